"""Benchmark: the page's watch on PostgreSQL (issue 44, item 4): what a look costs the
server, how soon a commit of ours is heard of, and how often another database's writes
wake it.

On a throwaway cluster (``bench_claims.durable_server``: fsync on), a database with our
tables and a second database of the same server:

* **cost**: ``--polls`` looks, back to back on one connection, of (a) the WAL
  position alone (the watch before issue 44), (b) the watch's statement with the
  WAL position (our tables' statistics and the WAL), (c) the statistics alone (a
  server that refuses the WAL functions): the client's round trip (Unix socket)
  and the server's own time (``EXPLAIN (ANALYZE)``'s execution time), median and
  p90 in milliseconds.
* **heard after**: seconds from a commit of ours (a turn through a Store, in a
  process of its own, ``tests/programs/turns_child.py``, that then stays idle) until the
  page's watch (``MarkerWatch`` over ``TableStatsMarker``, as ``watch_commits`` makes it)
  woke, for a turn after a quiet second and for one 0.3 s after the previous one
  (its session's statistics are published late: PostgreSQL publishes a session's
  at most once a second), with and without the WAL position.
* **wakes**: how many times the watch woke in 5 s while the other database took
  50 inserts a second, and nothing of ours changed.

Run: ``.venv/bin/python bench/bench_watch.py [--polls 2000]`` (about a minute). No
assertions.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from bench_claims import durable_server  # the throwaway cluster, fsync on

from effectful_durable import Store
from effectful_durable.store.engine.postgres import table_stats
from effectful_durable.store.engine.watch import MarkerWatch

if TYPE_CHECKING:
    from postgres_server import PostgresServer

ROOT = Path(__file__).resolve().parent.parent
TURNS_CHILD = ROOT / "tests" / "programs" / "turns_child.py"


def ms(values: list[float]) -> str:
    ordered = sorted(values)
    p90 = ordered[int(len(ordered) * 0.9)]
    return f"{statistics.median(ordered) * 1000:7.3f} / {p90 * 1000:7.3f}"


def cost(url: str, polls: int) -> None:
    """The round trip and the server's time of each kind of look."""
    with Store(url) as store:
        marker = table_stats.TableStatsMarker(store.engine)
        marker.read()
        tables = marker._tables
    statements = {
        "WAL position alone": (f"SELECT {table_stats._WAL}", None),
        "statistics + WAL": (table_stats._POLL.format(wal=table_stats._WAL), tables),
        "statistics alone": (table_stats._POLL.format(wal="NULL"), tables),
    }
    print(f"cost of one look, {polls} looks each: median / p90 ms")
    print(f"{'look':<22}{'round trip':>20}{'server':>20}")
    with psycopg.connect(url, autocommit=True) as conn:
        for name, (sql, params) in statements.items():
            query = sql.replace("?", "%s")
            trips, server_times = [], []
            for n in range(polls):
                started = time.perf_counter()
                conn.execute(query, params).fetchone()
                trips.append(time.perf_counter() - started)
                if n % 10 == 0:
                    plan = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", params)
                    server_times.append(plan.fetchone()[0][0]["Execution Time"] / 1000)
            print(f"{name:<22}{ms(trips):>20}{ms(server_times):>20}")


class Watching:
    """The page's watch of ``url`` (as ``watch_commits`` makes it, but for ``wal``: False
    plays a server that refuses the WAL position), noting when it woke."""

    def __init__(self, url: str, *, wal: bool) -> None:
        self.store = Store(url, readonly=True)
        marker = table_stats.TableStatsMarker(self.store.engine)
        marker._wal = wal
        self.moves: list[float] = []
        self._watch = MarkerWatch(
            marker.read,
            lambda: self.moves.append(time.monotonic()),
            location=self.store.engine.location,
        )

    def heard_after(self, committed: float, timeout: float = 15.0) -> float | None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [t for t in self.moves if t >= committed]
            if later:
                return later[0] - committed
            time.sleep(0.02)
        return None

    def close(self) -> None:
        self._watch.close()
        self.store.close()


def heard(url: str) -> None:
    """Seconds from a commit until the marker moved: after a quiet second, and 0.3 s
    after the previous commit of the same process."""
    print("\nheard after: seconds from a commit of ours to the watch's wake")
    print(f"{'watch':<22}{'after a quiet second':>24}{'0.3 s after another':>24}")
    for wal in (True, False):
        child = subprocess.Popen(
            [sys.executable, str(TURNS_CHILD), url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        )
        assert child.stdin is not None and child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        watching = Watching(url, wal=wal)
        quiet, quick = [], []
        try:
            for _ in range(2):
                time.sleep(1.5)
                child.stdin.write("\n")
                child.stdin.flush()
                quiet.append(watching.heard_after(float(child.stdout.readline())))
                time.sleep(0.3)
                child.stdin.write("\n")
                child.stdin.flush()
                quick.append(watching.heard_after(float(child.stdout.readline())))
                time.sleep(11)  # the late one is published meanwhile
        finally:
            watching.close()
            child.stdin.close()
            child.wait()
        name = "statistics + WAL" if wal else "statistics alone"
        print(f"{name:<22}{seconds(quiet):>24}{seconds(quick):>24}")


def seconds(values: list[float | None]) -> str:
    return ", ".join("never" if v is None else f"{v:.2f}" for v in values)


def wakes(cluster: PostgresServer, url: str) -> None:
    """Wakes of the watch while another database takes 50 inserts a second."""
    watching = Watching(url, wal=True)
    try:
        with cluster.another_database_writing(50):
            before = len(watching.moves)
            time.sleep(5)
            moved = len(watching.moves) - before
    finally:
        watching.close()
    print(f"\nwakes in 5 s of another database's 50 inserts a second: {moved}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=2000, help="looks of each kind (2,000)")
    args = parser.parse_args()
    cluster = durable_server()
    cluster.start()
    try:
        url = cluster.new_database()
        with Store(url) as store:
            store.send_event("w", "hello", create=True)
        cost(url, args.polls)
        heard(url)
        wakes(cluster, url)
        print(f"\nload average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
