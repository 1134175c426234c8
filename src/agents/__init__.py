"""Agent classes and the helpers they use.

PersistentAgent and the tool mixins (RecallTools, StateTools, SQLTools,
AlarmTools, OnEvent), tool approvals and events, with the operations those
tools perform, which the handlers answer.
Modules here import ``store`` (its values and checks) and ``errors``, never the
handlers or the runner above.
"""

from .alarms import AlarmTools
from .approvals import current_approval, requires_approval
from .events import OnEvent, wait_for_event
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
    "OnEvent",
    "PersistentAgent",
    "RecallTools",
    "SQLTools",
    "StateTools",
    "current_approval",
    "ephemeral",
    "per_conversation",
    "requires_approval",
    "wait_for_event",
]
