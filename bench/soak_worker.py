"""The processes of the soak (``bench/soak.py``): a zygote that forks workers and the runner.

Usage (soak.py starts it): ``python bench/soak_worker.py DB LOGDIR [--durability D]
[--agents N] [--shared S] [--threads T] [--model-ms M]``

Importing litellm costs seconds, so this process imports everything once, prints
``loaded``, then forks a child for each line on stdin and answers ``started <pid>``:

    worker <index> <start>   run turns of the worker's agents until SIGTERM or SIGKILL
    runner <index> <start>   run an AgentRunner on DB until SIGTERM or SIGKILL

SIGCHLD is ignored, so a killed child is reaped at once: a zombie would look alive to
the next runner, which frees the leases of dead runners on its host. Each child writes
its side log to ``LOGDIR/<role>-<index>-<start>-<pid>.jsonl`` (one JSON object per
line, each written with one ``write`` and fsynced) and its stderr beside it.
"""

from __future__ import annotations

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

import argparse
import contextlib
import dataclasses
import itertools
import json
import logging
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import fwd, handler
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled
from soak import (
    ALARM_ACTION,
    QUESTION,
    STEPS,
    WAIT,
    Plan,
    agent_id,
    kind_of,
    question,
    shared_id,
    step_key,
    workflow_name,
    workflows_in_progress,
)

from effectful_durable import (
    AgentRunner,
    AlarmTools,
    CompactionHandler,
    PersistenceHandler,
    PersistentAgent,
    RunnerConfig,
    SQLTools,
    StateTools,
    Store,
)
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

MAX_MESSAGES = 16  # compact every few turns
KEEP_RECENT = 6
SUMMARISE = "Summarise the conversation below"  # how summarize_context's prompt starts
SHARED_SHARE = 0.2  # of a thread's turns go to the agents all workers share


# -- the agents: one class per kind, so that each model request offers few tools ----


@dataclasses.dataclass
class Counting(PersistentAgent):
    """You are an agent of the soak test. Do what each question's plan says."""

    count: int = 0

    @Tool.define
    def bump(self) -> str:
        """Count one more turn that asked you to."""
        self.count += 1
        return f"count {self.count}"

    @Template.define
    def ask(self, question: str) -> str:
        """{question}"""
        raise NotHandled


@dataclasses.dataclass
class MemoryAgent(Counting, StateTools):
    """You are an agent of the soak test. Do what each question's plan says."""


@dataclasses.dataclass
class SQLAgent(Counting, SQLTools):
    """You are an agent of the soak test. Do what each question's plan says."""

    __sql_schema__ = "CREATE TABLE notes (slot INTEGER PRIMARY KEY, marker TEXT NOT NULL)"


@dataclasses.dataclass
class AlarmAgent(Counting, AlarmTools):
    """You are an agent of the soak test. Do what each question's plan says."""


CLASSES: dict[str, type[Counting]] = {
    "mem": MemoryAgent,
    "sql": SQLAgent,
    "alarm": AlarmAgent,
    "wf": MemoryAgent,
}


def make_agent(agent: str) -> Counting:
    """The agent of an id (the runner's factory too)."""
    return CLASSES[kind_of(agent)](agent_id=agent)


# -- side log and timing ------------------------------------------------------------


class SideLog:
    """This process's append-only log outside the database; every event is fsynced."""

    def __init__(self, path: Path) -> None:
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self._lock = threading.Lock()

    def write(self, **event: Any) -> None:
        line = (json.dumps(event, separators=(",", ":")) + "\n").encode()
        with self._lock:
            os.write(self._fd, line)  # one write: a kill leaves a whole line or none
            os.fsync(self._fd)


