"""Loading a long sealed history in one piece: a sealed copy of a conversation's active
messages at one version.

Where content is sealed, each message is opened on its own as the history loads:
a few microseconds each, which a history of thousands of messages feels. So a
load that opened many messages one by one leaves, in ``history_snapshots``, the
conversation's active messages at the version it loaded, sealed as one value
(bound to the agent, the conversation and that version); the next load opens it
at once, and opens one by one only the messages added since.

A snapshot is only ever a copy: the message rows stay the truth. A load takes
from it exactly the messages still active that were added by its version or
before (such a message was active then, so the snapshot holds it); any other
active message is read from its row. If the snapshot lacks one it should hold,
or does not open, the load reads every row, as without it. Nothing that changes
the rows needs to touch it: a row is never changed in place, only ended and
added anew, in a later version.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence

from ..errors import DurableError
from .engine.seam import Conn, Database
from .sealing import SNAPSHOT, Sealer

#: Fewer messages opened one by one than this: a load writes no snapshot.
MIN_OPENED = 200


def taken(
    conn: Conn, sealer: Sealer, agent_id: str, conversation: str
) -> tuple[list[float], list[bytes], int] | None:
    """The conversation's active ``(positions, bodies)``, opened, read through its
    snapshot, and how many were opened one by one (added since it); None if it has
    none that serves (then read every row)."""
    row = conn.execute(
        "SELECT version, messages FROM history_snapshots WHERE agent_id = ? AND conversation = ?",
        (agent_id, conversation),
    ).fetchone()
    if row is None:
        return None
    version, sealed = int(row[0]), bytes(row[1])
    try:
        frame = sealer.open_bytes(
            sealed, SNAPSHOT, agent_id, conversation, version, table="history_snapshots"
        )
        held = dict(zip(*_unframed(frame), strict=True))
    except (DurableError, struct.error, ValueError):
        return None  # damaged, or its key erased: the rows say it all
    active = conn.execute(
        """
        SELECT position, added_in FROM messages
         WHERE agent_id = ? AND conversation = ? AND removed_in IS NULL ORDER BY position
        """,
        (agent_id, conversation),
    ).fetchall()
    later = dict(
        sealer.open_messages(
            conn.execute(
                """
                SELECT position, body FROM checked_messages
                 WHERE agent_id = ? AND conversation = ? AND removed_in IS NULL
                   AND added_in > ?
                """,
                (agent_id, conversation, version),
            ),
            agent_id,
            conversation,
        )
    )
    positions: list[float] = []
    bodies: list[bytes] = []
    for position, added_in in active:
        body = later.get(position) if added_in > version else held.get(position)
        if body is None:
            return None
        positions.append(position)
        bodies.append(body if isinstance(body, bytes) else body.encode())
    return positions, bodies, len(later)


def keep(
    db: Database,
    sealer: Sealer,
    agent_id: str,
    conversation: str,
    version: int,
    positions: Sequence[float],
    bodies: Sequence[bytes],
) -> None:
    """Leave the conversation's active messages at ``version`` as its snapshot (unless
    a newer one is there). A cache: a write that fails is let go."""
    frame = _framed(positions, bodies)
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
                 WHERE excluded.version > history_snapshots.version
                """,
                (agent_id, conversation, version, sealed),
            )
    except DurableError:
        pass  # busy, or read-only: the next load tries again


def _framed(positions: Sequence[float], bodies: Sequence[bytes]) -> bytes:
    """Count, positions, lengths, then the bodies, back to back."""
    n = len(positions)
    head = struct.pack(f"<I{n}d{n}I", n, *positions, *(len(body) for body in bodies))
    return head + b"".join(bodies)


def _unframed(frame: bytes) -> tuple[tuple[float, ...], list[bytes]]:
    (n,) = struct.unpack_from("<I", frame)
    positions = struct.unpack_from(f"<{n}d", frame, 4)
    lengths = struct.unpack_from(f"<{n}I", frame, 4 + 8 * n)
    start = 4 + 12 * n
    ends = list(itertools.accumulate(lengths, initial=start))
    if ends[-1] != len(frame):
        msg = "a snapshot's lengths do not add up"
        raise ValueError(msg)
    return positions, [frame[a:b] for a, b in itertools.pairwise(ends)]
