"""Row checksums: a row another program changed is refused narrowly, and never blessed again."""

import shutil
from pathlib import Path

import pytest
from helpers import commit_message, edit_rows, persisted_rows, writable_connection
from paths import FIXTURES

from effectful_durable import DamagedRowError, DatabaseCorruptError, Store
from effectful_durable.store.engine.sqlite.migrations import SCHEMA_VERSION
from effectful_durable.store.engine.sqlite.row_checks import PAYLOAD, damaged_rows, row_crc
from effectful_durable.store.history import HistoryChange

SCHEMA3 = FIXTURES / "schema3.db"


@pytest.fixture
def two_agents(db_path: Path) -> Path:
    """Agents a (versions 1-3) and b (versions 1-2), one message per version."""
    with Store(db_path) as store:
        for n in range(3):
            commit_message(store, "a", f"a says {n}")
        for n in range(2):
            commit_message(store, "b", f"b says {n}")
    return db_path


def hand_edit(db_path: Path, sql: str) -> None:
    """Change the file as another SQLite program would (no triggers of ours)."""
    edit_rows(db_path, sql, foreign=True)


def test_every_row_carries_its_checksum(two_agents: Path) -> None:
    """Each row of every table we wrote holds the CRC of its other values."""
    for table in PAYLOAD:
        rows = persisted_rows(two_agents, f"SELECT * FROM {table}")
        for *values, crc in rows:
            assert crc == row_crc(table, *values), table
    assert persisted_rows(two_agents, "SELECT count(*) FROM messages") == [(5,)]


def test_a_hand_edit_refuses_that_agent_only(two_agents: Path) -> None:
    """A body changed by another program: a's reads that need the row are refused, naming
    it; b, and a's versions before it, read and write as before."""
    hand_edit(
        two_agents,
        "UPDATE messages SET body = replace(body, 'says', 'said') "
        "WHERE agent_id = 'a' AND added_in = 2",
    )
    with Store(two_agents) as store:
        with pytest.raises(DamagedRowError) as caught:
            store.history("a")
        error = caught.value
        assert isinstance(error, DatabaseCorruptError)
        assert (error.table, error.agent_id, error.conversation, error.version) == (
            "messages",
            "a",
            "default",
            2,
        )
        assert "'a'" in str(error) and "checksum" in str(error) and "backup" in str(error)
        with pytest.raises(DamagedRowError):
            store.turns.load("a")
        assert [m["content"] for m in store.history("a", 1)] == ["a says 0"]
        assert [m["content"] for m in store.history("b")] == ["b says 0", "b says 1"]
        assert commit_message(store, "b", "b goes on") == 3
        [row] = store.check()["damaged_rows"]
        assert row == {
            "table": "messages",
            "agent_id": "a",
            "conversation": "default",
            "version": 2,
        }


def test_rollback_repairs_the_agent_and_never_blesses_the_row(two_agents: Path) -> None:
    """Rolling a back to before the damaged row makes it whole again; the row itself, which
    the rollback marked removed, still fails (the update carried its discrepancy over)."""
    hand_edit(
        two_agents,
        "UPDATE messages SET body = replace(body, 'says', 'said') "
        "WHERE agent_id = 'a' AND added_in = 2",
    )
    with Store(two_agents) as store:
        assert store.rollback("a", 1) == 4
        assert [m["content"] for m in store.history("a")] == ["a says 0"]
        assert commit_message(store, "a", "a goes on") == 5
        assert [m["content"] for m in store.history("a")] == ["a says 0", "a goes on"]
        with pytest.raises(DamagedRowError):
            store.history("a", 2)  # that version held the changed row: still refused
        assert [(r["table"], r["version"]) for r in store.check()["damaged_rows"]] == [
            ("messages", 2)
        ]


def test_a_damaged_row_is_never_copied(two_agents: Path) -> None:
    """Fork and rollback copy rows through the check: a damaged one is refused, nothing written."""
    hand_edit(
        two_agents,
        "UPDATE messages SET body = replace(body, 'says', 'said') "
        "WHERE agent_id = 'a' AND added_in = 2",
    )
    before = persisted_rows(two_agents, "SELECT count(*), sum(crc) FROM messages")
    with Store(two_agents) as store:
        with pytest.raises(DamagedRowError):
            store.fork("a", 3, "a-copy")
        assert "a-copy" not in [agent.agent_id for agent in store.agents()]
    assert persisted_rows(two_agents, "SELECT count(*), sum(crc) FROM messages") == before


def test_a_row_another_program_inserted_is_refused(two_agents: Path) -> None:
    """A row with no checksum was not written by effectful-durable: refused when read."""
    hand_edit(
        two_agents,
        "INSERT INTO messages (agent_id, conversation, position, added_in, "
        "message_id, role, body) VALUES ('b', 'default', 9, 2, 'x', 'user', '{}')",
    )
    with Store(two_agents) as store:
        with pytest.raises(DamagedRowError, match="agent 'b'"):
            store.history("b")
        assert len(store.history("a")) == 3


