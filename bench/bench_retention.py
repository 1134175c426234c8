"""Benchmark: what pruning as you go costs per turn, and what it saves on disk.

Two ``Bot``s (PersistentAgents whose persisted ``topic`` field changes every turn,
so every version stores a ~200-byte state snapshot) play the same N-turn
conversation, turns interleaved, each on its own database: one under
``PersistenceHandler(db)``, one under ``PersistenceHandler(db, keep_versions=10)``.
Each turn adds a ~300-byte question and a ~700-byte answer to the agent's history.
They come from ``InstantModel``, a handler under PersistenceHandler that writes
them straight into the agent's ``__history__`` as effectful's provider would,
without effectful's LLM machinery (which costs tens of ms per call and grows with
the history: ``bench_persistence.py`` measures against it; here it would only
make 20,000 turns take an hour). Two scenarios:

* ``append``: the history only grows (nothing is ever removed from it);
* ``compacting``: a ``CompactionHandler(max_messages=40, keep_recent=10)`` with an
  instant summariser runs in both stacks, so the active history stays short and
  compaction originals pile up (the handler's pruning keeps them searchable).

Printed per scenario (times are the handler's own: a turn's wall time minus the
time spent below PersistenceHandler, measured by a timing handler under it):

* handler ms median and p90 over all turns and over the last 10% of turns, for
  both arms: if pruning's cost is flat, ``keep=10`` last-10% matches its all-turns;
* database size (db + wal after a TRUNCATE checkpoint) of each arm, then of the
  ``keep=10`` database after ``Store.prune(keep_versions=10, drop_compacted=True)``
  and ``Store.vacuum()``;
* the largest WAL file seen during the ``keep=10`` run.

Run: ``.venv/bin/python bench/bench_retention.py [--turns 5000] [--quick]``.
No assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # should anything import litellm

import apsw
from effectful.handlers.llm import Template
from effectful.ops.semantics import fwd, handler
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled

from effectful_durable import CompactionHandler, PersistenceHandler, PersistentAgent, Store
from effectful_durable.handlers.effectful_hooks import bound_agent

QUESTION = "please tell me more about the durable state of agents and how it is kept; "
ANSWER = "Durable state is kept in SQLite, one transaction per turn, append only. "
KEEP = 10


@dataclasses.dataclass
class Bot(PersistentAgent):
    """You are a helpful assistant."""

    topic: str = ""  # persisted, changed every turn

    @Template.define
    def ask(self, question: str) -> str:
        """Answer the question: {question}"""
        raise NotHandled


class InstantModel(ObjectInterpretation):
    """Answers an agent's template at once, appending the turn's messages to its history."""

    @implements(Template.__apply__)
    def _apply(self, template, *args, **kwargs):
        agent = bound_agent(template, PersistentAgent)
        if agent is None:
            return fwd()
        history = agent.__history__
        new = []
        if not history:
            new.append({"role": "system", "content": "You are a helpful assistant."})
        answer = (ANSWER * 10)[:700]
        new.append({"role": "user", "content": [{"type": "text", "text": args[0]}]})
        new.append({"role": "assistant", "content": answer})
        for message in new:
            message["id"] = str(uuid.uuid4())
            history[message["id"]] = message
        return answer


class Below(ObjectInterpretation):
    """Times every template call below it (the provider and the fake model)."""

    seconds = 0.0

    @implements(Template.__apply__)
    def _apply(self, template, *args, **kwargs):
        start = time.perf_counter()
        try:
            return fwd()
        finally:
            self.seconds = time.perf_counter() - start


def summarize(transcript: str) -> str:
    return f"summary of {len(transcript)} characters"


def question(i: int) -> str:
    return (f"Turn {i}: " + QUESTION * 5)[:300]


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def db_bytes(db: Path) -> int:
    conn = apsw.Connection(str(db))
    conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
    conn.close()
    wal = db.with_name(db.name + "-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def play(n: int, directory: Path, scenario: str) -> dict[str, object]:
    below = Below()
    arms = {
        "all": PersistenceHandler(directory / f"{scenario}-all.db"),
        "keep": PersistenceHandler(directory / f"{scenario}-keep.db", keep_versions=KEEP),
    }
    bots = {arm: Bot(agent_id=f"bot-{arm}") for arm in arms}
    own: dict[str, list[float]] = {arm: [] for arm in arms}
    wal = directory / f"{scenario}-keep.db-wal"
    wal_max = 0
    compaction = (
        [CompactionHandler(max_messages=40, keep_recent=10, summarizer=summarize)]
        if scenario == "compacting"
        else []
    )
    with handler(InstantModel()), handler(below):
        for i in range(n):
            order = ("all", "keep") if i % 2 else ("keep", "all")
            for arm in order:
                bot = bots[arm]
                bot.topic = f"topic {i} " + "t" * 190
                with contextlib_stack(compaction, arms[arm]):
                    start = time.perf_counter()
                    bot.ask(question(i))
                    wall = time.perf_counter() - start
                own[arm].append(wall - below.seconds)
            if wal.exists():
                wal_max = max(wal_max, wal.stat().st_size)
            if (i + 1) % max(1, n // 10) == 0:
                print(f"\r{scenario}: {i + 1} turns", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    for persistence in arms.values():
        persistence.close()
    return {"own": own, "wal_max": wal_max}


class contextlib_stack:
    """``with handler(h1), handler(h2), ...`` for a list of handlers."""

    def __init__(self, first: list[object], last: object) -> None:
        self.handlers = [*first, last]
        self.entered: list[object] = []

    def __enter__(self) -> None:
        for h in self.handlers:
            cm = handler(h)
            cm.__enter__()
            self.entered.append(cm)

    def __exit__(self, *exc: object) -> None:
        while self.entered:
            self.entered.pop().__exit__(*exc)


def row(name: str, values: list[float]) -> str:
    tail = values[-max(1, len(values) // 10) :]
    return (
        f"{name:<10} {statistics.median(values) * 1e3:>8.3f} {p90(values) * 1e3:>8.3f} "
        f"{statistics.median(tail) * 1e3:>10.3f} {p90(tail) * 1e3:>8.3f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=5000)
    parser.add_argument("--quick", action="store_true", help="300 turns, a smoke run")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the temp directory")
    args = parser.parse_args()
    n = 300 if args.quick else args.turns
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        directory = Path(tmp)
        for scenario in ("append", "compacting"):
            result = play(n, directory, scenario)
            own = result["own"]
            assert isinstance(own, dict)
            print(f"\n{scenario}, N = {n} turns; handler's own time per turn (ms)")
            print(f"{'arm':<10} {'median':>8} {'p90':>8} {'last10% med':>10} {'p90':>8}")
            print(row("all", own["all"]))
            print(row(f"keep={KEEP}", own["keep"]))
            keep_db = directory / f"{scenario}-keep.db"
            sizes = [db_bytes(directory / f"{scenario}-all.db"), db_bytes(keep_db)]
            with Store(keep_db) as store:
                store.prune(keep_versions=KEEP, drop_compacted=True)
                store.vacuum()
                versions = len(store.versions(f"bot-{'keep'}"))
            sizes.append(db_bytes(keep_db))
            print(
                f"db MB: all {sizes[0] / 1e6:.2f}, keep={KEEP} {sizes[1] / 1e6:.2f}, "
                f"then prune(drop_compacted) + vacuum {sizes[2] / 1e6:.2f} "
                f"({versions} versions kept); largest WAL seen "
                f"{int(result['wal_max']) / 1e6:.2f} MB"  # type: ignore[call-overload]
            )
    print(f"\nload average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
