"""Benchmark: how fast AgentRunners deliver alarms, and how late.

Offline: the agents' model is ``FakeLLM`` under effectful's ``LiteLLMProvider``; the
runner uses the real clock. Three measurements, each on a fresh database (an SQLite
file, or with ``--backend postgres`` a PostgreSQL database: on ``--postgres URL``'s
server, else on a throwaway cluster from the installed server binaries):

* throughput: ``--alarms`` alarms, all due now, spread over ``--agents`` agents;
  ``--runners`` runners (threads of this process, each with its own Store) deliver
  them all. Printed: alarms per second, and the same agents' plain turns per second
  under PersistenceHandler alone (no runner), for comparison.
* delay, known alarms: ``--delayed`` alarms due at random moments over ``--span``
  seconds, all scheduled before the runner sleeps; it sleeps until each is due.
* delay, other process: the same number of alarms scheduled one by one, while the
  runner sleeps, by another connection (as another process would), each due 0.2 s
  after it is written; on SQLite the runner notices them at its next poll (<= 1 s),
  on PostgreSQL the commit's NOTIFY wakes it.

Delay = the moment the model is asked (the alarm's turn has started) minus the
alarm's due time; printed as median and p99 in milliseconds.

Run: ``.venv/bin/python bench/bench_alarms.py [--alarms 500] [--agents 10]
[--runners 1] [--backend sqlite|postgres] [--postgres URL] [--quick]``. No assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import re
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import (
    AgentRunner,
    AlarmTools,
    PersistenceHandler,
    PersistentAgent,
    RunnerConfig,
    Store,
)
from effectful_durable.store.alarms import make_schedule
from effectful_durable.testing import FakeCall, FakeLLM

sys.path.insert(0, str(Path(__file__).parent))
from bench_scale import postgres_databases

ACTION = re.compile(r"The alarm's action: job (\d+)")

type NewDatabase = Callable[[str], str]  # a fresh database for a measurement's name


@dataclasses.dataclass
class Worker(PersistentAgent):
    """You do jobs."""

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled

    @Template.define
    def on_alarm(self, action: str) -> str:
        """An alarm is due. The alarm's action: {action}"""
        raise NotHandled


@dataclasses.dataclass
class ToolWorker(Worker, AlarmTools):
    """You do jobs, and may schedule alarms."""

    @Template.define
    def on_alarm(self, action: str) -> str:
        """An alarm is due. The alarm's action: {action}"""
        raise NotHandled


class Model:
    """Answers every request at once, noting when each alarm's turn asked it."""

    def __init__(self) -> None:
        self.asked: dict[int, float] = {}
        self.fake: FakeLLM | None = None

    def __call__(self, call: FakeCall) -> str:
        if self.fake is not None:
            self.fake.calls.clear()  # else they pile up, and cost grows with N
        found = ACTION.search(call.last_user_text)
        if found:
            self.asked.setdefault(int(found[1]), time.time())
        return "done"


def runner_for(db: str, model: Model, fake: FakeLLM, kind: type[Worker] = Worker) -> AgentRunner:
    def handlers(config: RunnerConfig) -> list[Any]:
        return [LiteLLMProvider(model="fake"), fake]

    return AgentRunner(
        db,
        agents=lambda agent_id: kind(agent_id=agent_id),
        handlers=handlers,
        config=RunnerConfig(poll_interval=1.0),
    )


def pending(store: Store) -> int:
    """How many alarms are still to be delivered (one count, not a listing)."""
    return store.alarm_queue.counts(time.time())["pending"]


def run_until_done(runners: list[AgentRunner], store: Store, timeout: float) -> float:
    """Run each runner in a thread until no alarm is pending; return the elapsed time."""
    threads = [threading.Thread(target=runner.run) for runner in runners]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + timeout
    while pending(store) and time.monotonic() < deadline:
        time.sleep(0.1)  # a light look: on PostgreSQL it competes for the server
    elapsed = time.perf_counter() - start
    for runner in runners:
        runner.stop()
    for thread in threads:
        thread.join()
    return elapsed


