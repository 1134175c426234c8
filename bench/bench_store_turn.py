"""Benchmark: the store's own cost of a turn and of a load on SQLite, without effectful.

One agent plays ``--turns`` turns through the Store alone, as PersistenceHandler
drives it: ``agent_lock``, ``begin_turn`` (the handoff row, committed) and
``commit_turn`` of two messages (a ~300-byte question and a ~700-byte answer,
shaped as effectful's messages), one process, back to back. Printed: the median
of each call and of the whole turn (``turn``: lock to release), over all turns and
over the last 10% (does it grow with the history?); then ``load_agent`` of the
agent (all its messages, checked and decoded), the median of ``--loads`` loads in
this process, and the same in fresh processes (``cold``: open the file, then load).

Run: ``.venv/bin/python bench/bench_store_turn.py [--turns 3000] [--json]``. With
``--json`` the last line is the row as JSON, for ``bench/compare.py``. No assertions.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from effectful_durable import Store
from effectful_durable.store.history import HistoryChange

QUESTION = ("please tell me more about the durable state of agents and how it is kept; " * 5)[:290]
ANSWER = ("Durable state is kept in SQLite, one transaction per turn, append only. " * 10)[:700]


def messages(turn: int) -> list[tuple[float, dict[str, object]]]:
    question = {"id": f"q-{turn}", "role": "user", "content": f"Turn {turn}: {QUESTION}"}
    answer = {"id": f"a-{turn}", "role": "assistant", "content": ANSWER}
    return [(float(2 * turn), question), (float(2 * turn + 1), answer)]


def play(store: Store, agent_id: str, turns: int) -> dict[str, list[float]]:
    """Play ``turns`` turns of ``agent_id``; each call's seconds, per turn."""
    times: dict[str, list[float]] = {"lock": [], "begin": [], "commit": [], "turn": []}
    clock = time.perf_counter
    for i in range(turns):
        t0 = clock()
        with store.agent_lock(agent_id):
            t1 = clock()
            start = store.begin_turn(agent_id, template="ask", arguments={"question": i})
            t2 = clock()
            change = HistoryChange(messages(i), [], 0)
            store.commit_turn(
                agent_id, base_version=start.version, template="ask", change=change, state=None
            )
            t3 = clock()
        t4 = clock()
        for name, seconds in (
            ("lock", t1 - t0 + t4 - t3),
            ("begin", t2 - t1),
            ("commit", t3 - t2),
        ):
            times[name].append(seconds)
        times["turn"].append(t4 - t0)
    return times


def load(db: str, agent_id: str, repeats: int) -> list[float]:
    """Seconds of each of ``repeats`` loads of ``agent_id`` in this process."""
    seconds = []
    with Store(db) as store:
        store.load_agent(agent_id)  # warm: statements compiled, pages cached
        for _ in range(repeats):
            gc.collect()
            start = time.perf_counter()
            store.load_agent(agent_id)
            seconds.append(time.perf_counter() - start)
    return seconds


def cold_load(db: str, agent_id: str) -> None:
    """In a fresh process: open the file and load the agent once; print the ms."""
    with tempfile.TemporaryDirectory() as tmp:  # warm up: imports, one turn elsewhere
        with Store(str(Path(tmp) / "warm.db")) as warm:
            play(warm, "warm", 3)
            warm.load_agent("warm")
    gc.collect()
    start = time.perf_counter()
    store = Store(db)
    store.load_agent(agent_id)
    print(json.dumps((time.perf_counter() - start) * 1e3))
    store.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3000, help="turns of the agent")
    parser.add_argument("--loads", type=int, default=7, help="loads timed in this process")
    parser.add_argument("--cold", type=int, default=3, help="loads timed in fresh processes")
    parser.add_argument("--json", action="store_true", help="end with the row as JSON")
    parser.add_argument("--child-load", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_load:
        cold_load(*args.child_load)
        return
    ms = 1e3
    median = statistics.median
    with tempfile.TemporaryDirectory() as tmp:
        db = str(Path(tmp) / "bench.db")
        with Store(db) as store:
            play(store, "warm", 20)  # every statement compiled
            times = play(store, "bench", args.turns)
        tail = slice(-max(1, args.turns // 10), None)
        row: dict[str, float] = {}
        for name, values in times.items():
            row[f"{name}_ms"] = median(values) * ms
            row[f"{name}_tail_ms"] = median(values[tail]) * ms
        row["load_ms"] = median(load(db, "bench", args.loads)) * ms
        cold = [
            float(
                subprocess.run(
                    [sys.executable, __file__, "--child-load", db, "bench"],
                    capture_output=True,
                    text=True,
                    check=True,
                ).stdout.split()[-1]
            )
            for _ in range(args.cold)
        ]
        row["cold_load_ms"] = median(cold) if cold else 0.0
    print(f"store-level turn of 2 messages, {args.turns} turns; load of {2 * args.turns} messages")
    print("median ms       all  last 10%")
    for name in times:
        print(f"{name:<10} {row[f'{name}_ms']:8.4f} {row[f'{name}_tail_ms']:9.4f}")
    print(f"load       {row['load_ms']:8.2f}  (in this process, warm)")
    print(f"cold load  {row['cold_load_ms']:8.2f}  (a fresh process: open the file, then load)")
    if args.json:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
