"""The Store's maintenance: rollback, fork, delete, retention, and the file as a whole."""

from __future__ import annotations

import os
import time
from datetime import datetime, timedelta
from typing import Any

import apsw

from ..errors import DatabaseBusyError, DurableError, NotFoundError
from . import retention
from .base import StoreBase
from .copy import copy_store
from .engine.seam import Conn, TurnWrite
from .engine.sqlite.translate import translated
from .ids import validate_agent_id, validate_conversation_id
from .parts import conversation_fields
from .parts import conversations as _conversations
from .reads import no_agent, no_conversation
from .records import ForkedAgent, PruneResult
from .rows import current_version, state_at

#: The tables whose rows a rollback or fork copies by their version marks, and
#: the column that says from which version on a row is held.
_VERSIONED: tuple[tuple[str, str], ...] = (
    ("messages", "added_in"),
    ("conversations", "added_in"),
    ("conversation_fields", "added_in"),
    ("memory", "added_in"),
    ("alarms", "created_in"),
)


class Maintenance(StoreBase):
    """The maintenance methods of :class:`~effectful_durable.Store` (a base of it).

    Each change to an agent takes the agent's lock, so it never races a running turn.
    """

    def check(self) -> dict[str, Any]:
        """An integrity check ("ok" when sound) and quick facts about the database.

        On SQLite, ``PRAGMA integrity_check``, ``damaged_rows`` (each row that fails
        its checksum: its table and the agent, conversation and version it claims;
        at most 1,000) and the file's size; on PostgreSQL, the schema version and
        row counts.
        """
        return self._db.check()

    def _check_copied(self, conn: Conn, agent_id: str, version: int) -> None:
        """Check every row a rollback or fork to ``version`` chooses from: they are
        chosen on their version marks, and a damaged mark must refuse the copy, not
        leave a row out of it."""
        for table, added in _VERSIONED:
            self._db.check_rows(conn, table, f"agent_id = ? AND {added} <= ?", (agent_id, version))

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
        with self._db.unhurried(), self._holding(agent_id) as conn:
            current = self._checked_version(conn, agent_id, None)
            self._checked_version(conn, agent_id, version)
            self._check_copied(conn, agent_id, version)
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
                  FROM checked_messages
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
                state=state_at(conn, agent_id, version),
                added=added,
                removed=removed,
                detail={"to": version},
            )
            for part in self._parts:
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
        with self._db.unhurried(), self._holding(new_agent_id) as conn:
            version = self._checked_version(conn, agent_id, version)
            self._check_copied(conn, agent_id, version)
            if current_version(conn, new_agent_id) is not None:
                msg = (
                    f"cannot fork into {new_agent_id!r}: that agent already exists in "
                    f"{self._db.location}. Choose another id, or delete it first."
                )
                raise DurableError(msg)
            now = time.time()
            conn.execute(
                """
                INSERT INTO agents (agent_id, version, created_at, updated_at)
                VALUES (?, 1, ?, ?)
                """,
                (new_agent_id, now, now),
            )
            conn.execute(
                """
                INSERT INTO messages (agent_id, conversation, position, added_in,
                    removed_in, message_id, role, body)
                SELECT ?3, conversation, position, 1, NULL, message_id, role, body
                  FROM checked_messages
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
                state=state_at(conn, agent_id, version),
                added=conn.changes(),
                removed=0,
                detail={"from": agent_id, "version": version},
            )
            for part in self._parts:
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
        with self._db.unhurried(), self._holding(agent_id) as conn:
            found = current_version(conn, agent_id) is not None
            conn.execute("DELETE FROM handoffs WHERE agent_id = ?", (agent_id,))
            if not found and not conn.changes():
                raise NotFoundError(no_agent(agent_id, self._db.location))
            for part in self._parts:
                part.delete(conn, agent_id)
            conn.execute("DELETE FROM agents WHERE agent_id = ?", (agent_id,))
            conn.execute("DELETE FROM compacted_text WHERE agent_id = ?", (agent_id,))
            self._db.agent_deleted(conn, agent_id)

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
        self._db.require("Store.prune")
        with self._db.unhurried():
            return retention.prune_store(
                self,
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
        self._db.require("Store.vacuum")
        before = _file_bytes(self.path)
        try:
            with translated(self.path, conn := self._connection()):
                retention.vacuum(conn)
        except apsw.BusyError as e:
            raise DatabaseBusyError(self.path, self.busy_timeout) from e
        return before - _file_bytes(self.path)

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
        if self._db.kind == "sqlite":
            retention.backup(self._connection(), self.path, target)
            return

        def write(partial: str) -> None:
            with self._store_at(partial) as copy:
                copy_store(self, copy)

        retention.publish(self._db.location, target, write)

    def pruning(self, keep_versions: int) -> TurnWrite:
        """A turn write that prunes its agent to its last ``keep_versions`` versions as it goes."""
        self._db.require("pruning as you go (keep_versions)")
        return retention.PruneAsYouGo(keep_versions, self._parts)

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
        with self._db.unhurried(), self._holding(agent_id) as conn:
            current = self._checked_version(conn, agent_id, None)
            if not _conversations.exists(conn, agent_id, conversation, current):
                raise NotFoundError(no_conversation(agent_id, conversation, current))
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


def _file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))
