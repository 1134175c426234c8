"""A process for the PgBouncer tests (tests/processes/test_pgbouncer.py): turns through one URL.

Usage:

- ``python tests/programs/pgbouncer_child.py turns URL NAME THREADS TURNS AGENTS``: prints
  ``ready`` once imported and waits for a line on stdin; then THREADS threads
  each run TURNS turns over AGENTS shared agents (``agent-0`` ...), waiting for
  an agent another turn holds (``wait=60``). Each turn asks its agent to
  remember a note of its own (``NAME-t1-0003``). Prints one JSON line per
  failed turn (``{"note", "error", "message"}``), then ``done``; exits 1 if any
  turn failed.
- ``python tests/programs/pgbouncer_child.py hold URL AGENT``: runs a turn of AGENT that
  prints ``in-turn`` inside the model call and waits there for a line on stdin,
  then prints ``committed`` once the turn committed.
"""

import json
import os
import sys
import threading

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

from child import say
from helpers import Assistant, persisted, running

from effectful_durable import PersistenceHandler
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall


def remember_then_answer(call: FakeCall) -> Reply:
    """Each turn asks the agent to remember its question, then answers."""
    if call.messages[-1]["role"] == "user":
        return ToolCall("remember", {"note": call.last_user_text.split(": ")[-1]})
    return "done"


def turns(url: str, name: str, threads: int, count: int, agents: int) -> int:
    persistence = PersistenceHandler(url, wait=60)
    llm = FakeLLM(respond=remember_then_answer)
    failed: list[dict[str, str]] = []

    def work(thread: int) -> None:
        with running(llm, persistence):
            for step in range(count):
                agent = Assistant(agent_id=f"agent-{(thread + step) % agents}")
                note = f"{name}-t{thread}-{step:04d}"
                try:
                    agent.ask(note)
                except Exception as error:  # reported to the test, which fails on it
                    failed.append(
                        {"note": note, "error": type(error).__name__, "message": str(error)}
                    )

    say("ready")
    sys.stdin.readline()
    workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    persistence.close()
    for record in failed:
        say(json.dumps(record))
    say("done")
    return 1 if failed else 0


def hold(url: str, agent_id: str) -> int:
    def block(call: FakeCall) -> str:
        say("in-turn")
        sys.stdin.readline()
        return "child answer"

    with persisted(url, FakeLLM(respond=block)):
        Assistant(agent_id=agent_id).ask("from the child")
    say("committed")
    return 0


def main() -> int:
    mode, url = sys.argv[1], sys.argv[2]
    if mode == "turns":
        name, threads, count, agents = sys.argv[3], *map(int, sys.argv[4:7])
        return turns(url, name, threads, count, agents)
    return hold(url, sys.argv[3])


if __name__ == "__main__":
    sys.exit(main())
