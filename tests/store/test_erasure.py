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

import dataclasses
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
from postgres_server import PostgresServer

from effectful_durable import (
    AgentInUseError,
    AlarmTools,
    CompactionHandler,
    InvalidSubjectError,
    NotFoundError,
    PersistenceHandler,
    PersistentAgent,
    RecallTools,
    SQLTools,
    StateTools,
    Store,
    TurnSuspended,
    requires_approval,
)
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

pytestmark = pytest.mark.slow

MARKERS = {"ann": "AnnSecret4711", "bob": "BobKept0815"}


@dataclasses.dataclass
class Keeper(PersistentAgent, StateTools, SQLTools, AlarmTools, RecallTools):
    """You keep track of things for one person."""

    __sql_schema__ = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)"

    notes: list[str] = dataclasses.field(default_factory=list)

    @Tool.define
    def remember(self, text: str) -> str:
        """Keep ``text`` in the agent's notes."""
        self.notes.append(text)
        return "kept"

    @Tool.define
    @requires_approval(reason="a payment")
    def pay(self, order: str) -> str:
        """Pay for an order."""
        return f"paid {order}"

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


def reply(call: FakeCall) -> Any:
    """The model: each request names what to do with the text after its first word."""
    text = call.last_user_text.removeprefix("Answer: ")
    if "Summarise the conversation" in text:
        return "SUMMARY: " + text[-200:]
    if call.messages[-1]["role"] == "tool":
        return f"done with {text}"
    verb, _, rest = text.partition(" ")
    if verb == "put":
        return ToolCall("put_state", {"key": "secret", "value": f'"{rest}"'})
    if verb == "add":
        return ToolCall("sql_insert", {"table": "items", "values": {"name": rest}})
    if verb == "remind":
        return ToolCall("schedule_alarm", {"delay_seconds": 3600.0, "action": text})
    if verb == "remember":
        return ToolCall("remember", {"text": rest})
    if verb == "pay":
        return ToolCall("pay", {"order": rest})
    if verb == "fail":
        return RuntimeError(f"the model is down ({rest})")
    return f"answer to {text}"


def fill(url: str, who: str) -> None:
    """Put ``who``'s marker into every kind of content, for agents whose subject is them."""
    mark = MARKERS[who]
    with Store(url) as store:
        store.set_subject(who, f"user:{who}")
        store.set_subject("shared", f"user:{who}", conversation=f"with-{who}")
    persistence = PersistenceHandler(url)
    compaction = CompactionHandler(max_messages=10, keep_recent=3)
    try:
        with running(FakeLLM(respond=reply), compaction, persistence):
            agent = Keeper(agent_id=who)
            for verb in ("hello", "put", "add", "remind", "remember", "tell", "more", "again"):
                agent.ask(f"{verb} {mark}")
            shared = Keeper(agent_id="shared")
            with shared.conversation(f"with-{who}"):
                shared.ask(f"hello {mark}")
        with Store(url) as store:
            store.fork(who, None, f"{who}-copy")
            store.send_event(who, "note", {"text": mark})
        with running(FakeLLM(respond=reply), PersistenceHandler(url, workflow=f"wf-{who}")):
            with pytest.raises(TurnSuspended):
                Keeper(agent_id=who).ask(f"pay {mark}")
        with running(FakeLLM(respond=reply), PersistenceHandler(url)):
            failing = Keeper(agent_id=who)
            with failing.conversation("side"), pytest.raises(RuntimeError):
                failing.ask(f"fail {mark}")
    finally:
        persistence.close()


def what_reads_back(store: Store, agent_id: str) -> dict[str, Any]:
    """Everything a person's agent reads back as, to compare before and after."""
    return {
        "versions": [(v.version, v.kind, v.template) for v in store.versions(agent_id)],
        "history": store.history(agent_id),
        "compacted": store.history(agent_id, include_compacted=True),
        "state": store.state(agent_id),
        "memory": store.memory(agent_id),
        "sql": store.sql(agent_id, "SELECT name FROM items ORDER BY id").rows,
        "alarms": [(a.action, a.status) for a in store.alarms(agent_id)],
        "events": [e.payload for e in store.events(agent_id)],
        "approvals": [(a.tool, a.arguments) for a in store.approvals(agent_id=agent_id)],
        "steps": [
            (s.agent_id, s.arguments)
            for w in store.workflows()
            for s in store.steps(w.workflow)
            if s.agent_id == agent_id
        ],
    }


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


@pytest.fixture
def server(store_url: str, request: pytest.FixtureRequest) -> PostgresServer | None:
    if not store_url.startswith("postgresql://"):
        return None
    found: PostgresServer = request.getfixturevalue("postgres_server")
    return found


class TestErasure:
    def test_a_subject_is_gone_from_every_file_and_the_other_stays(
        self, store_url: str, server: PostgresServer | None
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
            before = file_bytes(store_url, server)
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
            after = file_bytes(store_url, server)
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
