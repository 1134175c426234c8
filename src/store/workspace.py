"""The SQL workspace: each agent's own tables, in a SQLite file of its own, versioned.

Layout. The tables of agent A live in ``<db>-workspaces/<blake2b(A)>.sqlite``; the
agent's SQL runs on a connection to that file only (see ``sandbox.py``). The
main database stays the single source of truth: ``workspace_log`` holds, per
version, the steps that turn the previous version's tables into this version's,
in order: DDL text, or an ``apsw.Session`` changeset of row changes. The
workspace file is a materialised view of that log; ``PRAGMA user_version`` in it
records the version it holds, and whoever opens it next (a turn, ``Store.sql``)
catches it up from the log, or rebuilds it from scratch when it is ahead,
foreign or does not apply.

A turn: the workspace file is caught up, then one write transaction on it is
held from the turn's first SQL use to its end (the agent lock makes the turn the
only writer). Each agent statement runs in its own SAVEPOINT; a session records
what the statements changed. At commit the steps go into ``workspace_log`` in the
turn's one main transaction; after the main commit the workspace transaction
commits too, with ``user_version`` set to the new version. A failed turn rolls
the workspace back. A crash between the two commits leaves the file one version
behind, and the next use replays that version from the log.

Versions. ``rollback`` to v writes, as the new version, the inverse of the
changesets after v (O(changes since v)) when no DDL happened after v; otherwise
a snapshot of the tables at v (replayed from the log: O(history)). ``fork``
writes a snapshot. ``prune`` folds the steps before a version into one snapshot.
A snapshot starts with the ``-- reset`` step, which drops every table.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import apsw

from ..errors import SQLWorkspaceError
from .backend import Conn
from .connection import read_transaction
from .damage import CORRUPTION, header_problem
from .sandbox import Refused, SQLLimits, Statement, guarded, harden, vet
from .translate import translated

logger = logging.getLogger("effectful_durable.store")

WORKSPACE_APPLICATION_ID = 0x45465753  # "EFWS": PRAGMA application_id of workspace files
_RESET = "-- reset"  # a DDL step that drops every table: snapshots start with it

type Step = tuple[str | None, bytes | None]  # (DDL text, None) or (None, changeset)


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
class SQLResult:
    """The rows a workspace query returned.

    Attributes:
        columns: The result's column names.
        rows: The rows, as tuples.
        truncated: Why the rows were cut short (row or byte limit), or None.
        changes: Rows changed by a write statement (0 for a query).

    .. versionadded:: 0.2.0
    """

    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    truncated: str | None = None
    changes: int = 0

    def __iter__(self) -> Iterator[tuple[Any, ...]]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


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
    tables = {t.name: t for t in _tables(scratch)}
    for table in tables.values():
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
    return Declaration(text, tables, creates, indexes)


def workspace_path(db_path: str, agent_id: str) -> str:
    """The file that holds ``agent_id``'s tables, beside the main database."""
    digest = hashlib.blake2b(agent_id.encode(), digest_size=16).hexdigest()
    return os.path.join(os.path.realpath(db_path) + "-workspaces", f"{digest}.sqlite")


# -- the log in the main database --------------------------------------------


def _current(main: apsw.Connection, agent_id: str) -> int:
    with translated(main.filename, main):
        row = main.execute("SELECT version FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
    return 0 if row is None else int(row[0])


def _log(main: apsw.Connection, agent_id: str, after: int, upto: int) -> list[Step]:
    with translated(main.filename, main):
        rows = main.execute(
            """
            SELECT ddl, changeset FROM workspace_log
             WHERE agent_id = ? AND version > ? AND version <= ? ORDER BY version, seq
            """,
            (agent_id, after, upto),
        ).fetchall()
    return [(_text(ddl), _blob(changeset)) for ddl, changeset in rows]


def _write_log(main: apsw.Connection, agent_id: str, version: int, steps: Sequence[Step]) -> None:
    main.executemany(
        "INSERT INTO workspace_log (agent_id, version, seq, ddl, changeset) VALUES (?,?,?,?,?)",
        [(agent_id, version, seq, ddl, cs) for seq, (ddl, cs) in enumerate(steps)],
    )


def _apply(conn: apsw.Connection, steps: Iterable[Step]) -> None:
    for ddl, changeset in steps:
        if ddl == _RESET:
            for (name,) in conn.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            ).fetchall():
                conn.execute(f"DROP TABLE {_quote(str(name))}")
        elif ddl is not None:
            conn.execute(ddl)
        elif changeset:
            apsw.Changeset.apply(changeset, conn)  # any conflict aborts: the view diverged


