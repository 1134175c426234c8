"""A long sealed history loads through its snapshot, and reads back exactly as from its
rows, whatever happened since the snapshot: turns, compactions, a rollback, another
conversation. A snapshot that does not open (a flipped byte, moved to another agent)
is not used; an erasure and a key rotation take the snapshots with them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import edit_rows, persisted_rows, running
from sealed import Diary, new_keys, reply

from effectful_durable import CompactionHandler, Keys, PersistenceHandler, Store
from effectful_durable.store import snapshots
from effectful_durable.testing import FakeLLM

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def few(monkeypatch: pytest.MonkeyPatch) -> None:
    """Snapshots from a few messages on, so that short histories have them."""
    monkeypatch.setattr(snapshots, "MIN_OPENED", 3)


def ask(url: str, keys: Keys, agent_id: str, *questions: str, conversation: str = "") -> None:
    persistence = PersistenceHandler(url, keys=keys)
    compaction = CompactionHandler(max_messages=8, keep_recent=3)
    try:
        with running(FakeLLM(respond=reply), compaction, persistence):
            diary = Diary(agent_id=agent_id)
            for question in questions:
                if conversation:
                    with diary.conversation(conversation):
                        diary.ask(question)
                else:
                    diary.ask(question)
    finally:
        persistence.close()


def through_snapshot(store: Store, agent_id: str, conversation: str) -> Any:
    """The load as a turn makes it, from the snapshot (which must serve)."""
    with store.engine.reading() as conn:
        assert snapshots.taken(conn, store.sealer, agent_id, conversation) is not None
    loaded = store.turns.load(agent_id, conversation)
    return loaded.history.positions, loaded.history.messages


def from_rows(url: str, store: Store, agent_id: str, conversation: str) -> Any:
    """The load with no snapshot: every row opened."""
    edit_rows(
        url,
        "DELETE FROM history_snapshots WHERE agent_id = ? AND conversation = ?",
        agent_id,
        conversation,
    )
    loaded = store.turns.load(agent_id, conversation)
    return loaded.history.positions, loaded.history.messages


def snapshot_count(url: str, agent_id: str) -> int:
    return len(persisted_rows(url, "SELECT 1 FROM history_snapshots WHERE agent_id = ?", agent_id))


class TestSnapshots:
    def test_a_load_through_the_snapshot_reads_as_the_rows(
        self, store_url: str, tmp_path: Path
    ) -> None:
        """After each step the snapshot serves, and gives what the rows give."""
        keys = new_keys(tmp_path)
        ask(store_url, keys, "ann", "hello 1", "remember 2", "tell 3")
        with Store(store_url, keys=keys) as store:
            store.turns.load("ann")  # leaves the first snapshot
            steps: list[Any] = [
                lambda: ask(store_url, keys, "ann", "more 4", "remember 5", "again 6", "once 7"),
                lambda: store.rollback("ann", store.versions("ann")[-3].version),
                lambda: ask(store_url, keys, "ann", "after 8"),
                lambda: ask(store_url, keys, "ann", "side 9", "side 10", conversation="side"),
            ]
            for step in steps:
                step()
                for conversation in [c.conversation for c in store.conversations("ann")]:
                    store.turns.load("ann", conversation)  # a snapshot at the latest
                    ask(store_url, keys, "ann", "next", conversation=conversation)
                    got = through_snapshot(store, "ann", conversation)
                    assert got == from_rows(store_url, store, "ann", conversation)
                    assert got[1][-1]["content"] == "answer to next"

    def test_a_snapshot_that_does_not_open_is_not_used(
        self, store_url: str, tmp_path: Path
    ) -> None:
        """A flipped byte, or a snapshot moved to another agent: the load reads the rows."""
        keys = new_keys(tmp_path)
        for who in ("ann", "bob"):
            ask(store_url, keys, who, "hello", "tell", "more", "again")
        with Store(store_url, keys=keys) as store:
            expected = {who: store.turns.load(who).history.messages for who in ("ann", "bob")}
            assert snapshot_count(store_url, "ann") == snapshot_count(store_url, "bob") == 1
            edit_rows(
                store_url,
                "UPDATE history_snapshots SET messages = ? WHERE agent_id = 'ann'",
                b"ed1:x:" + bytes(40),
            )
            edit_rows(store_url, "DELETE FROM history_snapshots WHERE agent_id = 'bob'")
            edit_rows(
                store_url,
                "INSERT INTO history_snapshots (agent_id, conversation, version, messages)"
                " SELECT 'bob', conversation, version, messages FROM history_snapshots"
                " WHERE agent_id = 'ann'",
            )
            for who in ("ann", "bob"):
                with store.engine.reading() as conn:
                    assert snapshots.taken(conn, store.sealer, who, "default") is None
                assert store.turns.load(who).history.messages == expected[who]

    def test_erasure_and_rotation_take_the_snapshots(self, store_url: str, tmp_path: Path) -> None:
        """What an erasure deletes includes the snapshots; a rotation drops those sealed
        with the keys of before (the next load makes them anew)."""
        keys = new_keys(tmp_path)
        for who in ("ann", "bob"):
            ask(store_url, keys, who, "hello", "tell", "more", "again")
        with Store(store_url, keys=keys) as store:
            for who in ("ann", "bob"):
                store.turns.load(who)
            store.erase(agent="ann")
            assert snapshot_count(store_url, "ann") == 0
            assert snapshot_count(store_url, "bob") == 1
            before = store.turns.load("bob").history.messages
            store.reseal(rotate=True)
            assert snapshot_count(store_url, "bob") == 0
            assert store.turns.load("bob").history.messages == before
            assert snapshot_count(store_url, "bob") == 1

    def test_none_where_content_is_plain(self, store_url: str) -> None:
        with Store(store_url) as store:
            ask(store_url, None, "ann", "hello", "tell", "more", "again")  # type: ignore[arg-type]
            store.turns.load("ann")
        assert snapshot_count(store_url, "ann") == 0

    def test_a_read_only_store_leaves_none(
        self, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A read-only Store loads by every row and writes no snapshot, nor makes one to
        try (sealing a long history for nothing, at every load)."""
        keys = new_keys(tmp_path)
        ask(store_url, keys, "ann", "hello", "tell", "more", "again")
        edit_rows(store_url, "DELETE FROM history_snapshots")
        made: list[int] = []
        framed = snapshots._framed
        monkeypatch.setattr(snapshots, "_framed", lambda *a: made.append(1) or framed(*a))
        with Store(store_url, keys=keys, readonly=True) as store:
            loaded = store.turns.load("ann").history.messages
            assert len(loaded) == len(store.history("ann")) >= snapshots.MIN_OPENED
        assert snapshot_count(store_url, "ann") == 0 and made == []
