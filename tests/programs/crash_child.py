"""A child process for processes/test_crash.py: it runs turns of one agent until it is killed.

Usage: ``python tests/programs/crash_child.py DB_PATH [--durability normal|full]
[--keep-versions K]``

Importing litellm costs seconds, so one child serves many turns. The parent drives it
with one command per line on stdin, and it answers with one line per event on stdout::

    (at start)   ->  loaded               imports done; the database is not touched yet
    open         ->  ready <version>      the handler is open; <version> is the one on disk
    run <n>      ->  committed <version>  after each of n turns, then done <version>
    block        ->  in-turn <turn>       the turn's handoff is committed, its tool ran, and
                                          its second model call now blocks until SIGKILL
    (EOF)        ->  exit status 0

Turn k asks ``turn k``. The fake model answers deterministically: it calls the agent's
``bump`` tool, which increments the persisted ``count`` field, then answers ``answer k``.
The test module imports ``Counter``, ``FakeModel`` and ``question`` from here to continue
the same agent in its own process. (effectful sends this docstring to the model too, as
the first part of the agent's system prompt: templates prompt with their module's doc.)
"""

import os

# litellm downloads a price list on import unless told to use its bundled copy.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import argparse
import dataclasses
import re
import sys
import time

from child import running, say
from effectful.handlers.llm import Template, Tool
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent, Store
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

AGENT_ID = "counter"
BLOCK_SECONDS = 120  # a blocked child that nobody kills still ends, with status 3


@dataclasses.dataclass
class Counter(PersistentAgent):
    """You count turns."""

    count: int = 0

    @Tool.define
    def bump(self, turn: int) -> str:
        """Count one more turn."""
        self.count += 1
        return f"turn {turn}: count {self.count}"

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


def question(turn: int) -> str:
    """What turn ``turn`` asks."""
    return f"turn {turn}"


class FakeModel:
    """The model: for turn k, first call ``bump(turn=k)``, then answer ``answer k``.

    With ``blocking`` set, the second call of a turn announces ``in-turn k`` and
    sleeps instead of answering, so that the parent can kill the process there.
    """

    def __init__(self) -> None:
        self.blocking = False

    def __call__(self, call: FakeCall) -> Reply:
        found = re.fullmatch(r"Answer: turn (\d+)", call.last_user_text)
        if found is None:
            msg = f"unexpected question {call.last_user_text!r}"
            raise AssertionError(msg)
        turn = int(found[1])
        if call.messages[-1]["role"] != "tool":
            return self.first(turn)
        if self.blocking:
            say("in-turn", turn)
            time.sleep(BLOCK_SECONDS)
            os._exit(3)
        return f"answer {turn}"

    def first(self, turn: int) -> Reply:
        """Turn ``turn``'s first answer: its tool call."""
        return ToolCall("bump", {"turn": turn}, id=f"call_{turn}")


def on_disk_version(store: Store) -> int:
    """The agent's committed version as the database holds it (0 before its first turn)."""
    return next((a.version for a in store.agents() if a.agent_id == AGENT_ID), 0)


def serve(db_path: str, durability: str, keep_versions: int | None = None) -> None:
    """Answer the parent's commands until stdin closes."""
    model = FakeModel()
    bot = Counter(agent_id=AGENT_ID)
    persistence: PersistenceHandler | None = None
    say("loaded")
    with running(FakeLLM(respond=model)):
        for line in sys.stdin:
            if not line.strip():
                continue
            command, *operands = line.split()
            if command == "open":
                persistence = PersistenceHandler(
                    db_path, durability=durability, keep_versions=keep_versions
                )
                say("ready", on_disk_version(persistence.store))
                continue
            if persistence is None:
                msg = f"{command!r} before 'open'"
                raise RuntimeError(msg)
            with handler(persistence):
                if command == "run":
                    for _ in range(int(operands[0])):
                        bot.ask(question(on_disk_version(persistence.store) + 1))
                        say("committed", on_disk_version(persistence.store))
                    say("done", on_disk_version(persistence.store))
                elif command == "block":
                    model.blocking = True
                    bot.ask(question(on_disk_version(persistence.store) + 1))
                else:
                    msg = f"unknown command {command!r}"
                    raise RuntimeError(msg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db_path")
    parser.add_argument("--durability", choices=["normal", "full"], default="normal")
    parser.add_argument("--keep-versions", type=int, default=None)
    args = parser.parse_args(argv)
    serve(args.db_path, args.durability, args.keep_versions)
    return 0


if __name__ == "__main__":
    sys.exit(main())
