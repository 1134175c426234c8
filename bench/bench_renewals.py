"""Benchmark: does a healthy holder keep its holds while new connections cannot be
made, or while a PgBouncer pool is full, with the real lease (15 s)?

Three rounds, each holding agent ``bot`` in a turn for ``--seconds`` (20) while
another Store asks for it once a second (each refused while the hold stands), then
committing:

* ``no new connections``: the holder's role may have 3 connections (a pooled
  one, the renewals' own, one more); the renewals' own session is ended and every
  free slot taken for the whole time, so the renewals go through the pool;
* ``full pool, renewal_url``: behind PgBouncer with ``default_pool_size = 2``, two
  transactions hold both server connections for the whole time; the renewals go
  to the server directly (``renewal_url``);
* ``full pool, no renewal_url``: the same, the renewals queued behind them (the
  control: the hold lapses, and the commit is refused).

Run: ``.venv/bin/python bench/bench_renewals.py [--seconds 20]``. No assertions.
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import sys
import time
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "support"))

from helpers import added  # noqa: E402
from pgbouncer_server import PgBouncer, find_pgbouncer  # noqa: E402
from postgres_server import PostgresServer, find_bindir  # noqa: E402

from effectful_durable import AgentInUseError, DurableError, Store  # noqa: E402


def held_through(holder: Store, other: Store, seconds: float, squeeze: object) -> str:
    """Hold "bot" in a turn for ``seconds`` while ``squeeze()`` makes renewing hard
    (it returns what undoes it), the other Store refused all along; then commit."""
    refusals = takes = 0
    with holder.turns.start("bot", template="t", arguments={}) as start:
        undo = squeeze()  # type: ignore[operator]
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                try:
                    with other.agent_lock("bot"):
                        takes += 1
                except AgentInUseError:
                    refusals += 1
                time.sleep(1.0)
        finally:
            undo()
        try:
            holder.turns.commit(
                "bot", base_version=start.version, template="t", change=added(0), state=None
            )
            committed = "committed"
        except DurableError as error:
            committed = f"refused ({type(error).__name__})"
    return f"{refusals} refusals, {takes} takes elsewhere, the turn {committed}"


def no_new_connections(server: PostgresServer, seconds: float) -> str:
    url = server.new_database()
    name = url.rsplit("/", 1)[1]
    role = f"limited_{os.getpid()}"
    server.admin(f'CREATE ROLE "{role}" LOGIN CONNECTION LIMIT 3')
    server.admin(f'ALTER DATABASE "{name}" OWNER TO "{role}"')
    limited = server.url(name, user=role)
    with Store(limited, pool_size=2) as holder, Store(url) as other:

        def squeeze() -> object:
            renewals = holder.engine._holds._conn  # type: ignore[attr-defined]
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (renewals.info.backend_pid,))
            taken: list[psycopg.Connection] = []
            while True:
                try:
                    taken.append(psycopg.connect(limited))
                except psycopg.OperationalError:
                    break
            return lambda: [conn.close() for conn in taken]

        return held_through(holder, other, seconds, squeeze)


def full_pool(server: PostgresServer, seconds: float, *, renewal_url: bool) -> str:
    executable = find_pgbouncer()
    if executable is None:
        return "skipped: no pgbouncer"
    url = server.new_database()
    bouncer = PgBouncer(executable, server, {"default_pool_size": 2})
    bouncer.start()
    try:
        pooled = bouncer.pooled(url)
        with Store(pooled, renewal_url=url if renewal_url else None) as holder:
            with Store(url) as other:

                def squeeze() -> object:
                    blockers = [psycopg.connect(pooled) for _ in range(2)]
                    for blocker in blockers:
                        blocker.execute("SELECT 1")  # a transaction left open
                    return lambda: [blocker.close() for blocker in blockers]

                return held_through(holder, other, seconds, squeeze)
    finally:
        bouncer.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    bindir = find_bindir()
    if bindir is None:
        sys.exit("no PostgreSQL server binaries")
    server = PostgresServer(bindir)
    server.start()
    try:
        outcome = no_new_connections(server, args.seconds)
        print(f"no new connections for {args.seconds:g} s: {outcome}")
        for with_url in (True, False):
            what = "renewal_url" if with_url else "no renewal_url"
            outcome = full_pool(server, args.seconds, renewal_url=with_url)
            print(f"full PgBouncer pool for {args.seconds:g} s, {what}: {outcome}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
