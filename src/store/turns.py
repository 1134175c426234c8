"""The turn protocol: what PersistenceHandler (and a state migration) calls to run a turn.

A turn starts in one way, :meth:`Turns.start`: it holds the agent for the block
and commits the turn's handoff row (the common start travels with the hold's
request: one round trip on PostgreSQL); it ends with :meth:`Turns.commit`, one
write transaction of everything the turn did, or :meth:`Turns.fail`. What a
running turn reads and stages besides (its agent's memory, SQL workspace and
alarms, its workflow steps) is here too, so that the handlers write no SQL.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from . import snapshots
from .engine.seam import Conn, Database, TurnWrite
from .engine.sqlite.damage import DamageWatch, watched
from .handoffs import HANDOFF_SELECT, HOST, handoff_of, interrupted_json, new_handoff
from .history import ActiveHistory, HistoryChange
from .holds import fenced
from .ids import DEFAULT_CONVERSATION, validate_agent_id
from .journal import STEP_UPSERT, step_number
from .parts import alarms as _alarms
from .parts import approvals as _approvals
from .parts import conversation_fields
from .parts import conversations as _conversations
from .parts import events as _events
from .parts.alarms import AlarmInfo
from .parts.memory import MemoryRows
from .parts.steps import sealed_step
from .parts.versioned import VersionedPart
from .records import CommitStats, Compaction, LoadedAgent, TurnStart
from .retention import PruneAsYouGo
from .rows import decode_positioned, dumps, legible, state_at, trace_in
from .sealing import HANDOFF, PLAIN, STATE, Sealer
from .versions import write_compaction, write_version
from .workspace.cache import WorkspaceCache
from .workspace.sandbox import SQLLimits
from .workspace.schema import Declaration
from .workspace.workspace import WorkspaceTurn


@watched(lambda turns: turns._damage, name="Store.turns")
class Turns:
    """The turn protocol of one :class:`~effectful_durable.Store`: ``store.turns``.

    ``start()`` holds the agent and begins a turn; ``commit()`` commits it in one
    transaction, or ``fail()`` records its failure. PersistenceHandler runs every
    turn this way; ``migrate_states`` commits its migrations this way too.

    Example::

        with store.turns.start("bot", template="note", arguments={}) as start:
            store.turns.commit(
                "bot", base_version=start.version, template="note",
                change=HistoryChange(added=[], removed=[], removed_count=0), state='{"n": 1}'
            )

    Attributes:
        memory: Reads of the agents' current memory, for a turn's memory tools.

    .. versionadded:: 0.2.0
    """

    def __init__(
        self,
        db: Database,
        damage: DamageWatch,
        workspaces: WorkspaceCache,
        parts: Sequence[VersionedPart],
        *,
        busy_timeout: float,
        sealer: Sealer = PLAIN,
    ) -> None:
        self._db = db
        self._sealer = sealer
        self._damage = damage
        self._workspaces = workspaces
        self._parts = parts
        self._busy_timeout = busy_timeout
        self.memory = MemoryRows(db.reading, sealer)

    # -- a turn ----------------------------------------------------------------

    def load(self, agent_id: str, conversation: str = DEFAULT_CONVERSATION) -> LoadedAgent:
        """The agent's committed version, state, and one conversation's active history.

        Version 0 if the agent is new; an empty history, not found, if the
        conversation is.
        """
        db = self._db
        with db.reading() as conn:
            version = db.agent_version(conn, agent_id)
            if version is None:
                return LoadedAgent(0, ActiveHistory(), None)
            known, state = db.latest_state(conn, agent_id)
            if not known:
                state = state_at(conn, agent_id, version)
            if state is not None:
                state = self._sealer.open(state, STATE, agent_id, table="versions")
            opened = 0
            if self._sealer.enabled:
                positions, messages, opened = self._sealed_history(conn, agent_id, conversation)
            else:
                rows = db.active_messages(conn, agent_id, conversation)
                positions, messages = decode_positioned(rows)
            found = bool(positions) or _conversations.exists(conn, agent_id, conversation, version)
            own = conversation_fields.state_at(conn, agent_id, conversation, version, self._sealer)
        if opened >= snapshots.MIN_OPENED and not db.readonly:
            snapshots.keep(db, self._sealer, agent_id, conversation, version, positions, messages)
        return LoadedAgent(version, ActiveHistory(messages, positions), state, found, own)

    def _sealed_history(
        self, conn: Conn, agent_id: str, conversation: str
    ) -> tuple[list[float], list[dict[str, Any]], int]:
        """A sealed conversation's active positions and messages, through its snapshot
        where one serves; and how many messages were opened one by one."""
        got = snapshots.taken(conn, self._sealer, agent_id, conversation)
        if got is not None:
            return got
        rows = self._db.active_messages(conn, agent_id, conversation)
        positions, messages = decode_positioned(
            self._sealer.open_messages(rows, agent_id, conversation)
        )
        return positions, messages, len(messages)

    @contextmanager
    def start(
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
        """Hold the agent for the block, and commit a handoff row for a turn that starts now.

        The common start (no workflow step, no earlier handoff) is written with
        the hold's request: on PostgreSQL one round trip takes the hold and
        commits the handoff row. Otherwise the start reads what is there, in a
        write transaction fenced by the hold: an earlier turn's handoff, which
        this one replaces, and the workflow step (its number).

        A conversation whose turn is suspended starts no other turn: the start
        yields the suspension, and writes nothing, unless this turn is the
        suspended one (same template, arguments and step) and every approval it
        waits for is decided: then it starts as that turn, resumed.

        Args:
            agent_id: The agent.
            wait: Seconds to wait while another thread or process holds the agent.
            template: Name of the template the turn runs.
            arguments: The template's arguments, as JSON values.
            step: ``(workflow, step key)`` when the turn is a workflow step.
            conversation: The conversation the turn runs in; it has its own handoff.
            resume_only: Start only as the conversation's suspended turn, resumed.
            trace: The W3C ``traceparent`` of the turn's span, kept in the handoff
                (:attr:`Handoff.trace <effectful_durable.Handoff.trace>`) so
                that the turn after a crash can link to it.

        Yields:
            The agent's committed version, the handoff of an earlier turn that did
            not commit (crashed or failed), and the step's number.

        Raises:
            InvalidAgentIdError: ``agent_id`` is not a valid agent id.
            AgentInUseError: It stayed held for longer than ``wait`` seconds.
            HoldLapsedError: The hold lapsed, or another process took the agent:
                nothing is written.
        """
        validate_agent_id(agent_id)
        handoff = None
        if step is None and not resume_only:
            handoff = new_handoff(agent_id, conversation, template, arguments, trace, self._sealer)
        with self._db.agent_lock(agent_id, wait=wait, handoff=handoff) as rows:
            if rows:
                yield TurnStart(int(rows[0][0]), None, None)
            else:
                # PostgreSQL retries a start whose connection broke: the row that
                # one may have written is this turn's, not an earlier one.
                own = None if handoff is None else handoff[4:7]
                yield self._begin(
                    agent_id, template, arguments, step, conversation, resume_only, trace, own
                )

    def _begin(
        self,
        agent_id: str,
        template: str,
        arguments: Any,
        step: tuple[str, str] | None,
        conversation: str,
        resume_only: bool,
        trace: str | None,
        own: Sequence[Any] | None,
    ) -> TurnStart:
        """The start that reads what is there (see :meth:`start`). ``own``: ``(host,
        pid, started_at)`` of the handoff row sent with the hold, if one was: a row of
        these values is this turn's, not an earlier one."""
        arguments_json = dumps(arguments)
        now = time.time()
        with fenced(self._db, agent_id) as conn:
            version = self._db.agent_version(conn, agent_id) or 0
            suspension = _approvals.open_suspension(conn, agent_id, conversation, self._sealer)
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
            earlier = (
                handoff_of(row, self._sealer)
                if row and tuple(row[7:10]) != tuple(own or ())
                else None
            )
            seal = self._sealer.seal
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
                    seal(arguments_json, HANDOFF, agent_id, conversation, "arguments"),
                    interrupted_json(earlier, trace, self._sealer, conversation, agent_id),
                    HOST,
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
                        sealed_step(
                            self._sealer,
                            agent_id,
                            conversation,
                            workflow,
                            key,
                            "arguments",
                            arguments_json,
                        ),
                        version,
                        now,
                    ),
                )
        return TurnStart(version, earlier, number, suspension)

    def commit(
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
            HoldLapsedError: The hold lapsed, or another process took the agent.
        """
        db, new = self._db, base_version + 1
        # A batch: on PostgreSQL the turn's statements and its commit travel together.
        # One look at the key store for all the turn seals (its messages, fields, writes).
        with self._sealer.one_look(), db.writing(batch=True) as conn:
            db.advance(
                conn,
                agent_id,
                base_version,
                new if compaction is None else new + 1,
                state_in=new if state is not None else None,
            )
            added = write_version(
                db,
                conn,
                agent_id,
                new,
                kind="turn",
                template=template,
                change=change,
                state=state,
                detail=detail,
                conversation=conversation,
                sealer=self._sealer,
            )
            db.check_writes(writes)
            for write in writes:
                write.write(conn, agent_id, new, self._sealer)
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
                    (
                        None
                        if result is None
                        else sealed_step(
                            self._sealer, agent_id, conversation, *step, "result", result
                        ),
                        new,
                        time.time(),
                        *step,
                    ),
                )
            if compaction is not None:
                new += 1
                write_compaction(
                    db, conn, agent_id, new, compaction, conversation, sealer=self._sealer
                )
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
        with self._sealer.one_look(), self._db.writing() as conn:
            self._db.advance(conn, agent_id, base_version, base_version + 1)
            write_compaction(
                self._db,
                conn,
                agent_id,
                base_version + 1,
                compaction,
                conversation,
                sealer=self._sealer,
            )
        return base_version + 1

    def fail(
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
        with fenced(self._db, agent_id) as conn:
            conn.execute(
                """
                UPDATE handoffs SET status = 'failed', error = ?, ended_at = ?
                 WHERE agent_id = ? AND conversation = ? AND status = 'running'
                """,
                (
                    self._sealer.seal(legible(error), HANDOFF, agent_id, conversation, "error"),
                    now,
                    agent_id,
                    conversation,
                ),
            )
            if step is not None:
                conn.execute(
                    """
                    UPDATE workflow_steps SET status = 'failed', finished_at = ?
                     WHERE workflow = ? AND step_key = ? AND status = 'running'
                    """,
                    (now, *step),
                )

    def trace_of(self, agent_id: str, version: int) -> str | None:
        """The ``traceparent`` of the traced turn that committed ``version``, if any."""
        with self._db.reading() as conn:
            row = conn.execute(
                "SELECT detail FROM checked_versions WHERE agent_id = ? AND version = ?",
                (agent_id, version),
            ).fetchone()
        return trace_in(row[0]) if row else None

    # -- what a turn stages ------------------------------------------------------

    def workspace(
        self,
        agent_id: str,
        *,
        declaration: Declaration,
        allow_ddl: bool,
        limits: SQLLimits,
        owner: str,
    ) -> WorkspaceTurn:
        """Open the agent's SQL workspace for its running turn (the agent is held)."""
        return WorkspaceTurn(
            self._db,
            self._workspaces,
            agent_id,
            declaration=declaration,
            allow_ddl=allow_ddl,
            limits=limits,
            owner=owner,
            busy_timeout=self._busy_timeout,
        )

    def pruning(self, keep_versions: int) -> TurnWrite:
        """A turn write that prunes its agent to its last ``keep_versions`` versions as it goes."""
        self._db.require("pruning as you go (keep_versions)")
        return PruneAsYouGo(keep_versions, self._parts)

    def pending_alarms(self, agent_id: str) -> int:
        """How many pending alarms the agent has, committed (a turn's own are staged)."""
        with self._db.reading() as conn:
            return _alarms.pending_count(conn, agent_id)

    def open_alarm(self, alarm_id: str) -> AlarmInfo | None:
        """The pending or dead alarm ``alarm_id``, if there is one."""
        with self._db.reading() as conn:
            return _alarms.open_alarm(conn, alarm_id, sealer=self._sealer)

    # -- workflow steps ------------------------------------------------------------

    def record_step(
        self, workflow: str, key: str, *, template: str, arguments: Any, result: str
    ) -> int:
        """Record a finished step that has no agent to commit (a free template).

        Returns:
            The step's number.
        """
        now = time.time()
        with self._db.writing() as conn:
            self._db.serialize(conn, "workflow", workflow)
            number = step_number(conn, workflow, key)
            conn.execute(
                f"""
                INSERT INTO workflow_steps (workflow, step_key, number, template,
                    arguments, status, result, started_at, finished_at)
                VALUES (?, ?, ?, ?, ?, 'done', ?, ?, ?)
                {STEP_UPSERT}
                """,
                (
                    workflow,
                    key,
                    number,
                    template,
                    sealed_step(
                        self._sealer, None, None, workflow, key, "arguments", dumps(arguments)
                    ),
                    sealed_step(self._sealer, None, None, workflow, key, "result", result),
                    now,
                    now,
                ),
            )
        return number

    def discard_steps(self, workflow: str, key_prefix: str, from_number: int) -> None:
        """Forget steps numbered ``from_number`` or later whose key starts with ``key_prefix``.

        Used when a step that runs again makes other nested calls than last time.
        """
        with self._db.writing() as conn:
            conn.execute(
                """
                DELETE FROM workflow_steps
                 WHERE workflow = ?1 AND number >= ?3
                   AND substr(step_key, 1, length(?2)) = ?2
                """,
                (workflow, key_prefix, from_number),
            )

    def wait_event(
        self, workflow: str, step_key: str, agent_id: str, name: str, timeout: float
    ) -> tuple[bool, str | None, float]:
        """Begin or look again at a workflow step that waits for an event.

        Returns:
            ``(done, result JSON, deadline)``; see ``parts/events.py``'s ``wait``.
        """
        now = time.time()
        with self._db.writing() as conn:
            self._db.serialize(conn, "workflow", workflow)
            self._db.serialize(conn, "events", agent_id)
            number = step_number(conn, workflow, step_key)
            return _events.wait(
                conn, workflow, step_key, number, agent_id, name, timeout, now, self._sealer
            )


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
