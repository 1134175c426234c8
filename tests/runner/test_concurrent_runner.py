"""A runner that runs many turns at once: of different agents, in order per agent, fairly."""

import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from alarms_app import ACTION, delivered, in_threads, make_agent
from effectful.handlers.llm.completions import LiteLLMProvider
from helpers import integrity

from effectful_durable import AgentRunner, ConfigError, RunnerConfig, Store
from effectful_durable.runner import FakeClock
from effectful_durable.store.alarms import make_schedule
from effectful_durable.testing import FakeCall, FakeLLM


class SlowModel:
    """A model that answers each request after ``latency`` seconds and records who asked."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.lock = threading.Lock()
        self.running: dict[str, int] = defaultdict(int)  # agent -> requests in flight
        self.overlaps: list[str] = []
        self.most_at_once = 0
        self.at_once = 0
        self.order: list[str] = []

    def __call__(self, call: FakeCall) -> str:
        found = ACTION.search(call.last_user_text)
        action = found[1].strip() if found else "?"
        agent = action.split(":")[0]
        with self.lock:
            self.running[agent] += 1
            self.at_once += 1
            self.most_at_once = max(self.most_at_once, self.at_once)
            if self.running[agent] > 1:
                self.overlaps.append(action)
            self.order.append(action)
        time.sleep(self.latency)
        with self.lock:
            self.running[agent] -= 1
            self.at_once -= 1
        return f"did {action}"


def runner(store_url: str, model: SlowModel, **options: Any) -> AgentRunner:
    def handlers(config: RunnerConfig) -> list[Any]:
        return [LiteLLMProvider(model="fake"), FakeLLM(respond=model)]

    config = RunnerConfig(poll_interval=0.05, **options.pop("config", {}))
    return AgentRunner(store_url, agents=make_agent, handlers=handlers, config=config, **options)


def schedule(store: Store, agent_id: str, action: str, delay: float = 0.0) -> str:
    return store.schedule_alarm(agent_id, action, make_schedule(time.time(), delay=delay))


def wait_until_done(store: Store, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(a.status == "pending" for a in store.alarms()):
            return
        time.sleep(0.05)
    raise AssertionError(f"alarms still pending: {store.alarms()}")


def test_turns_of_different_agents_run_at_once(db_path: Path) -> None:
    """16 agents' alarms, 0.3 s of model latency each: up to 8 turns run at once, no more."""
    store_url = str(db_path)  # SQLite: what is tested here is the runner's own
    model = SlowModel(0.3)
    with Store(store_url) as store:
        for n in range(16):
            schedule(store, f"a{n}", f"a{n}:job")
        with in_threads(runner(store_url, model, max_concurrency=8)):
            wait_until_done(store)
        for n in range(16):
            assert delivered(store.history(f"a{n}")) == [f"a{n}:job"]
        assert integrity(store_url) == "ok"
    assert 2 <= model.most_at_once <= 8  # how many overlap depends on the machine's load


def test_one_agent_runs_one_turn_at_a_time_in_order(db_path: Path) -> None:
    """An agent's five due alarms are delivered one after the other, by due time."""
    store_url = str(db_path)  # SQLite: what is tested here is the runner's own
    model = SlowModel(0.05)
    with Store(store_url) as store:
        for n in range(5):
            schedule(store, "solo", f"solo:{n}", delay=n * 0.001)
        for n in range(6):
            schedule(store, f"o{n}", f"o{n}:x")
        with in_threads(runner(store_url, model, max_concurrency=8)):
            wait_until_done(store)
        assert delivered(store.history("solo")) == [f"solo:{n}" for n in range(5)]
    assert model.overlaps == []


def test_an_agent_with_many_alarms_does_not_starve_the_others(db_path: Path) -> None:
    """200 due alarms of one agent and one each of four others: the four go early."""
    store_url = str(db_path)  # SQLite: what is tested here is the runner's own
    model = SlowModel(0.01)
    with Store(store_url) as store:
        for n in range(200):
            schedule(store, "busy", f"busy:{n}")
        for n in range(4):
            schedule(store, f"q{n}", f"q{n}:x", delay=0.01)
        with in_threads(runner(store_url, model, max_concurrency=4)):
            wait_until_done(store, timeout=120)
    first = model.order[:12]
    assert {f"q{n}:x" for n in range(4)} <= set(first), first


@pytest.mark.parametrize("concurrency", [1, 4])
def test_leases_are_renewed_while_a_turn_runs(store_url: str, concurrency: int) -> None:
    """Turns longer than the lease keep it: a second runner never takes their alarms."""
    model = SlowModel(4.0)  # a lease of 1.5 s, renewed every 0.5 s: slack for a busy machine
    with Store(store_url) as store:
        for n in range(4):
            schedule(store, f"l{n}", f"l{n}:long")
        runners = [
            runner(store_url, model, max_concurrency=concurrency, config={"lease_seconds": 1.5})
            for _ in range(2)
        ]
        with in_threads(*runners):
            wait_until_done(store)
        for n in range(4):
            assert delivered(store.history(f"l{n}")) == [f"l{n}:long"]
    assert sum(r.errors for r in runners) == 0
    assert sum(r.turns for r in runners) == 4


