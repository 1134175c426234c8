"""Store: the durable log of agents, on an SQLite file or a PostgreSQL database.

:class:`Store` is the face users call: reads, maintenance, approvals, events,
backups, each documented here and written in the module of its concern. It holds
the machinery as components with names of their own: ``engine`` (the database,
behind ``engine/seam.py``, opened by ``opening.py``), ``turns`` (the turn
protocol, ``turns.py``) and ``alarm_queue`` (the runners' side of alarms,
``alarm_queue.py``), and hands each what it needs: the parts of an agent's record
(``PARTS``, from ``parts/``) and this machine's cache of the agents' SQL
workspace files (``workspace/``).
"""

from __future__ import annotations

import atexit
import json
import os
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, suppress
from datetime import datetime, timedelta
from typing import Any, Literal, cast

import apsw

from ..errors import (
    DatabaseBusyError,
    KeyUnavailableError,
    NotFoundError,
)
from . import browse, diff, erasure, journal, maintenance, reads, resealing, retention, waiting
from .alarm_queue import AlarmQueue, statuses
from .browse import VERSION_SELECT, AgentPage, HistoryFilter, TablePage, Timeline, version_info
from .checked import checked_rows, checked_version
from .copy import copy_store
from .diff import DIFF_LIMIT, VersionDiff
from .engine.seam import DEFAULT_STATEMENT_TIMEOUT, CommitWatch, Conn, Database
from .engine.sqlite.connection import Durability
from .engine.sqlite.damage import watched
from .engine.sqlite.database import SQLiteDatabase
from .handoffs import HANDOFF_SELECT, handoff_of
from .holds import hold
from .ids import (
    DEFAULT_CONVERSATION,
    validate_agent_id,
    validate_conversation_id,
    validate_subject,
)
from .inflight import AgentInFlight
from .keys import Keys, MasterKey
from .opening import open_engine, sealer_for
from .parts import alarms as _alarms
from .parts import approvals as _approvals
from .parts import conversations as _conversations
from .parts import events as _events
from .parts import subjects as _subjects
from .parts.alarms import AlarmInfo, AlarmPart, Schedule
from .parts.approvals import ApprovalPart
from .parts.conversation_fields import ConversationFields
from .parts.conversations import Conversations
from .parts.events import EventInfo
from .parts.memory import KEY, NOTE, MemoryNote, MemoryPart, memory_at, note_of
from .parts.subjects import SubjectPart
from .parts.versioned import VersionedPart
from .records import (
    AgentRecord,
    ApprovalInfo,
    ApprovalStatus,
    ConversationInfo,
    DecisionPage,
    ErasureReceipt,
    ForkedAgent,
    Handoff,
    PruneResult,
    StepInfo,
    Suspension,
    VersionInfo,
    WorkflowInfo,
    WorkflowReset,
)
from .resealing import ResealReport
from .rows import current_version
from .turns import Turns
from .workspace.cache import WorkspaceCache
from .workspace.part import WorkspacePart
from .workspace.schema import quote
from .workspace.workspace import SQLResult, read_sql

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
    SubjectPart(),
)


