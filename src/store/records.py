"""Rows coming out of the store, as frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from .history import ActiveHistory, HistoryChange


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """One durable agent: its id, last committed version and active message count, and
    the subject its content is about, if the application named one
    (:meth:`~effectful_durable.Store.set_subject`).

    .. versionchanged:: 0.2.0
       ``subject``.
    """

    agent_id: str
    version: int
    messages: int
    created_at: datetime
    updated_at: datetime
    subject: str | None = field(default=None, kw_only=True)


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One committed version of an agent.

    ``kind`` is ``"turn"``, ``"rollback"``, ``"fork"``, ``"compaction"`` or
    ``"delete"`` (a conversation deleted); ``added`` and ``removed`` count the
    messages the version added to and removed from the active histories.
    ``conversation`` is the conversation the version changed, or None for a
    rollback or a fork, which take every conversation along.

    .. versionchanged:: 0.2.0
       ``conversation``, and the kind ``"delete"``.
    """

    agent_id: str
    version: int
    kind: Literal["turn", "rollback", "fork", "compaction", "delete"]
    template: str | None
    added: int
    removed: int
    state_changed: bool
    detail: dict[str, Any] | None
    committed_at: datetime
    conversation: str | None = None

    @property
    def code_version(self) -> str | None:
        """The code version the turn was committed with (``PersistenceHandler(code_version=...)``).

        .. versionadded:: 0.2.0
        """
        found = (self.detail or {}).get("code_version")
        return found if isinstance(found, str) else None


@dataclass(frozen=True, slots=True)
class ConversationInfo:
    """One conversation of an agent, as of a version.

    ``messages`` counts its active messages; ``created_in`` is the version its
    first commit made (or the rollback that brought it back); ``last_version`` the
    latest version whose turn, compaction or deletion changed it.

    .. versionadded:: 0.2.0
    """

    agent_id: str
    conversation: str
    messages: int
    created_in: int
    last_version: int | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Handoff:
    """A turn that started and did not commit: in flight, crashed, or failed.

    ``status`` is ``"running"`` while the turn runs and stays so if its process
    died; ``"failed"`` with ``error`` if it raised. ``interrupted`` is the earlier
    handoff this turn was told about, if any. Each conversation of an agent has
    its own handoff. ``trace`` is the W3C ``traceparent`` of the turn's span when
    it ran with tracing on, so that the turn after it can link to it.

    .. versionchanged:: 0.2.0
       ``conversation``, ``trace``.
    """

    agent_id: str
    base_version: int
    template: str
    arguments: Any
    status: Literal["running", "failed"]
    error: str | None
    interrupted: dict[str, Any] | None
    host: str
    pid: int
    started_at: datetime
    ended_at: datetime | None
    conversation: str = "default"
    trace: str | None = None


@dataclass(frozen=True, slots=True)
class Compaction:
    """A compaction to commit: its history change and the range the summary replaces."""

    change: HistoryChange
    summary_id: str
    first_position: float
    last_position: float
    messages: int
    summarizer: str


@dataclass(frozen=True, slots=True)
class TurnStart:
    """A started turn: the agent's committed version, the earlier unfinished turn, if
    any, and the journal step number when the turn is a workflow step.

    ``suspension`` is the conversation's suspended turn, if one waits. With one,
    the turn started (``started``, its handoff written) only if it is that turn,
    resumed: the same template and arguments (and step), every approval decided.
    Otherwise, and for a resume-only start that found nothing to resume, nothing
    was written.
    """

    version: int
    earlier: Handoff | None
    step_number: int | None
    suspension: Suspension | None = None
    started: bool = True


@dataclass(slots=True)
class CommitStats:
    """What a commit wrote, filled in by ``commit_turn`` when asked (for traces).

    ``rows`` counts the rows of the turn's history change and version (messages
    added and archived, the version row, the agent's row, the cleared handoff);
    ``bytes`` the UTF-8 JSON of the messages, fields, detail and step result.
    The parts a turn staged (memory, SQL, alarms) are counted in ``parts``.
    """

    rows: int = 0
    bytes: int = 0
    parts: int = 0


@dataclass(frozen=True, slots=True)
class LoadedAgent:
    """What a handler needs to restore an agent: version, one conversation's active
    history, state, whether that conversation exists at that version, and its
    values of the fields declared per conversation (None if it has none)."""

    version: int
    history: ActiveHistory
    state: str | None
    conversation_found: bool = False
    conversation_state: str | None = None


@dataclass(frozen=True, slots=True)
class StepInfo:
    """One step of a workflow's journal.

    ``key`` identifies the step across runs (``"coder-1#2"``: the third call on
    agent coder-1; nested calls extend their parent's key). ``number`` orders
    steps by first start. ``result`` is the template's return value as JSON, set
    once the step is ``"done"``; ``version`` is the agent version it committed;
    ``conversation`` the agent's conversation it ran in (None for a free template).

    .. versionchanged:: 0.2.0
       ``conversation``.
    """

    workflow: str
    number: int
    key: str
    agent_id: str | None
    template: str
    arguments: Any
    status: Literal["running", "done", "failed"]
    result: Any
    base_version: int | None
    version: int | None
    started_at: datetime
    finished_at: datetime | None
    conversation: str | None = None


