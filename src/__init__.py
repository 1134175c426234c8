"""Durable, crash-safe state for effectful LLM agents, on SQLite."""

from .agents import (
    AgentMemory,
    MemoryDigest,
    MemoryLimits,
    PersistentAgent,
    RecallTools,
    StateTools,
    ephemeral,
)
from .errors import (
    AgentInUseError,
    DatabaseBusyError,
    DurableError,
    InvalidAgentIdError,
    MemoryWriteError,
    NotFoundError,
    NotOurDatabaseError,
    SchemaTooNewError,
    StateSerializationError,
    WorkflowDivergedError,
)
from .handlers import CompactionHandler, PersistenceHandler, summarize_context
from .store import (
    AgentRecord,
    Handoff,
    MemoryNote,
    StepInfo,
    Store,
    VersionInfo,
    WorkflowInfo,
)

__all__ = [
    "AgentInUseError",
    "AgentMemory",
    "AgentRecord",
    "CompactionHandler",
    "DatabaseBusyError",
    "DurableError",
    "Handoff",
    "InvalidAgentIdError",
    "MemoryDigest",
    "MemoryLimits",
    "MemoryNote",
    "MemoryWriteError",
    "NotFoundError",
    "NotOurDatabaseError",
    "PersistenceHandler",
    "PersistentAgent",
    "RecallTools",
    "SchemaTooNewError",
    "StateTools",
    "StateSerializationError",
    "StepInfo",
    "Store",
    "VersionInfo",
    "WorkflowDivergedError",
    "WorkflowInfo",
    "ephemeral",
    "summarize_context",
]
