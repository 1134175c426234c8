"""Subjects: who an agent's content, or one conversation's, is about, as the application says.

A subject is a label (``"user:42"``), one per agent (stored with conversation
``''``) and one per conversation that has its own. It is not versioned: a
rollback keeps it, a fork takes the source's, a delete takes it away. An
erasure of the subject (``store/erasure.py``) finds through it every agent and
conversation that carries it.
"""

from __future__ import annotations

from ..engine.seam import Conn
from ..sealing import Sealer

#: The ``conversation`` of an agent's own subject.
AGENT = ""


def set_subject(conn: Conn, agent_id: str, conversation: str, subject: str, now: float) -> None:
    """Name ``subject`` for the agent (``conversation`` :data:`AGENT`) or one conversation."""
    conn.execute(
        """
        INSERT INTO subjects (agent_id, conversation, subject, set_at) VALUES (?, ?, ?, ?)
        ON CONFLICT (agent_id, conversation) DO UPDATE
           SET subject = excluded.subject, set_at = excluded.set_at
        """,
        (agent_id, conversation, subject, now),
    )


def clear(conn: Conn, agent_id: str, conversation: str) -> None:
    """Name no subject for the agent (or the conversation) any more."""
    conn.execute(
        "DELETE FROM subjects WHERE agent_id = ? AND conversation = ?", (agent_id, conversation)
    )


def subjects_of(conn: Conn, agent_id: str) -> dict[str, str]:
    """The agent's subjects: by conversation, :data:`AGENT` for its own."""
    rows = conn.execute(
        "SELECT conversation, subject FROM checked_subjects WHERE agent_id = ?", (agent_id,)
    ).fetchall()
    return {str(conversation): str(subject) for conversation, subject in rows}


def holders(conn: Conn, subject: str) -> list[tuple[str, str]]:
    """``(agent_id, conversation)`` of what carries ``subject`` (conversation
    :data:`AGENT`: the whole agent), by agent."""
    rows = conn.execute(
        """
        SELECT agent_id, conversation FROM checked_subjects
         WHERE subject = ? ORDER BY agent_id, conversation
        """,
        (subject,),
    ).fetchall()
    return [(str(agent_id), str(conversation)) for agent_id, conversation in rows]


class SubjectPart:
    """How subjects follow a rollback (they stay), a fork (copied), a prune (they
    stay) and a delete (gone), as a VersionedPart."""

    def rollback(self, conn: Conn, agent_id: str, to_version: int, new_version: int) -> None:
        """A label of the agent, not of a version: it stays."""

    def fork(
        self, conn: Conn, agent_id: str, version: int, new_agent_id: str, sealer: Sealer
    ) -> None:
        """The fork carries its source's subjects: the same person's content."""
        conn.execute(
            """
            INSERT INTO subjects (agent_id, conversation, subject, set_at)
            SELECT ?2, conversation, subject, set_at FROM checked_subjects
             WHERE agent_id = ?1
            ON CONFLICT (agent_id, conversation) DO NOTHING
            """,
            (agent_id, new_agent_id),
        )

    def prune(self, conn: Conn, agent_id: str, keep_from: int) -> None:
        """A label of the agent, not of a version: it stays."""

    def delete(self, conn: Conn, agent_id: str) -> None:
        """Gone with the agent."""
        conn.execute("DELETE FROM subjects WHERE agent_id = ?", (agent_id,))
