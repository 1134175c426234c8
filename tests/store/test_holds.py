"""A PostgreSQL Store holds an agent by a lease row it renews in the server's clock
(``engine/postgres/holds.py``): its own while it renews, anyone's once it lapses, and a
holder whose hold lapsed commits nothing (DESIGN.md, promise 11).

A holder that stops renewing is played here by stopping its renewals, with a lease of
a second or two (``holds.TTL``); the partition tests (``tests/test_partitions.py``) cut
real processes off a real network with the real lease.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from pgbouncer_server import running as pgbouncer_running
from postgres_server import PostgresServer

from effectful_durable import AgentInUseError, HoldLapsedError, Store
from effectful_durable.store.engine import process
from effectful_durable.store.engine.postgres import holds
from tests.helpers import ENDED_PID, added, edit_rows, persisted_rows

LEASE = 1.5  # seconds: the holds' TTL in these tests


@pytest.fixture(autouse=True)
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holds, "TTL", LEASE)
    monkeypatch.setattr(holds, "RENEW_EVERY", LEASE / 5)


def silence(store: Store) -> None:
    """Stop ``store``'s renewals, as a host cut from the network stops them."""
    agent_holds = store._db._holds  # type: ignore[attr-defined]
    agent_holds._renew = lambda holds, unreleased: False


@pytest.fixture
def stores(postgres_url: str) -> Iterator[tuple[Store, Store]]:
    with Store(postgres_url) as holder, Store(postgres_url) as other:
        yield holder, other


class TestRenewals:
    def test_a_renewed_hold_outlives_many_leases(self, stores: tuple[Store, Store]) -> None:
        """A holder that renews keeps its agent through a turn four leases long: another
        process is refused all along, and the turn commits."""
        holder, other = stores
        with holder.locked_turn("bot", template="t", arguments={}) as start:
            deadline = time.monotonic() + 4 * LEASE
            while time.monotonic() < deadline:
                with pytest.raises(AgentInUseError, match=f"process {os.getpid()} on"):
                    with other.agent_lock("bot"):
                        pass
                time.sleep(0.2)
            version = holder.commit_turn(
                "bot", base_version=start.version, template="t", change=added(0), state=None
            )
        assert version == 1
        with other.agent_lock("bot"):  # let go at the turn's end
            pass

    def test_renewals_survive_the_server_ending_their_session(
        self, postgres_url: str, stores: tuple[Store, Store]
    ) -> None:
        """The server ends every session of the holder (a pooler's or server's idle
        timeout, an administrator) during its turn: the hold is renewed on a new
        connection, stays its own, and the turn commits."""
        holder, other = stores
        with holder.locked_turn("bot", template="t", arguments={}) as start:
            for _ in range(3):
                with psycopg.connect(postgres_url, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                        " AND application_name LIKE 'effectful-durable %%'"
                        " AND backend_type = 'client backend'"
                    )
                time.sleep(LEASE / 2)
            with pytest.raises(AgentInUseError):
                with other.agent_lock("bot"):
                    pass
            holder.commit_turn(
                "bot", base_version=start.version, template="t", change=added(0), state=None
            )
        assert len(holder.history("bot")) == 1


class TestSessionsEnded:
    """Nothing of a hold lives in a server session: timeouts that end sessions or
    transactions end no hold (the advisory locks of before were lost with them)."""

    def hold_through(self, holder: Store, other: Store, seconds: float) -> None:
        """Hold "bot" in a turn for ``seconds``, ``other`` refused all along; commit."""
        with holder.locked_turn("bot", template="t", arguments={}) as start:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                with pytest.raises(AgentInUseError):
                    with other.agent_lock("bot"):
                        pass
                time.sleep(0.25)
            holder.commit_turn(
                "bot", base_version=start.version, template="t", change=added(0), state=None
            )
        assert [v.template for v in other.versions("bot")] == ["t"]

    def test_the_servers_idle_session_timeout(self, postgres_url: str) -> None:
        """A database whose idle_session_timeout (200 ms) ends every connection idle
        between two statements: a turn three leases long keeps its agent, and commits."""
        name = postgres_url.rsplit("/", 1)[1]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f"ALTER DATABASE \"{name}\" SET idle_session_timeout = '200ms'")
        with Store(postgres_url) as holder, Store(postgres_url) as other:
            self.hold_through(holder, other, 3 * LEASE)

    def test_pgbouncers_idle_transaction_timeout(
        self, postgres_server: PostgresServer, postgres_url: str
    ) -> None:
        """Behind a PgBouncer whose idle_transaction_timeout is 1 s: a turn three
        leases long keeps its agent, and commits (no transaction stays open in it)."""
        with pgbouncer_running(postgres_server, {"idle_transaction_timeout": 1}) as pooler:
            url = pooler.pooled(postgres_url)
            with Store(url) as holder, Store(url) as other:
                assert holder._db.pooled  # type: ignore[attr-defined]
                self.hold_through(holder, other, 3 * LEASE)


