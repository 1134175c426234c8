"""An erasure killed (SIGKILL) at a random moment is done or not begun, for every row.

Each round, a child (``tests/erase_child.py``) erases one subject's 20 agents (3 turns
each, beside other subjects' agents) and is killed a random while after it said it
began. Afterwards the subject's agents are all there, with no receipt, or all gone,
with one; the other subjects' agents are untouched, the file passes its integrity
check (SQLite), and an erasure that finds its scrub cut off does it first.
``EFFECTFUL_DURABLE_CRASH=full`` (``make crash``) kills 30 times, else 6.
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

from effectful_durable import Store
from tests.helpers import commit_message

pytestmark = pytest.mark.slow

CHILD = Path(__file__).with_name("erase_child.py")
ROUNDS = 30 if os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full" else 6
AGENTS = 20


def populate(store: Store, subject: str) -> list[str]:
    ids = [f"{subject}-{n}" for n in range(AGENTS)]
    for agent in ids:
        store.set_subject(agent, subject)
        for turn in range(3):
            commit_message(store, agent, f"{subject} turn {turn}")
    return ids


def test_an_erasure_killed_is_done_or_not_begun(store_url: str) -> None:
    """Killed at random moments, an erasure leaves each subject's agents all there or
    all gone (with its receipt), never some of them, and the others untouched."""
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    with Store(store_url) as store:
        kept = populate(store, "kept")
        subjects = {f"s{n}": populate(store, f"s{n}") for n in range(ROUNDS)}
        kept_history = {agent: store.history(agent) for agent in kept}
    outcomes = {"done": 0, "not begun": 0}
    timing = populate_one(store_url)
    took = erase_time(store_url, timing)  # kills land from before its start to past its end
    for subject, agents in subjects.items():
        child = start(store_url, subject)
        time.sleep(rng.uniform(0, 1) ** 2 * 1.2 * took)  # more kills early, where it writes
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        with Store(store_url) as store:
            present = {a.agent_id for a in store.agents()} & set(agents)
            receipts = [r for r in store.erasures() if r.agents == tuple(sorted(agents))]
            assert present in (set(), set(agents)), (seed, subject, len(present))
            assert len(receipts) == (1 if not present else 0), (seed, subject)
            outcomes["done" if not present else "not begun"] += 1
            if store_url.endswith(".db"):
                assert store.check()["integrity"] == "ok"
    with Store(store_url) as store:
        last = store.erase(agent="kept-0")  # scrubs whatever a kill left pending first
        assert last.scrubbed_at is not None
        assert all(r.scrubbed_at is not None for r in store.erasures())
        assert all(r.verified for r in store.erasures())
        assert {agent: store.history(agent) for agent in kept[1:]} == {
            agent: kept_history[agent] for agent in kept[1:]
        }
    print(f"\nerase kills (seed {seed}, an erasure takes {took:.3f} s): {outcomes}")


def start(url: str, subject: str) -> subprocess.Popen[str]:
    """A child erasing ``subject``, once it said it begins."""
    child = subprocess.Popen(
        [sys.executable, str(CHILD), url, subject],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(CHILD.parent)},
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "erasing"
    return child


def populate_one(url: str) -> str:
    """A subject like the others', to time an erasure with; its name."""
    with Store(url) as store:
        populate(store, "timing")
    return "timing"


def erase_time(url: str, subject: str) -> float:
    """Seconds a child's erasure of ``subject`` takes, from its word to its end."""
    child = start(url, subject)
    started = time.monotonic()
    assert child.stdout is not None
    assert child.stdout.readline().startswith("done")
    child.wait()
    return time.monotonic() - started
