"""The seam between the Store's shared logic and the database it runs on.

A Store holds one :class:`Database`: ``SQLiteDatabase`` (``engine/sqlite/``) for
a file path, ``PostgresDatabase`` (``engine/postgres/``) for a ``postgresql://``
URL. The shared modules above it (the Store's own in ``store/``, the parts in
``store/parts/``, the SQL workspace's log in ``store/workspace/``) run their SQL
on a :class:`Conn`, written in the subset both databases read: ``?`` or ``?N``
parameters (PostgreSQL's connection rewrites them), upserts spelled ``ON
CONFLICT``, no SQLite-only functions (nor the scalar ``max(a, b)``). What
differs (full-text search, locking a row, claiming a row that other claimers
skip, serialising writers, waking the alarm runners, what the file or server can
check) is a method or attribute of the Database, and its SQL lives in that
engine's package. Where this machine keeps the agents' SQL workspace files
differs too: beside the SQLite file, or in a cache directory per PostgreSQL
database (``PostgresDatabase.workspace_directory``); the Store makes that cache.

Besides the protocols, this module holds what both engines and the layers above
them share: :class:`TurnWrite`, :data:`HANDOFF_INSERT`,
:data:`DEFAULT_STATEMENT_TIMEOUT` and :data:`APPLICATION_ID`. It imports nothing
of ours.

A part a backend does not carry yet is refused there (:meth:`Database.require`,
:meth:`Database.check_writes`), never half done.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from ..sealing import Sealer

#: What marks a database as ours: SQLite's ``PRAGMA application_id`` ("EFDU"),
#: and on PostgreSQL the ``application_id`` of the ``effectful_durable`` table.
APPLICATION_ID = 0x45464455

#: The default ``statement_timeout`` of a Store on a database server, in seconds:
#: the longest a statement may run and a call wait for the server.
DEFAULT_STATEMENT_TIMEOUT = 10.0


class Rows(Protocol):
    """The result of :meth:`Conn.execute`: an apsw Cursor, or PostgreSQL's equivalent."""

    def fetchone(self) -> Any:
        """The next row as a tuple, or None."""

    def fetchall(self) -> list[Any]:
        """The remaining rows, as tuples."""

    def __iter__(self) -> Iterator[Any]: ...

    @property
    def get(self) -> Any:
        """apsw's shorthand: None, the one value, one row's tuple, or the list of rows."""


class Conn(Protocol):
    """A connection inside one of the Store's transactions (an ``apsw.Connection`` on SQLite)."""

    def execute(self, statements: str, bindings: Any = None, /) -> Rows:
        """Run one statement with ``?``/``?N`` parameters."""

    def executemany(self, statements: str, sequenceofbindings: Iterable[Any], /) -> Any:
        """Run one statement for each set of parameters."""

    def changes(self) -> int:
        """Rows changed by the last INSERT, UPDATE or DELETE."""


#: A turn's handoff row as the turn starts, unless an earlier handoff of the
#: conversation is there, or a suspended turn: then no row. Parameters: agent,
#: conversation, template, arguments (JSON), host, pid, started_at, interrupted
#: (JSON or None). Its row is the version the turn starts from. PostgreSQL's
#: ``effectful_durable_take`` (engine/postgres/schema.sql) does the same.
HANDOFF_INSERT = """
    INSERT INTO handoffs (agent_id, conversation, base_version, template, arguments,
        status, interrupted, host, pid, started_at)
    SELECT ?1, ?2, coalesce((SELECT version FROM checked_agents WHERE agent_id = ?1), 0), ?3, ?4,
        'running', ?8, ?5, ?6, ?7
     WHERE NOT EXISTS (SELECT 1 FROM approvals
                        WHERE agent_id = ?1 AND conversation = ?2 AND ended_in IS NULL)
    ON CONFLICT (agent_id, conversation) DO NOTHING
    RETURNING base_version
"""


class TurnWrite(Protocol):
    """Something a turn writes besides messages and fields, in the turn's transaction."""

    def write(self, conn: Conn, agent_id: str, version: int, sealer: Sealer) -> None:
        """Apply the write as part of ``version`` of ``agent_id``, its content sealed by
        ``sealer``; raise to abort the turn."""


class CommitWatch(Protocol):
    """What tells a reader of the database that another process committed (``watch_commits``)."""

    def close(self) -> None:
        """Stop watching."""


