"""Copy a whole database to a new one: SQLite to PostgreSQL, back, or to its own kind.

The source is read as one snapshot (one read transaction) and never written; the
target must hold no agent and no journal yet, and gets everything in one write
transaction, so a copy that fails leaves it as it was. Every table of agent data
is copied row for row (``TABLES``, in an order that satisfies their references);
the full-text index of compacted messages is rebuilt on the target from the
copied rows, since each backend indexes in its own way. Before the target
commits, each table is read back and compared with the source: the counts and
the rows themselves must match. The agents' SQL tables travel as their log
(``workspace_log``): each machine that uses the target builds its workspace
files from it (``workspace/cache.py``), in a cache of the target's own.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from ..errors import DurableError
from .engine.seam import Conn, Database

#: The tables of agent data, parents before children. Adding a table is one line.
TABLES: tuple[str, ...] = (
    "agents",
    "versions",
    "conversations",
    "conversation_fields",
    "messages",
    "handoffs",
    "workflow_steps",
    "compactions",
    "retention",
    "memory",
    "workspace_log",
    "alarms",
    "approvals",
    "subjects",
    "erasures",
    "encryption",
    "runner_status",
)

_BATCH = 1000


@dataclass(frozen=True)
class CopyResult:
    """What :func:`copy_store` copied: rows per table, and the compacted texts indexed."""

    rows: dict[str, int]
    indexed: int


class HasEngine(Protocol):
    """What :func:`copy_store` copies from and to: a Store, or anything that holds an engine."""

    @property
    def engine(self) -> Database: ...


def copy_store(source: HasEngine, target: HasEngine) -> CopyResult:
    """Copy every agent (versions, journals, memory, SQL tables, alarms, events,
    approvals) and the runners' status reports to ``target``.

    Raises:
        DurableError: ``target`` already holds agents or journals, or lacks a
            table of a part that ``source`` has rows of (a part the target's
            backend does not carry); or a table read back differs from the
            source's. The target is left as it was.
    """
    source_db, target_db = source.engine, target.engine
    with (
        source_db.unhurried(),
        target_db.unhurried(),
        source_db.reading() as read,
        target_db.writing() as write,
    ):
        source_columns = source_db.columns(read)
        target_columns = target_db.columns(write)
        _refuse_non_empty(write, target_db)
        copied: dict[str, int] = {}
        for table in TABLES:
            if table not in source_columns:
                continue
            count = _count(read, table)
            if table not in target_columns:
                if count:
                    msg = (
                        f"{source_db.location} holds {count:,} rows of {table}, a part the "
                        f"{target_db.kind} backend of {target_db.location} does not carry "
                        "yet; copy it to an SQLite file instead"
                    )
                    raise DurableError(msg)
                continue
            columns = [c for c in target_columns[table] if c in source_columns[table]]
            copied[table] = _copy_table(read, write, target_db, table, columns)
            _compare(read, write, table, columns, source_db, target_db)
        indexed = _index_compacted(write, target_db)
    return CopyResult(copied, indexed)


def _refuse_non_empty(conn: Conn, db: Database) -> None:
    agents = _count(conn, "agents")
    journals = _count(conn, "workflow_steps")
    if agents or journals:
        msg = (
            f"{db.location} already holds {agents:,} agents and {journals:,} journal steps; "
            "copy into a new, empty database (nothing was written)"
        )
        raise DurableError(msg)


def _count(conn: Conn, table: str) -> int:
    return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])


#: Tables without a checksum: what they hold authenticates itself.
_UNCHECKED = frozenset({"encryption"})


def _select(table: str, columns: Sequence[str]) -> str:
    names = ", ".join(columns)
    source = table if table in _UNCHECKED else f"checked_{table}"
    return f"SELECT {names} FROM {source} ORDER BY {names}"


def _copy_table(read: Conn, write: Conn, db: Database, table: str, columns: Sequence[str]) -> int:
    rows = read.execute(_select(table, columns)).fetchall()
    if table == "encryption" and rows:
        # The copy's rows are sealed with the source's keys: its check value too.
        write.execute("DELETE FROM encryption")
    for start in range(0, len(rows), _BATCH):
        db.insert(write, table, columns, [tuple(row) for row in rows[start : start + _BATCH]])
    return len(rows)


def _compare(
    read: Conn, write: Conn, table: str, columns: Sequence[str], source: Database, target: Database
) -> None:
    """Refuse the copy unless ``table`` reads back from the target as from the source."""
    wanted = sorted(map(_comparable, read.execute(_select(table, columns)).fetchall()))
    found = sorted(map(_comparable, write.execute(_select(table, columns)).fetchall()))
    if wanted != found:
        differ = sum(1 for a, b in zip(wanted, found, strict=False) if a != b)
        msg = (
            f"{table} reads back differently from {target.location} than from "
            f"{source.location} ({len(wanted):,} rows copied, {len(found):,} read back, "
            f"{differ:,} different); nothing was written"
        )
        raise DurableError(msg)


def _comparable(row: Sequence[Any]) -> tuple[Any, ...]:
    """A row with values both databases return alike (an integral REAL as an int,
    a bool as an int, bytes of a memoryview), sortable with None first."""
    values = []
    for value in row:
        if isinstance(value, bool):
            value = int(value)
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            value = int(value)
        elif isinstance(value, memoryview):
            value = bytes(value)
        values.append((value is not None, type(value).__name__, value))
    return tuple(values)


def _index_compacted(conn: Conn, db: Database) -> int:
    """Index the copied compaction originals for recall, as each compaction did; none
    where content is sealed (an index of plain words would give it away)."""
    if conn.execute("SELECT 1 FROM encryption").fetchone() is not None:
        return 0
    compactions = conn.execute(
        """
        SELECT DISTINCT c.agent_id, c.version, c.summary_id, c.first_position,
               c.last_position, c.messages, c.summarizer, m.conversation
          FROM compactions AS c
          JOIN messages AS m
            ON m.agent_id = c.agent_id AND m.removed_in = c.version
           AND m.position BETWEEN c.first_position AND c.last_position
        """
    ).fetchall()
    for agent_id, version, _, first, last, _, _, conversation in compactions:
        db.index_compacted(conn, agent_id, version, first, last, conversation)
    return _count(conn, "compacted_text")
