"""Memory: the keys and context notes an agent decided to keep, versioned like messages.

One row per value a key held (kind ``'key'``) and per context note (kind
``'note'``, keyed by when it was added), with the versions that added and removed
it. A turn's write marks the active row of each key it changed removed and adds a
row for the new value, so it costs what it writes, never the size of the memory;
version *v* holds the rows with ``added_in <= v`` and no ``removed_in <= v``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from ..engine.seam import Conn
from ..sealing import MEMORY, PLAIN, Sealer
from .versioned import VersionedRows

type Kind = Literal["key", "note"]
KEY: Kind = "key"
NOTE: Kind = "note"


@dataclass(frozen=True, slots=True)
class MemoryNote:
    """One context note an agent added to its memory.

    .. versionadded:: 0.2.0
    """

    at: datetime
    text: str


class MemoryChanges:
    """A turn's staged memory writes, applied in the turn's transaction (a TurnWrite).

    ``changes`` maps ``(kind, key)`` to the new value as JSON text, or to None for
    a deletion; the last change of a key in the turn wins.
    """

    def __init__(self) -> None:
        self.changes: dict[tuple[Kind, str], str | None] = {}

    def write(self, conn: Conn, agent_id: str, version: int, sealer: Sealer) -> None:
        """Apply the changes as part of ``version`` of ``agent_id``."""
        for (kind, key), value in self.changes.items():
            if value is not None and _active_value(conn, agent_id, kind, key, sealer) == value:
                continue  # unchanged: no new row, the old one stays active
            conn.execute(
                """
                UPDATE memory SET removed_in = ?4
                 WHERE agent_id = ?1 AND kind = ?2 AND key = ?3 AND removed_in IS NULL
                """,
                (agent_id, kind, key, version),
            )
            if value is not None:
                conn.execute(
                    "INSERT INTO memory (agent_id, kind, key, added_in, value) VALUES (?,?,?,?,?)",
                    (
                        agent_id,
                        kind,
                        key,
                        version,
                        sealer.seal(value, *_place(agent_id, kind, key)),
                    ),
                )


class MemoryPart(VersionedRows):
    """Memory as a versioned part: rollback, fork, prune and delete."""

    def __init__(self) -> None:
        super().__init__(
            "memory",
            ("kind", "key", "value"),
            sealed="value",
            place=lambda agent_id, row: _place(agent_id, row["kind"], row["key"]),
        )


class MemoryRows:
    """Reads of agents' current memory, on the calling thread's connection.

    Args:
        reading: Opens a read of the database (``Database.reading``), which turns
            I/O errors into StorageError.
    """

    def __init__(
        self, reading: Callable[[], AbstractContextManager[Conn]], sealer: Sealer = PLAIN
    ) -> None:
        self._reading = reading
        self._sealer = sealer

    def value(self, agent_id: str, kind: Kind, key: str) -> str | None:
        """The JSON text ``key`` holds now, or None."""
        with self._reading() as conn:
            return _active_value(conn, agent_id, kind, key, self._sealer)

    def count(self, agent_id: str, kind: Kind) -> int:
        """How many keys (or notes) the agent holds now."""
        with self._reading() as conn:
            return int(
                conn.execute(
                    """
                    SELECT count(*) FROM memory
                     WHERE agent_id = ? AND kind = ? AND removed_in IS NULL
                    """,
                    (agent_id, kind),
                ).get
            )

    def entries(
        self,
        agent_id: str,
        kind: Kind,
        *,
        prefix: str = "",
        limit: int = -1,
        small: int = -1,
    ) -> list[tuple[str, int, str | None]]:
        """``(key, bytes, value)`` of current keys from ``prefix`` on, in key order.

        ``value`` is the JSON text when it is at most ``small`` bytes (all values
        when ``small`` is negative), else None. At most ``limit`` rows (negative:
        all); keys that do not start with ``prefix`` are left out.
        """
        if self._sealer.enabled:  # sizes are the plain values', known once opened
            return [
                (
                    key,
                    len(value.encode()),
                    value if small < 0 or len(value.encode()) <= small else None,
                )
                for key, value in self._opened_entries(agent_id, kind, prefix, limit)
            ]
        with self._reading() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(
                """
                SELECT key, octet_length(value),
                       CASE WHEN ?5 < 0 OR octet_length(value) <= ?5 THEN value END
                  FROM checked_memory
                 WHERE agent_id = ?1 AND kind = ?2 AND removed_in IS NULL
                   AND key >= ?3 AND (CAST(?6 AS TEXT) IS NULL OR key < CAST(?6 AS TEXT))
                   AND substr(key, 1, length(?3)) = ?3
                 ORDER BY key LIMIT CASE WHEN ?4 < 0 THEN 9223372036854775807 ELSE ?4 END
                """,
                (agent_id, kind, prefix, limit, small, _prefix_end(prefix)),
            ).fetchall()
        return rows

    def _opened_entries(
        self, agent_id: str, kind: Kind, prefix: str, limit: int
    ) -> list[tuple[str, str]]:
        with self._reading() as conn:
            rows = conn.execute(
                """
                SELECT key, value FROM checked_memory
                 WHERE agent_id = ?1 AND kind = ?2 AND removed_in IS NULL
                   AND key >= ?3 AND (CAST(?5 AS TEXT) IS NULL OR key < CAST(?5 AS TEXT))
                   AND substr(key, 1, length(?3)) = ?3
                 ORDER BY key LIMIT CASE WHEN ?4 < 0 THEN 9223372036854775807 ELSE ?4 END
                """,
                (agent_id, kind, prefix, limit, _prefix_end(prefix)),
            ).fetchall()
        with self._sealer.one_look():
            return [(key, opened(self._sealer, agent_id, kind, key, value)) for key, value in rows]


def memory_at(
    conn: Conn, agent_id: str, version: int, kind: Kind, sealer: Sealer = PLAIN
) -> list[tuple[str, str]]:
    """``(key, JSON text)`` of every key (or note) ``version`` held, in key order."""
    rows: list[tuple[Any, ...]] = conn.execute(
        """
        SELECT key, value FROM checked_memory
         WHERE agent_id = ?1 AND kind = ?2 AND added_in <= ?3
           AND (removed_in IS NULL OR removed_in > ?3)
         ORDER BY key
        """,
        (agent_id, kind, version),
    ).fetchall()
    if not sealer.enabled:
        return rows
    with sealer.one_look():
        return [(key, opened(sealer, agent_id, kind, key, value)) for key, value in rows]


def note_of(value: str) -> MemoryNote:
    """A note from its stored JSON text."""
    decoded = json.loads(value)
    return MemoryNote(datetime.fromtimestamp(decoded["at"], UTC), str(decoded["text"]))


def opened(sealer: Sealer, agent_id: str, kind: Kind, key: str, value: str) -> str:
    """A memory row's ``value`` of ``key``, opened by ``sealer``."""
    return sealer.open(value, *_place(agent_id, kind, key), table="memory")


def _place(agent_id: str, kind: Kind, key: str) -> tuple[str, str, str, str]:
    """What a memory value is sealed for: its agent, and its kind and key there."""
    return MEMORY, agent_id, "", f"{kind}:{key}"


def _active_value(
    conn: Conn, agent_id: str, kind: Kind, key: str, sealer: Sealer = PLAIN
) -> str | None:
    row = conn.execute(
        """
        SELECT value FROM checked_memory
         WHERE agent_id = ? AND kind = ? AND key = ? AND removed_in IS NULL
        """,
        (agent_id, kind, key),
    ).fetchone()
    if row is None:
        return None
    return opened(sealer, agent_id, kind, key, row[0])


def _prefix_end(prefix: str) -> str | None:
    """The least string greater than every string starting with ``prefix``, if simple.

    SQLite compares text as UTF-8 bytes, which order like code points, so the
    prefix with its last character incremented bounds the index range.
    """
    if not prefix:
        return None
    last = ord(prefix[-1]) + 1
    if last > 0x10FFFF or 0xD800 <= last <= 0xDFFF:
        return None  # no valid next character: the substr test alone decides
    return prefix[:-1] + chr(last)
