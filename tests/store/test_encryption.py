"""Encryption at rest (issue 52, item 3): what a turn writes is sealed, and only opens where
it was written, with its keys.

With ``keys=``, a person's marker goes into messages, a compacted original, the
agent's fields, a handoff (a failed turn's arguments and error) and a fork; no byte
of any file the library wrote (the SQLite file, its WAL and shared memory, the key
store; on PostgreSQL the table files after a checkpoint, and a ``pg_dump``) ever
holds it, checked between turns and from inside a running turn, while everything
reads back exactly. A row moved to another agent or place, a flipped byte, a wrong
key and a missing key are each refused clearly, and the refusals write nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import keeper
import pytest
from helpers import edit_rows, is_postgres, persisted_rows, running
from postgres_server import PostgresServer
from sealed import (
    MARK,
    SCAN_DURING_TURN,
    Diary,
    file_bytes,
    fill,
    fingerprint,
    load_diary,
    marks,
    new_keys,
    reads,
    reply,
)

from effectful_durable import (
    DamagedRowError,
    Keys,
    KeyUnavailableError,
    LocalMasterKey,
    PersistenceHandler,
    Store,
)
from effectful_durable.store.browse import HistoryFilter
from effectful_durable.store.copy import copy_store
from effectful_durable.testing import FakeLLM


class TestSealed:
    def test_no_marker_in_any_file_at_any_time(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """The marker never reaches a file: between turns, within a turn, after a failed
        turn, a compaction, a fork and a rollback; and all of it reads back as written."""
        keys = new_keys(tmp_path)
        seen: list[int] = []
        SCAN_DURING_TURN.append(
            lambda: seen.append(marks(file_bytes(store_url, tmp_path, store_server)))
        )
        try:
            fill(store_url, keys)
        finally:
            SCAN_DURING_TURN.clear()
        assert len(seen) == 2 and seen == [0, 0]
        with Store(store_url, keys=keys) as store:
            got = reads(store, "ann")
            assert any(MARK in str(m.get("content")) for m in got["compacted"])
            assert got["state"]["notes"] == [MARK, MARK]
            assert len(got["compacted"]) > len(got["history"])
            (handoff,) = got["handoffs"]
            assert handoff[0] == "side" and MARK in str(handoff[1]) and MARK in handoff[2]
            assert store.search_compacted("ann", MARK.lower())
            store.fork("ann", None, "ann-copy")
            copy = reads(store, "ann-copy")
            assert copy["history"] == got["history"] and copy["state"] == got["state"]
            store.rollback("ann", 2)
            assert store.state("ann") == store.state("ann", 2)
            assert store.history("ann") == store.history("ann", 2)
        assert marks(file_bytes(store_url, tmp_path, store_server)) == 0
        raw = persisted_rows(store_url, "SELECT body FROM messages")
        assert raw and all(str(body).startswith("ed1:") for (body,) in raw)

    def test_every_kind_of_content_is_sealed(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """Memory, the SQL workspace (its log and its file), per-conversation fields,
        an approval's arguments, an event's payload, an alarm's action and the workflow
        journal are sealed like messages, in the agent and in its fork, and read back
        as a plain database's do; no file holds the marker, from inside a turn or after."""
        keys = new_keys(tmp_path)
        mark = keeper.MARKERS["ann"]
        seen: list[int] = []
        keeper.DURING_TURN.append(
            lambda: seen.append(marks(file_bytes(store_url, tmp_path, store_server), mark))
        )
        try:
            keeper.fill(store_url, "ann", keys)
        finally:
            keeper.DURING_TURN.clear()
        assert seen == [0]  # memory, the SQL table and an alarm written before it
        with Store(store_url, keys=keys) as store:
            for agent in ("ann", "ann-copy"):
                got = keeper.what_reads_back(store, agent)
                for kind in ("history", "state", "memory", "sql", "alarms"):
                    assert mark in str(got[kind]), (agent, kind, got[kind])
            got = keeper.what_reads_back(store, "ann")
            for kind in ("events", "approvals", "steps"):
                assert mark in str(got[kind]), (kind, got[kind])
            assert mark in str(store.history("shared", conversation="with-ann"))
        assert marks(file_bytes(store_url, tmp_path, store_server), mark) == 0

    def test_every_read_opens_what_it_shows(self, store_url: str, tmp_path: Path) -> None:
        """The page's and the commands' reads (timeline, filtered timeline, compacted
        originals, diff) show the content, opened, as a plain database's do."""
        keys = new_keys(tmp_path)
        fill(store_url, keys)
        with Store(store_url, keys=keys) as store:
            latest = store.versions("ann")[-1].version
            shown = [m for b in store.timeline("ann").blocks for m in b.messages]
            assert any(MARK in str(m.get("content")) for m in shown)
            wanted = HistoryFilter(text=MARK.lower())
            found = [m for b in store.timeline("ann", filter=wanted).blocks for m in b.messages]
            assert found and all(MARK in str(m) for m in found)
            compaction = next(v for v in store.versions("ann") if v.kind == "compaction")
            originals = store.compacted("ann", compaction.version)
            assert originals and all(isinstance(m, dict) for m in originals)
            change = store.diff("ann", 1, latest)
            assert change.fields and any(c.added for c in change.conversations)
            assert MARK in str(change.fields) and MARK in str(change.conversations)

    def test_a_plain_database_opens_unchanged_and_starts_sealing(
        self, store_url: str, tmp_path: Path
    ) -> None:
        """A database written without keys opens without them as before; opened with keys,
        its plain rows still read and new rows are sealed; then it needs the keys."""
        persistence = PersistenceHandler(store_url)
        try:
            with running(FakeLLM(respond=reply), persistence):
                Diary(agent_id="old").ask("remember plain")
        finally:
            persistence.close()
        with Store(store_url) as store:
            before = reads(store, "old")
        keys = new_keys(tmp_path)
        fill(store_url, keys, "new", "NewSecret99")
        with Store(store_url, keys=keys) as store:
            assert reads(store, "old") == before
            assert store.state("new")["notes"] == ["NewSecret99", "NewSecret99"]
        with pytest.raises(KeyUnavailableError, match="encrypted"):
            Store(store_url)


