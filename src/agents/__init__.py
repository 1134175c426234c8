"""Agent classes and the helpers they use."""

from .persistent import PersistentAgent
from .state import ephemeral

__all__ = ["PersistentAgent", "ephemeral"]
