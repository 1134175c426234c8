"""Power loss: the disk keeps only what was synced, at each chosen point of a run of turns.

A run of turns (an agent whose tool changes a field, and an agent that writes
its SQL tables) goes through tests/support/faultvfs.py in power-loss mode. At the Nth
write or sync of the run the disk stops; every write since each file's last
sync and the ``-shm`` files are then dropped, as a reboot would find them, and
the database is reopened:

- ``durability="full"``: it reopens at a committed version, every turn that
  returned before the cut is there, and each version reads back as it was
  committed (history, fields, SQL tables);
- ``durability="normal"``: the same, except that the last commits may be
  missing: what is left is always a prefix of the committed versions, never a
  torn or damaged file.

Either way ``integrity_check`` is ok and the next turn commits. By default the
cut is tried at SAMPLE points spread over the run;
EFFECTFUL_DURABLE_FAULT_SWEEP=full tries every write and sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultvfs import FaultVFS, report, sample
from helpers import Assistant, integrity, running, texts
from sql_helpers import Tracker

from effectful_durable import PersistenceHandler, Store
from effectful_durable.store import Durability
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

SAMPLE = 12
TURNS = 4  # turns of each agent per run
QUERY = "SELECT km, day FROM runs ORDER BY id"


def respond(call: FakeCall) -> Reply:
    if call.messages[-1]["role"] == "tool":
        return f"done: {call.last_user_text}"
    if "self__sql_insert" in call.tools:
        values = {"km": len(call.messages), "day": call.last_user_text}
        return ToolCall("sql_insert", {"table": "runs", "values": values})
    return ToolCall("remember", {"note": call.last_user_text})


def run(db: Path, durability: Durability, returned: list[tuple[str, int]]) -> None:
    """Alternate turns of the two agents, appending (agent, version) as each returns."""
    persistence = PersistenceHandler(db, durability=durability)
    try:
        with running(FakeLLM(respond=respond), persistence):
            bot, tracker = Assistant(agent_id="bot"), Tracker(agent_id="tracker")
            for i in range(TURNS):
                for agent in (bot, tracker):
                    agent.ask(f"q{i}")
                    returned.append((agent.agent_id, agent.__dict__["__durable__"].version))
    finally:
        with contextlib.suppress(Exception):  # the disk may be off
            persistence.close()


def versions(db: Path) -> dict[tuple[str, int], Any]:
    """Every committed version (texts, fields, SQL rows), read as a restarted program would."""
    with Store(db) as store:
        return {
            (agent.agent_id, v): (
                texts(store.history(agent.agent_id, v)),
                store.state(agent.agent_id, v),
                store.sql(agent.agent_id, QUERY, version=v).rows
                if agent.agent_id == "tracker"
                else None,
            )
            for agent in store.agents()
            for v in range(1, agent.version + 1)
        }


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The versions of a run without a cut, and how many writes and syncs it makes."""
    db = tmp_path_factory.mktemp("reference") / "state.db"
    out: dict[str, Any] = {}
    for durability in ("normal", "full"):
        with FaultVFS(power_loss=True) as vfs, vfs.counting() as calls:
            run(db.with_name(f"{durability}.db"), durability, [])
        out[durability] = (
            calls["write"] + calls["sync"],
            versions(db.with_name(f"{durability}.db")),
        )
    return out


@contextlib.contextmanager
def power(vfs: FaultVFS) -> Iterator[None]:
    try:
        yield
    finally:
        vfs.power_loss()


@pytest.mark.parametrize("durability", ["full", "normal"])
def test_power_loss_at_each_point(
    durability: Durability, reference: dict[str, Any], tmp_path: Path
) -> None:
    """After a cut, the database reopens at committed versions that read back as committed."""
    total, committed = reference[durability]
    lost_runs = 0
    for nth in sample(total, SAMPLE):
        db = tmp_path / f"{nth}" / "state.db"
        db.parent.mkdir()
        returned: list[tuple[str, int]] = []
        with FaultVFS(power_loss=True) as vfs:
            vfs.cut(nth)
            with contextlib.suppress(Exception), power(vfs):
                run(db, durability, returned)
            where = f"{durability}, cut at write/sync {nth} of {total}"
            assert integrity(db) == "ok", where
            found = versions(db)
            assert all(found[key] == committed[key] for key in found), (
                f"{where}: a version reads back other than committed"
            )
            kept = [key for key in returned if key in found]
            if durability == "full":
                assert kept == returned, f"{where}: lost turns that had returned"
            else:
                assert kept == returned[: len(kept)], f"{where}: lost a turn but kept a later one"
                lost_runs += kept != returned
            for agent_id in ("bot", "tracker"):
                latest = max((v for a, v in found if a == agent_id), default=0)
                assert all((agent_id, v) in found for v in range(1, latest + 1)), where
            run(db, durability, [])  # the next turns commit
            assert integrity(db) == "ok", where
            assert len(versions(db)) == len(found) + 2 * TURNS, where
    if durability == "full":
        assert lost_runs == 0
    report(
        sweep="power",
        operation=f"{TURNS * 2} turns, 2 agents",
        durability=durability,
        calls=total,
        tried=len(sample(total, SAMPLE)),
        lost=lost_runs,
    )
