"""A child process for tests/processes/test_memory_crash.py: turns that write memory, until killed.

Usage: ``python tests/programs/memory_child.py DB_PATH [--durability normal|full]``

It speaks crash_child.py's protocol (``loaded``; ``open`` -> ``ready <version>``;
``run <n>`` -> ``committed <version>`` per turn, then ``done <version>``; ``block``
-> ``in-turn <turn>``, after the turn's memory writes are staged, then sleeps until
killed). Turn k's first model request calls the memory tools (see ``writes``); its
second answers ``answer k``.
"""

import os

# litellm downloads a price list on import unless told to use its bundled copy.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import argparse
import dataclasses
import sys
from typing import Any

import crash_child
from child import running, say
from effectful.handlers.llm import Template
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent, StateTools, Store
from effectful_durable.testing import FakeLLM, Reply, ToolCall

AGENT_ID = "rememberer"
PAD = "x" * 300  # makes each turn's writes span more than one page


@dataclasses.dataclass
class Rememberer(PersistentAgent, StateTools):
    """You remember every turn."""

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


def writes(turn: int) -> list[ToolCall]:
    """Turn k: count = k, key turn-k, drop turn-(k-3), a note; every 5th clears notes first."""
    calls = [
        ToolCall("put_state", {"key": "count", "value": str(turn)}),
        ToolCall(
            "put_state", {"key": f"turn-{turn}", "value": f'{{"k": {turn}, "pad": "{PAD}"}}'}
        ),
    ]
    if turn > 3:
        calls.append(ToolCall("delete_state_key", {"key": f"turn-{turn - 3}"}))
    if turn % 5 == 0:
        calls.append(ToolCall("clear_old_context", {"older_than_seconds": 0}))
    calls.append(ToolCall("add_to_context", {"item": f"turn {turn}"}))
    return calls


def expected_memory(version: int) -> dict[str, Any]:
    """The keys version ``version`` holds."""
    if version == 0:
        return {}
    kept = range(max(1, version - 2), version + 1)
    return {"count": version} | {f"turn-{k}": {"k": k, "pad": PAD} for k in kept}


def expected_notes(version: int) -> list[str]:
    """The texts of the notes version ``version`` holds, oldest first."""
    if version == 0:
        return []
    return [f"turn {k}" for k in range(max(1, version - version % 5), version + 1)]


class FakeModel(crash_child.FakeModel):
    """Turn k: first the memory tool calls, then ``answer k`` (or block, when blocking)."""

    def first(self, turn: int) -> Reply:
        return writes(turn)


def on_disk_version(store: Store) -> int:
    return next((a.version for a in store.agents() if a.agent_id == AGENT_ID), 0)


def serve(db_path: str, durability: str) -> None:
    model = FakeModel()
    bot = Rememberer(agent_id=AGENT_ID)
    persistence: PersistenceHandler | None = None
    say("loaded")
    with running(FakeLLM(respond=model)):
        for line in sys.stdin:
            if not line.strip():
                continue
            command, *operands = line.split()
            if command == "open":
                persistence = PersistenceHandler(db_path, durability=durability)
                say("ready", on_disk_version(persistence.store))
                continue
            if persistence is None:
                msg = f"{command!r} before 'open'"
                raise RuntimeError(msg)
            with handler(persistence):
                if command == "run":
                    for _ in range(int(operands[0])):
                        bot.ask(f"turn {on_disk_version(persistence.store) + 1}")
                        say("committed", on_disk_version(persistence.store))
                    say("done", on_disk_version(persistence.store))
                elif command == "block":
                    model.blocking = True
                    bot.ask(f"turn {on_disk_version(persistence.store) + 1}")
                else:
                    msg = f"unknown command {command!r}"
                    raise RuntimeError(msg)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db_path")
    parser.add_argument("--durability", choices=["normal", "full"], default="normal")
    args = parser.parse_args(argv)
    serve(args.db_path, args.durability)
    return 0


if __name__ == "__main__":
    sys.exit(main())
