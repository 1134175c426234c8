"""Changes to one agent besides its turns: rollback, fork, deletion, a conversation's deletion.

Each holds the agent (``holds.py``), so it never races a running turn, and
writes under the hold; each part of the record (``parts/``, the SQL workspace)
follows it (``VersionedPart``). :class:`~effectful_durable.Store` documents them.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from ..errors import DurableError, NotFoundError
from .checked import checked_version, no_agent, no_conversation
from .engine.seam import Conn, Database
from .holds import holding
from .ids import validate_agent_id, validate_conversation_id
from .parts import conversation_fields
from .parts import conversations as _conversations
from .parts.versioned import VersionedPart
from .reads import agents
from .records import ForkedAgent
from .rows import current_version, state_at
from .sealing import MESSAGE, PLAIN, STATE, Sealer
from .versions import MESSAGE_COLUMNS, insert_version

#: The tables whose rows a rollback or fork copies by their version marks, and
#: the column that says from which version on a row is held.
_VERSIONED: tuple[tuple[str, str], ...] = (
    ("messages", "added_in"),
    ("conversations", "added_in"),
    ("conversation_fields", "added_in"),
    ("memory", "added_in"),
    ("alarms", "created_in"),
)


def _check_copied(db: Database, conn: Conn, agent_id: str, version: int) -> None:
    """Check every row a rollback or fork to ``version`` chooses from: they are
    chosen on their version marks, and a damaged mark must refuse the copy, not
    leave a row out of it."""
    for table, added in _VERSIONED:
        db.check_rows(conn, table, f"agent_id = ? AND {added} <= ?", (agent_id, version))


def rollback(db: Database, parts: Sequence[VersionedPart], agent_id: str, version: int) -> int:
    """Store.rollback: commit a new version equal to ``version``; the new version."""
    with db.unhurried(), holding(db, agent_id) as conn:
        current = checked_version(db, conn, agent_id, None)
        checked_version(db, conn, agent_id, version)
        _check_copied(db, conn, agent_id, version)
        new = current + 1
        conn.execute(
            """
            UPDATE messages SET removed_in = ?3
             WHERE agent_id = ?1 AND removed_in IS NULL AND added_in > ?2
            """,
            (agent_id, version, new),
        )
        removed = conn.changes()
        conn.execute(
            """
            INSERT INTO messages (agent_id, conversation, position, added_in,
                removed_in, message_id, role, body)
            SELECT agent_id, conversation, position, ?3, NULL, message_id, role, body
              FROM checked_messages
             WHERE agent_id = ?1 AND added_in <= ?2 AND removed_in > ?2
            """,
            (agent_id, version, new),
        )
        added = conn.changes()
        insert_version(
            db,
            conn,
            agent_id,
            new,
            kind="rollback",
            template=None,
            state=state_at(conn, agent_id, version),
            added=added,
            removed=removed,
            detail={"to": version},
        )
        for part in parts:
            part.rollback(conn, agent_id, version, new)
        conn.execute(
            "UPDATE agents SET version = ?, updated_at = ? WHERE agent_id = ?",
            (new, time.time(), agent_id),
        )
    return new


def fork(
    db: Database,
    parts: Sequence[VersionedPart],
    agent_id: str,
    version: int | None,
    new_agent_id: str,
    *,
    sealer: Sealer = PLAIN,
) -> ForkedAgent:
    """Store.fork: create ``new_agent_id`` as a copy of ``agent_id`` at ``version``.

    Sealed content is opened and sealed again for the fork: each value is bound
    to its agent, so a byte-for-byte copy would not open there.
    """
    validate_agent_id(new_agent_id)
    with db.unhurried(), holding(db, new_agent_id) as conn:
        version = checked_version(db, conn, agent_id, version)
        _check_copied(db, conn, agent_id, version)
        if current_version(conn, new_agent_id) is not None:
            msg = (
                f"cannot fork into {new_agent_id!r}: that agent already exists in "
                f"{db.location}. Choose another id, or delete it first."
            )
            raise DurableError(msg)
        now = time.time()
        conn.execute(
            """
            INSERT INTO agents (agent_id, version, created_at, updated_at)
            VALUES (?, 1, ?, ?)
            """,
            (new_agent_id, now, now),
        )
        if sealer.enabled:
            copied = _fork_sealed(db, conn, sealer, agent_id, version, new_agent_id)
        else:
            conn.execute(
                """
                INSERT INTO messages (agent_id, conversation, position, added_in,
                    removed_in, message_id, role, body)
                SELECT ?3, conversation, position, 1, NULL, message_id, role, body
                  FROM checked_messages
                 WHERE agent_id = ?1 AND added_in <= ?2
                   AND (removed_in IS NULL OR removed_in > ?2)
                """,
                (agent_id, version, new_agent_id),
            )
            copied = conn.changes()
        state = state_at(conn, agent_id, version)
        if state is not None:
            state = sealer.open(state, STATE, agent_id, table="versions", version=version)
        insert_version(
            db,
            conn,
            new_agent_id,
            1,
            kind="fork",
            template=None,
            state=state,
            added=copied,
            removed=0,
            detail={"from": agent_id, "version": version},
            sealer=sealer,
        )
        for part in parts:
            part.fork(conn, agent_id, version, new_agent_id, sealer)
    with db.reading() as conn:
        record = next(a for a in agents(conn) if a.agent_id == new_agent_id)
    return ForkedAgent(
        record.agent_id,
        record.version,
        record.messages,
        record.created_at,
        record.updated_at,
        source_id=agent_id,
        source_version=version,
        subject=record.subject,
    )


def _fork_sealed(
    db: Database, conn: Conn, sealer: Sealer, agent_id: str, version: int, new_agent_id: str
) -> int:
    """Copy the messages of ``agent_id`` at ``version`` into the fork, each opened and
    sealed again for it; how many."""
    rows = conn.execute(
        """
        SELECT conversation, position, message_id, role, body FROM checked_messages
         WHERE agent_id = ?1 AND added_in <= ?2
           AND (removed_in IS NULL OR removed_in > ?2)
        """,
        (agent_id, version),
    ).fetchall()
    copied = [
        (
            new_agent_id,
            talk,
            position,
            1,
            None,
            message_id,
            role,
            sealer.seal(
                sealer.open(body, MESSAGE, agent_id, talk, position, table="messages"),
                MESSAGE,
                new_agent_id,
                talk,
                position,
            ),
        )
        for talk, position, message_id, role, body in rows
    ]
    if copied:
        db.insert(conn, "messages", MESSAGE_COLUMNS, copied)
    return len(copied)


def delete(db: Database, parts: Sequence[VersionedPart], agent_id: str) -> None:
    """Store.delete: delete the agent with all its versions, messages and handoffs."""
    with db.unhurried(), holding(db, agent_id) as conn:
        found = current_version(conn, agent_id) is not None
        conn.execute("DELETE FROM handoffs WHERE agent_id = ?", (agent_id,))
        if not found and not conn.changes():
            raise NotFoundError(no_agent(agent_id, db.location))
        for part in parts:
            part.delete(conn, agent_id)
        conn.execute("DELETE FROM agents WHERE agent_id = ?", (agent_id,))
        conn.execute("DELETE FROM compacted_text WHERE agent_id = ?", (agent_id,))
        db.agent_deleted(conn, agent_id)


def delete_conversation(db: Database, agent_id: str, conversation: str) -> int:
    """Store.delete_conversation: delete one conversation, as a new version; the new version."""
    validate_conversation_id(conversation)
    with db.unhurried(), holding(db, agent_id) as conn:
        current = checked_version(db, conn, agent_id, None)
        if not _conversations.exists(conn, agent_id, conversation, current):
            raise NotFoundError(no_conversation(agent_id, conversation, current))
        new = current + 1
        removed = _conversations.remove(conn, agent_id, conversation, new)
        conversation_fields.remove(conn, agent_id, conversation, new)
        insert_version(
            db,
            conn,
            agent_id,
            new,
            kind="delete",
            template=None,
            state=None,
            added=0,
            removed=removed,
            detail=None,
            conversation=conversation,
        )
        conn.execute(
            "UPDATE agents SET version = ?, updated_at = ? WHERE agent_id = ?",
            (new, time.time(), agent_id),
        )
    return new
