"""The durable log: agents, their versions and turns, on SQLite or PostgreSQL; no effectful here.

Layers, each importing only itself and the layers below: the :class:`Store`
(``store.py``), the face users call, and its machinery, each module one concern:
the components it hands out (``turns.py``, the turn protocol; ``alarm_queue.py``,
the runners' side of alarms), the reads and changes its methods run
(``reads.py``, ``browse.py``, ``diff.py``, ``maintenance.py``, ``journal.py``,
``waiting.py``, ``retention.py``, ``copy.py``, ``inflight.py``) and what those
share (``opening.py``, ``holds.py``, ``checked.py``, ``versions.py``,
``handoffs.py``); then ``parts/`` and ``workspace/`` side by side (neither
imports the other); then the shared leaves ``records.py``, ``history.py``,
``rows.py`` and ``ids.py``; then ``engine/``, the seam and the two engines; then
``errors``. Nothing here imports effectful, litellm, or the packages above
(``agents``, ``handlers``, ``runner``); ``tests/test_imports.py`` checks it all.
"""

from .engine.sqlite.connection import Durability, connect
from .keys import Keys, LocalMasterKey, MasterKey
from .parts.memory import MemoryNote
from .records import (
    AgentRecord,
    CommitStats,
    Compaction,
    ConversationInfo,
    ErasureReceipt,
    ForkedAgent,
    Handoff,
    LoadedAgent,
    PruneResult,
    StepInfo,
    TurnStart,
    VersionInfo,
    WorkflowInfo,
    WorkflowReset,
)
from .store import Store

__all__ = [
    "AgentRecord",
    "CommitStats",
    "Compaction",
    "ConversationInfo",
    "ErasureReceipt",
    "Durability",
    "ForkedAgent",
    "Handoff",
    "Keys",
    "LoadedAgent",
    "LocalMasterKey",
    "MasterKey",
    "PruneResult",
    "MemoryNote",
    "StepInfo",
    "Store",
    "TurnStart",
    "VersionInfo",
    "WorkflowInfo",
    "WorkflowReset",
    "connect",
]