def _replay(main: apsw.Connection, agent_id: str, upto: int) -> apsw.Connection:
    """A new in-memory database holding the agent's tables at ``upto``, from the log."""
    mem = apsw.Connection(":memory:")
    _apply(mem, _log(main, agent_id, 0, upto))
    return mem


def _snapshot(mem: apsw.Connection) -> list[Step]:
    """Steps that make any workspace equal to ``mem``: reset, DDL, then every row."""
    schema = mem.execute(
        """
        SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite%'
         ORDER BY type = 'index', rowid
        """
    ).fetchall()
    statements = [str(sql) for (sql,) in schema]
    steps: list[Step] = [(_RESET, None), *((sql, None) for sql in statements)]
    fresh = apsw.Connection(":memory:")
    for sql in statements:
        fresh.execute(sql)
    session = apsw.Session(fresh, "main")
    session.attach()
    with fresh:
        for table in _tables(mem):
            names = [c.name for c in table.columns if not c.hidden]
            columns = ", ".join(_quote(n) for n in names)
            rows = mem.execute(f"SELECT {columns} FROM {_quote(table.name)}")
            marks = ", ".join("?" * len(names))
            fresh.executemany(
                f"INSERT INTO {_quote(table.name)} ({columns}) VALUES ({marks})", rows
            )
    changeset = session.changeset()
    session.close()
    fresh.close()
    if changeset:
        steps.append((None, changeset))
    return steps


class WorkspacePart:
    """How the SQL workspace follows a rollback, a fork, a prune and a delete."""

    def rollback(self, db: Conn, agent_id: str, to_version: int, new_version: int) -> None:
        """Write, as ``new_version``, what undoes every change after ``to_version``."""
        conn = cast(apsw.Connection, db)  # SQLite only (sqlite.PARTS)
        later = _log(conn, agent_id, to_version, new_version - 1)
        if not later:
            return
        if all(ddl is None for ddl, _ in later):
            builder = apsw.ChangesetBuilder()  # type: ignore[no-untyped-call]
            for _, changeset in later:
                if changeset:
                    builder.add(changeset)
            inverse = apsw.Changeset.invert(builder.output())
            builder.close()
            if inverse:
                _write_log(conn, agent_id, new_version, [(None, inverse)])
            return
        mem = _replay(conn, agent_id, to_version)  # DDL after v: rebuild the tables at v
        _write_log(conn, agent_id, new_version, _snapshot(mem))
        mem.close()

    def fork(self, db: Conn, agent_id: str, version: int, new_agent_id: str) -> None:
        """Give ``new_agent_id`` (version 1) the tables ``agent_id`` had at ``version``."""
        conn = cast(apsw.Connection, db)
        if not _log(conn, agent_id, 0, version):
            return
        mem = _replay(conn, agent_id, version)
        _write_log(conn, new_agent_id, 1, _snapshot(mem))
        mem.close()
        _remove_files(workspace_path(conn.filename, new_agent_id))

    def prune(self, db: Conn, agent_id: str, keep_from: int) -> None:
        """Fold the steps of versions before ``keep_from`` into one snapshot.

        A snapshot costs what the tables hold, so it is made only once the steps
        it would replace outweigh the oldest version's (the last snapshot): the
        cost per pruned byte stays flat, as for pruning as you go.
        """
        conn = cast(apsw.Connection, db)
        base = keep_from - 1
        sizes = conn.execute(
            """
            SELECT version, sum(coalesce(length(changeset), 0) + coalesce(length(ddl), 0))
              FROM workspace_log WHERE agent_id = ? AND version <= ?
             GROUP BY version ORDER BY version
            """,
            (agent_id, base),
        ).fetchall()
        weights = [int(size or 0) for _, size in sizes]
        if len(weights) <= 1 or sum(weights[1:]) < weights[0]:
            return
        mem = _replay(conn, agent_id, base)
        conn.execute(
            "DELETE FROM workspace_log WHERE agent_id = ? AND version <= ?", (agent_id, base)
        )
        _write_log(conn, agent_id, base, _snapshot(mem))
        mem.close()

    def delete(self, db: Conn, agent_id: str) -> None:
        """Remove the agent's workspace file (its log goes with the agents row).

        Removing the file first is safe: if the main transaction then fails, the
        next use rebuilds the file from the log.
        """
        _remove_files(workspace_path(cast(apsw.Connection, db).filename, agent_id))