class TestLapse:
    def test_a_silent_holder_loses_its_agent_and_commits_nothing(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A holder that stops renewing loses its agent one lease after its last
        renewal; another process takes it, and the holder's commit then raises
        HoldLapsedError, writing nothing."""
        holder, other = stores
        with holder.locked_turn("bot", template="t", arguments={}) as start:
            silence(holder)
            silent_since = time.monotonic()
            with other.locked_turn("bot", template="u", arguments={}, wait=10) as theirs:
                took = time.monotonic() - silent_since
                with pytest.raises(HoldLapsedError, match="lapsed before its write"):
                    holder.commit_turn(
                        "bot", base_version=start.version, template="t", change=added(0),
                        state=None,
                    )  # fmt: skip
                other.commit_turn(
                    "bot", base_version=theirs.version, template="u", change=added(1), state=None
                )
        assert LEASE - 0.5 <= took <= LEASE + 1.0, took
        assert [v.template for v in other.versions("bot")] == ["u"]

    def test_the_server_refuses_a_commit_under_a_hold_taken_since(
        self, stores: tuple[Store, Store]
    ) -> None:
        """Even when the holder believes its hold fresh (its clock says so), the commit's
        own statement finds it taken by another process, and refuses it."""
        holder, other = stores
        with holder.locked_turn("bot", template="t", arguments={}) as start:
            silence(holder)
            with other.agent_lock("bot", wait=10):
                hold = holder._db._holds._held["bot"]  # type: ignore[attr-defined]
                hold.renewed = time.monotonic()  # as if renewed just now
                with pytest.raises(HoldLapsedError, match=f"process {os.getpid()} on .* took it"):
                    holder.commit_turn(
                        "bot", base_version=start.version, template="t", change=added(0),
                        state=None,
                    )  # fmt: skip
        assert holder.agents() == []  # nothing committed

    def test_a_lapsed_hold_commits_nothing_even_if_nobody_took_it(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A hold that lapsed is refused at commit whether or not another process took
        the agent meanwhile, on the server's word too."""
        holder, _ = stores
        with holder.locked_turn("bot", template="t", arguments={}) as start:
            silence(holder)
            time.sleep(LEASE + 0.3)
            holder._db._holds._held["bot"].renewed = time.monotonic()  # type: ignore[attr-defined]
            with pytest.raises(HoldLapsedError, match="last renewed"):
                holder.commit_turn(
                    "bot", base_version=start.version, template="t", change=added(0), state=None
                )
        assert holder.agents() == []  # nothing committed

    def test_the_failure_of_a_lapsed_turn_is_not_written_over_the_new_holders(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A holder whose hold lapsed cannot mark the agent's handoff failed: the
        handoff is the new holder's turn's, and stays running."""
        holder, other = stores
        with holder.locked_turn("bot", template="t", arguments={}):
            silence(holder)
            with other.locked_turn("bot", template="u", arguments={}, wait=10):
                with pytest.raises(HoldLapsedError):
                    holder.fail_turn("bot", "RuntimeError: the model failed")
                (handoff,) = other.handoffs()
                assert (handoff.template, handoff.status) == ("u", "running")

    def test_a_holder_gone_from_this_place_is_taken_over_at_once(
        self, postgres_url: str, stores: tuple[Store, Store]
    ) -> None:
        """A hold whose process ended here (the same kernel and PID namespace) is taken
        at once; one of the same host name and pid but another place waits out its
        lease: a host name and a pid name no process across containers."""
        _, other = stores
        for agent_id, place in (("here", process.place()), ("elsewhere", "another-kernel/1:2")):
            edit_rows(
                postgres_url,
                "INSERT INTO agent_holds VALUES (?, 'theirs', ?, ?, ?, 0,"
                " extract(epoch FROM clock_timestamp()), 3600)",
                agent_id,
                socket.gethostname(),
                ENDED_PID,
                place,
            )
        with other.agent_lock("here"):
            pass
        with pytest.raises(AgentInUseError, match=f"process {ENDED_PID} on"):
            with other.agent_lock("elsewhere", wait=0.5):
                pass
        held = "SELECT token, host, pid, place FROM agent_holds WHERE agent_id = ?"
        assert persisted_rows(postgres_url, held, "elsewhere") == [
            ("theirs", socket.gethostname(), ENDED_PID, "another-kernel/1:2"),
        ]


class TestThreads:
    def test_threads_taking_one_agent_name_the_real_holder(self, postgres_url: str) -> None:
        """Threads of one process that want an agent another process holds are each told
        who holds it, never one another."""
        with Store(postgres_url) as holder, Store(postgres_url) as other:
            with holder.agent_lock("bot"):
                errors: list[AgentInUseError] = []

                def attempt() -> None:
                    try:
                        with other.agent_lock("bot"):
                            pass
                    except AgentInUseError as error:
                        errors.append(error)

                threads = [threading.Thread(target=attempt) for _ in range(8)]
                for thread in threads:
                    thread.start()
                for thread in threads:
                    thread.join(30)
        assert len(errors) == 8
        assert all(f"process {os.getpid()} on" in str(error) for error in errors), errors
