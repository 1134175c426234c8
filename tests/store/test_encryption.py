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

import dataclasses
import hashlib
import os
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import psycopg
import pytest
from effectful.handlers.llm import Template, Tool
from effectful.ops.types import NotHandled
from postgres_server import PostgresServer

from effectful_durable import (
    CompactionHandler,
    DamagedRowError,
    Keys,
    KeyUnavailableError,
    LocalMasterKey,
    PersistenceHandler,
    PersistentAgent,
    RecallTools,
    Store,
)
from effectful_durable.store.browse import HistoryFilter
from effectful_durable.store.copy import copy_store
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall
from tests.helpers import edit_rows, is_postgres, persisted_rows, running

MARK = "AnnSecret4711"


@dataclasses.dataclass
class Diary(PersistentAgent, RecallTools):
    """You keep a diary for one person."""

    notes: list[str] = dataclasses.field(default_factory=list)

    @Tool.define
    def remember(self, text: str) -> str:
        """Keep ``text`` in the diary's notes."""
        self.notes.append(text)
        if SCAN_DURING_TURN:
            SCAN_DURING_TURN[0]()
        return "kept"

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


#: A scan of the files, run from inside a tool (the turn's handoff is committed then).
SCAN_DURING_TURN: list[Any] = []


def reply(call: FakeCall) -> Any:
    text = call.last_user_text.removeprefix("Answer: ")
    if "Summarise the conversation" in text:
        return "SUMMARY: " + text[-200:]
    if call.messages[-1]["role"] == "tool":
        return f"done with {text}"
    verb, _, rest = text.partition(" ")
    if verb == "remember":
        return ToolCall("remember", {"text": rest})
    if verb == "fail":
        return RuntimeError(f"the model is down ({rest})")
    return f"answer to {text}"


def new_keys(tmp_path: Path, name: str = "master") -> Keys:
    """Fresh keys: a key file, and a key store file of their own."""
    key_file = tmp_path / f"{name}.key"
    key_file.write_text(LocalMasterKey.generate())
    return Keys.from_file(key_file, store=str(tmp_path / f"{name}.keys"))


def file_bytes(url: str, tmp_path: Path, server: PostgresServer | None) -> bytes:
    """Every byte of every file under the test's directory (the SQLite database and its
    WAL and shared memory, the key store, workspace files); on PostgreSQL, also the
    database's table files after a checkpoint, and a ``pg_dump``."""
    chunks = [p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()]
    cache = Path(os.environ["XDG_CACHE_HOME"])
    chunks += [p.read_bytes() for p in cache.rglob("*") if p.is_file()]
    if server is not None:
        name = urllib.parse.urlsplit(url).path.lstrip("/")
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CHECKPOINT")
            oid = conn.execute(
                "SELECT oid FROM pg_database WHERE datname = %s", (name,)
            ).fetchone()
        assert oid is not None
        base = Path(server.data) / "base" / str(oid[0])
        chunks += [p.read_bytes() for p in base.iterdir() if p.is_file()]
        chunks.append(dump(url, server))
    return b"".join(chunks)


def dump(url: str, server: PostgresServer) -> bytes:
    return subprocess.run(
        [os.path.join(server.bindir, "pg_dump"), "--no-owner", url],
        capture_output=True,
        check=True,
    ).stdout


def marks(data: bytes, mark: str = MARK) -> int:
    return sum(data.count(form.encode()) for form in {mark, mark.lower(), mark.upper()})


def fingerprint(url: str, tmp_path: Path, server: PostgresServer | None) -> str:
    """What the database holds, to show that a refusal wrote nothing."""
    if server is not None:  # pg_dump's \restrict lines carry a random token of each run
        lines = dump(url, server).splitlines()
        kept = [line for line in lines if not line.startswith((b"\\restrict", b"\\unrestrict"))]
        return hashlib.sha256(b"\n".join(kept)).hexdigest()
    # The database, its WAL, and the key stores; not the shared-memory index, which any
    # reader rewrites (nor an empty WAL a read-only open leaves), nor the test's key files.
    files = sorted(
        p
        for p in tmp_path.rglob("*")
        if p.is_file() and p.stat().st_size and not p.name.endswith(("-shm", ".key"))
    )
    return hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()


@pytest.fixture
def server(store_url: str, request: pytest.FixtureRequest) -> PostgresServer | None:
    if not store_url.startswith("postgresql://"):
        return None
    found: PostgresServer = request.getfixturevalue("postgres_server")
    return found


def fill(url: str, keys: Keys, who: str = "ann", mark: str = MARK) -> None:
    """Turns of ``who``'s diary: messages, notes (fields), compactions, a failed turn."""
    persistence = PersistenceHandler(url, keys=keys)
    compaction = CompactionHandler(max_messages=8, keep_recent=3)
    try:
        with running(FakeLLM(respond=reply), compaction, persistence):
            diary = Diary(agent_id=who)
            for verb in ("hello", "remember", "tell", "remember", "more", "again", "once"):
                diary.ask(f"{verb} {mark}")
            with diary.conversation("side"), pytest.raises(RuntimeError):
                diary.ask(f"fail {mark}")
    finally:
        persistence.close()


def reads(store: Store, agent_id: str) -> dict[str, Any]:
    """What an agent reads back as."""
    return {
        "history": store.history(agent_id),
        "compacted": store.history(agent_id, include_compacted=True),
        "state": store.state(agent_id),
        "versions": [(v.version, v.kind) for v in store.versions(agent_id)],
        "handoffs": [
            (h.conversation, h.arguments, h.error) for h in store.handoffs()
            if h.agent_id == agent_id
        ],
    }  # fmt: skip


class TestSealed:
    def test_no_marker_in_any_file_at_any_time(
        self, store_url: str, tmp_path: Path, server: PostgresServer | None
    ) -> None:
        """The marker never reaches a file: between turns, within a turn, after a failed
        turn, a compaction, a fork and a rollback; and all of it reads back as written."""
        keys = new_keys(tmp_path)
        seen: list[int] = []
        SCAN_DURING_TURN.append(
            lambda: seen.append(marks(file_bytes(store_url, tmp_path, server)))
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
        assert marks(file_bytes(store_url, tmp_path, server)) == 0
        raw = persisted_rows(store_url, "SELECT body FROM messages")
        assert raw and all(str(body).startswith("ed1:") for (body,) in raw)

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
                Diary_load(store_url, keys, "bob")
            assert store.history("ann")  # the rest reads

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
        self, store_url: str, tmp_path: Path, server: PostgresServer | None
    ) -> None:
        """No keys, another master key, or a key store that is not there: a one-line
        error naming the database, and not a byte written."""
        keys = new_keys(tmp_path)
        fill(store_url, keys)
        before = fingerprint(store_url, tmp_path, server)
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
        assert fingerprint(store_url, tmp_path, server) == before
        with Store(store_url, keys=keys) as store:
            assert store.state("ann")["notes"] == [MARK, MARK]


def Diary_load(url: str, keys: Keys, agent_id: str) -> None:
    """Load ``agent_id`` as its next turn would."""
    persistence = PersistenceHandler(url, keys=keys)
    try:
        with running(FakeLLM(respond=reply), persistence):
            Diary(agent_id=agent_id).ask("hello again")
    finally:
        persistence.close()


def test_is_postgres_helper() -> None:
    """The fixture names PostgreSQL databases by URL (sanity for the matrix above)."""
    assert is_postgres("postgresql://x/y") and not is_postgres("state.db")
