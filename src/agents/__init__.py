"""Agent classes and the helpers they use."""

from .persistent import PersistentAgent
from .state import ephemeral
from .tools import RecallTools

__all__ = ["PersistentAgent", "RecallTools", "ephemeral"]