@dataclass(frozen=True, slots=True)
class WorkflowInfo:
    """A workflow's journal at a glance: step counts by status, first and last activity."""

    workflow: str
    steps: int
    done: int
    running: int
    failed: int
    started_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class ForkedAgent(AgentRecord):
    """The agent :meth:`~effectful_durable.Store.fork` made, and what it is a copy of.

    .. versionadded:: 0.2.0
    """

    source_id: str
    source_version: int


@dataclass(frozen=True, slots=True)
class WorkflowReset:
    """What :meth:`~effectful_durable.Store.reset_workflow` did (or, as a dry run, would do).

    ``rolled_back`` are the agents returned to their version before the first
    forgotten step; ``deleted`` those the forgotten steps had created. ``steps``
    counts the journal entries forgotten.

    .. versionadded:: 0.2.0
    """

    workflow: str
    from_step: int
    steps: int
    rolled_back: tuple[str, ...]
    deleted: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PruneResult:
    """What :meth:`~effectful_durable.Store.prune` deleted.

    ``agents`` are the agents it pruned (those with something to prune); ``skipped``
    those it left alone because a turn of theirs was running; ``workflows`` the
    journals it deleted. ``versions``, ``messages`` and ``handoffs`` (of turns that
    failed or crashed) count the rows deleted.

    .. versionadded:: 0.2.0
    """

    agents: tuple[str, ...]
    versions: int
    messages: int
    workflows: tuple[str, ...]
    skipped: tuple[str, ...]
    handoffs: int = 0


type ApprovalStatus = Literal["pending", "approved", "denied", "cancelled"]


@dataclass(frozen=True, slots=True)
class ApprovalInfo:
    """One tool call that needs (or needed) a person's decision.

    ``arguments`` are what the model asked for; ``decided_arguments`` what an
    approval lets the tool run with (the same, or edited). ``note`` is the reason
    of a denial, or a note with an approval. ``ended_in`` is the version whose
    turn used the decision (None while the suspended turn has not resumed).

    .. versionadded:: 0.2.0
    """

    approval_id: str
    agent_id: str
    conversation: str
    tool: str
    arguments: dict[str, Any]
    status: ApprovalStatus
    reason: str | None
    asked_at: datetime
    asked_by: str
    decided_at: datetime | None
    decided_by: str | None
    note: str | None
    decided_arguments: dict[str, Any] | None
    suspended_in: int
    ended_in: int | None
    template: str
    workflow: str | None
    step_key: str | None
    tool_call_id: str


class Paged:
    """What a page of a list knows: how many match in all, and how many pages they fill."""

    __slots__ = ()
    total: int
    per_page: int

    @property
    def pages(self) -> int:
        """How many pages the matching items fill (at least 1)."""
        return max(1, -(-self.total // self.per_page))


@dataclass(frozen=True, slots=True)
class DecisionPage(Paged):
    """One page of the approvals decided (or cancelled), newest first: the audit trail.

    .. versionadded:: 0.2.0
    """

    approvals: list[ApprovalInfo]
    total: int
    page: int
    per_page: int


@dataclass(frozen=True, slots=True)
class Suspension:
    """A suspended turn of one conversation: what it ran, and the approvals it waits for."""

    agent_id: str
    conversation: str
    suspended_in: int
    template: str
    arguments: Any
    workflow: str | None
    step_key: str | None
    approvals: tuple[ApprovalInfo, ...]

    @property
    def pending(self) -> list[ApprovalInfo]:
        """The approvals not decided yet."""
        return [a for a in self.approvals if a.status == "pending"]

    @property
    def decided(self) -> bool:
        """Whether every approval is decided, so that the turn can resume."""
        return not self.pending


@dataclass(frozen=True, slots=True)
class ErasureReceipt:
    """What :meth:`~effectful_durable.Store.erase` erased, and when, without any of it.

    ``selector`` says what was asked: ``{"subject": <its digest>}``, or ``{"agent":
    id}`` with ``"conversation"``. ``agents`` were erased whole; ``conversations``
    (agent, conversation) alone. ``counts`` are the rows erased, by kind
    (messages, versions, memory entries, ...), ``versions`` the versions the
    erased agents had, ``tables`` the tables they were in, ``files`` the SQL
    workspace files removed on this machine. ``scrubbed_at`` is when the bytes
    left the live files (None while pending: the next erasure scrubs first).
    ``digest`` is the SHA-256 of the receipt's body and ``previous`` the digest
    of the receipt before it, so that a later audit can check the chain;
    ``verified`` says whether this one's body still matches its digest.

    .. versionadded:: 0.2.0
    """

    erasure_id: str
    erased_at: datetime
    selector: dict[str, str]
    agents: tuple[str, ...]
    conversations: tuple[tuple[str, str], ...]
    versions: int
    counts: dict[str, int]
    tables: tuple[str, ...]
    previous: str | None
    files: int
    scrubbed_at: datetime | None
    digest: str
    verified: bool
