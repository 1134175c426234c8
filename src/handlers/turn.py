"""The state of a running turn, shared by PersistenceHandler and the mixins it is built from.

``persistence.py`` makes a :class:`Turn` when a turn starts and commits or
fails it; the mixins (``alarms.py``, ``memory.py``, ``workspace.py``) stage
their parts' writes on it. Both import this module, so the mixins never import
``persistence.py`` back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..agents.persistent import PersistentAgent
from ..store import Handoff
from ..store.engine.seam import TurnWrite
from ..store.history import ActiveHistory
from ..store.ids import DEFAULT_CONVERSATION
from ..store.parts.approvals import Asked
from ..store.records import ApprovalInfo, Suspension
from .effects import Compacted
from .journal import Step


@dataclass
class Committed:
    """An agent's last committed version, as held in memory beside the agent."""

    database: str
    version: int
    history: ActiveHistory  # of the conversation below
    state: str | None
    conversation: str = DEFAULT_CONVERSATION
    conversation_state: str | None = None  # its per-conversation fields


@dataclass
class Turn:
    """A running turn of one agent: what it started from, and what it staged so far."""

    agent: PersistentAgent
    template: str
    step: Step | None
    conversation: str = DEFAULT_CONVERSATION
    committed: Committed | None = None
    earlier: Handoff | None = None
    # What a failed turn puts back when its conversation holds nothing committed.
    uncommitted_history: list[Any] | None = None
    uncommitted_state: str | None = None
    uncommitted_conversation_state: str | None = None
    compacted: Compacted | None = None
    step_number: int | None = None
    # What the turn staged besides messages and fields, by part ("memory", ...);
    # committed in the turn's transaction, dropped with the turn if it fails.
    staged: dict[str, TurnWrite] = field(default_factory=dict)
    # The turn's template arguments (as JSON values), for its approvals' rows.
    arguments: Any = None
    # Approvals: the suspended turn this one resumes, with what it replays, and
    # the tool calls it asks approval for (which suspend it).
    resuming: Replay | None = None
    asked: list[Asked] = field(default_factory=list)
    # The id of the turn's own user message: operations whose history holds it
    # belong to the turn's own model loop, not to a template it called.
    own_message: str | None = None
    # The turn's OpenTelemetry span, when its handler traces (handlers/tracing.py).
    span: Any = None


@dataclass
class Replay:
    """What a resumed turn replays of the turn it resumes, instead of asking the model."""

    suspension: Suspension
    user: dict[str, Any]
    assistants: list[dict[str, Any]]
    tool_results: dict[str, dict[str, Any]]  # by tool call id, replayed once
    decisions: dict[str, ApprovalInfo]  # by tool call id, used once
