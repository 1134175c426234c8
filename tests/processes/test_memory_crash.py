"""SIGKILL amid turns that write memory: every committed version intact, nothing partial.

``tests/programs/memory_child.py`` runs turns of one StateTools agent, on SQLite or PostgreSQL,
whose every turn puts, deletes and adds context notes (see ``writes`` there). The tests
kill it inside a turn whose writes are staged, and at random moments of a 30-turn run.
After each kill, through connections of their own: integrity_check is ok; the versions
run 1 to v; EVERY version's memory and notes are exactly what its turns wrote; no
memory row of a later version exists. The next child goes on from v. The random kills
stop after 5 kills; ``EFFECTFUL_DURABLE_CRASH=full`` (``make crash``) allows 10.
"""

import itertools
import os
import random
import time
from pathlib import Path

import pytest
from crash_children import Child, Children, Kills, commits
from helpers import integrity, persisted_rows
from memory_child import AGENT_ID, expected_memory, expected_notes
from paths import PROGRAMS

from effectful_durable import Store

CHILD = PROGRAMS / "memory_child.py"
TURNS = 30
MAX_KILLS = 10 if os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full" else 5
SEED = 20261123


def check_on_disk(db_path: Path | str) -> int:
    """Check every committed version's memory; return the committed version."""
    assert integrity(db_path) == "ok"
    with Store(db_path, readonly=True) as store:
        records = [a for a in store.agents() if a.agent_id == AGENT_ID]
        version = records[0].version if records else 0
        if version:
            assert [i.version for i in store.versions(AGENT_ID)] == list(range(1, version + 1))
        for v in range(1, version + 1):
            assert store.memory(AGENT_ID, v) == expected_memory(v), v
            assert [n.text for n in store.memory_notes(AGENT_ID, v)] == expected_notes(v), v
    [(later,)] = persisted_rows(
        db_path,
        "SELECT count(*) FROM memory WHERE added_in > ?1 OR removed_in > ?1",
        version,
    )
    assert later == 0
    return version


@pytest.mark.slow
class TestKilledMemoryTurns:
    """Kills of a process whose turns write memory."""

    @pytest.mark.parametrize("durability", ["normal", "full", "postgres"])
    def test_kill_with_staged_writes(
        self, tmp_path: Path, durability: str, request: pytest.FixtureRequest
    ) -> None:
        """A kill after a turn staged writes keeps memory at its last commit; the run goes on."""
        db_path: Path | str = tmp_path / "state.db"
        if durability == "postgres":
            db_path = request.getfixturevalue("postgres_url")
            durability = "normal"
        child = Child(db_path, tmp_path / "logs", durability=durability, script=CHILD)
        try:
            child.load()
            assert child.open() == 0
            child.send("run 4")
            assert child.expect("done") == ["4"]
            child.send("block")
            assert child.expect("in-turn") == ["5"]
            child.kill()
        finally:
            child.close()
        assert check_on_disk(db_path) == 4
        resumed = Child(db_path, tmp_path / "logs", durability=durability, script=CHILD)
        try:
            resumed.load()
            assert resumed.open() == 4
            resumed.send("run 2")
            assert resumed.expect("done") == ["6"]
        finally:
            resumed.close()
        assert check_on_disk(db_path) == 6

    def test_random_kills(self, store_url: str, tmp_path: Path) -> None:
        """After every kill at a random moment, every committed version's memory is whole."""
        db_path = store_url
        rng = random.Random(SEED)
        kills = Kills(pace=[0.2])
        Store(db_path).close()
        version = 0
        with Children(db_path, tmp_path / "logs", budget=MAX_KILLS + 1, script=CHILD) as children:
            while version < TURNS and len(kills.versions) < MAX_KILLS:
                child = children.next()
                assert child.open() == version
                child.send(f"run {TURNS - version}")
                for _ in range(min(rng.randint(0, 2), TURNS - version - 1)):
                    child.expect("committed")
                time.sleep(kills.delay(rng))
                child.kill()
                reported = commits(child)
                kills.pace += [b - a for (a, _), (b, _) in itertools.pairwise(reported)]
                last = reported[-1][1] if reported else version
                version = check_on_disk(db_path)
                assert last <= version <= last + 1  # no reported commit is lost
                kills.versions.append(version)
            if version < TURNS:
                child = children.next()
                assert child.open() == version
                child.send(f"run {TURNS - version}")
                assert child.expect("done") == [str(TURNS)]
        assert check_on_disk(db_path) == TURNS
        print(f"\nversions after the kills: {kills.versions}")
