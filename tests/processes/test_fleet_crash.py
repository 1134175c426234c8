"""A fleet of runners SIGKILLed at random delivers every alarm and event once, in order
(DESIGN.md, promises 8 and 11), on PostgreSQL.

Three runner hosts (``tests/programs/fleet_app.py``: each imports once and forks
``effectful-durable run ... --concurrency 4`` again after every kill): one here,
two in containers of their own (``netns.container``: a host name and a PID
namespace of their own) under other host names, so that only heartbeats tell
whether their runners live. Agents get one-shot alarms
(``Store.schedule_alarm``) and events (``Store.send_event``, sent when due),
mixed, due over a span of time; meanwhile a random runner is SIGKILLed (its
process group) every few seconds and started again: at once, or, for a runner
"on another machine", sometimes only after that machine was down long enough
for the others to find it dead by its heartbeat.

Then, once the runners drained everything: every alarm and event was delivered
exactly once (its note is in its agent's committed state once, one turn each),
each agent's in the order they were due, nothing is left pending; the time from
due to the turn's commit is printed (median, p99, ``-s``).

The default run (``make test``) is a short sample: 30 agents x 4, 3 kills every
3 to 5 s. ``EFFECTFUL_DURABLE_CRASH=full`` (``make crash``): 200 agents x 5 due
over a minute, 20 kills every 5 to 10 s.
"""

import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import alive
from netns import container, containers, host_pid
from paths import PROGRAMS
from runner_procs import environment

from effectful_durable import Store
from effectful_durable.store.alarm_queue import DEAD_AFTER
from effectful_durable.store.alarms import make_schedule

HOST_APP = PROGRAMS / "fleet_app.py"
FULL = os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full"
AGENTS, EACH, SPAN = (200, 5, 60.0) if FULL else (30, 4, 15.0)
KILLS, EVERY = (20, (5.0, 10.0)) if FULL else (3, (3.0, 5.0))
ELSEWHERE = ["fleet-other-1", "fleet-other-2"]  # the hosts "on other machines"
DOWN = DEAD_AFTER + 5  # seconds a machine may stay down: its runner is found dead meanwhile
MODEL_SECONDS = 0.1  # per model call (two a turn): a kill finds turns in flight
LEAD = 5.0  # seconds from scheduling to the first due time
DRAIN = 300.0 if FULL else 120.0  # seconds the runners have to finish, after the last kill


@dataclass
class Item:
    """An alarm or an event of the plan: its agent, its note, when it is due."""

    agent: str
    label: str
    kind: str  # "alarm" or "event"
    offset: float  # seconds after the start


class Host:
    """A runner host (``fleet_app.py``), here or under another host name, and its runner."""

    def __init__(self, name: str | None, url: str, config: Path, log: Path) -> None:
        self.name = name or os.uname().nodename
        self.elsewhere = name is not None
        env = environment(FLEET_APP_SECONDS=str(MODEL_SECONDS))
        command = [sys.executable, str(HOST_APP), url, str(config)]
        if name is not None:  # another host name, and PID namespace: another machine
            command = [*container(name), *command]
        self.log = log
        with log.open("ab") as stderr:
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                env=env,
                start_new_session=True,
            )
        self.runner: int | None = None  # the running runner's pid (and process group)

    def read_line(self) -> str:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"{self.name} ended ({self.proc.poll()}):\n{self.tail()}")
        return line.strip()

    def start(self) -> None:
        """Fork a runner."""
        assert self.proc.stdin is not None and self.runner is None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()
        word, pid = self.read_line().split()
        assert word == "child", word
        self.runner = host_pid(self.proc.pid, int(pid)) if self.elsewhere else int(pid)

    def kill(self) -> None:
        """SIGKILL the runner's process group, and wait until its pid is gone."""
        if self.runner is None:
            return
        try:
            os.killpg(self.runner, signal.SIGKILL)
        except ProcessLookupError:
            pass
        deadline = time.monotonic() + 10
        while alive(self.runner) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.runner = None

    def close(self) -> None:
        self.kill()
        self.proc.kill()
        self.proc.wait(timeout=30)

    def tail(self, lines: int = 40) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def plan(rng: random.Random) -> list[Item]:
    """Each agent's alarms and events, mixed at random, due one in each slice of the
    span (so that two of an agent's are at least a tenth of a slice apart)."""
    items = []
    for a in range(AGENTS):
        for i in range(EACH):
            kind = rng.choice(["alarm", "event"])
            offset = SPAN * (i + rng.uniform(0.05, 0.95)) / EACH
            items.append(Item(f"f{a:03d}", f"{kind[0]}{a:03d}-{i}", kind, offset))
    return sorted(items, key=lambda item: item.offset)


def send_events(url: str, items: list[Item], start: float, failed: list[BaseException]) -> None:
    """Send each event when it is due (its ``sent_at`` is its due time)."""
    try:
        with Store(url) as store:
            for item in items:
                time.sleep(max(start + item.offset - time.time(), 0))
                store.send_event(item.agent, "ping", item.label, create=True)
    except BaseException as error:
        failed.append(error)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


