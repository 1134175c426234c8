"""The SQL workspace's log in the main database: each agent's tables, version by version.

The main database, on either backend, is the single source of truth for the
agents' tables. ``workspace_log`` holds, per version, the steps that turn the
previous version's tables into this version's, in ``seq`` order: DDL text, or an
``apsw.Session`` changeset of row changes. A snapshot starts with the
``-- reset`` step, which drops every table. This module reads and writes the log
on the seam's ``Conn``, in the SQL both backends speak, and replays it into
SQLite databases. ``part.py`` makes it follow a rollback, a fork, a prune and a
delete; the SQLite files that hold each agent's tables on a machine are
``cache.py``'s.

Versions (``part.py``). ``rollback`` to v writes, as the new version, the inverse of the
changesets after v (O(changes since v)) when no DDL happened after v; otherwise
a snapshot of the tables at v (replayed from the log: O(history)). ``fork``
writes a snapshot. ``prune`` folds the steps before a version into one snapshot.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import apsw

from ..engine.seam import Conn
from ..sealing import PLAIN, WORKSPACE, Sealer
from .schema import quote, tables

RESET = "-- reset"  # a DDL step that drops every table: snapshots start with it

type Step = tuple[str | None, bytes | None]  # (DDL text, None) or (None, changeset)


@dataclass(frozen=True)
class Truth:
    """What the main database says of an agent's tables, read in one snapshot.

    Attributes:
        current: The agent's committed version (0: no such agent).
        stamp: When ``current`` was committed: with the agent and the version, it
            names one commit, in this database or in a copy of it.
        held_stamp: When the version a workspace file holds was committed (None if
            the agent has no such version, or no longer: pruned).
    """

    current: int
    stamp: float | None
    held_stamp: float | None


def truth(conn: Conn, agent_id: str, held: int) -> Truth:
    """The agent's committed version, and the commit times of it and of version ``held``."""
    row = conn.execute(
        """
        SELECT a.version, c.committed_at, h.committed_at FROM checked_agents AS a
          LEFT JOIN versions AS c ON c.agent_id = a.agent_id AND c.version = a.version
          LEFT JOIN versions AS h ON h.agent_id = a.agent_id AND h.version = ?2
         WHERE a.agent_id = ?1
        """,
        (agent_id, held),
    ).fetchone()
    if row is None:
        return Truth(0, None, None)
    return Truth(int(row[0]), _float(row[1]), _float(row[2]))


def stamp_of(conn: Conn, agent_id: str, version: int) -> float | None:
    """When ``version`` of the agent was committed (in ``conn``'s transaction)."""
    row = conn.execute(
        "SELECT committed_at FROM versions WHERE agent_id = ? AND version = ?",
        (agent_id, version),
    ).fetchone()
    return None if row is None else _float(row[0])


def log(conn: Conn, agent_id: str, after: int, upto: int, sealer: Sealer = PLAIN) -> list[Step]:
    """The steps of the versions after ``after`` up to ``upto``, in order, opened by
    ``sealer``."""
    rows = conn.execute(
        """
        SELECT ddl, changeset, version, seq FROM checked_workspace_log
         WHERE agent_id = ? AND version > ? AND version <= ? ORDER BY version, seq
        """,
        (agent_id, after, upto),
    ).fetchall()
    with sealer.one_look():
        return [_opened(sealer, agent_id, *row) for row in rows]


def schema_steps(conn: Conn, agent_id: str, upto: int, sealer: Sealer = PLAIN) -> list[Step]:
    """The DDL steps (resets included) of the versions up to ``upto``, in order: what
    makes the tables' schema at ``upto``, without their rows."""
    rows = conn.execute(
        """
        SELECT ddl, NULL, version, seq FROM checked_workspace_log
         WHERE agent_id = ? AND version <= ? AND ddl IS NOT NULL ORDER BY version, seq
        """,
        (agent_id, upto),
    ).fetchall()
    with sealer.one_look():
        return [_opened(sealer, agent_id, *row) for row in rows]


