"""Benchmark: erasing one subject among many agents, on SQLite and PostgreSQL.

Builds ``--agents`` agents (10,000), each with its subject and ``--turns`` turns of a
~300-byte question and ~700-byte answer, then erases one subject (one agent and a fork
of it) and times ``Store.erase`` whole: the transaction under the holds, and the scrub
of the files (SQLite: the WAL checkpointed and truncated; PostgreSQL: ``VACUUM FULL``
of the tables that held the rows, which grows with those tables, not with what was
erased). Five erasures each; the median and the worst.

Run: ``.venv/bin/python bench/bench_erase.py [--agents 10000] [--turns 2]
[--backends sqlite,postgresql]``. No assertions.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from postgres_server import PostgresServer, find_bindir  # noqa: E402

from effectful_durable import Store  # noqa: E402
from effectful_durable.store.history import HistoryChange  # noqa: E402

ERASURES = 5


def build(url: str, agents: int, turns: int) -> None:
    """``agents`` agents of ``turns`` turns each, each its own subject."""
    with Store(url) as store:
        for n in range(agents):
            agent = f"user-{n:05d}"
            store.set_subject(agent, f"subject:{n}")
            for _ in range(turns):
                with store.turns.start(agent, template="ask", arguments={}) as start:
                    base = start.version
                    messages = [
                        (2 * base, {"id": f"q{base}", "role": "user", "content": "q" * 300}),
                        (
                            2 * base + 1,
                            {"id": f"a{base}", "role": "assistant", "content": "a" * 700},
                        ),
                    ]
                    store.turns.commit(
                        agent, base_version=base, template="ask",
                        change=HistoryChange(messages, [], 0), state='{"n": 1}',
                    )  # fmt: skip
            if n % 1000 == 999:
                print(f"  {n + 1} agents", file=sys.stderr)


def erasures(url: str, count: int) -> list[float]:
    """Seconds of ``count`` erasures of one subject each (the agent and a fork of it)."""
    taken = []
    with Store(url) as store:
        for n in range(count):
            agent = f"user-{n:05d}"
            store.fork(agent, None, f"{agent}-fork")
            started = time.perf_counter()
            receipt = store.erase(subject=f"subject:{n}")
            taken.append(time.perf_counter() - started)
            assert receipt.agents == (agent, f"{agent}-fork") and receipt.scrubbed_at
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--turns", type=int, default=2)
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    for backend in args.backends.split(","):
        server = None
        with tempfile.TemporaryDirectory() as directory:
            if backend == "sqlite":
                url = os.path.join(directory, "bench.db")
            else:
                bindir = find_bindir()
                if bindir is None:
                    sys.exit("no PostgreSQL server binaries")
                server = PostgresServer(bindir)
                server.start()
                url = server.new_database()
            try:
                started = time.perf_counter()
                build(url, args.agents, args.turns)
                built = time.perf_counter() - started
                taken = erasures(url, ERASURES)
                print(
                    f"{backend}: {args.agents} agents x {args.turns} turns (built in "
                    f"{built:.0f} s): an erasure of one subject took "
                    f"{statistics.median(taken):.3f} s (median), {max(taken):.3f} s (worst), "
                    f"over {ERASURES}"
                )
            finally:
                if server is not None:
                    server.stop()


if __name__ == "__main__":
    main()
