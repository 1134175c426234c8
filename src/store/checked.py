"""What a read may read: the version asked for, checked to exist and not pruned.

Reads at an earlier version choose rows by their version marks; those rows are
checked first (``Database.check_rows``), so that a damaged mark refuses the read
rather than leaves a row out. The latest version's rows are found by an index.
"""

from __future__ import annotations

from typing import Any

from ..errors import NotFoundError
from .engine.seam import Conn, Database
from .ids import DEFAULT_CONVERSATION, validate_agent_id, validate_conversation_id
from .parts import conversations as _conversations
from .rows import current_version, kept_from


def checked_version(db: Database, conn: Conn, agent_id: str, version: int | None) -> int:
    """``version`` (the latest when None), checked to exist and not to be pruned.

    Raises:
        NotFoundError: No such agent or version, or it was pruned.
    """
    return checked_and_current(db, conn, agent_id, version)[0]


def checked_and_current(
    db: Database, conn: Conn, agent_id: str, version: int | None
) -> tuple[int, int]:
    """:func:`checked_version`, and the latest version."""
    current = current_version(conn, validate_agent_id(agent_id))
    if current is None:
        raise NotFoundError(no_agent(agent_id, db.location))
    if version is None:
        return current, current
    if not 1 <= version <= current:
        msg = f"agent {agent_id!r} has no version {version}; it has versions 1 to {current}"
        raise NotFoundError(msg)
    if version < current and version < (kept := kept_from(conn, agent_id)):
        msg = (
            f"version {version} of agent {agent_id!r} was pruned; it keeps "
            f"versions {kept} to {current}"
        )
        raise NotFoundError(msg)
    return version, current


def checked_rows(
    db: Database,
    conn: Conn,
    agent_id: str,
    version: int | None,
    table: str,
    where: str,
    *params: Any,
) -> tuple[int, int]:
    """:func:`checked_and_current`, for a read that chooses rows of ``table`` by their
    version marks: at an earlier version, every row ``where`` (after ``agent_id =
    ?``) selects is checked first."""
    checked, current = checked_and_current(db, conn, agent_id, version)
    if checked < current:
        db.check_rows(conn, table, f"agent_id = ? AND {where}", (agent_id, *params))
    return checked, current


def checked_conversation(conn: Conn, agent_id: str, conversation: str, version: int) -> None:
    """Raise NotFoundError unless the agent has ``conversation`` at ``version``."""
    if conversation == DEFAULT_CONVERSATION:
        return  # an agent that never used it has it empty
    validate_conversation_id(conversation)
    if not _conversations.exists(conn, agent_id, conversation, version):
        raise NotFoundError(no_conversation(agent_id, conversation, version))


def no_conversation(agent_id: str, conversation: str, version: int) -> str:
    return (
        f"agent {agent_id!r} has no conversation {conversation!r} at version {version}; "
        "Store.conversations() lists the ones it has"
    )


def no_agent(agent_id: str, path: str) -> str:
    return f"no agent {agent_id!r} in {path}; Store.agents() lists the agents it holds"
