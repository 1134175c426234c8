"""What the encryption tests share: an agent whose every kind of content carries a
person's marker, its fake model, keys, and the raw bytes of every file to scan."""

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
from helpers import running
from keeper import reply
from postgres_server import PostgresServer

from effectful_durable import (
    CompactionHandler,
    Keys,
    LocalMasterKey,
    PersistenceHandler,
    PersistentAgent,
    RecallTools,
    Store,
)
from effectful_durable.testing import FakeLLM

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


def load_diary(url: str, keys: Keys, agent_id: str) -> None:
    """Load ``agent_id`` as its next turn would."""
    persistence = PersistenceHandler(url, keys=keys)
    try:
        with running(FakeLLM(respond=reply), persistence):
            Diary(agent_id=agent_id).ask("hello again")
    finally:
        persistence.close()