class TestMaintenance:
    def test_prune_and_copy(self, store_url: str, tmp_path: Path) -> None:
        """Pruning and copying the database (to an SQLite file) keep the sealed content
        readable with the same keys, and sealed; the copy needs them."""
        keys = new_keys(tmp_path)
        fill(store_url, keys)
        with Store(store_url, keys=keys) as store:
            state, history = store.state("ann"), store.history("ann")
            store.prune("ann", keep_versions=2)
            assert store.state("ann") == state and store.history("ann") == history
            with Store(tmp_path / "copy.db") as target:
                copy_store(store, target)
        with Store(tmp_path / "copy.db", keys=keys) as copy:
            assert copy.state("ann") == state and copy.history("ann") == history
        raw = persisted_rows(tmp_path / "copy.db", "SELECT body FROM messages")
        assert raw and all(str(body).startswith("ed1:") for (body,) in raw)
        with pytest.raises(KeyUnavailableError):
            Store(tmp_path / "copy.db")


class TestRefused:
    def test_a_row_moved_to_another_agent(self, store_url: str, tmp_path: Path) -> None:
        """A message moved to another agent, with its checksum made right, is damage there."""
        keys = new_keys(tmp_path)
        fill(store_url, keys, "ann")
        fill(store_url, keys, "bob", "BobKept0815")
        edit_rows(
            store_url,
            "UPDATE messages SET body = (SELECT body FROM messages WHERE agent_id = 'ann'"
            " AND removed_in IS NULL ORDER BY position DESC LIMIT 1)"
            " WHERE agent_id = 'bob' AND removed_in IS NULL"
            " AND position = (SELECT max(position) FROM messages WHERE agent_id = 'bob')",
        )
        with Store(store_url, keys=keys) as store:
            with pytest.raises(DamagedRowError, match="does not authenticate"):
                store.history("bob")
            with pytest.raises(DamagedRowError):
                load_diary(store_url, keys, "bob")
            assert store.history("ann")  # the rest reads

    def test_a_value_of_every_kind_moved_to_another_agent(
        self, store_url: str, tmp_path: Path
    ) -> None:
        """ann's memory value, SQL workspace change, alarm action, approval arguments and
        journal step's arguments, each put in bob's row of the same kind (checksums made right),
        are damage there; ann's own still read."""
        keys = new_keys(tmp_path)
        for who in ("ann", "bob"):
            keeper.fill(store_url, who, keys)
        moves = {
            "memory": ("value", "kind = 'key' AND removed_in IS NULL"),
            "workspace_log": ("changeset", "changeset IS NOT NULL"),
            "alarms": ("action", "kind = 'alarm'"),
            "approvals": ("arguments", "1 = 1"),
            "workflow_steps": ("arguments", "1 = 1"),
        }
        for table, (column, which) in moves.items():
            edit_rows(
                store_url,
                f"UPDATE {table} SET {column} = (SELECT {column} FROM {table}"
                f" WHERE agent_id = 'ann' AND {which} LIMIT 1)"
                f" WHERE agent_id = 'bob' AND {which}",
            )
        reads: dict[str, Any] = {
            "memory": lambda s: s.memory("bob"),
            "workspace_log": lambda s: s.sql("bob", "SELECT name FROM items"),
            "alarms": lambda s: s.alarms("bob"),
            "approvals": lambda s: s.approvals(agent_id="bob"),
            "workflow_steps": lambda s: s.steps("wf-bob"),
        }
        with Store(store_url, keys=keys) as store:
            for table, read in reads.items():
                with pytest.raises(DamagedRowError, match="does not authenticate") as found:
                    read(store)
                assert found.value.table == table
            mark = keeper.MARKERS["ann"]
            assert mark in str(store.memory("ann")) and mark in str(store.steps("wf-ann"))
            assert mark in str(store.sql("ann", "SELECT name FROM items").rows)

    def test_a_row_moved_within_its_agent_and_a_state_moved(
        self, store_url: str, tmp_path: Path
    ) -> None:
        """A message moved to another place of its conversation, or another agent's state,
        is refused as damage."""
        keys = new_keys(tmp_path)
        fill(store_url, keys, "ann")
        fill(store_url, keys, "bob", "BobKept0815")
        edit_rows(
            store_url,
            "UPDATE messages SET body = (SELECT body FROM messages AS m WHERE m.agent_id = 'ann'"
            " AND m.removed_in IS NULL ORDER BY m.position LIMIT 1)"
            " WHERE agent_id = 'ann' AND removed_in IS NULL"
            " AND position = (SELECT max(position) FROM messages WHERE agent_id = 'ann')",
        )
        edit_rows(
            store_url,
            "UPDATE versions SET state = (SELECT state FROM versions WHERE agent_id = 'ann'"
            " AND state IS NOT NULL ORDER BY version DESC LIMIT 1)"
            " WHERE agent_id = 'bob' AND state IS NOT NULL",
        )
        with Store(store_url, keys=keys) as store:
            with pytest.raises(DamagedRowError, match="messages.*does not authenticate"):
                store.history("ann")
            with pytest.raises(DamagedRowError, match="versions.*does not authenticate"):
                store.state("bob")

    def test_a_flipped_byte(self, store_url: str, tmp_path: Path) -> None:
        """One character of a sealed body changed (checksum made right): damage."""
        keys = new_keys(tmp_path)
        fill(store_url, keys)
        (body,) = persisted_rows(
            store_url,
            "SELECT body FROM messages WHERE agent_id = 'ann' AND removed_in IS NULL"
            " ORDER BY position LIMIT 1",
        )[0]
        flipped = body[:-6] + ("A" if body[-6] != "A" else "B") + body[-5:]
        edit_rows(store_url, "UPDATE messages SET body = ? WHERE body = ?", flipped, body)
        with Store(store_url, keys=keys) as store:
            with pytest.raises(DamagedRowError, match="does not authenticate"):
                store.history("ann")

    def test_a_plain_value_where_a_sealed_one_belongs(
        self, store_url: str, tmp_path: Path
    ) -> None:
        """In a database encrypted from its start, a plain body put in by hand is damage."""
        keys = new_keys(tmp_path)
        fill(store_url, keys)
        edit_rows(
            store_url,
            "UPDATE messages SET body = ? WHERE agent_id = 'ann' AND removed_in IS NULL"
            " AND position = (SELECT max(position) FROM messages WHERE agent_id = 'ann')",
            '{"role": "assistant", "content": "forged"}',
        )
        with Store(store_url, keys=keys) as store:
            with pytest.raises(DamagedRowError, match="is not sealed"):
                store.history("ann")

    def test_wrong_and_missing_keys_write_nothing(
        self, store_url: str, tmp_path: Path, store_server: PostgresServer | None
    ) -> None:
        """No keys, another master key, or a key store that is not there: a one-line
        error naming the database, and not a byte written."""
        keys = new_keys(tmp_path)
        fill(store_url, keys)
        before = fingerprint(store_url, tmp_path, store_server)
        wrong = LocalMasterKey(os.urandom(32))
        attempts: list[Any] = [
            lambda: Store(store_url),
            lambda: Store(store_url, keys=Keys(wrong, store=keys.store)),
            lambda: Store(store_url, keys=Keys(keys.master, store=str(tmp_path / "elsewhere"))),
            lambda: PersistenceHandler(store_url, keys=Keys(wrong, store=keys.store)),
            lambda: Store(store_url, keys=Keys(wrong, store=keys.store), readonly=True),
        ]
        for attempt in attempts:
            with pytest.raises(KeyUnavailableError) as info:
                attempt()
            message = str(info.value)
            assert "\n" not in message and "nothing" in message, message
        for variable in ("EFFECTFUL_DURABLE_KEY",):
            os.environ.pop(variable, None)
            with pytest.raises(KeyUnavailableError, match="EFFECTFUL_DURABLE_KEY"):
                Keys.from_env()
        with pytest.raises(KeyUnavailableError, match="cannot be read"):
            Keys.from_file(tmp_path / "no.key")
        (tmp_path / "bad.key").write_text("not base64!")
        with pytest.raises(KeyUnavailableError, match="base64"):
            Keys.from_file(tmp_path / "bad.key")
        assert fingerprint(store_url, tmp_path, store_server) == before
        with Store(store_url, keys=keys) as store:
            assert store.state("ann")["notes"] == [MARK, MARK]


def test_is_postgres_helper() -> None:
    """The fixture names PostgreSQL databases by URL (sanity for the matrix above)."""
    assert is_postgres("postgresql://x/y") and not is_postgres("state.db")
