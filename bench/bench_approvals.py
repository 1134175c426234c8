"""Benchmark: how soon a runner acts on approvals and events, and what a suspension costs.

Offline: the agents' model is ``FakeLLM`` under effectful's ``LiteLLMProvider``; the
runner uses the real clock. Each measurement gets a fresh database (an SQLite file,
or with ``--backend postgres`` a PostgreSQL database: on ``--postgres URL``'s server,
else on a throwaway cluster from the installed server binaries). The agent is a
``Clerk`` with one tool, ``pay``, that needs approval above 100 EUR.

* decision to resumed turn: ``--approvals`` agents, each with a turn suspended on an
  approval; one runner (a thread of this process, with its own Store) sleeps; another
  connection (as another process would) approves them one by one, in random order,
  0.1-0.5 s apart. Latency = the moment the approved tool runs in the resumed turn
  (and the resumed version's ``committed_at``) minus the approval's ``decided_at``.
  On SQLite the runner notices a decision at its next look at the database (at most
  ``poll_interval``, 1 s, apart); on PostgreSQL the commit's NOTIFY wakes it.
* events per second: ``--events`` events spread over ``--agents`` agents, all sent
  before the runner starts; one runner delivers them all (``on_event`` turns).
  Printed next to the alarms per second of the same agents (``on_alarm`` turns, one
  runner), and the same ``on_event`` turns without a runner, under
  PersistenceHandler alone. Each arm runs ``--rounds`` times (2), in alternating
  order; also printed: the CPU time of the thread that ran the turns, per turn, which
  other processes on a shared machine disturb less than the wall time.
* suspend and resume: ``--turns`` turns that suspend on the tool call, are approved and
  resumed in-process (``PersistenceHandler.resume``), interleaved with as many plain
  turns that make the same tool call (20 EUR: no approval needed). Medians of the
  suspended turn, the decision, the resume, and the suspended turn + resume next to
  the plain turn, in wall time and in the thread's CPU time.

Run: ``.venv/bin/python bench/bench_approvals.py [--approvals 50] [--events 500]
[--agents 10] [--turns 200] [--rounds 2] [--backend sqlite|postgres] [--postgres URL]
[--quick]``.
No assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
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

from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import (
    AgentRunner,
    OnEvent,
    PersistenceHandler,
    PersistentAgent,
    RunnerConfig,
    Store,
    TurnSuspended,
    requires_approval,
)
from effectful_durable.store.alarms import make_schedule
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

sys.path.insert(0, str(Path(__file__).parent))
from bench_scale import postgres_databases

REQUEST = re.compile(r"\bpay (\S+) (\d+) EUR\b")

type NewDatabase = Callable[[str], str]  # a fresh database for a measurement's name

#: When each invoice's payment ran (time.time()), written by the tool in any thread.
PAID: dict[str, float] = {}


@dataclasses.dataclass
class Clerk(PersistentAgent, OnEvent):
    """You pay invoices."""

    @Tool.define
    @requires_approval(when=lambda invoice, amount: amount > 100, reason="above 100 EUR")
    def pay(self, invoice: str, amount: int) -> str:
        """Pay ``amount`` EUR on ``invoice``."""
        PAID[invoice] = time.time()
        return f"paid {amount} EUR on {invoice}"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled

    @Template.define
    def on_alarm(self, action: str) -> str:
        """An alarm is due. The alarm's action: {action}"""
        raise NotHandled


def fake_model() -> FakeLLM:
    """A model that calls ``pay`` when asked to pay, and otherwise says "done".

    One per thread (each runner has its own); it forgets the requests it answered,
    else they pile up and the cost grows with N.
    """

    def answer(call: FakeCall) -> Any:
        fake.calls.clear()
        if call.messages[-1]["role"] != "tool":
            found = REQUEST.search(call.last_user_text)
            if found:
                return ToolCall("pay", {"invoice": found[1], "amount": int(found[2])})
        return "done"

    fake = FakeLLM(respond=answer)
    return fake


