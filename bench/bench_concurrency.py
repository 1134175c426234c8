"""Benchmark: how many alarms one runner delivers when the model takes its time, by concurrency.

Offline: each model request answers after ``--latency`` seconds (0.5 by default:
a real model's answer takes 0.5 to 5 s), through effectful's ``LiteLLMProvider``
and ``FakeLLM``; the runner uses the real clock. For each concurrency N (``--n``,
default 1,8,32,64), on a fresh database (an SQLite file, or with ``--backend
postgres`` a PostgreSQL database on ``--postgres URL``'s server, else a throwaway
cluster from the installed server binaries):

* throughput: ``--alarms`` alarms (fewer for small N), due now, of ``--agents``
  agents; one runner delivers them all. Printed: alarms per second.
* delay below saturation: alarms due at a steady rate, half of what N turns at
  once can deliver (N / latency / 2 per second, at most half the throughput
  measured), over ``--span`` seconds. Delay = the moment the alarm's turn asks
  the model minus its due time; printed as median and p99 in milliseconds.

Run: ``.venv/bin/python bench/bench_concurrency.py [--n 1,8,32,64] [--latency 0.5]
[--backend sqlite|postgres] [--quick]``. No assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
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
from effectful.ops.types import NotHandled

from effectful_durable import AgentRunner, PersistentAgent, RunnerConfig, Store
from effectful_durable.store.alarms import make_schedule
from effectful_durable.testing import FakeCall, FakeLLM

sys.path.insert(0, str(Path(__file__).parent))
from bench_scale import postgres_databases

ACTION = re.compile(r"The alarm's action: job (\d+) due (\S+)")

type NewDatabase = Callable[[str], str]


@dataclasses.dataclass
class Worker(PersistentAgent):
    """You do jobs."""

    @Template.define
    def on_alarm(self, action: str) -> str:
        """An alarm is due. The alarm's action: {action}"""
        raise NotHandled


class SlowModel:
    """Answers each request after ``latency`` seconds; notes how late each alarm's turn began."""

    def __init__(self, latency: float) -> None:
        self.latency = latency
        self.delays: list[float] = []
        self.lock = threading.Lock()
        self.fake: FakeLLM | None = None

    def __call__(self, call: FakeCall) -> str:
        asked = time.time()
        found = ACTION.search(call.last_user_text)
        with self.lock:
            if self.fake is not None:
                self.fake.calls.clear()  # else they pile up
            if found:
                self.delays.append(asked - float(found[2]))
        time.sleep(self.latency)
        return "done"


def schedule(store: Store, count: int, agents: int, due: Callable[[int], float]) -> None:
    now = time.time()
    for n in range(count):
        at = due(n)
        store.schedule_alarm(
            f"agent-{n % agents}",
            f"job {n} due {at!r}",
            make_schedule(now, at=max(at, now)),
            now=now,
        )


def deliver(db: str, model: SlowModel, concurrency: int, timeout: float) -> float:
    """Run one runner until nothing is pending; return the seconds it took."""
    fake = FakeLLM(respond=model)
    model.fake = fake

    def handlers(config: RunnerConfig) -> list[Any]:
        return [LiteLLMProvider(model="fake"), fake]

    runner = AgentRunner(
        db,
        agents=lambda agent_id: Worker(agent_id=agent_id),
        handlers=handlers,
        config=RunnerConfig(poll_interval=1.0),
        max_concurrency=concurrency,
    )
    thread = threading.Thread(target=runner.run)
    with Store(db) as store:
        start = time.perf_counter()
        thread.start()
        deadline = time.monotonic() + timeout
        while store.alarm_queue.counts(time.time())["pending"] and time.monotonic() < deadline:
            time.sleep(0.05)
        elapsed = time.perf_counter() - start
    runner.stop()
    thread.join()
    runner.close()
    return elapsed


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", default="1,8,32,64", help="comma-separated concurrencies")
    parser.add_argument("--latency", type=float, default=0.5, help="seconds per model answer")
    parser.add_argument("--alarms", type=int, default=600)
    parser.add_argument("--agents", type=int, default=200)
    parser.add_argument("--span", type=float, default=20.0, help="seconds of the delay run")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--postgres", help="a PostgreSQL server URL to create databases on")
    parser.add_argument("--quick", action="store_true", help="a smoke run (~30 s)")
    parser.add_argument("--dir", help="parent directory of the temporary databases")
    args = parser.parse_args()
    levels = [int(n) for n in args.n.split(",")]
    if args.quick:
        levels, args.alarms, args.span = [1, 8], 40, 5.0
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir)))
        if args.backend == "postgres":
            new_postgres = stack.enter_context(postgres_databases(args.postgres))

            def new_db(name: str) -> str:
                return str(new_postgres())
        else:

            def new_db(name: str) -> str:
                return str(tmp / f"{name}-{time.monotonic_ns()}.db")

        print(
            f"{args.backend}, model latency {args.latency:g} s, {args.agents} agents "
            f"(load average {os.getloadavg()[0]:.2f} at start)"
        )
        header = ("N", "alarms", "alarms/s", "delay med ms", "p99 ms", "rate/s")
        print(" ".join(f"{h:>{w}}" for h, w in zip(header, (4, 7, 9, 13, 8, 7), strict=True)))
        for concurrency in levels:
            # Enough alarms for about 8 s of work at N turns at once, at most --alarms.
            count = min(args.alarms, max(8, int(8 * concurrency / args.latency)))
            db = new_db(f"throughput-{concurrency}")
            with Store(db) as store:
                schedule(store, count, args.agents, lambda n: 0.0)
            model = SlowModel(args.latency)
            elapsed = deliver(db, model, concurrency, timeout=600)
            per_second = count / elapsed
            rate = min(concurrency / args.latency, per_second) / 2
            spread = max(int(rate * args.span), 4)
            db = new_db(f"delay-{concurrency}")
            first_due = time.time() + 3.0
            with Store(db) as store:
                schedule(store, spread, args.agents, lambda n, t=first_due, r=rate: t + n / r)
            model = SlowModel(args.latency)
            deliver(db, model, concurrency, timeout=args.span + 120)
            delays = [d * 1000 for d in model.delays]
            print(
                f"{concurrency:>4} {count:>7} {per_second:>9.1f} "
                f"{statistics.median(delays):>13.1f} {p(delays, 0.99):>8.1f} {rate:>7.1f}"
            )
    print(f"load average: {os.getloadavg()[0]:.2f} (the machine may be shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
