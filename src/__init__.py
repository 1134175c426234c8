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
    ForkedAgent,
    Handoff,
    PruneResult,
    StepInfo,
    Store,
    VersionInfo,
    WorkflowInfo,
    WorkflowReset,
)

__all__ = [
    "AgentInUseError",
    "AgentRecord",
    "CompactionHandler",
    "ConversationInfo",
    "DatabaseBusyError",
    "DurableError",
    "ForkedAgent",
    "Handoff",
    "InvalidAgentIdError",
    "InvalidConversationIdError",
    "NotFoundError",
    "NotOurDatabaseError",
    "PersistenceHandler",
    "PersistentAgent",
    "PruneResult",
    "RecallTools",
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