def _merged(steps: Sequence[Step]) -> list[Step]:
    """The steps with each run of changesets between DDL steps combined into one."""
    merged: list[Step] = []
    run: list[bytes] = []

    def flush() -> None:
        if len(run) == 1:
            merged.append((None, run[0]))
        elif run:
            builder = apsw.ChangesetBuilder()  # type: ignore[no-untyped-call]
            for changeset in run:
                builder.add(changeset)
            combined = builder.output()
            builder.close()
            if combined:
                merged.append((None, combined))
        run.clear()

    for ddl, changeset in steps:
        if ddl is None and changeset:
            run.append(changeset)
        else:
            flush()
            merged.append((ddl, changeset))
    flush()
    return merged


def _remove_files(path: str) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


# -- workspace files -----------------------------------------------------------


def open_workspace(
    path: str, limits: SQLLimits, *, busy_timeout: float = 5.0, readonly: bool = False
) -> apsw.Connection:
    """Open (creating if missing) an agent's workspace file, hardened for agent SQL.

    A file SQLite finds damaged, or one in its place that is not a workspace
    file, is set aside (see :func:`set_aside`) and a new one started: whoever
    opened it catches it up from the log.

    Raises:
        SQLWorkspaceError: With ``readonly``, the file is damaged or not a
            workspace file.
    """
    try:
        return _open_workspace(path, limits, busy_timeout=busy_timeout, readonly=readonly)
    except _UNUSABLE as e:
        if readonly:
            msg = f"{path} is damaged or not an effectful-durable SQL workspace file ({e})"
            raise SQLWorkspaceError(msg) from e
        set_aside(path, str(e))
    return _open_workspace(path, limits, busy_timeout=busy_timeout, readonly=readonly)


class Damaged(Refused):
    """The workspace file is damaged; the turn's SQL is refused and the file rebuilt after it."""


_DAMAGED = (
    "the file that holds your SQL tables is damaged; nothing was changed by this call. "
    "It is rebuilt from your saved versions when this turn ends: use your tables again "
    "in your next turn"
)


class _NotWorkspace(Exception):
    """The file is SQLite, but not an effectful-durable workspace file."""


_UNUSABLE: tuple[type[Exception], ...] = (*CORRUPTION, _NotWorkspace)
_NOT_THE_DECLARATION: tuple[type[Exception], ...] = (*CORRUPTION, apsw.IOError, apsw.FullError)


