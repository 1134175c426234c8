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
from .store import AgentRecord, Handoff, StepInfo, Store, VersionInfo, WorkflowInfo
from .store.sandbox import SQLLimits
from .store.workspace import SQLResult

__all__ = [
    "AgentInUseError",
    "AgentRecord",
    "CompactionHandler",
    "DatabaseBusyError",
    "DurableError",
    "Handoff",
    "InvalidAgentIdError",
    "NotFoundError",
    "NotOurDatabaseError",
    "PersistenceHandler",
    "PersistentAgent",
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
    "ephemeral",
    "summarize_context",
]
