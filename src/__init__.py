"""Durable, crash-safe state for effectful LLM agents, on SQLite."""

from .agents import PersistentAgent, RecallTools, SQLTools, ephemeral
from .errors import (
    AgentInUseError,
    DatabaseBusyError,
    DurableError,
    InvalidAgentIdError,
    NotFoundError,
    NotOurDatabaseError,
    SchemaTooNewError,
    SQLWorkspaceError,
    StateSerializationError,
    WorkflowDivergedError,
)
from .handlers import CompactionHandler, PersistenceHandler, summarize_context
from .store import (
    AgentRecord,
    ForkedAgent,
    Handoff,
    PruneResult,
    StepInfo,
    Store,
    VersionInfo,
    WorkflowInfo,
    WorkflowReset,
)
from .store.sandbox import SQLLimits
from .store.workspace import SQLResult

__all__ = [
    "AgentInUseError",
    "AgentRecord",
    "CompactionHandler",
    "DatabaseBusyError",
    "DurableError",
    "ForkedAgent",
    "Handoff",
    "InvalidAgentIdError",
    "NotFoundError",
    "NotOurDatabaseError",
    "PersistenceHandler",
    "PersistentAgent",
    "PruneResult",
    "RecallTools",
    "SQLLimits",
    "SQLResult",
    "SQLTools",
    "SQLWorkspaceError",
    "SchemaTooNewError",
    "StateSerializationError",
    "StepInfo",
    "Store",
    "VersionInfo",
    "WorkflowDivergedError",
    "WorkflowInfo",
    "WorkflowReset",
    "ephemeral",
    "summarize_context",
]
