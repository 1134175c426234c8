"""A runner's claims are its own while it lives, however long its turn, and move to
another runner within 30 s of its death, on any host (DESIGN.md, promise 11).

Real ``effectful-durable run`` processes. A runner "on another machine" runs in a
container of its own (``netns.container``: a host name and a PID namespace of its
own): the runners here cannot tell whether its process lives, and only its
heartbeat speaks for it.
Each event turn notes where it began (``heartbeat_app``), so that a turn begun
twice is seen even if only one commits.

A fleet across machines shares a PostgreSQL server: the default run plays these on
PostgreSQL; ``EFFECTFUL_DURABLE_CRASH=full`` (``make crash``) on SQLite too.
"""

import os
import time
from pathlib import Path

import pytest
from helpers import wait_until
from netns import container, containers
from runner_procs import Runner, delivered, starts_of, write_config

from effectful_durable import DatabaseUnavailableError, Store
from effectful_durable.runner import heartbeat

ELSEWHERE = "fleet-elsewhere"
PROMISE = 30.0  # seconds: a dead runner's claims move within this (DESIGN.md, 11)


@pytest.fixture
def elsewhere() -> list[str]:
    """The command prefix of a runner "on another machine": a container named ELSEWHERE
    (killing it kills the runner in it)."""
    containers()
    return container(ELSEWHERE)


@pytest.mark.slow
class TestHeartbeats:
    def test_a_runner_killed_on_another_host_has_its_event_delivered_within_30_s(
        self, fleet_url: str, elsewhere: list[str], tmp_path: Path
    ) -> None:
        """A runner on "another machine" is SIGKILLed inside an event's turn: a runner
        here delivers the event within 30 s of the kill, once, telling why."""
        config = write_config(tmp_path / "runner.toml")  # lease_seconds: the default, 300
        starts = tmp_path / "starts.txt"
        doomed = Runner(elsewhere, fleet_url, config, starts, seconds=600)
        heir: Runner | None = None
        try:
            with Store(fleet_url) as store:
                store.send_event("w", "job", {"n": 1}, create=True)
            wait_until(lambda: starts_of(starts), 60, "a turn began", poll=0.05)
            assert starts_of(starts)[0].host == ELSEWHERE  # inside the model call
            heir = Runner([], fleet_url, config, starts)
            killed = time.monotonic()
            doomed.proc.kill()
            doomed.proc.wait(timeout=30)
            with Store(fleet_url) as store:
                while not delivered(store, "w"):
                    assert time.monotonic() - killed < 2 * PROMISE, heir.text()
                    time.sleep(0.1)
                took = time.monotonic() - killed
                versions = store.versions("w")
            line = heir.expect("is dead", timeout=60)
        finally:
            doomed.proc.kill()
            if heir is not None:
                heir.stop()
        print(f"delivered by the runner here {took:.1f} s after the kill on another host")
        assert took <= PROMISE, (took, heir.text())
        assert ELSEWHERE in line and "took back 1 claim" in line, line
        assert [start.host for start in starts_of(starts)] == [ELSEWHERE, os.uname().nodename]
        assert [v.version for v in versions] == [1]
        assert "Traceback" not in heir.text(), heir.text()

    def test_a_turn_longer_than_its_lease_is_delivered_once(
        self, fleet_url: str, elsewhere: list[str], tmp_path: Path
    ) -> None:
        """lease_seconds = 3 and an 8 s turn, on "another machine", with a runner here
        waiting all along: the turn keeps its claim, and the event is delivered once."""
        config = write_config(tmp_path / "runner.toml", lease_seconds=3)
        starts = tmp_path / "starts.txt"
        runners = [Runner(elsewhere, fleet_url, config, starts, seconds=8)]
        try:
            runners.append(Runner([], fleet_url, config, starts, seconds=8))
            with Store(fleet_url) as store:
                store.send_event("w", "job", {"n": 1}, create=True)
                deadline = time.monotonic() + 60
                while not delivered(store, "w"):
                    assert time.monotonic() < deadline, [r.text() for r in runners]
                    time.sleep(0.1)
                versions = store.versions("w")
                time.sleep(1.0)  # a second start would have begun by now
        finally:
            for runner in runners:
                runner.stop()
        logs = "\n".join(runner.text() for runner in runners)
        assert len(starts_of(starts)) == 1, (starts_of(starts), logs)
        assert [v.version for v in versions] == [1]
        assert "lease lost" not in logs and "is dead" not in logs, logs
        assert "Traceback" not in logs, logs


class FakeQueue:
    """The part of an AlarmQueue a Heartbeat uses: beats that land or fail, rescues noted."""

    def __init__(self) -> None:
        self.down = False
        self.rescues: list[bool] = []

    def beat(self, runner: str) -> bool:
        if self.down:
            raise DatabaseUnavailableError("postgresql://fake", "the server did not answer")
        return True

    def rescue(self, me: str, now: float, *, heartbeats: bool = True) -> dict[str, int]:
        self.rescues.append(heartbeats)
        return {}


class TestTrust:
    """A runner judges others by their heartbeats only while its own land in a row."""

    def test_an_outage_of_the_database_moves_no_live_claim(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Before TRUST_AFTER seconds of its own heartbeats in a row (at start, after the
        database failed, after this process stalled), a rescue frees only the claims of
        processes gone from this host."""
        now = [1000.0]
        monkeypatch.setattr(heartbeat.time, "monotonic", lambda: now[0])
        fake = FakeQueue()
        beats = heartbeat.Heartbeat(
            fake,  # type: ignore[arg-type]
            "me",
            now=time.time,
            record=lambda: None,
            wake=lambda: None,
        )

        def run_for(seconds: float) -> None:
            end = now[0] + seconds
            while now[0] < end:
                now[0] += heartbeat.HEARTBEAT_EVERY
                beats.beat()

        beats.beat()
        beats.rescue()
        run_for(heartbeat.TRUST_AFTER - heartbeat.HEARTBEAT_EVERY)
        beats.rescue()
        run_for(heartbeat.HEARTBEAT_EVERY)
        beats.rescue()
        assert fake.rescues == [False, False, True]
        fake.down = True  # an outage: every runner's heartbeat gets old
        run_for(heartbeat.DEAD_AFTER * 2)
        fake.down = False
        beats.beat()
        beats.rescue()
        run_for(heartbeat.TRUST_AFTER)
        beats.rescue()
        now[0] += 3 * heartbeat.HEARTBEAT_EVERY  # this process stalled
        beats.rescue()
        beats.beat()
        beats.rescue()
        assert fake.rescues[3:] == [False, True, False, False]