@watched(lambda store: store._damage)  # SQLite's reports of damage -> DatabaseCorruptError
class Store:
    """The durable log of every agent in one SQLite database file or PostgreSQL database.

    Reads (``agents``, ``history``, ``conversations``, ``state``, ``memory``,
    ``memory_notes``, ``versions``, ``handoffs``, ``search_compacted``,
    ``workflows``, ``steps``; a page at a time: ``agent_page``, ``timeline``,
    ``version_page``; ``diff`` of two versions) see the last committed versions.
    Maintenance (``rollback``, ``fork``, ``delete``, ``reset_workflow``, ``prune``)
    holds the agent (``agent_lock``), so it never races a running turn; ``vacuum``
    and ``backup`` work on the whole file while turns go on. Each thread gets its
    own connection; close the store when done, or use it as a context manager.
    Its machinery is in the components it hands out (the attributes below; see
    :doc:`/layout`).

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
        keys: Encryption at rest (:doc:`/privacy`): the content of the rows
            written from now on is sealed with AES-GCM under data keys that
            :class:`~effectful_durable.store.keys.Keys` wraps and keeps outside the
            database. A database that is encrypted is refused without them, or
            with others (KeyUnavailableError), before anything is written.

    Attributes:
        turns: The turn protocol (:class:`~effectful_durable.store.turns.Turns`):
            how PersistenceHandler starts, commits and fails a turn.
        alarm_queue: The runners' queue of alarms, events and resumptions
            (:class:`~effectful_durable.store.alarm_queue.AlarmQueue`): claims,
            failures, rescue of dead runners' claims, status reports.
        engine: The database the store runs on, behind the seam
            (``engine/seam.py``): its ``location`` (the file, or the URL without
            its password), ``identity``, and the waits a stopping runner ends
            (``hurry``); the store's own components use the rest.

    Raises:
        NotOurDatabaseError: ``path`` is not an effectful-durable database.
        DatabaseCorruptError: SQLite found ``path`` damaged, on opening or later
            (every method may raise it; the store then refuses to write).
        SchemaTooNewError: ``path`` was written by a newer version.
        KeyUnavailableError: ``path`` is encrypted and ``keys`` are missing or
            not its own.

    Example::

        with Store("state.db") as store:
            for agent in store.agents():
                print(agent.agent_id, agent.version, agent.messages)

    .. versionadded:: 0.1.0

    .. versionchanged:: 0.2.0
       The turn protocol moved to ``Store.turns``, the engine is ``Store.engine``.
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
        keys: Keys | None = None,
    ) -> None:
        self.path = os.fspath(path)
        self.durability: Durability = durability
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        opened = open_engine(
            self.path,
            durability=durability,
            busy_timeout=busy_timeout,
            readonly=readonly,
            on_unreadable=on_unreadable,
            pool_size=pool_size,
            workspace_dir=None if workspace_dir is None else os.fspath(workspace_dir),
            statement_timeout=statement_timeout,
            wait_for_database=wait_for_database,
            renewal_url=renewal_url,
        )
        self.engine: Database = opened.engine
        try:
            self.sealer = sealer_for(self.engine, keys, readonly=readonly)
        except BaseException:
            self.engine.close()
            raise
        self._damage = opened.damage
        self._workspaces = self._workspace_files = opened.workspaces
        if self.sealer.enabled:  # no file may hold the tables' rows in plain text
            self._workspaces = WorkspaceCache.in_memory(self.sealer)
        # The parts rollback, fork, prune and delete carry, the SQL workspace last.
        self._parts = (*PARTS, WorkspacePart(self._workspaces))
        self.turns = Turns(
            self.engine,
            self._damage,
            self._workspaces,
            self._parts,
            busy_timeout=busy_timeout,
            sealer=self.sealer,
        )
        self.alarm_queue = AlarmQueue(self.engine, self._damage, self.sealer)
        if isinstance(self.engine, SQLiteDatabase):
            self._pid = os.getpid()
            _open.add(self)

    def __repr__(self) -> str:
        return f"Store({self.engine.location!r})"

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every connection this store opened, in all threads."""
        self._close()

    def agent_lock(self, agent_id: str, *, wait: float = 0.0) -> AbstractContextManager[None]:
        """Hold the agent against every other thread and process for the block.

        Turns and maintenance of the agent, here or in another process, wait for
        the block (up to their ``wait``) or raise AgentInUseError. On PostgreSQL
        the hold is a lease renewed in the server's clock while the block runs
        (:doc:`/production`).

        Raises:
            InvalidAgentIdError: ``agent_id`` is not a valid agent id.
            AgentInUseError: It stayed held for longer than ``wait`` seconds.
        """
        return hold(self.engine, agent_id, wait=wait)

    # -- the agents and their histories -------------------------------------

    def agents(self) -> list[AgentRecord]:
        """Every agent in the database, by id."""
        with self.engine.reading() as conn:
            return reads.agents(conn)

    def agent_count(self) -> int:
        """How many agents the database holds: one read.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            return int(conn.execute("SELECT count(*) FROM agents").get)

    def agent_ids(self, *, after: str | None = None, limit: int = 500) -> list[str]:
        """A page of agent ids, in order: those after ``after`` (from the start if None).

        Read the next page with ``after`` set to the last id of this one; each page
        is one indexed read, however many agents the database holds.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            return reads.agent_ids(conn, after, limit)

    def history(
        self,
        agent_id: str,
        version: int | None = None,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        include_compacted: bool = False,
        code_versions: bool = False,
    ) -> list[dict[str, Any]]:
        """One conversation's active messages, in order, at ``version`` (default: latest).

        With ``include_compacted``, the originals that compactions replaced are
        included too, in their places, so nothing the agent ever saw is missing.
        Each of them carries ``"durable": {"compacted_in": <version>}``, and each
        summary ``"durable": {"summary_of": <number of messages>}``.

        Args:
            agent_id: The agent.
            version: The version to read; the latest by default.
            conversation: The conversation; the default one unless named. The
                default conversation of an agent that never used it is empty.
            include_compacted: Include the originals compactions replaced.
            code_versions: Mark each message whose turn was committed with a
                ``code_version`` with it: ``"durable": {"code_version": ...}``.

        Raises:
            NotFoundError: No such agent or version, or no such conversation at
                that version.

        .. versionchanged:: 0.2.0
           ``conversation`` and ``code_versions``.
        """
        return reads.history(
            self.engine,
            agent_id,
            version,
            conversation,
            include_compacted,
            code_versions,
            sealer=self.sealer,
        )

    def search_compacted(
        self,
        agent_id: str,
        query: str,
        limit: int = 5,
        *,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> list[dict[str, Any]]:
        """Compacted messages of one conversation that match ``query``, best match first.

        Every word of ``query`` must occur (stemmed, case-insensitive), through
        SQLite's FTS5 full-text index (PostgreSQL's full-text search on
        PostgreSQL). Other conversations are never searched.

        Raises:
            InvalidAgentIdError: ``agent_id`` is not a valid agent id.
            InvalidConversationIdError: ``conversation`` is not a valid conversation id.

        .. versionchanged:: 0.2.0
           ``conversation``.
        """
        return reads.search_compacted(
            self.engine, agent_id, query, limit, conversation, sealer=self.sealer
        )

    def state(
        self,
        agent_id: str,
        version: int | None = None,
        *,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> dict[str, Any]:
        """The agent's persisted fields as JSON values, at ``version`` (default: latest).

        The shared fields, and the values ``conversation`` holds of the fields
        declared :func:`~effectful_durable.per_conversation` (absent until a turn
        in it stored them).

        Raises:
            NotFoundError: No such agent or version.

        .. versionchanged:: 0.2.0
           ``conversation``.
        """
        return reads.state(self.engine, agent_id, version, conversation, sealer=self.sealer)

    def versions(self, agent_id: str) -> list[VersionInfo]:
        """Every committed version of the agent, oldest first.

        Raises:
            NotFoundError: No such agent.
        """
        with self.engine.reading() as conn:
            checked_version(self.engine, conn, agent_id, None)
            rows = conn.execute(
                f"{VERSION_SELECT} WHERE agent_id = ? ORDER BY version", (agent_id,)
            ).fetchall()
        return [version_info(agent_id, row) for row in rows]

    def handoffs(self) -> list[Handoff]:
        """Turns that started and did not commit: running, crashed or failed.

        In a copy made before an erasure (encryption at rest), the erased
        subjects' handoffs are left out: their keys are gone.
        """
        with self.engine.reading() as conn:
            rows = conn.execute(f"{HANDOFF_SELECT} ORDER BY agent_id, conversation").fetchall()
        return self.sealer.listed(rows, lambda row: handoff_of(row, self.sealer))

    def conversations(self, agent_id: str, version: int | None = None) -> list[ConversationInfo]:
        """The agent's conversations at ``version`` (default: the latest), by id.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            checked, current = checked_rows(
                self.engine, conn, agent_id, version, "conversations", "added_in <= ?", version
            )
            return _conversations.listed(conn, agent_id, checked, latest=checked == current)

    def in_flight(self, agent_ids: list[str]) -> list[AgentInFlight]:
        """What the agents ``agent_ids`` hold at their latest versions, as a check reads it:
        their fields, their conversations' tool calls and results, their memory's keys,
        their code version. Pass a page of :meth:`agent_ids`: each read takes the range
        from the first id to the last.

        Eight set-wise reads for all of them (at most 1,000 ids a call), however
        long their histories: only the tool calls of their active messages, and the
        first and last 400 characters of each tool result (where content is sealed,
        the active messages are read whole, and opened). Agents the database does
        not hold are left out.

        .. versionadded:: 0.2.0
        """
        return reads.in_flight(self.engine, agent_ids, self.sealer)

    def code_versions(self, agent_ids: list[str]) -> dict[str, str | None]:
        """The ``code_version`` each agent's latest turn was committed with (None: not said).

        One read for all of ``agent_ids`` (see ``PersistenceHandler(code_version=...)``).

        .. versionadded:: 0.2.0
        """
        return reads.code_versions(self.engine, agent_ids)

    # -- browsing, a page at a time, and diffs ------------------------------

    def agent_page(
        self,
        *,
        text: str = "",
        attention: bool = False,
        sort: str = "id",
        page: int = 1,
        per_page: int = 50,
    ) -> AgentPage:
        """One page of the agents, with what waits for each: the agents list.

        Args:
            text: Keep the agents whose id holds this text (in any case).
            attention: Keep the agents that need a person: an approval waits, an
                alarm or event died, or a turn started and did not commit.
            sort: One of ``AGENT_SORTS``: ``id``, ``updated``, ``version``,
                ``created``, each reversed with a leading ``-``.
            page: The page, from 1.
            per_page: Agents per page, at most ``MAX_PAGE`` (500).

        Raises:
            ValueError: An unknown sort, or a page or page size out of range.

        .. versionadded:: 0.2.0
        """
        return browse.agent_page(
            self.engine, text=text, attention=attention, sort=sort, page=page, per_page=per_page
        )

    def timeline(
        self,
        agent_id: str,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        before: int | None = None,
        limit: int = 20,
        filter: HistoryFilter | None = None,
    ) -> Timeline:
        """A page of the agent's history in ``conversation``: one block per version, newest first.

        Only the versions of the page are read, and with a filter only the
        messages of versions that hold a match are kept: the history is read
        newest first until the page is full, never loaded whole.

        Args:
            agent_id: The agent.
            conversation: The conversation whose history to show.
            before: Show versions before this one (the previous page's
                ``next_before``); the latest first by default.
            limit: Blocks per page, at most ``MAX_PAGE`` (500).
            filter: Show only the versions with a message that passes, and only
                those messages.

        Raises:
            NotFoundError: No such agent.
            ValueError: ``before`` or ``limit`` is out of range.

        .. versionadded:: 0.2.0
        """
        with self.sealer.one_look():
            return browse.timeline(
                self.engine, agent_id, conversation, before, limit, filter, sealer=self.sealer
            )

    def version_page(
        self, agent_id: str, *, before: int | None = None, limit: int = 50
    ) -> list[VersionInfo]:
        """The agent's versions before ``before`` (default: all), newest first, at most ``limit``.

        Raises:
            NotFoundError: No such agent.
            ValueError: ``limit`` is out of range.

        .. versionadded:: 0.2.0
        """
        return browse.version_page(self.engine, agent_id, before=before, limit=limit)

    def compacted(
        self, agent_id: str, version: int, *, conversation: str = DEFAULT_CONVERSATION
    ) -> list[dict[str, Any]]:
        """The originals the compaction that made ``version`` replaced, in order.

        Empty if ``version`` is no compaction of ``conversation``.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self.sealer.one_look():
            return browse.compacted(
                self.engine, agent_id, version, conversation=conversation, sealer=self.sealer
            )

    def sql_tables(self, agent_id: str, version: int | None = None) -> list[str]:
        """The names of the agent's SQL tables at ``version`` (default: latest).

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        result = self.sql(agent_id, browse.TABLE_NAMES, version=version)
        return [str(name) for (name,) in result.rows]

    def table_page(
        self,
        agent_id: str,
        table: str,
        *,
        version: int | None = None,
        page: int = 1,
        per_page: int = 50,
    ) -> TablePage:
        """One page of the rows of one of the agent's SQL tables, in rowid order.

        Read in the sandbox of :meth:`~effectful_durable.Store.sql`.

        Raises:
            NotFoundError: No such agent, version or table.
            ValueError: ``page`` or ``per_page`` is out of range.

        .. versionadded:: 0.2.0
        """
        browse.check_page(page, per_page)
        if table not in self.sql_tables(agent_id, version):
            msg = f"agent {agent_id!r} has no SQL table {table!r}"
            raise NotFoundError(msg)
        name = quote(table)
        total = int(self.sql(agent_id, f"SELECT count(*) FROM {name}", version=version).rows[0][0])
        rows = self.sql(
            agent_id,
            f"SELECT * FROM {name} LIMIT ? OFFSET ?",
            [per_page, (page - 1) * per_page],
            version=version,
        )
        return TablePage(table, rows.columns, rows.rows, total, page, per_page)

    def diff(
        self, agent_id: str, before: int, after: int, *, limit: int | None = DIFF_LIMIT
    ) -> VersionDiff:
        """What changed in the agent from version ``before`` to version ``after``.

        Args:
            agent_id: The agent.
            before: One version (usually the older).
            after: The other.
            limit: The most messages listed per conversation and side, and rows per
                table (None: all); the counts are always of all.

        Raises:
            NotFoundError: No such agent, or either version does not exist or was pruned.

        .. versionadded:: 0.2.0
        """
        with self.sealer.one_look():
            return diff.diff(self.engine, agent_id, before, after, limit=limit, sealer=self.sealer)

    def watch_commits(self, wake: Callable[[], None]) -> CommitWatch:
        """Call ``wake`` (from another thread) soon after each commit to the database.

        A thread looks five times a second, reading no table: at ``PRAGMA
        data_version`` on SQLite; on PostgreSQL at the server's statistics of our
        tables and its WAL position (``engine/postgres/table_stats.py``), so that a
        commit to another database of the server wakes nobody. No commit sends
        anything for it. Close what it returns to stop.

        .. versionadded:: 0.2.0
        """
        return self.engine.watch_commits(wake)

    # -- memory and the SQL workspace ---------------------------------------

    def memory(self, agent_id: str, version: int | None = None) -> dict[str, Any]:
        """The keys the agent stored in its memory, with their values, at ``version``.

        Default: the latest version. Keys are in sorted order.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            version = self._checked_memory(conn, agent_id, version, KEY)
            rows = memory_at(conn, agent_id, version, KEY, self.sealer)
        return {key: json.loads(value) for key, value in rows}

    def memory_notes(self, agent_id: str, version: int | None = None) -> list[MemoryNote]:
        """The context notes the agent kept at ``version`` (default: latest), oldest first.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            version = self._checked_memory(conn, agent_id, version, NOTE)
            rows = memory_at(conn, agent_id, version, NOTE, self.sealer)
        return [note_of(value) for _, value in rows]

    def sql(
        self, agent_id: str, query: str, params: Sequence[Any] = (), version: int | None = None
    ) -> SQLResult:
        """Run a read-only query on the agent's own SQL workspace, at ``version``.

        The query runs in the same sandbox as the agent's ``sql_query`` (one
        statement, reads only), without its row and size caps.

        Raises:
            NotFoundError: No such agent or version.
            SQLWorkspaceError: The query was refused or failed.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            version = checked_version(self.engine, conn, agent_id, version)
            latest = current_version(conn, agent_id)
        try:
            return read_sql(
                self.engine, self._workspaces, agent_id, query, params, version=version,
                latest=version == latest, readonly=self.readonly, busy_timeout=self.busy_timeout
            )  # fmt: skip
        except apsw.BusyError as e:
            raise DatabaseBusyError(self.engine.location, self.busy_timeout) from e

    # -- maintenance --------------------------------------------------------

    def check(self) -> dict[str, Any]:
        """An integrity check ("ok" when sound) and quick facts about the database.

        On SQLite, ``PRAGMA integrity_check``, ``damaged_rows`` (each row that fails
        its checksum: its table and the agent, conversation and version it claims;
        at most 1,000) and the file's size; on PostgreSQL, the schema version and
        row counts.
        """
        return self.engine.check()

    def rollback(self, agent_id: str, version: int) -> int:
        """Commit a new version whose histories, state and memory equal those of ``version``.

        Every conversation goes back: those created since are removed, those
        deleted since come back, each with its messages as they were. Nothing is
        deleted: the versions in between stay readable.

        Returns:
            The new version number.

        Raises:
            NotFoundError: No such agent or version.
            AgentInUseError: A turn of the agent is running.
        """
        return maintenance.rollback(self.engine, self._parts, agent_id, version)

    def fork(self, agent_id: str, version: int | None, new_agent_id: str) -> ForkedAgent:
        """Create ``new_agent_id`` as a copy of ``agent_id`` at ``version``.

        The copy gets the conversations, state and memory of that version.

        Returns:
            The new agent, with the id and version it copies (``source_version`` is
            the latest version when ``version`` is None).

        Raises:
            NotFoundError: No such agent or version.
            DurableError: ``new_agent_id`` already exists.
        """
        with self.sealer.one_look():  # for every value the fork seals again
            return maintenance.fork(
                self.engine, self._parts, agent_id, version, new_agent_id, sealer=self.sealer
            )

    def delete(self, agent_id: str) -> None:
        """Delete the agent with all its versions, messages and handoff.

        Raises:
            NotFoundError: No such agent.
            AgentInUseError: A turn of the agent is running.
        """
        maintenance.delete(self.engine, self._parts, agent_id)

    # -- privacy: subjects and erasure (SQL in parts/subjects.py, erasure.py) -------

    def set_subject(
        self, agent_id: str, subject: str | None, *, conversation: str | None = None
    ) -> None:
        """Name the subject (the person or tenant) the agent's content, or one of its
        conversations', is about; None names none any more.

        :meth:`erase` with ``subject=`` then erases what carries it: the agent
        whole, or that conversation alone (an agent's fields and memory are shared
        by its conversations, so a person whose data may be in them is the
        agent's subject). A fork carries its source's subjects. It may be named
        before the agent's first turn.

        Raises:
            InvalidAgentIdError, InvalidConversationIdError, InvalidSubjectError:
                An argument is not valid. Nothing was written.

        .. versionadded:: 0.2.0
        """
        validate_agent_id(agent_id)
        talk = _subjects.AGENT if conversation is None else validate_conversation_id(conversation)
        with self.engine.writing() as conn:
            if subject is None:
                _subjects.clear(conn, agent_id, talk)
            else:
                _subjects.set_subject(conn, agent_id, talk, validate_subject(subject), time.time())

    def subjects(self, agent_id: str) -> dict[str | None, str]:
        """The subjects named for the agent: ``None`` for its own, and by conversation.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            found = _subjects.subjects_of(conn, agent_id)
        return {(None if talk == _subjects.AGENT else talk): who for talk, who in found.items()}

    def holders(self, subject: str) -> list[tuple[str, str | None]]:
        """What carries ``subject``: ``(agent_id, None)`` for an agent whose subject it
        is, ``(agent_id, conversation)`` for a conversation of its own; by agent.

        .. versionadded:: 0.2.0
        """
        validate_subject(subject)
        with self.engine.reading() as conn:
            found = _subjects.holders(conn, subject)
        return [(agent, None if talk == _subjects.AGENT else talk) for agent, talk in found]

    def erase(
        self,
        *,
        subject: str | None = None,
        agent: str | None = None,
        conversation: str | None = None,
    ) -> ErasureReceipt:
        """Erase every copy the database holds of what a subject, an agent, or one of its
        conversations holds, and scrub it from the files; a receipt of what was erased.

        ``subject=`` erases every agent whose subject it is, whole (forks included),
        and every conversation of another agent that carries it; ``agent=`` one
        agent whole; ``agent=`` with ``conversation=`` that conversation alone. An
        agent's erasure reaches its every version, message, compacted original and
        its search index, state, memory, SQL workspace (its log, and its file on
        this machine, overwritten), approvals, events, alarms, journal steps,
        handoffs and subjects; a conversation's, its messages, compactions, fields,
        handoffs, approvals and journal steps. It holds every affected agent
        (refused, with nothing erased, while a turn of one runs) and deletes in
        one transaction: a crash leaves it done or not begun. Then the bytes leave
        the live files: SQLite overwrites what it deletes and truncates its WAL
        (a file made before this release is vacuumed at its first erasure);
        PostgreSQL rewrites the tables that held the rows (``VACUUM FULL``). What
        the server's WAL, archives, replicas and backups made before still hold is
        said in the docs' :doc:`/privacy` page.

        Returns:
            The receipt, which :meth:`erasures` lists too. It holds none of the
            erased content, and names the subject only by its digest.

        Raises:
            ValueError: Neither or both of ``subject`` and ``agent``, or
                ``conversation`` with ``subject``.
            NotFoundError: ``agent=`` names no agent (or no such conversation).
            AgentInUseError: A turn of an affected agent is running.

        .. versionadded:: 0.2.0
        """
        return erasure.erase(
            self.engine,
            subject=subject,
            agent_id=agent,
            conversation=conversation,
            forget_files=self._workspaces.shred,
            destroy_keys=self.sealer.destroy,
        )

    def reseal(
        self,
        *,
        rotate: bool = False,
        batch: int = 500,
        wait: float = 5.0,
        agents: Sequence[str] | None = None,
    ) -> ResealReport:
        """Seal again what the database holds: encrypt it in place, or rotate its keys.

        Online, agent by agent and ``batch`` rows at a time, each batch one
        transaction under the agent's hold: its turns wait for a batch (up to
        their ``wait``) as for another turn. Killed at any moment, every row is
        as it was or done, and running it again finishes. Plain rows are sealed
        (encryption in place); with ``rotate``, every agent and conversation
        gets a new data key first, and every row is sealed again with it. Once
        no plain row is left, the database is marked complete: a plain value
        found later is refused as damage, and this machine's SQL workspace files
        are shredded (with keys, the tables are kept in memory). Stop programs
        that write to the database without keys first (they would go on writing
        plain rows).

        Args:
            rotate: Make new data keys, and seal every row again with them.
            batch: Rows per transaction.
            wait: Seconds to wait for an agent's running turn; an agent still
                held then is skipped, and named in the report's ``busy``.
            agents: Only these agents (default: all).

        Raises:
            KeyUnavailableError: The store has no keys.

        .. versionadded:: 0.2.0
        """
        report = resealing.reseal(
            self.engine, self.sealer, rotate=rotate, batch=batch, wait=wait, agents=agents
        )
        if report.complete:  # the files of the plain days held the tables in plain text
            report.shredded = self._workspace_files.shred_all()
        return report

    def rewrap_keys(self, master: MasterKey) -> int:
        """Wrap every data key with the master key ``master`` instead; how many.

        One transaction in the key store; the database is not touched. From then
        on the store must be opened with the new master key.

        .. versionadded:: 0.2.0
        """
        if self.sealer.keys is None:
            msg = f"{self.engine.location} is not encrypted: no keys to wrap again"
            raise KeyUnavailableError(msg)
        return self.sealer.keys.rewrap(master)

    def erasures(self) -> list[ErasureReceipt]:
        """Every erasure's receipt, oldest first.

        .. versionadded:: 0.2.0
        """
        return erasure.erasures(self.engine)

    def delete_conversation(self, agent_id: str, conversation: str) -> int:
        """Delete one conversation of the agent, as a new version.

        Its messages and its values of the fields declared per conversation leave
        the active record and its handoff is dropped; shared fields, memory and
        the other conversations are untouched. Nothing is destroyed:
        :meth:`rollback` to an earlier version brings the conversation back, and
        :meth:`history` still reads it at earlier versions. To free the space for
        good, delete the whole agent (or prune old versions).

        Returns:
            The new version.

        Raises:
            NotFoundError: No such agent, or no such conversation now.
            AgentInUseError: A turn of the agent is running.

        .. versionadded:: 0.2.0
        """
        return maintenance.delete_conversation(self.engine, agent_id, conversation)

    def prune(
        self,
        agent_id: str | None = None,
        *,
        keep_versions: int | None = None,
        older_than: timedelta | datetime | None = None,
        drop_compacted: bool = False,
    ) -> PruneResult:
        """Delete what only old versions need, keeping every later version exact.

        For each agent (or only ``agent_id``), the versions before its retention
        point are pruned: their version rows, the messages no kept version shows,
        and what memory, SQL workspace, alarms, events and approvals kept only for
        them (done, delivered, decided: what still waits stays). The handoffs of
        turns that failed or crashed go too when the rules let them: ``older_than``
        by the time the turn failed (or started), ``keep_versions`` when it started
        from a pruned version; with ``older_than``, those of agents whose first
        turn never committed as well. Every kept
        version still reads back (history, state) and rolls back exactly; reading
        or rolling back to a pruned one raises NotFoundError saying so. The
        journals of finished workflows whose versions are all pruned are deleted
        too (a re-run of such a workflow runs it afresh). The latest version is
        always kept. Call :meth:`vacuum` afterwards to give the space back to the
        file system; otherwise SQLite reuses it for new rows.

        Args:
            agent_id: The agent to prune; all agents when None.
            keep_versions: Keep this many latest versions (at least 1).
            older_than: Prune only versions committed before this moment (an aware
                datetime) or longer ago than this (a timedelta). With
                ``keep_versions`` too, a version goes only when both rules let it.
            drop_compacted: Also delete compaction originals of pruned versions,
                which otherwise stay readable (``history(include_compacted=True)``)
                and searchable (RecallTools).

        Returns:
            What was deleted, and which agents were skipped because a turn of
            theirs was running (only when ``agent_id`` is None).

        Raises:
            ValueError: Neither ``keep_versions`` nor ``older_than`` was given, or
                ``keep_versions`` < 1.
            NotFoundError: No agent ``agent_id``.
            AgentInUseError: ``agent_id`` is running a turn.

        .. versionadded:: 0.2.0
        """
        self.engine.require("Store.prune")
        with self.engine.unhurried():
            return retention.prune_store(
                self.engine,
                agent_id,
                keep_versions=keep_versions,
                older_than=older_than,
                drop_compacted=drop_compacted,
                parts=self._parts,
            )

    def vacuum(self) -> int:
        """Give the space of deleted rows back to the file system, and empty the WAL.

        Rebuilds the file (SQLite ``VACUUM``), which needs free disk space about
        the size of the database and holds the write lock meanwhile: turns of
        other threads and processes wait (up to their ``busy_timeout``).

        Returns:
            How many bytes the database and its WAL shrank by.

        Raises:
            DatabaseBusyError: Another writer held the database too long.
            StorageError: Reading or writing the file failed (DiskFullError: no
                space for the rebuild); the database is as it was.

        .. versionadded:: 0.2.0
        """
        self.engine.require("Store.vacuum")
        return retention.vacuum_file(self._connection(), self.path, self.busy_timeout)

    def backup(self, path: str | os.PathLike[str]) -> None:
        """Copy the database, as of one committed moment, to the new SQLite file ``path``.

        Agents keep committing meanwhile (the copy reads one snapshot, which never
        blocks writers). The copy is compact, opens as a Store and passes
        ``PRAGMA integrity_check``; it appears at ``path`` only once complete. On
        PostgreSQL too the copy is an SQLite file, with every table of agent data
        (as ``effectful-durable copy`` makes; use ``pg_dump`` for the server's own).

        Raises:
            DurableError: ``path`` is empty, exists (it is never overwritten),
                or its directory does not.

        .. versionadded:: 0.2.0
        """
        target = os.fspath(path)
        if self.engine.kind == "sqlite":
            retention.backup(self._connection(), self.path, target)
            return

        def write(partial: str) -> None:
            with Store(partial) as copy:
                copy_store(self, copy)

        retention.publish(self.engine.location, target, write)

    # -- workflow journals --------------------------------------------------

    def workflows(self) -> list[WorkflowInfo]:
        """Every workflow with a journal, by name."""
        with self.engine.reading() as conn:
            return journal.workflows(conn)

    def steps(self, workflow: str) -> list[StepInfo]:
        """The workflow's journal, in step order.

        Raises:
            NotFoundError: No journal for ``workflow``.
        """
        return journal.steps(self.engine, workflow, self.sealer)

    def step(self, workflow: str, key: str) -> StepInfo | None:
        """One step of the journal by key, or None: one indexed read."""
        with self.engine.reading() as conn:
            row = conn.execute(
                f"{journal.STEP_SELECT} WHERE workflow = ? AND step_key = ?", (workflow, key)
            ).fetchone()
        return None if row is None else journal.step_info(row, self.sealer)

    def reset_workflow(
        self, workflow: str, from_step: int = 1, *, dry_run: bool = False
    ) -> WorkflowReset:
        """Forget steps ``from_step`` and later, so the next run does them afresh.

        Each agent those steps ran on is rolled back to its version before the
        first of them, so their turns are not in its history twice; an agent the
        forgotten steps created (it had no version before them) is deleted.
        Earlier steps stay in the journal and keep replaying.

        Args:
            workflow: The workflow's name.
            from_step: The first step to forget.
            dry_run: Change nothing; return what a reset would do.

        Returns:
            The agents rolled back and deleted, and the number of steps forgotten.

        Raises:
            NotFoundError: No journal for ``workflow``, or a version to roll back to
                was pruned (then nothing is changed).
            AgentInUseError: One of those agents is running a turn.

        .. versionchanged:: 0.2.0
           Returns a :class:`WorkflowReset` rather than the list of agents, and
           takes ``dry_run``.
        """
        return journal.reset_workflow(
            self.engine, self._parts, workflow, from_step, dry_run=dry_run, sealer=self.sealer
        )

    # -- alarms (SQL in parts/alarms.py) ------------------------------------

    def alarms(
        self, agent_id: str | None = None, *, include_ended: bool = False
    ) -> list[AlarmInfo]:
        """The pending and dead alarms (of one agent, or all), by next occurrence.

        With ``include_ended``, delivered and cancelled alarms are listed too.

        Raises:
            InvalidAgentIdError: ``agent_id`` is not a valid agent id.

        .. versionadded:: 0.2.0
        """
        if agent_id is not None:
            validate_agent_id(agent_id)
        with self.engine.reading() as conn:
            if include_ended:  # which span is an alarm's latest is read from every span
                where, params = ("agent_id = ?", (agent_id,)) if agent_id else ("1", ())
                self.engine.check_rows(conn, "alarms", where, params)
            return _alarms.latest(conn, agent_id, include_ended=include_ended, sealer=self.sealer)

    def schedule_alarm(
        self, agent_id: str, action: str, schedule: Schedule, *, now: float | None = None
    ) -> str:
        """Schedule an alarm outside any turn, as part of the agent's current version.

        Turns stage theirs instead (``AlarmTools``, ``agent.schedule``).

        Returns:
            The new alarm's id.

        Raises:
            InvalidAgentIdError: ``agent_id`` is not a valid agent id.
            InvalidAlarmError: ``action`` is empty, too long, or not text.

        .. versionadded:: 0.2.0
        """
        validate_agent_id(agent_id)
        _alarms.check_action(action)
        alarm_id = _alarms.new_alarm_id()
        with self.engine.writing() as conn:
            version = _alarms.current_version(conn, agent_id)
            when = time.time() if now is None else now
            _alarms.insert(conn, agent_id, alarm_id, action, schedule, version, when, self.sealer)
        return alarm_id

    def cancel_alarm(self, alarm_id: str, *, agent_id: str | None = None) -> bool:
        """Cancel a pending or dead alarm (of ``agent_id``, if given); False if none.

        .. versionadded:: 0.2.0
        """
        with self.engine.writing() as conn:
            return _alarms.cancel(conn, alarm_id, agent_id, self.sealer)

    def rearm_alarm(self, alarm_id: str, *, at: float | None = None) -> AlarmInfo:
        """Make a dead alarm pending again, due at ``at`` (default: now), attempts reset.

        Raises:
            NotFoundError: No pending or dead alarm has that id.

        .. versionadded:: 0.2.0
        """
        with self.engine.writing() as conn:
            return _alarms.rearm(conn, alarm_id, time.time() if at is None else at, self.sealer)

    def runner_statuses(self) -> list[dict[str, Any]]:
        """Each runner's last status report, most recent first.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            return statuses(conn)

    # -- approvals (SQL in parts/approvals.py) ------------------------------

    def approvals(
        self, agent_id: str | None = None, *, status: ApprovalStatus | None = "pending"
    ) -> list[ApprovalInfo]:
        """The approvals (of one agent) with ``status`` (None: all of them), oldest first.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            return _approvals.listed(conn, agent_id=agent_id, status=status, sealer=self.sealer)

    def unresumed_approvals(self) -> list[ApprovalInfo]:
        """Every approval whose suspended turn has not resumed yet, decided or not, oldest
        first: one indexed read (what ``effectful-durable check-upgrade`` looks at).

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            return _approvals.unresumed(conn, self.sealer)

    def approval(self, approval_id: str) -> ApprovalInfo:
        """One approval, by its id.

        Raises:
            NotFoundError: No approval has that id.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            found = _approvals.one(conn, approval_id, self.sealer)
        if found is None:
            raise waiting.unknown(approval_id)
        return found

    def approval_parameters(self, approval_id: str) -> dict[str, Any]:
        """The JSON schema of the tool's parameters, as the model was offered it, that
        edited arguments of the approval must fit (:meth:`approve` checks them).

        Raises:
            NotFoundError: No approval has that id.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            found = _approvals.parameters(conn, approval_id)
        if found is None:
            raise waiting.unknown(approval_id)
        return found

    def decisions(
        self,
        *,
        status: ApprovalStatus | None = None,
        by: str | None = None,
        agent_text: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        page: int = 1,
        per_page: int = 50,
    ) -> DecisionPage:
        """The approvals no longer pending, newest decision first, filtered: the audit trail.

        Args:
            status: Keep only ``"approved"``, ``"denied"`` or ``"cancelled"`` ones
                (cancelled: a rollback undid the turn that asked).
            by: Keep those decided by this name, in any case.
            agent_text: Keep those of agents whose id holds this text, in any case.
            since: Keep those decided at or after this moment (an aware datetime).
            until: Keep those decided before this moment.
            page: The page, from 1.
            per_page: Decisions per page, from 1 to 500.

        Raises:
            ValueError: ``status`` is ``"pending"`` or unknown, or a page out of range.

        .. versionadded:: 0.2.0
        """
        return waiting.decisions(
            self.engine, status, by, agent_text, since, until, page, per_page, self.sealer
        )

    def approve(
        self,
        approval_id: str,
        *,
        by: str | None = None,
        arguments: Mapping[str, Any] | None = None,
        note: str | None = None,
        parameters: Mapping[str, Any] | None = None,
    ) -> ApprovalInfo:
        """Approve a tool call that waits: the suspended turn may then run it, once.

        Args:
            approval_id: The approval, as :meth:`approvals` lists it.
            by: Who decides (default: the operating system's user name); kept.
            arguments: Run the tool with these instead of the model's: a JSON
                object that must fit the tool's parameters. The model is told.
            note: A note kept with the decision, shown to the model.
            parameters: The JSON schema of the tool's parameters in the code that
                will resume the turn, which the arguments must fit instead of the
                schema stored when the turn suspended (:meth:`approval_parameters`);
                it is stored in its place. ``effectful-durable approve --agents``
                finds it in the new code.

        Returns:
            The approval, decided. Once the last approval of its turn is decided, a
            runner resumes the turn (a workflow's turn: the workflow's next run).

        Raises:
            NotFoundError: No approval has that id.
            InvalidDecisionError: It was decided already, or cancelled by a
                rollback, or ``arguments`` do not fit. Nothing was changed.

        .. versionadded:: 0.2.0
        """
        return waiting.decide(
            self.engine,
            approval_id,
            by,
            note,
            arguments,
            parameters,
            approve=True,
            sealer=self.sealer,
        )

    def deny(self, approval_id: str, *, reason: str, by: str | None = None) -> ApprovalInfo:
        """Deny a tool call that waits: the model reads ``reason`` as the tool's result.

        Raises:
            NotFoundError: No approval has that id.
            InvalidDecisionError: It was decided already, or cancelled, or the
                reason is empty or not text. Nothing was changed.

        .. versionadded:: 0.2.0
        """
        return waiting.decide(
            self.engine, approval_id, by, reason, None, None, approve=False, sealer=self.sealer
        )

    def retarget_approval(
        self,
        approval_id: str,
        *,
        tool: str,
        arguments: Mapping[str, Any],
        parameters: Mapping[str, Any],
        by: str | None = None,
    ) -> ApprovalInfo:
        """Make an approval name ``tool`` (and ``arguments``) instead: new code renamed
        its tool, or changed what it takes.

        When the suspended turn resumes, the model's call is replayed, and
        committed, as a call of ``tool`` with ``arguments``, which is what an
        approval then lets run. Use it after ``effectful-durable check`` reports an
        approval whose tool is gone or whose arguments no longer fit
        (``effectful-durable retarget`` finds ``parameters``, the new tool's JSON
        schema, in the new code). An approval that was approved, and whose turn
        has not resumed, waits for a decision again: the decision was about
        another call.

        Raises:
            NotFoundError: No approval has that id.
            InvalidDecisionError: It is denied, cancelled or used already, or
                ``arguments`` do not fit ``parameters``. Nothing was changed.
            AgentInUseError: It was approved and a turn of the agent is running,
                or a runner is resuming its turn now.

        .. versionadded:: 0.2.0
        """
        return waiting.retarget(
            self.engine,
            approval_id,
            tool=tool,
            arguments=arguments,
            parameters=parameters,
            by=by,
            sealer=self.sealer,
        )

    def suspension(
        self, agent_id: str, conversation: str = DEFAULT_CONVERSATION
    ) -> Suspension | None:
        """The conversation's suspended turn, if one waits (decided or not).

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            return _approvals.open_suspension(conn, agent_id, conversation, self.sealer)

    # -- events (SQL in parts/events.py) ------------------------------------

    def send_event(
        self,
        agent_id: str,
        name: str,
        payload: Any = None,
        *,
        key: str | None = None,
        create: bool = False,
    ) -> EventInfo:
        """Send an event to an agent: a runner delivers it as a turn (``on_event``).

        If a workflow step waits for an event of that name for that agent, the
        event is that step's result instead, in this same transaction.

        Args:
            agent_id: The agent the event is for.
            name: What happened (``"payment_received"``): printable text.
            payload: Any JSON value, at most 64 KiB as JSON.
            key: An idempotency key: sending again with the same key (a retried
                sender) returns the first event and sends nothing.
            create: Accept an agent id the database does not know yet (the
                runner's agent factory builds it). Default: refuse it.

        Raises:
            InvalidEventError: The id, name, payload or key is not valid, or the key
                was used for another event. Nothing was sent.
            NotFoundError: No such agent, and ``create`` is False.

        .. versionadded:: 0.2.0
        """
        return waiting.send_event(
            self.engine, agent_id, name, payload, key=key, create=create, sealer=self.sealer
        )

    def events(
        self, agent_id: str | None = None, *, include_delivered: bool = False
    ) -> list[EventInfo]:
        """The events (of one agent), oldest first: pending and dead ones, unless asked.

        .. versionadded:: 0.2.0
        """
        with self.engine.reading() as conn:
            return _events.listed(
                conn, agent_id, include_delivered=include_delivered, sealer=self.sealer
            )

    # -- internals -----------------------------------------------------------------

    def _close(self) -> None:
        # Not wrapped by @watched: the exit hook below meets SQLite's own errors.
        _open.discard(self)
        try:
            self.engine.close()
        finally:
            self._workspaces.close()
            if self.sealer.keys is not None:
                self.sealer.keys.close()

    def _connection(self) -> apsw.Connection:
        """This thread's SQLite connection (vacuum and backup, once ``require`` passed)."""
        return cast(SQLiteDatabase, self.engine).connection()

    def _checked_memory(self, conn: Conn, agent_id: str, version: int | None, kind: str) -> int:
        where = "kind = ? AND added_in <= ?"
        return checked_rows(self.engine, conn, agent_id, version, "memory", where, kind, version)[
            0
        ]


# The SQLite stores this process opened and has not closed: a normal interpreter
# exit closes them, so that a program that never called close() leaves one file.
_open: weakref.WeakSet[Store] = weakref.WeakSet()


@atexit.register
def _close_open_stores() -> None:
    for store in list(_open):
        if store._pid == os.getpid():  # not a forked child's copy of its parent's
            with suppress(apsw.Error):
                store._close()
