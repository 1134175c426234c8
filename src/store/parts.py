"""The parts of an agent's durable record besides its messages and fields.

Memory, the SQL workspace and alarms each live in their own module under
``store/``. A turn hands the store :class:`TurnWrite` objects for what it staged;
the store applies them in the turn's one transaction, after the version row is
written. Each part also says how it follows a rollback, a fork, a prune and a
delete, so that every version of an agent reads back whole.
"""

from __future__ import annotations

from typing import Protocol

import apsw


class TurnWrite(Protocol):
    """Something a turn writes besides messages and fields, in the turn's transaction."""

    def write(self, conn: apsw.Connection, agent_id: str, version: int) -> None:
        """Apply the write as part of ``version`` of ``agent_id``; raise to abort the turn."""


class VersionedPart(Protocol):
    """A part of the agent's record that every version carries."""

    def rollback(
        self, conn: apsw.Connection, agent_id: str, to_version: int, new_version: int
    ) -> None:
        """Make ``new_version`` hold what ``to_version`` held."""

    def fork(self, conn: apsw.Connection, agent_id: str, version: int, new_agent_id: str) -> None:
        """Give ``new_agent_id`` (at version 1) what ``agent_id`` held at ``version``."""

    def prune(self, conn: apsw.Connection, agent_id: str, keep_from: int) -> None:
        """Delete what only versions before ``keep_from`` need.

        Every version from ``keep_from`` on must still read back, and roll back,
        exactly as before.
        """

    def delete(self, conn: apsw.Connection, agent_id: str) -> None:
        """Delete everything of ``agent_id`` that the agents row's cascade does not."""
