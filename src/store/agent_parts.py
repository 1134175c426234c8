"""The Store's methods for an agent's memory, SQL workspace and alarms (SQL in their modules)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import apsw

from ..errors import DatabaseBusyError
from .alarm_queue import AlarmQueue, statuses
from .base import StoreBase
from .engine.seam import Conn
from .ids import validate_agent_id
from .parts import alarms as _alarms
from .parts.alarms import AlarmInfo, Schedule
from .parts.memory import KEY, NOTE, MemoryNote, memory_at, note_of
from .rows import current_version
from .workspace.workspace import SQLResult, WorkspaceTurn, read_sql


class PartMethods(StoreBase):
    """The memory, SQL and alarm methods of :class:`~effectful_durable.Store` (a base of it)."""

    def memory(self, agent_id: str, version: int | None = None) -> dict[str, Any]:
        """The keys the agent stored in its memory, with their values, at ``version``.

        Default: the latest version. Keys are in sorted order.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            version = self._checked_memory(conn, agent_id, version, KEY)
            rows = memory_at(conn, agent_id, version, KEY)
        return {key: json.loads(value) for key, value in rows}

    def memory_notes(self, agent_id: str, version: int | None = None) -> list[MemoryNote]:
        """The context notes the agent kept at ``version`` (default: latest), oldest first.

        Raises:
            NotFoundError: No such agent or version.

        .. versionadded:: 0.2.0
        """
        with self._reading() as conn:
            version = self._checked_memory(conn, agent_id, version, NOTE)
            rows = memory_at(conn, agent_id, version, NOTE)
        return [note_of(value) for _, value in rows]

    def _checked_memory(self, conn: Conn, agent_id: str, version: int | None, kind: str) -> int:
        where = "kind = ? AND added_in <= ?"
        return self._checked_rows_of(conn, agent_id, version, "memory", where, kind, version)

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
        with self._reading() as conn:
            version = self._checked_version(conn, agent_id, version)
            latest = current_version(conn, agent_id)
        try:
            return read_sql(
                self._db, self._workspaces, agent_id, query, params, version=version,
                latest=version == latest, readonly=self.readonly, busy_timeout=self.busy_timeout,
            )  # fmt: skip
        except apsw.BusyError as e:
            raise DatabaseBusyError(self._db.location, self.busy_timeout) from e

    def workspace_turn(self, agent_id: str, **options: Any) -> WorkspaceTurn:
        """Open the agent's SQL workspace for its running turn (its lock is held)."""
        return WorkspaceTurn(
            self._db, self._workspaces, agent_id, busy_timeout=self.busy_timeout, **options
        )

    # -- alarms (SQL in parts/alarms.py) ----------------------------------------

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
        with self._reading() as conn:
            if include_ended:  # which span is an alarm's latest is read from every span
                where, params = ("agent_id = ?", (agent_id,)) if agent_id else ("1", ())
                self._db.check_rows(conn, "alarms", where, params)
            return _alarms.latest(conn, agent_id, include_ended=include_ended)

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
        with self._reading() as conn:
            return statuses(conn)

    @property
    def alarm_queue(self) -> AlarmQueue:
        """The runner's protocol: claim, release and fail alarms, report status."""
        return AlarmQueue(self)
