"""Benchmark: N worker processes x M agents on one database, SQLite file against PostgreSQL.

For each backend and each N in ``--workers`` (1, 2, 4, 8), N worker processes start
together against one fresh database; each plays ``--turns`` turns of each of its own
``--agents`` agents (round-robin, ~300-byte questions and ~700-byte answers from the
offline ``FakeLLM`` under effectful's ``LiteLLMProvider``, a ``PersistenceHandler`` on
top). Workers import and warm up first (one turn of a scratch agent), then wait, so
that the clock starts when all are ready. Printed per row:

* ``turns/s``: all workers' turns over the wall time from the start to the last
  worker's end: the throughput of the whole machine against that database;
* ``turn ms med/p90``: one turn's wall time, as a worker sees it;
* ``overhead ms med/p90``: what persistence adds to a turn: a turn's wall time minus
  the time below the PersistenceHandler (a timing handler between it and the
  provider), minus the same difference measured without persistence in that worker
  (effectful's own cost of calling a template, which a plain turn pays too). It
  includes the wait for SQLite's one write lock, or PostgreSQL's round trips.

The ``none`` backend runs the same turns without persistence: effectful's own
ceiling on this machine. Without ``--postgres URL`` the PostgreSQL rows run on a
throwaway cluster started from the installed server binaries (tests/support/postgres_server.py)
on a Unix socket, with fsync off: compare it with SQLite's default ``durability="normal"``,
which does not sync at each commit either. A server with fsync on pays a flush per
commit (``synchronous_commit``), as SQLite does with ``durability="full"``.

Run: ``.venv/bin/python bench/bench_scale.py [--workers 1,2,4,8] [--agents 4]
[--turns 100] [--backends none,sqlite,postgres] [--postgres URL] [--quick]``.
No assertions; the numbers depend on the machine's cores (printed with the table).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

sys.path.insert(0, str(Path(__file__).parent))
from bench_persistence import Below, Bot, fake_llm, p90, question

ROOT = Path(__file__).parents[1]


# -- a worker process -------------------------------------------------------------


def worker(db: str, index: int, agents: int, turns: int) -> None:
    """Warm up, say ``ready``, wait for ``go``, play the turns, print one JSON line."""
    from effectful.handlers.llm.completions import LiteLLMProvider
    from effectful.ops.semantics import handler

    from effectful_durable import PersistenceHandler

    persistence = PersistenceHandler(db) if db != "none" else None
    fake, below = fake_llm(), Below()
    bots = [Bot(agent_id=f"w{index}-a{j}") for j in range(agents)]
    plain = [Bot(agent_id=f"w{index}-plain-{j}") for j in range(3)]
    durable = handler(persistence) if persistence is not None else nullcontext()
    walls: list[float] = []
    overheads: list[float] = []
    with handler(LiteLLMProvider(model="fake")), handler(fake), handler(below):
        # effectful's own cost of a template call: a plain turn's wall minus its time below.
        floor = []
        for i in range(20):
            start = time.perf_counter()
            plain[i % len(plain)].ask(question(i))
            floor.append(time.perf_counter() - start - below.seconds)
        template_cost = statistics.median(floor)
        with durable:
            Bot(agent_id=f"w{index}-warm").ask(question(0))
            print("ready", flush=True)
            sys.stdin.readline()
            began = time.perf_counter()
            for i in range(turns):
                for bot in bots:
                    start = time.perf_counter()
                    bot.ask(question(i))
                    wall = time.perf_counter() - start
                    walls.append(wall)
                    overheads.append(wall - below.seconds - template_cost)
                fake.calls.clear()
            ended = time.perf_counter()
    if persistence is not None:
        persistence.close()
    print(json.dumps({"began": began, "ended": ended, "walls": walls, "overheads": overheads}))


# -- the parent -------------------------------------------------------------------


@contextmanager
def postgres_databases(url: str | None) -> Iterator[Any]:
    """A function making a fresh database per row: on ``url``'s server, or a throwaway one."""
    import psycopg

    if url is not None:
        names = iter(range(10**6))

        def fresh_on_server() -> str:
            name = f"bench_scale_{os.getpid()}_{next(names)}"
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{name}"'.encode())
            base, _, _ = url.rpartition("/")
            return f"{base}/{name}"

        yield fresh_on_server
        return
    sys.path.insert(0, str(ROOT / "tests" / "support"))
    from postgres_server import PostgresServer, find_bindir, unavailable

    reason = unavailable()
    if reason is not None:
        sys.exit(f"bench_scale: {reason}; or pass --postgres URL")
    bindir = find_bindir()
    assert bindir is not None
    server = PostgresServer(bindir)
    server.start()
    try:
        yield server.new_database
    finally:
        server.stop()


