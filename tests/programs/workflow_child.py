"""A fork server that runs a multi-agent workflow, for tests/processes/test_workflow_crash.py.

Importing litellm costs seconds per process, so this program imports everything
once and then forks one real child process per run of the workflow, which the test
kills with SIGKILL at random moments. The server itself stays single-threaded and
never opens a database, so every child starts clean. Protocol, one line each way:

    -> ready threads=N            (imports done; N threads alive, must be 1)
    <- run DIR VARIANT DELAY_MS   (VARIANT: "same", or one of DIVERGED to change a step)
    -> pid N                      (the forked child running the workflow once)
    -> exit CODE | signal SIGNUM  (0 done, 3 diverged, 1 other error)

A run works in DIR: ``wf.db`` the database (or the PostgreSQL database whose URL
``db.url`` holds, when that file exists), ``out.json`` the final output,
``calls.log`` one JSON line per model call (``"event": "call"``, written and
fsync'd before the model answers, so calls cut off by a kill are counted) and one
per answer handed back (``"event": "answer"``), and ``error.txt`` the error of a
run that failed.
"""

import os
import sys

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import dataclasses
import inspect
import json
import threading
import time
import traceback
import zlib
from pathlib import Path

import pydantic
import pydantic_core
from effectful.handlers.llm import Template
from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled
from helpers import Assistant, running

from effectful_durable import PersistenceHandler, PersistentAgent, WorkflowDivergedError
from effectful_durable.testing import FakeCall, FakeLLM

WORKERS = ("worker-1", "worker-2")
PARTS = 3
#: Steps of one run: 3 plan parts, 2 workers x 3 parts, 6 reviews, 1 summary.
STEPS = PARTS + len(WORKERS) * PARTS + len(WORKERS) * PARTS + 1
#: Variants that change one step's arguments, by the step they change.
DIVERGED = {"diverged-planner": "planner#1", "diverged-worker": "worker-2#2"}


@dataclasses.dataclass
class Verdict:
    ok: bool
    score: int


class Summary(pydantic.BaseModel):
    accepted: int
    best: str
    scores: list[int]


@dataclasses.dataclass
class Reviewer(PersistentAgent):
    """You review work."""

    @Template.define
    def review(self, work: str) -> Verdict:
        """Judge this work: {work}"""
        raise NotHandled


@dataclasses.dataclass
class Planner(Assistant):
    """You plan and summarise."""

    @Template.define
    def summarize(self, verdicts: list[Verdict]) -> Summary:
        """Summarise these verdicts: {verdicts}"""
        raise NotHandled


class StepTracker(ObjectInterpretation):
    """Remembers, per thread, which template call (and arguments) is talking to the model.

    Installed outside PersistenceHandler, it sees only the steps that really run,
    never the replayed ones. Arguments are taken as the journal takes them.
    """

    def __init__(self) -> None:
        super().__init__()
        self._local = threading.local()

    def current(self) -> list[object] | None:
        stack = getattr(self._local, "stack", [])
        return stack[-1] if stack else None

    @implements(Template.__apply__)
    def _apply(self, template: Template, *args: object, **kwargs: object) -> object:
        arguments = inspect.signature(template).bind(*args, **kwargs).arguments
        step = [template.__name__, pydantic_core.to_jsonable_python(arguments, fallback=repr)]
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(step)
        try:
            return fwd()
        finally:
            stack.pop()


def answer(call: FakeCall) -> object:
    """The model's answer: a function of the request's text only, never of call order."""
    text = call.last_user_text
    if call.response_format is None:
        return f"answer to <{text}>"
    if text.startswith("Judge this work:"):
        digest = zlib.crc32(text.encode())
        return Verdict(ok=digest % 3 != 0, score=digest % 100)
    verdicts = json.loads(text.split(": ", 1)[1])  # "Summarise these verdicts: [...]"
    scores = [verdict["score"] for verdict in verdicts]
    accepted = sum(verdict["ok"] for verdict in verdicts)
    return Summary(accepted=accepted, best=f"review {scores.index(max(scores))}", scores=scores)


