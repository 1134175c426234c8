"""The durable log on SQLite. Knows nothing about effectful."""

from .connection import Durability, connect
from .records import (
    AgentRecord,
    Compaction,
    ForkedAgent,
    Handoff,
    LoadedAgent,
    PruneResult,
    StepInfo,
    TurnStart,
    VersionInfo,
    WorkflowInfo,
    WorkflowReset,
)
from .store import Store

__all__ = [
    "AgentRecord",
    "Compaction",
    "Durability",
    "ForkedAgent",
    "Handoff",
    "LoadedAgent",
    "PruneResult",
    "StepInfo",
    "Store",
    "TurnStart",
    "VersionInfo",
    "WorkflowInfo",
    "WorkflowReset",
    "connect",
]