class Times(threading.local):
    """This thread's timings of the turn in progress, in seconds."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        # (wall, CPU) seconds: in PersistenceHandler and below it; below it only.
        self.outer: tuple[float, float] | None = None
        self.inner: tuple[float, float] | None = None
        self.model = 0.0  # inside the fake model
        self.lock = 0.0  # waiting for the agent's lock (another thread or process has it)
        self.calls = 0


TIMES = Times()


class Stopwatch(ObjectInterpretation[Any, Any]):
    """Times the outermost template call it sees in each thread into ``TIMES.<slot>``.

    Wall time, and this thread's CPU time, which other threads and processes
    taking the cores (the GIL, the machine) do not inflate.
    """

    def __init__(self, slot: str) -> None:
        super().__init__()
        self.slot = slot
        self._local = threading.local()

    @implements(Template.__apply__)
    def _apply(self, template: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self._local, "busy", False):
            return fwd()
        self._local.busy = True
        start, cpu = time.perf_counter(), time.thread_time()
        try:
            return fwd()
        finally:
            self._local.busy = False
            setattr(TIMES, self.slot, (time.perf_counter() - start, time.thread_time() - cpu))


class TimedStore(Store):
    """A Store that adds the time a turn takes to start (the wait for its agent's hold,
    and its handoff row) to ``TIMES.lock``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        start = self.turns.start

        @contextlib.contextmanager
        def timed(agent_id: str, **options: Any) -> Iterator[Any]:
            began = time.perf_counter()
            with start(agent_id, **options) as started:
                TIMES.lock += time.perf_counter() - began
                yield started

        self.turns.start = timed  # type: ignore[method-assign]


class Model:
    """The fake model of a worker: it follows the plan written in each question."""

    def __init__(self, log: SideLog, model_ms: float) -> None:
        self.log = log
        self.model_ms = model_ms

    def __call__(self, call: FakeCall) -> Reply:
        start = time.perf_counter()
        try:
            return self._answer(call)
        finally:
            TIMES.model += time.perf_counter() - start
            TIMES.calls += 1

    def _answer(self, call: FakeCall) -> Reply:
        time.sleep(random.uniform(0, 2 * self.model_ms) / 1000)
        text = call.last_user_text
        if text.startswith(SUMMARISE):
            return "the earlier turns followed their plans"
        found = QUESTION.search(text)
        if found is None:
            msg = f"unexpected request {text[:200]!r}"
            raise AssertionError(msg)
        marker, plan = found[1], Plan.parse(found[2])
        if step_key(marker) is not None:
            self.log.write(e="call", m=marker, t=time.time())
        if call.messages[-1]["role"] == "tool":
            return f"A {marker}"
        return tool_calls(marker, plan) or f"A {marker}"


def tool_calls(marker: str, plan: Plan) -> list[ToolCall]:
    """The tool calls a turn's plan asks for, with ids unique to the marker."""
    calls = []
    if plan.bump:
        calls.append(ToolCall("bump", {}, id=f"{marker}-bump"))
    if plan.mem is not None:
        arguments = {"key": f"k{plan.mem}", "value": json.dumps(marker)}
        calls.append(ToolCall("put_state", arguments, id=f"{marker}-mem"))
    if plan.sql is not None:
        arguments = {
            "statement": "INSERT OR REPLACE INTO notes (slot, marker) VALUES (?, ?)",
            "params": [plan.sql, marker],
        }
        calls.append(ToolCall("sql_execute", arguments, id=f"{marker}-sql"))
    if plan.alarm is not None:
        arguments = {
            "delay_seconds": plan.alarm,
            "action": f"alarm {marker}",
            "every_seconds": plan.every or 0,
        }
        calls.append(ToolCall("schedule_alarm", arguments, id=f"{marker}-alarm"))
    return calls


# -- a worker ------------------------------------------------------------------------


@dataclasses.dataclass
class Workflow:
    """The workflow a wf agent is in: its name, the next step, and its handler."""

    agent: str
    epoch: int
    step: int = 0
    persistence: PersistenceHandler | None = None

    @property
    def name(self) -> str:
        return workflow_name(self.agent, self.epoch)


