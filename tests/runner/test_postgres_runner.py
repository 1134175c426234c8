"""What only PostgreSQL does for alarms: claims that skip each other, pick-up by polling.

Runners on several machines share one database there. A claim skips an alarm
another runner is claiming (``FOR UPDATE SKIP LOCKED``) instead of waiting for
it. Nothing notifies a runner (schema 10): an idle runner looks at the pending
alarms every ``poll_interval`` (0.5 s), so an alarm or event another process
makes due starts within about that, and a lost connection costs nothing but the
looks that failed meanwhile.
"""

import threading
import time
from typing import Any

import psycopg
import pytest
from alarms_app import in_threads
from effectful.handlers.llm.completions import LiteLLMProvider
from pg_faults_app import Noter

from effectful_durable import AgentRunner, RunnerConfig, Store
from effectful_durable.store.parts.alarms import make_schedule
from effectful_durable.testing import FakeCall, FakeLLM

PICK_UP = 1.0  # seconds from an alarm's commit to its turn's start (issue 38: p99)
SAMPLES = 10


def due_now(store: Store, agent_id: str, action: str) -> str:
    return store.schedule_alarm(agent_id, action, make_schedule(time.time(), delay=0))


class TestClaims:
    """A claim skips the alarm another runner is claiming; it never waits for it."""

    def test_a_claim_skips_a_row_another_transaction_holds(self, postgres_url: str) -> None:
        """While another session holds the earliest due alarm's row, a claim takes the
        next one at once (not after busy_timeout), and the held one stays unclaimed."""
        now = time.time()
        with Store(postgres_url, busy_timeout=60) as store:
            first = store.schedule_alarm("a", "first", make_schedule(now, delay=0), now=now)
            store.schedule_alarm("b", "second", make_schedule(now, delay=0), now=now + 0.001)
            got: list[Any] = []
            with psycopg.connect(postgres_url) as other:  # a runner in the middle of its claim
                other.execute("SELECT 1 FROM alarms WHERE alarm_id = %s FOR UPDATE", (first,))
                claimer = threading.Thread(
                    target=lambda: got.append(store.alarm_queue.claim("r2", now + 1, 30))
                )
                claimer.start()
                claimer.join(timeout=30)  # a claim that waited would wait for 60 s
                assert not claimer.is_alive(), "the claim waited for the held row"
                assert got[0] is not None and got[0].action == "second"
                assert store.alarm_queue.claim("r3", now + 1, 30) is None  # nothing else
            again = store.alarm_queue.claim("r3", now + 1, 30)  # released: claimable
            assert again is not None and again.alarm_id == first


class Sleeper:
    """One idle runner in a thread, recording when each turn starts."""

    def __init__(self, url: str) -> None:
        self.started: dict[str, float] = {}

        def respond(call: FakeCall) -> str:
            self.started.setdefault(call.last_user_text, time.monotonic())
            return "done"

        def handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model="fake"), FakeLLM(respond=respond)]

        self.runner = AgentRunner(
            url, agents=lambda agent_id: Noter(agent_id=agent_id), handlers=handlers
        )

    def latency(self, store: Store, action: str, *, send: bool = False) -> float:
        """Seconds from the commit of an alarm due now (or an event) to its turn's start."""
        written = time.monotonic()
        if send:
            store.send_event("k", "ping", action, create=True)
        else:
            due_now(store, "k", action)
        deadline = written + 60
        while time.monotonic() < deadline:
            started = [at for text, at in self.started.items() if action in text]
            if started:
                return started[0] - written
            time.sleep(0.005)
        raise AssertionError(f"{action!r} was not delivered within 60 s")

    def latencies(self, store: Store, name: str) -> list[float]:
        """:meth:`latency` of SAMPLES alarms and events, one at a time, at moments
        spread over the runner's poll interval."""
        found = []
        for i in range(SAMPLES):
            time.sleep(0.05 * i % 0.5)
            found.append(self.latency(store, f"{name} {i}", send=bool(i % 2)))
        return sorted(found)


class TestPickUp:
    """An idle runner starts what another process made due within a second."""

    def test_an_alarm_or_event_starts_within_a_second(self, postgres_url: str) -> None:
        """Alarms and events committed by another Store while the runner is idle
        start within PICK_UP seconds, nine in ten of them at least (a loaded test
        machine may stall one), none later than three times that."""
        sleeper = Sleeper(postgres_url)
        with Store(postgres_url) as store, in_threads(sleeper.runner):
            sleeper.latency(store, "warm-up")  # the first turn imports and builds the agent
            found = sleeper.latencies(store, "due")
        assert found[-2] < PICK_UP, found
        assert found[-1] < 3 * PICK_UP, found

    @pytest.mark.parametrize("loss", ["terminate", "restart", "outage"])
    def test_a_lost_connection_is_survived(
        self, postgres_url: str, postgres_server: Any, loss: str
    ) -> None:
        """When the server drops every connection (pg_terminate_backend, an immediate
        restart, or one after 8 s down, longer than a read waits for the server),
        the runner keeps delivering, and soon as fast as before."""
        sleeper = Sleeper(postgres_url)
        with in_threads(sleeper.runner):
            with Store(postgres_url) as store:
                sleeper.latency(store, "before the loss")
            if loss == "terminate":
                with psycopg.connect(postgres_url, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
            else:
                postgres_server.restart(down=8.0 if loss == "outage" else 0.0)
            with Store(postgres_url) as store:
                assert sleeper.latency(store, "after the loss") < 60
                assert sleeper.latency(store, "back to normal") < 3 * PICK_UP
        assert sleeper.runner.turns == 3
