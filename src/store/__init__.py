"""The durable log on SQLite. Knows nothing about effectful."""

from .connection import Durability, connect
from .records import (
    AgentRecord,
    Compaction,
    ConversationInfo,
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
    "ConversationInfo",
    "Durability",
    "Handoff",
    "LoadedAgent",
    "StepInfo",
    "Store",
    "TurnStart",
    "VersionInfo",
    "WorkflowInfo",
    "connect",
]