def write_log(
    conn: Conn, agent_id: str, version: int, steps: Sequence[Step], sealer: Sealer = PLAIN
) -> None:
    """Record ``steps`` as ``version`` of the agent's tables, sealed by ``sealer``."""
    rows = []
    for seq, (ddl, changeset) in enumerate(steps):
        where = f"{version}:{seq}"
        if ddl is not None and ddl != RESET:
            ddl = sealer.seal(ddl, WORKSPACE, agent_id, "", where)
        if changeset is not None:
            changeset = sealer.seal_bytes(changeset, WORKSPACE, agent_id, "", where)
        rows.append((agent_id, version, seq, ddl, changeset))
    conn.executemany(
        "INSERT INTO workspace_log (agent_id, version, seq, ddl, changeset) VALUES (?,?,?,?,?)",
        rows,
    )


def _opened(
    sealer: Sealer, agent_id: str, ddl: Any, changeset: Any, version: int, seq: int
) -> Step:
    """A log row's step, opened (a reset is never sealed: it holds nothing)."""
    where = f"{version}:{seq}"
    text = _text(ddl)
    if text is not None and text != RESET:
        text = sealer.open(text, WORKSPACE, agent_id, "", where, table="workspace_log")
    blob = _blob(changeset)
    if blob is not None:
        blob = sealer.open_bytes(blob, WORKSPACE, agent_id, "", where, table="workspace_log")
    return text, blob


def apply(ws: apsw.Connection, steps: Iterable[Step]) -> None:
    """Replay ``steps`` on a workspace database; any conflict aborts (the view diverged)."""
    for ddl, changeset in steps:
        if ddl == RESET:
            for (name,) in ws.execute(
                "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%'"
            ).fetchall():
                ws.execute(f"DROP TABLE {quote(str(name))}")
        elif ddl is not None:
            ws.execute(ddl)
        elif changeset:
            apsw.Changeset.apply(changeset, ws)


def replayed(steps: Iterable[Step]) -> apsw.Connection:
    """A new in-memory database holding what ``steps`` make from nothing."""
    mem = apsw.Connection(":memory:")
    apply(mem, steps)
    return mem


def snapshot(mem: apsw.Connection) -> list[Step]:
    """Steps that make any workspace equal to ``mem``: reset, DDL, then every row."""
    schema = mem.execute(
        """
        SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL AND name NOT LIKE 'sqlite%'
         ORDER BY type = 'index', rowid
        """
    ).fetchall()
    statements = [str(sql) for (sql,) in schema]
    steps: list[Step] = [(RESET, None), *((sql, None) for sql in statements)]
    fresh = apsw.Connection(":memory:")
    for sql in statements:
        fresh.execute(sql)
    session = apsw.Session(fresh, "main")
    session.attach()
    with fresh:
        for table in tables(mem):
            names = [c.name for c in table.columns if not c.hidden]
            columns = ", ".join(quote(n) for n in names)
            rows = mem.execute(f"SELECT {columns} FROM {quote(table.name)}")
            marks = ", ".join("?" * len(names))
            insert = f"INSERT INTO {quote(table.name)} ({columns}) VALUES ({marks})"
            fresh.executemany(insert, rows)
    changeset = session.changeset()
    session.close()
    fresh.close()
    if changeset:
        steps.append((None, changeset))
    return steps


def merged(steps: Sequence[Step]) -> list[Step]:
    """The steps with each run of changesets between DDL steps combined into one."""
    out: list[Step] = []
    run: list[bytes] = []

    def flush() -> None:
        if len(run) == 1:
            out.append((None, run[0]))
        elif run:
            combined = combine(run)
            if combined:
                out.append((None, combined))
        run.clear()

    for ddl, changeset in steps:
        if ddl is None and changeset:
            run.append(changeset)
        else:
            flush()
            out.append((ddl, changeset))
    flush()
    return out


def combine(changesets: Iterable[bytes]) -> bytes:
    """One changeset with the effect of ``changesets`` applied in order."""
    builder = apsw.ChangesetBuilder()  # type: ignore[no-untyped-call]
    for changeset in changesets:
        if changeset:
            builder.add(changeset)
    combined = builder.output()
    builder.close()
    return combined


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _text(value: Any) -> str | None:
    return None if value is None else str(value)


def _blob(value: Any) -> bytes | None:
    return None if value is None else bytes(value)
