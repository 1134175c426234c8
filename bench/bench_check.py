"""How long `effectful-durable check-upgrade` takes over many agents with mixed in-flight work.

The database is bench/many_agents.py's, written in bulk on PostgreSQL (a throwaway
server, or ``--postgres URL``'s): ``--agents`` agents with ``--messages`` messages
in all, tool calls in their histories, fields, pending and dead alarms, pending
events, approvals waiting and decided, failed turns. It is then copied to an
SQLite file (``effectful-durable copy``), and the check runs on both, twice each:

* ``same``: the code that wrote it (a ``Desk`` agent with the ``lookup`` and
  ``refund`` tools, ``on_event`` and ``on_alarm``): everything carries over;
* ``same again``: the same, a second time (the first read the data cold);
* ``renamed``: ``refund`` renamed to ``pay_refund``: every waiting approval, and
  every history that called it, breaks.

One line per run: seconds, agents per second, what was found. Nothing is asserted.

    .venv/bin/python bench/bench_check.py                    # 10,000 agents, 500,000 messages
    .venv/bin/python bench/bench_check.py --agents 100000 --messages 5000000 --no-sqlite
"""

from __future__ import annotations

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import argparse
import dataclasses
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

import many_agents
from effectful.handlers.llm import Template, Tool
from effectful.ops.types import NotHandled

from effectful_durable import (
    AlarmTools,
    OnEvent,
    PersistentAgent,
    Store,
    check_upgrade,
    requires_approval,
)
from effectful_durable.store.copy import copy_store


@dataclasses.dataclass
class Customer(PersistentAgent, AlarmTools, OnEvent):
    """You answer customers about their orders."""

    customer: str = ""
    topic: str = ""

    @Tool.define
    def lookup(self, order: str) -> str:
        """Look an order up."""
        return order

    @Template.define
    def ask(self, question: str) -> str:
        """{question}"""
        raise NotHandled


@dataclasses.dataclass
class Desk(Customer):
    """You answer customers about their orders."""

    @Tool.define
    @requires_approval(reason="a refund")
    def refund(self, order: str) -> str:
        """Refund an order."""
        return order


@dataclasses.dataclass
class RenamedDesk(Customer):
    """You answer customers about their orders."""

    @Tool.define
    @requires_approval(reason="a refund")
    def pay_refund(self, order: str) -> str:
        """Refund an order."""
        return order


# The first run reads a database no check has read yet (the server's and the file
# system's caches cold); the second the same, warm; the third with the tool renamed.
RUNS = [("same", Desk), ("same again", Desk), ("renamed", RenamedDesk)]


def timed(db: str, what: str, agent_class: type[Any]) -> None:
    started = time.perf_counter()
    report = check_upgrade(db, agents=lambda agent_id: agent_class(agent_id=agent_id))
    seconds = time.perf_counter() - started
    kinds: dict[str, int] = {}
    for problem in report.breaks:
        kinds[problem.kind] = kinds.get(problem.kind, 0) + 1
    counts = report.in_flight
    print(
        f"{what:<20} {seconds:7.1f} s  {counts['agents'] / seconds:8,.0f} agents/s  "
        f"{counts['agents']:,} agents, {counts['conversations']:,} conversations, "
        f"{counts['approvals']:,} approvals, {counts['alarms']:,} alarms, "
        f"{counts['events']:,} events; breaks: {kinds or 'none'}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agents", type=int, default=10_000)
    parser.add_argument("--messages", type=int, default=500_000)
    parser.add_argument("--postgres", metavar="URL", help="a server to use (default: throwaway)")
    parser.add_argument("--no-sqlite", action="store_true", help="skip the SQLite copy")
    args = parser.parse_args()
    name = f"bench_check_{args.agents}_{args.messages}"
    with many_agents.databases(args.postgres) as database:
        url = database(name) if args.postgres else database(name)
        if not many_agents.built(url):
            done = many_agents.build(
                url, agents=args.agents, messages=args.messages, long_turns=1_000
            )
            print(
                f"built {done.agents:,} agents, {done.messages:,} messages, {done.alarms:,} "
                f"alarms, {done.approvals:,} approvals in {done.seconds:.0f} s",
                flush=True,
            )
        for what, agent_class in RUNS:
            timed(url, f"postgres {what}", agent_class)
        if args.no_sqlite:
            print(f"load average: {' '.join(f'{n:.2f}' for n in os.getloadavg())}")
            return
        with tempfile.TemporaryDirectory() as folder:
            path = str(Path(folder) / "check.db")
            started = time.perf_counter()
            with Store(url, readonly=True) as source, Store(path) as target:
                copy_store(source, target)
            print(f"copied to SQLite in {time.perf_counter() - started:.0f} s", flush=True)
            for what, agent_class in RUNS:
                timed(path, f"sqlite {what}", agent_class)
    print(f"load average: {' '.join(f'{n:.2f}' for n in os.getloadavg())}")


if __name__ == "__main__":
    main()
