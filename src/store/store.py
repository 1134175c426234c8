"""Store: the durable log of agents on one SQLite file, and the only code that writes SQL."""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime, timedelta
from typing import Any, Literal

import apsw
import pydantic_core

from ..errors import (
    AgentInUseError,
    DatabaseBusyError,
    DatabaseCorruptError,
    DurableError,
    NotFoundError,
    NotOurDatabaseError,
    StorageError,
)
from . import alarms as _alarms
from . import conversation_fields, retention
from . import conversations as _conversations
from .alarms import AlarmInfo, AlarmPart, AlarmQueue, Schedule
from .connection import Durability, connect, quarantine, read_transaction, write_transaction
from .damage import DamageWatch, watched
from .history import ActiveHistory, HistoryChange, message_json
from .ids import DEFAULT_CONVERSATION, validate_agent_id, validate_conversation_id
from .journal import WorkflowJournal, step_number
from .locks import AgentBusy, AgentLocks
from .memory import KEY, NOTE, MemoryNote, MemoryPart, MemoryRows, memory_at, note_of
from .parts import TurnWrite, VersionedPart
from .records import (
    AgentRecord,
    Compaction,
    ConversationInfo,
    ForkedAgent,
    Handoff,
    LoadedAgent,
    PruneResult,
    TurnStart,
    VersionInfo,
)
from .rows import current_version, dumps, storable, utc
from .translate import translated
from .workspace import SQLResult, WorkspaceFiles, WorkspacePart, WorkspaceTurn, read_sql

_HOST = socket.gethostname()

# Every part of an agent's record besides messages and fields: rollback and fork
# carry each of them (see parts.py).
_PARTS: tuple[VersionedPart, ...] = (
    _conversations.Conversations(),
    conversation_fields.ConversationFields(),
    MemoryPart(),
    WorkspacePart(),
    AlarmPart(),
)


