"""Writing a version: its row, and a conversation's history change applied as it.

A turn's commit (``turns.py``) writes its version this way, and a compaction as
the next one; rollback, fork and the deletion of a conversation (``maintenance.py``)
write the version row of theirs.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from .engine.seam import Conn, Database
from .history import HistoryChange, message_json
from .parts import conversations as _conversations
from .records import Compaction
from .rows import dumps
from .sealing import MESSAGE, PLAIN, STATE, Sealer, is_sealed

#: A message row's columns, as :func:`write_version` inserts them.
MESSAGE_COLUMNS = tuple(
    "agent_id conversation position added_in removed_in message_id role body".split()
)
#: A version row's columns, as :func:`insert_version` inserts them.
VERSION_COLUMNS = tuple(
    "agent_id version kind conversation template state added removed detail committed_at".split()
)


def insert_version(
    db: Database,
    conn: Conn,
    agent_id: str,
    version: int,
    *,
    kind: str,
    template: str | None,
    state: str | None,
    added: int,
    removed: int,
    detail: Mapping[str, Any] | None,
    conversation: str | None = None,
    sealer: Sealer = PLAIN,
) -> None:
    """Insert the row of ``version``: what made it, and how many messages it added and removed.

    ``state`` is plain JSON, sealed here; or a value already sealed for this agent
    (a rollback's, read from another of its versions), kept as it is.
    """
    if state is not None and not is_sealed(state):
        state = sealer.seal(state, STATE, agent_id)
    row = (
        agent_id,
        version,
        kind,
        conversation,
        template,
        state,
        added,
        removed,
        dumps(detail) if detail else None,
        time.time(),
    )
    db.insert(conn, "versions", VERSION_COLUMNS, [row])


def write_version(
    db: Database,
    conn: Conn,
    agent_id: str,
    version: int,
    *,
    kind: str,
    template: str | None,
    change: HistoryChange,
    state: str | None,
    detail: Mapping[str, Any] | None,
    conversation: str,
    sealer: Sealer = PLAIN,
) -> list[tuple[Any, ...]]:
    """Apply one conversation's history change as ``version`` and record the version.

    Its caller takes the one look at the key store (``Sealer.one_look``) for the write.

    Returns:
        The message rows it inserted (their bodies sealed, when ``sealer`` seals).
    """
    added = [
        (
            agent_id,
            conversation,
            position,
            version,
            None,
            message.get("id"),
            message.get("role", ""),
            message_json(agent_id, message),
        )
        for position, message in change.added
    ]
    if sealer.enabled:
        added = [
            (*row[:7], sealer.seal(row[7], MESSAGE, agent_id, conversation, row[2]))
            for row in added
        ]
    _conversations.ensure(conn, agent_id, conversation, version)
    for low, high in change.removed:
        conn.execute(
            """
            UPDATE messages SET removed_in = ?4
             WHERE agent_id = ?1 AND conversation = ?5 AND removed_in IS NULL
               AND position BETWEEN ?2 AND ?3
            """,
            (agent_id, low, high, version, conversation),
        )
    if added:
        db.insert(conn, "messages", MESSAGE_COLUMNS, added)
    insert_version(
        db,
        conn,
        agent_id,
        version,
        kind=kind,
        template=template,
        state=state,
        added=len(added),
        removed=change.removed_count,
        detail=detail,
        conversation=conversation,
        sealer=sealer,
    )
    return added


def write_compaction(
    db: Database,
    conn: Conn,
    agent_id: str,
    version: int,
    compaction: Compaction,
    conversation: str,
    *,
    sealer: Sealer = PLAIN,
) -> None:
    """Write ``compaction`` as ``version``, and index the originals it replaced for recall.

    Where content is sealed, the originals are not indexed: an index holds their
    words in plain text (``search_compacted`` opens and matches them instead).
    """
    write_version(
        db,
        conn,
        agent_id,
        version,
        kind="compaction",
        template=compaction.summarizer,
        change=compaction.change,
        state=None,
        detail={"summary_id": compaction.summary_id, "messages": compaction.messages},
        conversation=conversation,
        sealer=sealer,
    )
    conn.execute(
        """
        INSERT INTO compactions (agent_id, version, summary_id, first_position,
            last_position, messages, summarizer)
        VALUES (?, ?, ?, ?, ?, ?, ?)
        """,
        (
            agent_id,
            version,
            compaction.summary_id,
            compaction.first_position,
            compaction.last_position,
            compaction.messages,
            compaction.summarizer,
        ),
    )
    if sealer.enabled:
        return
    db.index_compacted(
        conn, agent_id, version, compaction.first_position, compaction.last_position, conversation
    )