class Worker:
    """Drives its agents from ``threads`` threads until stopped."""

    def __init__(
        self, db: str, logdir: Path, index: int, start: int, args: Any, stop: threading.Event
    ) -> None:
        self.index, self.start, self.args = index, start, args
        self.log = SideLog(logdir / f"worker-{index}-{start}-{os.getpid()}.jsonl")
        self.log.write(e="start", pid=os.getpid(), t=time.time())
        self.store = TimedStore(db, durability=args.durability)
        self.persistence = PersistenceHandler(self.store, wait=WAIT)
        self.agents = [make_agent(agent_id(index, j)) for j in range(args.agents)]
        self.stop = stop
        self.crashed = threading.Event()
        self.numbers = itertools.count(1)
        self.workflows: dict[str, Workflow] = {}
        for agent, (epoch, ended) in workflows_in_progress(logdir, index).items():
            self.workflows[agent] = Workflow(agent, epoch + ended)
            if ended:
                self.log.write(e="wf-start", a=agent, epoch=epoch + 1)

    def run(self) -> int:
        threads = [
            threading.Thread(target=self._drive, args=(self.agents[t :: self.args.threads],))
            for t in range(min(self.args.threads, len(self.agents)))
        ]
        for thread in threads:
            thread.start()
        while not self.stop.wait(0.2) and not self.crashed.is_set():
            pass
        self.stop.set()
        for thread in threads:
            thread.join()
        self.log.write(e="end", t=time.time())
        return 2 if self.crashed.is_set() else 0

    def _drive(self, agents: list[Counting]) -> None:
        # Every worker thread drives the shared agents too, through instances of its own.
        shared = [make_agent(shared_id(j)) for j in range(self.args.shared)]
        model = Model(self.log, self.args.model_ms)
        fake = FakeLLM(respond=model)
        try:
            with (
                handler(LiteLLMProvider(model="fake")),
                handler(fake),
                handler(CompactionHandler(max_messages=MAX_MESSAGES, keep_recent=KEEP_RECENT)),
                handler(Stopwatch("inner")),
            ):
                while not self.stop.is_set():
                    use_shared = shared and random.random() < SHARED_SHARE
                    agent = random.choice(shared if use_shared else agents)
                    try:
                        if kind_of(agent.agent_id) == "wf":
                            self._step(agent)
                        else:
                            self._turn(agent)
                    except Exception as error:
                        self.log.write(
                            e="fail", a=agent.agent_id, err=f"{type(error).__name__}: {error}"
                        )
                        time.sleep(0.05)
                    fake.calls.clear()  # else every request stays in memory
        except BaseException:
            sys.stderr.write(traceback.format_exc())
            self.crashed.set()

    def _turn(self, agent: Counting) -> None:
        marker = f"w{self.index}.{self.start}.{next(self.numbers)}"
        plan = Plan.draw(marker, kind_of(agent.agent_id))
        self._ask(agent, self.persistence, marker, plan)

    def _step(self, agent: Counting) -> None:
        """Run the next step of the agent's workflow; a new handler replays the done ones."""
        workflow = self.workflows.get(agent.agent_id)
        if workflow is None:
            workflow = self.workflows[agent.agent_id] = Workflow(agent.agent_id, 0)
            self.log.write(e="wf-start", a=agent.agent_id, epoch=0)
        if workflow.persistence is None:
            workflow.persistence = PersistenceHandler(
                self.store, wait=WAIT, workflow=workflow.name
            )
            workflow.step = 0
        marker = f"{workflow.name}.s{workflow.step}"
        try:
            self._ask(agent, workflow.persistence, marker, Plan.draw(marker, "wf"), workflow)
        except BaseException:
            workflow.persistence = None  # the next try runs the workflow again from step 0
            raise
        workflow.step += 1
        if workflow.step == STEPS:
            self.log.write(e="wf-end", a=agent.agent_id, epoch=workflow.epoch)
            self.workflows[agent.agent_id] = Workflow(agent.agent_id, workflow.epoch + 1)
            self.log.write(e="wf-start", a=agent.agent_id, epoch=workflow.epoch + 1)

    def _ask(
        self,
        agent: Counting,
        persistence: PersistenceHandler,
        marker: str,
        plan: Plan,
        workflow: Workflow | None = None,
    ) -> None:
        TIMES.reset()
        start = time.perf_counter()
        with handler(persistence), handler(Stopwatch("outer")):
            agent.ask(question(marker, plan))
        wall = time.perf_counter() - start
        if TIMES.inner is None:  # PersistenceHandler answered from the journal
            self.log.write(e="replay", a=agent.agent_id, m=marker, t=time.time())
            return
        assert TIMES.outer is not None
        self.log.write(
            e="turn",
            a=agent.agent_id,
            m=marker,
            v=persistence.load(agent),  # the version it committed, as this process saw it
            p=plan.text(),
            wf=workflow.name if workflow else None,
            own=round((TIMES.outer[0] - TIMES.inner[0]) * 1000, 4),
            cpu=round((TIMES.outer[1] - TIMES.inner[1]) * 1000, 4),
            lock=round(TIMES.lock * 1000, 4),
            wall=round(wall * 1000, 4),
            model=round(TIMES.model * 1000, 4),
            t=time.time(),
        )


