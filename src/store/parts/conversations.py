"""Conversations: the several histories of one agent, and how they follow its versions.

A conversation exists at version v when a row of ``conversations`` has
``added_in <= v`` and ``removed_in`` NULL or greater than v, the same rule as
messages. The first commit in a conversation adds its row; deleting it is a
version of its own that removes the row and its messages, so rolling back to an
earlier version brings it back whole.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

from ..engine.seam import Conn
from ..records import ConversationInfo
from .versioned import VersionedRows


class Conversations(VersionedRows):
    """The ``conversations`` table as a versioned part of an agent's record."""

    def __init__(self) -> None:
        super().__init__("conversations", ("conversation", "created_at"))


def ensure(conn: Conn, agent_id: str, conversation: str, version: int) -> None:
    """Record that ``conversation`` exists from ``version`` on, unless it already does.

    One probe of the partial unique index ``conversations_active``.
    """
    conn.execute(
        """
        INSERT INTO conversations (agent_id, conversation, added_in, created_at)
        VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING
        """,
        (agent_id, conversation, version, time.time()),
    )


def exists(conn: Conn, agent_id: str, conversation: str, version: int) -> bool:
    """Whether ``conversation`` of ``agent_id`` exists at ``version``."""
    row = conn.execute(
        """
        SELECT 1 FROM conversations
         WHERE agent_id = ?1 AND conversation = ?2 AND added_in <= ?3
           AND (removed_in IS NULL OR removed_in > ?3)
        """,
        (agent_id, conversation, version),
    ).fetchone()
    return row is not None


def remove(conn: Conn, agent_id: str, conversation: str, version: int) -> int:
    """Remove the conversation and its active messages as of ``version``.

    Returns:
        How many messages it removed.
    """
    conn.execute(
        """
        UPDATE messages SET removed_in = ?3
         WHERE agent_id = ?1 AND conversation = ?2 AND removed_in IS NULL
        """,
        (agent_id, conversation, version),
    )
    removed = conn.changes()
    conn.execute(
        """
        UPDATE conversations SET removed_in = ?3
         WHERE agent_id = ?1 AND conversation = ?2 AND removed_in IS NULL
        """,
        (agent_id, conversation, version),
    )
    conn.execute(
        "DELETE FROM handoffs WHERE agent_id = ? AND conversation = ?", (agent_id, conversation)
    )
    return removed


def listed(conn: Conn, agent_id: str, version: int, *, latest: bool) -> list[ConversationInfo]:
    """The conversations of ``agent_id`` at ``version``, by id.

    At the ``latest`` version a conversation's messages are its active ones: they
    are counted in the index of those (``messages_active``), without reading a row;
    at an earlier one, every row of the conversation is read.
    """
    active = (
        "m.removed_in IS NULL"
        if latest
        else "m.added_in <= ?2 AND (m.removed_in IS NULL OR m.removed_in > ?2)"
    )
    rows: list[tuple[Any, ...]] = conn.execute(
        f"""
        SELECT c.conversation, c.added_in, c.created_at,
               (SELECT count(*) FROM messages AS m
                 WHERE m.agent_id = c.agent_id AND m.conversation = c.conversation
                   AND {active}),
               (SELECT max(v.version) FROM versions AS v
                 WHERE v.agent_id = c.agent_id AND v.conversation = c.conversation
                   AND v.version <= ?2)
          FROM checked_conversations AS c
         WHERE c.agent_id = ?1 AND c.added_in <= ?2
           AND (c.removed_in IS NULL OR c.removed_in > ?2)
         ORDER BY c.conversation
        """,
        (agent_id, version),
    ).fetchall()
    return [
        ConversationInfo(
            agent_id,
            conversation,
            messages,
            created_in,
            last_version,
            datetime.fromtimestamp(created_at, UTC),
        )
        for conversation, created_in, created_at, messages, last_version in rows
    ]
