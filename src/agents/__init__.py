"""Agent classes and the helpers they use.

PersistentAgent and the tool mixins (RecallTools, StateTools, SQLTools,
AlarmTools), with the operations those tools perform, which the handlers answer.
Modules here import ``store`` (its values and checks) and ``errors``, never the
handlers or the runner above.
"""

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