# -- the runner ------------------------------------------------------------------------


def run_runner(db: str, logdir: Path, index: int, start: int, args: Any) -> int:
    log = SideLog(logdir / f"runner-{index}-{start}-{os.getpid()}.jsonl")
    log.write(e="start", pid=os.getpid(), t=time.time())

    def answer(call: FakeCall) -> Reply:
        time.sleep(random.uniform(0, 2 * args.model_ms) / 1000)
        text = call.last_user_text
        if text.startswith(SUMMARISE):
            return "the earlier turns followed their plans"
        found = ALARM_ACTION.search(text)
        if found is None:
            msg = f"unexpected request {text[:200]!r}"
            raise AssertionError(msg)
        log.write(e="alarm-call", m=found[1], t=time.time())
        return f"did {found[1]}"

    def make_handlers(config: RunnerConfig) -> list[Any]:
        return [
            LiteLLMProvider(model="fake"),
            FakeLLM(respond=answer),
            CompactionHandler(max_messages=MAX_MESSAGES, keep_recent=KEEP_RECENT),
        ]

    config = RunnerConfig(poll_interval=0.05, lease_seconds=30, backoff_base=1, backoff_max=5)
    with AgentRunner(
        db, agents=make_agent, handlers=make_handlers, config=config, durability=args.durability
    ) as runner:
        runner.run()
    log.write(e="end", t=time.time())
    return 0


# -- the zygote ------------------------------------------------------------------------


def fork(main: Callable[[], int], output: Path) -> int:
    """Fork a child that runs ``main`` with its output in ``output``; its pid."""
    pid = os.fork()
    if pid:
        return pid
    code = 3
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the supervisor stops us
        fd = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        code = main()
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stderr.flush()
        os._exit(code)


def serve(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    logdir = Path(args.logdir)
    print("loaded", flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        role, index_text, start_text = line.split()
        index, start = int(index_text), int(start_text)
        output = logdir / f"{role}-{index}-{start}.stderr"
        if role == "worker":

            def child(index: int = index, start: int = start) -> int:
                stop = threading.Event()
                signal.signal(signal.SIGTERM, lambda *_: stop.set())
                return Worker(args.db, logdir, index, start, args, stop).run()

        else:

            def child(index: int = index, start: int = start) -> int:
                return run_runner(args.db, logdir, index, start, args)

        pid = fork(child, output)
        print("started", pid, flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db")
    parser.add_argument("logdir")
    parser.add_argument("--durability", choices=["normal", "full"], default="normal")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--shared", type=int, default=4)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--model-ms", type=float, default=5.0)
    return serve(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
