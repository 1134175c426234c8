"""The SQLite backend: one file, a connection per thread, file locks per agent.

Opening the file (identify, migrate, pragmas) is ``connection.py``; damage and
I/O errors are translated by ``damage.py`` and ``translate.py``. This module
holds the connections of one Store and the SQL that only SQLite speaks (FTS5,
``PRAGMA integrity_check``); see ``engine/seam.py`` for the seam.
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from typing import Any, Literal, NamedTuple

import apsw

from ....errors import (
    AgentInUseError,
    DamagedRowError,
    DatabaseBusyError,
    DatabaseCorruptError,
    DurableError,
    NotOurDatabaseError,
    StorageError,
)
from ..seam import Conn, Rows, TurnWrite, forked, moved_by
from ..watch import MarkerWatch
from . import row_checks
from .connection import Durability, connect, quarantine, read_transaction, write_transaction
from .damage import DamageWatch
from .locks import AgentBusy, AgentLocks
from .translate import translate, translated


class SQLiteDatabase:
    """One SQLite database file, as a Store's Database (see engine/seam.py).

    Raises:
        NotOurDatabaseError, DatabaseCorruptError, SchemaTooNewError: as
            :class:`~effectful_durable.Store` says.
    """

    kind = "sqlite"
    # 'now' to the millisecond (one file is on one machine: its clock is the host's).
    now_sql = "((julianday('now') - 2440587.5) * 86400.0)"
    statement_timeout: float | None = None  # no server to wait for

    def __init__(
        self,
        path: str,
        *,
        durability: Durability,
        busy_timeout: float,
        readonly: bool,
        on_unreadable: Literal["refuse", "quarantine"],
    ) -> None:
        self.path = self.location = path
        self.durability: Durability = durability
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self._local = threading.local()
        self._connections: list[apsw.Connection] = []
        self._connections_lock = threading.Lock()
        # This process's writers take turns here before SQLite's write lock: a
        # queue on a lock instead of SQLite's busy handler, whose sleeps let one
        # thread of many miss the lock for seconds (other processes still meet
        # that handler, one writer of ours at a time).
        self._writer = threading.Lock()
        self._closed = False
        self._pid = os.getpid()
        # Each agent's row (version, creation time, state_in) as this Store last
        # read or wrote it: a hint, never trusted, that the statements using it
        # check (a turn's start, the commit's advance), so that a turn reads its
        # agent's row in none of its statements; one that no longer fits takes the
        # checked way.
        self._heads: dict[str, _Head] = {}
        self._shapes: dict[str, row_checks.TableShape] = {}
        self.damage = DamageWatch(self.path, self._connections)
        try:
            self.connection()  # fail here, not at the first turn, if the file is bad
        except (NotOurDatabaseError, DatabaseCorruptError):
            if on_unreadable == "refuse":
                raise
            try:  # another process may have moved it aside and started afresh meanwhile
                self.connection()
            except (NotOurDatabaseError, DatabaseCorruptError):
                quarantine(self.path)
                self.connection()
        self._locks = AgentLocks.for_database(self.path)
        self.identity = os.path.realpath(self.path)

    def unhurried(self) -> AbstractContextManager[None]:
        """Nothing to lift: SQLite's only wait is for a lock (``busy_timeout``)."""
        return nullcontext()

    def hurry(self, seconds: float | None) -> None:
        """Nothing to end: no server to wait for (a lock's wait ends by ``busy_timeout``)."""

    def close(self) -> None:
        """Close every connection this database opened, in all threads.

        When they were the file's last connections, SQLite copies the WAL into the
        file and removes it: the file alone then holds every commit.
        """
        with self._connections_lock:
            self._closed = True
            if os.getpid() == self._pid:  # a forked child's copies are the parent's
                for conn in self._connections:
                    conn.close()
            self._connections.clear()

    # -- connections and transactions ------------------------------------------

    def connection(self) -> apsw.Connection:
        """This thread's connection, opened at its first use."""
        if self._closed:
            msg = f"Store({self.path!r}) is closed; open a new Store to use {self.path}"
            raise DurableError(msg)
        if os.getpid() != self._pid:
            raise DurableError(forked(self.path, self._pid))
        conn: apsw.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = connect(
                self.path,
                durability=self.durability,
                busy_timeout=self.busy_timeout,
                readonly=self.readonly,
            )
            with self._connections_lock:
                self._connections.append(conn)
                if not self._shapes:
                    self._shapes = row_checks.shapes(conn)
            self._local.conn = conn
        return conn

    def writing(self, *, batch: bool = False) -> _Write:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` on this thread's connection (a batch is
        no different: each statement is a call into the library, not a round trip)."""
        return _Write(self, transaction=True)

    def autocommit(self) -> _Write:
        """This thread's connection, each statement a transaction of its own."""
        return _Write(self, transaction=False)

    @contextmanager
    def reading(self) -> Iterator[apsw.Connection]:
        """One read transaction, so several SELECTs see the same snapshot."""
        conn = self.connection()
        nested = conn.in_transaction
        try:
            with self.damage.watching("a read"), translated(self.path, conn):
                with read_transaction(conn):
                    yield conn
        except StorageError:
            if not nested:
                self._reconnect()
            raise

    def _reconnect(self) -> None:
        """Replace this thread's connection after an I/O error, opening the new one first.

        SQLite rolls a failed transaction back in the file, but FTS5's state in the
        connection did not follow and damaged its index at the next insert (found
        by tests/processes/test_faults.py). Closing the process's last connection first would
        drop the WAL index, and a commit whose sync failed could then be recovered.
        """
        old = self._local.conn
        self._local.conn = None
        try:
            self.connection()
        except DurableError:
            self._local.conn = old  # keep it: nothing better to offer
            return
        with self._connections_lock:
            self._connections.remove(old)
        with suppress(apsw.Error):
            old.close()

    # -- the agents' locks -------------------------------------------------------

    def agent_lock(
        self, agent_id: str, *, wait: float, handoff: Sequence[Any] | None = None
    ) -> _Held:
        """Hold the agent against every other thread and process (locks.py), then write
        the turn's ``handoff`` row (the statement's rows are the block's value)."""
        if os.getpid() != self._pid:
            raise DurableError(forked(self.path, self._pid))
        return _Held(self, agent_id, wait, handoff)

    def fence(self, conn: Conn, agent_id: str) -> None:
        """Nothing to check: a file's record lock lasts as long as the process holding it."""

    def agent_deleted(self, conn: Conn, agent_id: str) -> None:
        """Nothing kept: a file's record lock leaves no row."""

    def scrub(self, tables: Sequence[str]) -> bool:
        """Vacuum a file written before every write overwrote what it deleted (schema 8),
        once; then checkpoint and truncate the WAL, which holds the pages as they were.
        Whether the WAL was emptied (a reader holding an older snapshot keeps it)."""
        conn = self.connection()
        try:
            with self._writer, translated(self.path, conn):
                if conn.execute("SELECT 1 FROM scrubbed").fetchone() is None:
                    conn.execute("VACUUM")  # the free space of years of writes
                    with write_transaction(conn):
                        conn.execute("INSERT INTO scrubbed VALUES (?)", (time.time(),))
                checkpoint = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except DatabaseBusyError:
            return False
        return checkpoint is not None and int(checkpoint[0]) == 0

    def prune_holds(self, conn: Conn) -> None:
        """Nothing to prune: a file's record locks leave no rows."""

    def _start(self, conn: Conn, handoff: Sequence[Any]) -> list[Any]:
        """Write the turn's handoff row, with its checksum (``HANDOFF_INSERT``, engine/seam.py).

        The version it starts from is this Store's hint (the agent's row, read
        and checked at its first use), and the statement writes only while the
        row is still exactly that one: otherwise nothing, and the turn starts
        the checked way (a transaction, ``Turns.start``), which refuses a row that
        fails its checksum.
        """
        agent_id, conversation, template, arguments, host, pid, started_at, told = handoff
        head = self._heads.get(agent_id)
        if head is None:
            self.agent_version(conn, agent_id)
            head = self._heads.get(agent_id)
        base = head.version if head is not None else 0
        row = self._shapes["handoffs"].checksummed(
            (agent_id, conversation, base, template, arguments, "running", None, told)
            + (host, pid, started_at, None)
        )
        if head is None:
            rows: list[Any] = conn.execute(_START_NEW, row).fetchall()
        else:
            rows = conn.execute(_START, (*row, *head)).fetchall()
        return rows

    def agent_version(self, conn: Conn, agent_id: str) -> int | None:
        """The agent's committed version (None: no such agent), its row checked here."""
        row = conn.execute(
            "SELECT agent_id, version, created_at, updated_at, state_in, crc FROM agents"
            " WHERE agent_id = ?",
            (agent_id,),
        ).fetchone()
        if row is None:
            self._heads.pop(agent_id, None)
            return None
        _, version, created_at, updated_at, state_in = self._checked("agents", row)
        self._hint(agent_id, _Head(version, created_at, updated_at, state_in, row[-1]))
        return int(version)

    def _hint(self, agent_id: str, head: _Head) -> None:
        if len(self._heads) >= _HEADS:
            self._heads.clear()  # a bound on memory; the hints come back as agents run
        self._heads[agent_id] = head

    def latest_state(self, conn: Conn, agent_id: str) -> tuple[bool, str | None]:
        """The agent's state now, from the version its row names (``state_in``).

        Call after :meth:`agent_version` in the same transaction. Both rows are
        checked; ``(False, None)`` when the row names no version, or one that is
        gone (pruned: the state is then the retention row's), so that the caller
        walks back through the versions.
        """
        head = self._heads.get(agent_id)
        if head is None or head.state_in is None:
            return False, None
        row = conn.execute(
            f"SELECT {_VERSION_COLUMNS}, crc FROM versions WHERE agent_id = ? AND version = ?",
            (agent_id, head.state_in),
        ).fetchone()
        if row is None:
            return False, None
        state = self._checked("versions", row)[5]
        return (True, str(state)) if state is not None else (False, None)

    def _checked(self, table: str, row: Sequence[Any]) -> tuple[Any, ...]:
        """The values of ``row`` (its table's columns, then crc), checked against its crc."""
        *values, crc = row
        if crc is None or crc != row_checks.row_crc(table, *values):
            raise DamagedRowError(self.path, table, *self._shapes[table].where(tuple(values)))
        return tuple(values)

    def insert(
        self, conn: Conn, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Insert ``rows``, each with its checksum computed here (no trigger rewrites it).

        A version that holds a state becomes its agent's ``state_in`` unless a later
        one is (the commit's advance has set it already for a turn's own version).
        """
        shape = self._shapes.get(table)
        if shape is None or tuple(columns) != shape.columns:  # the trigger computes it
            marks = ", ".join("?" * len(columns))
            conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)
        elif len(rows) == 1:
            conn.execute(shape.insert, shape.checksummed(rows[0]))
        else:
            conn.executemany(shape.insert, [shape.checksummed(row) for row in rows])
        if table == "versions":
            self._state_in(conn, columns, rows)

    def _state_in(self, conn: Conn, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Make each agent's newest inserted version that holds a state its ``state_in``,
        unless its row names a later one (the commit's advance has named the turn's)."""
        agent, version, state = (columns.index(c) for c in ("agent_id", "version", "state"))
        newest: dict[str, int] = {}
        for row in rows:
            if row[state] is not None:
                newest[row[agent]] = max(newest.get(row[agent], 0), row[version])
        for agent_id, pointed in newest.items():
            head = self._heads.get(agent_id)
            if head is not None and head.state_in == pointed:
                continue
            self._heads.pop(agent_id, None)
            conn.execute(
                """
                UPDATE agents SET state_in = ?2
                 WHERE agent_id = ?1 AND (state_in IS NULL OR state_in < ?2)
                """,
                (agent_id, pointed),
            )

    def advance(
        self,
        conn: Conn,
        agent_id: str,
        base_version: int,
        version: int,
        *,
        state_in: int | None = None,
    ) -> None:
        """Move the agent's version, fenced (see engine/seam.py).

        The agent's row is written whole, with its checksum, when this Store's
        hint is still exactly the row: the UPDATE finds it by every value it
        holds (its checksum too). Otherwise the row is updated the checked way
        (its trigger carries a damaged row's discrepancy over), and one that
        moved or fails its checksum raises.
        """
        now = time.time()
        head = self._heads.get(agent_id)
        if base_version == 0:
            crc = row_checks.row_crc("agents", agent_id, version, now, now, state_in)
            conn.execute(
                """
                INSERT INTO agents (agent_id, version, created_at, updated_at, state_in, crc)
                VALUES (?1, ?2, ?3, ?3, ?4, ?5) ON CONFLICT (agent_id) DO NOTHING
                """,
                (agent_id, version, now, state_in, crc),
            )
            if conn.changes() == 1:
                self._hint(agent_id, _Head(version, now, now, state_in, crc))
                return
        elif head is not None and head.version == base_version:
            created = head.created_at
            pointed = state_in if state_in is not None else head.state_in
            crc = row_checks.row_crc("agents", agent_id, version, created, now, pointed)
            conn.execute(
                """
                UPDATE agents SET version = ?2, updated_at = ?3, state_in = ?4, crc = ?5
                 WHERE agent_id = ?1 AND version = ?6 AND created_at = ?7 AND updated_at = ?8
                   AND state_in IS ?9 AND crc = ?10
                """,
                (agent_id, version, now, pointed, crc, *head),
            )
            if conn.changes() == 1:
                self._hint(agent_id, _Head(version, created, now, pointed, crc))
                return
        self._heads.pop(agent_id, None)
        if base_version != 0:
            conn.execute(
                """
                UPDATE agents SET version = ?2, updated_at = ?3, state_in = coalesce(?4, state_in)
                 WHERE agent_id = ?1 AND version = ?5
                """,
                (agent_id, version, now, state_in, base_version),
            )
            if conn.changes() == 1:
                return
        current = self.agent_version(conn, agent_id)
        raise AgentInUseError(agent_id, moved_by(current or 0))

    def _describe_holder(self, agent_id: str, busy: AgentBusy) -> str:
        if busy.holder != "another process":
            return busy.holder
        try:
            row = (
                self.connection()
                .execute(
                    """
                    SELECT pid, host, template FROM handoffs
                     WHERE agent_id = ? AND status = 'running' ORDER BY started_at DESC
                    """,
                    (agent_id,),
                )
                .fetchone()
            )
        except apsw.Error:
            row = None
        if row is None:
            return busy.holder
        pid, host, template = row
        return f"process {pid} on {host} (running {template})"

    # -- what differs from PostgreSQL ---------------------------------------------

    def require(self, feature: str) -> None:
        """SQLite carries every part."""

    def check_writes(self, writes: Sequence[TurnWrite]) -> None:
        """SQLite carries every part."""

    def serialize(self, conn: Conn, scope: str, key: str) -> None:
        """Nothing to do: SQLite has one writer at a time."""

    def select_for_claim(self, conn: Conn, query: str, params: Sequence[Any]) -> Rows:
        # BEGIN IMMEDIATE already holds every other claimer off until commit.
        return conn.execute(query, params)

    def watch_commits(self, wake: Callable[[], None]) -> MarkerWatch:
        """Poll ``PRAGMA data_version`` in a thread of its own (engine/watch.py)."""
        return MarkerWatch(self._data_version, wake, location=self.path)

    def _data_version(self) -> int:
        """This thread's connection's ``PRAGMA data_version``: it moves when another
        connection commits to the file."""
        return int(self.connection().pragma("data_version"))

    def check_rows(self, conn: Conn, table: str, where: str, params: Sequence[Any]) -> None:
        payload = row_checks.PAYLOAD[table]
        conn.execute(f"SELECT count({payload}) FROM checked_{table} WHERE {where}", params)

    def active_messages(
        self, conn: Conn, agent_id: str, conversation: str
    ) -> Iterator[tuple[float, bytes]]:
        # Checked here rather than through checked_messages: a call from SQLite
        # per row would double the cost of loading a long history. SQLite writes
        # the text of each row's other values; the body comes as its UTF-8 bytes,
        # which the check and the JSON decoder both take as they are.
        rows = conn.execute(
            f"""
            SELECT position, CAST({row_checks.MESSAGE_HEAD} AS BLOB), CAST(body AS BLOB), crc
              FROM messages
             WHERE agent_id = ? AND conversation = ? AND removed_in IS NULL
             ORDER BY position
            """,
            (agent_id, conversation),
        )
        return row_checks.active_messages(
            rows, self.path, agent_id, conversation, self._exact_message
        )

    def _exact_message(self, agent_id: str, conversation: str, position: float) -> None:
        """Check an active message's row as the view does (after the quick check failed)."""
        conn = self.connection()
        row = conn.execute(
            """
            SELECT agent_id, conversation, position, added_in, removed_in, message_id, role,
                   body, crc
              FROM messages
             WHERE agent_id = ? AND conversation = ? AND position = ? AND removed_in IS NULL
            """,
            (agent_id, conversation, position),
        ).fetchone()
        if row is None:  # not found again in the same snapshot: it cannot be trusted
            raise DamagedRowError(self.path, "messages", agent_id, conversation, None)
        self._checked("messages", row)

    def index_compacted(
        self,
        conn: Conn,
        agent_id: str,
        version: int,
        first_position: float,
        last_position: float,
        conversation: str,
    ) -> None:
        conn.execute(
            f"""
            INSERT INTO compacted_text (text, agent_id, position, version)
            SELECT {_indexed_text("body")}, agent_id, position, removed_in
              FROM messages
             WHERE agent_id = ?1 AND conversation = ?5 AND removed_in = ?2
               AND position BETWEEN ?3 AND ?4 AND json_valid(body)
            """,
            (agent_id, version, first_position, last_position, conversation),
        )

    def search_compacted(
        self, conn: Conn, agent_id: str, words: list[str], limit: int, conversation: str
    ) -> list[str]:
        # Each word quoted: an FTS5 phrase, so that no word is read as an operator.
        query = " ".join('"' + w.replace('"', '""') + '"' for w in words)
        rows = conn.execute(
            f"""
            SELECT m.body FROM compacted_text AS t
              JOIN checked_messages AS m
                ON m.agent_id = t.agent_id AND m.position = t.position
               AND m.removed_in = t.version
               AND CASE WHEN json_valid(m.body) THEN t.text IS {_indexed_text("m.body")} END
             WHERE compacted_text MATCH ?2 AND t.agent_id = ?1 AND m.conversation = ?4
             ORDER BY t.rank LIMIT ?3
            """,
            (agent_id, query, limit, conversation),
        ).fetchall()
        return [str(body) for (body,) in rows]

    def columns(self, conn: Conn) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for table, column in conn.execute(
            """
            SELECT t.name, c.name FROM sqlite_schema AS t, pragma_table_info(t.name) AS c
             WHERE t.type = 'table' ORDER BY t.name, c.cid
            """
        ):
            found.setdefault(str(table), []).append(str(column))
        return found

    def check(self) -> dict[str, Any]:
        """``PRAGMA integrity_check`` ("ok" when sound), the rows that fail their
        checksums (row_checks.py), and quick facts about the file."""
        conn = self.connection()
        integrity = [str(row[0]) for row in conn.execute("PRAGMA integrity_check")]
        if not self.readonly:  # FTS5 checks its index against its text only as a write
            try:
                command = "VALUES ('integrity-check', 1)"
                conn.execute(f"INSERT INTO compacted_text (compacted_text, rank) {command}")
            except apsw.CorruptError as e:
                integrity = [line for line in integrity if line != "ok"] + [str(e)]
        unmatched = conn.execute(
            f"""
            SELECT count(*) FROM compacted_text AS t
              LEFT JOIN messages AS m
                ON m.agent_id = t.agent_id AND m.position = t.position
               AND m.removed_in = t.version
             WHERE CASE WHEN m.body IS NULL OR NOT json_valid(m.body) THEN 1
                        ELSE t.text IS NOT {_indexed_text("m.body")} END
            """
        ).get
        if unmatched:
            integrity = [line for line in integrity if line != "ok"]
            integrity.append(f"{unmatched} rows of compacted_text differ from their messages")
        facts: dict[str, Any] = {
            "integrity": "; ".join(integrity),
            "damaged_rows": [dataclasses.asdict(row) for row in row_checks.damaged_rows(conn)],
            "schema": conn.pragma("user_version"),
        }
        for table in (
            "agents",
            "conversations",
            "versions",
            "messages",
            "workflow_steps",
            "memory",
        ):
            facts[table] = conn.execute(f"SELECT count(*) FROM {table}").get
        sizes = [os.path.getsize(p) for p in (self.path, self.path + "-wal") if os.path.exists(p)]
        facts["bytes"] = sum(sizes)
        return facts


# A turn's handoff row as it starts, with its checksum: HANDOFF_INSERT's twin.
# Parameters: the row's values in order, its crc, then the Store's hint of the
# agent's row (its values but the id, and its crc): the row is written only while
# the agent's row is exactly that one. _START_NEW: for an agent not in the file.
_HANDOFF = """
    INSERT INTO handoffs (agent_id, conversation, base_version, template, arguments,
        status, error, interrupted, host, pid, started_at, ended_at, crc)
    SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13
     WHERE {agent}
       AND NOT EXISTS (SELECT 1 FROM approvals
                        WHERE agent_id = ?1 AND conversation = ?2 AND ended_in IS NULL)
    ON CONFLICT (agent_id, conversation) DO NOTHING
    RETURNING base_version
"""
_START = _HANDOFF.format(
    agent="EXISTS (SELECT 1 FROM agents WHERE agent_id = ?1 AND version = ?14"
    " AND created_at = ?15 AND updated_at = ?16 AND state_in IS ?17 AND crc = ?18)"
)
_START_NEW = _HANDOFF.format(agent="NOT EXISTS (SELECT 1 FROM agents WHERE agent_id = ?1)")

# How many agents' hints a Store keeps (SQLiteDatabase._heads) before it starts afresh.
_HEADS = 10_000

_VERSION_COLUMNS = (
    "agent_id, version, kind, conversation, template, state, added, removed, detail, committed_at"
)


class _Head(NamedTuple):
    """An agent's row as a Store last read or wrote it (the hint of SQLiteDatabase._heads):
    its values but the id, and its crc."""

    version: int
    created_at: float
    updated_at: float
    state_in: int | None
    crc: int


def _indexed_text(body: str) -> str:
    """The text of the message ``body`` that recall indexes: its text blocks, plain
    content and tool-call arguments (of bodies SQLite's JSON functions read: not
    nested deeper than 1,000, sqlite.org/json1.html#jmini)."""
    return f"""concat_ws(
        ' ',
        CASE json_type({body}, '$.content')
        WHEN 'array' THEN (
            SELECT group_concat(json_extract(value, '$.text'), ' ')
              FROM json_each({body}, '$.content'))
        ELSE json_extract({body}, '$.content') END,
        json_extract({body}, '$.tool_calls'))"""


class _Write:
    """A write on the thread's connection: one transaction, or statements that each commit.

    The errors of the block, of its BEGIN and of its COMMIT come out as the Store's:
    an I/O error as StorageError (the connection is then replaced), damage as
    DatabaseCorruptError, a lock not obtained in time as DatabaseBusyError. A
    class, not stacked generator context managers: it runs twice in every turn.
    """

    __slots__ = ("_conn", "_db", "_nested", "_transaction")

    _conn: apsw.Connection

    def __init__(self, db: SQLiteDatabase, *, transaction: bool) -> None:
        self._db = db
        self._transaction = transaction

    def __enter__(self) -> apsw.Connection:
        db = self._db
        db.damage.check_writable("a write")
        conn = self._conn = db.connection()
        # Autocommit statements inside this thread's open write join it; it translates.
        self._nested = not self._transaction and conn.in_transaction
        if self._nested:
            return conn
        if not db._writer.acquire(timeout=db.busy_timeout):
            raise DatabaseBusyError(db.path, db.busy_timeout)
        if self._transaction:
            try:
                conn.execute("BEGIN IMMEDIATE")
            except BaseException as error:
                db._writer.release()
                raise self._translated(error) from error
        return conn

    def __exit__(self, kind: object, error: BaseException | None, traceback: object) -> None:
        failed = error is not None
        try:
            self._finish(error)
        except BaseException:
            failed = True
            raise
        finally:
            if failed:  # what the block wrote of the agents' rows was rolled back
                self._db._heads.clear()
            if not self._nested:
                self._db._writer.release()

    def _finish(self, error: BaseException | None) -> None:
        raised = error
        if self._transaction:
            try:
                if error is None:
                    self._conn.execute("COMMIT")
                elif self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
            except BaseException as failure:
                raised = failure
        if raised is None or self._nested:
            return
        ours = self._translated(raised)
        if ours is not raised:
            raise ours from raised
        if raised is not error:
            raise raised

    def _translated(self, error: BaseException) -> BaseException:
        db = self._db
        driver = translate(error, db.path, self._conn) if isinstance(error, apsw.Error) else None
        ours = driver or db.damage.translated(error, "a write")
        if isinstance(ours, StorageError):
            db._reconnect()
        elif isinstance(ours, apsw.BusyError):
            ours = DatabaseBusyError(db.path, db.busy_timeout)
        elif isinstance(ours, apsw.ReadOnlyError):
            msg = f"{db.path} is open read-only; open Store({db.path!r}) to change it"
            ours = DurableError(msg)
        return ours


class _Held:
    """An agent's lock held for a ``with`` block (locks.py), and its handoff row's rows."""

    __slots__ = ("_agent_id", "_db", "_handoff", "_wait")

    def __init__(
        self, db: SQLiteDatabase, agent_id: str, wait: float, handoff: Sequence[Any] | None
    ) -> None:
        self._db, self._agent_id, self._wait, self._handoff = db, agent_id, wait, handoff

    def __enter__(self) -> list[Any] | None:
        try:
            self._db._locks.acquire(self._agent_id, wait=self._wait)
        except AgentBusy as busy:
            holder = self._db._describe_holder(self._agent_id, busy)
            raise AgentInUseError(self._agent_id, holder) from None
        if self._handoff is None:
            return None
        try:
            with self._db.autocommit() as conn:
                return self._db._start(conn, self._handoff)
        except BaseException:
            self._db._locks.release(self._agent_id)
            raise

    def __exit__(self, *exc_info: object) -> None:
        self._db._locks.release(self._agent_id)
