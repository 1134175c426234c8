"""Durable, crash-safe state for effectful LLM agents, on SQLite."""

from .agents import AlarmTools, PersistentAgent, RecallTools, ephemeral
from .errors import (
    AgentInUseError,
    AlarmLeaseLostError,
    DatabaseBusyError,
    DurableError,
    InvalidAgentIdError,
    InvalidAlarmError,
    NotFoundError,
    NotOurDatabaseError,
    SchemaTooNewError,
    StateSerializationError,
    WorkflowDivergedError,
)
from .handlers import CompactionHandler, PersistenceHandler, summarize_context
from .runner import AgentRunner, ConfigError, RunnerConfig
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
from .store.alarms import AlarmInfo

__all__ = [
    "AgentInUseError",
    "AgentRecord",
    "AgentRunner",
    "AlarmInfo",
    "AlarmLeaseLostError",
    "AlarmTools",
    "CompactionHandler",
    "ConfigError",
    "DatabaseBusyError",
    "DurableError",
    "ForkedAgent",
    "Handoff",
    "InvalidAgentIdError",
    "InvalidAlarmError",
    "NotFoundError",
    "NotOurDatabaseError",
    "PersistenceHandler",
    "PersistentAgent",
    "PruneResult",
    "RecallTools",
    "RunnerConfig",
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
