"""Row checksums: a CRC-32 of every row of ours, kept by our connections and checked on read.

SQLite keeps no checksum of what it stores, so a flipped byte inside a stored
value that still reads as valid text would go unseen. Every table of ours
(:data:`PAYLOAD`) ends with a ``crc`` column: the CRC-32 of the row's other
values (:func:`row_crc`), the columns that say whose row it is and where it
belongs (agent, conversation, position, versions) included, so a damaged key
cannot move a valid row into another agent's history.

The writes every turn makes give ``crc`` themselves, computed in Python as the
row is bound (:meth:`TableShape.checksummed`, the SQLite engine's ``insert``,
``start`` and ``advance``): the turn's messages and version, its handoff, and
the agent's row, which the start and the UPDATE find by every value the Store
last checked or wrote in it (its crc too), so that a row changed since is never
written over unchecked. Every other write is covered by our connections without
the shared SQL naming ``crc`` (:func:`install`):

- a TEMP trigger per table computes ``crc`` after each INSERT that gives none,
  and after each UPDATE of the other columns that leaves ``crc`` as it was
  carries the row's old discrepancy over to the new values
  (:func:`updated_crc`), so an update never blesses a damaged row;
- a TEMP view per table, ``checked_<table>``, reads the table with its payload
  column (:data:`PAYLOAD`) computed by :func:`checked`, which raises
  :class:`~effectful_durable.DamagedRowError` for a row whose values no longer
  match its checksum. The check runs for each row a query returns that selects
  the payload column, never in a WHERE clause, so a damaged row of another
  agent that a scan passes over refuses nothing. Reads that return a row's
  values go through these views and select the payload column; statements
  that only filter, count or delete use the tables.

A read filters rows before the view checks them, so a damaged column it filters
on could leave a row out rather than refuse it. The latest version's rows are
found through indexes (``messages_active``, ``memory_active``...), which hold
their keys apart from the row; reads and copies of an earlier version, which
choose rows by their version marks, first check every row they choose from
(``Database.check_rows``). Loading an agent checks in Python, without a call
from SQLite per row: its row, the version its row names as holding its state
(``agents.state_in``: no walk back through the versions that left the state
unchanged, each of which would need its check), and each active message of the
conversation (:func:`active_messages`).

These objects live in each connection's TEMP schema, not in the file: any other
SQLite program reads and writes the tables as it likes. A row it changes keeps
its old checksum and is refused when read (a row it inserts has none, and is
refused too), narrowly: that row, never the whole file. A file's pages may be
checkpointed or rewritten by any program; ``PRAGMA integrity_check`` covers the
b-trees, and :func:`damaged_rows` lists every row that fails its checksum.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from ....errors import DamagedRowError

#: Our tables, each with the column its ``checked_`` view checks the row in:
#: one that every read returning the row's values selects, and no WHERE clause names.
PAYLOAD: dict[str, str] = {
    "agents": "version",
    "versions": "state",
    "messages": "body",
    "handoffs": "arguments",
    "workflow_steps": "arguments",
    "compactions": "messages",
    "conversations": "created_at",
    "conversation_fields": "state",
    "retention": "state",
    "memory": "value",
    "workspace_log": "changeset",
    "alarms": "action",
    "approvals": "arguments",
    "runner_status": "report",
    "subjects": "subject",
    "erasures": "receipt",
}

# The Python type SQLite returns for a value of a STRICT column of each declared
# type, and how a value of another type is made one.
_PYTHON: dict[str, type] = {"TEXT": str, "INTEGER": int, "REAL": float, "BLOB": bytes}
_CONVERT: dict[str, Callable[[Any], Any]] = {
    "TEXT": str,
    "INTEGER": int,
    "REAL": float,
    "BLOB": bytes,
}

#: The columns that say where a row belongs, named in a DamagedRowError.
_AGENT = ("agent_id",)
_CONVERSATION = ("conversation",)
_VERSION = ("version", "added_in", "created_in", "suspended_in", "kept_from", "base_version")


def row_crc(table: str, *values: Any) -> int:
    """The checksum of a row of ``table`` holding ``values`` (its columns but ``crc``, in order).

    Computed on the values as SQLite returns them, at C speed: their text joined
    by a separator, as UTF-8 (a float's text is the shortest that reads back the
    same; a blob's is its ``repr``).
    """
    return zlib.crc32((_FORMATS[len(values)] % values).encode(), _SEEDS[table])


_SEEDS: dict[str, int] = {table: zlib.crc32(table.encode()) for table in PAYLOAD}
# "%s\x1f%s...": one str() of each value, joined; a third faster than join(map(str, ...)).
_FORMATS: list[str] = ["\x1f".join(["%s"] * n) for n in range(33)]


#: The text :func:`row_crc` gives an active message's columns between its
#: conversation and its body, as SQLite writes it (for :func:`active_messages`).
MESSAGE_HEAD = (
    "position || x'1f' || added_in || x'1f' || 'None' || x'1f' || message_id || x'1f'"
    " || role || x'1f'"
)


def active_messages(
    rows: Iterable[tuple[float, bytes, bytes, int | None]],
    path: str,
    agent_id: str,
    conversation: str,
    exact: Callable[[str, str, float], None],
) -> Iterator[tuple[float, bytes]]:
    """``(position, body)`` of ``rows``, active messages of one conversation, each checked.

    ``rows`` are ``(position, head, body, crc)``: ``head`` is the text of the
    row's columns between its conversation and its body as SQLite writes it
    (:data:`MESSAGE_HEAD`), ``body`` its UTF-8 bytes. The check ``checked_messages``
    makes, computed here without a call from SQLite per row, and with the agent
    and conversation the query asked for: the row's checksum is of its values'
    text as Python writes them, which is SQLite's text but for some positions
    (``1e+16``, or a fraction that takes 16 digits); a row whose quick check fails
    is checked again as the view checks it (``exact``), which raises if it fails.

    Raises:
        DamagedRowError: A row fails its checksum.
    """
    crc32 = zlib.crc32
    start = crc32(f"{agent_id}\x1f{conversation}\x1f".encode(), _SEEDS["messages"])
    for position, head, body, crc in rows:
        if crc != crc32(body, crc32(head, start)):
            exact(agent_id, conversation, position)
        yield position, body


def updated_crc(table: str, width: int, old_crc: int | None, *values: Any) -> int | None:
    """The checksum of a row updated from ``values[:width]`` to ``values[width:]``.

    The old row's discrepancy (zero when it was sound) carries over, so a row
    that was damaged, or changed by another program, stays refused after our
    update; a row without a checksum keeps none.
    """
    if old_crc is None:
        return None
    old = row_crc(table, *values[:width])
    return row_crc(table, *values[width:]) ^ old ^ old_crc


@dataclass(frozen=True)
class TableShape:
    """A table of ours: its columns (``crc`` left out), which of them hold text, the
    WHERE clause that finds the NEW row in a trigger (its rowid, or its key), and
    each column's declared type."""

    table: str
    columns: tuple[str, ...]
    text: tuple[bool, ...]
    new_row: str
    types: tuple[str, ...]

    @functools.cached_property
    def insert(self) -> str:
        """The INSERT of a whole row with its checksum: the parameters of :meth:`checksummed`."""
        names = ", ".join((*self.columns, "crc"))
        marks = ", ".join("?" * (len(self.columns) + 1))
        return f"INSERT INTO main.{self.table} ({names}) VALUES ({marks})"

    def checksummed(self, row: Sequence[Any]) -> list[Any]:
        """``row`` (a value of each column, in order) as SQLite stores it, its crc last.

        Each value becomes the type its column keeps (a STRICT table converts an
        integer bound to a REAL column, say), so that the checksum is computed on
        the values as SQLite returns them, as the insert trigger would compute it.
        """
        values = list(row)
        for i, kind, convert in self._conversions:
            value = values[i]
            if value is not None and type(value) is not kind:
                values[i] = convert(value)
        values.append(row_crc(self.table, *values))
        return values

    @functools.cached_property
    def _conversions(self) -> tuple[tuple[int, type, Callable[[Any], Any]], ...]:
        """For each column: its index, the type SQLite returns, and how to make one."""
        return tuple(
            (i, _PYTHON[kind], _CONVERT[kind])
            for i, kind in enumerate(self.types)
            if kind in _PYTHON
        )

    def where(self, values: tuple[Any, ...]) -> tuple[str | None, str | None, int | None]:
        """The agent, conversation and version a row holding ``values`` claims to belong to."""

        def first(names: tuple[str, ...], kind: type) -> Any:
            found = (values[self.columns.index(n)] for n in names if n in self.columns)
            value = next(found, None)
            return value if isinstance(value, kind) else None

        return first(_AGENT, str), first(_CONVERSATION, str), first(_VERSION, int)


def shapes(conn: apsw.Connection) -> dict[str, TableShape]:
    """The shape of each of our tables in ``conn``'s main database that carries a ``crc``."""
    found: dict[str, TableShape] = {}
    for table in PAYLOAD:
        info = conn.execute("SELECT name, type, pk FROM pragma_table_info(?)", (table,)).fetchall()
        if not info or info[-1][0] != "crc":
            continue
        columns = tuple(str(name) for name, _, _ in info[:-1])
        types = tuple(str(kind) for _, kind, _ in info[:-1])
        text = tuple(kind == "TEXT" for kind in types)
        without_rowid = conn.execute(
            "SELECT wr FROM pragma_table_list WHERE schema = 'main' AND name = ?", (table,)
        ).get
        key = sorted((pk, str(name)) for name, _, pk in info if pk)
        new_row = (
            " AND ".join(f"{name} = NEW.{name}" for _, name in key)
            if without_rowid
            else "rowid = NEW.rowid"
        )
        found[table] = TableShape(table, columns, text, new_row, types)
    return found


def register(conn: apsw.Connection) -> None:
    """Give ``conn`` the functions that compute checksums (for the triggers and migrations)."""
    functions: dict[str, Callable[..., Any]] = {"row_crc": row_crc, "updated_crc": updated_crc}
    for name, function in functions.items():
        conn.create_scalar_function(name, function, -1, deterministic=True)


def install(conn: apsw.Connection, path: str) -> None:
    """Create ``conn``'s TEMP triggers and ``checked_`` views over the tables that carry a crc.

    Call after :func:`register`, once the schema is current; ``path`` is named in
    the errors of the views.
    """
    found = shapes(conn)
    conn.create_scalar_function("checked", _checker(path, found), -1, deterministic=True)
    statements = []
    for shape in found.values():
        table, columns, key = shape.table, shape.columns, shape.new_row
        new = ", ".join(f"NEW.{c}" for c in columns)
        old = ", ".join(f"OLD.{c}" for c in columns)
        statements.append(f"""
            CREATE TEMP TRIGGER {table}_crc_insert AFTER INSERT ON main.{table}
            WHEN NEW.crc IS NULL
            BEGIN
                UPDATE main.{table} SET crc = row_crc('{table}', {new}) WHERE {key};
            END;
            CREATE TEMP TRIGGER {table}_crc_update
            AFTER UPDATE OF {", ".join(columns)} ON main.{table}
            WHEN NEW.crc IS OLD.crc
            BEGIN
                UPDATE main.{table}
                   SET crc = updated_crc('{table}', {len(columns)}, OLD.crc, {old}, {new})
                 WHERE {key};
            END;""")
        payload = columns.index(PAYLOAD[table])
        shown = ", ".join(
            f"checked('{table}', {payload}, crc, {', '.join(columns)}) AS {c}"
            if c == PAYLOAD[table]
            else c
            for c in columns
        )
        statements.append(
            f"CREATE TEMP VIEW checked_{table} AS SELECT {shown}, crc FROM main.{table};"
        )
    conn.execute("\n".join(statements))


def _checker(path: str, found: dict[str, TableShape]) -> Callable[..., Any]:
    def checked(table: str, payload: int, crc: int | None, *values: Any) -> Any:
        if crc is None or crc != row_crc(table, *values):
            raise DamagedRowError(path, table, *found[table].where(values))
        return values[payload]

    return checked


@dataclass(frozen=True)
class DamagedRow:
    """A row that fails its checksum: its table, and where it claims to belong."""

    table: str
    agent_id: str | None
    conversation: str | None
    version: int | None


def damaged_rows(conn: apsw.Connection, limit: int = 1000) -> list[DamagedRow]:
    """Every row (at most ``limit``) of our tables whose values fail its checksum.

    Reads every row of every table: for ``effectful-durable check``, not for turns.
    Text is read as bytes and decoded here, so that a row whose text is no longer
    UTF-8 is one damaged row, not an error that ends the scan.
    """
    found: list[DamagedRow] = []
    for shape in shapes(conn).values():
        read = ", ".join(
            f"CAST({c} AS BLOB)" if t else c
            for c, t in zip(shape.columns, shape.text, strict=True)
        )
        for *raw, crc in conn.execute(f"SELECT {read}, crc FROM main.{shape.table}"):
            try:
                values = _decoded(raw, shape.text, "strict")
            except UnicodeDecodeError:  # damaged: its text is named as well as it reads
                values, crc = _decoded(raw, shape.text, "replace"), None
            if crc is None or crc != row_crc(shape.table, *values):
                found.append(DamagedRow(shape.table, *shape.where(values)))
                if len(found) >= limit:
                    return found
    return found


def _decoded(raw: list[Any], text: tuple[bool, ...], errors: str) -> tuple[Any, ...]:
    """The values of a row read with its text as bytes, the text decoded."""
    return tuple(
        v.decode(errors=errors) if t and v is not None else v
        for v, t in zip(raw, text, strict=True)
    )
