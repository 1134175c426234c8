"""effectful handlers: persistence with its workflow journal, and compaction."""

from .compaction import CompactionHandler, summarize_context
from .persistence import PersistenceHandler

__all__ = ["CompactionHandler", "PersistenceHandler", "summarize_context"]
