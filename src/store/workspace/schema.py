"""The tables of an SQL workspace: what the developer declared, what a workspace holds.

``__sql_schema__`` is read once, at class definition (:func:`parse_declaration`),
and migrated forward at each turn (:func:`plan_migration`): tables, columns and
indexes may be added, never changed. Every table needs a primary key, because
versions record row changes by primary key (SQLite sessions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import apsw

from ...errors import SQLWorkspaceError


@dataclass(frozen=True)
class Column:
    """One column of a workspace table."""

    name: str
    type: str
    notnull: bool
    default: str | None
    pk: int
    hidden: int


@dataclass(frozen=True)
class TableInfo:
    """A workspace table: its name and columns, in order."""

    name: str
    columns: tuple[Column, ...]

    def describe(self) -> str:
        """``name(col TYPE, ...)``, with PRIMARY KEY marked, for the model."""
        parts = []
        for column in self.columns:
            text = f"{column.name} {column.type}".strip()
            if column.pk:
                text += " PRIMARY KEY"
            parts.append(text)
        return f"{self.name}({', '.join(parts)})"


@dataclass(frozen=True)
class Declaration:
    """The tables and indexes a developer declared, as SQLite reads them."""

    text: str
    tables: Mapping[str, TableInfo] = field(default_factory=dict)
    creates: Mapping[str, str] = field(default_factory=dict)  # table -> CREATE TABLE
    indexes: Mapping[str, str] = field(default_factory=dict)  # index -> CREATE INDEX


def parse_declaration(text: str, owner: str) -> Declaration:
    """Read a ``__sql_schema__``: CREATE TABLE and CREATE INDEX statements only.

    Raises:
        SQLWorkspaceError: It is not valid SQL, holds other statements, or has a
            table without a PRIMARY KEY.
    """
    if not text.strip():
        return Declaration(text)
    scratch = apsw.Connection(":memory:")
    allowed = {
        apsw.SQLITE_CREATE_TABLE,
        apsw.SQLITE_CREATE_INDEX,
        apsw.SQLITE_INSERT,
        apsw.SQLITE_UPDATE,
        apsw.SQLITE_READ,
        apsw.SQLITE_FUNCTION,
        apsw.SQLITE_REINDEX,
    }

    def authorize(code: int, a1: Any, a2: Any, db: Any, _: Any) -> int:
        return apsw.SQLITE_OK if code in allowed and db in (None, "main") else apsw.SQLITE_DENY

    scratch.authorizer = authorize
    try:
        scratch.execute(text)
    except apsw.Error as e:
        msg = (
            f"{owner}.__sql_schema__ is not a valid declaration: {e}. Declare the "
            "agent's tables with CREATE TABLE (and CREATE INDEX) statements only."
        )
        raise SQLWorkspaceError(msg) from e
    finally:
        scratch.authorizer = None
    found = {t.name: t for t in tables(scratch)}
    for table in found.values():
        if not any(column.pk for column in table.columns):
            msg = (
                f"{owner}.__sql_schema__: table {table.name} has no PRIMARY KEY. Every "
                "workspace table needs one (e.g. id INTEGER PRIMARY KEY): versions "
                "record row changes by primary key."
            )
            raise SQLWorkspaceError(msg)
    creates = {
        str(name): str(sql)
        for name, sql in scratch.execute(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'table'"
        )
    }
    indexes = {
        str(name): str(sql)
        for name, sql in scratch.execute(
            "SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND sql IS NOT NULL"
        )
    }
    scratch.close()
    return Declaration(text, found, creates, indexes)


def tables(conn: apsw.Connection) -> list[TableInfo]:
    """The tables of a workspace, by name."""
    names = conn.execute(
        "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%' "
        "ORDER BY name"
    ).fetchall()
    found = []
    for (name,) in names:
        columns = tuple(
            Column(n, t, bool(nn), d, pk, hidden)
            for _, n, t, nn, d, pk, hidden in conn.execute(
                "SELECT * FROM pragma_table_xinfo(?)", (name,)
            )
        )
        found.append(TableInfo(str(name), columns))
    return found


def quote(name: str) -> str:
    """``name`` as an SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def plan_migration(conn: apsw.Connection, declaration: Declaration, owner: str) -> list[str]:
    """The DDL that brings a workspace up to its declaration: new tables, columns, indexes.

    Raises:
        SQLWorkspaceError: The declaration changed an existing column, which is not
            a forward migration.
    """
    have = {t.name: t for t in tables(conn)}
    plan = []
    for name, table in declaration.tables.items():
        existing = have.get(name)
        if existing is None:
            plan.append(declaration.creates[name])
            continue
        current = {c.name: c for c in existing.columns}
        for column in table.columns:
            old = current.get(column.name)
            if old is None:
                plan.append(_add_column(name, column, owner))
            elif (old.type.upper(), bool(old.pk)) != (column.type.upper(), bool(column.pk)):
                msg = (
                    f"{owner}.__sql_schema__ changes column {name}.{column.name} "
                    f"({old.type or 'no type'}{' PRIMARY KEY' if old.pk else ''} -> "
                    f"{column.type or 'no type'}{' PRIMARY KEY' if column.pk else ''}). "
                    "Declarations may only grow: add tables, columns and indexes."
                )
                raise SQLWorkspaceError(msg)
    present = {
        name for (name,) in conn.execute("SELECT name FROM sqlite_schema WHERE type = 'index'")
    }
    plan.extend(sql for name, sql in declaration.indexes.items() if name not in present)
    return plan


def _add_column(table: str, column: Column, owner: str) -> str:
    if column.pk or column.hidden:
        msg = (
            f"{owner}.__sql_schema__ adds column {table}.{column.name}, which is part of "
            "the primary key or generated; ALTER TABLE ADD COLUMN cannot add it. Declare "
            "a new table instead."
        )
        raise SQLWorkspaceError(msg)
    text = f"ALTER TABLE {quote(table)} ADD COLUMN {quote(column.name)} {column.type}"
    if column.notnull:
        text += " NOT NULL"
    if column.default is not None:
        text += f" DEFAULT {column.default}"
    return text
