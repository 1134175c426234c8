"""Benchmark: how soon is an agent usable elsewhere when its holder froze inside a
maintenance write?

Each round, a holder (``tests/programs/freeze_child.py``, with the real lease: 15 s, renewed
every 5 s) makes a maintenance write of an agent (rollback, fork, delete, a
conversation's removal, prune) and stops itself (SIGSTOP, its renewals with it)
in the middle of it: right after its second statement under the hold, or just
before its COMMIT, by turns. Its transaction stays open on the server, locks and
all. This process then waits for the agent (``wait=60``) and commits a turn; the
round's figure is the time from the stop to the agent taken here. The holder is
then let go on, and must commit nothing (``tests/processes/test_hold_freezes.py``'s checks).
Directly, and through PgBouncer in transaction mode.

DESIGN.md's promise 11: within 30 s. A hold lapses 15 s after its last renewal,
and the take ends the stopped write's session, so the figure lies between 10 and
15 s.

Run: ``.venv/bin/python bench/bench_freezes.py [--rounds 10] [--paths direct,pgbouncer]``.
No assertions beyond the loop's own.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

import paths  # noqa: E402  (the tests' modules, and the holder it starts)
from freezes import Holder, case  # noqa: E402
from pgbouncer_server import PgBouncer, find_pgbouncer  # noqa: E402
from postgres_server import PostgresServer, find_bindir  # noqa: E402

from effectful_durable import Store  # noqa: E402
from effectful_durable.store.engine.postgres import holds  # noqa: E402

paths.install()

KINDS = ("rollback", "fork", "delete", "delete_conversation", "prune")


def rounds(url: str, count: int) -> list[float]:
    """The seconds until usable, one per round, each checked by the loop's checks."""
    holder = Holder(url, lease=holds.TTL)
    taken: list[float] = []
    try:
        with Store(url) as other:
            for number in range(count):
                kind = KINDS[number % len(KINDS)]
                agent = f"{kind}-{number}"
                holder.send({"setup": kind, "agent": f"{agent}-count"})
                assert holder.answer()["ok"]
                holder.send({"act": kind, "agent": f"{agent}-count", "stop": None})
                points = len(holder.answer()["events"])
                stop = 2 if number % 2 == 0 else points  # in the middle, or before COMMIT
                seconds = case(holder, other, kind, agent, stop)
                assert seconds is not None
                print(f"  {kind:<20} stopped at {stop}/{points}: usable after {seconds:.2f} s")
                taken.append(seconds)
    finally:
        holder.close()
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--paths", default="direct,pgbouncer")
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("no PostgreSQL server binaries")
    server = PostgresServer(bindir)
    server.start()
    bouncer = None
    try:
        for path in args.paths.split(","):
            url = server.new_database()
            if path == "pgbouncer":
                executable = find_pgbouncer()
                if executable is None:
                    sys.exit("no pgbouncer")
                bouncer = PgBouncer(executable, server)
                bouncer.start()
                url = bouncer.pooled(url)
            print(f"{path}:")
            taken = rounds(url, args.rounds)
            print(
                f"{path}: usable after {statistics.median(taken):.2f} s (median), "
                f"{max(taken):.2f} s (max), over {len(taken)} freezes"
            )
    finally:
        if bouncer is not None:
            bouncer.stop()
        server.stop()


if __name__ == "__main__":
    main()
