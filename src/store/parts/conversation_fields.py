"""Fields declared per conversation: one JSON object per conversation, versioned like memory.

A row holds the values of an agent's :func:`~effectful_durable.per_conversation`
fields in one conversation, from the version that wrote them (``added_in``) to
the one that replaced them or deleted the conversation (``removed_in``). A turn
writes a row only when its conversation's values changed, so a turn costs what
it changed however many conversations the agent has.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..engine.seam import Conn
from ..sealing import FIELDS, PLAIN, Sealer
from .versioned import VersionedRows


@dataclass(frozen=True, slots=True)
class ConversationFieldsWrite:
    """A turn's new values of its conversation's fields (a TurnWrite)."""

    conversation: str
    state: str

    def write(self, conn: Conn, agent_id: str, version: int, sealer: Sealer) -> None:
        """Make ``state`` the conversation's values from ``version`` on."""
        remove(conn, agent_id, self.conversation, version)
        conn.execute(
            """
            INSERT INTO conversation_fields (agent_id, conversation, added_in, state)
            VALUES (?, ?, ?, ?)
            """,
            (
                agent_id,
                self.conversation,
                version,
                sealer.seal(self.state, FIELDS, agent_id, self.conversation),
            ),
        )


class ConversationFields(VersionedRows):
    """The ``conversation_fields`` table as a versioned part of an agent's record."""

    def __init__(self) -> None:
        super().__init__(
            "conversation_fields",
            ("conversation", "state"),
            sealed="state",
            place=lambda agent_id, row: (FIELDS, agent_id, row["conversation"], ""),
        )


def remove(conn: Conn, agent_id: str, conversation: str, version: int) -> None:
    """End the conversation's current values at ``version`` (a new row or a deletion)."""
    conn.execute(
        """
        UPDATE conversation_fields SET removed_in = ?3
         WHERE agent_id = ?1 AND conversation = ?2 AND removed_in IS NULL
        """,
        (agent_id, conversation, version),
    )


def state_at(
    conn: Conn, agent_id: str, conversation: str, version: int, sealer: Sealer = PLAIN
) -> str | None:
    """The JSON values of the conversation's fields at ``version``, or None if it has none."""
    row = conn.execute(
        """
        SELECT state FROM checked_conversation_fields
         WHERE agent_id = ?1 AND conversation = ?2 AND added_in <= ?3
           AND (removed_in IS NULL OR removed_in > ?3)
        """,
        (agent_id, conversation, version),
    ).fetchone()
    if row is None:
        return None
    return sealer.open(
        row[0], FIELDS, agent_id, conversation, table="conversation_fields", version=version
    )
