"""effectful handlers: persistence with its workflow journal, and compaction.

``persistence.py`` is PersistenceHandler, built from one mixin per concern
(``conversations.py``, ``memory.py``, ``workspace.py``, ``alarms.py``) that all
share a running turn's state through ``turn.py``; ``compaction.py`` is
CompactionHandler. Handlers import ``agents`` and ``store`` below them, never
``runner`` or the command above, and never write SQL.
"""

from .compaction import CompactionHandler, summarize_context
from .persistence import PersistenceHandler

__all__ = ["CompactionHandler", "PersistenceHandler", "summarize_context"]
