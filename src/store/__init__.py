"""The durable log on SQLite. Knows nothing about effectful."""

from .engine.sqlite.connection import Durability, connect
from .parts.memory import MemoryNote
from .records import (
    AgentRecord,
    Compaction,
    ConversationInfo,
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
    "ConversationInfo",
    "Durability",
    "ForkedAgent",
    "Handoff",
    "LoadedAgent",
    "PruneResult",
    "MemoryNote",
    "StepInfo",
    "Store",
    "TurnStart",
    "VersionInfo",
    "WorkflowInfo",
    "WorkflowReset",
    "connect",
]
