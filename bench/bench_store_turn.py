"""Benchmark: the store's own cost of a turn and of a load on SQLite, without effectful.

One agent plays ``--turns`` turns through the Store alone, as PersistenceHandler
drives it: ``Store.turns.start`` (``begin``: the agent's hold and the handoff row,
committed), ``Store.turns.commit`` of two messages (a ~300-byte question and a
~700-byte answer, shaped as effectful's messages; the first turn stores the
agent's fields, the others leave them unchanged) and the release of the hold
(``lock``), one process, back to back. Printed: the median of each call and of the
whole turn (``turn``: start to release), over all turns and over the last 10% (does
it grow with the history?); then ``Store.turns.load`` of the
agent (all its messages, checked and decoded), the median of ``--loads`` loads in
this process, and of ``--cold`` loads in fresh processes (``cold``: open the file,
then load).

``--baseline DIR`` plays the same turns with another checkout of effectful-durable
(DIR holds its ``src/``), imported under its own name, on a database of its own:
turn by turn in turns with ours, and loads in turns with ours, so that both arms
meet the same machine. A row each.

Run: ``.venv/bin/python bench/bench_store_turn.py [--turns 3000] [--baseline DIR]``.
No assertions.
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import effectful_durable

QUESTION = ("please tell me more about the durable state of agents and how it is kept; " * 5)[:290]
ANSWER = ("Durable state is kept in SQLite, one transaction per turn, append only. " * 10)[:700]


def messages(turn: int) -> list[tuple[float, dict[str, object]]]:
    question = {"id": f"q-{turn}", "role": "user", "content": f"Turn {turn}: {QUESTION}"}
    answer = {"id": f"a-{turn}", "role": "assistant", "content": ANSWER}
    return [(float(2 * turn), question), (float(2 * turn + 1), answer)]


def turn(package: Any, store: Any, agent_id: str, i: int, times: dict[str, list[float]]) -> None:
    """Play turn ``i`` of ``agent_id``; add each call's seconds to ``times``."""
    clock, turns = time.perf_counter, turns_of(store)
    t0 = clock()
    with turns.start(agent_id, template="ask", arguments={"question": i}) as start:
        t2 = clock()
        change = package.store.history.HistoryChange(messages(i), [], 0)
        state = '{"topic":"benchmarks"}' if start.version == 0 else None  # as a Bot's fields
        turns.commit(
            agent_id, base_version=start.version, template="ask", change=change, state=state
        )
        t3 = clock()
    t4 = clock()
    times["lock"].append(t4 - t3)
    times["begin"].append(t2 - t0)
    times["commit"].append(t3 - t2)
    times["turn"].append(t4 - t0)


def turns_of(store: Any) -> Any:
    """``store.turns``; for a checkout from before it (issue 51), whose Store itself had
    the turn protocol, the same calls under their old names."""
    return getattr(store, "turns", None) or _OldTurns(store)


class _OldTurns:
    def __init__(self, store: Any) -> None:
        self.store = store

    def start(self, agent_id: str, **options: Any) -> Any:
        return self.store.locked_turn(agent_id, **options)

    def commit(self, agent_id: str, **options: Any) -> Any:
        return self.store.commit_turn(agent_id, **options)

    def load(self, agent_id: str, *conversation: str) -> Any:
        return self.store.load_agent(agent_id, *conversation)


def baseline_package(tree: Path) -> Any:
    """The effectful_durable package of the checkout ``tree``, imported under its own name."""
    name = "effectful_durable_baseline"
    src = tree / "src"
    spec = importlib.util.spec_from_file_location(
        name, src / "__init__.py", submodule_search_locations=[str(src)]
    )
    assert spec is not None and spec.loader is not None
    package = importlib.util.module_from_spec(spec)
    sys.modules[name] = package
    spec.loader.exec_module(package)
    importlib.import_module(f"{name}.store.history")
    return package