def runner_for(db: str, poll_interval: float = 1.0) -> AgentRunner:
    fake = fake_model()

    def handlers(config: RunnerConfig) -> list[Any]:
        return [LiteLLMProvider(model="fake"), fake]

    return AgentRunner(
        db,
        agents=lambda agent_id: Clerk(agent_id=agent_id),
        handlers=handlers,
        config=RunnerConfig(poll_interval=poll_interval),
    )


def queued(store: Store) -> int:
    """Alarms, events and resumptions still to be delivered (one count, not a listing)."""
    counts = store.alarm_queue.counts(time.time())
    return counts["pending"] + counts["events_pending"] + counts["resumes_pending"]


def run_until_done(runner: AgentRunner, store: Store, timeout: float) -> tuple[float, float]:
    """Run the runner in a thread until nothing is queued; the elapsed and its CPU time."""
    cpu: list[float] = []

    def run() -> None:
        start = time.thread_time()
        runner.run()
        cpu.append(time.thread_time() - start)

    thread = threading.Thread(target=run)
    start = time.perf_counter()
    thread.start()
    deadline = time.monotonic() + timeout
    while queued(store) and time.monotonic() < deadline:
        time.sleep(0.05)  # a light look: on PostgreSQL it competes for the server
    elapsed = time.perf_counter() - start
    runner.stop()
    thread.join()
    return elapsed, cpu[0]


# -- 1. decision to resumed turn ---------------------------------------------------


def suspend_all(db: str, count: int) -> dict[str, str]:
    """Give ``count`` agents a turn suspended on a payment; approval id per invoice."""
    waiting: dict[str, str] = {}
    persistence = PersistenceHandler(db)
    with handler(LiteLLMProvider(model="fake")), handler(fake_model()), handler(persistence):
        for n in range(count):
            try:
                Clerk(agent_id=f"c{n}").ask(f"pay INV-{n} 420 EUR")
            except TurnSuspended as suspended:
                waiting[f"INV-{n}"] = suspended.approvals[0].approval_id
    persistence.close()
    return waiting


def decision_latency(new_db: NewDatabase, count: int) -> tuple[list[float], list[float]]:
    """Decision to approved tool run, and to resumed commit, in ms, per approval."""
    db = new_db("decisions")
    waiting = suspend_all(db, count)
    PAID.clear()
    rng = random.Random(3)
    order = list(waiting.items())
    rng.shuffle(order)
    decided: dict[str, float] = {}
    with Store(db) as store, runner_for(db) as runner:
        thread = threading.Thread(target=runner.run)
        thread.start()
        time.sleep(1.5)  # nothing is due: the runner goes to sleep
        with Store(db) as other:  # its own connection, like another process
            for invoice, approval_id in order:
                time.sleep(rng.uniform(0.1, 0.5))
                approval = other.approve(approval_id, by="bench")
                assert approval.decided_at is not None
                decided[invoice] = approval.decided_at.timestamp()
        deadline = time.monotonic() + 60
        while queued(store) and time.monotonic() < deadline:
            time.sleep(0.05)
        runner.stop()
        thread.join()
        committed = {
            f"INV-{n}": store.versions(f"c{n}")[-1].committed_at.timestamp() for n in range(count)
        }
    ran = [(PAID[invoice] - at) * 1000 for invoice, at in decided.items()]
    done = [(committed[invoice] - at) * 1000 for invoice, at in decided.items()]
    return ran, done


# -- 2. events per second ---------------------------------------------------------


