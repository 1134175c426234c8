"""Erasure: every copy the database holds of what a subject, an agent or a conversation
said, gone in one transaction under the agents' holds, then scrubbed from the files,
with a receipt.

What one erasure reaches (``_WHOLE_AGENT`` and ``_ONE_CONVERSATION`` name every
table): an agent's every version, message, compacted original and its search
index, state, memory, SQL workspace (its log, and its file on this machine),
approvals, events, alarms, journal steps, handoffs and subjects; a conversation's
messages, compactions, fields, handoffs, approvals and journal steps (an agent's
fields and memory are shared by its conversations, and stay). A subject reaches
every agent and conversation that carries it (:mod:`.parts.subjects`), forks
included, since a fork carries its source's subjects.

Then the bytes go from the live files, not only from the tables: the engine
scrubs (``Database.scrub``: SQLite overwrites what it deletes and truncates its
WAL; PostgreSQL rewrites the tables that held rows). A crash between the commit
and the scrub leaves the erasure done and its scrub pending: the receipt says so
(``scrubbed_at`` None), and the next erasure scrubs first.

The receipt (:class:`~effectful_durable.ErasureReceipt`) counts what was
erased, by kind, and names the agents and conversations, never their content;
the subject only by a digest. Its own digest covers it and the digest of the
receipt before it, so that receipts form a chain a later audit can check.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import ExitStack
from typing import Any

from ..errors import AgentInUseError, NotFoundError
from .engine.seam import Conn, Database
from .holds import hold
from .ids import validate_agent_id, validate_conversation_id, validate_subject
from .parts.subjects import AGENT, holders
from .records import ErasureReceipt
from .rows import utc

#: What an agent's erasure deletes, table by table: the kind the receipt counts
#: it as (None: not counted), and which rows.
_WHOLE_AGENT: tuple[tuple[str, str | None, str], ...] = (
    ("messages", "messages", "agent_id = ?1"),
    ("history_snapshots", None, "agent_id = ?1"),
    ("compacted_text", "search index entries", "agent_id = ?1"),
    ("compactions", "compactions", "agent_id = ?1"),
    ("conversation_fields", "conversation fields", "agent_id = ?1"),
    ("conversations", "conversations", "agent_id = ?1"),
    ("memory", "memory entries", "agent_id = ?1"),
    ("workspace_log", "SQL workspace changes", "agent_id = ?1"),
    ("alarms", "alarms and events", "agent_id = ?1"),
    ("approvals", "approvals", "agent_id = ?1"),
    ("workflow_steps", "journal steps", "agent_id = ?1"),
    ("handoffs", "handoffs", "agent_id = ?1"),
    ("retention", None, "agent_id = ?1"),
    ("subjects", None, "agent_id = ?1"),
    ("versions", "versions", "agent_id = ?1"),
    ("agents", None, "agent_id = ?1"),
)

# A conversation's compactions are the versions it compacted.
_COMPACTED_IN = (
    "agent_id = ?1 AND version IN (SELECT v.version FROM versions AS v"
    " WHERE v.agent_id = ?1 AND v.conversation = ?2 AND v.kind = 'compaction')"
)

#: Where a conversation leaves a row: one in any of them is a conversation to erase.
_CONVERSATION_TABLES = ("versions", "messages", "conversations", "handoffs", "subjects")
#: What a conversation's erasure deletes; the agent's shared fields and memory stay.
_ONE_CONVERSATION: tuple[tuple[str, str | None, str], ...] = (
    ("messages", "messages", "agent_id = ?1 AND conversation = ?2"),
    ("history_snapshots", None, "agent_id = ?1 AND conversation = ?2"),
    ("compacted_text", "search index entries", _COMPACTED_IN),
    ("compactions", "compactions", _COMPACTED_IN),
    ("conversation_fields", "conversation fields", "agent_id = ?1 AND conversation = ?2"),
    ("conversations", "conversations", "agent_id = ?1 AND conversation = ?2"),
    ("approvals", "approvals", "agent_id = ?1 AND conversation = ?2"),
    ("workflow_steps", "journal steps", "agent_id = ?1 AND conversation = ?2"),
    ("handoffs", "handoffs", "agent_id = ?1 AND conversation = ?2"),
    ("subjects", None, "agent_id = ?1 AND conversation = ?2"),
)

_SUBJECT_DIGEST = "effectful-durable subject\0"


def subject_digest(subject: str) -> str:
    """The digest a receipt names a subject by (a later audit recomputes it)."""
    return hashlib.sha256((_SUBJECT_DIGEST + subject).encode()).hexdigest()


def erase(
    db: Database,
    *,
    subject: str | None = None,
    agent_id: str | None = None,
    conversation: str | None = None,
    forget_files: Callable[[str], bool],
    destroy_keys: Callable[[Sequence[str], Sequence[tuple[str, str]]], int],
) -> ErasureReceipt:
    """Store.erase: erase what ``subject`` (or the agent, or its conversation) holds.

    ``forget_files(agent_id)`` removes the agent's SQL workspace file on this
    machine, its bytes overwritten first. ``destroy_keys(agents, conversations)``
    destroys their data keys (encryption at rest; none without it), under the holds
    and before the rows go: killed between the two, the rows are there but unreadable, "erased",
    and erasing again deletes them.
    """
    selector = _selector(subject, agent_id, conversation)
    scrub_pending(db)
    with db.reading() as conn:
        agents, conversations = _targets(conn, subject, agent_id, conversation)
    if subject is None and not agents and not conversations:
        where = f"conversation {conversation!r} of " if conversation is not None else ""
        msg = f"{db.location} holds no {where}agent {agent_id!r}: nothing to erase"
        raise NotFoundError(msg)
    held = sorted({*agents, *(a for a, _ in conversations)})
    tally = _Tally()
    with ExitStack() as holding:
        for one in held:
            try:
                holding.enter_context(hold(db, one))
            except AgentInUseError as error:
                raise AgentInUseError(one, f"{error.holder}; nothing was erased") from error
        keys = destroy_keys(agents, conversations)
        if keys:
            tally.counts["data keys"] = keys
        with db.writing() as conn:
            for one in held:
                db.fence(conn, one)
            versions = _count_versions(conn, agents)
            for one in agents:
                tally.delete(conn, _WHOLE_AGENT, (one,))
                db.agent_deleted(conn, one)
            for one, talk in conversations:
                tally.delete(conn, _ONE_CONVERSATION, (one, talk))
            body = _signed(conn, selector, agents, conversations, versions, tally)
            digest = hashlib.sha256(_dumps(body).encode()).hexdigest()
            conn.execute(
                "INSERT INTO erasures (erasure_id, erased_at, receipt, digest)"
                " VALUES (?, ?, ?, ?)",
                (body["erasure_id"], body["erased_at"], _dumps(body), digest),
            )
    files = sum(1 for one in agents if forget_files(one))
    if files:
        with db.writing() as conn:
            conn.execute(
                "UPDATE erasures SET receipt = ? WHERE erasure_id = ?",
                (_dumps({**body, "files": files}), body["erasure_id"]),
            )
    scrub_pending(db)
    with db.reading() as conn:
        row = conn.execute(
            "SELECT receipt, digest FROM checked_erasures WHERE erasure_id = ?",
            (body["erasure_id"],),
        ).fetchone()
    return _receipt_of(str(row[0]), str(row[1]))


def erasures(db: Database) -> list[ErasureReceipt]:
    """Store.erasures: every receipt, oldest first."""
    with db.reading() as conn:
        rows = conn.execute(
            "SELECT receipt, digest FROM checked_erasures ORDER BY erased_at, erasure_id"
        ).fetchall()
    return [_receipt_of(str(body), str(digest)) for body, digest in rows]


def scrub_pending(db: Database) -> float | None:
    """Scrub the files of the erasures whose scrub a crash cut off, if any; when the
    last erasure's files were scrubbed (None if they could not be)."""
    with db.reading() as conn:
        pending = [
            str(body)
            for (body,) in conn.execute(
                "SELECT receipt FROM checked_erasures ORDER BY erased_at, erasure_id"
            ).fetchall()
            if json.loads(str(body)).get("scrubbed_at") is None
        ]
    if not pending:
        return None
    tables = sorted({table for body in pending for table in json.loads(body)["tables"]})
    if not db.scrub(tables):
        return None
    now = time.time()
    with db.writing() as conn:
        for body in pending:
            found = json.loads(body)
            found["scrubbed_at"] = now
            conn.execute(
                "UPDATE erasures SET receipt = ? WHERE erasure_id = ?",
                (_dumps(found), found["erasure_id"]),
            )
    return now


