"""A PostgreSQL Store holds an agent by a lease row it renews in the server's clock
(``engine/postgres/holds.py``): its own while it renews, anyone's once it lapses, and a
holder whose hold lapsed commits nothing (DESIGN.md, promise 11).

A holder that stops renewing is played here by stopping its renewals, with a lease of
a second or two (``holds.TTL``); the partition tests (``tests/processes/test_partitions.py``) cut
real processes off a real network with the real lease.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from helpers import ENDED_PID, added, edit_rows, persisted_rows
from pgbouncer_server import running as pgbouncer_running
from postgres_server import PostgresServer

from effectful_durable import (
    AgentInUseError,
    DurableError,
    HoldLapsedError,
    NotFoundError,
    Store,
)
from effectful_durable.store.engine import process
from effectful_durable.store.engine.postgres import holds

LEASE = 1.5  # seconds: the holds' TTL in these tests
LOCK_BOT = "SELECT 1 FROM agent_holds WHERE agent_id = 'bot' FOR UPDATE"


@pytest.fixture(autouse=True)
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holds, "TTL", LEASE)
    monkeypatch.setattr(holds, "RENEW_EVERY", LEASE / 5)


def silence(store: Store) -> None:
    """Stop ``store``'s renewals, as a host cut from the network stops them."""
    agent_holds = store.engine._holds  # type: ignore[attr-defined]
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
        with holder.turns.start("bot", template="t", arguments={}) as start:
            deadline = time.monotonic() + 4 * LEASE
            while time.monotonic() < deadline:
                with pytest.raises(AgentInUseError, match=f"process {os.getpid()} on"):
                    with other.agent_lock("bot"):
                        pass
                time.sleep(0.2)
            version = holder.turns.commit(
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
        with holder.turns.start("bot", template="t", arguments={}) as start:
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
            holder.turns.commit(
                "bot", base_version=start.version, template="t", change=added(0), state=None
            )
        assert len(holder.history("bot")) == 1


class TestSessionsEnded:
    """Nothing of a hold lives in a server session: timeouts that end sessions or
    transactions end no hold (the advisory locks of before were lost with them)."""

    def hold_through(self, holder: Store, other: Store, seconds: float) -> None:
        """Hold "bot" in a turn for ``seconds``, ``other`` refused all along; commit."""
        with holder.turns.start("bot", template="t", arguments={}) as start:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                with pytest.raises(AgentInUseError):
                    with other.agent_lock("bot"):
                        pass
                time.sleep(0.25)
            holder.turns.commit(
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
                assert holder.engine.pooled  # type: ignore[attr-defined]
                self.hold_through(holder, other, 3 * LEASE)


class TestLapse:
    def test_a_silent_holder_loses_its_agent_and_commits_nothing(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A holder that stops renewing loses its agent one lease after its last
        renewal; another process takes it, and the holder's commit then raises
        HoldLapsedError, writing nothing."""
        holder, other = stores
        with holder.turns.start("bot", template="t", arguments={}) as start:
            silence(holder)
            silent_since = time.monotonic()
            with other.turns.start("bot", template="u", arguments={}, wait=10) as theirs:
                took = time.monotonic() - silent_since
                with pytest.raises(HoldLapsedError, match="lapsed before its write"):
                    holder.turns.commit(
                        "bot", base_version=start.version, template="t", change=added(0),
                        state=None,
                    )  # fmt: skip
                other.turns.commit(
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
        with holder.turns.start("bot", template="t", arguments={}) as start:
            silence(holder)
            with other.agent_lock("bot", wait=10):
                hold = holder.engine._holds._held["bot"]  # type: ignore[attr-defined]
                hold.renewed = holds.clock()  # as if renewed just now
                with pytest.raises(HoldLapsedError, match=f"process {os.getpid()} on .* took it"):
                    holder.turns.commit(
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
        with holder.turns.start("bot", template="t", arguments={}) as start:
            silence(holder)
            time.sleep(LEASE + 0.3)
            holder.engine._holds._held["bot"].renewed = holds.clock()  # type: ignore[attr-defined]
            with pytest.raises(HoldLapsedError, match="last renewed"):
                holder.turns.commit(
                    "bot", base_version=start.version, template="t", change=added(0), state=None
                )
        assert holder.agents() == []  # nothing committed

    def test_the_failure_of_a_lapsed_turn_is_not_written_over_the_new_holders(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A holder whose hold lapsed cannot mark the agent's handoff failed: the
        handoff is the new holder's turn's, and stays running."""
        holder, other = stores
        with holder.turns.start("bot", template="t", arguments={}):
            silence(holder)
            with other.turns.start("bot", template="u", arguments={}, wait=10):
                with pytest.raises(HoldLapsedError):
                    holder.turns.fail("bot", "RuntimeError: the model failed")
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


class TestFence:
    """A hold changes hands only once the writes made under it are over, and such a
    write commits only while its hold lasts: checked again just before its COMMIT."""

    def test_a_take_ends_a_write_left_open_under_a_lapsed_hold(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A holder stopped inside a write (its transaction open, its renewals silent)
        loses the agent a lease later: the take ends the stopped write's session, and
        the write, gone on, commits nothing."""
        holder, other = stores
        with holder.agent_lock("bot"):
            with pytest.raises(DurableError):
                with holder.engine.writing() as conn:
                    holder.engine.fence(conn, "bot")
                    conn.execute("DELETE FROM agent_holds WHERE agent_id = 'nobody'")
                    silence(holder)
                    silent_since = time.monotonic()
                    with other.turns.start("bot", template="u", arguments={}, wait=10) as start:
                        took = time.monotonic() - silent_since
                        other.turns.commit(
                            "bot", base_version=start.version, template="u", change=added(0),
                            state=None,
                        )  # fmt: skip
        assert took <= LEASE + 1.0, took
        assert [v.template for v in other.versions("bot")] == ["u"]

    def test_a_write_under_a_hold_that_lapsed_meanwhile_is_refused_at_its_commit(
        self, stores: tuple[Store, Store]
    ) -> None:
        """A write fenced while its hold was fresh, still open when the hold lapsed
        (nobody took the agent), is refused by the fence before its COMMIT: nothing of
        it lands."""
        holder, _ = stores
        with holder.agent_lock("bot"):
            with pytest.raises(HoldLapsedError, match="last renewed"):
                with holder.engine.writing() as conn:
                    holder.engine.fence(conn, "bot")
                    silence(holder)
                    conn.execute(
                        "INSERT INTO agents (agent_id, version, created_at, updated_at)"
                        " VALUES ('bot', 1, 0, 0)"
                    )
                    time.sleep(LEASE * 0.45)  # within the bound the fence set, past the lease
                    conn.execute("UPDATE agents SET updated_at = 1 WHERE agent_id = 'bot'")
                    time.sleep(LEASE * 0.45)
                    conn.execute("UPDATE agents SET updated_at = 2 WHERE agent_id = 'bot'")
                    time.sleep(LEASE * 0.2)
        assert holder.agents() == []

    def test_a_write_under_a_hold_is_bounded_by_the_lease_whatever_the_settings(
        self, postgres_url: str
    ) -> None:
        """Opened with no statement timeout, a Store's write under a hold still gets
        half the lease's remaining time at most per statement and per wait for the
        client, on the server's side."""
        with Store(postgres_url, statement_timeout=None) as holder:
            with holder.agent_lock("bot"), holder.engine.writing() as conn:
                before = conn.execute("SHOW statement_timeout").fetchone()[0]
                holder.engine.fence(conn, "bot")
                for setting in ("statement_timeout", "idle_in_transaction_session_timeout"):
                    shown = conn.execute(f"SHOW {setting}").fetchone()[0]
                    assert 0 < seconds(shown) <= LEASE / 2, (setting, shown)
        assert before == "0"

    def test_a_write_of_another_role_left_idle_is_ended_by_the_servers_bound(
        self, postgres_server: PostgresServer, postgres_url: str
    ) -> None:
        """A holder of another role, stopped inside a write: the take may not end its
        session; the server ends it by the bound its fence set (half a lease), and the
        agent is usable here once the hold lapsed."""
        first, second = two_roles(postgres_server, postgres_url)
        with Store(first) as holder, Store(second) as other:
            with holder.agent_lock("bot"), pytest.raises(DurableError):
                with holder.engine.writing() as conn:
                    holder.engine.fence(conn, "bot")
                    silence(holder)
                    silent_since = time.monotonic()
                    with other.agent_lock("bot", wait=10):
                        took = time.monotonic() - silent_since
                    conn.execute("SELECT 1")
        assert took <= LEASE + 1.0, took

    def test_a_refusal_names_a_write_left_open_that_this_role_may_not_end(
        self, postgres_server: PostgresServer, postgres_url: str
    ) -> None:
        """A holder of another role stopped in the middle of a pipeline (no server
        timeout runs there): past its lease, a taker that may not end it is refused,
        told of the write still open and its session; the write then commits nothing."""
        first, second = two_roles(postgres_server, postgres_url)
        with Store(first) as holder, Store(second) as other:
            with holder.agent_lock("bot"), pytest.raises(HoldLapsedError):
                with holder.engine.writing() as conn:
                    holder.engine.fence(conn, "bot")
                    silence(holder)
                    backend = conn.raw.info.backend_pid
                    with conn.raw.pipeline():  # sent, with no Sync: the server waits
                        conn.raw.execute("SELECT 1")
                        time.sleep(LEASE + 0.5)
                        with pytest.raises(AgentInUseError) as refused:
                            with other.agent_lock("bot", wait=0):
                                pass
                    conn.execute("SELECT 1")
            assert other.agents() == []
        assert f"still open on the server (backend {backend})" in str(refused.value)


class TestRenewalPaths:
    def test_renewals_go_through_the_pool_when_their_connection_cannot_be_made(
        self, postgres_server: PostgresServer, postgres_url: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A role limited to 3 connections, the renewals' own ended and every free slot
        taken for five leases: the renewals go through the Store's pool, say so once,
        and the holder keeps its agent and commits."""
        role = f"limited_{os.getpid()}"
        name = postgres_url.rsplit("/", 1)[1]
        postgres_server.admin(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 3')
        postgres_server.admin(f'ALTER DATABASE "{name}" OWNER TO "{role}"')
        limited = postgres_server.url(name, user=role)
        taken: list[psycopg.Connection] = []
        try:
            with Store(limited, pool_size=2) as holder, Store(postgres_url) as other:
                with holder.turns.start("bot", template="t", arguments={}) as start:
                    renewals = holder.engine._holds._conn  # type: ignore[attr-defined]
                    with psycopg.connect(postgres_url, autocommit=True) as admin:
                        admin.execute(
                            "SELECT pg_terminate_backend(%s)", (renewals.info.backend_pid,)
                        )
                    while len(taken) < 3:
                        try:
                            taken.append(psycopg.connect(limited))
                        except psycopg.OperationalError:
                            break
                    deadline = time.monotonic() + 5 * LEASE
                    while time.monotonic() < deadline:
                        with pytest.raises(AgentInUseError):
                            with other.agent_lock("bot"):
                                pass
                        time.sleep(0.2)
                    holder.turns.commit(
                        "bot", base_version=start.version, template="t", change=added(0),
                        state=None,
                    )  # fmt: skip
        finally:
            for conn in taken:
                conn.close()
            postgres_server.admin(f'ALTER DATABASE "{name}" OWNER TO postgres')
            postgres_server.drop_database(postgres_url)
            postgres_server.admin(f'DROP ROLE "{role}"')
        pooled = [r for r in caplog.records if "through the Store's pool" in r.getMessage()]
        assert len(pooled) == 1, [r.getMessage() for r in caplog.records]

    @pytest.mark.parametrize("renewal_url", [False, True], ids=["pooled", "renewal_url"])
    def test_a_saturated_pgbouncer_pool(
        self,
        postgres_server: PostgresServer,
        postgres_url: str,
        renewal_url: bool,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Two transactions fill a PgBouncer pool of 2 for four leases: renewals through
        the pooler queue behind them and the hold lapses, unless the renewals have a
        path of their own (``renewal_url``, the server here): then the holder keeps
        its agent and commits once the pool frees."""
        with pgbouncer_running(postgres_server, {"default_pool_size": 2}) as pooler:
            url = pooler.pooled(postgres_url)
            direct = postgres_url if renewal_url else None
            with Store(url, renewal_url=direct) as holder:
                with holder.turns.start("bot", template="t", arguments={}) as start:
                    blockers = [psycopg.connect(url) for _ in range(2)]
                    for blocker in blockers:
                        blocker.execute("SELECT 1")  # BEGIN ... a transaction left open
                    time.sleep(4 * LEASE)
                    for blocker in blockers:
                        blocker.close()
                    commit = lambda: holder.turns.commit(  # noqa: E731
                        "bot", base_version=start.version, template="t", change=added(0),
                        state=None,
                    )  # fmt: skip
                    if renewal_url:
                        commit()
                    else:
                        with pytest.raises(HoldLapsedError):
                            commit()
        if not renewal_url:
            assert any("could not renew" in r.getMessage() for r in caplog.records)

    def test_behind_pgbouncer_a_renewal_carries_its_own_settings(
        self, postgres_server: PostgresServer, postgres_url: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A renewal through PgBouncer waiting for a locked hold row is ended by its own
        timeouts, on the server (a pooler's server session carries none of ours)."""
        with pgbouncer_running(postgres_server) as pooler:
            url = pooler.pooled(postgres_url)
            with Store(url) as holder:
                with holder.agent_lock("bot"):
                    with psycopg.connect(postgres_url) as locker:
                        locker.execute(
                            "SELECT 1 FROM agent_holds WHERE agent_id = 'bot' FOR UPDATE"
                        )
                        time.sleep(3 * holds.RENEW_EVERY)
        waits = [r.getMessage() for r in caplog.records if "could not renew" in r.getMessage()]
        assert waits and re.search("due to (lock|statement) timeout", waits[0]), waits


class TestRestarts:
    def test_a_crash_restart_keeps_a_renewing_holders_hold(
        self, postgres_server: PostgresServer, postgres_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A backend killed (SIGKILL) makes the server end every session and recover
        (its start time unchanged: no grace); the holder's renewals come back within
        the lease, the hold stays its own, and its turn commits."""
        monkeypatch.setattr(holds, "TTL", 6.0)
        monkeypatch.setattr(holds, "RENEW_EVERY", 1.0)
        with Store(postgres_url) as holder, Store(postgres_url) as other:
            with holder.turns.start("bot", template="t", arguments={}) as start:
                with psycopg.connect(postgres_url, autocommit=True) as victim:
                    started_at = victim.execute("SELECT pg_postmaster_start_time()").fetchone()
                    os.kill(victim.info.backend_pid, signal.SIGKILL)
                    time.sleep(0.5)
                deadline = time.monotonic() + 30
                while True:
                    try:
                        with psycopg.connect(postgres_url, autocommit=True) as back:
                            after = back.execute("SELECT pg_postmaster_start_time()").fetchone()
                        break
                    except psycopg.OperationalError:
                        assert time.monotonic() < deadline, "the server did not recover"
                        time.sleep(0.2)
                assert after == started_at
                time.sleep(2 * holds.RENEW_EVERY)
                with pytest.raises(AgentInUseError):
                    with other.agent_lock("bot"):
                        pass
                holder.turns.commit(
                    "bot", base_version=start.version, template="t", change=added(0), state=None
                )
            assert [v.template for v in other.versions("bot")] == ["t"]


class TestForkAndSuspend:
    @pytest.mark.filterwarnings("ignore::DeprecationWarning")  # fork() of a threaded process
    @pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
    def test_a_forked_child_refuses_its_parents_store(
        self, backend: str, tmp_path: Path, postgres_url: str
    ) -> None:
        """A child forked while the parent holds an agent refuses, at once and in one
        line, to use the parent's Store (nor its hold); whatever it then does to the
        objects, the parent's sessions stay and its turn commits."""
        target = str(tmp_path / "state.db") if backend == "sqlite" else postgres_url
        with Store(target) as store:
            with store.turns.start("bot", template="t", arguments={}) as start:
                read, write = os.pipe()
                pid = os.fork()
                if pid == 0:  # the child
                    os.close(read)
                    said = []
                    for use in (store.agents, lambda: store.agent_lock("bot").__enter__()):
                        try:
                            use()
                            said.append("used")
                        except DurableError as error:
                            said.append(str(error))
                    store.close()
                    del store
                    gc.collect()
                    os.write(write, json.dumps(said).encode())
                    os._exit(0)
                os.close(write)
                with os.fdopen(read) as pipe:
                    said = json.loads(pipe.read())
                assert os.waitpid(pid, 0)[1] == 0
                assert len(said) == 2 and all("a child it forked" in s for s in said), said
                assert all("\n" not in s for s in said)
                store.turns.commit(
                    "bot", base_version=start.version, template="t", change=added(0), state=None
                )
            assert [a.agent_id for a in store.agents()] == ["bot"]

    def test_time_suspended_ages_a_hold(
        self, stores: tuple[Store, Store], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A host suspended longer than a lease (a clock that counts suspended time
        jumps; the monotonic one does not): its hold is known lapsed here, and a write
        under it is refused before anything is sent."""
        holder, _ = stores
        with holder.turns.start("bot", template="t", arguments={}) as start:
            silence(holder)
            resumed = holds.clock() + LEASE + 1
            monkeypatch.setattr(holds, "clock", lambda: resumed)
            with pytest.raises(HoldLapsedError, match="could not renew it for"):
                holder.turns.commit(
                    "bot", base_version=start.version, template="t", change=added(0), state=None
                )
        assert holder.agents() == []


class TestTidyRows:
    def test_no_row_stays_for_an_agent_that_does_not_exist(
        self, postgres_url: str, stores: tuple[Store, Store]
    ) -> None:
        """A rollback or delete of an id the database never held, and the delete of an
        agent, leave no hold row; an agent that exists keeps its row, let go."""
        holder, _ = stores
        for refused in (lambda: holder.rollback("ghost", 1), lambda: holder.delete("ghost")):
            with pytest.raises(NotFoundError):
                refused()
        for agent_id in ("kept", "gone"):
            with holder.turns.start(agent_id, template="t", arguments={}) as start:
                holder.turns.commit(
                    agent_id, base_version=start.version, template="t", change=added(0),
                    state=None,
                )  # fmt: skip
        holder.delete("gone")
        rows = persisted_rows(postgres_url, "SELECT agent_id, token FROM agent_holds")
        assert rows == [("kept", None)]

    def test_prune_removes_the_rows_of_agents_gone(
        self, postgres_url: str, stores: tuple[Store, Store]
    ) -> None:
        """A let-go row of an agent gone since (left by an earlier release) goes with a
        prune; a held row and an agent's row stay."""
        holder, other = stores
        with holder.turns.start("kept", template="t", arguments={}) as start:
            holder.turns.commit(
                "kept", base_version=start.version, template="t", change=added(0), state=None
            )
        for agent_id, token in (("left", None), ("held", "theirs")):
            edit_rows(
                postgres_url,
                "INSERT INTO agent_holds VALUES (?, ?, 'h', 1, NULL, 0,"
                " extract(epoch FROM clock_timestamp()), 3600)",
                agent_id,
                token,
            )
        other.prune(keep_versions=1)
        rows = persisted_rows(postgres_url, "SELECT agent_id FROM agent_holds ORDER BY 1")
        assert rows == [("held",), ("kept",)]


class TestRefusals:
    def test_a_refusal_names_the_holders_place_and_when_its_hold_lapses(
        self, stores: tuple[Store, Store]
    ) -> None:
        """Refused, a taker is told the holder's host, pid and place, what it runs, and
        when its hold lapses by the server's clock."""
        holder, other = stores
        with holder.turns.start("bot", template="ask", arguments={}):
            with pytest.raises(AgentInUseError) as refused:
                with other.agent_lock("bot"):
                    pass
        message = str(refused.value)
        assert f"process {os.getpid()} on {socket.gethostname()}" in message
        assert f"place {process.place()}" in message and "running ask" in message
        assert re.search(
            r"lapses in \d+\.\d s, at \d\d:\d\d:\d\d UTC by the server's clock", message
        )

    def test_wait_zero_does_not_wait_behind_another_threads_take(
        self, postgres_url: str, stores: tuple[Store, Store]
    ) -> None:
        """While one thread's take waits on a locked row, another thread of the same
        Store asking with wait=0 is answered at once."""
        holder, other = stores
        with holder.turns.start("bot", template="t", arguments={}) as start:
            holder.turns.commit(
                "bot", base_version=start.version, template="t", change=added(0), state=None
            )
        with psycopg.connect(postgres_url) as locker:
            locker.execute(LOCK_BOT)
            taking = threading.Thread(target=lambda: suppress_busy(other))
            taking.start()
            time.sleep(0.5)  # the first take waits for the row now
            started = time.monotonic()
            with pytest.raises(AgentInUseError):
                with other.agent_lock("bot", wait=0):
                    pass
            assert time.monotonic() - started < 1.0
        taking.join(30)


def suppress_busy(store: Store) -> None:
    """Take "bot" once, as a thread waiting for its row would (busy: fine)."""
    with contextlib.suppress(DurableError), store.agent_lock("bot", wait=5):
        pass


def seconds(shown: str) -> float:
    """A duration as SHOW prints it (``750ms``, ``1s``), in seconds."""
    number = re.fullmatch(r"(\d+)(ms|s|min)?", shown)
    assert number is not None, shown
    return int(number[1]) * {"ms": 0.001, "s": 1, "min": 60, None: 0.001}[number[2]]


def two_roles(server: PostgresServer, url: str) -> tuple[str, str]:
    """URLs of the database of ``url`` as two roles of their own, which may use its
    tables and may not end each other's sessions."""
    name = url.rsplit("/", 1)[1]
    first, second = f"first_{os.getpid()}", f"second_{os.getpid()}"
    for role in (first, second):
        server.admin(f'DROP ROLE IF EXISTS "{role}"')
        server.admin(f'CREATE ROLE "{role}" LOGIN')
    server.admin(f'ALTER DATABASE "{name}" OWNER TO "{first}"')
    with Store(server.url(name, user=first)):
        pass
    with psycopg.connect(server.url(name, user=first), autocommit=True) as owner:
        owner.execute(f'GRANT ALL ON ALL TABLES IN SCHEMA public TO "{second}"')
    return server.url(name, user=first), server.url(name, user=second)
