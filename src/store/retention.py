"""Retention: pruning old versions, giving space back, and copying a live database.

An agent's versions before its retention point ``kept_from`` are pruned: their
version rows go, and so does every message row that only they showed (a row is
shown by versions ``added_in`` to ``removed_in - 1``, so a row removed at or
before ``kept_from`` is shown by none of the kept ones). The newest state
snapshot among the pruned versions is carried in the ``retention`` row, because
kept versions whose state did not change inherit it. Compaction originals stay,
searchable, unless pruning is told to drop them. Each part of the record
(memory, SQL workspace, alarms and events, approvals) prunes its own rows
(``VersionedPart.prune``). Handoffs are not versioned: :meth:`Store.prune
<effectful_durable.Store.prune>` deletes those of turns that failed or crashed
(it holds the agent's lock: none of its turns runs) that its rules let go
(:func:`prune_handoffs`), including those of agents whose first turn never
committed.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta

import apsw

from ..errors import AgentInUseError, DatabaseBusyError, DurableError, NotFoundError
from .checked import checked_version
from .engine.seam import Conn, Database
from .engine.sqlite.translate import translated
from .holds import holding
from .parts.versioned import VersionedPart
from .records import PruneResult
from .rows import kept_from
from .sealing import Sealer


def prune_store(
    db: Database,
    agent_id: str | None,
    *,
    keep_versions: int | None,
    older_than: timedelta | datetime | None,
    drop_compacted: bool,
    parts: Sequence[VersionedPart],
) -> PruneResult:
    """Store.prune: each agent in its own transaction under its lock, then the journals."""
    if keep_versions is None and older_than is None:
        msg = "prune needs a rule: pass keep_versions=, older_than= or both"
        raise ValueError(msg)
    if keep_versions is not None and (
        isinstance(keep_versions, bool) or not isinstance(keep_versions, int) or keep_versions < 1
    ):
        msg = f"keep_versions must be an integer >= 1, not {keep_versions!r}"
        raise ValueError(msg)
    cutoff = cutoff_of(older_than, time.time()) if older_than is not None else None
    if agent_id is not None:
        ids = [agent_id]
    else:
        with db.reading() as conn:
            ids = [str(a) for (a,) in conn.execute(_AGENTS).fetchall()]
            if cutoff is not None:  # agents whose first turn never committed: a handoff only
                ids += [str(a) for (a,) in conn.execute(_NEVER_COMMITTED).fetchall()]
    pruned: list[str] = []
    skipped: list[str] = []
    versions = messages = handoffs = 0
    for one in ids:
        try:
            with holding(db, one) as conn:
                if db.agent_version(conn, one) is None and has_handoff(conn, one):
                    deleted = (0, 0, prune_handoffs(conn, one, before=None, cutoff=cutoff))
                else:
                    current = checked_version(db, conn, one, None)
                    point = retention_point(
                        conn, one, current, keep_versions=keep_versions, cutoff=cutoff
                    )
                    changed = prune_agent(
                        conn, one, point, parts=parts, drop_compacted=drop_compacted
                    )
                    before = current - keep_versions + 1 if keep_versions is not None else None
                    deleted = (*changed, prune_handoffs(conn, one, before=before, cutoff=cutoff))
        except AgentInUseError:
            if agent_id is not None:
                raise
            skipped.append(one)
            continue
        except NotFoundError:
            if agent_id is not None:
                raise
            continue  # deleted since the list was read
        if any(deleted):
            pruned.append(one)
        versions += deleted[0]
        messages += deleted[1]
        handoffs += deleted[2]
    with db.writing() as conn:
        workflows = finished_journals(conn, agent_id, cutoff)
        delete_journals(conn, workflows)
        db.prune_holds(conn)
    return PruneResult(
        tuple(pruned), versions, messages, tuple(workflows), tuple(skipped), handoffs
    )


_AGENTS = "SELECT agent_id FROM checked_agents ORDER BY agent_id"

# Agents with a handoff and no version: their first turn failed or crashed.
_NEVER_COMMITTED = """
    SELECT DISTINCT agent_id FROM handoffs AS h
     WHERE NOT EXISTS (SELECT 1 FROM agents AS a WHERE a.agent_id = h.agent_id)
     ORDER BY agent_id
