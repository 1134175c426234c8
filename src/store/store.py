"""Store: the durable log of agents, on an SQLite file or a PostgreSQL database.

The Store is assembled from one module per concern: this one picks the engine
(``engine/sqlite/`` or ``engine/postgres/``, behind ``engine/seam.py``) and holds
it, with what the engines leave to the layers above them: the parts of an
agent's record (``PARTS``, from ``parts/``) and this machine's cache of the
agents' SQL workspace files (``workspace/``). ``reads.py``, ``turns.py`` (the
turn protocol and its one commit), ``maintenance.py`` (rollback, fork, delete,
retention), ``agent_parts.py`` (memory, SQL workspace, alarms) and
``journal.py`` (workflow journals) hold the methods, the same on both backends.
"""

from __future__ import annotations

import atexit
import os
import weakref
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Literal, cast

import apsw

from ..errors import NotSupportedError
from .agent_parts import PartMethods
from .browse import BrowseMethods
from .diff import DiffMethods
from .engine.seam import DEFAULT_STATEMENT_TIMEOUT, Conn, Database, is_postgres_url
from .engine.sqlite.connection import Durability
from .engine.sqlite.damage import DamageWatch, watched
from .engine.sqlite.database import SQLiteDatabase
from .ids import validate_agent_id
from .journal import WorkflowJournal
from .maintenance import Maintenance
from .parts.alarms import AlarmPart
from .parts.approvals import ApprovalPart
from .parts.conversation_fields import ConversationFields
from .parts.conversations import Conversations
from .parts.memory import MemoryPart, MemoryRows
from .parts.versioned import VersionedPart
from .reads import StoreReads
from .turns import TurnProtocol
from .waiting import WaitingMethods
from .workspace.cache import WorkspaceCache
from .workspace.part import WorkspacePart

# Every part of an agent's record besides messages, fields and the SQL workspace
# (whose part knows where this machine's workspace files are): rollback, fork,
# prune and delete carry each of them (see parts/versioned.py). Both backends
# carry every part.
PARTS: tuple[VersionedPart, ...] = (
    Conversations(),
    ConversationFields(),
    MemoryPart(),
    AlarmPart(),
    ApprovalPart(),
)