def model(calls: Path, delay: float, tracker: StepTracker) -> FakeLLM:
    """The deterministic model, which logs each call durably before answering it."""
    fd = os.open(calls, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(event: str, text: str) -> None:
        step = tracker.current()
        line = {"event": event, "step": step, "text": text, "pid": os.getpid()}
        os.write(fd, (json.dumps(line) + "\n").encode())  # one write: lines never interleave
        os.fsync(fd)

    def respond(call: FakeCall) -> object:
        log("call", call.last_user_text)
        time.sleep(delay)  # so that kills land inside calls, between steps and in commits
        reply = answer(call)
        log("answer", call.last_user_text)
        return reply

    return FakeLLM(respond=respond)


def database(directory: Path) -> Path | str:
    """The database of the runs in ``directory``: the URL in ``db.url``, or ``wf.db``."""
    url = directory / "db.url"
    return url.read_text() if url.exists() else directory / "wf.db"


def workflow(directory: Path, variant: str, delay: float) -> dict[str, object]:
    """Plan, work in two parallel threads, review, summarise; return every result."""
    tracker = StepTracker()
    llm = model(directory / "calls.log", delay, tracker)
    persistence = PersistenceHandler(database(directory), workflow="wf")
    try:
        with running(llm, tracker, persistence):
            questions = [f"plan part {n}" for n in range(PARTS)]
            if variant == "diverged-planner":
                questions[1] = "plan part one, reworded"
            planner = Planner(agent_id="planner")
            parts = [planner.ask(question) for question in questions]
            done: dict[str, list[str]] = {}
            failures: list[BaseException] = []
            # The workers start each task together, so that their model calls overlap
            # however the threads are scheduled (the kill tests wait for both in flight).
            in_step = threading.Barrier(len(WORKERS))

            def work(name: str) -> None:
                try:
                    # Handlers are thread-local: each thread installs the whole stack.
                    with running(llm, tracker, persistence):
                        agent = Assistant(agent_id=name)
                        tasks = [f"{name} does {part}" for part in parts]
                        if variant == "diverged-worker" and name == "worker-2":
                            tasks[2] = f"{name} does part 2 differently"
                        done[name] = []
                        for task in tasks:
                            in_step.wait()
                            done[name].append(agent.ask(task))
                except BaseException as error:
                    failures.append(error)
                    in_step.abort()  # the other worker stops too, instead of waiting

            threads = [threading.Thread(target=work, args=(name,)) for name in WORKERS]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if failures:
                raise failures[0]
            reviewer = Reviewer(agent_id="reviewer")
            verdicts = [reviewer.review(w) for name in WORKERS for w in done[name]]
            summary = planner.summarize(verdicts)
    finally:
        persistence.close()
    return {
        "parts": parts,
        "done": done,
        "verdicts": [dataclasses.asdict(v) for v in verdicts],
        "summary": summary.model_dump(),
    }


def run_child(directory: str, variant: str, delay_ms: str) -> int:
    """Run the workflow once in this (forked) process; the exit code says how it went."""
    os.dup2(2, 1)  # stdout is the server's protocol: nothing of ours may land there
    path = Path(directory)
    try:
        result = workflow(path, variant, float(delay_ms) / 1000)
    except WorkflowDivergedError as error:
        (path / "error.txt").write_text(f"{type(error).__name__}: {error}")
        return 3
    except BaseException:
        (path / "error.txt").write_text(traceback.format_exc())
        return 1
    (path / "out.tmp").write_text(json.dumps(result, sort_keys=True, indent=1))
    os.replace(path / "out.tmp", path / "out.json")
    return 0


def main() -> None:
    print(f"ready threads={threading.active_count()}", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command != "run":
            continue
        if threading.active_count() != 1:  # forking a threaded process copies held locks
            print(f"refused threads={threading.active_count()}", flush=True)
            continue
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = run_child(*args)
            finally:
                os._exit(code)
        print(f"pid {pid}", flush=True)
        status = os.waitpid(pid, 0)[1]
        if os.WIFSIGNALED(status):
            print(f"signal {os.WTERMSIG(status)}", flush=True)
        else:
            print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    main()
