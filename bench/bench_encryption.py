"""Benchmark: what encryption at rest (``keys=``) adds to a turn, and to loading an agent.

Two arms on SQLite, turns interleaved in one process so both have the same history
length whenever they are measured: ``PersistenceHandler(db)`` and
``PersistenceHandler(db, keys=...)``, each turn a ~300-byte question and a ~700-byte
answer from the offline ``FakeLLM`` (as ``bench_persistence.py`` plays them).
Printed:

* the median wall time of a turn in each arm, and the median and p90 of the
  encrypted minus the plain time of each turn pair (the cost of encryption per
  turn; target: <= +0.1 ms);
* loading the N-turn agent (``store.turns.load``: one read of its active messages,
  opened and decoded) in a fresh process per load, 5 loads per arm, alternating:
  the medians and their ratio (target: <= 1.2x at 5,000 turns). The first sealed
  load opens every message and leaves the history's snapshot (``snapshots.py``),
  which the later ones load through: it is printed apart, and the median is of the
  later ones.

Run: ``.venv/bin/python bench/bench_encryption.py [--turns 5000] [--loads 5]``.
No assertions: targets are in bench/README.md.
"""

from __future__ import annotations

import argparse
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

from bench_persistence import Bot, answer, question  # the same turns, played the same way
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler

from effectful_durable import Keys, LocalMasterKey, PersistenceHandler, Store
from effectful_durable.testing import FakeLLM


def keys_in(directory: Path) -> Keys:
    key_file = directory / "master.key"
    if not key_file.exists():
        key_file.write_text(LocalMasterKey.generate())
    return Keys.from_file(key_file, store=str(directory / "sealed.db.keys"))


def play(n: int, directory: Path) -> dict[str, list[float]]:
    """``n`` turns in each arm, interleaved; each turn's wall time by arm."""
    arms = {
        "plain": PersistenceHandler(directory / "plain.db"),
        "sealed": PersistenceHandler(directory / "sealed.db", keys=keys_in(directory)),
    }
    times: dict[str, list[float]] = {arm: [] for arm in arms}
    with handler(LiteLLMProvider(model="fake")), handler(FakeLLM(respond=answer)):
        bots = {arm: Bot(agent_id="bot") for arm in arms}
        for i in range(n):
            for arm, persistence in arms.items():
                with handler(persistence):
                    start = time.perf_counter()
                    bots[arm].ask(question(i))
                    times[arm].append(time.perf_counter() - start)
    for persistence in arms.values():
        persistence.close()
    return times


def child_load(db: str, key_dir: str) -> None:
    """In a fresh process: open the database and load the agent; print the time in ms."""
    keys = keys_in(Path(key_dir)) if key_dir else None
    with tempfile.TemporaryDirectory() as tmp:  # warm up imports and statements
        with Store(Path(tmp) / "warm.db", keys=keys_in(Path(tmp))) as warm:
            warm.turns.load("bot")
    gc.collect()
    start = time.perf_counter()
    with Store(db, keys=keys) as store:
        loaded = store.turns.load("bot")
        took = time.perf_counter() - start
    print(json.dumps({"load_ms": took * 1e3, "messages": len(loaded.history.messages)}))


def load_ms(db: Path, key_dir: str) -> float:
    found = subprocess.run(
        [sys.executable, __file__, "--child-load", str(db), key_dir],
        capture_output=True,
        text=True,
        check=True,
    )
    return float(json.loads(found.stdout.strip().splitlines()[-1])["load_ms"])


def p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1] if len(values) > 1 else values[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=5000)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where to keep the databases (default: tmp)")
    parser.add_argument("--child-load", nargs=2, metavar=("DB", "KEYDIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_load:
        child_load(*args.child_load)
        return
    with tempfile.TemporaryDirectory() as tmp:
        directory = args.dir or Path(tmp)
        directory.mkdir(parents=True, exist_ok=True)
        times = play(args.turns, directory)
        extra = [s - p for s, p in zip(times["sealed"], times["plain"], strict=True)]
        ms = 1e3
        print(f"turns: {args.turns} per arm, SQLite, ~300 B question + ~700 B answer")
        for arm in ("plain", "sealed"):
            print(f"  {arm:>6} turn: median {statistics.median(times[arm]) * ms:.3f} ms")
        print(
            f"  encryption per turn: median {statistics.median(extra) * ms:+.3f} ms, "
            f"p90 {p90(extra) * ms:+.3f} ms"
        )
        loads: dict[str, list[float]] = {"plain": [], "sealed": []}
        first = load_ms(directory / "sealed.db", str(directory))  # leaves the snapshot
        for _ in range(args.loads):
            loads["plain"].append(load_ms(directory / "plain.db", ""))
            loads["sealed"].append(load_ms(directory / "sealed.db", str(directory)))
        plain, sealed = statistics.median(loads["plain"]), statistics.median(loads["sealed"])
        print(f"load of the {args.turns}-turn agent (fresh process, median of {args.loads}):")
        print(f"  plain {plain:.1f} ms, sealed {sealed:.1f} ms: {sealed / plain:.2f}x")
        print(f"  the first sealed load, which leaves the snapshot: {first:.1f} ms")


if __name__ == "__main__":
    main()