@watched(lambda store: store._damage)  # SQLite's reports of damage -> DatabaseCorruptError
class Store(
    StoreReads,
    BrowseMethods,
    DiffMethods,
    TurnProtocol,
    Maintenance,
    PartMethods,
    WaitingMethods,
    WorkflowJournal,
):
    """The durable log of every agent in one SQLite database file or PostgreSQL database.

    Reads (``agents``, ``history``, ``conversations``, ``state``, ``memory``,
    ``memory_notes``, ``versions``, ``handoffs``, ``search_compacted``,
    ``workflows``, ``steps``; a page at a time: ``agent_page``, ``timeline``,
    ``version_page``; ``diff`` of two versions) see the last committed versions.
    Maintenance (``rollback``, ``fork``, ``delete``, ``reset_workflow``, ``prune``)
    takes the agent's lock, so it never races a running turn; ``vacuum`` and
    ``backup`` work on the whole file while turns go on. The remaining methods are the
    turn protocol PersistenceHandler uses. Each thread gets its own connection;
    close the store when done, or use it as a context manager.

    Args:
        path: SQLite file; created if missing, refused if it is not ours. Or a
            ``postgresql://`` URL (libpq's form; needs the ``postgres`` extra): its
            database gets our tables if it has none, and is refused if it holds
            another program's. ``vacuum`` is SQLite-only (NotSupportedError on
            PostgreSQL).
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
        pool_size: PostgreSQL only: the most connections the store opens at once.
            A process needs at least 2 (a pooled one, and one renewing the
            agents' holds); see :doc:`/backends`.
        statement_timeout: PostgreSQL only: the longest, in seconds, a statement
            may run and any call may wait for the server (for a connection, and
            for each answer); past it the call raises DatabaseUnavailableError,
            so that a frozen server is an error, not a hang. Model calls are not
            database time. None: no limit.
        wait_for_database: PostgreSQL only: how long opening waits for a server
            that does not answer yet (default: ``busy_timeout``, at least 5 s).
        renewal_url: PostgreSQL only: where the connection that renews this
            store's holds on agents connects, if not to ``path``: behind a
            pooler whose pool the workload may fill (PgBouncer), the server
            itself, or a pooler database of its own, so that renewals never
            wait behind turns (see :doc:`/production`, "Renewals").
        workspace_dir: PostgreSQL only: the directory under which this machine
            keeps its copies of the agents' SQL tables (``SQLTools``), one
            subdirectory per database; by default
            ``$XDG_CACHE_HOME/effectful-durable/workspaces`` (``~/.cache/...``).
            The copies are a cache of the log in the database: any of them may be
            deleted at any time. An SQLite database keeps its agents' tables beside
            it, in ``<db>-workspaces/``.

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
        pool_size: int = 10,
        workspace_dir: str | os.PathLike[str] | None = None,
        statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
        wait_for_database: float | None = None,
        renewal_url: str | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.durability: Durability = durability
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        if on_unreadable not in ("refuse", "quarantine") or (
            readonly and on_unreadable == "quarantine"
        ):
            msg = (
                "on_unreadable must be 'refuse' or, for a read-write Store, "
                f"'quarantine'; not {on_unreadable!r}"
            )
            raise ValueError(msg)
        self._db: Database
        if is_postgres_url(self.path):
            from .engine.postgres.database import PostgresDatabase  # psycopg only when asked for

            if on_unreadable != "refuse":
                msg = "on_unreadable='quarantine' is for SQLite files, not PostgreSQL databases"
                raise ValueError(msg)
            db = PostgresDatabase(
                self.path,
                busy_timeout=busy_timeout,
                readonly=readonly,
                pool_size=pool_size,
                workspace_dir=None if workspace_dir is None else os.fspath(workspace_dir),
                statement_timeout=statement_timeout,
                wait_for_database=wait_for_database,
                renewal_url=renewal_url,
            )
            self._db = db
            self._damage = DamageWatch(db.location, [])
            # Many machines share the log: each file is trusted only while stamped
            # with the commit it holds (workspace/cache.py).
            self._workspaces = WorkspaceCache(db.workspace_directory, stamped=True)
        else:
            if renewal_url is not None:
                msg = "renewal_url is for PostgreSQL; an SQLite file's holds need no renewals"
                raise ValueError(msg)
            if workspace_dir is not None:
                msg = (
                    "workspace_dir is for PostgreSQL; an SQLite database keeps its agents' "
                    f"SQL tables beside it, in {self.path}-workspaces"
                )
                raise ValueError(msg)
            sqlite = SQLiteDatabase(
                self.path,
                durability=durability,
                busy_timeout=busy_timeout,
                readonly=readonly,
                on_unreadable=on_unreadable,
            )
            self._db = self._sqlite = sqlite
            self._damage = sqlite.damage
            self._workspaces = WorkspaceCache.beside(self.path)
            self._pid = os.getpid()
            _open.add(self)
        self._workspace_part = WorkspacePart(self._workspaces)
        self.memory_rows = MemoryRows(self._reading)  # current memory, for the handler

    def __repr__(self) -> str:
        return f"Store({self._db.location!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this store opened, in all threads."""
        self._close()

    # -- the agents' locks ----------------------------------------------------

    def agent_lock(self, agent_id: str, *, wait: float = 0.0) -> AbstractContextManager[None]:
        """Hold the agent against every other thread and process.

        Raises:
            InvalidAgentIdError: ``agent_id`` is not a valid agent id.
            AgentInUseError: It stayed held for longer than ``wait`` seconds.
        """
        # Checked here, as the lock is taken only when the block is entered, past the
        # translation of the lock's errors (a lone surrogate cannot name a lock file).
        # Without a first statement the block's value is None.
        return cast(
            AbstractContextManager[None],
            self._db.agent_lock(validate_agent_id(agent_id), wait=wait),
        )

    # -- internals -----------------------------------------------------------

    def _close(self) -> None:
        # Not wrapped by @watched: the exit hook below meets SQLite's own errors.
        _open.discard(self)
        try:
            self._db.close()
        finally:
            self._workspaces.close()

    @property
    def _parts(self) -> tuple[VersionedPart, ...]:
        """The parts of an agent's record besides messages and fields: rollback,
        fork, prune and delete go through each."""
        # Read at each use, so that a test may replace the module's tuple.
        return (*PARTS, self._workspace_part)

    def _connection(self) -> apsw.Connection:
        """This thread's SQLite connection (SQLite only: vacuum, backup)."""
        return self._sqlite_db().connection()

    def _store_at(self, path: str) -> Store:
        """A new Store on ``path``, with the defaults (backup of a PostgreSQL database)."""
        return Store(path)

    def _sqlite_db(self) -> SQLiteDatabase:
        if not isinstance(self._db, SQLiteDatabase):
            what = "a direct SQLite connection (Store._connection)"
            raise NotSupportedError(what, "PostgreSQL")
        return self._db

    def _writing(self) -> AbstractContextManager[Conn]:
        return self._db.writing()

    @contextmanager
    def _fenced_writing(self, agent_id: str) -> Iterator[Conn]:
        """A write transaction under this Store's hold on ``agent_id``: it lands only
        while the hold does (``Database.fence``)."""
        with self._db.writing() as conn:
            self._db.fence(conn, agent_id)
            yield conn

    @contextmanager
    def _holding(self, agent_id: str) -> Iterator[Conn]:
        """Hold ``agent_id`` (at once, or :class:`AgentInUseError`) and write under the hold."""
        with self.agent_lock(agent_id), self._fenced_writing(agent_id) as conn:
            yield conn

    def _reading(self) -> AbstractContextManager[Conn]:
        """One read transaction, so several SELECTs see the same snapshot."""
        return self._db.reading()

    @property
    def _identity(self) -> str:
        """The database, the same for every Store on it: a file's real path, or the URL."""
        if isinstance(self._db, SQLiteDatabase):
            return os.path.realpath(self.path)
        return self.path


# The SQLite stores this process opened and has not closed: a normal interpreter
# exit closes them, so that a program that never called close() leaves one file.
_open: weakref.WeakSet[Store] = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    for store in list(_open):
        if store._pid == os.getpid():  # not a forked child's copy of its parent's
            with suppress(apsw.Error):
                store._close()
