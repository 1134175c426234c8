"""Benchmark: an agent's SQL INSERT costs the same into a 100,000-row table as into an empty one.

Two ``Ledger`` agents (PersistentAgent + SQLTools) share one database: ``empty``, whose
``events`` table is empty, and ``full``, whose ``events`` table was filled with
``--rows`` rows (100,000 by default; loaded in one turn through ``sql_execute`` with a
recursive CTE, in batches that fit the sandbox's step budget). Then each agent plays
``--turns`` turns, interleaved; in each, the model makes one ``sql_insert`` call. Printed
per agent (median and p90 over the turns):

* ``turn ms``: wall time of the whole turn (two fake model calls, the tool call, the
  commit of the history and of the SQL change, the workspace commit). Most of it is
  effectful building pydantic schemas for the three SQL tools at each model call;
* ``insert ms``: wall time of the store's part of the ``sql_insert`` tool call
  (``WorkspaceTurn.insert``: the sandbox checks, the savepoint, the insert, the
  session bookkeeping);
* ``workspace ms``: wall time of opening the workspace for the turn (open the file,
  catch up, check the declaration), logging its changeset in the main transaction,
  and committing the workspace file after the main commit;
* ``log bytes``: size of the changeset the turn wrote into the main database;
* the size of the agent's workspace file.

Run: ``.venv/bin/python bench/bench_sql.py [--rows 100000] [--turns 200]
[--backend sqlite|postgres] [--postgres URL]``. With ``--backend postgres`` the
database is a new one on ``--postgres URL``'s server, or on a throwaway cluster
(see bench_scale.py), and the workspace files are in a temporary cache directory.
No assertions: the target is that both columns are about equal for the two agents.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent, SQLTools, Store
from effectful_durable.store.workspace.workspace import SQLResult, WorkspaceTurn
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall


@dataclasses.dataclass
class Ledger(PersistentAgent, SQLTools):
    """You log events."""

    __sql_schema__ = """
        CREATE TABLE events (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, at REAL, body TEXT);
        CREATE INDEX events_kind ON events (kind);
    """

    @Template.define
    def log(self, what: str) -> str:
        """Log this: {what}"""
        raise NotHandled


FILL = (
    "INSERT INTO events (kind, at, body) "
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?) "
    "SELECT 'kind-' || (i % 50), i * 1.5, printf('event %d with some text', i) FROM n"
)


def respond(call: FakeCall) -> Reply:
    if call.messages[-1]["role"] == "tool":
        return "logged"
    text = call.last_user_text
    if text.startswith("Log this: fill"):
        return ToolCall("sql_execute", {"statement": FILL, "params": [int(text.split()[-1])]})
    values = {"kind": "kind-7", "at": time.time(), "body": text}
    return ToolCall("sql_insert", {"table": "events", "values": values})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--postgres", help="a PostgreSQL server URL to create the database on")
    args = parser.parse_args(argv)
    insert_times: list[float] = []
    original = WorkspaceTurn.insert

    def timed(self: WorkspaceTurn, table: str, values: Any) -> SQLResult:
        started = time.perf_counter()
        try:
            return original(self, table, values)
        finally:
            insert_times.append(time.perf_counter() - started)

    WorkspaceTurn.insert = timed  # type: ignore[method-assign]
    overhead: list[float] = []  # opening, logging and committing the workspace, per turn
    for method in ("__init__", "write", "finish"):
        wrapped = getattr(WorkspaceTurn, method)

        def clocked(*a: Any, _wrapped: Any = wrapped, **k: Any) -> Any:
            started = time.perf_counter()
            try:
                return _wrapped(*a, **k)
            finally:
                overhead.append(time.perf_counter() - started)

        setattr(WorkspaceTurn, method, clocked)
    with tempfile.TemporaryDirectory() as tmp, ExitStack() as stack:
        if args.backend == "postgres":
            from bench_scale import postgres_databases

            url = stack.enter_context(postgres_databases(args.postgres))()
            store = Store(url, workspace_dir=Path(tmp) / "cache")
        else:
            store = Store(Path(tmp) / "bench.db")
        persistence = PersistenceHandler(store)
        agents = {"empty": Ledger(agent_id="empty"), "full": Ledger(agent_id="full")}
        turn_ms: dict[str, list[float]] = {name: [] for name in agents}
        insert_ms: dict[str, list[float]] = {name: [] for name in agents}
        workspace_ms: dict[str, list[float]] = {name: [] for name in agents}
        with handler(LiteLLMProvider(model="fake")), handler(FakeLLM(respond=respond)):
            with handler(persistence):
                agents["empty"].log("hello")
                batch = 50_000  # within the default budget of 10 million VM steps
                for done in range(0, args.rows, batch):
                    agents["full"].log(f"fill {min(batch, args.rows - done)}")
                count = persistence.store.sql("full", "SELECT count(*) FROM events").rows
                print(f"full agent's events: {count[0][0]:,} rows", file=sys.stderr)
                insert_times.clear()
                for turn in range(args.turns):
                    for name, agent in agents.items():
                        overhead.clear()
                        started = time.perf_counter()
                        agent.log(f"turn {turn}")
                        turn_ms[name].append((time.perf_counter() - started) * 1000)
                        insert_ms[name].append(insert_times.pop() * 1000)
                        workspace_ms[name].append(sum(overhead) * 1000)
        print(
            f"{'agent':<6} {'rows before':>11} {'turn ms p50':>11} {'p90':>6} "
            f"{'insert ms p50':>13} {'p90':>6} {'workspace ms p50':>16} {'p90':>6} "
            f"{'log bytes':>9} {'file KiB':>9}"
        )
        for name in agents:
            rows = args.rows if name == "full" else 0
            with store.engine.reading() as conn:
                log_bytes = conn.execute(
                    "SELECT length(changeset) FROM workspace_log WHERE agent_id = ? "
                    "ORDER BY version DESC LIMIT 1",
                    (name,),
                ).get
            size = os.path.getsize(store._workspaces.path(name)) // 1024
            print(
                f"{name:<6} {rows:>11,} {statistics.median(turn_ms[name]):>11.2f} "
                f"{_p90(turn_ms[name]):>6.2f} {statistics.median(insert_ms[name]):>13.3f} "
                f"{_p90(insert_ms[name]):>6.3f} {statistics.median(workspace_ms[name]):>16.3f} "
                f"{_p90(workspace_ms[name]):>6.3f} {log_bytes:>9} {size:>9,}"
            )
        persistence.close()
    print(f"load average: {os.getloadavg()[0]:.2f} (the machine may be shared)")
    return 0


def _p90(values: list[float]) -> float:
    return statistics.quantiles(values, n=10)[-1]


if __name__ == "__main__":
    sys.exit(main())
