"""Memory rows: versioned writes, reads of any version, rollback, fork, prune and delete."""

import json
from typing import Any

import pytest
from helpers import integrity, persisted_rows

from effectful_durable import NotFoundError, Store
from effectful_durable.store.history import HistoryChange
from effectful_durable.store.parts.memory import KEY, NOTE, MemoryChanges, MemoryPart

NO_MESSAGES = HistoryChange(added=[], removed=[], removed_count=0)


def commit(store: Store, agent_id: str, **values: Any) -> int:
    """Commit one turn that puts each value (None deletes the key); return its version."""
    base = next((a.version for a in store.agents() if a.agent_id == agent_id), 0)
    changes = MemoryChanges()
    for key, value in values.items():
        changes.changes[KEY, key] = None if value is None else json.dumps(value)
    with store.turns.start(agent_id, template="t", arguments={}):
        return store.turns.commit(
            agent_id,
            base_version=base,
            template="t",
            change=NO_MESSAGES,
            state=None,
            writes=[changes],
        )


def rows(store_url: str, agent_id: str = "a") -> list[tuple[Any, ...]]:
    return persisted_rows(
        store_url,
        "SELECT key, added_in, removed_in, value FROM memory WHERE agent_id = ?"
        " ORDER BY key, added_in",
        agent_id,
    )


@pytest.fixture
def store(store_url: str) -> Store:
    with Store(store_url) as store:
        yield store


class TestWrites:
    """A turn's memory writes: rows per key, versioned, O(what they write)."""

    def test_every_version_reads_back(self, store: Store) -> None:
        """memory(agent, v) returns what version v held, for every v."""
        commit(store, "a", x=1, y=[1, 2])
        commit(store, "a", x={"deep": True}, z="text")
        commit(store, "a", y=None)
        assert store.memory("a", 1) == {"x": 1, "y": [1, 2]}
        assert store.memory("a", 2) == {"x": {"deep": True}, "y": [1, 2], "z": "text"}
        assert store.memory("a", 3) == store.memory("a") == {"x": {"deep": True}, "z": "text"}

    def test_write_touches_only_its_keys(self, store: Store, store_url: str) -> None:
        """Putting one key of many adds one row and closes one; the others are untouched."""
        commit(store, "a", **{f"k{i}": i for i in range(50)})
        before = rows(store_url)
        commit(store, "a", k7="new")
        after = rows(store_url)
        assert len(after) == len(before) + 1
        changed = set(after) - set(before)
        assert changed == {("k7", 1, 2, "7"), ("k7", 2, None, '"new"')}

    def test_unchanged_value_writes_nothing(self, store: Store, store_url: str) -> None:
        """Putting the value a key already holds adds no row."""
        commit(store, "a", x=1)
        commit(store, "a", x=1)
        assert rows(store_url) == [("x", 1, None, "1")]

    def test_deleting_a_missing_key_writes_nothing(self, store: Store, store_url: str) -> None:
        """A staged deletion of a key the memory does not hold leaves no row."""
        commit(store, "a", x=1)
        commit(store, "a", nope=None)
        assert rows(store_url) == [("x", 1, None, "1")]

    def test_failed_commit_writes_no_memory(self, store: Store, store_url: str) -> None:
        """A commit that raises after the memory write leaves no memory row behind."""
        commit(store, "a", x=1)

        class Boom:
            def write(self, conn: Any, agent_id: str, version: int, sealer: Any) -> None:
                raise RuntimeError("boom")

        changes = MemoryChanges()
        changes.changes[KEY, "x"] = "2"
        with pytest.raises(RuntimeError):
            store.turns.commit(
                "a",
                base_version=1,
                template="t",
                change=NO_MESSAGES,
                state=None,
                writes=[changes, Boom()],
            )
        assert rows(store_url) == [("x", 1, None, "1")]
        assert store.memory("a") == {"x": 1}

    def test_unknown_agent_or_version(self, store: Store) -> None:
        """Reading the memory of an unknown agent or version raises NotFoundError."""
        commit(store, "a", x=1)
        with pytest.raises(NotFoundError, match="no agent 'b'"):
            store.memory("b")
        with pytest.raises(NotFoundError, match="versions 1 to 1"):
            store.memory("a", 2)
        with pytest.raises(NotFoundError):
            store.memory_notes("a", 0)

    def test_notes_are_separate_from_keys(self, store: Store) -> None:
        """Notes and keys live side by side without mixing."""
        changes = MemoryChanges()
        changes.changes[NOTE, "00000000000000000001"] = json.dumps({"at": 1.5, "text": "hi"})
        changes.changes[KEY, "00000000000000000001"] = "3"
        with store.turns.start("a", template="t", arguments={}):
            store.turns.commit(
                "a", base_version=0, template="t", change=NO_MESSAGES, state=None, writes=[changes]
            )
        assert store.memory("a") == {"00000000000000000001": 3}
        [note] = store.memory_notes("a")
        assert (note.text, note.at.timestamp()) == ("hi", 1.5)


class TestVersionedPart:
    """Rollback, fork, prune and delete carry memory exactly."""

    def test_rollback_restores_memory(self, store: Store) -> None:
        """rollback(a, 1) commits a version whose memory equals version 1's."""
        commit(store, "a", x=1, y=2)
        commit(store, "a", x=10, y=None, z=3)
        new = store.rollback("a", 1)
        assert store.memory("a", new) == {"x": 1, "y": 2}
        assert store.memory("a", 2) == {"x": 10, "z": 3}  # the versions between stay
        commit(store, "a", y=20)
        assert store.memory("a") == {"x": 1, "y": 20}
        again = store.rollback("a", 2)
        assert store.memory("a", again) == {"x": 10, "z": 3}

    def test_fork_copies_memory_of_a_version(self, store: Store, store_url: str) -> None:
        """fork() gives the new agent the memory of the version it copies, at version 1."""
        commit(store, "a", x=1)
        commit(store, "a", x=2, y=3)
        store.fork("a", 1, "b")
        assert store.memory("b") == {"x": 1}
        assert rows(store_url, "b") == [("x", 1, None, "1")]
        commit(store, "b", x=5)
        assert store.memory("a") == {"x": 2, "y": 3}  # the original is untouched

    def test_prune_keeps_later_versions_exact(self, store: Store, store_url: str) -> None:
        """prune(keep_from) drops rows only earlier versions held; later ones stay exact."""
        commit(store, "a", x=1, y=1)  # v1
        commit(store, "a", x=2)  # v2
        commit(store, "a", y=None, z=3)  # v3
        commit(store, "a", x=4)  # v4
        expected = {v: store.memory("a", v) for v in range(3, 5)}
        with store.engine.writing() as conn:
            MemoryPart().prune(conn, "a", 3)
        assert ("x", 1, 2, "1") not in rows(store_url)
        assert ("y", 1, 3, "1") not in rows(store_url)
        assert {v: store.memory("a", v) for v in range(3, 5)} == expected
        new = store.rollback("a", 3)
        assert store.memory("a", new) == expected[3]

    def test_delete_removes_all_memory(self, store: Store, store_url: str) -> None:
        """delete() leaves no memory row of the agent, and others keep theirs."""
        commit(store, "a", x=1)
        commit(store, "a", x=2)
        commit(store, "b", x=3)
        store.delete("a")
        assert rows(store_url, "a") == []
        assert store.memory("b") == {"x": 3}
        assert integrity(store_url) == "ok"

    def test_check_counts_memory_rows(self, store: Store) -> None:
        """check() reports the number of memory rows."""
        commit(store, "a", x=1, y=2)
        assert store.check()["memory"] == 2
