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
