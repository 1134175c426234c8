"""AgentRunner in this process, on a fake clock: delivery, recurrence, retries, leases, config."""

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from alarms_app import delivered, in_threads, make_agent, make_handlers
from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.types import NotHandled
from helpers import ghost_runner, integrity

from effectful_durable import (
    AgentRunner,
    ConfigError,
    PersistentAgent,
    RunnerConfig,
    Store,
)
from effectful_durable.runner import FakeClock
from effectful_durable.store.alarms import make_schedule
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

START = 1_800_000_000.0


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(START)


@pytest.fixture
def store(store_url: str):
    with Store(store_url) as opened:
        yield opened


def runner(store_url: str, clock: FakeClock, **options: Any) -> AgentRunner:
    options.setdefault("handlers", make_handlers)
    return AgentRunner(store_url, agents=make_agent, clock=clock, **options)


def schedule(store: Store, clock: FakeClock, agent_id: str, action: str, **when: Any) -> str:
    return store.schedule_alarm(
        agent_id, action, make_schedule(clock.now(), **when), now=clock.now()
    )


class TestDelivery:
    """Due alarms become turns of their agents, marked done in the same commit."""

    def test_one_shot_alarm_fires_once_at_its_time(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """An alarm due in an hour is not delivered before, and delivered once after."""
        alarm_id = schedule(store, clock, "k", "check the oven", delay=3600)
        with runner(store_url, clock) as first:
            first.run(until=START + 3599)
            assert store.agents() == []
            first.run(until=START + 7200)
            assert first.turns == 1
        assert delivered(store.history("k")) == ["check the oven"]
        (alarm,) = store.alarms("k", include_ended=True)
        assert (alarm.alarm_id, alarm.status, alarm.ended_in) == (alarm_id, "done", 1)
        assert [v.template for v in store.versions("k")] == ["on_alarm"]

    def test_a_store_passed_in_stays_open(self, store: Store, clock: FakeClock) -> None:
        """A runner given a Store (not a path) delivers through it and leaves it open."""
        schedule(store, clock, "k", "check the oven", delay=0)
        with AgentRunner(store, agents=make_agent, handlers=make_handlers, clock=clock) as shared:
            shared.run(until=START + 1)
        assert delivered(store.history("k")) == ["check the oven"]
        schedule(store, clock, "k", "check again", delay=60)  # the caller's store still writes

    def test_interval_alarm_fires_every_hour(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """An hourly alarm run over a day of fake time is delivered 24 times."""
        schedule(store, clock, "k", "tick", every=3600)
        with runner(store_url, clock) as hourly:
            hourly.run(until=START + 24 * 3600 + 1)
        assert delivered(store.history("k")) == ["tick"] * 24
        (alarm,) = store.alarms("k")
        assert alarm.due_at.timestamp() == START + 25 * 3600

    def test_missed_occurrences_are_coalesced(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """After ten hours with no runner, an hourly alarm fires once, then on its grid."""
        schedule(store, clock, "k", "tick", every=3600)
        clock.advance(10 * 3600 + 60)
        with runner(store_url, clock) as late:
            late.run(until=clock.now() + 1)
        assert delivered(store.history("k")) == ["tick"]
        (alarm,) = store.alarms("k")
        assert alarm.due_at.timestamp() == START + 11 * 3600

    def test_missed_each_delivers_every_occurrence(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """With missed = "each" every missed occurrence is delivered."""
        schedule(store, clock, "k", "tick", every=3600)
        clock.advance(5 * 3600 + 60)
        config = RunnerConfig(missed="each")
        with runner(store_url, clock, config=config) as each:
            each.run(until=clock.now() + 1)
        assert delivered(store.history("k")) == ["tick"] * 5

    def test_cron_alarm_follows_its_expression(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """A cron alarm at minute 0 of every 6th hour fires 4 times a day."""
        schedule(store, clock, "k", "report", cron="0 */6 * * *")
        with runner(store_url, clock) as cron:
            cron.run(until=START + 24 * 3600 - 1)
        assert delivered(store.history("k")) == ["report"] * 4

    def test_agent_schedules_a_check_back_while_handling_an_alarm(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """An alarm scheduled by the delivering turn commits with it and fires later."""

        def respond(call: FakeCall) -> Any:
            if call.messages[-1]["role"] == "tool":
                return "scheduled"
            if "first" in call.last_user_text:
                return ToolCall("schedule_alarm", {"delay_seconds": 600, "action": "second"})
            return "did second"

        def handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model="fake"), FakeLLM(respond=respond)]

        schedule(store, clock, "k", "first", delay=0)
        with runner(store_url, clock, handlers=handlers) as chain:
            chain.run(until=START + 601)
        assert delivered(store.history("k")) == ["first", "second"]
        versions = store.versions("k")
        assert len(versions) == 2
        (second,) = [a for a in store.alarms("k", include_ended=True) if a.action == "second"]
        assert (second.created_in, second.ended_in) == (1, 2)

    def test_model_is_told_which_alarm_the_turn_delivers(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """The delivering turn's system message names the alarm, its due time and now."""
        systems: list[str] = []

        def respond(call: FakeCall) -> str:
            content = call.messages[0]["content"]
            systems.append(" ".join(block["text"] for block in content))
            return "ok"

        def handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model="fake"), FakeLLM(respond=respond)]

        alarm_id = schedule(store, clock, "k", "look", delay=60)
        clock.advance(3600)
        with runner(store_url, clock, handlers=handlers) as noting:
            noting.run(until=clock.now())
        (system,) = systems
        assert f"this turn delivers your alarm {alarm_id}, due 2027-01-15 08:01:00 UTC" in system
        assert "it is now 2027-01-15 09:00:00 UTC" in system
        assert "delivers your alarm" not in str(store.history("k"))  # outside the history


class TestFailures:
    """Failed deliveries back off exponentially, then the alarm is dead until re-armed."""

    def test_backoff_then_dead_then_rearm(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """Retries come 10, 20, 40, 80 s apart; after 5 failures the alarm is dead."""
        alarm_id = schedule(store, clock, "k", "fail always", delay=0)
        attempts: list[float] = []
        with runner(store_url, clock) as failing:
            while len(attempts) < 10:
                attempts.append(clock.now())
                failing.run(until=clock.now())
                (alarm,) = store.alarms("k")
                if alarm.status == "dead":
                    break
                assert alarm.next_attempt is not None
                clock.advance(alarm.next_attempt.timestamp() - clock.now())
            assert failing.errors == 5 and failing.turns == 0
        gaps = [round(b - a) for a, b in zip(attempts, attempts[1:], strict=False)]
        assert gaps == [10, 20, 40, 80]
        (dead,) = store.alarms("k")
        assert (dead.status, dead.attempts) == ("dead", 5)
        assert "cannot fail always" in (dead.last_error or "")
        assert store.agents() == []  # no failed delivery committed anything
        store.rearm_alarm(alarm_id, at=clock.now())
        (alive,) = store.alarms("k")
        assert (alive.status, alive.attempts) == ("pending", 0)

    def test_agent_without_on_alarm_is_a_clear_error(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """An agent class with no on_alarm template fails the delivery with a clear error."""

        @dataclasses.dataclass
        class Plain(PersistentAgent):
            """Plain."""

            @Template.define
            def ask(self, q: str) -> str:
                """{q}"""
                raise NotHandled

        schedule(store, clock, "p", "x", delay=0)
        config = RunnerConfig(max_attempts=1)
        with AgentRunner(
            store_url,
            agents=lambda i: Plain(agent_id=i),
            handlers=make_handlers,
            clock=clock,
            config=config,
        ) as plain:
            plain.run(until=clock.now())
        (dead,) = store.alarms("p")
        assert dead.status == "dead" and "no on_alarm template" in (dead.last_error or "")

    def test_lost_lease_commits_nothing(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """A turn whose claim another runner took meanwhile commits nothing."""
        schedule(store, clock, "k", "contested", delay=0)
        stolen: list[Any] = []

        def respond(call: FakeCall) -> str:
            if not stolen:  # mid-turn: the lease runs out, the runner's heartbeat stops
                clock.advance(301)  # (it stalled), and another runner claims the alarm
                with Store(store_url) as other:
                    with other.engine.writing() as conn:
                        conn.execute("UPDATE runner_status SET reported_at = 0")
                    stolen.append(other.alarm_queue.claim("thief", clock.now(), 300))
            return "did contested"

        def handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model="fake"), FakeLLM(respond=respond)]

        with runner(store_url, clock, handlers=handlers) as slow:
            slow.run(until=clock.now())
            assert slow.errors == 1 and slow.turns == 0
        assert stolen[0] is not None
        assert store.agents() == []
        (alarm,) = store.alarms("k")
        assert alarm.leased_by == "thief"
        assert [h.status for h in store.handoffs()] == ["failed"]

    def test_dead_runner_lease_is_taken_back_at_once(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """A lease of a runner whose process ended here (this kernel and PID namespace)
        is freed at start."""
        schedule(store, clock, "k", "orphan", delay=0)
        ghost_runner(store, "ghost")
        assert store.alarm_queue.claim("ghost", clock.now(), 3600) is not None
        with runner(store_url, clock) as heir:
            heir.run(until=clock.now() + 1)
        assert delivered(store.history("k")) == ["orphan"]


class TestLeases:
    """A claim of a claimer that keeps no heartbeat is respected until its lease runs out."""

    def test_expired_lease_of_another_host_is_taken_over(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """A claim of a claimer without a status row blocks delivery until its lease
        has passed."""
        schedule(store, clock, "k", "handed over", delay=0)
        assert store.alarm_queue.claim("elsewhere:1:abc", clock.now(), 300) is not None
        with runner(store_url, clock) as heir:
            heir.run(until=clock.now() + 299)
            assert store.agents() == []
            heir.run(until=clock.now() + 2)
        assert delivered(store.history("k")) == ["handed over"]


class TestPolling:
    """The runner sleeps, and notices alarms other processes schedule within a second."""

    def test_alarm_from_another_connection_is_noticed_within_a_second(
        self, store_url: str, store: Store
    ) -> None:
        """An alarm written by another connection while the runner sleeps starts < 1.5 s later."""
        started: list[float] = []

        def respond(call: FakeCall) -> str:
            started.append(time.time())
            return "ok"

        def handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model="fake"), FakeLLM(respond=respond)]

        with AgentRunner(store_url, agents=make_agent, handlers=handlers) as sleeper:
            thread = threading.Thread(target=sleeper.run)
            thread.start()
            try:
                time.sleep(0.5)  # the runner found nothing and sleeps (up to 1 s)
                written = time.time()
                store.schedule_alarm("k", "wake up", make_schedule(written, delay=0))
                deadline = time.monotonic() + 10
                while not started and time.monotonic() < deadline:
                    time.sleep(0.01)
            finally:
                sleeper.stop()
                thread.join(timeout=30)
        assert started and started[0] - written < 1.5


class TestConfig:
    """The TOML config: parsed strictly, reloaded, per-agent settings honoured."""

    def test_paused_agent_gets_no_alarms(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """Alarms of a paused agent wait; other agents' are delivered."""
        schedule(store, clock, "paused", "x", delay=0)
        schedule(store, clock, "active", "y", delay=0)
        config = RunnerConfig.from_mapping({"agents": {"paused": {"paused": True}}})
        with runner(store_url, clock, config=config) as picky:
            picky.run(until=clock.now() + 30)
        assert [a.agent_id for a in store.agents()] == ["active"]
        assert [a.status for a in store.alarms("paused")] == ["pending"]

    @pytest.mark.parametrize(
        ("text", "reason"),
        [
            ("[runner]\npoll_intervall = 1\n", "unknown key"),
            ("[runner]\nmax_attempts = 0\n", "max_attempts"),
            ("[runner]\npoll_interval = 5\n", "at most 1 second"),
            ("model = 3\n", "model must be a string"),
            ("[runner\n", "cannot read"),
            ('missed = "x"\n', "unknown top-level"),
        ],
        ids=["typo", "zero-attempts", "slow-poll", "model-type", "not-toml", "misplaced"],
    )
    def test_bad_files_are_refused(self, tmp_path: Path, text: str, reason: str) -> None:
        """A file that does not parse, or holds a bad value, raises ConfigError."""
        path = tmp_path / "agents.toml"
        path.write_text(text)
        with pytest.raises(ConfigError, match=reason):
            RunnerConfig.from_toml(path)

    def test_reload_applies_good_files_and_keeps_old_config_on_bad_ones(
        self, store_url: str, tmp_path: Path, clock: FakeClock, store: Store
    ) -> None:
        """A good file becomes the next generation and reaches the hook; a bad one is ignored."""
        hooks = tmp_path / "hooks.jsonl"
        path = tmp_path / "agents.toml"
        path.write_text(f'[features]\nhook_file = "{hooks}"\nmood = "calm"\n')
        schedule(store, clock, "k", "x", delay=0)
        with runner(store_url, clock, config=path) as reloading:
            reloading.run(until=clock.now())
            path.write_text(f'[features]\nhook_file = "{hooks}"\nmood = "busy"\n')
            assert reloading.reload()
            reloading.run(until=clock.now())
            assert reloading.config.features["mood"] == "busy"
            assert reloading.config_generation == 2
            path.write_text("[runner\n")
            assert not reloading.reload()
            reloading.run(until=clock.now())
            assert reloading.config_generation == 2
        moods = [line for line in hooks.read_text().splitlines()]
        assert len(moods) == 2 and '"calm"' in moods[0] and '"busy"' in moods[1]


class TestTwoRunners:
    """Two runners on one database share the alarms; each is delivered exactly once."""

    def test_each_alarm_is_delivered_once_and_in_parallel(
        self, store_url: str, store: Store
    ) -> None:
        """Two runner threads, each with its own connections, deliver 42 alarms of 8
        agents exactly once, with no lease lost (no alarm claimed twice); their first
        turns meet inside the model, so they ran at once, neither waiting for the other."""
        meet = threading.Barrier(2, timeout=60)

        def respond(call: FakeCall) -> str:
            if "meet" in call.last_user_text:
                meet.wait()  # BrokenBarrierError (a failed delivery) unless both are here
            return "done"

        def handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model="fake"), FakeLLM(respond=respond)]

        now = time.time()
        for n in range(2):  # due first: one for each runner
            store.schedule_alarm(f"agent-{n}", "meet", make_schedule(now, delay=0), now=now)
        for n in range(40):
            when = now + 0.001 * (n + 1)
            schedule = make_schedule(when, delay=0)
            store.schedule_alarm(f"agent-{n % 8}", f"job {n}", schedule, now=when)
        runners = [AgentRunner(store_url, agents=make_agent, handlers=handlers) for _ in range(2)]
        with in_threads(*runners):
            deadline = time.monotonic() + 120
            while store.alarms() and time.monotonic() < deadline:
                time.sleep(0.05)
        assert store.alarms() == []
        jobs = sorted(
            action for n in range(8) for action in delivered(store.history(f"agent-{n}"))
        )
        assert jobs == sorted(["meet", "meet"] + [f"job {n}" for n in range(40)])
        assert [one.errors for one in runners] == [0, 0]
        assert all(one.turns > 1 for one in runners), [one.turns for one in runners]
        assert sum(one.turns for one in runners) == 42
        assert integrity(store_url) == "ok"


class TestStatus:
    """The status report counts what the runner did and what waits."""

    def test_report_is_stored_for_the_cli(
        self, store_url: str, store: Store, clock: FakeClock
    ) -> None:
        """report_status stores the counts where Store.runner_statuses reads them."""
        schedule(store, clock, "k", "x", delay=0)
        schedule(store, clock, "k", "later", delay=3600)
        with runner(store_url, clock) as reporting:
            reporting.run(until=clock.now())
            report = reporting.report_status()
        assert report["turns"] == 1 and report["alarms_pending"] == 1
        assert report["agents_seen"] == 1 and report["error_rate"] == 0.0
        (stored,) = store.runner_statuses()
        assert stored["state"] == "stopped" and stored["turns"] == 1
