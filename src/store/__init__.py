"""The durable log on SQLite. Knows nothing about effectful."""

from .connection import Durability, connect
from .memory import MemoryNote
from .records import (
    AgentRecord,
    Compaction,
    Handoff,
    LoadedAgent,
    StepInfo,
    TurnStart,
    VersionInfo,
    WorkflowInfo,
)
from .store import Store

__all__ = [
    "AgentRecord",
    "Compaction",
    "Durability",
    "Handoff",
    "LoadedAgent",
    "MemoryNote",
    "StepInfo",
    "Store",
    "TurnStart",
    "VersionInfo",
    "WorkflowInfo",
    "connect",
]
