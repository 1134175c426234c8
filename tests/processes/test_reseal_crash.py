"""A key rotation killed (SIGKILL) at a random moment is done or not begun, for every row.

Each round, a child (``tests/programs/reseal_child.py``) seals every row of 12 agents again
with new keys, four rows a transaction, and is killed a random while after it said it
began. Afterwards every agent reads back exactly as before (no row is half sealed:
each opens, with its old key or its new one), the file passes its integrity check
(SQLite), and a rotation run to its end leaves every row on a key of its own.
``EFFECTFUL_DURABLE_CRASH=full`` (``make crash``) kills 20 times, else 5.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import commit_message, persisted_rows
from paths import PROGRAMS

from effectful_durable import Keys, LocalMasterKey, Store
from effectful_durable.store.sealing import key_id_of

pytestmark = pytest.mark.slow

CHILD = PROGRAMS / "reseal_child.py"
ROUNDS = 20 if os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full" else 5
AGENTS = 12


def key_ids(url: str) -> list[str]:
    rows = persisted_rows(url, "SELECT body FROM messages")
    rows += persisted_rows(url, "SELECT state FROM versions WHERE state IS NOT NULL")
    rows += persisted_rows(url, "SELECT arguments FROM handoffs")
    return [key_id_of(str(value)) for (value,) in rows]


def test_a_rotation_killed_is_done_or_not_begun_for_every_row(
    store_url: str, tmp_path: Path
) -> None:
    """Killed at random moments, a rotation leaves each row on its old key or its new
    one, every agent reading back exactly; run to its end, it leaves none on an old one."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    key_file = tmp_path / "master.key"
    key_file.write_text(LocalMasterKey.generate())
    key_store = str(tmp_path / "master.keys")
    keys = Keys.from_file(key_file, store=key_store)
    agents = [f"agent-{n}" for n in range(AGENTS)]
    with Store(store_url, keys=keys) as store:
        for agent in agents:
            for turn in range(20):
                commit_message(store, agent, f"{agent} says secret {turn}")
        with store.turns.start("agent-0", template="t", arguments={"q": "in flight"}):
            pass  # a handoff left behind, as by a crash
        before = {agent: (store.history(agent), store.versions(agent)) for agent in agents}
        handoffs = store.handoffs()
    took = reseal_time(store_url, key_file, key_store)
    outcomes = {"killed": 0, "finished": 0}
    for _ in range(ROUNDS):
        child = start(store_url, key_file, key_store)
        time.sleep(rng.uniform(0, 1) * 1.1 * took)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        outcomes["killed" if child.returncode else "finished"] += 1
        with Store(store_url, keys=keys) as store:
            after = {agent: (store.history(agent), store.versions(agent)) for agent in agents}
            assert after == before, seed
            assert store.handoffs() == handoffs, seed
            if not store_url.startswith("postgresql://"):
                assert store.check()["integrity"] == "ok"
        assert "" not in key_ids(store_url), seed
    finish = start(store_url, key_file, key_store)
    assert finish.stdout is not None and finish.stdout.readline().startswith("done")
    finish.wait()
    made_last = {str(k) for (k,) in _newest_keys(key_store, len(set(key_ids(store_url))))}
    assert set(key_ids(store_url)) <= made_last, seed
    with Store(store_url, keys=keys) as store:
        assert {agent: (store.history(agent), store.versions(agent)) for agent in agents} == before
    print(f"\nreseal kills (seed {seed}, a rotation takes {took:.3f} s): {outcomes}")


def _newest_keys(key_store: str, count: int) -> list[tuple[str]]:
    import apsw

    conn = apsw.Connection(key_store, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        rows = conn.execute(
            "SELECT key_id FROM data_keys ORDER BY created_at DESC LIMIT ?", (count,)
        ).fetchall()
        return [(str(row[0]),) for row in rows]
    finally:
        conn.close()


def start(url: str, key_file: Path, key_store: str) -> subprocess.Popen[str]:
    """A child rotating the keys, once it said it begins."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), url, str(key_file), key_store],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "resealing"
    return child


def reseal_time(url: str, key_file: Path, key_store: str) -> float:
    """Seconds a child's rotation takes, from its word to its end."""
    child = start(url, key_file, key_store)
    started = time.monotonic()
    assert child.stdout is not None
    assert child.stdout.readline().startswith("done")
    child.wait()
    return time.monotonic() - started
