"""A host lost without a word loses its agents and claims within 30 s, and comes back
committing nothing of what it held (DESIGN.md, promise 11), on PostgreSQL.

Real processes on hosts of the tests' own (``tests/support/netns.py``: a network namespace
each, reaching the server over TCP), cut off by blackhole routes on both sides:
packets vanish, nobody is told, and the server believes the sessions alive for
hours. The tests' own clients reach the server on its Unix socket, never cut.

- A runner cut off in a turn, another runner up: the event is delivered once by
  the other within 45 s of the cut; healed, the cut-off runner commits nothing of
  its turn and goes on delivering without a restart.
- A worker (a process running turns, as a web service does) cut off in a turn:
  its agent is usable here within 30 s of the cut; healed, its call ends with
  HoldLapsedError and nothing it wrote is there.
- Two runners under one host name, each in a PID namespace of its own (as
  containers with the host's network, or cloned machines): neither takes the
  other's live claims, so every event costs one model call.

Each plays directly and through PgBouncer in transaction mode; the default run
(``make test``) plays the direct ones, ``EFFECTFUL_DURABLE_CRASH=full`` (``make
crash``) all of them. ``tests/processes/test_partition_crash.py`` cuts runners at random.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import first_turn_after, wait_until
from netns import Network, container, containers
from postgres_server import PostgresServer
from runner_procs import Runner, delivered, starts_of, worker, write_config

from effectful_durable import Store

FULL = os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full"
AGENT_FREE_WITHIN = 30.0  # seconds from a cut (DESIGN.md, 11)
DELIVERED_WITHIN = 45.0  # seconds from a runner's cut to its event's delivery elsewhere


@pytest.fixture(params=["direct", "pgbouncer"])
def urls(
    request: pytest.FixtureRequest, net: Network, listening_server: PostgresServer
) -> Iterator[tuple[str, str]]:
    """A new database: the URL the hosts reach it by over the network (directly, or
    through PgBouncer), and the URL this process reads it by (the Unix socket)."""
    if request.param == "pgbouncer" and not FULL:
        pytest.skip("through PgBouncer with EFFECTFUL_DURABLE_CRASH=full (make crash)")
    here = listening_server.new_database()
    name = here.rsplit("/", 1)[1]
    port = 6432 if request.param == "pgbouncer" else 5432
    if request.param == "pgbouncer":
        request.getfixturevalue("listening_bouncer")
    try:
        yield f"postgresql://postgres@{net.server}:{port}/{name}", here
    finally:
        listening_server.drop_database(here)


# -- the tests -------------------------------------------------------------------------


@pytest.mark.slow
class TestRunnerCutOff:
    def test_its_event_moves_once_and_it_comes_back_to_work(
        self, net: Network, urls: tuple[str, str], tmp_path: Path
    ) -> None:
        """A runner is cut off inside an event's 20 s turn, with a runner here up: the
        event is delivered here within 45 s of the cut, once; healed, the cut-off
        runner commits nothing of its turn, and delivers the next event without a
        restart."""
        remote, here = urls
        far_host = net.host()
        config = write_config(tmp_path / "runner.toml")
        starts = tmp_path / "starts.txt"
        far = Runner(far_host.command([]), remote, config, starts, seconds=20)
        near: Runner | None = None
        try:
            with Store(here) as store:
                store.send_event("shared", "job", {"n": 1}, create=True)
                wait_until(lambda: starts_of(starts), 60, "the far runner's turn began")
                near = Runner([], here, config, starts)
                far_host.cut()
                cut = time.monotonic()
                took = wait_until(
                    lambda: delivered(store, "shared"), 2 * DELIVERED_WITHIN, "delivered here"
                )
                assert [v.version for v in store.versions("shared")] == [1]
                far_host.heal()
                line = far.expect("given back", timeout=90)
                near.stop()
                store.send_event("after", "job", {"n": 2, "seconds": 0}, create=True)
                wait_until(lambda: delivered(store, "after"), 60, "delivered after the heal")
                versions = [v.version for v in store.versions("shared")]
        finally:
            if far_host.is_cut:
                far_host.heal()
            far.stop()
            if near is not None:
                near.stop()
        print(f"delivered {took:.1f} s after the cut ({time.monotonic() - cut:.0f} s in all)")
        assert took <= DELIVERED_WITHIN, (took, near.text(), far.text())
        assert "hold on the agent lapsed" in line or "database failed" in line, line
        assert versions == [1]  # the cut-off turn never committed
        pids = [start.pid for start in starts_of(starts)]
        assert pids == [far.proc.pid, near.proc.pid, far.proc.pid], (pids, far.text())
        assert "is dead" in near.text() and "took back 1 claim" in near.text(), near.text()
        assert "Traceback" not in far.text() + near.text()


@pytest.mark.slow
class TestWorkerCutOff:
    def test_its_agent_is_free_within_30_s_and_it_commits_nothing(
        self, net: Network, urls: tuple[str, str]
    ) -> None:
        """A worker is cut off inside a turn whose model takes 20 s: its agent is
        usable here within 30 s of the cut (a turn here commits); healed, the
        worker's call ends with HoldLapsedError at once, and nothing it wrote is
        there."""
        remote, here = urls
        host = net.host()
        far = worker(host.command([]), remote, "shared", 20)
        try:
            host.cut()
            free = first_turn_after(here, "shared", time.monotonic(), 2 * AGENT_FREE_WITHIN)
            host.heal()
            out, _ = far.communicate(timeout=120)
            with Store(here) as store:
                versions = store.versions("shared")
        finally:
            if host.is_cut:
                host.heal()
            far.kill()
            far.wait()
        print(f"the agent was free here {free:.1f} s after the cut")
        assert free <= AGENT_FREE_WITHIN, free
        outcome = json.loads(out.strip().splitlines()[-1])
        assert outcome["error"] == "HoldLapsedError", outcome
        assert "hold on agent 'shared' lapsed" in outcome["message"], outcome
        assert outcome["seconds_after_answer"] < 5, outcome  # it does not hang
        (version,) = versions  # the worker's turn never committed: only the one here
        assert version.detail is not None and version.detail["recovered"]["template"] == "ask"


@pytest.mark.slow
class TestOneHostName:
    def test_two_runners_in_two_pid_namespaces_never_take_each_others_claims(
        self, postgres_server: PostgresServer, tmp_path: Path
    ) -> None:
        """Two runners under the host name "twin", each in a PID namespace of its own
        with another pid, deliver events whose turns take 8 s: each event costs one
        model call; neither runner finds the other dead."""
        containers()
        events = 50 if FULL else 4  # two in flight on each runner at once
        here = postgres_server.new_database()
        config = write_config(tmp_path / "runner.toml", concurrency=4 if FULL else 2)
        starts = tmp_path / "starts.txt"
        runners = [
            Runner(container("twin", skip_pids=skip), here, config, starts) for skip in (1, 3)
        ]
        try:
            with Store(here) as store:
                for n in range(events):
                    store.send_event(f"a{n}", "job", {"n": n, "seconds": 8}, create=True)
                wait_until(
                    lambda: all(delivered(store, f"a{n}") for n in range(events)),
                    60 + 8 * events,
                    "every event delivered",
                    poll=0.5,
                )
                versions = {f"a{n}": len(store.versions(f"a{n}")) for n in range(events)}
        finally:
            for runner in runners:
                runner.stop()
            postgres_server.drop_database(here)
        found = starts_of(starts)
        logs = "\n".join(runner.text() for runner in runners)
        assert {start.host for start in found} == {"twin"}
        assert len({start.pid for start in found}) == 2, found  # both delivered, as two pids
        assert len(found) == events, (found, logs)  # one model call each
        assert set(versions.values()) == {1}, versions
        assert "is dead" not in logs and "lease lost" not in logs, logs
