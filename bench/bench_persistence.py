"""Benchmark: what PersistenceHandler adds to each turn of a long conversation.

For each N in ``--turns`` one ``Bot`` (a PersistentAgent) with persistence and one
without play an N-turn conversation side by side (turns interleaved, so both have
the same history length whenever they are measured). Each turn is a ~300-byte user
message and a ~700-byte answer from the offline ``FakeLLM`` under effectful's
``LiteLLMProvider``. Printed per N (see bench/README.md for the columns):

* median wall time of a turn without and with persistence;
* overhead = with minus without, per turn pair: median and p90 over all turns and
  over the last 10% of turns (is the cost independent of history length?);
* handler time = a persisted turn's wall time minus the time spent below the
  PersistenceHandler (a timing handler sits between it and the provider): the
  handler's own work measured directly, without the noise of two separate calls;
* database size (db + wal after a TRUNCATE checkpoint);
* loading the N-turn agent in a fresh process (see ``child_load``).

Run: ``.venv/bin/python bench/bench_persistence.py [--turns 100,1000,5000] [--quick]``.
No assertions: targets are <= 1 ms overhead per turn at N = 1,000 and 5,000, and
< 100 ms to load a 5,000-turn agent.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

import apsw
from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import fwd, handler
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent
from effectful_durable.testing import FakeLLM

QUESTION = "please tell me more about the durable state of agents and how it is kept; "
ANSWER = "Durable state is kept in SQLite, one transaction per turn, append only. "


@dataclasses.dataclass
class Bot(PersistentAgent):
    """You are a helpful assistant."""

    topic: str = "benchmarks"  # a persisted field, unchanged by turns

    @Template.define
    def ask(self, question: str) -> str:
        """Answer the question: {question}"""
        raise NotHandled


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


def question(i: int) -> str:
    return (f"Turn {i}: " + QUESTION * 5)[:300]


def answer(_call) -> str:
    return (ANSWER * 10)[:700]


def fake_llm() -> FakeLLM:
    return FakeLLM(respond=answer)


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def play(n: int, db: Path) -> dict[str, list[float]]:
    """Play n turns with a plain and a persisted Bot; per-turn times in seconds."""
    fake, below = fake_llm(), Below()
    persistence = PersistenceHandler(db)
    plain, durable = Bot(agent_id="plain"), Bot(agent_id="durable")
    times: dict[str, list[float]] = {"plain": [], "durable": [], "below": []}
    with handler(LiteLLMProvider(model="fake")), handler(fake), handler(below):
        for i in range(n):
            q = question(i)
            for arm in ("plain", "durable") if i % 2 else ("durable", "plain"):
                if arm == "plain":
                    start = time.perf_counter()
                    plain.ask(q)
                    times["plain"].append(time.perf_counter() - start)
                else:
                    with handler(persistence):
                        start = time.perf_counter()
                        durable.ask(q)
                        times["durable"].append(time.perf_counter() - start)
                    times["below"].append(below.seconds)
            fake.calls.clear()  # keep memory flat: .calls holds every request
            if (i + 1) % max(1, n // 10) == 0:
                print(f"\rN={n}: {i + 1} turns", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    persistence.close()
    return times


def db_bytes(db: Path) -> int:
    conn = apsw.Connection(str(db))
    conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
    conn.close()
    wal = db.with_name(db.name + "-wal")
    return db.stat().st_size + (wal.stat().st_size if wal.exists() else 0)


def child_load(db: str, agent_id: str, what: str) -> None:
    """In a fresh process: time loading the agent (``what``: load or ask); print JSON.

    Everything is imported (module top) and warmed up first: an effectful turn
    without persistence and a persisted turn on a scratch database, so one-time
    costs (pydantic schemas, apsw statement compilation) are not counted; then
    ``gc.collect()``, so that a full collection the imports made due does not land
    in the timed window by chance. Each measure gets its own process, so neither
    runs with the other's copy of the history in memory. Timed:

    * load: ``PersistenceHandler(db)`` (open the file) + ``store.load_agent(id)``
      (one indexed read of the active messages, JSON decode);
    * ask: the first ``ask()`` of a new ``Bot`` object with that id under
      persistence (loads and restores history and state, then runs and commits a
      turn) minus the median of 3 ``ask()``s without persistence of a Bot holding
      the same history in memory (effectful's model call is itself O(history), so
      an empty Bot would be the wrong baseline).
    """
    fake, q = fake_llm(), question(0)
    with handler(LiteLLMProvider(model="fake")), handler(fake):
        Bot(agent_id="warm").ask(q)
        with tempfile.TemporaryDirectory() as tmp:
            scratch = PersistenceHandler(Path(tmp) / "warm.db")
            with handler(scratch):
                Bot(agent_id="warm").ask(q)
            scratch.close()
        gc.collect()

        start = time.perf_counter()
        persistence = PersistenceHandler(db)
        if what == "load":
            persistence.store.load_agent(agent_id)
            print(json.dumps({"load_ms": (time.perf_counter() - start) * 1e3}))
            return
        fresh = Bot(agent_id=agent_id)
        start = time.perf_counter()
        with handler(persistence):
            fresh.ask(q)
        first = time.perf_counter() - start

        plain = Bot(agent_id="baseline")
        plain.__history__.update(list(fresh.__history__.items())[:-2])
        base = []
        for _ in range(3):
            start = time.perf_counter()
            plain.ask(q)
            base.append(time.perf_counter() - start)
            fake.calls.clear()
    print(json.dumps({"first_ask_extra_ms": (first - statistics.median(base)) * 1e3}))


def fresh_load(db: Path, agent_id: str) -> dict[str, float]:
    """Both fresh-process measures; ``ask`` commits a turn, so it runs last."""
    results: dict[str, float] = {}
    for what in ("load", "ask"):
        out = subprocess.run(
            [sys.executable, __file__, "--child-load", str(db), agent_id, what],
            capture_output=True,
            text=True,
            check=True,
        )
        results.update(json.loads(out.stdout.strip().splitlines()[-1]))
    return results


def measure(n: int, directory: Path) -> dict[str, float]:
    db = directory / f"bench-{n}.db"
    t = play(n, db)
    over = [d - p for d, p in zip(t["durable"], t["plain"], strict=True)]
    own = [d - b for d, b in zip(t["durable"], t["below"], strict=True)]
    tail = slice(n - max(1, n // 10), n)
    ms = 1e3
    return {
        "plain": statistics.median(t["plain"]) * ms,
        "durable": statistics.median(t["durable"]) * ms,
        "over": statistics.median(over) * ms,
        "over90": p90(over) * ms,
        "over_tail": statistics.median(over[tail]) * ms,
        "over90_tail": p90(over[tail]) * ms,
        "own": statistics.median(own) * ms,
        "own90": p90(own) * ms,
        "own_tail": statistics.median(own[tail]) * ms,
        "own90_tail": p90(own[tail]) * ms,
        "mb": db_bytes(db) / 1e6,
        **fresh_load(db, "durable"),
    }


COLUMNS = [  # (header, format)
    ("turns", "{n:>6}"),
    ("plain ms", "{plain:>8.2f}"),
    ("durable ms", "{durable:>10.2f}"),
    ("overhead med/p90", "{over:>7.2f}/{over90:<8.2f}"),
    ("last10% med/p90", "{over_tail:>7.2f}/{over90_tail:<7.2f}"),
    ("handler med/p90", "{own:>7.2f}/{own90:<7.2f}"),
    ("last10% med/p90", "{own_tail:>7.2f}/{own90_tail:<7.2f}"),
    ("db MB", "{mb:>6.2f}"),
    ("load ms", "{load_ms:>7.2f}"),
    ("1st ask +ms", "{first_ask_extra_ms:>11.2f}"),
]


def print_table(rows: list[dict[str, float]]) -> None:
    cells = [[fmt.format(**row) for _, fmt in COLUMNS] for row in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _) in enumerate(COLUMNS)]
    print("  ".join(h.rjust(w) for (h, _), w in zip(COLUMNS, widths, strict=True)))
    for row in cells:
        print("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", default="100,1000,5000", help="comma-separated N values")
    parser.add_argument("--quick", action="store_true", help="smoke run: --turns 20,100")
    parser.add_argument("--dir", type=Path, help="where to put the databases (default: tmp)")
    parser.add_argument("--child-load", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_load:
        child_load(*args.child_load)
        return
    turns = [20, 100] if args.quick else [int(n) for n in args.turns.split(",")]
    started, load_before = time.perf_counter(), os.getloadavg()[0]
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        rows = [{"n": n, **measure(n, Path(tmp))} for n in turns]
    print_table(rows)
    print(
        f"(times in ms; run took {time.perf_counter() - started:.0f} s; 1-min load average "
        f"{load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs; "
        f"Python {sys.version.split()[0]}, SQLite {apsw.sqlite_lib_version()})"
    )


if __name__ == "__main__":
    main()
