"""Durable, crash-safe state for effectful LLM agents, on SQLite."""

from .agents import PersistentAgent, RecallTools, ephemeral
from .errors import (
    AgentInUseError,
    DatabaseBusyError,
    DurableError,
    InvalidAgentIdError,
    InvalidConversationIdError,
    NotFoundError,
    NotOurDatabaseError,
    SchemaTooNewError,
    StateSerializationError,
    WorkflowDivergedError,
)
from .handlers import CompactionHandler, PersistenceHandler, summarize_context
from .store import (
    AgentRecord,
    ConversationInfo,
    Handoff,
    StepInfo,
    Store,
    VersionInfo,
    WorkflowInfo,
)

__all__ = [
    "AgentInUseError",
    "AgentRecord",
    "CompactionHandler",
    "ConversationInfo",
    "DatabaseBusyError",
    "DurableError",
    "Handoff",
    "InvalidAgentIdError",
    "InvalidConversationIdError",
    "NotFoundError",
    "NotOurDatabaseError",
    "PersistenceHandler",
    "PersistentAgent",
    "RecallTools",
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