def delivered_per_second(
    new_db: NewDatabase, kind: str, count: int, agents: int
) -> tuple[float, float]:
    """Send ``count`` events (or schedule as many alarms, due now); one runner delivers.

    Returns:
        Turns per second, and the runner thread's CPU ms per turn.
    """
    db = new_db(f"throughput-{kind}")
    now = time.time()
    with Store(db) as store:
        for n in range(count):
            agent_id = f"c{n % agents}"
            if kind == "event":
                store.send_event(agent_id, "invoice", {"n": n}, create=True)
            else:
                store.schedule_alarm(agent_id, f"job {n}", make_schedule(now, delay=0))
        with runner_for(db) as runner:
            elapsed, cpu = run_until_done(runner, store, timeout=600)
            delivered = runner.turns
    if delivered != count:
        print(f"  warning: {delivered} of {count} {kind}s delivered", file=sys.stderr)
    return delivered / elapsed, cpu * 1000 / delivered


def plain_per_second(new_db: NewDatabase, count: int, agents: int) -> tuple[float, float]:
    """The same ``on_event`` turns, called directly under PersistenceHandler."""
    db = new_db("plain-events")
    clerks = [Clerk(agent_id=f"c{n}") for n in range(agents)]
    persistence = PersistenceHandler(db)
    with handler(LiteLLMProvider(model="fake")), handler(fake_model()), handler(persistence):
        start, cpu = time.perf_counter(), time.thread_time()
        for n in range(count):
            clerks[n % agents].on_event("invoice", json.dumps({"n": n}))
        elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    persistence.close()
    return count / elapsed, cpu * 1000 / count


def throughputs(
    new_db: NewDatabase, count: int, agents: int, rounds: int
) -> dict[str, tuple[float, float]]:
    """Each arm ``rounds`` times, in alternating order: turns/s and CPU ms per turn, overall.

    The machine may be shared: alternating the arms spreads the other processes' load
    over them alike.
    """
    arms = ["event", "alarm", "plain"]
    totals = {arm: [0.0, 0.0] for arm in arms}  # seconds, CPU seconds
    for round_ in range(rounds):
        for arm in arms if round_ % 2 == 0 else arms[::-1]:
            if arm == "plain":
                rate, cpu = plain_per_second(new_db, count, agents)
            else:
                rate, cpu = delivered_per_second(new_db, arm, count, agents)
            totals[arm][0] += count / rate
            totals[arm][1] += cpu * count / 1000
    done = count * rounds
    return {arm: (done / wall, cpu * 1000 / done) for arm, (wall, cpu) in totals.items()}


# -- 3. suspend and resume --------------------------------------------------------


