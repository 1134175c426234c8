"""A fork server that runs a multi-agent workflow, for tests/test_workflow_crash.py.

Importing litellm costs seconds per process, so this program imports everything
once and then forks one real child process per run of the workflow, which the test
kills with SIGKILL at random moments. Protocol, one line each way:

    -> ready                      (imports done; no database opened)
    <- run DB OUT CALLS VARIANT   (VARIANT: "same", or "diverged" to change a step)
    -> pid N                      (the forked child running the workflow once)
    -> exit CODE | signal SIGNUM  (0 done, 3 diverged, 1 other error)
"""

import os
import sys

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import dataclasses
import json
import threading
import time
import traceback
from pathlib import Path

from effectful.handlers.llm import Template
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent, WorkflowDivergedError
from effectful_durable.testing import FakeCall, FakeLLM
from tests.helpers import Assistant, running

WORKERS = ("worker-1", "worker-2")


@dataclasses.dataclass
class Verdict:
    ok: bool
    score: int


@dataclasses.dataclass
class Reviewer(PersistentAgent):
    """You review work."""

    @Template.define
    def review(self, work: str) -> Verdict:
        """Judge this work: {work}"""
        raise NotHandled


def model(calls: Path) -> FakeLLM:
    """A deterministic model that answers by content and logs each call durably first."""

    def respond(call: FakeCall) -> object:
        text = call.last_user_text
        with calls.open("a") as log:
            log.write(json.dumps({"text": text, "pid": os.getpid()}) + "\n")
            log.flush()
            os.fsync(log.fileno())
        time.sleep(0.01)  # so that kills land inside calls, between steps and in commits
        if call.response_format is not None:
            return Verdict(ok=len(text) % 2 == 0, score=len(text))
        return f"answer to <{text}>"

    return FakeLLM(respond=respond)


def workflow(db: str, out: str, calls: str, variant: str) -> None:
    """Plan, work in two parallel threads, review; write the results to ``out``."""
    llm = model(Path(calls))
    persistence = PersistenceHandler(db, workflow="wf")
    with running(llm, persistence):
        questions = [f"plan part {n}" for n in range(3)]
        if variant == "diverged":
            questions[1] = "plan part one, reworded"  # another argument at step planner#1
        planner = Assistant(agent_id="planner")
        parts = [planner.ask(question) for question in questions]
        done: dict[str, list[str]] = {}
        failures: list[BaseException] = []

        def work(name: str) -> None:
            try:
                with running(llm, persistence):
                    agent = Assistant(agent_id=name)
                    done[name] = [agent.ask(f"{name} does {part}") for part in parts]
            except BaseException as error:
                failures.append(error)

        threads = [threading.Thread(target=work, args=(name,)) for name in WORKERS]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if failures:
            raise failures[0]
        reviewer = Reviewer(agent_id="reviewer")
        verdicts = [dataclasses.asdict(reviewer.review(w)) for n in WORKERS for w in done[n]]
    persistence.close()
    result = {"parts": parts, "done": done, "verdicts": verdicts}
    Path(out + ".tmp").write_text(json.dumps(result, sort_keys=True))
    os.replace(out + ".tmp", out)


def run_child(db: str, out: str, calls: str, variant: str) -> int:
    try:
        workflow(db, out, calls, variant)
    except WorkflowDivergedError as error:
        print(f"diverged: {error}", file=sys.stderr, flush=True)
        return 3
    except BaseException:
        traceback.print_exc()
        return 1
    return 0


def main() -> None:
    print("ready", flush=True)
    for line in sys.stdin:
        command, *args = line.split()
        if command != "run":
            continue
        pid = os.fork()
        if pid == 0:
            os._exit(run_child(*args))
        print(f"pid {pid}", flush=True)
        status = os.waitpid(pid, 0)[1]
        if os.WIFSIGNALED(status):
            print(f"signal {os.WTERMSIG(status)}", flush=True)
        else:
            print(f"exit {os.waitstatus_to_exitcode(status)}", flush=True)


if __name__ == "__main__":
    main()
