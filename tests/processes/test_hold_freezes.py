"""A holder stopped at any point of a write under its hold commits nothing once its hold
lapsed, and takes no one's commit with it (DESIGN.md, promise 11; issue 49).

The freeze loop: for each kind of write made under a hold (a turn's commit, the
record of a failed turn, a workflow step, a compaction, an approved turn resumed, a
state migration, rollback, fork, delete, a conversation's removal, prune), a child
(``tests/programs/freeze_child.py``) makes the write and stops itself (SIGSTOP, its renewals
with it) right after one statement of it, or just before its COMMIT: each point in
turn. Meanwhile this process waits for the agent, takes it once the child's hold
lapsed, and commits a turn; then takes it again and, holding it mid-turn, lets the
child go on (SIGCONT). Counted: the child's writes that landed after its hold lapsed
(must be 0), and this process's acknowledged commits lost or its running turn's
handoff changed (must be 0), and how long the agent took to be usable here.

Holds last 2 s here (``holds.TTL``); ``bench/bench_freezes.py`` measures the real
lease. A default run tries one point of each kind, directly; ``make crash``
(``EFFECTFUL_DURABLE_CRASH=full``) every point, directly and through PgBouncer.
"""

from __future__ import annotations

import os
import random
import statistics
from typing import Any

import pytest
from freezes import LEASE, Holder, case
from pgbouncer_server import running as pgbouncer_running
from postgres_server import PostgresServer

from effectful_durable import Store
from effectful_durable.store.engine.postgres import holds

FULL = os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full"
KINDS = (
    "turn",
    "failed",
    "workflow",
    "compaction",
    "approval",
    "migration",
    "rollback",
    "fork",
    "delete",
    "delete_conversation",
    "prune",
)

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def short_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(holds, "TTL", LEASE)
    monkeypatch.setattr(holds, "RENEW_EVERY", LEASE / 5)


def freeze_loop(url: str, *, every_point: bool) -> dict[str, Any]:
    """Run the loop; what it counted."""
    seed = random.randrange(2**32)
    picks = random.Random(seed)
    holder = Holder(url)
    usable: list[float] = []
    cases = 0
    try:
        with Store(url) as other:
            for kind in KINDS:
                holder.send({"setup": kind, "agent": f"{kind}-count"})
                assert holder.answer()["ok"]
                holder.send({"act": kind, "agent": f"{kind}-count", "stop": None})
                counted = holder.answer()
                assert counted["ok"] or kind == "failed", counted
                points = len(counted["events"])
                assert points >= 2, counted  # the fence's statement, the COMMIT at least
                stops = range(1, points + 1) if every_point else [picks.randint(1, points)]
                for stop in stops:
                    seconds = case(holder, other, kind, f"{kind}-{stop}", stop)
                    assert seconds is not None, f"{kind}: event {stop} of {points} not reached"
                    usable.append(seconds)
                    cases += 1
    finally:
        holder.close()
    counts = {
        "seed": seed,
        "cases": cases,
        "usable_median": round(statistics.median(usable), 2),
        "usable_max": round(max(usable), 2),
    }
    print(f"\nfreeze loop ({url.rsplit('@', 1)[-1]}): {counts}")
    return counts


class TestFreezeLoop:
    def test_a_stopped_holder_commits_nothing_and_loses_no_commit(self, postgres_url: str) -> None:
        """At each point of each write under a hold, a holder stopped there loses its
        agent within a lease or two, commits nothing when it goes on, and this process's
        two commits meanwhile stay."""
        counts = freeze_loop(postgres_url, every_point=FULL)
        assert counts["usable_max"] < 4 * LEASE

    @pytest.mark.skipif(not FULL, reason="every point through PgBouncer: make crash")
    def test_through_pgbouncer(self, postgres_server: PostgresServer, postgres_url: str) -> None:
        """The same through PgBouncer in transaction mode: the stopped holder's server
        session serves no one else until it is ended."""
        with pgbouncer_running(postgres_server) as pooler:
            counts = freeze_loop(pooler.pooled(postgres_url), every_point=True)
        assert counts["usable_max"] < 4 * LEASE