def cold_load(db: str, agent_id: str) -> None:
    """In a fresh process: open the file and load the agent once; print the ms."""
    package: Any = effectful_durable
    importlib.import_module("effectful_durable.store.history")
    with tempfile.TemporaryDirectory() as tmp:  # warm up: imports, a few turns elsewhere
        with package.Store(str(Path(tmp) / "warm.db")) as warm:
            times: dict[str, list[float]] = {k: [] for k in ("lock", "begin", "commit", "turn")}
            for i in range(3):
                turn(package, warm, "warm", i, times)
            turns_of(warm).load("warm")
    gc.collect()
    start = time.perf_counter()
    store = package.Store(db)
    turns_of(store).load(agent_id)
    print(json.dumps((time.perf_counter() - start) * 1e3))
    store.close()


def cold(db: str, tree: Path | None) -> float:
    """Milliseconds of one cold load of ``db`` in a fresh process (of ``tree``'s package)."""
    with tempfile.TemporaryDirectory() as path:
        env = dict(os.environ)
        if tree is not None:
            os.symlink((tree / "src").resolve(), Path(path) / "effectful_durable")
            env["PYTHONPATH"] = os.pathsep.join([path, env.get("PYTHONPATH", "")])
        out = subprocess.run(
            [sys.executable, __file__, "--child-load", db, "bench"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        )
    return float(out.stdout.split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=3000, help="turns of the agent")
    parser.add_argument("--loads", type=int, default=7, help="loads timed in this process")
    parser.add_argument("--cold", type=int, default=3, help="loads timed in fresh processes")
    parser.add_argument("--baseline", type=Path, help="a checkout to compare with (its root)")
    parser.add_argument("--json", action="store_true", help="end with the rows as JSON")
    parser.add_argument("--child-load", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_load:
        cold_load(*args.child_load)
        return
    importlib.import_module("effectful_durable.store.history")
    arms: dict[str, tuple[Any, Path | None]] = {"ours": (effectful_durable, None)}
    if args.baseline is not None:
        arms["base"] = (baseline_package(args.baseline), args.baseline)
    ms, median = 1e3, statistics.median
    tail = slice(-max(1, args.turns // 10), None)
    rows: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        dbs = {arm: str(Path(tmp) / f"{arm}.db") for arm in arms}
        stores = {arm: package.Store(dbs[arm]) for arm, (package, _) in arms.items()}
        times = {arm: {k: [] for k in ("lock", "begin", "commit", "turn")} for arm in arms}
        order = list(arms)
        for arm, (package, _) in arms.items():  # every statement compiled
            for i in range(20):
                turn(package, stores[arm], "warm", i, {k: [] for k in times[arm]})
        for i in range(args.turns):
            for arm in order[i % len(order) :] + order[: i % len(order)]:
                turn(arms[arm][0], stores[arm], "bench", i, times[arm])
        loads: dict[str, list[float]] = {arm: [] for arm in arms}
        for store in stores.values():
            turns_of(store).load("bench")  # warm: statements compiled, pages cached
        for _ in range(args.loads):
            for arm, store in stores.items():
                gc.collect()
                start = time.perf_counter()
                turns_of(store).load("bench")
                loads[arm].append(time.perf_counter() - start)
        for store in stores.values():
            store.close()
        colds: dict[str, list[float]] = {arm: [] for arm in arms}
        for _ in range(args.cold):
            for arm, (_, tree) in arms.items():
                colds[arm].append(cold(dbs[arm], tree))
        for arm in arms:
            row = rows[arm] = {}
            for name, values in times[arm].items():
                row[f"{name}_ms"] = median(values) * ms
                row[f"{name}_tail_ms"] = median(values[tail]) * ms
            row["load_ms"] = median(loads[arm]) * ms
            row["cold_load_ms"] = median(colds[arm]) if colds[arm] else 0.0
    print(f"store-level turn of 2 messages, {args.turns} turns; load of {2 * args.turns} messages")
    print(f"{'median ms':<20}" + "".join(f"{arm:>10}" for arm in arms))
    for name in ("lock", "begin", "commit", "turn"):
        for key, what in ((f"{name}_ms", "all"), (f"{name}_tail_ms", "last 10%")):
            print(f"{name + ' ' + what:<20}" + "".join(f"{r[key]:10.4f}" for r in rows.values()))
    print(f"{'load (warm)':<20}" + "".join(f"{r['load_ms']:10.2f}" for r in rows.values()))
    print(f"{'load (cold)':<20}" + "".join(f"{r['cold_load_ms']:10.2f}" for r in rows.values()))
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
