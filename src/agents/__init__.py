"""Agent classes and the helpers they use."""

from .alarms import AlarmTools
from .persistent import PersistentAgent
from .state import ephemeral
from .tools import RecallTools

__all__ = ["AlarmTools", "PersistentAgent", "RecallTools", "ephemeral"]
