"""Durable, crash-safe state for effectful LLM agents, on SQLite."""

from .agents import PersistentAgent, ephemeral
from .errors import (
    AgentInUseError,
    DatabaseBusyError,
    DurableError,
    InvalidAgentIdError,
    NotFoundError,
    NotOurDatabaseError,
    SchemaTooNewError,
    StateSerializationError,
    WorkflowDivergedError,
)
from .handlers import PersistenceHandler
from .store import AgentRecord, Handoff, Store, VersionInfo

__all__ = [
    "AgentInUseError",
    "AgentRecord",
    "DatabaseBusyError",
    "DurableError",
    "Handoff",
    "InvalidAgentIdError",
    "NotFoundError",
    "NotOurDatabaseError",
    "PersistenceHandler",
    "PersistentAgent",
    "SchemaTooNewError",
    "StateSerializationError",
    "Store",
    "VersionInfo",
    "WorkflowDivergedError",
    "ephemeral",
]