def test_another_programs_delete_is_theirs_to_make(two_agents: Path) -> None:
    """A row deleted by hand is gone: the agent loads what is there."""
    hand_edit(two_agents, "DELETE FROM messages WHERE agent_id = 'a' AND added_in = 3")
    with Store(two_agents) as store:
        assert [m["content"] for m in store.history("a")] == ["a says 0", "a says 1"]
        assert store.check()["damaged_rows"] == []


def test_our_own_edits_keep_checksums(two_agents: Path) -> None:
    """A connection of ours (triggers installed) keeps every checksum through inserts,
    updates and upserts: nothing to report."""
    conn = writable_connection(two_agents)
    try:
        conn.execute("UPDATE agents SET updated_at = updated_at + 1")
        conn.execute("UPDATE messages SET role = 'user' WHERE agent_id = 'b'")
        assert damaged_rows(conn) == []
    finally:
        conn.close()


def test_schema3_file_is_migrated_in_place(tmp_path: Path) -> None:
    """A file made by the last page-checksum release (schema 3) opens as schema 4, every
    row checksummed, every agent readable as that release wrote it, and goes on."""
    path = tmp_path / "state.db"
    shutil.copy(SCHEMA3, path)
    with Store(path) as store:
        facts = store.check()
        assert (facts["integrity"], facts["damaged_rows"], facts["schema"]) == (
            "ok",
            [],
            SCHEMA_VERSION,
        )
        assert {a.agent_id: a.version for a in store.agents()} == {
            "w1": 15,
            "w1-copy": 1,
            "w2": 4,
            "w3": 2,
        }
        assert store.memory("w1") == {
            "k10": "put apples",
            "k13": "put side note",
            "k8": "put figs",
        }
        assert [row[1] for row in store.sql("w1", "SELECT * FROM items ORDER BY id").rows] == [
            "apples",
            "plums",
            "kiwis",
            "limes",
        ]
        assert len(store.alarms(include_ended=True)) == 2
        assert [s.status for s in store.steps("nightly")] == ["done", "done"]
        assert len(store.history("w1", include_compacted=True)) > len(store.history("w1"))
        assert commit_message(store, "w1", "after the migration") == 16
    assert persisted_rows(path, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    # Schema 6: each agent's row names its newest version that holds a state.
    assert persisted_rows(path, "SELECT agent_id, state_in FROM agents ORDER BY agent_id") == (
        persisted_rows(
            path,
            "SELECT agent_id, max(version) FILTER (WHERE state IS NOT NULL) FROM versions"
            " GROUP BY agent_id ORDER BY agent_id",
        )
    )


def test_check_lists_a_row_whose_text_no_longer_decodes(two_agents: Path) -> None:
    """Text that is not UTF-8 any more is one damaged row in the listing, not an error."""
    hand_edit(two_agents, "UPDATE messages SET body = CAST(x'ff' AS TEXT) WHERE added_in = 3")
    with Store(two_agents) as store:
        assert store.check()["damaged_rows"] == [
            {"table": "messages", "agent_id": "a", "conversation": "default", "version": 3}
        ]
        assert len(store.history("b")) == 2


def test_the_load_checks_rows_as_the_view_does(two_agents: Path) -> None:
    """Loading a conversation checks each active row in Python, with the same checksum:
    a changed row is refused there too, naming it."""
    with Store(two_agents) as store:
        assert len(store.turns.load("a").history.messages) == 3
    hand_edit(
        two_agents, "UPDATE messages SET role = 'system' WHERE agent_id = 'a' AND added_in = 1"
    )
    with Store(two_agents) as store:
        with pytest.raises(DamagedRowError) as caught:
            store.turns.load("a")
        assert (caught.value.agent_id, caught.value.version) == ("a", 1)
        assert len(store.turns.load("b").history.messages) == 2


def test_a_changed_version_mark_refuses_rather_than_hides(two_agents: Path) -> None:
    """A row whose removed_in another program changed would drop out of an earlier
    version's history: reads and copies of earlier versions refuse it instead."""
    with Store(two_agents) as store:
        assert store.rollback("a", 1) == 4  # ends the rows of versions 2 and 3 at 4
    hand_edit(
        two_agents, "UPDATE messages SET removed_in = 3 WHERE agent_id = 'a' AND added_in = 2"
    )
    with Store(two_agents) as store:
        assert [m["content"] for m in store.history("a")] == ["a says 0"]  # the latest reads
        with pytest.raises(DamagedRowError, match="version 2"):
            store.history("a", 3)
        with pytest.raises(DamagedRowError):
            store.rollback("a", 3)
        with pytest.raises(DamagedRowError):
            store.fork("a", 3, "a-copy")
        assert store.rollback("a", 1) == 5  # before the row: the repair still works


def commit_state(store: Store, agent_id: str, state: str | None) -> int:
    """Commit an empty turn of ``agent_id`` that stores ``state`` (None: unchanged)."""
    with store.turns.start(agent_id, template="t", arguments={}) as start:
        return store.turns.commit(
            agent_id,
            base_version=start.version,
            template="t",
            change=HistoryChange([], [], 0),
            state=state,
        )


class TestLatestState:
    """Loading reads the state from the version the agent's row names, both rows checked."""

    @pytest.fixture
    def stateful(self, db_path: Path) -> Path:
        """Agent a: state s1 at version 1, s3 at 3, unchanged at 2, 4 and 5."""
        with Store(db_path) as store:
            for state in ('{"n":1}', None, '{"n":3}', None, None):
                commit_state(store, "a", state)
        return db_path

    def test_the_agent_row_names_the_latest_state(self, stateful: Path) -> None:
        """state_in is the newest version holding a state; a load reads it, in a Store
        that wrote it and in a new one, and a rollback moves it."""
        assert persisted_rows(stateful, "SELECT version, state_in FROM agents") == [(5, 3)]
        with Store(stateful) as store:
            assert store.turns.load("a").state == '{"n":3}'
            assert store.rollback("a", 1) == 6
            assert store.turns.load("a").state == '{"n":1}'
            assert commit_state(store, "a", None) == 7
        assert persisted_rows(stateful, "SELECT version, state_in FROM agents") == [(7, 6)]
        with Store(stateful) as store:
            assert store.turns.load("a").state == '{"n":1}'
            assert store.check()["damaged_rows"] == []

    def test_a_state_emptied_by_another_program_is_refused(self, stateful: Path) -> None:
        """The latest state row set to NULL by hand: the load refuses it, never reading
        the older state in its place."""
        hand_edit(stateful, "UPDATE versions SET state = NULL WHERE version = 3")
        with Store(stateful) as store, pytest.raises(DamagedRowError) as caught:
            store.turns.load("a")
        assert (caught.value.table, caught.value.version) == ("versions", 3)

    def test_a_pointer_changed_by_another_program_is_refused(self, stateful: Path) -> None:
        """state_in changed by hand (to the older state): the agent's row is refused."""
        hand_edit(stateful, "UPDATE agents SET state_in = 1")
        with Store(stateful) as store, pytest.raises(DamagedRowError, match="agents"):
            store.turns.load("a")

    def test_an_agent_without_a_pointer_is_read_by_its_versions(self, stateful: Path) -> None:
        """A row naming no version (copied from PostgreSQL, say) loads as before: the
        walk back through the versions finds the state."""
        edit_rows(stateful, "UPDATE agents SET state_in = NULL")
        with Store(stateful) as store:
            assert store.turns.load("a").state == '{"n":3}'


class TestTheStoresHint:
    """A Store's hint of its agents' rows is checked by the statements that use it."""

    def test_a_version_changed_by_another_program_is_refused(self, two_agents: Path) -> None:
        """The agent's version changed by hand under a Store that holds a hint: its next
        turn is refused at its start, and writes nothing."""
        with Store(two_agents) as store:
            assert store.turns.load("a").version == 3  # the hint: version 3
            hand_edit(two_agents, "UPDATE agents SET version = 9 WHERE agent_id = 'a'")
            with pytest.raises(DamagedRowError, match="agents"):
                commit_message(store, "a", "refused")
        assert persisted_rows(two_agents, "SELECT count(*) FROM handoffs") == [(0,)]

    def test_a_row_changed_under_a_hint_is_refused(self, two_agents: Path) -> None:
        """Another program changed only the row's update time, under a Store holding a
        hint of the row: the next turn is refused at its start, as a Store without the
        hint refuses it, and the row stays as that program left it."""
        with Store(two_agents) as store:
            assert store.turns.load("a").version == 3
            hand_edit(two_agents, "UPDATE agents SET updated_at = 1.5 WHERE agent_id = 'a'")
            with pytest.raises(DamagedRowError, match="agents"):
                commit_message(store, "a", "refused")
            assert [r["table"] for r in store.check()["damaged_rows"]] == ["agents"]
            assert commit_message(store, "b", "b goes on") == 3
        query = "SELECT version, updated_at FROM agents WHERE agent_id = 'a'"
        assert persisted_rows(two_agents, query) == [(3, 1.5)]


def test_the_load_checks_positions_sqlite_writes_otherwise(db_path: Path) -> None:
    """Positions whose text SQLite writes otherwise than Python (more digits, another
    exponent) load, their rows checked the exact way; a changed one is refused."""
    odd = [0.1 + 0.2, 1 / 3, 1e16]
    with Store(db_path) as store:
        with store.turns.start("a", template="t", arguments={}) as start:
            added = [
                (p, {"id": f"m{i}", "role": "user", "content": str(p)}) for i, p in enumerate(odd)
            ]
            store.turns.commit(
                "a",
                base_version=start.version,
                template="t",
                change=HistoryChange(added, [], 0),
                state=None,
            )
        loaded = store.turns.load("a").history
        assert loaded.positions == odd
        assert [m["content"] for m in loaded.messages] == [str(p) for p in odd]
    hand_edit(db_path, "UPDATE messages SET role = 'system' WHERE position = 1e16")
    with Store(db_path) as store, pytest.raises(DamagedRowError) as caught:
        store.turns.load("a")
    assert (caught.value.table, caught.value.version) == ("messages", 1)
