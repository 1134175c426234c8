"""How the SQL workspace follows a rollback, a fork, a prune and a delete of its agent.

The log (``log.py``) is the agent's tables, version by version; these operations
write new versions into it, in the main transaction of the Store's maintenance,
as every other part does (``store/parts/versioned.py``'s ``VersionedPart``).
A fork or a delete also removes the agent's file on this machine from the cache
(``cache.py``), which the next use rebuilds from the log.
"""

from __future__ import annotations

import apsw

from ..engine.seam import Conn
from ..sealing import Sealer
from .cache import WorkspaceCache
from .log import combine, log, replayed, snapshot, write_log


class WorkspacePart:
    """How the SQL workspace follows a rollback, a fork, a prune and a delete.

    Args:
        cache: The database's workspace files on this machine: a fork or a delete
            removes the file its agent id had here.
    """

    def __init__(self, cache: WorkspaceCache) -> None:
        self.cache = cache

    def rollback(self, conn: Conn, agent_id: str, to_version: int, new_version: int) -> None:
        """Write, as ``new_version``, what undoes every change after ``to_version``."""
        later = log(conn, agent_id, to_version, new_version - 1, self.cache.sealer)
        if not later:
            return
        if all(ddl is None for ddl, _ in later):
            inverse = apsw.Changeset.invert(combine(cs for _, cs in later if cs))
            if inverse:
                write_log(conn, agent_id, new_version, [(None, inverse)], self.cache.sealer)
            return
        mem = replayed(
            log(conn, agent_id, 0, to_version, self.cache.sealer)
        )  # DDL after v: rebuild v's tables
        write_log(conn, agent_id, new_version, snapshot(mem), self.cache.sealer)
        mem.close()

    def fork(
        self, conn: Conn, agent_id: str, version: int, new_agent_id: str, sealer: Sealer
    ) -> None:
        """Give ``new_agent_id`` (version 1) the tables ``agent_id`` had at ``version``."""
        steps = log(conn, agent_id, 0, version, self.cache.sealer)
        if not steps:
            return
        mem = replayed(steps)
        write_log(conn, new_agent_id, 1, snapshot(mem), self.cache.sealer)
        mem.close()
        self.cache.remove(new_agent_id)

    def prune(self, conn: Conn, agent_id: str, keep_from: int) -> None:
        """Fold the steps of versions before ``keep_from`` into one snapshot.

        A snapshot costs what the tables hold, so it is made only once the steps
        it would replace outweigh the oldest version's (the last snapshot): the
        cost per pruned byte stays flat, as for pruning as you go.
        """
        base = keep_from - 1
        sizes = conn.execute(
            """
            SELECT version, sum(coalesce(length(changeset), 0) + coalesce(length(ddl), 0))
              FROM workspace_log WHERE agent_id = ? AND version <= ?
             GROUP BY version ORDER BY version
            """,
            (agent_id, base),
        ).fetchall()
        weights = [int(size or 0) for _, size in sizes]
        if len(weights) <= 1 or sum(weights[1:]) < weights[0]:
            return
        mem = replayed(log(conn, agent_id, 0, base, self.cache.sealer))
        conn.execute(
            "DELETE FROM workspace_log WHERE agent_id = ? AND version <= ?", (agent_id, base)
        )
        write_log(conn, agent_id, base, snapshot(mem), self.cache.sealer)
        mem.close()

    def delete(self, conn: Conn, agent_id: str) -> None:
        """Remove the agent's workspace file here (its log goes with the agents row).

        Removing the file first is safe: if the main transaction then fails, the
        next use rebuilds the file from the log.
        """
        self.cache.remove(agent_id)