def throughput(
    new_db: NewDatabase, alarms: int, agents: int, kind: type[Worker], runners: int = 1
) -> tuple[float, float]:
    db = new_db(f"throughput-{kind.__name__}")
    model = Model()
    fakes = [FakeLLM(respond=model) for _ in range(runners)]  # FakeLLM is not thread-safe
    now = time.time()
    with Store(db) as store, ExitStack() as stack:
        for n in range(alarms):
            store.schedule_alarm(f"w{n % agents}", f"job {n}", make_schedule(now, delay=0))
        started = [stack.enter_context(runner_for(db, model, fake, kind)) for fake in fakes]
        elapsed = run_until_done(started, store, timeout=600)
        delivered = sum(runner.turns for runner in started)
        assert delivered == alarms, (delivered, alarms)
    fake = fakes[0]
    plain_db = new_db(f"plain-{kind.__name__}")
    workers = [kind(agent_id=f"w{n}") for n in range(agents)]
    persistence = PersistenceHandler(plain_db)
    with handler(LiteLLMProvider(model="fake")), handler(fake), handler(persistence):
        start = time.perf_counter()
        for n in range(alarms):
            workers[n % agents].ask(f"job {n}")
            fake.calls.clear()
        plain = time.perf_counter() - start
    persistence.close()
    return alarms / elapsed, alarms / plain


def delays_known(new_db: NewDatabase, count: int, span: float) -> list[float]:
    db = new_db("known")
    model = Model()
    rng = random.Random(1)
    start = time.time() + 0.5
    due = {n: start + rng.uniform(0, span) for n in range(count)}
    with Store(db) as store:
        for n, at in due.items():
            store.schedule_alarm(f"w{n % 10}", f"job {n}", make_schedule(time.time(), at=at))
        with runner_for(db, model, FakeLLM(respond=model)) as runner:
            run_until_done([runner], store, timeout=span + 60)
    return [(model.asked[n] - due[n]) * 1000 for n in due]


def delays_other_process(new_db: NewDatabase, count: int) -> list[float]:
    db = new_db("other")
    model = Model()
    due: dict[int, float] = {}
    rng = random.Random(2)
    with Store(db) as store, runner_for(db, model, FakeLLM(respond=model)) as runner:
        thread = threading.Thread(target=runner.run)
        thread.start()
        with Store(db) as other:  # its own connection, like another process
            for n in range(count):
                time.sleep(rng.uniform(0.05, 0.3))
                due[n] = time.time() + 0.2
                other.schedule_alarm(
                    f"w{n % 10}", f"job {n}", make_schedule(time.time(), at=due[n])
                )
        deadline = time.monotonic() + 60
        while pending(store) and time.monotonic() < deadline:
            time.sleep(0.1)
        runner.stop()
        thread.join()
    return [(model.asked[n] - due[n]) * 1000 for n in due]


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--alarms", type=int, default=500)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--delayed", type=int, default=100)
    parser.add_argument("--span", type=float, default=30.0)
    parser.add_argument("--runners", type=int, default=1, help="runners in the throughput run")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--postgres", help="a PostgreSQL server URL to create databases on")
    parser.add_argument("--quick", action="store_true", help="a smoke run (~15 s)")
    parser.add_argument("--dir", help="parent directory of the temporary databases")
    args = parser.parse_args()
    if args.quick:
        args.alarms, args.delayed, args.span = 50, 20, 6.0
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir)))
        if args.backend == "postgres":
            new_postgres = stack.enter_context(postgres_databases(args.postgres))

            def new_db(name: str) -> str:
                return str(new_postgres())
        else:

            def new_db(name: str) -> str:
                return str(tmp / f"{name}-{time.monotonic_ns()}.db")

        throughput(new_db, 2, 1, ToolWorker)  # imports, first turns
        for kind, what in ((Worker, "no tools"), (ToolWorker, "AlarmTools' 3 tools")):
            per_second, plain = throughput(new_db, args.alarms, args.agents, kind, args.runners)
            print(
                f"{args.backend} throughput, agent with {what}: {per_second:.1f} alarms/s "
                f"delivered by {args.runners} runner(s) ({args.alarms} alarms, "
                f"{args.agents} agents); the same turns without a runner, under "
                f"PersistenceHandler: {plain:.1f}/s"
            )
        known = delays_known(new_db, args.delayed, args.span)
        print(
            f"delay, alarms known in advance ({args.delayed} over {args.span:g} s): "
            f"median {statistics.median(known):.1f} ms, p99 {p(known, 0.99):.1f} ms"
        )
        other = delays_other_process(new_db, args.delayed)
        print(
            f"delay, alarms scheduled by another connection while the runner sleeps "
            f"({args.delayed}): median {statistics.median(other):.1f} ms, "
            f"p99 {p(other, 0.99):.1f} ms"
        )
    print(f"load average: {os.getloadavg()[0]:.2f} (the machine may be shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
