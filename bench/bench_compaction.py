"""Benchmark: what CompactionHandler costs on turns below and at its budget.

Plays TURNS turns of a PersistentAgent under PersistenceHandler and
CompactionHandler(max_messages=BUDGET) (offline FakeLLM) and prints:

* the median time of the turns before the first compaction, next to the same
  turns under PersistenceHandler alone: the handler's cost when it does nothing
  (later turns are not compared: without compaction the history keeps growing,
  and effectful's own per-turn work grows with it);
* the compactions made, the summariser calls (one per compaction, never more), and
  the median time of a turn that compacts;
* rows written by each compaction commit (SQLite ``total_changes``) next to the
  messages it covered and the length of the full stored history: the write follows
  what is covered, not the history.

Run: ``.venv/bin/python bench/bench_compaction.py [--turns 2000] [--budget 40]``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import CompactionHandler, PersistenceHandler, PersistentAgent, Store
from effectful_durable.testing import FakeCall, FakeLLM

QUESTION = "please tell me more about the durable state of agents and how it is kept; " * 4


@dataclasses.dataclass
class Bot(PersistentAgent):
    """You are a helpful assistant."""

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


class Model:
    """Answers questions, and summaries when asked; counts the summaries."""

    def __init__(self) -> None:
        self.summaries = 0

    def __call__(self, call: FakeCall) -> str:
        if "Summarise the conversation below" in call.last_user_text:
            self.summaries += 1
            return f"summary {self.summaries}"
        return "an answer of about seven hundred bytes " * 18


def play(db: Path, turns: int, compaction: CompactionHandler | None) -> dict[str, Any]:
    model = Model()
    persistence = PersistenceHandler(db)
    handlers = [LiteLLMProvider(model="fake"), FakeLLM(respond=model), compaction, persistence]
    times, compacting, writes = [], [], []
    with contextlib.ExitStack() as stack:
        for installed in filter(None, handlers):
            stack.enter_context(handler(installed))
        bot = Bot(agent_id="bot")
        conn = persistence.store.engine.connection()
        for turn in range(turns):
            summaries, changes = model.summaries, conn.total_changes()
            started = time.perf_counter()
            bot.ask(f"{turn}: {QUESTION}")
            times.append(time.perf_counter() - started)
            if model.summaries > summaries:
                compacting.append(times[-1])
                writes.append(conn.total_changes() - changes)
    stored = len(Store(db).history("bot", include_compacted=True))
    persistence.close()
    return {
        "times": times,
        "compacting": compacting,
        "writes": writes,
        "summaries": model.summaries,
        "stored": stored,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--budget", type=int, default=40)
    parser.add_argument("--keep", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = play(Path(tmp) / "plain.db", args.turns, None)
        compaction = CompactionHandler(max_messages=args.budget, keep_recent=args.keep)
        compacted = play(Path(tmp) / "compacted.db", args.turns, compaction)
    ms = 1000
    before = (args.budget - 1) // 2  # turns before the first compaction
    print(f"{args.turns} turns, max_messages={args.budget}, keep_recent={args.keep}")
    print(
        f"  first {before} turns, median: persistence only "
        f"{statistics.median(plain['times'][:before]) * ms:.2f} ms, with compaction "
        f"{statistics.median(compacted['times'][:before]) * ms:.2f} ms"
    )
    print(
        f"  last 100 turns, median: persistence only "
        f"{statistics.median(plain['times'][-100:]) * ms:.2f} ms, with compaction "
        f"{statistics.median(compacted['times'][-100:]) * ms:.2f} ms"
    )
    print(
        f"  compactions: {len(compacted['compacting'])}, summariser calls: "
        f"{compacted['summaries']}, median compacting turn: "
        f"{statistics.median(compacted['compacting']) * ms:.2f} ms"
    )
    covered = args.budget + 1 - 1 - args.keep  # messages a compaction summarises
    print(
        f"  rows written per compaction commit: median {statistics.median(compacted['writes'])}"
        f" (first {compacted['writes'][0]}, last {compacted['writes'][-1]}) for about "
        f"{covered} covered messages; full stored history at the end: "
        f"{compacted['stored']} messages"
    )


if __name__ == "__main__":
    main()