def test_stop_lets_every_turn_in_flight_finish(db_path: Path) -> None:
    """A stop within the grace period: the turns in flight all commit, no new one starts."""
    store_url = str(db_path)  # SQLite: what is tested here is the runner's own
    model = SlowModel(0.5)
    with Store(store_url) as store:
        for n in range(6):
            schedule(store, f"s{n}", f"s{n}:x")
        worker = runner(store_url, model, max_concurrency=3)
        thread = threading.Thread(target=worker.run)
        thread.start()
        deadline = time.monotonic() + 30
        while len(worker.status()["in_progress"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        in_flight = {turn["agent"] for turn in worker.status()["in_progress"]}
        assert len(in_flight) == 3
        worker.stop(grace=10)
        thread.join(30)
        worker.close()
        done = {a.agent_id for a in store.alarms(include_ended=True) if a.status == "done"}
        assert done == in_flight
        assert store.handoffs() == []


def test_stop_past_the_grace_period_cancels_turns_at_their_next_request(
    db_path: Path,
) -> None:
    """Turns still running past the grace stop at their next model request, as interrupted."""
    store_url = str(db_path)  # SQLite: what is tested here is the runner's own
    model = SlowModel(0.4)
    with Store(store_url) as store:
        for n in range(2):
            schedule(store, f"g{n}", f"g{n}:x")
        worker = runner(store_url, model, max_concurrency=2)
        thread = threading.Thread(target=worker.run)
        thread.start()
        deadline = time.monotonic() + 30
        while len(worker.status()["in_progress"]) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        worker._delivery.cancel.set()  # as the grace period's end does
        worker.stop(grace=0)
        thread.join(30)
        worker.close()
        assert not thread.is_alive()
        # Each turn either committed before the cancel reached it, or left a
        # handoff and its alarm, pending again, for the next runner.
        for alarm in store.alarms(include_ended=True):
            assert alarm.status in ("done", "pending")
            assert alarm.attempts == 0


def test_concurrency_comes_from_the_config_and_a_reload_changes_it(
    store_url: str, tmp_path: Path
) -> None:
    config = tmp_path / "agents.toml"
    config.write_text("[runner]\nconcurrency = 4\n")
    worker = AgentRunner(store_url, agents=make_agent, config=config, handlers=lambda c: [])
    try:
        assert worker.status()["max_concurrency"] == 4
        config.write_text("[runner]\nconcurrency = 16\n")
        assert worker.reload()
        worker._apply_pending_config()
        assert worker.status()["max_concurrency"] == 16
        config.write_text("[runner]\nconcurrency = 0\n")
        assert not worker.reload()  # a bad value is logged; 16 stays
        assert worker.status()["max_concurrency"] == 16
    finally:
        worker.close()
    with pytest.raises(ConfigError, match="concurrency must be an integer from 1 to 1024"):
        RunnerConfig(concurrency=True)
    with pytest.raises(ConfigError, match="max_concurrency must be"):
        AgentRunner(store_url, agents=make_agent, max_concurrency=0)


def test_a_fake_clock_waits_for_the_turns_in_flight(db_path: Path) -> None:
    """On a fake clock, time jumps only when no turn runs: a day of hourly alarms, 4 agents."""
    store_url = str(db_path)
    clock = FakeClock(1_900_000_000.0)
    model = SlowModel(0.0)
    with Store(store_url) as store:
        for n in range(4):
            store.schedule_alarm(
                f"h{n}", f"h{n}:tick", make_schedule(clock.now(), every=3600), now=clock.now()
            )
        worker = runner(store_url, model, max_concurrency=4, clock=clock)
        with worker:
            worker.run(until=clock.now() + 24 * 3600 + 1)
        for n in range(4):
            assert delivered(store.history(f"h{n}")) == [f"h{n}:tick"] * 24
    assert model.overlaps == []


@pytest.mark.parametrize("concurrency", [1, 4], ids=["one-at-a-time", "four-at-once"])
def test_run_until_returns_once_nothing_is_due(db_path: Path, concurrency: int) -> None:
    """``run(until=...)`` past its time still delivers every alarm due: 8 agents' alarms,
    turns of 0.3 s, ``until`` 0.1 s ahead; it returns with none of them pending."""
    store_url = str(db_path)  # SQLite: what is tested here is the runner's own
    model = SlowModel(0.3)
    with Store(store_url) as store:
        for n in range(8):
            schedule(store, f"u{n}", f"u{n}:job")
        with runner(store_url, model, max_concurrency=concurrency) as worker:
            worker.run(until=time.time() + 0.1)
        assert [a.agent_id for a in store.alarms() if a.status == "pending"] == []
        for n in range(8):
            assert delivered(store.history(f"u{n}")) == [f"u{n}:job"]