@pytest.mark.slow
def test_a_fleet_killed_at_random_delivers_each_alarm_and_event_once_in_order(
    postgres_url: str, tmp_path: Path
) -> None:
    """Three runners, two "on other machines", SIGKILLed at random and started again
    while agents' alarms and events fall due: each is delivered once, each agent's
    in due order, and nothing is left pending."""
    containers()
    seed = int(os.environ.get("EFFECTFUL_DURABLE_SEED", random.randrange(2**32)))
    print(f"\nseed {seed} (EFFECTFUL_DURABLE_SEED)")
    rng = random.Random(seed)
    items = plan(rng)
    config = tmp_path / "runner.toml"
    config.write_text("[runner]\npoll_interval = 0.1\n")  # lease_seconds: the default, 300
    with Store(postgres_url):
        pass  # the schema, before three runners race to make it
    hosts: list[Host] = []
    failed: list[BaseException] = []
    kills: list[tuple[str, float]] = []
    sender: threading.Thread | None = None
    began = time.monotonic()
    try:
        for n, name in enumerate([None, *ELSEWHERE]):
            hosts.append(Host(name, postgres_url, config, tmp_path / f"host{n}.log"))
        for host in hosts:
            assert host.read_line() == "loaded"
            host.start()
        start = time.time() + LEAD
        with Store(postgres_url) as store:
            for item in items:
                if item.kind == "alarm":
                    at = start + item.offset
                    store.schedule_alarm(item.agent, item.label, make_schedule(time.time(), at=at))
        events = [item for item in items if item.kind == "event"]
        sender = threading.Thread(target=send_events, args=(postgres_url, events, start, failed))
        sender.start()

        # The kill loop: a random runner every EVERY seconds, never the last one
        # running; a runner "on another machine" comes back at once or after DOWN.
        time.sleep(max(start - time.time(), 0))
        restarts: list[tuple[float, Host]] = []
        next_kill = time.monotonic() + rng.uniform(*EVERY)
        while len(kills) < KILLS or restarts:
            now = time.monotonic()
            for at, host in [r for r in restarts if r[0] <= now]:
                restarts.remove((at, host))
                host.start()
            running = [host for host in hosts if host.runner is not None]
            if len(kills) < KILLS and now >= next_kill and len(running) >= 2:
                if not kills:  # first a machine elsewhere goes down: a heartbeat rescue
                    victim, down = hosts[1], DOWN
                else:
                    victim = rng.choice(running)
                    down = rng.choice([0.0, DOWN]) if victim is not hosts[0] else 0.0
                victim.kill()
                kills.append((victim.name, down))
                restarts.append((now + down, victim))
                next_kill = now + rng.uniform(*EVERY)
            time.sleep(0.05)
        sender.join()
        assert not failed, failed

        # Drain: the runners deliver what is left, a dead runner's claims included.
        killed = time.monotonic()
        with Store(postgres_url) as store:
            while store.alarms() or store.events():
                if time.monotonic() - killed > DRAIN:
                    left = [*store.alarms(), *store.events()]
                    logs = "\n".join(host.tail() for host in hosts)
                    raise AssertionError(f"{len(left)} left, e.g. {left[:3]}\n{logs}")
                time.sleep(0.5)
        drained = time.monotonic() - killed
    finally:
        if sender is not None:
            sender.join(timeout=SPAN + 30)
        for host in hosts:
            host.close()
    took = time.monotonic() - began

    due = {item.label: start + item.offset for item in items if item.kind == "alarm"}
    expected: dict[str, list[str]] = {}
    latencies: list[float] = []
    wrong: list[str] = []
    with Store(postgres_url) as store:
        assert store.alarms() == [] and store.events() == []
        for event in store.events(include_delivered=True):
            due[event.payload] = event.sent_at.timestamp()
        for item in items:
            expected.setdefault(item.agent, []).append(item.label)
        for agent, labels in expected.items():
            labels.sort(key=due.__getitem__)
            notes = json.loads(store.turns.load(agent).state or "{}").get("notes", [])
            turns = [v for v in store.versions(agent) if v.kind == "turn"]
            if notes != labels or len(turns) != len(notes):
                wrong.append(f"{agent}: noted {notes}, due {labels}, {len(turns)} turns")
                continue
            for label, turn in zip(notes, turns, strict=True):
                latencies.append(turn.committed_at.timestamp() - due[label])
        crashed = len(store.handoffs())
    logs = "".join(host.log.read_text(errors="replace") for host in hosts)
    print(
        f"{len(items)} alarms and events of {AGENTS} agents, {len(kills)} kills "
        f"({sum(1 for _, down in kills if down)} with the machine down {DOWN:g} s): "
        f"{', '.join(f'{name}{"+down" if down else ""}' for name, down in kills)}\n"
        f"due to delivered: median {statistics.median(latencies):.2f} s, "
        f"p99 {percentile(latencies, 0.99):.2f} s, max {max(latencies):.2f} s; "
        f"drained {drained:.1f} s after the last kill; {took:.0f} s in all; "
        f"{logs.count('is dead')} runners found dead; {crashed} turns left handoffs"
    )
    assert not wrong, "\n".join(wrong[:10])
    assert len(latencies) == len(items)
    assert "Traceback" not in logs, logs[-5000:]
    if not FULL:  # a generous bound: a heartbeat rescue takes 17 s, a busy machine more
        assert percentile(latencies, 0.99) < 60.0, latencies
