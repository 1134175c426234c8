"""Rows coming out of the store, as frozen dataclasses."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from .history import ActiveHistory


@dataclass(frozen=True, slots=True)
class AgentRecord:
    """One durable agent: its id, last committed version and active message count."""

    agent_id: str
    version: int
    messages: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class VersionInfo:
    """One committed version of an agent.

    ``kind`` is ``"turn"``, ``"rollback"`` or ``"fork"``; ``added`` and ``removed``
    count the messages the version added to and removed from the active history.
    """

    agent_id: str
    version: int
    kind: Literal["turn", "rollback", "fork"]
    template: str | None
    added: int
    removed: int
    state_changed: bool
    detail: dict[str, Any] | None
    committed_at: datetime


@dataclass(frozen=True, slots=True)
class Handoff:
    """A turn that started and did not commit: in flight, crashed, or failed.

    ``status`` is ``"running"`` while the turn runs and stays so if its process
    died; ``"failed"`` with ``error`` if it raised. ``interrupted`` is the earlier
    handoff this turn was told about, if any.
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


@dataclass(frozen=True, slots=True)
class LoadedAgent:
    """What a handler needs to restore an agent: version, active history, state."""

    version: int
    history: ActiveHistory
    state: str | None
