"""Benchmark: where a turn's time goes in the store, PostgreSQL against SQLite.

A turn of an agent held in memory makes three calls of the store, each one round
trip on PostgreSQL (``tests/store/test_round_trips.py`` counts them on the wire):
the start (``Store.turns.start``: the agent's hold and its handoff row), the commit
(``Store.turns.commit``: a question and an answer of ~300 and ~700 bytes) and the
release of the lock when the turn's block ends. This times each call, and a
``SELECT 1`` on a connection of its own, in two arms:

* ``after work``: before each turn the process keeps the CPU busy for ``--gap`` ms
  (5), as a worker does while effectful builds the request and reads the answer;
  the server's process goes idle meanwhile, and the next request wakes it;
* ``back to back``: no gap; the server's process is still awake.

``bench_scale.py``'s per-turn overhead is about the sum of the three calls plus
the handler's own work, which SQLite's row shows. The gap between the arms is what
waking the server costs here: on a virtual machine whose idle cores halt, most of
a PostgreSQL turn.

``--baseline DIR`` plays each arm with another checkout of effectful-durable too
(DIR holds its ``src/``; ``bench_store_turn.baseline_package``), on a database of
its own, 20 turns of one then 20 of the other, so that both meet the same
machine: a row each (``base``).

Run: ``.venv/bin/python bench/bench_round_trips.py [--turns 400] [--gap 5]
[--postgres URL] [--baseline DIR]``. Without ``--postgres``, a throwaway cluster on
a Unix socket (tests/support/postgres_server.py, fsync off), as ``bench_scale.py``. No
assertions.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
from bench_scale import postgres_databases
from bench_store_turn import baseline_package, turns_of

from effectful_durable import Store
from effectful_durable.store.history import HistoryChange

QUESTION = "x" * 300
ANSWER = "y" * 700


def busy(seconds: float) -> None:
    """Keep this process's CPU busy, as a worker between its calls of the store."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def change(version: int, history_change: type[Any] = HistoryChange) -> Any:
    """The turn's change: a question and an answer (as ``history_change``, a checkout's)."""
    question = {"id": f"q{version}", "role": "user", "content": QUESTION}
    answer = {"id": f"a{version}", "role": "assistant", "content": ANSWER}
    return history_change(
        added=[(2 * version + 1, question), (2 * version + 2, answer)],
        removed=[],
        removed_count=0,
    )


def turns(
    store: Store, count: int, gap: float, history_change: type[Any] = HistoryChange
) -> dict[str, list[float]]:
    """Play ``count`` turns of one agent; each call's seconds."""
    times: dict[str, list[float]] = {"start": [], "commit": [], "release": []}
    protocol = turns_of(store)
    for _ in range(count):
        busy(gap)
        t0 = time.perf_counter()
        with protocol.start("bench", template="ask", arguments={"q": QUESTION}) as start:
            t1 = time.perf_counter()
            protocol.commit(
                "bench",
                base_version=start.version,
                template="ask",
                change=change(start.version, history_change),
                state=None,
            )
            t2 = time.perf_counter()
        t3 = time.perf_counter()
        times["start"].append(t1 - t0)
        times["commit"].append(t2 - t1)
        times["release"].append(t3 - t2)
    return times


def select_one(url: str, count: int, gap: float) -> list[float]:
    import psycopg

    seconds = []
    with psycopg.connect(url, autocommit=True) as conn:
        for _ in range(count):
            busy(gap)
            start = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            seconds.append(time.perf_counter() - start)
    return seconds


def row(name: str, arm: str, times: dict[str, list[float]], probe: list[float] | None) -> str:
    def ms(values: list[float]) -> str:
        return f"{statistics.median(values) * 1000:8.3f}"

    total = [sum(parts) for parts in zip(*times.values(), strict=True)]
    select = ms(probe) if probe is not None else f"{'-':>8}"
    return (
        f"{name:<10} {arm:<13} {select} {ms(times['start'])} {ms(times['commit'])}"
        f" {ms(times['release'])} {ms(total)}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=400, help="turns per arm")
    parser.add_argument("--gap", type=float, default=5.0, help="ms of CPU work before each turn")
    parser.add_argument("--postgres", help="a PostgreSQL server URL to create a database on")
    parser.add_argument("--baseline", type=Path, help="a checkout to compare with (its root)")
    args = parser.parse_args()
    base = baseline_package(args.baseline) if args.baseline is not None else None
    arms: list[tuple[str, float]] = [("after work", args.gap / 1000), ("back to back", 0.0)]
    header = (
        f"{'backend':<10} {'arm':<13} {'SELECT 1':>8} {'start':>8} {'commit':>8}"
        f" {'release':>8} {'turn':>8}"
    )
    lines = ["median ms", header, "-" * len(header)]
    with tempfile.TemporaryDirectory() as scratch, postgres_databases(args.postgres) as new:
        for name, make in (
            ("sqlite", lambda: str(Path(scratch) / f"bench-{time.time_ns()}.db")),
            ("postgres", new),
        ):
            played = {"": (Store, HistoryChange)}
            if base is not None:
                played["base"] = (
                    base.Store,
                    sys.modules[f"{base.__name__}.store.history"].HistoryChange,
                )
            stores = {key: (opened(make()), kind) for key, (opened, kind) in played.items()}
            try:
                for store, kind in stores.values():
                    turns(store, 20, 0.0, kind)  # warm up: every statement prepared
                for arm, gap in arms:
                    times = {key: {"start": [], "commit": [], "release": []} for key in stores}
                    for _ in range(max(args.turns // 20, 1)):
                        for key, (store, kind) in stores.items():
                            for part, seconds in turns(store, 20, gap, kind).items():
                                times[key][part] += seconds
                    probe = (
                        select_one(stores[""][0].engine.url, args.turns, gap)
                        if name == "postgres"
                        else None
                    )
                    for key, measured in times.items():
                        lines.append(row(f"{name} {key}".strip(), arm, measured, probe))
            finally:
                for store, _ in stores.values():
                    store.close()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
