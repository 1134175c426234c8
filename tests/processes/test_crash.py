"""Crash tests for DESIGN promise 1, with real processes killed by SIGKILL.

Promise 1: no committed turn is ever lost, and no partial turn is ever visible; kill -9
at any point leaves the database at the last committed version, and integrity_check passes.

How: ``tests/programs/crash_child.py`` runs turns of one agent on a real SQLite file, or on a
PostgreSQL database of the tests' throwaway server (PersistenceHandler over a fake
model); each turn's tool bumps a persisted counter. The tests SIGKILL it inside a turn
just after its handoff row commits, and at random moments of a 50-turn conversation.
After each kill they read the database through connections of their own, never the
child's memory: integrity_check is ok; the versions are 1..v with no
gap and no row of a later version exists; the active history is exactly v whole turns; the
counter is v; every commit the child reported is there. Then the agent goes on from v,
its next turn is told once about the turn that was cut off, and its version records that.

Importing litellm costs a child seconds, so each child serves many turns over
stdin/stdout, and the next child starts importing while the current one runs. The
random kills stop after 5 kills; ``EFFECTFUL_DURABLE_CRASH=full`` (``make crash``)
allows 20.
"""

import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from crash_child import AGENT_ID, Counter, FakeModel, question
from crash_children import (
    SYSTEM_PROMPT,
    TURNS,
    Child,
    Children,
    Kills,
    kill_at_random,
    on_disk,
    whole_turns,
)
from helpers import integrity, is_postgres, persisted, texts

from effectful_durable import Handoff, Store
from effectful_durable.testing import FakeLLM

NOTE = "Note from the runtime: your previous turn did not complete."


# -- what must be on disk -------------------------------------------------------


def note_count(call_messages: list[dict[str, Any]]) -> int:
    """How many times the handoff note is in the request's system message."""
    [system] = [m for m in call_messages if m["role"] == "system"]
    return sum(block["text"].count(NOTE) for block in system["content"])


# -- (a) a kill inside one turn ---------------------------------------------------

COMMITTED = 3  # turns committed before the killed one


@dataclass(frozen=True)
class Crash:
    """A database as a SIGKILL inside turn ``COMMITTED + 1`` left it, and who was killed."""

    db_path: Path | str
    durability: str
    pid: int


