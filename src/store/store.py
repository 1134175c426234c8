"""Store: the durable log of agents on one SQLite file, and the only code that writes SQL.

The Store is assembled from one module per concern: this one opens the file and
holds the connections (one per thread) and the agents' locks; ``reads.py``,
``turns.py`` (the turn protocol and its one commit), ``maintenance.py``
(rollback, fork, delete, retention), ``agent_parts.py`` (memory, SQL workspace,
alarms) and ``journal.py`` (workflow journals) hold the methods.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from typing import Literal

import apsw

from ..errors import (
    AgentInUseError,
    DatabaseBusyError,
    DatabaseCorruptError,
    DurableError,
    NotOurDatabaseError,
    StorageError,
)
from .agent_parts import PartMethods
from .connection import Durability, connect, quarantine, read_transaction, write_transaction
from .damage import DamageWatch, watched
from .journal import WorkflowJournal
from .locks import AgentBusy, AgentLocks
from .maintenance import Maintenance
from .memory import MemoryRows
from .reads import StoreReads
from .rows import current_version
from .translate import translated
from .turns import TurnProtocol
from .workspace import WorkspaceFiles


@watched(lambda store: store._damage)  # SQLite's reports of damage -> DatabaseCorruptError
class Store(StoreReads, TurnProtocol, Maintenance, PartMethods, WorkflowJournal):
    """The durable log of every agent in one SQLite database file.

    Reads (``agents``, ``history``, ``conversations``, ``state``, ``memory``,
    ``memory_notes``, ``versions``, ``handoffs``, ``search_compacted``,
    ``workflows``, ``steps``) see the last committed versions.
    Maintenance (``rollback``, ``fork``, ``delete``, ``reset_workflow``, ``prune``)
    takes the agent's lock, so it never races a running turn; ``vacuum`` and
    ``backup`` work on the whole file while turns go on. The remaining methods are the
    turn protocol PersistenceHandler uses. Each thread gets its own connection;
    close the store when done, or use it as a context manager.

    Args:
        path: SQLite file; created if missing, refused if it is not ours.
        durability: ``"normal"`` survives process crashes; ``"full"`` also power loss.
        busy_timeout: Seconds to wait for another writer before DatabaseBusyError.
        readonly: Open for inspection only.
        on_unreadable: What to do when ``path`` is not an effectful-durable
            database (not SQLite, damaged, or another program's): ``"refuse"``
            raises NotOurDatabaseError (DatabaseCorruptError if damaged) and
            touches nothing; ``"quarantine"``
            renames it (with its ``-wal`` and ``-shm`` files) to
            ``<name>.unreadable-<UTC time>``, logs a warning naming the new name,
            and starts a new database at ``path``. A file written by a newer
            version is always refused.

    Raises:
        NotOurDatabaseError: ``path`` is not an effectful-durable database.
        DatabaseCorruptError: SQLite found ``path`` damaged, on opening or later
            (every method may raise it; the store then refuses to write).
        SchemaTooNewError: ``path`` was written by a newer version.

    Example::

        with Store("state.db") as store:
            for agent in store.agents():
                print(agent.agent_id, agent.version, agent.messages)

    .. versionadded:: 0.1.0
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: Durability = "normal",
        busy_timeout: float = 5.0,
        readonly: bool = False,
        on_unreadable: Literal["refuse", "quarantine"] = "refuse",
    ) -> None:
        self.path = os.fspath(path)
        self.durability: Durability = durability
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self._local = threading.local()
        self._connections: list[apsw.Connection] = []
        self._workspace_caches: list[WorkspaceFiles] = []
        self._connections_lock = threading.Lock()
        self._closed = False
        self._damage = DamageWatch(self.path, self._connections)
        if on_unreadable not in ("refuse", "quarantine") or (
            readonly and on_unreadable == "quarantine"
        ):
            msg = (
                "on_unreadable must be 'refuse' or, for a read-write Store, "
                f"'quarantine'; not {on_unreadable!r}"
            )
            raise ValueError(msg)
        try:
            self._connection()  # fail here, not at the first turn, if the file is bad
        except (NotOurDatabaseError, DatabaseCorruptError):
            if on_unreadable == "refuse":
                raise
            try:  # another process may have moved it aside and started afresh meanwhile
                self._connection()
            except (NotOurDatabaseError, DatabaseCorruptError):
                quarantine(self.path)
                self._connection()
        self._locks = AgentLocks.for_database(self.path)
        self.memory_rows = MemoryRows(self._reading)  # current memory, for the handler

    def __repr__(self) -> str:
        return f"Store({self.path!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this store opened, in all threads."""
        with self._connections_lock:
            self._closed = True
            for files in self._workspace_caches:
                files.close()
            self._workspace_caches.clear()
            for conn in self._connections:
                conn.close()
            self._connections.clear()

    # -- the agents' locks ----------------------------------------------------

    @contextmanager
    def agent_lock(self, agent_id: str, *, wait: float = 0.0) -> Iterator[None]:
        """Hold the agent against every other thread and process.

        Raises:
            AgentInUseError: It stayed held for longer than ``wait`` seconds.
        """
        try:
            self._locks.acquire(agent_id, wait=wait)
        except AgentBusy as busy:
            holder = self._describe_holder(agent_id, busy)
            raise AgentInUseError(agent_id, holder) from None
        try:
            yield
        finally:
            self._locks.release(agent_id)

    # -- internals -----------------------------------------------------------

    def _connection(self) -> apsw.Connection:
        if self._closed:
            msg = f"{self!r} is closed; open a new Store to use {self.path}"
            raise DurableError(msg)
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
            self._local.conn = conn
        return conn

    @contextmanager
    def _writing(self) -> Iterator[apsw.Connection]:
        self._damage.check_writable("a write")
        try:
            with self._damage.watching("a write"), write_transaction(self._connection()) as conn:
                yield conn
        except StorageError:
            self._reconnect()
            raise
        except apsw.BusyError as e:
            raise DatabaseBusyError(self.path, self.busy_timeout) from e
        except apsw.ReadOnlyError as e:
            msg = f"{self.path} is open read-only; open Store({self.path!r}) to change it"
            raise DurableError(msg) from e

    @contextmanager
    def _reading(self) -> Iterator[apsw.Connection]:
        """One read transaction, so several SELECTs see the same snapshot."""
        conn = self._connection()
        nested = conn.in_transaction
        try:
            with self._damage.watching("a read"), translated(self.path, conn):
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
        by tests/test_faults.py). Closing the process's last connection first would
        drop the WAL index, and a commit whose sync failed could then be recovered.
        """
        old = self._local.conn
        self._local.conn = None
        try:
            self._connection()
        except DurableError:
            self._local.conn = old  # keep it: nothing better to offer
            return
        with self._connections_lock:
            self._connections.remove(old)
        with suppress(apsw.Error):
            old.close()

    def _version_of(self, agent_id: str) -> int | None:
        return current_version(self._connection(), agent_id)

    def _describe_holder(self, agent_id: str, busy: AgentBusy) -> str:
        if busy.holder != "another process":
            return busy.holder
        try:
            row = (
                self._connection()
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
