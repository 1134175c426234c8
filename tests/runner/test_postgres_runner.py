"""What only PostgreSQL does for alarms: claims that skip each other, NOTIFY wake-ups.

Runners on several machines share one database there. A claim skips an alarm
another runner is claiming (``FOR UPDATE SKIP LOCKED``) instead of waiting for
it; a commit that makes an alarm due notifies the runners (a trigger, so every
way of writing one does), and a runner sleeping until its next due alarm is
woken by it; a runner whose listening connection is lost polls meanwhile and
listens again once it is back. Timings are asserted with wide margins only:
a runner that listens sleeps 30 s between looks at the database, so a delivery
within 15 s of the commit can only come from the NOTIFY.
"""

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from alarms_app import in_threads, make_agent
from effectful.handlers.llm.completions import LiteLLMProvider
from helpers import commit_writes

from effectful_durable import AgentRunner, AlarmLeaseLostError, RunnerConfig, Store
from effectful_durable.runner import SystemClock
from effectful_durable.store.engine.postgres.listen import CHANNEL
from effectful_durable.store.parts.alarms import AlarmWrite, Claim, make_schedule, new_alarm_id
from effectful_durable.testing import FakeCall, FakeLLM

LONG_SLEEP = 20.0  # a runner sleeping this long is listening (it polls every <= 1 s else)
WITHIN = 15.0  # a delivery this soon after its commit was woken by the NOTIFY


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


@contextmanager
def notifications(url: str) -> Iterator[Callable[[], list[str]]]:
    """LISTEN as a runner does; yields a function returning the payloads received since."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"LISTEN {CHANNEL}")

        def received() -> list[str]:
            # Notifications arrive in commit order: ours comes after every earlier one.
            conn.execute("SELECT pg_notify(%s, 'mark')", (CHANNEL,))
            payloads = []
            for notify in conn.notifies(timeout=30):
                if notify.payload == "mark":
                    return payloads
                payloads.append(notify.payload)
            raise AssertionError("our own notification did not come back within 30 s")

        yield received


class TestNotify:
    """Each commit that makes an alarm claimable notifies the runners, once, on commit."""

    def test_writes_that_make_an_alarm_due_notify(self, postgres_url: str) -> None:
        """Scheduling (in a turn or not), a released or retried claim, a re-arm and a
        rollback that restores an alarm notify; a claim, a cancel, a final failure
        and a turn that fails to commit do not."""
        now = time.time()
        with Store(postgres_url) as store, notifications(postgres_url) as received:
            write = AlarmWrite()
            write.schedule(new_alarm_id(), "in a turn", make_schedule(now, delay=60), now)
            commit_writes(store, "a", write)
            assert received() == ["public"]  # once for the transaction, naming the schema
            alarm_id = due_now(store, "a", "due")
            assert received() == ["public"]
            queue = store.alarm_queue
            claim = queue.claim("r", now + 1, 30)
            assert claim is not None and received() == []
            assert queue.release(claim, now + 2) and received() == ["public"]
            claim = queue.claim("r", now + 3, 30)
            assert claim is not None and received() == []
            assert queue.fail(claim, "boom", now + 10) == "pending" and received() == ["public"]
            claim = queue.claim("r", now + 11, 30)
            assert claim is not None and received() == []
            assert queue.fail(claim, "boom", None) == "dead" and received() == []
            store.rearm_alarm(alarm_id)
            assert received() == ["public"]
            assert store.cancel_alarm(alarm_id) and received() == []
            aborted = AlarmWrite()  # inserts an alarm, then fails: the turn rolls back
            aborted.schedule(new_alarm_id(), "never", make_schedule(now, delay=5), now)
            aborted.deliver(Claim(alarm_id, "a", "due", claim.schedule, 0, "x", now), None, now)
            with pytest.raises(AlarmLeaseLostError):
                commit_writes(store, "a", aborted)
            assert received() == []
            cancel = AlarmWrite()
            cancel.cancel(write.added[0][0])
            commit_writes(store, "a", cancel)
            assert received() == []
            store.rollback("a", 1)  # "in a turn" is pending again
            assert received() == ["public"]


class WatchedClock(SystemClock):
    """The real clock, telling the test when the runner goes to sleep for long."""

    def __init__(self) -> None:
        self.asleep = threading.Event()

    def sleep(self, seconds: float, wake: threading.Event) -> None:
        if seconds >= LONG_SLEEP:
            self.asleep.set()
        try:
            super().sleep(seconds, wake)
        finally:
            self.asleep.clear()


class Sleeper:
    """One runner in a thread on a watched clock, recording when each turn starts."""

    def __init__(self, url: str) -> None:
        self.clock = WatchedClock()
        self.started: dict[str, float] = {}

        def respond(call: FakeCall) -> str:
            self.started.setdefault(call.last_user_text, time.monotonic())
            return "done"

        def handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model="fake"), FakeLLM(respond=respond)]

        self.runner = AgentRunner(url, agents=make_agent, handlers=handlers, clock=self.clock)

    def wait_until_listening(self) -> None:
        """Wait until the runner sleeps for long, which it does only while it listens."""
        assert self.clock.asleep.wait(timeout=120), "the runner never slept for long"

    def latency(self, store: Store, action: str) -> float:
        """Seconds from the commit of an alarm due now to the start of its turn."""
        written = time.monotonic()
        due_now(store, "k", action)
        deadline = written + 60
        while time.monotonic() < deadline:
            started = [at for text, at in self.started.items() if action in text]
            if started:
                return started[0] - written
            time.sleep(0.01)
        raise AssertionError(f"{action!r} was not delivered within 60 s")


class TestWakeUps:
    """A runner sleeping until its next alarm wakes for one committed meanwhile."""

    def test_a_notify_wakes_a_sleeping_runner(self, postgres_url: str) -> None:
        """An alarm committed while the runner sleeps for 30 s starts within 15 s."""
        sleeper = Sleeper(postgres_url)
        with Store(postgres_url) as store, in_threads(sleeper.runner):
            sleeper.wait_until_listening()
            assert sleeper.latency(store, "wake up") < WITHIN

    @pytest.mark.parametrize("loss", ["terminate", "restart", "outage"])
    def test_a_lost_listening_connection_is_survived(
        self, postgres_url: str, postgres_server: Any, loss: str
    ) -> None:
        """When the server drops every connection (pg_terminate_backend, an immediate
        restart, or one after 8 s down, longer than a read waits for the server),
        the runner keeps delivering, listens again, and is woken again."""
        sleeper = Sleeper(postgres_url)
        with in_threads(sleeper.runner):
            sleeper.wait_until_listening()
            if loss == "terminate":
                with psycopg.connect(postgres_url, autocommit=True) as admin:
                    admin.execute(
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
            else:
                postgres_server.restart(down=8.0 if loss == "outage" else 0.0)
            with Store(postgres_url) as store:
                # Delivered whether the runner still polls or listens again already.
                assert sleeper.latency(store, "after the loss") < 60
                sleeper.wait_until_listening()
                assert sleeper.latency(store, "listening again") < WITHIN
        assert sleeper.runner.turns == 2
