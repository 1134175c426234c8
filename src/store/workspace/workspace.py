"""An agent's SQL workspace in use: a turn's transaction on its tables; the developer's reads.

The tables live in a SQLite file of the agent's own on this machine, caught up
from the log in the main database (``cache.py``, ``log.py``);
the agent's SQL runs there, in the sandbox of ``sandbox.py``, on both backends.

A turn: the workspace file is caught up, then one write transaction on it is
held from the turn's first SQL use to its end (the agent lock makes the turn the
only writer). Each agent statement runs in its own SAVEPOINT; a session records
what the statements changed. At commit the steps go into ``workspace_log`` in the
turn's one main transaction; after the main commit the workspace transaction
commits too, with ``user_version`` set to the new version (and, on a stamped
cache, the new version's stamp written first). A failed turn rolls the
workspace back. A crash between the two commits leaves the file one version
behind, and the next use replays that version from the log.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import apsw

from ...errors import SQLWorkspaceError
from ..engine.seam import Conn
from ..engine.sqlite.damage import CORRUPTION
from ..engine.sqlite.translate import translated
from ..sealing import Sealer
from .cache import WorkspaceCache, WorkspaceFiles, caught_up, materialize, set_aside
from .log import Step, apply, merged, stamp_of, write_log
from .sandbox import Refused, SQLLimits, Statement, guarded, harden, vet
from .schema import Declaration, TableInfo, plan_migration, quote, tables

if TYPE_CHECKING:
    from ..engine.seam import Database


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


class Damaged(Refused):
    """The workspace file is damaged; the turn's SQL is refused and the file rebuilt after it."""


_DAMAGED = (
    "the file that holds your SQL tables is damaged; nothing was changed by this call. "
    "It is rebuilt from your saved versions when this turn ends: use your tables again "
    "in your next turn"
)


_NOT_THE_DECLARATION: tuple[type[Exception], ...] = (*CORRUPTION, apsw.IOError, apsw.FullError)


class WorkspaceTurn:
    """One turn's transaction on an agent's workspace; a TurnWrite for its commit.

    Args:
        db: The main database (idle in this thread), which holds the log.
        cache: This machine's files of ``db``'s workspaces: one holds the agent's tables.
        agent_id: The agent whose turn it is (its lock is held).
        declaration: The developer's declared tables, migrated forward here.
        allow_ddl: Whether the agent may change its schema itself.
        limits: The sandbox limits.
        owner: The agent's class name, for error messages.
        busy_timeout: Seconds to wait for the file's write lock.
    """

    def __init__(
        self,
        db: Database,
        cache: WorkspaceCache,
        agent_id: str,
        *,
        declaration: Declaration,
        allow_ddl: bool,
        limits: SQLLimits,
        owner: str,
        busy_timeout: float = 5.0,
    ) -> None:
        self.agent_id = agent_id
        self.limits = limits
        self.allow_ddl = allow_ddl
        self.protected = frozenset(declaration.tables)
        self._cache = cache
        self._files = self._cache.files()
        self.path = self._cache.path(agent_id)
        for attempt in (1, 2):  # a file found damaged is set aside and rebuilt, once
            with translated(self.path):
                self.conn, self._start = caught_up(
                    self._files, self.path, limits, db, agent_id, busy_timeout
                )
            self.version: int | None = None
            self._stamp: float | None = None
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
            apply(self.conn, self._steps)
        self._session = self._new_session()
        self._tables = None

    def tables(self) -> list[TableInfo]:
        """The workspace's tables as the turn sees them (none once the file is found damaged)."""
        if self._tables is None:
            try:
                with self._watching():
                    self._tables = tables(self.conn)
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
        names = ", ".join(quote(columns[str(name).lower()]) for name in values)
        marks = ", ".join("?" * len(values))
        sql = f"INSERT INTO {quote(found.name)} ({names}) VALUES ({marks})"
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
    def write(self, conn: Conn, agent_id: str, version: int, sealer: Sealer) -> None:
        """Log the turn's steps as ``version`` of ``agent_id``, in the main transaction."""
        self._cut()
        write_log(conn, agent_id, version, merged(self._steps), sealer)
        self.version = version
        if self._cache.stamped:
            self._stamp = stamp_of(conn, agent_id, version)

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
                        start = self._start
                        self._cache.stamp(
                            self.path, {start.current: start.stamp, self.version: self._stamp}
                        )
                        self.conn.pragma("user_version", self.version)
                        self.conn.execute("COMMIT")
                    except (apsw.Error, OSError):
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
    db: Database,
    cache: WorkspaceCache,
    agent_id: str,
    query: str,
    params: Sequence[Any],
    *,
    version: int,
    latest: bool,
    readonly: bool,
    busy_timeout: float,
    limits: SQLLimits = DEVELOPER_LIMITS,
) -> SQLResult:
    """Run a read-only query on the agent's tables at ``version`` (``latest`` if it is the last).

    The latest version is read from the agent's file, caught up (a read-only
    Store, or a machine without the file, reads a copy in memory instead: a read
    never creates a file); another version from a copy caught up or back.

    Raises:
        SQLWorkspaceError: The query was refused or failed.
    """
    path = cache.path(agent_id)
    conn: apsw.Connection
    in_place = latest and not readonly and os.path.exists(path)
    if in_place:
        files = WorkspaceFiles(cache, limit=0)
        conn, _ = caught_up(files, path, limits, db, agent_id, busy_timeout)
    else:
        conn = materialize(db, cache, agent_id, version)
    try:
        return _query_on(conn, agent_id, query, params, limits)
    except CORRUPTION:  # met in the workspace file (or its copy): read the log alone
        if in_place:
            set_aside(path, "SQLite found it malformed while reading it")
        fresh = materialize(db, cache, agent_id, version, from_file=False)
        return _query_on(fresh, agent_id, query, params, limits)


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
