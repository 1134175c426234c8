"""Loading a long sealed history in one piece: a sealed copy of a conversation's active
messages at one version.

Where content is sealed, each message is opened on its own as the history loads:
a few microseconds each, which a history of thousands of messages feels. So a
load that opened many messages one by one leaves, in ``history_snapshots``, the
conversation's active messages at the version it loaded, sealed as one value
(bound to the agent, the conversation and that version); the next load opens it
at once, and opens one by one only the messages added since.

A snapshot is only ever a copy: the message rows stay the truth. A load takes
from it the messages not ended since its version (a row is never changed in
place, only ended and added anew, in a later version), and reads the messages
added since from their rows; if that does not make as many messages as the
conversation has active rows (rows it held were pruned since), or it does not
open, the load reads every row, as without it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import pydantic_core

from ..errors import DurableError
from .engine.seam import Conn, Database
from .rows import collector_paused, decode_positioned
from .sealing import SNAPSHOT, Sealer

#: Fewer messages opened one by one than this: a load writes no snapshot.
MIN_OPENED = 200


def taken(
    conn: Conn, sealer: Sealer, agent_id: str, conversation: str
) -> tuple[list[float], list[dict[str, Any]], int] | None:
    """The conversation's active ``(positions, messages)``, read through its snapshot,
    and how many messages were opened one by one (added since it); None if it has
    none that serves (then read every row)."""
    row = conn.execute(
        "SELECT version, messages FROM history_snapshots WHERE agent_id = ? AND conversation = ?",
        (agent_id, conversation),
    ).fetchone()
    if row is None:
        return None
    version = int(row[0])
    try:
        frame = sealer.open_bytes(
            bytes(row[1]), SNAPSHOT, agent_id, conversation, version, table="history_snapshots"
        )
        held = list(zip(*_unframed(frame), strict=True))
    except (DurableError, struct.error, ValueError):
        return None  # damaged, or its key erased: the rows say it all
    ended = {
        position
        for (position,) in conn.execute(
            """
            SELECT position FROM messages
             WHERE agent_id = ? AND conversation = ? AND removed_in > ? AND added_in <= ?
            """,
            (agent_id, conversation, version, version),
        )
    }
    positions, messages = decode_positioned(
        sealer.open_messages(
            conn.execute(
                """
                SELECT position, body FROM checked_messages
                 WHERE agent_id = ? AND conversation = ? AND removed_in IS NULL
                   AND added_in > ? ORDER BY position
                """,
                (agent_id, conversation, version),
            ),
            agent_id,
            conversation,
        )
    )
    later = list(zip(positions, messages, strict=True))
    kept = [(p, m) for p, m in held if p not in ended] if ended else held
    merged = sorted(kept + later, key=_first) if later else kept
    active = conn.execute(
        """
        SELECT count(*) FROM messages
         WHERE agent_id = ? AND conversation = ? AND removed_in IS NULL
        """,
        (agent_id, conversation),
    ).fetchone()[0]
    if len(merged) != active:  # rows gone that it held (pruned): the rows say it all
        return None
    return [p for p, _ in merged], [m for _, m in merged], len(later)


def keep(
    db: Database,
    sealer: Sealer,
    agent_id: str,
    conversation: str,
    version: int,
    positions: Sequence[float],
    messages: Sequence[dict[str, Any]],
) -> None:
    """Leave the conversation's active messages at ``version`` as its snapshot (unless
    a newer one is there). A cache: one that cannot be made or written is let go."""
    try:
        frame = _framed(positions, messages)
    except ValueError:  # a text JSON holds and pydantic-core does not write
        return
    sealed = sealer.seal_bytes(frame, SNAPSHOT, agent_id, conversation, version)
    try:
        with db.writing() as conn:
            conn.execute(
                """
                INSERT INTO history_snapshots (agent_id, conversation, version, messages)
                SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (
                    SELECT 1 FROM agents WHERE agent_id = ?1 AND version = ?3)
                ON CONFLICT (agent_id, conversation) DO UPDATE
                   SET version = excluded.version, messages = excluded.messages
                 WHERE excluded.version >= history_snapshots.version
                """,
                (agent_id, conversation, version, sealed),
            )
    except DurableError:
        pass  # busy: the next load tries again


def _first(item: tuple[float, object]) -> float:
    return item[0]


def _framed(positions: Sequence[float], messages: Sequence[dict[str, Any]]) -> bytes:
    """The count, the positions, then the messages as one JSON array: one parse loads
    them all (a message's own JSON text is one parse each)."""
    head = struct.pack(f"<I{len(positions)}d", len(positions), *positions)
    return head + pydantic_core.to_json(list(messages))


def _unframed(frame: bytes) -> tuple[tuple[float, ...], list[dict[str, Any]]]:
    (n,) = struct.unpack_from("<I", frame)
    positions = struct.unpack_from(f"<{n}d", frame, 4)
    with collector_paused():
        messages = pydantic_core.from_json(frame[4 + 8 * n :])
    if not isinstance(messages, list) or len(messages) != n:
        msg = "a snapshot's messages do not match its positions"
        raise ValueError(msg)
    return positions, messages
