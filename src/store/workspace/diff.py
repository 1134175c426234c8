"""What changed in an agent's SQL tables between two versions, row by row.

When no schema change lies between the two versions, the log's changesets
between them, combined into one, say exactly which rows were inserted, deleted
or updated (``apsw.Changeset.iter``): the cost is what changed, never the size
of the tables. The column names come from the schema, rebuilt from the log's DDL
steps alone. Across a schema change (or a snapshot: fork, prune, a rollback over
DDL) both versions' tables are rebuilt in memory and compared whole.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

import apsw

from ..engine.seam import Conn
from ..sealing import PLAIN, Sealer
from .log import Step, apply, combine, log, replayed, schema_steps
from .schema import quote, tables
from .workspace import jsonable


@dataclass(frozen=True, slots=True)
class RowChange:
    """One row added, removed or changed; values as JSON (blobs as ``{"blob_hex": ...}``).

    ``before`` and ``after`` map column names to values: the whole row when it
    was added or removed; for a change, the key columns and those that changed.

    .. versionadded:: 0.2.0
    """

    op: Literal["added", "removed", "changed"]
    before: dict[str, Any] | None
    after: dict[str, Any] | None


@dataclass(frozen=True, slots=True)
class TableChange:
    """The rows of one table that differ between two versions (``rows``: the first
    ``limit``; the counts are of all). ``schema`` says the table was created,
    dropped or altered in between.

    .. versionadded:: 0.2.0
    """

    table: str
    added: int = 0
    removed: int = 0
    changed: int = 0
    rows: list[RowChange] = field(default_factory=list)
    schema: str | None = None


def table_changes(
    conn: Conn, agent_id: str, low: int, high: int, *, limit: int | None, sealer: Sealer = PLAIN
) -> list[TableChange]:
    """What the agent's tables gained and lost from version ``low`` to ``high`` (either order).

    Args:
        conn: A read transaction on the main database.
        limit: The most rows listed per table (None: all).
    """
    first, last = sorted((low, high))
    steps = log(conn, agent_id, first, last, sealer)
    if not steps:
        return []
    if all(ddl is None for ddl, _ in steps):
        changeset = combine(cs for _, cs in steps if cs)
        if low > high:
            changeset = apsw.Changeset.invert(changeset) if changeset else changeset
        columns = _columns(schema_steps(conn, agent_id, last, sealer))
        return _from_changeset(changeset, columns, limit)
    before = replayed(log(conn, agent_id, 0, low, sealer))
    after = replayed(log(conn, agent_id, 0, high, sealer))
    try:
        return _compared(before, after, limit)
    finally:
        before.close()
        after.close()


def _columns(steps: list[Step]) -> dict[str, list[str]]:
    """Each table's columns, from DDL ``steps`` alone (no rows replayed)."""
    mem = apsw.Connection(":memory:")
    try:
        apply(mem, steps)
        return {t.name: [c.name for c in t.columns if not c.hidden] for t in tables(mem)}
    finally:
        mem.close()


def _from_changeset(
    changeset: bytes, columns: dict[str, list[str]], limit: int | None
) -> list[TableChange]:
    found: dict[str, dict[str, Any]] = {}
    if not changeset:
        return []
    for change in apsw.Changeset.iter(changeset):
        names = columns.get(change.name) or [f"column {i + 1}" for i in range(change.column_count)]
        entry = found.setdefault(change.name, {"added": 0, "removed": 0, "changed": 0, "rows": []})
        old = _row(names, change.old) if change.old is not None else None
        new = _row(names, change.new) if change.new is not None else None
        if change.op == "INSERT":
            op: Literal["added", "removed", "changed"] = "added"
        elif change.op == "DELETE":
            op = "removed"
        else:
            op = "changed"
            # An update holds the key and the changed columns; the rest are no_change.
            old = {k: v for k, v in (old or {}).items() if v is not _SKIP}
            new = {k: old[k] if v is _SKIP else v for k, v in (new or {}).items() if k in old}
        entry[op] += 1
        if limit is None or len(entry["rows"]) < limit:
            entry["rows"].append(RowChange(op, _clean(old), _clean(new)))
    return [TableChange(name, **entry) for name, entry in sorted(found.items())]


_SKIP = object()


def _row(names: list[str], values: tuple[Any, ...]) -> dict[str, Any]:
    return {
        name: _SKIP if value is apsw.no_change else value
        for name, value in zip(names, values, strict=False)
    }


def _clean(row: dict[str, Any] | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {k: jsonable(v) for k, v in row.items() if v is not _SKIP}


def _compared(
    before: apsw.Connection, after: apsw.Connection, limit: int | None
) -> list[TableChange]:
    """Every table of either database, whole rows compared (as multisets)."""
    old_tables = {t.name: t for t in tables(before)}
    new_tables = {t.name: t for t in tables(after)}
    changes = []
    for name in sorted(old_tables.keys() | new_tables.keys()):
        old_cols = _names(old_tables.get(name))
        new_cols = _names(new_tables.get(name))
        schema = None
        if name not in old_tables:
            schema = "created"
        elif name not in new_tables:
            schema = "dropped"
        elif old_cols != new_cols:
            schema = "altered"
        old_rows = Counter(_rows(before, name, old_cols))
        new_rows = Counter(_rows(after, name, new_cols))
        removed = list((old_rows - new_rows).elements())
        added = list((new_rows - old_rows).elements())
        if not (added or removed or schema):
            continue
        shown = [RowChange("removed", _as(old_cols, r), None) for r in removed]
        shown += [RowChange("added", None, _as(new_cols, r)) for r in added]
        changes.append(
            TableChange(
                name,
                added=len(added),
                removed=len(removed),
                rows=shown if limit is None else shown[:limit],
                schema=schema,
            )
        )
    return changes


def _names(table: Any) -> list[str]:
    return [] if table is None else [c.name for c in table.columns if not c.hidden]


def _rows(conn: apsw.Connection, table: str, columns: list[str]) -> list[tuple[Any, ...]]:
    if not columns:
        return []
    names = ", ".join(quote(c) for c in columns)
    return [tuple(row) for row in conn.execute(f"SELECT {names} FROM {quote(table)}")]


def _as(columns: list[str], row: tuple[Any, ...]) -> dict[str, Any]:
    return {c: jsonable(v) for c, v in zip(columns, row, strict=True)}