def _open_workspace(
    path: str, limits: SQLLimits, *, busy_timeout: float, readonly: bool
) -> apsw.Connection:
    if not readonly:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    flags = (
        apsw.SQLITE_OPEN_READONLY
        if readonly
        else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    )
    problem = header_problem(path, WORKSPACE_APPLICATION_ID)
    if problem is not None:
        raise _NotWorkspace(problem)
    conn = apsw.Connection(path, flags=flags)
    try:
        conn.set_busy_timeout(int(busy_timeout * 1000))
        if not readonly and conn.readonly("main"):
            msg = "SQLite opened it read-only (its header, or its permissions)"
            raise _NotWorkspace(msg)
        application_id = conn.pragma("application_id")
        try:
            empty = conn.execute("SELECT count(*) FROM sqlite_schema").get == 0  # page 1
        except apsw.SQLError as e:  # "unsupported file format": a damaged header
            raise _NotWorkspace(str(e)) from e
        if application_id != WORKSPACE_APPLICATION_ID:
            if application_id != 0 or not empty or readonly:
                msg = f"its application_id is {application_id:#x}"
                raise _NotWorkspace(msg)
            conn.pragma("application_id", WORKSPACE_APPLICATION_ID)
        if not readonly:
            conn.pragma("journal_mode", "wal")
            conn.pragma("synchronous", "NORMAL")  # the log in the main database is the truth
            page_size = int(conn.pragma("page_size"))
            conn.pragma("max_page_count", max(1, limits.max_workspace_bytes // page_size))
        harden(conn, limits)
    except BaseException:
        conn.close()
        raise
    return conn


def set_aside(path: str, reason: str) -> str:
    """Rename a damaged workspace file (with its -wal and -shm) to ``<path>.damaged-<UTC time>``.

    Nothing is deleted; a warning names the new name. The file is only a view of
    the log in the main database, so the next use rebuilds it from there.

    Returns:
        The new name.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = f"{path}.damaged-{stamp}"
    for suffix in ("", "-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, aside + suffix)
    logger.warning(
        "the SQL workspace file %s is damaged (%s); moved it to %s (nothing was deleted) "
        "and rebuilt it from the log in the main database",
        path,
        reason,
        aside,
    )
    return aside


def _sound(conn: apsw.Connection) -> bool:
    """Whether SQLite finds the file of ``conn`` whole (its ``quick_check``)."""
    try:
        return bool(conn.execute("PRAGMA quick_check").get == "ok")
    except apsw.Error:
        return False


def _caught_up(
    files: WorkspaceFiles,
    path: str,
    limits: SQLLimits,
    main: apsw.Connection,
    agent_id: str,
    busy_timeout: float,
) -> apsw.Connection:
    """The agent's workspace file, open and caught up; a damaged one is set aside and rebuilt.

    Damage of the main database (the log) is raised as SQLite reported it.
    """
    conn = files.open(path, limits, busy_timeout=busy_timeout)
    try:
        catch_up(conn, main, agent_id)
        return conn
    except CORRUPTION as e:
        sound = _sound(conn)
        conn.close()
        if sound:
            raise  # the workspace is whole: the damage is in the main database
        set_aside(path, str(e))
    except BaseException:
        conn.close()
        raise
    conn = files.open(path, limits, busy_timeout=busy_timeout)
    try:
        catch_up(conn, main, agent_id)
    except BaseException:
        conn.close()
        raise
    return conn


class WorkspaceFiles:
    """One thread's open workspace connections, kept between turns (least recently used go).

    Opening a WAL file and closing it (which checkpoints and syncs it) would cost
    milliseconds per turn. A kept connection is used again only while its file is
    the same file (inode) and it holds no transaction.
    """

    def __init__(self, limit: int = 16) -> None:
        self.limit = limit
        self._open: dict[str, tuple[apsw.Connection, tuple[int, int]]] = {}

    def open(self, path: str, limits: SQLLimits, *, busy_timeout: float) -> apsw.Connection:
        """A hardened connection to ``path``, kept or new."""
        kept = self._open.pop(path, None)
        if kept is not None:
            conn, identity = kept
            if _identity(path) == identity and not conn.in_transaction:
                harden(conn, limits)
                page_size = int(conn.pragma("page_size"))
                conn.pragma("max_page_count", max(1, limits.max_workspace_bytes // page_size))
                return conn
            conn.close()
        return open_workspace(path, limits, busy_timeout=busy_timeout)

    def release(self, path: str, conn: apsw.Connection) -> None:
        """Keep ``conn`` for the next turn, or close it."""
        identity = _identity(path)
        if self.limit <= 0 or identity is None or conn.in_transaction:
            conn.close()
            return
        self._open[path] = (conn, identity)
        while len(self._open) > self.limit:
            oldest = next(iter(self._open))
            self._open.pop(oldest)[0].close()

    def close(self) -> None:
        """Close every kept connection."""
        while self._open:
            self._open.popitem()[1][0].close()


def _identity(path: str) -> tuple[int, int] | None:
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return (found.st_dev, found.st_ino)


def catch_up(ws: apsw.Connection, main: apsw.Connection, agent_id: str) -> int:
    """Bring a workspace file to the agent's committed version; return that version.

    A file ahead of the log (the agent was deleted and made anew) or one the log
    does not apply to is rebuilt from the whole log.
    """
    with _read(main):
        current = _current(main, agent_id)
    if int(ws.pragma("user_version")) == current and not ws.in_transaction:
        return current  # up to date: no write lock needed
    ws.execute("BEGIN IMMEDIATE")
    try:
        with _read(main):
            current = _current(main, agent_id)
            held = int(ws.pragma("user_version"))
            if held != current:
                try:
                    ws.execute("SAVEPOINT catch_up")
                    if held > current:
                        msg = "ahead of the log"
                        raise apsw.ConstraintError(msg)
                    _apply(ws, _log(main, agent_id, held, current))
                    ws.execute("RELEASE catch_up")
                except (apsw.IOError, apsw.FullError):
                    raise  # the disk failed, not the log
                except apsw.Error:
                    ws.execute("ROLLBACK TO catch_up")
                    ws.execute("RELEASE catch_up")
                    _apply(ws, [(_RESET, None), *_log(main, agent_id, 0, current)])
                ws.pragma("user_version", current)
        ws.execute("COMMIT")
    except BaseException:
        if ws.in_transaction:
            ws.execute("ROLLBACK")
        raise
    return current


@contextlib.contextmanager
def _read(main: apsw.Connection) -> Iterator[None]:
    with read_transaction(main):
        yield


def materialize(
    main: apsw.Connection, path: str | None, agent_id: str, version: int
) -> apsw.Connection:
    """An in-memory database holding the agent's tables at ``version``; never writes.

    It starts from a copy of the workspace file at ``path`` when that helps, and
    from the log alone when ``path`` is None or the copy turns out damaged.
    """
    if path is not None and header_problem(path, WORKSPACE_APPLICATION_ID) is None:
        try:
            return _materialize(main, path, agent_id, version)
        except apsw.Error:
            pass  # the copy does not take the log: damaged (the log's damage raises below)
    return _materialize(main, None, agent_id, version)


def _materialize(
    main: apsw.Connection, path: str | None, agent_id: str, version: int
) -> apsw.Connection:
    mem = apsw.Connection(":memory:")
    with _read(main):
        current = _current(main, agent_id)
        held = 0
        if path is not None and os.path.exists(path):
            try:
                source = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
                try:
                    with mem.backup("main", source, "main") as backup:
                        backup.step(-1)
                finally:
                    source.close()
                mem.execute("SELECT count(*) FROM sqlite_schema")  # a copy SQLite can read
                held = int(mem.pragma("user_version"))
                if mem.pragma("application_id") != WORKSPACE_APPLICATION_ID or held < 0:
                    held = current + 1
            except apsw.Error:
                held = current + 1
        if held > current:  # ahead of the log, foreign or damaged: start from nothing
            mem.close()
            mem = apsw.Connection(":memory:")
            held = 0
        if held <= version:
            _apply(mem, _log(main, agent_id, held, version))
        else:
            later = _log(main, agent_id, version, held)
            if all(ddl is None for ddl, _ in later):
                for _, changeset in reversed(later):
                    if changeset:
                        apsw.Changeset.apply(apsw.Changeset.invert(changeset), mem)
            else:
                _apply(mem, [(_RESET, None), *_log(main, agent_id, 0, version)])
    return mem


def tables(conn: apsw.Connection) -> list[TableInfo]:
    """The tables of a workspace, by name."""
    return _tables(conn)


def _tables(conn: apsw.Connection) -> list[TableInfo]:
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


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _blob(value: Any) -> bytes | None:
    return None if value is None else bytes(value)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def plan_migration(conn: apsw.Connection, declaration: Declaration, owner: str) -> list[str]:
    """The DDL that brings a workspace up to its declaration: new tables, columns, indexes.

    Raises:
        SQLWorkspaceError: The declaration changed an existing column, which is not
            a forward migration.
    """
    have = {t.name: t for t in _tables(conn)}
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
    text = f"ALTER TABLE {_quote(table)} ADD COLUMN {_quote(column.name)} {column.type}"
    if column.notnull:
        text += " NOT NULL"
    if column.default is not None:
        text += f" DEFAULT {column.default}"
    return text


# -- a turn's use of the workspace ------------------------------------------------


class WorkspaceTurn:
    """One turn's transaction on an agent's workspace; a TurnWrite for its commit.

    Args:
        main: The caller's connection to the main database (idle).
        db_path: The main database file.
        agent_id: The agent whose turn it is (its lock is held).
        declaration: The developer's declared tables, migrated forward here.
        allow_ddl: Whether the agent may change its schema itself.
        limits: The sandbox limits.
        owner: The agent's class name, for error messages.
    """

    def __init__(
        self,
        main: apsw.Connection,
        db_path: str,
        agent_id: str,
        *,
        declaration: Declaration,
        allow_ddl: bool,
        limits: SQLLimits,
        owner: str,
        busy_timeout: float = 5.0,
        files: WorkspaceFiles | None = None,
    ) -> None:
        self.agent_id = agent_id
        self.limits = limits
        self.allow_ddl = allow_ddl
        self.protected = frozenset(declaration.tables)
        self.path = workspace_path(db_path, agent_id)
        self._files = files or WorkspaceFiles(limit=0)
        for attempt in (1, 2):  # a file found damaged is set aside and rebuilt, once
            with translated(self.path):
                self.conn = _caught_up(
                    self._files, self.path, limits, main, agent_id, busy_timeout
                )
            self.version: int | None = None
            self._finished = False
            self._damaged = False
            self._steps: list[Step] = []
            self._tables: list[TableInfo] | None = None
            try:
                with translated(self.path, self.conn):
                    self._begin(declaration, owner)
                return
            except CORRUPTION as e:
                self._damaged = True
                self.finish(committed=False)
                if attempt == 2:
                    msg = f"the SQL workspace file of {agent_id!r} stays damaged: {e}"
                    raise SQLWorkspaceError(msg) from e
            except BaseException:
                self.finish(committed=False)
                raise

    def _begin(self, declaration: Declaration, owner: str) -> None:
        self.conn.execute("BEGIN IMMEDIATE")
        self._session = self._new_session()
        for ddl in plan_migration(self.conn, declaration, owner):
            self._cut()
            try:
                self.conn.execute(ddl)
            except _NOT_THE_DECLARATION:
                raise  # the file or the disk failed, not the declaration
            except apsw.Error as e:
                msg = f"cannot migrate the SQL workspace of {self.agent_id!r}: {e} in {ddl!r}"
                raise SQLWorkspaceError(msg) from e
            self._steps.append((ddl, None))

    def _new_session(self) -> apsw.Session:
        session = apsw.Session(self.conn, "main")
        session.attach()  # every table, including ones created later
        return session

    def _cut(self) -> None:
        """End the current changeset segment, before a schema change."""
        changeset = self._session.changeset()
        self._session.close()
        if changeset:
            self._steps.append((None, changeset))
        self._session = self._new_session()

    def _recover(self) -> None:
        """Redo the turn's earlier steps after SQLite rolled its transaction back."""
        self._session.close()
        with translated(self.path, self.conn):
            self.conn.execute("BEGIN IMMEDIATE")
            _apply(self.conn, self._steps)
        self._session = self._new_session()
        self._tables = None

    def tables(self) -> list[TableInfo]:
        """The workspace's tables as the turn sees them (none once the file is found damaged)."""
        if self._tables is None:
            try:
                with self._watching():
                    self._tables = _tables(self.conn)
            except Damaged:
                return []
        return self._tables

    @contextlib.contextmanager
    def _watching(self) -> Iterator[None]:
        """Turn SQLite's report of a damaged file into a refusal; the file is rebuilt later."""
        if self._damaged:
            raise Damaged(_DAMAGED)
        try:
            yield
        except CORRUPTION as e:
            self._damaged = True  # finish() sets the file aside; the log rebuilds it
            msg = f"{_DAMAGED} (SQLite: {e})"
            raise Damaged(msg) from None

    def query(self, sql: str, params: Sequence[Any]) -> SQLResult:
        """Run one read-only statement for the model.

        Raises:
            Refused: The sandbox refused it or SQLite reported an error.
        """
        with self._watching():
            statement = vet(
                self.conn, sql, params, write=False, allow_ddl=False, limits=self.limits
            )
            self._cut()  # so that _recover can replay every write before this read
            try:
                return self._run(statement, params)
            finally:
                if not self.conn.in_transaction and not self._damaged:
                    self._recover()  # SQLite gave up the transaction on an error

    def execute(self, sql: str, params: Sequence[Any]) -> SQLResult:
        """Run one write statement for the model, in its own savepoint.

        Raises:
            Refused: The sandbox refused it or SQLite reported an error; nothing
                it did is kept.
        """
        with self._watching():
            statement = vet(
                self.conn,
                sql,
                params,
                write=True,
                allow_ddl=self.allow_ddl,
                protected=self.protected,
                limits=self.limits,
            )
            # A segment per statement: SQLite rolls back the whole transaction when a
            # write is interrupted (budget) or hits SQLITE_FULL
            # (sqlite.org/lang_transaction.html#response_to_errors_within_a_transaction);
            # the turn's earlier statements are then replayed from the steps.
            self._cut()
            self.conn.execute("SAVEPOINT agent_statement")
            try:
                result = self._run(statement, params)
                if statement.ddl is not None:
                    self._check_keys()
            except CORRUPTION:
                raise  # the whole transaction is given up with the file
            except BaseException:
                if self.conn.in_transaction:
                    self.conn.execute("ROLLBACK TO agent_statement")
                    self.conn.execute("RELEASE agent_statement")
                else:
                    self._recover()
                raise
            self.conn.execute("RELEASE agent_statement")
        if statement.ddl is not None:
            self._steps.append((statement.sql.strip(), None))
            self._tables = None
        return result

    def insert(self, table: str, values: Mapping[str, Any]) -> SQLResult:
        """Insert one row, naming only a table and columns that exist.

        Raises:
            Refused: No such table or column, or the insert failed.
        """
        if self._damaged:
            raise Damaged(_DAMAGED)
        found = {t.name.lower(): t for t in self.tables()}.get(str(table).lower())
        if found is None:
            names = ", ".join(t.name for t in self.tables()) or "none"
            msg = f"there is no table {table!r}; the tables are: {names}"
            raise Refused(msg)
        if not isinstance(values, Mapping) or not values:
            msg = "values must be an object of column names to values, with at least one"
            raise Refused(msg)
        columns = {c.name.lower(): c.name for c in found.columns if not c.hidden}
        unknown = [name for name in values if str(name).lower() not in columns]
        if unknown:
            msg = (
                f"table {found.name} has no column(s) {', '.join(map(repr, unknown))}; its "
                f"columns are: {', '.join(columns.values())}"
            )
            raise Refused(msg)
        names = ", ".join(_quote(columns[str(name).lower()]) for name in values)
        marks = ", ".join("?" * len(values))
        sql = f"INSERT INTO {_quote(found.name)} ({names}) VALUES ({marks})"
        return self.execute(sql, list(values.values()))

    def _run(self, statement: Statement, params: Sequence[Any]) -> SQLResult:
        rows: list[tuple[Any, ...]] = []
        truncated = None
        size = 0
        limits = self.limits
        try:
            with guarded(self.conn, statement, limits):
                cursor = self.conn.execute(statement.sql, tuple(params))
                try:
                    columns = tuple(name for name, _ in cursor.get_description())
                except apsw.ExecutionCompleteError:
                    columns = ()
                for row in cursor:
                    if len(rows) >= limits.max_rows:
                        truncated = f"cut at {limits.max_rows} rows (the row limit)"
                        break
                    size += len(json.dumps(_jsonable_row(row)))
                    if size > limits.max_result_bytes:
                        truncated = (
                            f"cut at {len(rows)} rows: the result passed "
                            f"{limits.max_result_bytes:,} bytes (the size limit)"
                        )
                        break
                    rows.append(row)
                if truncated is not None and not statement.readonly:
                    for _ in cursor:  # a write with RETURNING still does all its work
                        pass
        except apsw.FullError:
            msg = (
                "the workspace is full: it may hold at most "
                f"{limits.max_workspace_bytes:,} bytes. Delete rows you no longer need."
            )
            raise Refused(msg) from None
        except apsw.TooBigError:
            msg = (
                f"a value passed the size limit of {limits.max_value_bytes:,} bytes; "
                "nothing was done"
            )
            raise Refused(msg) from None
        except apsw.AuthError as e:
            msg = f"not allowed: {e}"
            raise Refused(msg) from None
        except CORRUPTION:
            raise  # the file is damaged, not the statement
        except apsw.Error as e:
            msg = f"SQL error: {e}"
            raise Refused(msg) from None
        except UnicodeDecodeError as e:
            msg = (
                f"a text value in the result is not valid UTF-8 ({e}); select it as "
                "hex(column) or CAST(column AS BLOB), or replace it with UPDATE"
            )
            raise Refused(msg) from None
        except (TypeError, ValueError, OverflowError) as e:
            msg = f"bad parameter value: {e}"
            raise Refused(msg) from None
        changes = 0 if statement.readonly else self.conn.changes()
        return SQLResult(columns, rows, truncated, changes)

    def _check_keys(self) -> None:
        self._tables = None
        for table in self.tables():
            if not any(column.pk for column in table.columns):
                msg = (
                    f"table {table.name} needs a PRIMARY KEY (e.g. id INTEGER PRIMARY KEY); "
                    "it was not created"
                )
                raise Refused(msg)

    # TurnWrite
    def write(self, conn: Conn, agent_id: str, version: int) -> None:
        """Log the turn's steps as ``version`` of ``agent_id``, in the main transaction."""
        self._cut()
        _write_log(cast(apsw.Connection, conn), agent_id, version, _merged(self._steps))
        self.version = version

    def finish(self, *, committed: bool) -> None:
        """Commit the workspace after the main commit, or roll it back; close it.

        A commit that fails here is left to the next catch-up: the main
        database already holds the turn.
        """
        if self._finished:
            return
        self._finished = True
        try:
            if self._damaged:
                with contextlib.suppress(apsw.Error):
                    if self.conn.in_transaction:
                        self.conn.execute("ROLLBACK")
            elif self.conn.in_transaction:
                if committed and self.version is not None:
                    try:
                        self.conn.pragma("user_version", self.version)
                        self.conn.execute("COMMIT")
                    except apsw.Error:
                        if self.conn.in_transaction:
                            self.conn.execute("ROLLBACK")
                else:
                    self.conn.execute("ROLLBACK")
        finally:
            with contextlib.suppress(Exception):
                session = getattr(self, "_session", None)
                if session is not None:
                    session.close()
            if self._damaged:  # the next use rebuilds it from the log
                self.conn.close()
                set_aside(self.path, "SQLite found it malformed during a turn")
            else:
                self._files.release(self.path, self.conn)


# Store.sql reads for the developer: no row or size cap, a generous budget.
DEVELOPER_LIMITS = SQLLimits(
    max_rows=2**62,
    max_result_bytes=2**62,
    max_statement_chars=1_000_000,
    max_vm_steps=10**12,
    max_seconds=600.0,
)


def read_sql(
    main: apsw.Connection,
    db_path: str,
    agent_id: str,
    query: str,
    params: Sequence[Any],
    *,
    version: int | None,
    readonly: bool,
    busy_timeout: float,
    limits: SQLLimits = DEVELOPER_LIMITS,
) -> SQLResult:
    """Run a read-only query on the agent's tables at ``version`` (default: the latest).

    Raises:
        SQLWorkspaceError: The query was refused or failed.
    """
    path = workspace_path(db_path, agent_id)
    current = _current(main, agent_id)
    version = current if version is None else version
    conn: apsw.Connection
    in_place = version == current and not readonly and os.path.exists(path)
    if in_place:
        conn = _caught_up(WorkspaceFiles(limit=0), path, limits, main, agent_id, busy_timeout)
    else:  # a read never creates a file
        conn = materialize(main, path, agent_id, version)
    try:
        return _query_on(conn, agent_id, query, params, limits)
    except CORRUPTION:  # met in the workspace file (or its copy): read the log alone
        if in_place:
            set_aside(path, "SQLite found it malformed while reading it")
        return _query_on(
            materialize(main, None, agent_id, version), agent_id, query, params, limits
        )


def _query_on(
    conn: apsw.Connection,
    agent_id: str,
    query: str,
    params: Sequence[Any],
    limits: SQLLimits,
) -> SQLResult:
    """Run the developer's query on ``conn``, then close it."""
    harden(conn, limits)
    try:
        conn.execute("BEGIN DEFERRED")
        statement = vet(conn, query, params, write=False, allow_ddl=False, limits=limits)
        reader = _Reader(conn, limits)
        return reader.run(statement, params)
    except Refused as e:
        msg = f"query on the tables of {agent_id!r} refused: {e}"
        raise SQLWorkspaceError(msg) from None
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        conn.close()


class _Reader(WorkspaceTurn):
    """The statement runner of WorkspaceTurn over an already open connection."""

    def __init__(self, conn: apsw.Connection, limits: SQLLimits) -> None:
        self.conn = conn
        self.limits = limits

    def run(self, statement: Statement, params: Sequence[Any]) -> SQLResult:
        return self._run(statement, params)


def _jsonable_row(row: Sequence[Any]) -> list[Any]:
    return [jsonable(value) for value in row]


def jsonable(value: Any) -> Any:
    """A SQLite value as JSON: blobs become ``{"blob_hex": ...}`` (first 64 bytes)."""
    if isinstance(value, bytes):
        shown = value[:64].hex()
        return {"blob_hex": shown, "bytes": len(value)}
    if isinstance(value, float) and value != value:  # NaN has no JSON spelling
        return None
    return value
