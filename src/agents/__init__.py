"""Agent classes and the helpers they use."""

from .alarms import AlarmTools
from .memory import AgentMemory, MemoryDigest, MemoryLimits, StateTools
from .persistent import PersistentAgent
from .sql_tools import SQLTools
from .state import ephemeral, per_conversation
from .tools import RecallTools

__all__ = [
    "AgentMemory",
    "AlarmTools",
    "MemoryDigest",
    "MemoryLimits",
    "PersistentAgent",
    "RecallTools",
    "SQLTools",
    "StateTools",
    "ephemeral",
    "per_conversation",
]
