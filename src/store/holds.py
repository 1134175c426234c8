"""Holding an agent, and writing under the hold: what every change to one agent goes through.

The engine holds an agent (``Database.agent_lock``: a lock on ``<db>-lock`` for
SQLite, a lease row renewed in the server's clock on PostgreSQL) and fences a
write transaction with the hold (``Database.fence``: it lands only while the
hold does). The turn protocol (``turns.py``), the maintenance that changes one
agent (rollback, fork, delete, prune) and a re-targeted approval write this way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import cast

from .engine.seam import Conn, Database
from .ids import validate_agent_id


def hold(db: Database, agent_id: str, *, wait: float = 0.0) -> AbstractContextManager[None]:
    """Hold ``agent_id`` against every other thread and process for the block.

    Raises:
        InvalidAgentIdError: ``agent_id`` is not a valid agent id.
        AgentInUseError: It stayed held for longer than ``wait`` seconds.
    """
    # Checked here, as the lock is taken only when the block is entered, past the
    # translation of the lock's errors (a lone surrogate cannot name a lock file).
    # Without a first statement the block's value is None.
    return cast(
        AbstractContextManager[None], db.agent_lock(validate_agent_id(agent_id), wait=wait)
    )


@contextmanager
def fenced(db: Database, agent_id: str) -> Iterator[Conn]:
    """A write transaction under this Store's hold on ``agent_id``: it lands only
    while the hold does (``Database.fence``)."""
    with db.writing() as conn:
        db.fence(conn, agent_id)
        yield conn


@contextmanager
def holding(db: Database, agent_id: str) -> Iterator[Conn]:
    """Hold ``agent_id`` (at once, or AgentInUseError) and write under the hold."""
    with hold(db, agent_id), fenced(db, agent_id) as conn:
        yield conn