def _selector(
    subject: str | None, agent_id: str | None, conversation: str | None
) -> dict[str, str]:
    if (subject is None) == (agent_id is None):
        msg = "erase takes subject= or agent= (with conversation= to erase one of its own)"
        raise ValueError(msg)
    if subject is not None:
        if conversation is not None:
            msg = "erase(subject=...) takes no conversation: it erases all the subject holds"
            raise ValueError(msg)
        return {"subject": subject_digest(validate_subject(subject))}
    selector = {"agent": validate_agent_id(agent_id)}
    if conversation is not None:
        selector["conversation"] = validate_conversation_id(conversation)
    return selector


def _targets(
    conn: Conn, subject: str | None, agent_id: str | None, conversation: str | None
) -> tuple[list[str], list[tuple[str, str]]]:
    """The whole agents, and the conversations of other agents, to erase."""
    if subject is not None:
        found = holders(conn, subject)
        agents = sorted({a for a, talk in found if talk == AGENT})
        talks = sorted({(a, talk) for a, talk in found if talk != AGENT and a not in agents})
        return agents, talks
    assert agent_id is not None
    exists = conn.execute(
        "SELECT 1 FROM agents WHERE agent_id = ?1 UNION ALL SELECT 1 FROM handoffs"
        " WHERE agent_id = ?1 UNION ALL SELECT 1 FROM subjects WHERE agent_id = ?1 LIMIT 1",
        (agent_id,),
    ).fetchone()
    if exists is None:
        return [], []
    if conversation is None:
        return [agent_id], []
    held = conn.execute(
        " UNION ALL ".join(
            f"SELECT 1 FROM {table} WHERE agent_id = ?1 AND conversation = ?2"
            for table in _CONVERSATION_TABLES
        )
        + " LIMIT 1",
        (agent_id, conversation),
    ).fetchone()
    return ([], [(agent_id, conversation)]) if held is not None else ([], [])