"""


def has_handoff(conn: Conn, agent_id: str) -> bool:
    """Whether a turn of the agent started and did not commit (in any conversation)."""
    return (
        conn.execute("SELECT 1 FROM handoffs WHERE agent_id = ?", (agent_id,)).fetchone()
        is not None
    )


def prune_handoffs(conn: Conn, agent_id: str, *, before: int | None, cutoff: float | None) -> int:
    """Delete the agent's handoffs that each rule given lets go; how many.

    The caller holds the agent's lock, so no turn of it runs: every handoff is
    one of a turn that failed, or crashed. ``before``: its turn started from a
    version before this one (``keep_versions`` pruned it); ``cutoff``: it ended
    (failed) or, crashed, started before this time. With neither, none goes:
    the handoff of an agent's last failed turn is what its next turn is told.
    """
    if before is None and cutoff is None:
        return 0
    rules = ["agent_id = ?"]
    params: list[str | float] = [agent_id]
    if before is not None:
        rules.append("base_version < ?")
        params.append(before)
    if cutoff is not None:
        rules.append("coalesce(ended_at, started_at) < ?")
        params.append(cutoff)
    conn.execute(f"DELETE FROM handoffs WHERE {' AND '.join(rules)}", params)
    return conn.changes()


def retention_point(
    conn: Conn, agent_id: str, current: int, *, keep_versions: int | None, cutoff: float | None
) -> int:
    """The oldest version to keep: each rule given keeps what it names, and the latest."""
    points = []
    if keep_versions is not None:
        points.append(current - keep_versions + 1)
    if cutoff is not None:
        first_new = conn.execute(
            "SELECT min(version) FROM versions WHERE agent_id = ? AND committed_at >= ?",
            (agent_id, cutoff),
        ).get
        points.append(current if first_new is None else int(first_new))
    return max(1, min(current, *points)) if points else 1


def prune_agent(
    conn: Conn,
    agent_id: str,
    keep_from: int,
    *,
    parts: Sequence[VersionedPart],
    drop_compacted: bool = False,
) -> tuple[int, int]:
    """Delete what only the agent's versions before ``keep_from`` need, in ``conn``'s transaction.

    Returns:
        How many version rows and message rows were deleted.
    """
    before = kept_from(conn, agent_id)
    if keep_from <= before and not drop_compacted:
        return 0, 0
    keep_from = max(keep_from, before)
    versions = messages = 0
    if keep_from > before:
        conn.execute(
            """
            INSERT INTO retention (agent_id, kept_from, state, pruned_at)
            VALUES (?1, ?2, (SELECT state FROM checked_versions
                              WHERE agent_id = ?1 AND version < ?2 AND state IS NOT NULL
                              ORDER BY version DESC LIMIT 1), ?3)
            ON CONFLICT (agent_id) DO UPDATE
               SET kept_from = excluded.kept_from,
                   state = coalesce(excluded.state, retention.state),
                   pruned_at = excluded.pruned_at
            """,
            (agent_id, keep_from, time.time()),
        )
        conn.execute(
            "DELETE FROM versions WHERE agent_id = ? AND version < ?", (agent_id, keep_from)
        )
        versions = conn.changes()
    # Rows removed at or before the last prune are gone already, except the
    # compaction originals it kept: only drop_compacted looks at those again.
    low = 0 if drop_compacted else before
    conn.execute(
        """
        DELETE FROM messages
         WHERE agent_id = ?1 AND removed_in > ?2 AND removed_in <= ?3
           AND (?4 OR NOT EXISTS (
                SELECT 1 FROM compactions AS c
                 WHERE c.agent_id = messages.agent_id AND c.version = messages.removed_in
                   AND messages.position BETWEEN c.first_position AND c.last_position))
        """,
        (agent_id, low, keep_from, drop_compacted),
    )
    messages = conn.changes()
    if drop_compacted:
        conn.execute(
            "DELETE FROM compacted_text WHERE agent_id = ? AND version <= ?", (agent_id, keep_from)
        )
    for part in parts:
        part.prune(conn, agent_id, keep_from)
    return versions, messages


def finished_journals(conn: Conn, agent_id: str | None, cutoff: float | None) -> list[str]:
    """Workflows whose journals only pruned versions need.

    A journal qualifies when every step is done, every step run on an agent
    committed a version that is pruned (or whose agent is gone), and, with
    ``cutoff``, its last step finished before it. A journal of free templates
    only qualifies through ``cutoff``. With ``agent_id``, only journals with a
    step on that agent are considered.
    """
    rows = conn.execute(
        """
        WITH rule (agent_id, cutoff) AS (
            SELECT CAST(?1 AS text), CAST(?2 AS double precision))
        SELECT w.workflow FROM workflow_steps AS w
          CROSS JOIN rule
          LEFT JOIN agents AS a ON a.agent_id = w.agent_id
          LEFT JOIN retention AS r ON r.agent_id = w.agent_id
         GROUP BY w.workflow, rule.agent_id, rule.cutoff
        HAVING count(*) FILTER (WHERE w.status <> 'done') = 0
           AND count(*) FILTER (WHERE w.agent_id IS NOT NULL AND a.agent_id IS NOT NULL
                                  AND w.version >= coalesce(r.kept_from, 1)) = 0
           AND (rule.cutoff IS NULL
                OR max(coalesce(w.finished_at, w.started_at)) < rule.cutoff)
           AND (rule.cutoff IS NOT NULL OR count(w.agent_id) > 0)
           AND (rule.agent_id IS NULL OR count(*) FILTER (WHERE w.agent_id = rule.agent_id) > 0)
         ORDER BY w.workflow
        """,
        (agent_id, cutoff),
    )
    return [str(workflow) for (workflow,) in rows]


def delete_journals(conn: Conn, workflows: Iterable[str]) -> None:
    """Delete the whole journal of each workflow."""
    conn.executemany("DELETE FROM workflow_steps WHERE workflow = ?", [(w,) for w in workflows])


def cutoff_of(older_than: object, now: float) -> float:
    """``older_than`` (a timedelta, or an aware datetime) as Unix seconds."""
    if isinstance(older_than, timedelta):
        if older_than.total_seconds() < 0:
            msg = f"older_than must not be negative, not {older_than!r}"
            raise ValueError(msg)
        return now - older_than.total_seconds()
    if isinstance(older_than, datetime):
        if older_than.tzinfo is None:
            msg = (
                f"older_than={older_than!r} has no time zone; pass an aware datetime "
                "such as datetime.now(UTC) - timedelta(days=7), or a timedelta"
            )
            raise ValueError(msg)
        return older_than.timestamp()
    msg = f"older_than must be a datetime.timedelta or datetime.datetime, not {older_than!r}"
    raise TypeError(msg)


def checkpoint(conn: apsw.Connection) -> None:
    """Copy the WAL into the database file and truncate the WAL to zero bytes."""
    conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)


def vacuum(conn: apsw.Connection) -> None:
    """Rebuild the file without its free pages, then empty the WAL that rebuild filled."""
    conn.execute("VACUUM")
    checkpoint(conn)


def vacuum_file(conn: apsw.Connection, path: str, busy_timeout: float) -> int:
    """Store.vacuum: :func:`vacuum` the file ``path``; how many bytes it and its WAL shrank by.

    Raises:
        DatabaseBusyError: Another writer held the database too long.
    """
    before = _file_bytes(path)
    try:
        with translated(path, conn):
            vacuum(conn)
    except apsw.BusyError as e:
        raise DatabaseBusyError(path, busy_timeout) from e
    return before - _file_bytes(path)


def _file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + "-wal") if os.path.exists(p))


def backup(conn: apsw.Connection, source: str, target: str) -> None:
    """Write a consistent copy of ``conn``'s database to the new file ``target``.

    ``VACUUM INTO`` reads one snapshot (a read transaction, which in WAL mode never
    blocks writers) and writes a compact copy.
    """

    def write(partial: str) -> None:
        conn.execute("VACUUM INTO ?", (partial,))

    publish(source, target, write)


def publish(source: str, target: str, write: Callable[[str], None]) -> None:
    """Have ``write`` make a database file, and put it at the new path ``target``.

    It goes to a temporary name in the target's directory first and is linked into
    place only once complete and synced, so ``target`` is either absent or whole,
    and is never overwritten.
    """
    if not target:
        msg = f"cannot back up {source}: the path of the new file is empty. Name a new file."
        raise DurableError(msg)
    if os.path.lexists(target):
        msg = f"cannot back up {source} to {target}: that file exists. Choose a new path."
        raise DurableError(msg)
    directory = os.path.dirname(os.path.abspath(target))
    if not os.path.isdir(directory):
        msg = f"cannot back up {source} to {target}: the directory {directory} does not exist"
        raise DurableError(msg)
    partial = os.path.join(directory, f".{os.path.basename(target)}.partial-{uuid.uuid4().hex}")
    try:
        write(partial)
        with open(partial, "rb") as written:
            os.fsync(written.fileno())
        try:
            os.link(partial, target)  # fails, rather than overwrite, if target appeared
        except FileExistsError:
            msg = f"cannot back up {source} to {target}: that file exists. Choose a new path."
            raise DurableError(msg) from None
        _fsync_directory(directory)
    finally:
        for leftover in (partial, f"{partial}-wal", f"{partial}-shm", f"{partial}-lock"):
            if os.path.exists(leftover):
                os.unlink(leftover)


def _fsync_directory(directory: str) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class PruneAsYouGo:
    """A TurnWrite that keeps an agent's last ``keep_versions`` versions, in the turn's commit.

    It prunes once ``every = max(1, keep_versions // 2)`` versions beyond
    ``keep_versions`` have piled up, so at most ``keep_versions + every - 1``
    versions are held after a turn's commit (one more with a compaction), and each
    prune deletes only the rows the moved retention point pushed out (indexed
    ranges): a flat cost per turn, whatever the length of the history. Between
    prunes the cost is one indexed read.
    """

    def __init__(self, keep_versions: int, parts: Sequence[VersionedPart]) -> None:
        self.keep_versions = keep_versions
        self.every = max(1, keep_versions // 2)
        self.parts = parts

    def write(self, conn: Conn, agent_id: str, version: int, sealer: Sealer) -> None:
        """Prune ``agent_id`` if it holds ``every`` versions more than it keeps."""
        if version - kept_from(conn, agent_id) + 1 >= self.keep_versions + self.every:
            prune_agent(conn, agent_id, version - self.keep_versions + 1, parts=self.parts)
