"""The durable log on SQLite. Knows nothing about effectful."""

from .connection import Durability, connect
from .records import AgentRecord, Handoff, LoadedAgent, VersionInfo
from .store import Store

__all__ = [
    "AgentRecord",
    "Durability",
    "Handoff",
    "LoadedAgent",
    "Store",
    "VersionInfo",
    "connect",
]