def _count_versions(conn: Conn, agents: Sequence[str]) -> int:
    total = 0
    for one in agents:
        row = conn.execute("SELECT count(*) FROM versions WHERE agent_id = ?", (one,)).fetchone()
        total += int(row[0])
    return total


class _Tally:
    """What an erasure deleted: rows by kind, and the tables they were in."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.tables: set[str] = set()

    def delete(
        self, conn: Conn, plan: Iterable[tuple[str, str | None, str]], params: tuple[str, ...]
    ) -> None:
        for table, kind, where in plan:
            conn.execute(f"DELETE FROM {table} WHERE {where}", params)
            changed = conn.changes()
            if changed:
                self.tables.add(table)
                if kind is not None:
                    self.counts[kind] = self.counts.get(kind, 0) + changed


def _signed(
    conn: Conn,
    selector: dict[str, str],
    agents: Sequence[str],
    conversations: Sequence[tuple[str, str]],
    versions: int,
    tally: _Tally,
) -> dict[str, Any]:
    """The receipt's body its digest covers, chained to the receipt before it."""
    previous = conn.execute(
        "SELECT digest FROM erasures ORDER BY erased_at DESC, erasure_id DESC LIMIT 1"
    ).fetchone()
    return {
        "erasure_id": f"era_{secrets.token_hex(8)}",
        "erased_at": time.time(),
        "selector": selector,
        "agents": list(agents),
        "conversations": [list(pair) for pair in conversations],
        "versions": versions,
        "counts": dict(sorted(tally.counts.items())),
        "tables": sorted(tally.tables),
        "previous": None if previous is None else str(previous[0]),
    }


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_SIGNED = ("erasure_id", "erased_at", "selector", "agents", "conversations", "versions",
           "counts", "tables", "previous")  # fmt: skip


def _receipt_of(body: str, digest: str) -> ErasureReceipt:
    found = json.loads(body)
    signed = {key: found[key] for key in _SIGNED}  # what the digest covers
    return ErasureReceipt(
        erasure_id=found["erasure_id"],
        erased_at=utc(found["erased_at"]),
        selector=dict(found["selector"]),
        agents=tuple(found["agents"]),
        conversations=tuple((a, c) for a, c in found["conversations"]),
        versions=int(found["versions"]),
        counts=dict(found["counts"]),
        tables=tuple(found["tables"]),
        previous=found["previous"],
        files=int(found.get("files", 0)),
        scrubbed_at=None if found.get("scrubbed_at") is None else utc(found["scrubbed_at"]),
        digest=digest,
        verified=hashlib.sha256(_dumps(signed).encode()).hexdigest() == digest,
    )
