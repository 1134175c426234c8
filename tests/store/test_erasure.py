"""Forgetting a person: Store.erase reaches every copy the database holds, and only that.

Each person's marker goes into every kind of content the library stores: messages,
a compacted original and its search index, the agent's fields, memory, SQL
workspace rows (log and file), an approval's arguments, an event's payload, an
alarm's action, the workflow journal, a failed turn's handoff, a fork, and a
conversation of another agent that carries the person as its own subject. After
the erasure, no byte of any file the library wrote (the SQLite file, its WAL and
shared memory, the workspace files; on PostgreSQL the table files after a
checkpoint, and a ``pg_dump``) holds the erased person's marker, while the other
person's content reads back exactly as before (DESIGN.md, promise 12).
"""

from __future__ import annotations

import os
import subprocess
import urllib.parse
from pathlib import Path

import psycopg
import pytest
from keeper import MARKERS, fill, what_reads_back
from postgres_server import PostgresServer

from effectful_durable import AgentInUseError, InvalidSubjectError, NotFoundError, Store

pytestmark = pytest.mark.slow


def file_bytes(url: str, server: PostgresServer | None) -> bytes:
    """Every byte of every file the library wrote for ``url``: the database's files and
    its workspace files; on PostgreSQL the table files after a checkpoint, and a dump."""
    if server is None:
        chunks = [p.read_bytes() for p in Path(url).parent.rglob("*") if p.is_file()]
        cache = Path(os.environ["XDG_CACHE_HOME"])
        chunks += [p.read_bytes() for p in cache.rglob("*") if p.is_file()]
        return b"".join(chunks)
    name = urllib.parse.urlsplit(url).path.lstrip("/")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        oid = conn.execute("SELECT oid FROM pg_database WHERE datname = %s", (name,)).fetchone()
    base = Path(server.data) / "base" / str(oid[0])
    chunks = [p.read_bytes() for p in base.iterdir() if p.is_file()]
    dump = subprocess.run(
        [os.path.join(server.bindir, "pg_dump"), "--no-owner", url],
        capture_output=True,
        check=True,
    )
    cache = Path(os.environ["XDG_CACHE_HOME"])
    chunks += [p.read_bytes() for p in cache.rglob("*") if p.is_file()]
    return b"".join([*chunks, dump.stdout])


def count(data: bytes, who: str) -> int:
    mark = MARKERS[who]
    return sum(data.count(form.encode()) for form in {mark, mark.lower(), mark.upper()})


class TestErasure:
    def test_a_subject_is_gone_from_every_file_and_the_other_stays(
        self, store_url: str, store_server: PostgresServer | None
    ) -> None:
        """Every kind of content of one person, in their agent, its fork and another
        agent's conversation, leaves every file; the other person's reads back as it was."""
        fill(store_url, "ann")
        fill(store_url, "bob")
        with Store(store_url) as store:
            assert store.holders("user:ann") == [
                ("ann", None),
                ("ann-copy", None),
                ("shared", "with-ann"),
            ]
            kept = {agent: what_reads_back(store, agent) for agent in ("bob", "bob-copy")}
            kept_shared = store.history("shared", conversation="with-bob")
            before = file_bytes(store_url, store_server)
            assert count(before, "ann") > 20 and count(before, "bob") > 20
            receipt = store.erase(subject="user:ann")
            assert receipt.agents == ("ann", "ann-copy")
            assert receipt.conversations == (("shared", "with-ann"),)
            assert receipt.scrubbed_at is not None and receipt.verified
            kinds = receipt.counts
            for kind in ("messages", "versions", "memory entries", "SQL workspace changes",
                         "alarms and events", "approvals", "journal steps", "handoffs",
                         "search index entries"):  # fmt: skip
                assert kinds.get(kind, 0) > 0, (kind, kinds)
            assert "AnnSecret" not in repr(receipt)
            after = file_bytes(store_url, store_server)
            assert count(after, "ann") == 0
            assert count(after, "bob") > 0
            assert {agent: what_reads_back(store, agent) for agent in kept} == kept
            assert store.history("shared", conversation="with-bob") == kept_shared
            with pytest.raises(NotFoundError):
                store.history("ann")
            assert store.holders("user:ann") == []
            assert [r.erasure_id for r in store.erasures()] == [receipt.erasure_id]

    def test_an_agent_and_a_conversation_alone(self, store_url: str) -> None:
        """``agent=`` erases one agent whole; with ``conversation=``, that conversation
        alone, the agent's other conversations and shared fields staying."""
        fill(store_url, "bob")
        with Store(store_url) as store:
            other = store.history("shared", conversation="default")
            first = store.erase(agent="shared", conversation="with-bob")
            assert first.conversations == (("shared", "with-bob"),) and first.agents == ()
            with pytest.raises(NotFoundError):
                store.history("shared", conversation="with-bob")
            assert store.history("shared", conversation="default") == other
            second = store.erase(agent="bob-copy")
            assert second.agents == ("bob-copy",) and second.previous == first.digest
            assert "bob-copy" not in [a.agent_id for a in store.agents()]
            with pytest.raises(NotFoundError):
                store.erase(agent="nobody")
            with pytest.raises(NotFoundError, match="conversation 'nope'"):
                store.erase(agent="shared", conversation="nope")
            assert [r.erasure_id for r in store.erasures()] == [
                first.erasure_id,
                second.erasure_id,
            ]

    def test_refused_while_a_turn_runs(self, store_url: str) -> None:
        """An erasure that meets a running turn of an affected agent erases nothing."""
        with Store(store_url) as store, Store(store_url) as other:
            store.set_subject("ann", "user:ann")
            store.set_subject("zed", "user:ann")
            with other.turns.start("zed", template="t", arguments={}):
                with pytest.raises(AgentInUseError, match="nothing was erased"):
                    store.erase(subject="user:ann")
            assert store.holders("user:ann") == [("ann", None), ("zed", None)]
            assert store.erasures() == []

    def test_bad_arguments(self, store_url: str) -> None:
        """A subject that is no subject, or both selectors, is refused before anything."""
        with Store(store_url) as store:
            with pytest.raises(InvalidSubjectError):
                store.set_subject("ann", "")
            with pytest.raises(ValueError, match="subject= or agent="):
                store.erase()
            with pytest.raises(ValueError, match="subject= or agent="):
                store.erase(subject="user:ann", agent="ann")
            with pytest.raises(ValueError, match="takes no conversation"):
                store.erase(subject="user:ann", conversation="c")
            assert store.erasures() == []