def run_row(db: str, workers: int, agents: int, turns: int) -> dict[str, float]:
    """Start ``workers`` processes on ``db`` together; the row's figures."""
    if db != "none":
        from effectful_durable import Store

        Store(db).close()  # the schema, made once before the workers race to open it
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--worker", db, str(i), str(agents), str(turns)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(workers)
    ]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            sys.exit(f"bench_scale: a worker failed to start (said {line!r})")
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=3600)
        if proc.returncode != 0:
            sys.exit(f"bench_scale: a worker exited with {proc.returncode}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    wall = max(r["ended"] for r in results) - min(r["began"] for r in results)
    walls = [w for r in results for w in r["walls"]]
    overheads = [o for r in results for o in r["overheads"]]
    return {
        "turns/s": len(walls) / wall,
        "turn med": statistics.median(walls) * 1000,
        "turn p90": p90(walls) * 1000,
        "over med": statistics.median(overheads) * 1000,
        "over p90": p90(overheads) * 1000,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        db, index, agents, turns = sys.argv[2:6]
        worker(db, int(index), int(agents), int(turns))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", default="1,2,4,8", help="worker process counts")
    parser.add_argument("--agents", type=int, default=4, help="agents per worker")
    parser.add_argument("--turns", type=int, default=100, help="turns per agent")
    parser.add_argument("--backends", default="none,sqlite,postgres")
    parser.add_argument("--postgres", help="a PostgreSQL server URL to create databases on")
    parser.add_argument("--quick", action="store_true", help="1 and 2 workers, 10 turns")
    args = parser.parse_args()
    counts = [1, 2] if args.quick else [int(n) for n in args.workers.split(",")]
    turns = 10 if args.quick else args.turns
    backends = args.backends.split(",")
    print(
        f"{os.cpu_count()} CPUs; {args.agents} agents per worker x {turns} turns each",
        file=sys.stderr,
    )
    header = (
        f"{'backend':<10} {'workers':>7} {'turns/s':>9} {'turn ms med/p90':>16}"
        f" {'overhead ms med/p90':>20}"
    )
    rows = [header, "-" * len(header)]
    databases = postgres_databases(args.postgres) if "postgres" in backends else nullcontext()
    with tempfile.TemporaryDirectory() as scratch, databases as new_postgres_database:
        for backend in backends:
            for n in counts:
                if backend == "sqlite":
                    db = str(Path(scratch) / f"scale-{n}.db")
                elif backend == "postgres":
                    db = new_postgres_database()
                else:
                    db = "none"
                print(f"{backend} x {n} ...", file=sys.stderr, flush=True)
                row = run_row(db, n, args.agents, turns)
                rows.append(
                    f"{backend:<10} {n:>7} {row['turns/s']:>9.0f}"
                    f" {row['turn med']:>7.2f} / {row['turn p90']:<6.2f}"
                    f" {row['over med']:>9.2f} / {row['over p90']:<6.2f}"
                )
    print("\n".join(rows))
    print(f"load average: {os.getloadavg()}")


if __name__ == "__main__":
    main()