def suspend_resume_cost(
    new_db: NewDatabase, turns: int, pool: int
) -> dict[str, dict[str, list[float]]]:
    """Per turn, in ms of wall and of CPU time: plain tool turn; suspended turn, decision, resume.

    Each arm cycles through ``pool`` agents of its own, so that both arms' histories
    grow alike (effectful's cost per model request grows with the history).
    """
    db = new_db("cost")
    phases = ("plain", "suspend", "approve", "resume")
    times: dict[str, dict[str, list[float]]] = {
        c: {k: [] for k in phases} for c in ("wall", "cpu")
    }
    plain = [Clerk(agent_id=f"plain{k}") for k in range(pool)]
    held = [Clerk(agent_id=f"held{k}") for k in range(pool)]
    persistence = PersistenceHandler(db)
    store = persistence.store
    clock = [(0.0, 0.0)]

    def lap(phase: str | None) -> None:
        now = (time.perf_counter(), time.thread_time())
        if phase is not None:
            times["wall"][phase].append((now[0] - clock[0][0]) * 1000)
            times["cpu"][phase].append((now[1] - clock[0][1]) * 1000)
        clock[0] = now

    def plain_turn(n: int) -> None:
        lap(None)
        plain[n % pool].ask(f"pay P-{n} 20 EUR")
        lap("plain")

    def held_turn(n: int) -> None:
        clerk = held[n % pool]
        lap(None)
        try:
            clerk.ask(f"pay H-{n} 420 EUR")
        except TurnSuspended as suspended:
            approval_id = suspended.approvals[0].approval_id
        else:
            msg = f"the turn of {clerk.agent_id} did not suspend"
            raise RuntimeError(msg)
        lap("suspend")
        store.approve(approval_id, by="bench")
        lap("approve")
        persistence.resume(clerk)
        lap("resume")

    with handler(LiteLLMProvider(model="fake")), handler(fake_model()), handler(persistence):
        for n in range(-2 * pool, turns):  # the first round of each agent is a warm-up
            first, second = (plain_turn, held_turn) if n % 2 else (held_turn, plain_turn)
            first(n)
            second(n)
            if n < 0:
                for values in (*times["wall"].values(), *times["cpu"].values()):
                    values.clear()
    persistence.close()
    return times


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--approvals", type=int, default=50)
    parser.add_argument("--events", type=int, default=500)
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--turns", type=int, default=200, help="suspended turns (and plain ones)")
    parser.add_argument("--rounds", type=int, default=2, help="of the events/s measurement")
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--postgres", help="a PostgreSQL server URL to create databases on")
    parser.add_argument("--quick", action="store_true", help="a smoke run (~40 s)")
    parser.add_argument("--dir", help="parent directory of the temporary databases")
    args = parser.parse_args()
    if args.quick:
        args.approvals, args.events, args.turns, args.rounds = 10, 50, 20, 1
    with ExitStack() as stack:
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=args.dir)))
        if args.backend == "postgres":
            new_postgres = stack.enter_context(postgres_databases(args.postgres))

            def new_db(name: str) -> str:
                return str(new_postgres())
        else:

            def new_db(name: str) -> str:
                return str(tmp / f"{name}-{time.monotonic_ns()}.db")

        delivered_per_second(new_db, "event", 2, 1)  # imports, first turns
        wakes = "woken by NOTIFY" if args.backend == "postgres" else "polling every 1 s"
        ran, done = decision_latency(new_db, args.approvals)
        print(
            f"{args.backend}, decision to resumed turn ({args.approvals} approvals by another "
            f"connection, runner {wakes}): approved tool runs after median "
            f"{statistics.median(ran):.1f} ms, p99 {p(ran, 0.99):.1f} ms; resumed turn "
            f"committed after median {statistics.median(done):.1f} ms, "
            f"p99 {p(done, 0.99):.1f} ms"
        )
        rates = throughputs(new_db, args.events, args.agents, args.rounds)
        (events, events_cpu), (alarms, alarms_cpu), (plain, plain_cpu) = (
            rates[arm] for arm in ("event", "alarm", "plain")
        )
        print(
            f"{args.backend}, one runner ({args.events} events, {args.agents} agents, "
            f"{args.rounds} round(s)): {events:.1f} events/s ({events_cpu:.1f} ms CPU each); "
            f"as many alarms, same agents: {alarms:.1f} alarms/s ({alarms_cpu:.1f} ms CPU "
            f"each); the same on_event turns without a runner, under PersistenceHandler: "
            f"{plain:.1f}/s ({plain_cpu:.1f} ms CPU each)"
        )
        times = suspend_resume_cost(new_db, args.turns, min(args.agents, args.turns))
        for clock, what in (("wall", "wall time"), ("cpu", "CPU time")):
            med = {k: statistics.median(v) for k, v in times[clock].items()}
            pairs = zip(times[clock]["suspend"], times[clock]["resume"], strict=True)
            total = statistics.median([s + r for s, r in pairs])
            print(
                f"{args.backend}, {what} per turn ({args.turns} of each, medians): plain "
                f"tool turn {med['plain']:.2f} ms; suspended turn {med['suspend']:.2f} ms "
                f"+ resume {med['resume']:.2f} ms = {total:.2f} ms "
                f"({total / med['plain']:.2f}x); the decision (Store.approve) "
                f"{med['approve']:.2f} ms"
            )
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load average: {load} (1, 5, 15 min; the machine may be shared)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
