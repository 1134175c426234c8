"""effectful handlers: persistence (and, later, compaction and the workflow journal)."""

from .persistence import PersistenceHandler

__all__ = ["PersistenceHandler"]
