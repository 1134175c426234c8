"""The turn protocol PersistenceHandler runs: load, handoff, the one commit per turn."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from .base import StoreBase
from .engine.seam import Conn, TurnWrite
from .history import ActiveHistory, HistoryChange, message_json
from .ids import DEFAULT_CONVERSATION, validate_agent_id
from .journal import STEP_UPSERT, step_number
from .parts import approvals as _approvals
from .parts import conversation_fields
from .parts import conversations as _conversations
from .records import CommitStats, Compaction, Handoff, LoadedAgent, TurnStart
from .rows import decode_positioned, dumps, legible, state_at, utc

_HOST = socket.gethostname()


class TurnProtocol(StoreBase):
    """The turn protocol of :class:`~effectful_durable.Store` (a base of it).

    PersistenceHandler holds the agent's lock (``agent_lock``) around a turn,
    commits a handoff row when it starts (``begin_turn``), and commits the turn
    in one transaction (``commit_turn``) or records its failure (``fail_turn``).
    """

    def load_agent(self, agent_id: str, conversation: str = DEFAULT_CONVERSATION) -> LoadedAgent:
        """The agent's committed version, state, and one conversation's active history.

        Version 0 if the agent is new; an empty history, not found, if the
        conversation is.
        """
        with self._reading() as conn:
            version = self._db.agent_version(conn, agent_id)
            if version is None:
                return LoadedAgent(0, ActiveHistory(), None)
            known, state = self._db.latest_state(conn, agent_id)
            if not known:
                state = state_at(conn, agent_id, version)
            rows = self._db.active_messages(conn, agent_id, conversation)
            positions, messages = decode_positioned(rows)
            found = bool(positions) or _conversations.exists(conn, agent_id, conversation, version)
            own = conversation_fields.state_at(conn, agent_id, conversation, version)
        return LoadedAgent(version, ActiveHistory(messages, positions), state, found, own)

    @contextmanager
    def locked_turn(
        self,
        agent_id: str,
        *,
        wait: float = 0.0,
        template: str,
        arguments: Any,
        step: tuple[str, str] | None = None,
        conversation: str = DEFAULT_CONVERSATION,
        resume_only: bool = False,
        trace: str | None = None,
    ) -> Iterator[TurnStart]:
        """Hold the agent's lock for the block and begin a turn in it (``begin_turn``).

        The same as ``begin_turn`` inside ``agent_lock``, but the common start (no
        workflow step, no earlier handoff) is written with the lock's request: on
        PostgreSQL one round trip takes the lock and commits the handoff row.

        Raises:
            InvalidAgentIdError: ``agent_id`` is not a valid agent id.
            AgentInUseError: It stayed held for longer than ``wait`` seconds.
        """
        validate_agent_id(agent_id)
        handoff = None
        if step is None and not resume_only:
            handoff = self._handoff_values(agent_id, conversation, template, arguments, trace)
        with self._db.agent_lock(agent_id, wait=wait, handoff=handoff) as rows:
            if rows:
                yield TurnStart(int(rows[0][0]), None, None)
            else:
                yield self.begin_turn(
                    agent_id,
                    template=template,
                    arguments=arguments,
                    step=step,
                    conversation=conversation,
                    resume_only=resume_only,
                    trace=trace,
                    # PostgreSQL retries a start whose connection broke: the row
                    # that one may have written is this turn's, not an earlier one.
                    own=None if handoff is None else handoff[4:7],
                )

    def begin_turn(
        self,
        agent_id: str,
        *,
        template: str,
        arguments: Any,
        step: tuple[str, str] | None = None,
        conversation: str = DEFAULT_CONVERSATION,
        resume_only: bool = False,
        trace: str | None = None,
        own: Sequence[Any] | None = None,
    ) -> TurnStart:
        """Commit a handoff row for a turn that starts now (and its journal step).

        A conversation whose turn is suspended starts no other turn: the start
        returns the suspension, and writes nothing, unless this turn is the
        suspended one (same template, arguments and step) and every approval it
        waits for is decided: then it starts as that turn, resumed.

        Args:
            agent_id: The agent.
            conversation: The conversation the turn runs in; it has its own handoff.
            template: Name of the template the turn runs.
            arguments: The template's arguments, as JSON values.
            step: ``(workflow, step key)`` when the turn is a workflow step.
            resume_only: Start only as the conversation's suspended turn, resumed.
            trace: The W3C ``traceparent`` of the turn's span, kept in the handoff
                (:attr:`Handoff.trace <effectful_durable.Handoff.trace>`) so
                that the turn after a crash can link to it.
            own: ``(host, pid, started_at)`` of the handoff row ``locked_turn``
                sent with the hold, which found an earlier handoff or a suspended
                turn (or whose answer was lost): it is not sent again, and a row
                of these values is this turn's, not an earlier one.

        Returns:
            The agent's committed version, the handoff of an earlier turn that did
            not commit (crashed or failed), which this one replaces, and the step's
            number.

        Raises:
            HoldLapsedError: This Store's hold on the agent lapsed, or another
                process took the agent: nothing is written.
        """
        arguments_json = dumps(arguments)
        now = time.time()
        if step is None and not resume_only and own is None:
            # The common case: no earlier handoff to read, so one statement, in a
            # transaction of its own, starts the turn (``locked_turn`` sent it with
            # the hold, and passes ``own``). No row back means there is an earlier
            # handoff, or a suspended turn.
            with self._db.autocommit() as conn:
                rows = self._db.start(
                    conn, self._handoff_values(agent_id, conversation, template, arguments, trace)
                )
            if rows:
                return TurnStart(int(rows[0][0]), None, None)
        with self._fenced_writing(agent_id) as conn:
            version = self._db.agent_version(conn, agent_id) or 0
            suspension = _approvals.open_suspension(conn, agent_id, conversation)
            if suspension is None and resume_only:
                return TurnStart(version, None, None, None, started=False)
            if suspension is not None and not (
                suspension.decided
                and suspension.template == template
                and suspension.arguments == json.loads(arguments_json)
                and (suspension.workflow, suspension.step_key) == (step or (None, None))
            ):
                return TurnStart(version, None, None, suspension, started=False)
            row = conn.execute(
                f"{HANDOFF_SELECT} WHERE agent_id = ? AND conversation = ?",
                (agent_id, conversation),
            ).fetchone()
            earlier = handoff_of(row) if row and tuple(row[7:10]) != tuple(own or ()) else None
            conn.execute(
                """
                INSERT INTO handoffs (agent_id, conversation, base_version,
                    template, arguments, status, interrupted, host, pid, started_at)
                VALUES (?, ?, ?, ?, ?, 'running', ?, ?, ?, ?)
                ON CONFLICT (agent_id, conversation) DO UPDATE SET
                    base_version = excluded.base_version, template = excluded.template,
                    arguments = excluded.arguments, status = 'running', error = NULL,
                    interrupted = excluded.interrupted, host = excluded.host,
                    pid = excluded.pid, started_at = excluded.started_at, ended_at = NULL
                """,
                (
                    agent_id,
                    conversation,
                    version,
                    template,
                    arguments_json,
                    _handoff_json(earlier, trace),
                    _HOST,
                    os.getpid(),
                    now,
                ),
            )
            number = None
            if step is not None:
                workflow, key = step
                self._db.serialize(conn, "workflow", workflow)
                number = step_number(conn, workflow, key)
                conn.execute(
                    f"""
                    INSERT INTO workflow_steps (workflow, step_key, number,
                        agent_id, conversation, template, arguments, status, base_version,
                        started_at)
                    VALUES (?, ?, ?, ?, ?, ?, ?, 'running', ?, ?)
                    {STEP_UPSERT}
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
        return TurnStart(version, earlier, number, suspension)

    def _handoff_values(
        self,
        agent_id: str,
        conversation: str,
        template: str,
        arguments: Any,
        trace: str | None = None,
    ) -> tuple[Any, ...]:
        """The parameters of ``HANDOFF_INSERT`` for a turn that starts now."""
        return (
            agent_id,
            conversation,
            template,
            dumps(arguments),
            _HOST,
            os.getpid(),
            time.time(),
            _handoff_json(None, trace),
        )

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
        stats: CommitStats | None = None,
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
            stats: Filled in with what the commit wrote, once it has committed.

        Returns:
            The last new version.

        Raises:
            StateSerializationError: A message cannot be stored as JSON.
            AgentInUseError: The agent was changed by a writer that bypassed its lock.
        """
        new = base_version + 1
        # A batch: on PostgreSQL the turn's statements and its commit travel together.
        with self._db.writing(batch=True) as conn:
            self._db.advance(
                conn,
                agent_id,
                base_version,
                new if compaction is None else new + 1,
                state_in=new if state is not None else None,
            )
            added = self._write_version(
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
            self._db.check_writes(writes)
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
        if stats is not None:
            _count(stats, added, change, state, detail, result, writes, compaction)
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
            self._db.advance(conn, agent_id, base_version, base_version + 1)
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
        """Mark the conversation's running handoff, and its journal step, as failed.

        Raises:
            HoldLapsedError: This Store's hold on the agent lapsed: the handoff is
                another process's now, and nothing is written.
        """
        now = time.time()
        with self._fenced_writing(agent_id) as conn:
            conn.execute(
                """
                UPDATE handoffs SET status = 'failed', error = ?, ended_at = ?
                 WHERE agent_id = ? AND conversation = ? AND status = 'running'
                """,
                (legible(error), now, agent_id, conversation),
            )
            if step is not None:
                conn.execute(
                    """
                    UPDATE workflow_steps SET status = 'failed', finished_at = ?
                     WHERE workflow = ? AND step_key = ? AND status = 'running'
                    """,
                    (now, *step),
                )

    def _write_version(
        self,
        conn: Conn,
        agent_id: str,
        version: int,
        *,
        kind: str,
        template: str | None,
        change: HistoryChange,
        state: str | None,
        detail: Mapping[str, Any] | None,
        conversation: str,
    ) -> list[tuple[Any, ...]]:
        """Apply one conversation's history change as ``version`` and record the version.

        Returns:
            The message rows it inserted.
        """
        added = [
            (
                agent_id,
                conversation,
                position,
                version,
                None,
                message.get("id"),
                message.get("role", ""),
                message_json(agent_id, message),
            )
            for position, message in change.added
        ]
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
        if added:
            self._db.insert(conn, "messages", MESSAGE_COLUMNS, added)
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
        return added

    def _write_compaction(
        self,
        conn: Conn,
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
            """
            INSERT INTO compactions (agent_id, version, summary_id, first_position,
                last_position, messages, summarizer)
            VALUES (?, ?, ?, ?, ?, ?, ?)
            """,
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
        self._db.index_compacted(
            conn,
            agent_id,
            version,
            compaction.first_position,
            compaction.last_position,
            conversation,
        )

    def _insert_version(
        self,
        conn: Conn,
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
        row = (
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
        )
        self._db.insert(conn, "versions", VERSION_COLUMNS, [row])


def _count(
    stats: CommitStats,
    added: list[tuple[Any, ...]],
    change: HistoryChange,
    state: str | None,
    detail: Mapping[str, Any] | None,
    result: str | None,
    writes: Sequence[TurnWrite],
    compaction: Compaction | None,
) -> None:
    """Fill ``stats`` with what a committed turn wrote (see :class:`CommitStats`)."""
    texts = [row[-1] for row in added]
    texts += [text for text in (state, result) if text is not None]
    if detail:
        texts.append(dumps(detail))
    rows = len(added) + change.removed_count + 3  # the version, the agent, the handoff
    if compaction is not None:
        rows += len(compaction.change.added) + compaction.change.removed_count + 2
    stats.rows = rows
    stats.bytes = sum(len(text.encode()) for text in texts)
    stats.parts = len(writes)


#: A message row's columns, as ``_write_version`` inserts them.
MESSAGE_COLUMNS = (
    "agent_id",
    "conversation",
    "position",
    "added_in",
    "removed_in",
    "message_id",
    "role",
    "body",
)
#: A version row's columns, as ``_insert_version`` inserts them.
VERSION_COLUMNS = (
    "agent_id",
    "version",
    "kind",
    "conversation",
    "template",
    "state",
    "added",
    "removed",
    "detail",
    "committed_at",
)

HANDOFF_SELECT = """
    SELECT agent_id, base_version, template, arguments, status, error, interrupted,
           host, pid, started_at, ended_at, conversation
      FROM checked_handoffs
"""


def handoff_of(row: tuple[Any, ...]) -> Handoff:
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
    told = json.loads(interrupted) if interrupted else None
    trace = told.pop("trace", None) if told is not None else None
    return Handoff(
        agent_id,
        base,
        template,
        json.loads(arguments),
        status,
        error,
        told or None,
        host,
        pid,
        utc(started),
        utc(ended) if ended is not None else None,
        conversation,
        trace,
    )


def _handoff_json(handoff: Handoff | None, trace: str | None = None) -> str | None:
    """The handoff's ``interrupted`` column: the earlier handoff it replaces, if any.

    With tracing on it also keeps the turn's own ``traceparent`` under ``"trace"``
    (read back as :attr:`Handoff.trace`), so that no schema change was needed.
    """
    told: dict[str, Any] = {}
    if handoff is not None:
        told = {
            "template": handoff.template,
            "arguments": handoff.arguments,
            "status": handoff.status,
            "error": handoff.error,
            "base_version": handoff.base_version,
            "started_at": handoff.started_at.isoformat(),
        }
    if trace is not None:
        told["trace"] = trace
    return dumps(told) if told else None
