"""What a put_state costs in a 10,000-key memory, next to an empty one.

Offline (FakeLLM under effectful's LiteLLMProvider). Two StateTools agents share one
database: ``big`` holds N keys (10,000 by default, written in one setup turn), and
``empty`` holds none. For each, interleaved, the script measures:

- ``tool us``: one ``put_state`` of a new key, as the model's tool call runs it inside a
  turn (validation, the key-count check, staging), median over R calls;
- ``write us``: the SQL of one staged put at commit (``MemoryChanges.write``), inside a
  write transaction that is then rolled back, median over R writes;
- ``turn ms``: a whole turn (two model requests: the put_state call, then the answer,
  with the digest in both system messages, and the commit), median over T turns.

Run: ``.venv/bin/python bench/bench_memory.py [--keys 10000] [--turns 50] [--quick]``.
"""

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import MemoryLimits, PersistenceHandler, PersistentAgent, StateTools
from effectful_durable.store.parts.memory import KEY, MemoryChanges
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall


@dataclasses.dataclass
class Bot(PersistentAgent, StateTools):
    """You remember."""

    __memory_limits__: ClassVar[MemoryLimits] = MemoryLimits(keys=1_000_000)

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


VALUE = '{"note": "a value of about a hundred bytes, like most memory entries", "n": 1}'


class Model:
    """Answers from a queue of replies, or runs ``action`` inside the turn and answers."""

    def __init__(self) -> None:
        self.replies: list[Reply] = []
        self.action: Any = None

    def __call__(self, call: FakeCall) -> Reply:
        if self.action is not None:
            action, self.action = self.action, None
            action()
        return self.replies.pop(0) if self.replies else "done"


def fill(bot: Bot, model: Model, keys: int) -> None:
    """Give ``bot`` ``keys`` keys in one turn (staged through the developer API)."""

    def put_all() -> None:
        memory = bot.__memory__
        for n in range(keys):
            memory.put(f"fact-{n:06}", {"n": n, "text": "x" * 60})

    model.action = put_all
    bot.ask("fill")


def tool_calls(bot: Bot, model: Model, repeats: int, tag: str) -> list[float]:
    """Seconds per put_state tool call of a new key, inside one turn."""
    times: list[float] = []

    def measure() -> None:
        for n in range(repeats):
            start = time.perf_counter()
            result = bot.put_state(f"new-{tag}-{n:05}", VALUE)
            times.append(time.perf_counter() - start)
            assert result.startswith("stored"), result

    model.action = measure
    bot.ask(f"tool calls {tag}")
    return times


def sql_writes(persistence: PersistenceHandler, agent_id: str, repeats: int) -> list[float]:
    """Seconds per staged put's SQL at commit, rolled back each time."""
    store = persistence.store
    version = next(a.version for a in store.agents() if a.agent_id == agent_id)
    times = []
    for n in range(repeats):
        changes = MemoryChanges()
        changes.changes[KEY, f"sql-{n:05}"] = VALUE
        conn = store.engine.connection()
        conn.execute("BEGIN IMMEDIATE")
        try:
            start = time.perf_counter()
            changes.write(conn, agent_id, version + 1)
            times.append(time.perf_counter() - start)
        finally:
            conn.execute("ROLLBACK")
    return times


def turn(bot: Bot, model: Model, n: int) -> float:
    model.replies = [ToolCall("put_state", {"key": f"turn-{n:05}", "value": VALUE}), "done"]
    start = time.perf_counter()
    bot.ask(f"turn {n}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=10_000, help="keys in the big memory")
    parser.add_argument("--turns", type=int, default=50, help="turns measured per agent")
    parser.add_argument("--repeats", type=int, default=200, help="tool calls and writes")
    parser.add_argument("--quick", action="store_true", help="smoke run: 1,000 keys, 10 turns")
    args = parser.parse_args(argv)
    if args.quick:
        args.keys, args.turns, args.repeats = 1_000, 10, 50
    with tempfile.TemporaryDirectory() as directory:
        db = Path(directory) / "bench.db"
        model = Model()
        persistence = PersistenceHandler(db)
        with (
            handler(LiteLLMProvider(model="fake")),
            handler(FakeLLM(respond=model)),
            handler(persistence),
        ):
            big, empty = Bot(agent_id="big"), Bot(agent_id="empty")
            print(f"filling 'big' with {args.keys:,} keys ...", file=sys.stderr)
            fill(big, model, args.keys)
            empty.ask("first turn")
            rows: dict[str, dict[str, float]] = {}
            for name, bot in (("empty", empty), ("big", big)):
                rows[name] = {"keys": float(len(bot.__memory__))}
            for name, bot in (("empty", empty), ("big", big)):
                tools = tool_calls(bot, model, args.repeats, name)
                writes = sql_writes(persistence, name, args.repeats)
                rows[name] |= {
                    "tool": statistics.median(tools),
                    "write": statistics.median(writes),
                }
            turns: dict[str, list[float]] = {"empty": [], "big": []}
            for n in range(args.turns):  # interleaved, so both see the same machine noise
                turns["empty"].append(turn(empty, model, n))
                turns["big"].append(turn(big, model, n))
            for name in turns:
                rows[name]["turn"] = statistics.median(turns[name])
        persistence.close()
    print(f"{'memory':<8} {'keys':>8} {'tool us':>9} {'write us':>9} {'turn ms':>9}")
    for name, row in rows.items():
        print(
            f"{name:<8} {int(row['keys']):>8,} {row['tool'] * 1e6:>9.0f} "
            f"{row['write'] * 1e6:>9.0f} {row['turn'] * 1e3:>9.1f}"
        )
    print(f"load average: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