class Database(Protocol):
    """What a Store needs of the database it runs on (one per Store)."""

    #: ``"sqlite"`` or ``"postgresql"``.
    kind: str
    #: The file path, or the URL without its password: named in messages.
    location: str
    #: The database, the same for every Store on it: a file's real path, or the URL.
    identity: str
    #: Opened read-only (``Store(..., readonly=True)``): every write is refused.
    readonly: bool
    #: An SQL expression for the database's own time, in seconds since the epoch:
    #: runners on many machines write and judge their heartbeats by this one clock.
    now_sql: str
    #: The longest a call may wait for a database server, in seconds (None: no
    #: limit); assignable. An SQLite file has no server: it is None there, unused.
    statement_timeout: float | None

    def reading(self) -> AbstractContextManager[Conn]:
        """One read transaction (or the thread's open write): several reads, one snapshot."""

    def writing(self, *, batch: bool = False) -> AbstractContextManager[Conn]:
        """One write transaction: committed when the block ends, rolled back if it raises.

        With ``batch``, the statements may travel to the server together, with the
        commit (PostgreSQL's pipeline mode): reading a statement's rows or
        :meth:`Conn.changes` then waits for its answer, and a statement's error may
        be raised by a later statement or at the end of the block.
        """

    def agent_lock(
        self, agent_id: str, *, wait: float, handoff: Sequence[Any] | None = None
    ) -> AbstractContextManager[list[Any] | None]:
        """Hold ``agent_id`` against every other thread and process.

        With ``handoff`` (:data:`HANDOFF_INSERT`'s parameters), start a turn as
        soon as the lock is held: write its handoff row, in a transaction of its
        own, and give that statement's rows as the block's value (on PostgreSQL
        one statement takes the lock and writes the row: one round trip).

        Raises:
            AgentInUseError: It stayed held for longer than ``wait`` seconds.
        """

    def fence(self, conn: Conn, agent_id: str) -> None:
        """Refuse this transaction's writes unless this Store still holds ``agent_id``
        (when it holds it at all), and keep the hold until the transaction ends:
        checked again just before the COMMIT, which lands only while the hold does.

        For the writes made under a hold besides the commit's own (which
        :meth:`advance` fences): a turn's start and the record of its failure,
        rollback, fork, deletion and pruning (``store/holds.py``). A hold
        can be lost only where it is a lease (PostgreSQL); elsewhere this checks
        nothing.

        Raises:
            HoldLapsedError: The hold lapsed, or another process took the agent.
        """

    def agent_version(self, conn: Conn, agent_id: str) -> int | None:
        """The agent's committed version, or None if the database does not know it."""

    def latest_state(self, conn: Conn, agent_id: str) -> tuple[bool, str | None]:
        """The agent's state now (its fields' JSON), when this database keeps where it
        is: ``(True, state)``; ``(False, None)`` asks the caller to find it from the
        versions. Call after :meth:`agent_version`, in the same transaction."""

    def insert(
        self, conn: Conn, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Insert ``rows``, each the values of ``columns`` in order, into ``table``."""

    def advance(
        self,
        conn: Conn,
        agent_id: str,
        base_version: int,
        version: int,
        *,
        state_in: int | None = None,
    ) -> None:
        """Move the agent from ``base_version`` to ``version`` (a new agent from 0),
        fenced: the write fails unless no other writer moved it since ``base_version``,
        and unless this Store's hold on it, if it holds it, is still its own.
        ``state_in``: the new version that holds a state, if one does.

        The agents row stays locked until the transaction ends. In a batch the
        failure may come at a later statement or at the end of the block.

        Raises:
            AgentInUseError: Another writer committed since ``base_version``.
            HoldLapsedError: The hold lapsed, or another process took the agent.
        """

    def close(self) -> None:
        """Close every connection, in all threads."""

    def unhurried(self) -> AbstractContextManager[None]:
        """Lift the statement timeout for this thread's calls in the block.

        For maintenance that may take long on a large database (a prune, a fork,
        a copy); a database without such a timeout returns a block that does
        nothing.
        """

    def hurry(self, seconds: float | None) -> None:
        """End every wait for a server within ``seconds`` from now, those in progress
        included (a process stopping past its grace period); None lifts it. A
        database without a server to wait for does nothing.
        """

    def require(self, feature: str) -> None:
        """Raise NotSupportedError unless this database carries ``feature``."""

    def check_writes(self, writes: Sequence[TurnWrite]) -> None:
        """Raise NotSupportedError for a turn write of a part this database does not carry."""

    def serialize(self, conn: Conn, scope: str, key: str) -> None:
        """Hold writers of ``(scope, key)`` (a workflow's step numbers) off until commit."""

    def select_for_claim(self, conn: Conn, query: str, params: Sequence[Any]) -> Rows:
        """Run the SELECT ``query`` for rows this write transaction claims.

        Rows another transaction is claiming are skipped, never waited for, and
        the rows returned stay held against other claimers until this one ends.
        """

    def watch_commits(self, wake: Callable[[], None]) -> CommitWatch:
        """Call ``wake`` (from another thread) soon after each commit to the database.

        A commit is noticed without reading any table, by polling a marker that
        every commit to our tables moves (engine/watch.py): SQLite's ``PRAGMA
        data_version``, PostgreSQL's statistics of our tables (helped by its WAL
        position). Nothing is sent or locked by a commit for it.
        ``wake`` may also be called when nothing changed (after a lost connection,
        say), never much later than a commit.
        """

    def agent_deleted(self, conn: Conn, agent_id: str) -> None:
        """``agent_id`` is deleted in ``conn``'s transaction, under this Store's hold:
        what the database keeps of the hold goes too once it is let go."""

    def scrub(self, tables: Sequence[str]) -> bool:
        """Make the rows deleted from ``tables`` unreadable in the database's files, not
        only gone from the tables (an erasure); whether that completed.

        SQLite overwrites what it deletes (``secure_delete``); here it vacuums a
        file written before it did, and checkpoints and truncates the WAL (False
        while a reader holds an older snapshot). PostgreSQL rewrites the tables
        (``VACUUM FULL``: each locked meanwhile).
        """

    def prune_holds(self, conn: Conn) -> None:
        """Delete what the database keeps of holds let go of agents that are gone
        (PostgreSQL's lease rows; a file's locks leave nothing)."""

    def check_rows(self, conn: Conn, table: str, where: str, params: Sequence[Any]) -> None:
        """Check every row of ``table`` that ``where`` selects, or raise DamagedRowError.

        Before a read or a copy that filters rows on a column a damaged byte could
        change (a version mark), so that a damaged row is refused rather than left
        out. ``where`` is index-driven: the agent (and conversation) and a version.
        """

    def active_messages(
        self, conn: Conn, agent_id: str, conversation: str
    ) -> Iterable[tuple[float, str | bytes]]:
        """``(position, body)`` of each active message of the conversation, in order
        (the body's JSON text, or its UTF-8 bytes).

        One indexed range read: loading an agent costs this, and what it decodes.
        """

    def index_compacted(
        self,
        conn: Conn,
        agent_id: str,
        version: int,
        first_position: float,
        last_position: float,
        conversation: str,
    ) -> None:
        """Index the text of the originals a compaction removed at ``version``: the
        messages of ``conversation`` from ``first_position`` to ``last_position``."""

    def search_compacted(
        self, conn: Conn, agent_id: str, words: list[str], limit: int, conversation: str
    ) -> list[str]:
        """Bodies of compacted messages holding every one of ``words``, best match first."""

    def check(self) -> dict[str, Any]:
        """An integrity check of the database ("ok" when sound) and quick facts about it."""

    def columns(self, conn: Conn) -> dict[str, list[str]]:
        """Each of the database's tables, with its columns in order."""


def moved_by(version: int) -> str:
    """Who holds an agent whose fenced advance failed: AgentInUseError's ``holder``."""
    return f"a writer that committed version {version} during this turn"


def forked(location: str, pid: int) -> str:
    """What to say when a forked child uses the Store that process ``pid`` opened on
    ``location``: its connections (and an agent's holds) are the parent's."""
    return (
        f"Store({location!r}) was opened by process {pid}, and this process "
        f"({os.getpid()}) is a child it forked: a Store's connections and holds on "
        "agents belong to the process that opened it. Open a new Store in the child, "
        "after the fork (gunicorn: in post_fork or the app factory, not with --preload; "
        "multiprocessing: in the worker, or with the 'spawn' start method)"
    )


def is_postgres_url(target: str) -> bool:
    """Whether ``target`` names a PostgreSQL database rather than an SQLite file."""
    return target.startswith(("postgresql://", "postgres://"))


def redacted(url: str) -> str:
    """``url`` without its password, to name it in messages."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc))
