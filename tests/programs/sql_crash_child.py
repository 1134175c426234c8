"""A child process for tests/processes/test_sql_crash.py: turns of a Ledger agent until SIGKILL.

Usage: ``python tests/programs/sql_crash_child.py DB_PATH``. Commands on stdin, one per line;
answers on stdout, one line each:

    (at start)   ->  loaded
    run <n>      ->  committed <version> after each of n turns, then done <version>
    between      ->  between <version>   the turn's main commit is done and its
                                          workspace commit has not started; it
                                          then sleeps until killed
    stamped      ->  stamped <version>   as between, but the workspace file's stamps
                                          for the new version are written (on a
                                          stamped cache: PostgreSQL's)
    block        ->  in-turn <turn>      the turn's SQL writes are made, and its next
                                          model call sleeps until killed

Turn k inserts row k into ``entries`` and adds 1 to ``totals.n`` (and adds row k's
square in a second statement), so version v holds entries 1..v and n = v.
"""

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import dataclasses
import re
import sys
import time
from typing import Any

from child import running, say
from effectful.handlers.llm import Template
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent, SQLTools, Store
from effectful_durable.store.workspace import workspace
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

AGENT_ID = "ledger"


@dataclasses.dataclass
class Ledger(PersistentAgent, SQLTools):
    """You keep a ledger."""

    __sql_schema__ = """
        CREATE TABLE entries (id INTEGER PRIMARY KEY, turn INT NOT NULL, square INT);
        CREATE TABLE totals (id INTEGER PRIMARY KEY, n INT NOT NULL);
    """

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


def hang(*words: object) -> None:
    """Say ``words``, then wait to be killed (exit 3 if nobody does)."""
    say(*words)
    time.sleep(120)
    os._exit(3)


class Model:
    def __init__(self) -> None:
        self.blocking = False

    def __call__(self, call: FakeCall) -> Reply:
        turn = int(re.fullmatch(r"Answer: turn (\d+)", call.last_user_text)[1])  # type: ignore[index]
        if call.messages[-1]["role"] != "tool":
            return [
                ToolCall("sql_insert", {"table": "entries", "values": {"id": turn, "turn": turn}}),
                ToolCall(
                    "sql_execute",
                    {
                        "statement": "INSERT INTO totals (id, n) VALUES (1, 1) "
                        "ON CONFLICT (id) DO UPDATE SET n = n + 1"
                    },
                ),
                ToolCall(
                    "sql_execute",
                    {
                        "statement": "UPDATE entries SET square = turn * turn WHERE id = ?",
                        "params": [turn],
                    },
                ),
            ]
        if self.blocking:
            hang("in-turn", turn)
        return f"answer {turn}"


def version(store: Store) -> int:
    return next((a.version for a in store.agents() if a.agent_id == AGENT_ID), 0)


def main() -> None:
    model = Model()
    bot = Ledger(agent_id=AGENT_ID)
    say("loaded")
    persistence = PersistenceHandler(sys.argv[1])
    with running(FakeLLM(respond=model)):
        with handler(persistence):
            for line in sys.stdin:
                command, *operands = line.split()
                if command == "run":
                    for _ in range(int(operands[0])):
                        bot.ask(f"turn {version(persistence.store) + 1}")
                        say("committed", version(persistence.store))
                    say("done", version(persistence.store))
                elif command in ("between", "stamped"):
                    finish = workspace.WorkspaceTurn.finish

                    def stall(
                        self: workspace.WorkspaceTurn,
                        *,
                        committed: bool,
                        finish: Any = finish,
                        where: str = command,
                    ) -> None:
                        if committed and where == "between":
                            hang("between", self.version)
                        if committed:  # hang once the new version's stamps are written
                            stamp, version = self._cache.stamp, self.version

                            def stamped(path: str, stamps: Any) -> None:
                                stamp(path, stamps)
                                hang("stamped", version)

                            self._cache.stamp = stamped  # type: ignore[method-assign]
                        finish(self, committed=committed)

                    workspace.WorkspaceTurn.finish = stall  # type: ignore[method-assign]
                    bot.ask(f"turn {version(persistence.store) + 1}")
                elif command == "block":
                    model.blocking = True
                    bot.ask(f"turn {version(persistence.store) + 1}")


if __name__ == "__main__":
    main()
