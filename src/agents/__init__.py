"""Agent classes and the helpers they use."""

from .persistent import PersistentAgent
from .sql_tools import SQLTools
from .state import ephemeral
from .tools import RecallTools

__all__ = ["PersistentAgent", "RecallTools", "SQLTools", "ephemeral"]
