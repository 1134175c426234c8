"""PersistenceHandler: one durable, atomic commit per agent turn."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Literal

import pydantic_core
from effectful.handlers.llm import Template
from effectful.ops.semantics import fwd, handler
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.approvals import ApprovalPolicy
from ..agents.conversations import (
    current_conversation,
    parked_fields,
    set_current_conversation,
    set_in_turn,
)
from ..agents.history import History, history_messages
from ..agents.persistent import PersistentAgent
from ..agents.state import conversation_fields, dump_state, reset_conversation_state, restore_state
from ..agents.tools import search_compacted
from ..errors import DurableError, TurnSuspended
from ..store import CommitStats, Compaction, Durability, Handoff, Keys, Store, TurnStart
from ..store.engine.seam import DEFAULT_STATEMENT_TIMEOUT
from ..store.history import (
    ActiveHistory,
    HistoryChange,
    check_messages,
    plan_change,
    plan_logged,
)
from ..store.ids import validate_agent_id
from ..store.parts.approvals import ApprovalWrite
from ..store.parts.conversation_fields import ConversationFieldsWrite
from .alarms import AlarmHandling
from .approvals import (
    ApprovalHandling,
    NothingToResume,
    ResumeFirst,
    Suspend,
    workflow_message,
)
from .conversations import ConversationHandling
from .effectful_hooks import (
    add_prompt_cache_hints,
    bound_agent,
    keep_own_history,
    set_history,
    system_notes,
)
from .effects import Compacted, compaction_scope, history_compacted
from .events import EventHandling
from .journal import Journal, step_arguments
from .memory import MemoryHandling
from .turn import Committed, Turn
from .workspace import WorkspaceHandling

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

    from .tracing import Tracing

log = logging.getLogger("effectful_durable.persistence")


class PersistenceHandler(  # type: ignore[no-untyped-call]
    ApprovalHandling,
    EventHandling,
    ConversationHandling,
    MemoryHandling,
    WorkspaceHandling,
    AlarmHandling,
    ObjectInterpretation[Any, Any],
):
    """Persist every PersistentAgent's history and state, one transaction per turn.

    A turn is the outermost template call on an agent. When it starts, a handoff row
    naming it is committed; when it returns, one transaction adds the messages it
    added, records what it removed, stores the agent's fields, bumps the version and
    clears the handoff. If it raises (Ctrl-C included), the agent in memory goes back
    to its last committed history and state and the handoff records the failure.
    A turn that was cut off by a crash is told to the agent's next turn, once.

    Install it inside the model provider, so that it sees template calls first::

        with handler(LiteLLMProvider(model="gpt-4o-mini")), handler(
            PersistenceHandler("state.db")
        ):
            bot.ask("What did we decide yesterday?")

    Plain effectful agents and free templates pass through untouched. Install the
    same handler in every thread that runs agents: different agents commit
    concurrently, and one agent driven by two threads or processes at once raises
    :class:`~effectful_durable.AgentInUseError` (or waits up to ``wait`` seconds).

    With ``workflow="name"`` the run is a crash-resumable workflow: every
    outermost template call is a numbered step whose result is recorded in the
    turn's own commit, and running the same program again replays the steps that
    are done (no model call, no new messages) and runs the first unfinished one.
    Steps are keyed by agent and per-agent call order (``coder-1#0``,
    ``coder-1#1``; a call nested in another step's turn extends that step's key),
    so each agent's calls must come in the same order on every run; calls on
    different agents may interleave freely across threads. Each conversation of
    an agent counts its own steps (``coder-1@c-42#0``).

    Conversations: a turn runs in its agent's current conversation, loading that
    conversation's history if the agent was last in another one; fields are the
    agent's, shared by all its conversations. The agent's lock covers all its
    conversations, so two turns of one agent never run at once, whatever their
    conversations (see :doc:`/conversations`).

    Args:
        db: SQLite file (created if missing, refused if not ours), a
            ``postgresql://`` URL (see :class:`~effectful_durable.Store`), or an open Store.
        durability: ``"normal"`` survives process crashes; ``"full"`` also power loss.
            Used only when ``db`` is a path (PostgreSQL's durability is the server's).
        busy_timeout: Seconds to wait for another writer's lock. Only with a path.
        statement_timeout: On PostgreSQL, the longest in seconds any one call
            of the turn may wait for the server (for a connection, for each
            answer; model calls are not database time): past it the turn fails
            with DatabaseUnavailableError, so that a frozen server is an error,
            not a hang. None: no limit. Only with a URL.
        wait: Seconds a turn waits for its agent while another turn holds it.
        workflow: Name of the workflow whose step journal this run follows.
        keep_versions: Keep only each agent's latest ``keep_versions`` versions,
            pruning older ones in the commits of its turns (see
            :meth:`Store.prune <effectful_durable.Store.prune>`); after each turn's
            commit an agent holds at most
            ``keep_versions + max(1, keep_versions // 2) - 1`` versions (one more
            after a compaction; see :doc:`/retention`). None keeps all.
        on_unreadable: ``"quarantine"`` moves a file that is not a readable
            effectful-durable database aside and starts a new one (see
            :class:`~effectful_durable.Store`); ``"refuse"`` raises. Only with a path.
        on_invalid_state: ``"default"`` gives a stored field that no longer
            validates against the agent's class its default, with a warning (the
            old value stays in the version history); ``"raise"`` raises
            :class:`~effectful_durable.StateSerializationError`.
        needs_approval: A policy over every tool call of the agents' turns:
            ``needs_approval(tool_name, arguments)`` returns falsy to run it, or
            True (or a text saying why) to suspend the turn until a person decides,
            as for tools marked with :func:`~effectful_durable.requires_approval`.
        tracing: OpenTelemetry traces of the turns (see :doc:`/traces`): False
            (the default) imports nothing of OpenTelemetry and costs nothing;
            True uses the global TracerProvider; or pass a TracerProvider. Needs
            ``pip install 'effectful-durable[otel]'``.
        code_version: What code this is, in your words (a git sha, a release
            tag): recorded with every turn it commits (``detail["code_version"]``
            of :meth:`Store.versions <effectful_durable.Store.versions>`), shown by
            ``effectful-durable versions``, the page and the traces, and counted by
            ``effectful-durable check`` (see :doc:`/upgrades`).
        trace_tool_arguments: Record each tool call's arguments in its span
            (``gen_ai.tool.call.arguments``, cut to at most 1,024 characters),
            and a failing tool's error message in its span and its turn's. They
            are written by the model, so off by default.
        keys: Encryption at rest (see :doc:`/privacy`): the master key and the
            key store (:class:`~effectful_durable.store.keys.Keys`). Only with a
            path or URL; an open Store brings its own.

    A turn that calls a tool needing approval is suspended: its messages so far
    commit, with the approvals it waits for, and the call raises
    :class:`~effectful_durable.TurnSuspended`. After every approval is decided,
    calling the agent again (or :meth:`resume`, or an AgentRunner) resumes it
    where it stopped; see :doc:`/approvals`.

    Raises:
        WorkflowDivergedError: A step asks for another template or other arguments
            than the journal recorded at its place.
        ImportError: ``tracing`` is on and the OpenTelemetry API is not installed.

    .. versionadded:: 0.1.0

    .. versionchanged:: 0.2.0
       ``tracing``, ``trace_tool_arguments``, ``statement_timeout`` and ``code_version``.

    .. versionchanged:: 0.2.0
       ``keys``.
    """

    def __init__(
        self,
        db: str | os.PathLike[str] | Store,
        *,
        durability: Durability = "normal",
        busy_timeout: float = 5.0,
        statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
        wait: float = 0.0,
        workflow: str | None = None,
        keep_versions: int | None = None,
        on_unreadable: Literal["refuse", "quarantine"] = "refuse",
        on_invalid_state: Literal["raise", "default"] = "raise",
        needs_approval: ApprovalPolicy | None = None,
        tracing: bool | TracerProvider = False,
        trace_tool_arguments: bool = False,
        code_version: str | None = None,
        keys: Keys | None = None,
    ) -> None:
        super().__init__()
        if keep_versions is not None and (
            isinstance(keep_versions, bool)
            or not isinstance(keep_versions, int)
            or keep_versions < 1
        ):
            msg = f"keep_versions must be None or an integer >= 1, not {keep_versions!r}"
            raise ValueError(msg)
        if on_invalid_state not in ("raise", "default"):
            msg = f"on_invalid_state must be 'raise' or 'default', not {on_invalid_state!r}"
            raise ValueError(msg)
        self.store = (
            db
            if isinstance(db, Store)
            else Store(
                db,
                durability=durability,
                busy_timeout=busy_timeout,
                on_unreadable=on_unreadable,
                statement_timeout=statement_timeout,
                keys=keys,
            )
        )
        self.wait = wait
        self.keep_versions = keep_versions
        self.on_invalid_state = on_invalid_state
        self.needs_approval = needs_approval
        self.code_version = _checked_code_version(code_version)
        self._pruning = [self.store.turns.pruning(keep_versions)] if keep_versions else []
        self.journal = Journal(self.store, workflow) if workflow is not None else None
        self._database = self.store.engine.identity
        self._local = threading.local()
        self.traces: Tracing | None = None  # its turns' spans; a runner's deliveries parent them
        if tracing is not False and tracing is not None:
            from .tracing import Tracing  # imports opentelemetry: only when asked

            provider = None if tracing is True else tracing
            self.traces = Tracing(provider, tool_arguments=trace_tool_arguments)

    def close(self) -> None:
        """Close the handler's store."""
        self.store.close()

    def load(self, agent: PersistentAgent) -> int:
        """Restore ``agent`` from the database now rather than at its first turn.

        Use it to read persisted fields before the agent's first template call.

        Returns:
            The agent's committed version (0 if the database does not know it yet).

        Raises:
            InvalidAgentIdError: The agent's id is not valid.
            StateSerializationError: A stored field no longer fits its type (unless
                ``on_invalid_state="default"``). Nothing is written.
        """
        validate_agent_id(agent.agent_id)
        committed = _committed(agent)
        if not self._loaded_here(agent):
            committed = self._load(agent, keep_memory=True)
        assert committed is not None
        return committed.version

    @implements(Template.__apply__)  # type: ignore[untyped-decorator]
    def _apply(self, template: Template[..., Any], *args: Any, **kwargs: Any) -> Any:
        agent = bound_agent(template, PersistentAgent)
        turns = self._turns()
        if agent is not None and any(turn.agent is agent for turn in turns):
            return fwd()  # a nested call on the same agent belongs to its turn
        if agent is not None:
            validate_agent_id(agent.agent_id)
        resume_only = agent is not None and self.resuming(agent)
        journal = self.journal if (agent is not None or not turns) and not resume_only else None
        if agent is None and journal is None:
            return fwd()  # a free template, and not a workflow step: not ours
        name = getattr(template, "__name__", type(template).__name__)
        arguments = step_arguments(template, args, kwargs)
        step = None
        if journal is not None:
            parent = turns[-1].step if turns else None
            agent_id = agent.agent_id if agent is not None else None
            conversation = current_conversation(agent) if agent is not None else None
            step = journal.next_step(template, name, arguments, agent_id, parent, conversation)
            started = time.time_ns() if self.traces is not None else 0
            replayed, result = journal.replay(step, nested=bool(turns))
            if replayed:
                if self.traces is not None:
                    self.traces.replayed(journal.workflow, step.key, name, agent_id, started)
                return result
        if agent is not None:
            turn = Turn(agent, name, step, current_conversation(agent), arguments=arguments)
            try:
                return self._run_turn(agent, turn, arguments, resume_only=resume_only)
            except ResumeFirst as first:
                if resume_only:
                    # The turn this call was to resume was resumed elsewhere since it
                    # was read, and a later one waits, decided: resume that one. Never
                    # run the call read as a new turn: it would ask its approvals again.
                    return self._resume_call(agent, first.suspension)
                # The conversation's suspended turn, decided, was another call: it
                # goes first (its result is in the history), then this call.
                log.info(
                    "resuming the suspended %s of %s before %s",
                    first.suspension.template,
                    agent.agent_id,
                    name,
                    extra={"agent": agent.agent_id},
                )
                with contextlib.suppress(NothingToResume):
                    self._resume_call(agent, first.suspension)
                turn = Turn(agent, name, step, current_conversation(agent), arguments=arguments)
                return self._run_turn(agent, turn, arguments)
        result = fwd()  # a free template as a workflow step: no agent to commit
        if journal is not None and step is not None:
            journal.record(step, result)
        return result

    def _resume_local(self) -> list[PersistentAgent]:
        """The agents this thread is resuming a suspended turn of (resume-only calls)."""
        resuming: list[PersistentAgent] | None = getattr(self._local, "resuming", None)
        if resuming is None:
            resuming = self._local.resuming = []
        return resuming

    def _run_turn(
        self, agent: PersistentAgent, turn: Turn, arguments: Any, *, resume_only: bool = False
    ) -> Any:
        if self.traces is None:
            return self._locked_turn(agent, turn, arguments, resume_only=resume_only)
        workflow = self.journal.workflow if self.journal is not None else None
        with self.traces.turn(agent, turn, workflow, self.code_version) as span:
            turn.span = span
            return self._locked_turn(agent, turn, arguments, resume_only=resume_only)

    def _locked_turn(
        self, agent: PersistentAgent, turn: Turn, arguments: Any, *, resume_only: bool
    ) -> Any:
        step = (self.journal.workflow, turn.step.key) if self.journal and turn.step else None
        tracing = self.traces
        with self.store.turns.start(
            agent.agent_id,
            wait=self.wait,
            template=turn.template,
            arguments=arguments,
            step=step,
            conversation=turn.conversation,
            resume_only=resume_only,
            trace=tracing.traceparent(turn.span) if tracing is not None else None,
        ) as start:
            self._begin(agent, turn, start)
            self._turns().append(turn)
            set_in_turn(agent, True)
            try:
                interpretation = self._turn_interpretation(turn)
                with contextlib.ExitStack() as installed:
                    if interpretation:
                        installed.enter_context(handler(interpretation))
                    if self.traces is not None:  # innermost: it sees every call first
                        traced = self.traces.interpretation(
                            turn, lambda: self._turns()[-1] is turn
                        )
                        installed.enter_context(handler(traced))
                    result = fwd()
                self._commit(agent, turn, result)
            except Suspend as suspend:
                self._suspend(agent, turn, suspend.messages)
                raise self._suspended(agent, turn.conversation) from None
            except BaseException as error:
                self._end_turn(turn, committed=False)
                self._abort(agent, turn, error)
                raise
            finally:
                set_in_turn(agent, False)
                self._turns().pop()
        return result

    def _suspend(self, agent: PersistentAgent, turn: Turn, messages: list[Any]) -> None:
        """Commit what the turn did up to the tool calls it asks approval for."""
        try:
            set_history(agent, messages)
            self._commit(agent, turn, None, suspended=True)
        except BaseException as error:
            self._end_turn(turn, committed=False)
            self._abort(agent, turn, error)
            raise

    @implements(history_compacted)  # type: ignore[untyped-decorator]
    def _history_compacted(self, agent: Any, compacted: Compacted) -> None:
        if not isinstance(agent, PersistentAgent):
            fwd()
            return None
        turn = self._turn_of(agent)
        if turn is not None:
            turn.compacted = compacted  # committed with the turn, as the next version
            return None
        with self.store.agent_lock(agent.agent_id, wait=self.wait):
            committed = _committed(agent)
            if (
                committed is None
                or committed.conversation != current_conversation(agent)
                or committed.history.messages != compacted.before
            ):
                msg = (
                    f"compaction of {agent.agent_id!r} happened on a history that is not "
                    "its last commit; list CompactionHandler before PersistenceHandler"
                )
                raise DurableError(msg)
            compaction, history = _compaction(committed.history, agent, compacted)
            version = self.store.turns.commit_compaction(
                agent.agent_id,
                base_version=committed.version,
                compaction=compaction,
                conversation=committed.conversation,
            )
            _set_committed(
                agent,
                replace(committed, version=version, history=history),
            )
        return None

    @implements(compaction_scope)  # type: ignore[untyped-decorator]
    def _compaction_scope(
        self, agent: Any, messages: int, summarizer: str
    ) -> contextlib.AbstractContextManager[Any]:
        if self.traces is None:
            return fwd()  # type: ignore[no-any-return]
        return self.traces.compaction(agent, messages, summarizer)

    @implements(search_compacted)  # type: ignore[untyped-decorator]
    def _search_compacted(self, agent: Any, query: str, limit: int) -> list[dict[str, Any]]:
        if not isinstance(agent, PersistentAgent):
            return fwd()  # type: ignore[no-any-return]
        return self.store.search_compacted(
            agent.agent_id, query, limit, conversation=current_conversation(agent)
        )

    def _turn_of(self, agent: PersistentAgent) -> Turn | None:
        """The turn of ``agent`` running in this thread, if any."""
        return next((turn for turn in self._turns() if turn.agent is agent), None)

    def _turns(self) -> list[Turn]:
        turns: list[Turn] | None = getattr(self._local, "turns", None)
        if turns is None:
            turns = self._local.turns = []
        return turns

    def _begin(self, agent: PersistentAgent, turn: Turn, start: TurnStart) -> None:
        """Carry on with the turn the store began (or refuse it): load what it needs."""
        tracing = self.traces
        if tracing is not None:
            earlier = start.earlier
            tracing.started(
                turn.span,
                start.version,
                earlier.trace if earlier is not None else None,
                earlier.status if earlier is not None else "running",
            )
        suspension = start.suspension
        if not start.started:  # nothing was written
            if suspension is None:
                raise NothingToResume(agent.agent_id)
            if suspension.pending:
                raise TurnSuspended(agent.agent_id, list(suspension.approvals))
            if suspension.workflow is not None:
                raise DurableError(workflow_message(suspension))
            raise ResumeFirst(suspension)
        if tracing is not None and suspension is not None:
            suspended = self.store.turns.trace_of(agent.agent_id, suspension.suspended_in)
            if suspended is not None:
                tracing.resumes(turn.span, suspended)
        turn.step_number = start.step_number
        if self.journal is not None and turn.step is not None:
            self.journal.log(turn.step_number, turn.step, "live")
        try:
            committed = _committed(agent)
            if committed is None or committed.database != self._database:
                committed = self._load(agent, keep_memory=start.version == 0)
            elif committed.version != start.version:
                committed = self._load(agent, keep_memory=False)  # another writer moved it
            elif committed.conversation != turn.conversation:
                committed = self._load(agent, keep_memory=True, history_only=True)
            if not committed.history.positions:
                # Nothing committed in this conversation: a failure goes back to
                # what the user built in memory.
                turn.uncommitted_history = history_messages(agent.__history__)
            if committed.version == 0:
                turn.uncommitted_state = dump_state(agent)
            if committed.conversation_state is None and conversation_fields(agent):
                turn.uncommitted_conversation_state = dump_state(agent, per_conversation=True)
            cleared = self._begin_conversation(agent)
            if cleared is not None:
                turn.uncommitted_history = cleared
            if suspension is not None:
                turn.resuming = self._replay(suspension, committed.history.messages)
        except BaseException as error:
            if self._record_failure(agent, turn, error):
                # The error may say that nothing was written (of the agent): say
                # what was (the handoff), and that the model will hear of it.
                written = "handoff row and workflow step were" if turn.step else "handoff row was"
                error.add_note(
                    f"effectful-durable: the turn ({turn.template!r} of agent "
                    f"{agent.agent_id!r}) stopped before it called the model. Only its "
                    f"{written} written, marked failed with this error "
                    "(Store.handoffs()); the agent's next turn is told that it failed."
                )
            raise
        turn.committed, turn.earlier = committed, start.earlier

    def _load(
        self, agent: PersistentAgent, *, keep_memory: bool, history_only: bool = False
    ) -> Committed:
        """Install the committed agent in its current conversation.

        What the database does not know (a new agent, a new conversation) keeps
        what memory holds if ``keep_memory``. With ``history_only`` (the version is
        the one in memory) the fields in memory are kept as they are.
        """
        conversation = current_conversation(agent)
        if self.traces is None:
            loaded = self.store.turns.load(agent.agent_id, conversation)
        else:
            with self.traces.load(agent.agent_id, conversation) as done:
                loaded = self.store.turns.load(agent.agent_id, conversation)
                done(len(loaded.history.messages))
        if (
            history_only
            and (committed := _committed(agent))
            and loaded.version != committed.version
        ):
            history_only = False  # another writer moved it since
        state = loaded.state
        if loaded.conversation_found or not keep_memory:
            set_history(agent, loaded.history.messages)
            add_prompt_cache_hints(agent.__history__)
            loaded.history.messages[:] = history_messages(agent.__history__)
        if history_only:
            state = committed.state  # type: ignore[union-attr]  # set above
        elif loaded.version:
            parked_fields(agent).clear()  # the database wins over what memory kept
            if loaded.state is not None:
                restore_state(agent, loaded.state, on_invalid=self.on_invalid_state)
        if loaded.conversation_state is not None:
            restore_state(
                agent,
                loaded.conversation_state,
                on_invalid=self.on_invalid_state,
                per_conversation=True,
            )
        elif loaded.conversation_found or not keep_memory:
            reset_conversation_state(agent)
        committed = Committed(
            self._database,
            loaded.version,
            loaded.history,
            state,
            conversation,
            loaded.conversation_state,
        )
        _set_committed(agent, committed)
        return committed

    def _loaded_here(self, agent: PersistentAgent) -> bool:
        committed = _committed(agent)
        return committed is not None and committed.database == self._database

    def _load_conversation(self, agent: PersistentAgent, conversation: str) -> None:
        # The agent switches to ``conversation`` once this returns; load it as such.
        previous = current_conversation(agent)
        set_current_conversation(agent, conversation)
        try:
            self._load(agent, keep_memory=False, history_only=True)
        finally:
            set_current_conversation(agent, previous)

    def _advanced(self, agent: PersistentAgent, version: int) -> None:
        committed = _committed(agent)
        if committed is not None and committed.version == version - 1:
            committed.version = version  # our own change: memory still matches

    def _turn_interpretation(self, turn: Turn) -> Mapping[Any, Any]:
        """Keep nested agents' messages; add the turn's notes to its system message.

        Only what the turn needs: installing a handler costs effectful tens of
        microseconds, so the notes' handler is there only if the turn has a
        handoff note or its agent one of the parts' notes (a memory digest, ...).
        """
        interpretation = dict(keep_own_history())
        interpretation.update(self._approval_interpretation(turn))
        if turn.earlier is not None or self._tells(turn.agent):
            interpretation.update(
                system_notes(lambda: self._system_notes(turn) if self._turns()[-1] is turn else [])
            )
        return interpretation

    def _tells(self, agent: PersistentAgent) -> bool:
        """Whether a part (memory, ...) may add notes to ``agent``'s model requests."""
        parts = getattr(super(), "_tells", None)
        return bool(parts(agent)) if parts is not None else False

    def _system_notes(self, turn: Turn) -> list[str]:
        """What the model is told each request of ``turn``, outside its history."""
        handoff = [_handoff_note(turn.earlier)] if turn.earlier is not None else []
        return [*handoff, *super()._system_notes(turn)]  # the parts' notes (memory, SQL)

    def _commit(
        self, agent: PersistentAgent, turn: Turn, result: Any, *, suspended: bool = False
    ) -> None:
        committed = turn.committed
        assert committed is not None
        state = dump_state(agent)
        writes = list(turn.staged.values())
        if turn.asked or turn.resuming is not None:
            writes.append(self._approval_write(turn))
        own = dump_state(agent, per_conversation=True) if conversation_fields(agent) else None
        if own is not None and own != committed.conversation_state:
            writes.append(ConversationFieldsWrite(committed.conversation, own))
        writes += self._pruning
        step, result_json = None, None
        if self.journal is not None and turn.step is not None and not suspended:
            step = (self.journal.workflow, turn.step.key)
            result_json = self.journal.encode(turn.step, result)
        compaction = None
        if turn.compacted is None:
            change, history = _plan(agent.agent_id, committed.history, agent.__history__)
        else:
            change, history = plan_change(committed.history, turn.compacted.before)
            check_messages(agent.agent_id, (m for _, m in change.added), None)
            compaction, history = _compaction(history, agent, turn.compacted)
        detail: dict[str, Any] = {}
        if turn.earlier:
            detail["recovered"] = _handoff_summary(turn.earlier)
        if suspended:
            detail["suspended"] = [asked.approval_id for asked in turn.asked]
        if turn.resuming is not None:
            detail["resumed"] = turn.resuming.suspension.suspended_in
        if self.code_version is not None:
            detail["code_version"] = self.code_version
        tracing, stats = self.traces, None
        if tracing is not None:
            # The turn's trace context, for the alarms it schedules (their deliveries link to it).
            detail["trace"] = tracing.traceparent(turn.span)
            stats = CommitStats()
        with (
            tracing.commit(agent.agent_id, stats)
            if tracing is not None and stats is not None
            else contextlib.nullcontext()
        ):
            version = self.store.turns.commit(
                agent.agent_id,
                base_version=committed.version,
                template=turn.template,
                change=change,
                state=state if state != committed.state else None,
                detail=detail or None,
                step=step,
                result=result_json,
                compaction=compaction,
                writes=writes,
                conversation=committed.conversation,
                stats=stats,
            )
        if tracing is not None:
            tracing.committed(turn.span, version)
        if history is committed.history:
            history.extend(change)  # a logged plan: true now that it is committed
        turn.committed = Committed(
            self._database, version, history, state, committed.conversation, own
        )
        _set_committed(agent, turn.committed)
        self._commit_conversation(agent)
        self._end_turn(turn, committed=True)
        if self.journal is not None and turn.step is not None:
            self.journal.log(turn.step_number, turn.step, "suspended" if suspended else "done")

    def _approval_write(self, turn: Turn) -> ApprovalWrite:
        step = (self.journal.workflow, turn.step.key) if self.journal and turn.step else None
        return ApprovalWrite(
            turn.conversation,
            turn.template,
            turn.arguments,
            step,
            list(turn.asked),
            turn.resuming.suspension if turn.resuming is not None else None,
        )

    def _abort(self, agent: PersistentAgent, turn: Turn, error: BaseException) -> None:
        committed = turn.committed
        if committed is not None and _committed(agent) is committed:
            # The turn did not commit: roll the agent in memory back.
            history = turn.uncommitted_history
            set_history(agent, committed.history.messages if history is None else history)
            state = committed.state if committed.version else turn.uncommitted_state
            if state is not None:
                restore_state(agent, state, on_invalid=self.on_invalid_state)
            own = committed.conversation_state or turn.uncommitted_conversation_state
            if own is not None:
                restore_state(agent, own, on_invalid=self.on_invalid_state, per_conversation=True)
            _set_committed(agent, committed)
        self._record_failure(agent, turn, error)

    def _record_failure(self, agent: PersistentAgent, turn: Turn, error: BaseException) -> bool:
        """Mark the turn's handoff failed with ``error``; whether that was written."""
        step = (self.journal.workflow, turn.step.key) if self.journal and turn.step else None
        recorded = False
        with contextlib.suppress(Exception):  # never mask the turn's own error
            self.store.turns.fail(
                agent.agent_id,
                f"{type(error).__name__}: {error}",
                step=step,
                conversation=turn.conversation,
            )
            recorded = True
        if self.journal is not None and turn.step is not None:
            self.journal.log(turn.step_number, turn.step, "failed")
        return recorded


def _compaction(
    before: ActiveHistory, agent: PersistentAgent, compacted: Compacted
) -> tuple[Compaction, ActiveHistory]:
    """The compaction to commit, from the committed history just before it."""
    change, after = _plan(agent.agent_id, before, agent.__history__, logged=False)
    compaction = Compaction(
        change=change,
        summary_id=str(compacted.summary["id"]),
        first_position=before.positions[compacted.first],
        last_position=before.positions[compacted.last],
        messages=compacted.last - compacted.first + 1,
        summarizer=compacted.summarizer,
    )
    return compaction, after


def _plan(
    agent_id: str, committed: ActiveHistory, history: Any, *, logged: bool = True
) -> tuple[HistoryChange, ActiveHistory]:
    """The turn's change, from the history's log when it has one, else by comparison.

    A logged change comes back with ``committed`` itself as the history after it:
    apply it with ``committed.extend(change)`` once the commit has succeeded.

    Raises:
        StateSerializationError: The change adds a message that could not be
            stored and loaded back as it is.
    """
    changes = history.changes() if logged and isinstance(history, History) else None
    try:
        change = None
        if changes is not None:
            change = plan_logged(committed, history, changes.appended, changes.replaced)
        if change is not None:
            after = committed
        else:
            change, after = plan_change(committed, history_messages(history))
    except (AttributeError, TypeError):  # planning met a message that is not a dict
        check_messages(agent_id, history_messages(history), history)
        raise
    check_messages(agent_id, (message for _, message in change.added), history)
    return change, after


def _committed(agent: PersistentAgent) -> Committed | None:
    committed: Committed | None = agent.__dict__.get("__durable__")
    return committed


def _set_committed(agent: PersistentAgent, committed: Committed) -> None:
    """Record that ``agent`` in memory is at ``committed``; its history logs from here."""
    agent.__dict__["__durable__"] = committed
    history = agent.__history__
    if isinstance(history, History):
        history.mark_committed()


def _checked_code_version(code_version: str | None) -> str | None:
    if code_version is None:
        return None
    if not isinstance(code_version, str) or not code_version.strip() or len(code_version) > 200:
        msg = (
            "code_version must be None or a non-empty text of at most 200 characters "
            f"(a git sha, a release tag), not {code_version!r}"
        )
        raise ValueError(msg)
    return code_version


def _handoff_summary(handoff: Handoff) -> dict[str, Any]:
    return {
        "template": handoff.template,
        "arguments": handoff.arguments,
        "status": handoff.status,
        "error": handoff.error,
        "started_at": handoff.started_at.isoformat(),
    }


def _handoff_note(handoff: Handoff) -> str:
    arguments = pydantic_core.to_json(handoff.arguments).decode()
    what = (
        f"failed with {_what_failed(handoff.error or 'an error')}"
        if handoff.status == "failed"
        else "was cut off: the program stopped before the turn finished"
    )
    return (
        "Note from the runtime: your previous turn did not complete. It was "
        f"`{handoff.template}` called with {arguments}, started at "
        f"{handoff.started_at:%Y-%m-%d %H:%M:%S} UTC, and it {what}. Nothing from "
        "that turn was kept: your history ends with your last completed turn. "
        "If that work is still needed, do it again."
    )


def _what_failed(error: str) -> str:
    """A recorded failure (``"Type: message"``) as the model is told it.

    An error of this library is told briefly: its type and its message's first
    sentence, without asides in parentheses. Its other sentences (what was
    written, what to change: "pass on_invalid_state=...", "Annotate the field
    ...") are meant for the developer, who got the whole error; the handoff row
    keeps it whole. Other errors (the provider's, a tool's) are told as they are.
    """
    name, colon, message = error.partition(": ")
    if not colon or name not in _library_errors():
        return error
    return f"{name}: {_first_sentence(message)}"


def _library_errors() -> set[str]:
    """The names of DurableError and of every subclass of it."""
    names, classes = set(), [DurableError]
    while classes:
        cls = classes.pop()
        names.add(cls.__name__)
        classes += cls.__subclasses__()
    return names


def _first_sentence(message: str) -> str:
    """``message`` up to its first full stop outside brackets, without its " (...)" asides."""
    kept: list[str] = []
    depth, aside = 0, False
    for i, char in enumerate(message):
        if char in "([{":
            if depth == 0 and char == "(" and kept and kept[-1] == " ":
                kept.pop()  # the aside's space goes with it
                aside = True
            depth += 1
        elif char in ")]}" and depth:
            depth -= 1
            if depth == 0 and aside:
                aside = False
                continue
        elif depth == 0 and char == "." and message[i + 1 : i + 2] in (" ", ""):
            break
        if not aside:
            kept.append(char)
    return "".join(kept).strip() or message