@watched(lambda store: store._damage)  # SQLite's reports of damage -> DatabaseCorruptError
class Store(WorkflowJournal):
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

    # -- reads ---------------------------------------------------------------

    def agents(self) -> list[AgentRecord]:
        """Every agent in the database, by id."""
        with self._reading() as conn:
            rows: list[tuple[Any, ...]] = conn.execute(
                """
                SELECT agent_id, version, created_at, updated_at,
                       (SELECT count(*) FROM messages AS m
                         WHERE m.agent_id = a.agent_id AND m.removed_in IS NULL)
                  FROM agents AS a ORDER BY agent_id
                """
            ).fetchall()
        return [
            AgentRecord(agent_id, version, messages, utc(created), utc(updated))
            for agent_id, version, created, updated, messages in rows
        ]

    def history(
        self,
        agent_id: str,
        version: int | None = None,
        *,
        conversation: str = DEFAULT_CONVERSATION,
        include_compacted: bool = False,
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

        Raises:
            NotFoundError: No such agent or version, or no such conversation at
                that version.

        .. versionchanged:: 0.2.0
           ``conversation``.
        """
        with self._reading() as conn:
            version = self._checked_version(conn, agent_id, version)
            self._checked_conversation(conn, agent_id, conversation, version)
            if not include_compacted:
                bodies = conn.execute(
                    """
                    SELECT body FROM messages
                     WHERE agent_id = ?1 AND conversation = ?3 AND added_in <= ?2
                       AND (removed_in IS NULL OR removed_in > ?2)
                     ORDER BY position
                    """,
                    (agent_id, version, conversation),
                )
                return _decode_messages(body for (body,) in bodies)
            rows: list[tuple[Any, ...]] = conn.execute(
                """
                SELECT m.body, c.version, s.messages FROM messages AS m
                  LEFT JOIN compactions AS c
                    ON c.agent_id = m.agent_id AND c.version = m.removed_in
                   AND m.position BETWEEN c.first_position AND c.last_position
                  LEFT JOIN compactions AS s
                    ON s.agent_id = m.agent_id AND s.version = m.added_in
                   AND s.summary_id = m.message_id
                 WHERE m.agent_id = ?1 AND m.conversation = ?3 AND m.added_in <= ?2
                   AND (m.removed_in IS NULL OR m.removed_in > ?2 OR c.version IS NOT NULL)
                 ORDER BY m.position, m.added_in
                """,
                (agent_id, version, conversation),
            ).fetchall()
        messages = _decode_messages(body for body, _, _ in rows)
        for message, (_, compacted_in, summary_of) in zip(messages, rows, strict=True):
            if compacted_in is not None:
                message["durable"] = {"compacted_in": compacted_in}
            elif summary_of is not None:
                message["durable"] = {"summary_of": summary_of}
        return messages

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
        SQLite's FTS5 full-text index. Other conversations are never searched.

        .. versionchanged:: 0.2.0
           ``conversation``.
        """
        words = " ".join(
            '"' + w.replace('"', '""') + '"' for w in query.replace("\0", " ").split()
        )
        if not words or not storable(words):  # a lone surrogate is in no stored text
            return []
        with self._reading() as conn:
            bodies = conn.execute(
                """
                SELECT m.body FROM compacted_text AS t
                  JOIN messages AS m
                    ON m.agent_id = t.agent_id AND m.position = t.position
                   AND m.removed_in = t.version
                 WHERE compacted_text MATCH ?2 AND t.agent_id = ?1 AND m.conversation = ?4
                 ORDER BY t.rank LIMIT ?3
                """,
                (agent_id, words, limit, conversation),
            ).fetchall()
        return _decode_messages(body for (body,) in bodies)

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
        validate_conversation_id(conversation)
        with self._reading() as conn:
            version = self._checked_version(conn, agent_id, version)
            state = _state_at(conn, agent_id, version)
            own = conversation_fields.state_at(conn, agent_id, conversation, version)
        values: dict[str, Any] = json.loads(state) if state is not None else {}
        return values | json.loads(own) if own is not None else values

    def memory(self, agent_id: str, version: int | None = None) -> dict[str, Any]:
        """The keys the agent stored in its memory, with their values, at ``version``.

        Default: the latest version. Keys are in sorted order.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            version = self._checked_version(conn, agent_id, version)
            rows = memory_at(conn, agent_id, version, KEY)
        return {key: json.loads(value) for key, value in rows}

    def memory_notes(self, agent_id: str, version: int | None = None) -> list[MemoryNote]:
        """The context notes the agent kept at ``version`` (default: latest), oldest first.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            version = self._checked_version(conn, agent_id, version)
            rows = memory_at(conn, agent_id, version, NOTE)
        return [note_of(value) for _, value in rows]

    def sql(
        self,
        agent_id: str,
        query: str,
        params: Sequence[Any] = (),
        version: int | None = None,
    ) -> SQLResult:
        """Run a read-only query on the agent's own SQL workspace, at ``version``.

        The query runs in the same sandbox as the agent's ``sql_query`` (one
        statement, reads only), without its row and size caps.

        Raises:
            NotFoundError: No such agent or version.
            SQLWorkspaceError: The query was refused or failed.

        .. versionadded:: 0.2.0
        """
        conn = self._connection()
        with self._reading():
            version = self._checked_version(conn, agent_id, version)
        try:
            return read_sql(
                conn, self.path, agent_id, query, params, version=version,
                readonly=self.readonly, busy_timeout=self.busy_timeout,
            )  # fmt: skip
        except apsw.BusyError as e:
            raise DatabaseBusyError(self.path, self.busy_timeout) from e

    def versions(self, agent_id: str) -> list[VersionInfo]:
        """Every committed version of the agent, oldest first.

        Raises:
            NotFoundError: No such agent.
        """
        with self._reading() as conn:
            self._checked_version(conn, agent_id, None)
            rows: list[tuple[Any, ...]] = conn.execute(
                """
                SELECT version, kind, template, added, removed, state IS NOT NULL,
                       detail, committed_at, conversation
                  FROM versions WHERE agent_id = ? ORDER BY version
                """,
                (agent_id,),
            ).fetchall()
        return [
            VersionInfo(
                agent_id,
                version,
                kind,
                template,
                added,
                removed,
                bool(changed),
                json.loads(detail) if detail else None,
                utc(committed),
                conversation,
            )
            for (
                version,
                kind,
                template,
                added,
                removed,
                changed,
                detail,
                committed,
                conversation,
            ) in rows
        ]

    def handoffs(self) -> list[Handoff]:
        """Turns that started and did not commit: running, crashed or failed."""
        with self._reading() as conn:
            rows = conn.execute(f"{_HANDOFF_SELECT} ORDER BY agent_id, conversation").fetchall()
        return [_handoff(row) for row in rows]

    def check(self) -> dict[str, Any]:
        """``PRAGMA integrity_check`` ("ok" when sound) and quick facts about the file."""
        conn = self._connection()
        facts: dict[str, Any] = {
            "integrity": "; ".join(str(row[0]) for row in conn.execute("PRAGMA integrity_check")),
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

    # -- maintenance ---------------------------------------------------------

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
        with self.agent_lock(agent_id), self._writing() as conn:
            current = self._checked_version(conn, agent_id, None)
            self._checked_version(conn, agent_id, version)
            new = current + 1
            conn.execute(
                """
                UPDATE messages SET removed_in = ?3
                 WHERE agent_id = ?1 AND removed_in IS NULL AND added_in > ?2
                """,
                (agent_id, version, new),
            )
            removed = conn.changes()
            conn.execute(
                """
                INSERT INTO messages (agent_id, conversation, position, added_in,
                    removed_in, message_id, role, body)
                SELECT agent_id, conversation, position, ?3, NULL, message_id, role, body
                  FROM messages
                 WHERE agent_id = ?1 AND added_in <= ?2 AND removed_in > ?2
                """,
                (agent_id, version, new),
            )
            added = conn.changes()
            self._insert_version(
                conn,
                agent_id,
                new,
                kind="rollback",
                template=None,
                state=_state_at(conn, agent_id, version),
                added=added,
                removed=removed,
                detail={"to": version},
            )
            for part in _PARTS:
                part.rollback(conn, agent_id, version, new)
            conn.execute(
                "UPDATE agents SET version = ?, updated_at = ? WHERE agent_id = ?",
                (new, time.time(), agent_id),
            )
        return new

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
        validate_agent_id(new_agent_id)
        with self.agent_lock(new_agent_id), self._writing() as conn:
            version = self._checked_version(conn, agent_id, version)
            if current_version(conn, new_agent_id) is not None:
                msg = (
                    f"cannot fork into {new_agent_id!r}: that agent already exists in "
                    f"{self.path}. Choose another id, or delete it first."
                )
                raise DurableError(msg)
            now = time.time()
            conn.execute("INSERT INTO agents VALUES (?, 1, ?, ?)", (new_agent_id, now, now))
            conn.execute(
                """
                INSERT INTO messages (agent_id, conversation, position, added_in,
                    removed_in, message_id, role, body)
                SELECT ?3, conversation, position, 1, NULL, message_id, role, body
                  FROM messages
                 WHERE agent_id = ?1 AND added_in <= ?2
                   AND (removed_in IS NULL OR removed_in > ?2)
                """,
                (agent_id, version, new_agent_id),
            )
            self._insert_version(
                conn,
                new_agent_id,
                1,
                kind="fork",
                template=None,
                state=_state_at(conn, agent_id, version),
                added=conn.changes(),
                removed=0,
                detail={"from": agent_id, "version": version},
            )
            for part in _PARTS:
                part.fork(conn, agent_id, version, new_agent_id)
        record = next(a for a in self.agents() if a.agent_id == new_agent_id)
        return ForkedAgent(
            record.agent_id,
            record.version,
            record.messages,
            record.created_at,
            record.updated_at,
            source_id=agent_id,
            source_version=version,
        )

    def delete(self, agent_id: str) -> None:
        """Delete the agent with all its versions, messages and handoff.

        Raises:
            NotFoundError: No such agent.
            AgentInUseError: A turn of the agent is running.
        """
        with self.agent_lock(agent_id), self._writing() as conn:
            found = current_version(conn, agent_id) is not None
            conn.execute("DELETE FROM handoffs WHERE agent_id = ?", (agent_id,))
            if not found and not conn.changes():
                raise NotFoundError(_no_agent(agent_id, self.path))
            for part in _PARTS:
                part.delete(conn, agent_id)
            conn.execute("DELETE FROM agents WHERE agent_id = ?", (agent_id,))
            conn.execute("DELETE FROM compacted_text WHERE agent_id = ?", (agent_id,))

    # -- alarms (SQL in alarms.py) ----------------------------------------------

    def alarms(
        self, agent_id: str | None = None, *, include_ended: bool = False
    ) -> list[AlarmInfo]:
        """The pending and dead alarms (of one agent, or all), by next occurrence.

        With ``include_ended``, delivered and cancelled alarms are listed too.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            return _alarms.latest(conn, agent_id, include_ended=include_ended)

    def schedule_alarm(
        self, agent_id: str, action: str, schedule: Schedule, *, now: float | None = None
    ) -> str:
        """Schedule an alarm outside any turn, as part of the agent's current version.

        Turns stage theirs instead (``AlarmTools``, ``agent.schedule``).

        Returns:
            The new alarm's id.

        .. versionadded:: 0.2.0
        """
        validate_agent_id(agent_id)
        alarm_id = _alarms.new_alarm_id()
        with self._writing() as conn:
            version = _alarms.current_version(conn, agent_id)
            when = time.time() if now is None else now
            _alarms.insert(conn, agent_id, alarm_id, action, schedule, version, when)
        return alarm_id

    def cancel_alarm(self, alarm_id: str, *, agent_id: str | None = None) -> bool:
        """Cancel a pending or dead alarm (of ``agent_id``, if given); False if none.

        .. versionadded:: 0.2.0
        """
        with self._writing() as conn:
            return _alarms.cancel(conn, alarm_id, agent_id)

    def rearm_alarm(self, alarm_id: str, *, at: float | None = None) -> AlarmInfo:
        """Make a dead alarm pending again, due at ``at`` (default: now), attempts reset.

        Raises:
            NotFoundError: No pending or dead alarm has that id.

        .. versionadded:: 0.2.0
        """
        with self._writing() as conn:
            return _alarms.rearm(conn, alarm_id, time.time() if at is None else at)

    def runner_statuses(self) -> list[dict[str, Any]]:
        """Each runner's last status report, most recent first.

        .. versionadded:: 0.2.0
        """
        return _alarms.statuses(self._connection())

    @property
    def alarm_queue(self) -> AlarmQueue:
        """The runner's protocol: claim, release and fail alarms, report status."""
        return AlarmQueue(self)

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
        and what memory, SQL workspace and alarms kept only for them. Every kept
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
        return retention.prune_store(
            self,
            agent_id,
            keep_versions=keep_versions,
            older_than=older_than,
            drop_compacted=drop_compacted,
            parts=_PARTS,
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
        before = _file_bytes(self.path)
        try:
            with translated(self.path, conn := self._connection()):
                retention.vacuum(conn)
        except apsw.BusyError as e:
            raise DatabaseBusyError(self.path, self.busy_timeout) from e
        return before - _file_bytes(self.path)

    def backup(self, path: str | os.PathLike[str]) -> None:
        """Copy the database, as of one committed moment, to the new file ``path``.

        Agents keep committing meanwhile (the copy reads one snapshot, which never
        blocks writers). The copy is compact, opens as a Store and passes
        ``PRAGMA integrity_check``; it appears at ``path`` only once complete.

        Raises:
            DurableError: ``path`` exists (it is never overwritten) or its
                directory does not.

        .. versionadded:: 0.2.0
        """
        retention.backup(self._connection(), self.path, os.fspath(path))

    def pruning(self, keep_versions: int) -> TurnWrite:
        """A turn write that prunes its agent to its last ``keep_versions`` versions as it goes."""
        return retention.PruneAsYouGo(keep_versions, _PARTS)

    # -- conversations -------------------------------------------------------

    def conversations(self, agent_id: str, version: int | None = None) -> list[ConversationInfo]:
        """The agent's conversations at ``version`` (default: the latest), by id.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            version = self._checked_version(conn, agent_id, version)
            return _conversations.listed(conn, agent_id, version)

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
        validate_conversation_id(conversation)
        with self.agent_lock(agent_id), self._writing() as conn:
            current = self._checked_version(conn, agent_id, None)
            if not _conversations.exists(conn, agent_id, conversation, current):
                raise NotFoundError(_no_conversation(agent_id, conversation, current))
            new = current + 1
            removed = _conversations.remove(conn, agent_id, conversation, new)
            conversation_fields.remove(conn, agent_id, conversation, new)
            self._insert_version(
                conn,
                agent_id,
                new,
                kind="delete",
                template=None,
                state=None,
                added=0,
                removed=removed,
                detail=None,
                conversation=conversation,
            )
            conn.execute(
                "UPDATE agents SET version = ?, updated_at = ? WHERE agent_id = ?",
                (new, time.time(), agent_id),
            )
        return new

    # -- the turn protocol, used by PersistenceHandler -----------------------

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

    def load_agent(self, agent_id: str, conversation: str = DEFAULT_CONVERSATION) -> LoadedAgent:
        """The agent's committed version, state, and one conversation's active history.

        Version 0 if the agent is new; an empty history, not found, if the
        conversation is.
        """
        with self._reading() as conn:
            version = current_version(conn, agent_id)
            if version is None:
                return LoadedAgent(0, ActiveHistory(), None)
            rows: list[tuple[Any, ...]] = conn.execute(
                """
                SELECT position, body FROM messages
                 WHERE agent_id = ? AND conversation = ? AND removed_in IS NULL
                 ORDER BY position
                """,
                (agent_id, conversation),
            ).fetchall()
            found = bool(rows) or _conversations.exists(conn, agent_id, conversation, version)
            state = _state_at(conn, agent_id, version)
            own = conversation_fields.state_at(conn, agent_id, conversation, version)
        positions = [position for position, _ in rows]
        messages = _decode_messages(body for _, body in rows)
        return LoadedAgent(version, ActiveHistory(messages, positions), state, found, own)

    def workspace_turn(self, agent_id: str, **options: Any) -> WorkspaceTurn:
        """Open the agent's SQL workspace for its running turn (its lock is held)."""
        files: WorkspaceFiles | None = getattr(self._local, "workspaces", None)
        if files is None:
            files = self._local.workspaces = WorkspaceFiles()
            with self._connections_lock:
                self._workspace_caches.append(files)
        conn, timeout = self._connection(), self.busy_timeout
        return WorkspaceTurn(
            conn, self.path, agent_id, busy_timeout=timeout, files=files, **options
        )

    def begin_turn(
        self,
        agent_id: str,
        *,
        template: str,
        arguments: Any,
        step: tuple[str, str] | None = None,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> TurnStart:
        """Commit a handoff row for a turn that starts now (and its journal step).

        Args:
            agent_id: The agent.
            conversation: The conversation the turn runs in; it has its own handoff.
            template: Name of the template the turn runs.
            arguments: The template's arguments, as JSON values.
            step: ``(workflow, step key)`` when the turn is a workflow step.

        Returns:
            The agent's committed version, the handoff of an earlier turn that did
            not commit (crashed or failed), which this one replaces, and the step's
            number.
        """
        arguments_json = dumps(arguments)
        now = time.time()
        with self._writing() as conn:
            version = current_version(conn, agent_id) or 0
            row = conn.execute(
                f"{_HANDOFF_SELECT} WHERE agent_id = ? AND conversation = ?",
                (agent_id, conversation),
            ).fetchone()
            earlier = _handoff(row) if row else None
            conn.execute(
                """
                INSERT OR REPLACE INTO handoffs (agent_id, conversation, base_version,
                    template, arguments, status, interrupted, host, pid, started_at)
                VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)
                """,
                (
                    agent_id,
                    conversation,
                    version,
                    template,
                    arguments_json,
                    _handoff_json(earlier),
                    _HOST,
                    os.getpid(),
                    now,
                ),
            )
            number = None
            if step is not None:
                workflow, key = step
                number = step_number(conn, workflow, key)
                conn.execute(
                    """
                    INSERT OR REPLACE INTO workflow_steps (workflow, step_key, number,
                        agent_id, conversation, template, arguments, status, base_version,
                        started_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)
                    """,
                    (
                        workflow,
                        key,
                        number,
                        agent_id,
                        conversation,
                        template,
                        arguments_json,
                        version,
                        now,
                    ),
                )
        return TurnStart(version, earlier, number)

    def commit_turn(
        self,
        agent_id: str,
        *,
        base_version: int,
        template: str,
        change: HistoryChange,
        state: str | None,
        detail: Mapping[str, Any] | None = None,
        step: tuple[str, str] | None = None,
        result: str | None = None,
        compaction: Compaction | None = None,
        writes: Sequence[TurnWrite] = (),
        conversation: str = DEFAULT_CONVERSATION,
    ) -> int:
        """Commit one turn in one transaction and clear its handoff.

        Args:
            agent_id: The agent.
            conversation: The conversation the turn ran in; ``change`` and
                ``compaction`` apply to its history.
            base_version: The version the turn started from.
            template: Name of the template the turn ran.
            change: Messages the turn added and removed.
            state: JSON of the persisted fields, or None if unchanged.
            detail: Extra facts to record with the version.
            step: ``(workflow, step key)`` to mark done, when the turn is a step.
            result: The step's result as JSON.
            compaction: A compaction made at the end of the turn; it becomes the
                next version, in the same transaction.
            writes: What the turn staged besides messages and fields (memory, SQL,
                alarms), applied as part of the turn's version.

        Returns:
            The last new version.

        Raises:
            StateSerializationError: A message cannot be stored as JSON.
            AgentInUseError: The agent was changed by a writer that bypassed its lock.
        """
        new = base_version + 1
        with self._writing() as conn:
            self._check_base(conn, agent_id, base_version)
            self._write_version(
                conn,
                agent_id,
                new,
                kind="turn",
                template=template,
                change=change,
                state=state,
                detail=detail,
                conversation=conversation,
            )
            for write in writes:
                write.write(conn, agent_id, new)
            conn.execute(
                "DELETE FROM handoffs WHERE agent_id = ? AND conversation = ?",
                (agent_id, conversation),
            )
            if step is not None:
                conn.execute(
                    """
                    UPDATE workflow_steps SET status = 'done', result = ?, version = ?,
                           finished_at = ?
                     WHERE workflow = ? AND step_key = ?
                    """,
                    (result, new, time.time(), *step),
                )
            if compaction is not None:
                new += 1
                self._write_compaction(conn, agent_id, new, compaction, conversation)
        return new

    def commit_compaction(
        self,
        agent_id: str,
        *,
        base_version: int,
        compaction: Compaction,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> int:
        """Commit a compaction made after the agent's turn had committed, as its own version.

        Returns:
            The new version.
        """
        with self._writing() as conn:
            self._check_base(conn, agent_id, base_version)
            self._write_compaction(conn, agent_id, base_version + 1, compaction, conversation)
        return base_version + 1

    def fail_turn(
        self,
        agent_id: str,
        error: str,
        *,
        step: tuple[str, str] | None = None,
        conversation: str = DEFAULT_CONVERSATION,
    ) -> None:
        """Mark the conversation's running handoff, and its journal step, as failed."""
        now = time.time()
        with self._writing() as conn:
            conn.execute(
                """
                UPDATE handoffs SET status = 'failed', error = ?, ended_at = ?
                 WHERE agent_id = ? AND conversation = ? AND status = 'running'
                """,
                (error, now, agent_id, conversation),
            )
            if step is not None:
                conn.execute(
                    """
                    UPDATE workflow_steps SET status = 'failed', finished_at = ?
                     WHERE workflow = ? AND step_key = ? AND status = 'running'
                    """,
                    (now, *step),
                )

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

    def _checked_version(self, conn: apsw.Connection, agent_id: str, version: int | None) -> int:
        current = current_version(conn, validate_agent_id(agent_id))
        if current is None:
            raise NotFoundError(_no_agent(agent_id, self.path))
        if version is None:
            return current
        if not 1 <= version <= current:
            msg = f"agent {agent_id!r} has no version {version}; it has versions 1 to {current}"
            raise NotFoundError(msg)
        if version < current and version < (kept := retention.kept_from(conn, agent_id)):
            msg = (
                f"version {version} of agent {agent_id!r} was pruned; it keeps "
                f"versions {kept} to {current}"
            )
            raise NotFoundError(msg)
        return version

    def _checked_conversation(
        self, conn: apsw.Connection, agent_id: str, conversation: str, version: int
    ) -> None:
        if conversation == DEFAULT_CONVERSATION:
            return  # an agent that never used it has it empty
        validate_conversation_id(conversation)
        if not _conversations.exists(conn, agent_id, conversation, version):
            raise NotFoundError(_no_conversation(agent_id, conversation, version))

    def _check_base(self, conn: apsw.Connection, agent_id: str, base_version: int) -> None:
        current = current_version(conn, agent_id) or 0
        if current != base_version:
            holder = f"a writer that committed version {current} during this turn"
            raise AgentInUseError(agent_id, holder)

    def _write_version(
        self,
        conn: apsw.Connection,
        agent_id: str,
        version: int,
        *,
        kind: str,
        template: str | None,
        change: HistoryChange,
        state: str | None,
        detail: Mapping[str, Any] | None,
        conversation: str,
    ) -> None:
        """Apply one conversation's history change as ``version`` and record the version."""
        added = [
            (
                agent_id,
                conversation,
                position,
                version,
                message.get("id"),
                message.get("role", ""),
                message_json(agent_id, message),
            )
            for position, message in change.added
        ]
        conn.execute(
            """
            INSERT INTO agents VALUES (?1, ?2, ?3, ?3)
            ON CONFLICT (agent_id) DO UPDATE SET version = ?2, updated_at = ?3
            """,
            (agent_id, version, time.time()),
        )
        _conversations.ensure(conn, agent_id, conversation, version)
        for low, high in change.removed:
            conn.execute(
                """
                UPDATE messages SET removed_in = ?4
                 WHERE agent_id = ?1 AND conversation = ?5 AND removed_in IS NULL
                   AND position BETWEEN ?2 AND ?3
                """,
                (agent_id, low, high, version, conversation),
            )
        conn.executemany(
            """
            INSERT INTO messages (agent_id, conversation, position, added_in, message_id,
                role, body)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            """,
            added,
        )
        self._insert_version(
            conn,
            agent_id,
            version,
            kind=kind,
            template=template,
            state=state,
            added=len(added),
            removed=change.removed_count,
            detail=detail,
            conversation=conversation,
        )

    def _write_compaction(
        self,
        conn: apsw.Connection,
        agent_id: str,
        version: int,
        compaction: Compaction,
        conversation: str,
    ) -> None:
        self._write_version(
            conn,
            agent_id,
            version,
            kind="compaction",
            template=compaction.summarizer,
            change=compaction.change,
            state=None,
            detail={"summary_id": compaction.summary_id, "messages": compaction.messages},
            conversation=conversation,
        )
        conn.execute(
            "INSERT INTO compactions VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                agent_id,
                version,
                compaction.summary_id,
                compaction.first_position,
                compaction.last_position,
                compaction.messages,
                compaction.summarizer,
            ),
        )
        # Index the text of the originals, for RecallTools: text blocks, plain
        # content and tool-call arguments (of bodies SQLite's JSON functions read:
        # not nested deeper than 1,000, sqlite.org/json1.html#jmini).
        conn.execute(
            """
            INSERT INTO compacted_text (text, agent_id, position, version)
            SELECT concat_ws(
                       ' ',
                       CASE json_type(body, '$.content')
                       WHEN 'array' THEN (
                           SELECT group_concat(json_extract(value, '$.text'), ' ')
                             FROM json_each(body, '$.content'))
                       ELSE json_extract(body, '$.content') END,
                       json_extract(body, '$.tool_calls')),
                   agent_id, position, removed_in
              FROM messages
             WHERE agent_id = ?1 AND conversation = ?5 AND removed_in = ?2
               AND position BETWEEN ?3 AND ?4 AND json_valid(body)
            """,
            (
                agent_id,
                version,
                compaction.first_position,
                compaction.last_position,
                conversation,
            ),
        )

    def _insert_version(
        self,
        conn: apsw.Connection,
        agent_id: str,
        version: int,
        *,
        kind: str,
        template: str | None,
        state: str | None,
        added: int,
        removed: int,
        detail: Mapping[str, Any] | None,
        conversation: str | None = None,
    ) -> None:
        conn.execute(
            """
            INSERT INTO versions (agent_id, version, kind, conversation, template, state,
                added, removed, detail, committed_at)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """,
            (
                agent_id,
                version,
                kind,
                conversation,
                template,
                state,
                added,
                removed,
                dumps(detail) if detail else None,
                time.time(),
            ),
        )

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


_HANDOFF_SELECT = """
    SELECT agent_id, base_version, template, arguments, status, error, interrupted,
           host, pid, started_at, ended_at, conversation
      FROM handoffs
"""


def _handoff(row: tuple[Any, ...]) -> Handoff:
    (
        agent_id,
        base,
        template,
        arguments,
        status,
        error,
        interrupted,
        host,
        pid,
        started,
        ended,
        conversation,
    ) = row
    return Handoff(
        agent_id,
        base,
        template,
        json.loads(arguments),
        status,
        error,
        json.loads(interrupted) if interrupted else None,
        host,
        pid,
        utc(started),
        utc(ended) if ended is not None else None,
        conversation,
    )


def _handoff_json(handoff: Handoff | None) -> str | None:
    if handoff is None:
        return None
    return dumps(
        {
            "template": handoff.template,
            "arguments": handoff.arguments,
            "status": handoff.status,
            "error": handoff.error,
            "base_version": handoff.base_version,
            "started_at": handoff.started_at.isoformat(),
        }
    )


def _state_at(conn: apsw.Connection, agent_id: str, version: int) -> str | None:
    # Kept versions that did not change the state inherit the one carried over
    # from the pruned versions before them (retention.py).
    state = conn.execute(
        """
        SELECT coalesce(
            (SELECT state FROM versions
              WHERE agent_id = ?1 AND version <= ?2 AND state IS NOT NULL
              ORDER BY version DESC LIMIT 1),
            (SELECT state FROM retention WHERE agent_id = ?1))
        """,
        (agent_id, version),
    ).get
    return None if state is None else str(state)


def _decode_messages(bodies: Iterator[str] | Any) -> list[dict[str, Any]]:
    # One parse of the joined rows is several times faster than one per row, and
    # pydantic-core's parser about twice as fast as json's. It refuses what only
    # json accepts (an escaped lone surrogate): then json decides.
    text = "[%s]" % ",".join(bodies)  # noqa: UP031  # one copy, where + makes two
    try:
        decoded: list[dict[str, Any]] = pydantic_core.from_json(text)
    except ValueError:
        decoded = json.loads(text)
    return decoded


def _no_conversation(agent_id: str, conversation: str, version: int) -> str:
    return (
        f"agent {agent_id!r} has no conversation {conversation!r} at version {version}; "
        "Store.conversations() lists the ones it has"
    )


def _no_agent(agent_id: str, path: str) -> str:
    return f"no agent {agent_id!r} in {path}; Store.agents() lists the agents it holds"


def _file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