@pytest.fixture(
    scope="class", params=["normal", "full", "postgres"], ids=["normal", "full", "postgres"]
)
def crash(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Crash:
    """Commit COMMITTED turns in a child, then kill it inside the next one.

    On SQLite with either durability, and on a PostgreSQL database.
    """
    directory = tmp_path_factory.mktemp(f"crash-{request.param}")
    if request.param == "postgres":
        db: Path | str = request.getfixturevalue("postgres_server").new_database()
        durability = "normal"
    else:
        db, durability = directory / "state.db", request.param
    child = Child(db, directory / "logs", durability=durability)
    try:
        child.load()
        assert child.open() == 0
        child.send(f"run {COMMITTED}")
        assert child.expect("done") == [str(COMMITTED)]
        child.send("block")
        assert child.expect("in-turn") == [str(COMMITTED + 1)]
        child.kill()
    finally:
        child.close()
    return Crash(db, durability, child.pid)


def copy_database(db: Path | str, directory: Path, request: pytest.FixtureRequest) -> Path | str:
    """Copy a database that no process uses any more, as a crash left it.

    An SQLite file is copied with its WAL; a PostgreSQL database is cloned on its server.
    """
    if is_postgres(db):
        return str(request.getfixturevalue("postgres_server").clone_database(str(db)))
    db_path = Path(db)
    directory.mkdir()
    for source in db_path.parent.glob(db_path.name + "*"):
        if not source.name.endswith(("-shm", "-lock")):
            shutil.copy2(source, directory / source.name)
    return directory / db_path.name


@dataclass(frozen=True)
class Recovery:
    """The crashed database after two more turns run by this process, and their requests."""

    db_path: Path | str
    llm: FakeLLM
    handoffs_after_retry: list[Handoff]


@pytest.fixture(scope="class")
def recovery(
    crash: Crash, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Recovery:
    """Continue the killed agent on a copy of its database: the retried turn, then one more."""
    db_path = copy_database(crash.db_path, tmp_path_factory.mktemp("recovery") / "copy", request)
    llm = FakeLLM(respond=FakeModel())
    bot = Counter(agent_id=AGENT_ID)
    with persisted(db_path, llm, durability=crash.durability):
        bot.ask(question(COMMITTED + 1))
        with Store(db_path, readonly=True) as store:
            handoffs_after_retry = store.handoffs()
        bot.ask(question(COMMITTED + 2))
    return Recovery(db_path, llm, handoffs_after_retry)


@pytest.mark.slow
class TestKillInsideTurn:
    """SIGKILL after a turn's handoff commit and before its commit."""

    def test_database_stays_at_last_committed_version(self, crash: Crash) -> None:
        """The file holds exactly the turns committed before the kill, intact."""
        version, _ = on_disk(crash.db_path)
        assert version == COMMITTED

    def test_handoff_names_the_cut_off_turn(self, crash: Crash) -> None:
        """The handoff row still shows the killed turn running, with its template and arguments."""
        with Store(crash.db_path, readonly=True) as store:
            [handoff] = store.handoffs()
        assert handoff.status == "running"
        assert handoff.template == "ask"
        assert handoff.arguments == {"question": question(COMMITTED + 1)}
        assert (handoff.base_version, handoff.pid, handoff.error) == (COMMITTED, crash.pid, None)

    def test_next_turn_sees_committed_history_only(self, recovery: Recovery) -> None:
        """The first request after the crash holds the committed turns and the new question."""
        first = recovery.llm.calls[0].messages
        assert first[0]["role"] == "system"
        assert first[0]["content"][0]["text"] == SYSTEM_PROMPT
        assert texts(first[1:]) == whole_turns(COMMITTED)[1:] + [
            f"user:Answer: {question(COMMITTED + 1)}"
        ]

    def test_next_turn_is_told_once(self, recovery: Recovery) -> None:
        """Each request of the retried turn carries the note once; the turn after has none."""
        calls = recovery.llm.calls
        assert len(calls) == 4  # two turns: the bump call, then the answer
        assert [note_count(call.messages) for call in calls] == [1, 1, 0, 0]
        first_system = calls[0].messages[0]["content"]
        assert question(COMMITTED + 1) in first_system[-1]["text"]
        assert "`ask`" in first_system[-1]["text"]

    def test_recovery_clears_handoff_and_is_recorded(self, recovery: Recovery) -> None:
        """After the retried turn commits, the handoff is gone and its version records it."""
        assert recovery.handoffs_after_retry == []
        version, handoff = on_disk(recovery.db_path)
        assert (version, handoff) == (COMMITTED + 2, None)
        with Store(recovery.db_path, readonly=True) as store:
            infos = store.versions(AGENT_ID)
            history = store.history(AGENT_ID)
        recovered = infos[COMMITTED].detail["recovered"]
        assert recovered["template"] == "ask"
        assert recovered["arguments"] == {"question": question(COMMITTED + 1)}
        assert recovered["status"] == "running"
        assert [i.detail for i in infos if i.version != COMMITTED + 1] == [None] * (version - 1)
        assert NOTE not in str(history)  # the note reached the model, never the history


# -- (b) random kills during a long conversation -------------------------------------

SEED = 20240601
# Each kill costs a child start (seconds); one more child then finishes.
MAX_KILLS = 20 if os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full" else 5


@pytest.mark.slow
class TestRandomKills:
    """A 50-turn conversation whose process is SIGKILLed again and again at random moments."""

    def test_every_kill_leaves_whole_committed_turns(self, store_url: str, tmp_path: Path) -> None:
        """After every kill the database holds whole committed turns, and the next run goes on."""
        db_path = store_url
        rng = random.Random(SEED)
        kills = Kills()
        recovered: set[int] = set()  # versions that must record a recovered handoff
        Store(db_path).close()  # create the schema once, before children race to open it
        version = 0
        with Children(db_path, tmp_path / "logs", budget=MAX_KILLS + 1) as children:
            while version < TURNS and len(kills.versions) < MAX_KILLS:
                child = children.next()
                assert child.open() == version  # the next run continues from the file
                reported = kill_at_random(child, rng, kills, version)
                version, handoff = on_disk(db_path)
                # No turn the child saw committed is lost; at most one was not reported yet.
                assert reported <= version <= reported + 1
                kills.versions.append(version)
                kills.unreported += version - reported
                if handoff is not None:
                    kills.inside_turn += 1
                    recovered.add(handoff.base_version + 1)
            if version < TURNS:
                child = children.next()
                assert child.open() == version
                child.send(f"run {TURNS - version}")
                assert child.expect("done") == [str(TURNS)]
            starts = children.started
        version, handoff = on_disk(db_path)
        assert (version, handoff) == (TURNS, None)
        with Store(db_path, readonly=True) as store:
            infos = store.versions(AGENT_ID)
        assert {i.version for i in infos if i.detail} == recovered
        assert all(i.detail["recovered"]["status"] == "running" for i in infos if i.detail)
        print("\n" + kills.summary(starts))


KEEP = 4


def pruned_on_disk(db_path: Path | str) -> int:
    """Check a file pruned as it goes: whole turns, K to 1.5 K exact versions; its version."""
    assert integrity(db_path) == "ok"
    with Store(db_path, readonly=True) as store:
        records = [a for a in store.agents() if a.agent_id == AGENT_ID]
        version = records[0].version if records else 0
        if not version:
            return 0
        kept = [i.version for i in store.versions(AGENT_ID)]
        assert kept == list(range(kept[0], version + 1))
        assert min(version, KEEP) <= len(kept) <= KEEP + KEEP // 2 - 1, kept
        for v in kept:
            assert texts(store.history(AGENT_ID, v)) == whole_turns(v)
            assert store.state(AGENT_ID, v) == {"count": v}
    return version


@pytest.mark.slow
class TestRandomKillsWhilePruning:
    """Kills of a conversation pruned as it goes (keep_versions=4) leave whole, exact versions."""

    def test_every_kill_leaves_whole_kept_versions(self, store_url: str, tmp_path: Path) -> None:
        """After every kill the kept versions are contiguous, exact, and at most 1.5 K."""
        db_path = store_url
        rng = random.Random(SEED + 1)
        kills = Kills()
        Store(db_path).close()
        version = 0
        budget = min(MAX_KILLS, 6)
        with Children(
            db_path, tmp_path / "logs", budget=budget + 1, keep_versions=KEEP
        ) as children:
            while version < TURNS and len(kills.versions) < budget:
                child = children.next()
                assert child.open() == version
                reported = kill_at_random(child, rng, kills, version)
                version = pruned_on_disk(db_path)
                assert reported <= version <= reported + 1
                kills.versions.append(version)
            if version < TURNS:
                child = children.next()
                assert child.open() == version
                child.send(f"run {TURNS - version}")
                assert child.expect("done") == [str(TURNS)]
        assert pruned_on_disk(db_path) == TURNS
        print("\n" + kills.summary(budget + 1))
