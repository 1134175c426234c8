"""What the parts of an agent's durable record share, besides its messages and fields.

Conversations, their fields, memory and alarms each live in their own module of
``parts/``; the SQL workspace's part is ``workspace/part.py``. A turn hands the
store TurnWrite objects (``engine/seam.py``) for what it staged; the store
applies them in the turn's one transaction, after the version row is written.
Each part also says how it follows a rollback, a fork, a prune and a delete
(:class:`VersionedPart`), so that every version of an agent reads back whole;
the Store lists the parts it carries (``store.py``'s ``PARTS``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ..engine.seam import Conn
from ..sealing import Sealer


class VersionedPart(Protocol):
    """A part of the agent's record that every version carries."""

    def rollback(self, conn: Conn, agent_id: str, to_version: int, new_version: int) -> None:
        """Make ``new_version`` hold what ``to_version`` held."""

    def fork(
        self, conn: Conn, agent_id: str, version: int, new_agent_id: str, sealer: Sealer
    ) -> None:
        """Give ``new_agent_id`` (at version 1) what ``agent_id`` held at ``version``,
        its sealed content opened and sealed again for the new agent by ``sealer``."""

    def prune(self, conn: Conn, agent_id: str, keep_from: int) -> None:
        """Delete what only versions before ``keep_from`` need.

        Every version from ``keep_from`` on must still read back, and roll back,
        exactly as before.
        """

    def delete(self, conn: Conn, agent_id: str) -> None:
        """Delete everything of ``agent_id`` that the agents row's cascade does not."""


class VersionedRows:
    """A table of rows each active from ``added_in`` until ``removed_in``, as a VersionedPart.

    Version *v* holds the rows with ``added_in <= v`` and ``removed_in`` NULL or
    greater than *v*. ``columns`` are the table's columns besides ``agent_id``,
    ``added_in`` and ``removed_in``; a rollback or fork copies them. ``sealed`` is
    the column that holds sealed content, if one does, and ``place`` what a row's
    value is sealed for (its kind, agent, conversation and place), from its agent
    and its columns.
    """

    def __init__(
        self,
        table: str,
        columns: tuple[str, ...],
        sealed: str | None = None,
        place: Callable[[str, dict[str, Any]], tuple[str, str, str, str]] | None = None,
    ) -> None:
        self._table, self._columns = table, columns
        self._sealed, self._place = sealed, place
        names = ", ".join(columns)
        self._end_later = f"""
            UPDATE {table} SET removed_in = ?3
             WHERE agent_id = ?1 AND removed_in IS NULL AND added_in > ?2"""
        self._restore = f"""
            INSERT INTO {table} (agent_id, {names}, added_in)
            SELECT agent_id, {names}, ?3 FROM checked_{table}
             WHERE agent_id = ?1 AND added_in <= ?2 AND removed_in > ?2"""
        held = """
             WHERE agent_id = ?1 AND added_in <= ?2
               AND (removed_in IS NULL OR removed_in > ?2)"""
        self._copy = f"""
            INSERT INTO {table} (agent_id, {names}, added_in)
            SELECT ?3, {names}, 1 FROM checked_{table} {held}"""
        self._held = f"SELECT {names} FROM checked_{table} {held}"
        marks = ", ".join("?" * (len(columns) + 1))
        self._insert = f"INSERT INTO {table} (agent_id, {names}, added_in) VALUES ({marks}, 1)"
        self._prune = f"DELETE FROM {table} WHERE agent_id = ? AND removed_in <= ?"
        self._delete = f"DELETE FROM {table} WHERE agent_id = ?"

    def rollback(self, conn: Conn, agent_id: str, to_version: int, new_version: int) -> None:
        """End the rows added after ``to_version``; restore those it held that ended since."""
        conn.execute(self._end_later, (agent_id, to_version, new_version))
        conn.execute(self._restore, (agent_id, to_version, new_version))

    def fork(
        self, conn: Conn, agent_id: str, version: int, new_agent_id: str, sealer: Sealer
    ) -> None:
        """Copy the rows ``version`` holds to ``new_agent_id``, at its version 1."""
        if not sealer.enabled or self._sealed is None or self._place is None:
            conn.execute(self._copy, (agent_id, version, new_agent_id))
            return
        for row in conn.execute(self._held, (agent_id, version)).fetchall():
            values = dict(zip(self._columns, row, strict=True))
            old = self._place(agent_id, values)
            plain = sealer.open(values[self._sealed], *old, table=self._table)
            values[self._sealed] = sealer.seal(plain, *self._place(new_agent_id, values))
            conn.execute(self._insert, (new_agent_id, *values.values()))

    def prune(self, conn: Conn, agent_id: str, keep_from: int) -> None:
        """Delete the rows no version from ``keep_from`` on holds."""
        conn.execute(self._prune, (agent_id, keep_from))

    def delete(self, conn: Conn, agent_id: str) -> None:
        """Delete every row of ``agent_id``."""
        conn.execute(self._delete, (agent_id,))
