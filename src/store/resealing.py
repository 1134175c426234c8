"""Sealing again what is stored: encrypting a plain database in place, and rotating keys.

Online: agent by agent, a batch of rows at a time, each batch one transaction
under the agent's hold (a turn of that agent waits for one batch, as for a turn
of its own). A row is opened and sealed again as a whole in its batch's
transaction: killed at any moment, every row is as it was or done, never half,
and running it again finishes the work. With ``rotate``, each scope (an agent, a
conversation) first gets a new data key, and every row not sealed with a key of
this run is sealed again; the older keys stay in the key store (copies made
before still need them) until their scope is erased. With ``encrypt``, plain rows
are sealed; once none is left, the database is marked complete, and a plain
value found later is damage.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import AgentInUseError, KeyUnavailableError
from .engine.seam import Conn, Database
from .holds import fenced, hold
from .sealing import HANDOFF, MESSAGE, STATE, Sealer, is_sealed, key_id_of


@dataclass
class ResealReport:
    """What :meth:`~effectful_durable.Store.reseal` did.

    ``agents``: how many agents' rows were gone through; ``sealed``: the values
    sealed (again, or for the first time), by table; ``keys``: the new data keys
    made (``rotate``); ``complete``: whether every row is sealed now, and the
    database marked so; ``busy``: the agents skipped because a turn held them for
    longer than ``wait``; ``unindexed``: the entries taken out of the full-text
    index of compacted originals (plain words); ``scrubbed``: whether the files
    were scrubbed of what the values were before.

    .. versionadded:: 0.2.0
    """

    agents: int
    sealed: dict[str, int]
    keys: int
    complete: bool
    busy: list[str]
    unindexed: int
    scrubbed: bool


#: What holds sealed content, per table: the columns of its key after agent_id,
#: the sealed columns, and each column's kind, conversation and place in it.
@dataclass(frozen=True)
class _Table:
    name: str
    keys: tuple[str, ...]
    columns: tuple[str, ...]
    place: Callable[[tuple[Any, ...], str], tuple[str, str, Any]]
    #: The version column that bounds a pass to the rows there when it began: rows
    #: turns add meanwhile are sealed with the newest key already, and a pass that
    #: chased them would never end while turns run.
    bound: str | None = None


_TABLES: tuple[_Table, ...] = (
    _Table(
        "messages",
        ("conversation", "position", "added_in"),
        ("body",),
        lambda key, _: (MESSAGE, str(key[0]), float(key[1])),
        "added_in",
    ),
    _Table("versions", ("version",), ("state",), lambda key, _: (STATE, "", ""), "version"),
    _Table("retention", (), ("state",), lambda key, _: (STATE, "", "")),
    _Table(
        "handoffs",
        ("conversation",),
        ("arguments", "error", "interrupted"),
        lambda key, column: (HANDOFF, str(key[0]), column),
    ),
)


def reseal(
    db: Database,
    sealer: Sealer,
    *,
    rotate: bool,
    batch: int = 500,
    wait: float = 5.0,
    agents: Sequence[str] | None = None,
    pause: float = 0.0,
) -> ResealReport:
    """Store.reseal: seal again every agent's rows (see the module's docstring)."""
    if sealer.keys is None:
        msg = f"{db.location}: resealing needs keys (keys=Keys.from_file(...))"
        raise KeyUnavailableError(msg)
    keys = sealer.keys
    report = ResealReport(0, {}, 0, False, [], 0, False)
    fresh: set[str] = set()  # the key ids this run made
    rotated: set[tuple[str, str]] = set()

    def current_fresh(agent_id: str, conversation: str) -> None:
        if rotate and (agent_id, conversation) not in rotated:
            fresh.add(keys.rotate(agent_id, conversation).id)
            rotated.add((agent_id, conversation))
            report.keys += 1

    def needs(value: str | None) -> bool:
        if value is None:
            return False
        if not is_sealed(value):
            return True
        return rotate and key_id_of(value) not in fresh

    if agents is None:
        with db.reading() as conn:
            found = conn.execute(
                "SELECT agent_id FROM agents UNION SELECT agent_id FROM handoffs ORDER BY agent_id"
            ).fetchall()
        agents = [str(a) for (a,) in found]
    for agent_id in agents:
        try:
            with hold(db, agent_id, wait=wait):
                pass  # only to learn early that a turn keeps it
        except AgentInUseError:
            report.busy.append(agent_id)
            continue
        report.agents += 1
        try:  # an index of plain words would give the sealed originals away
            with hold(db, agent_id, wait=wait), fenced(db, agent_id) as conn:
                conn.execute("DELETE FROM compacted_text WHERE agent_id = ?", (agent_id,))
                report.unindexed += conn.changes()
                began = db.agent_version(conn, agent_id) or 0
        except AgentInUseError:
            report.busy.append(agent_id)
            continue
        for table in _TABLES:
            after: tuple[Any, ...] | None = None
            while True:
                try:
                    with hold(db, agent_id, wait=wait), fenced(db, agent_id) as conn:
                        rows = _page(conn, table, agent_id, after, batch, began)
                        for row in rows:
                            key, values = row[: len(table.keys)], row[len(table.keys) :]
                            changed = []
                            for column, value in zip(table.columns, values, strict=True):
                                if not needs(value):
                                    continue
                                kind, conversation, where = table.place(key, column)
                                current_fresh(agent_id, conversation if kind != STATE else "")
                                plain = sealer.open(
                                    value, kind, agent_id, conversation, where, table=table.name
                                )
                                sealed = sealer.seal(plain, kind, agent_id, conversation, where)
                                changed.append((column, sealed))
                            if changed:
                                _update(conn, table, agent_id, key, changed)
                                report.sealed[table.name] = report.sealed.get(table.name, 0) + len(
                                    changed
                                )
                except AgentInUseError:
                    report.busy.append(agent_id)
                    break
                if len(rows) < batch or not table.keys:
                    break
                after = tuple(rows[-1][: len(table.keys)])
                if pause:
                    time.sleep(pause)
    if not report.busy:
        report.complete = _mark_complete(db)
        if report.complete:
            sealer.complete = True
    # What a value was before it was sealed again may stay in the files' free space
    # (PostgreSQL's dead rows, SQLite's WAL): scrubbed as an erasure's rows are.
    report.scrubbed = db.scrub([*(t.name for t in _TABLES), "compacted_text"])
    return report


def _page(
    conn: Conn,
    table: _Table,
    agent_id: str,
    after: tuple[Any, ...] | None,
    batch: int,
    began: int,
) -> list[tuple[Any, ...]]:
    """The next ``batch`` rows of ``agent_id`` in ``table`` after the key ``after``, of
    those there at version ``began``."""
    selected = ", ".join((*table.keys, *table.columns))
    order = ", ".join(table.keys) or "agent_id"
    where = "agent_id = ?"
    params: list[Any] = [agent_id]
    if table.bound is not None:
        where += f" AND {table.bound} <= ?"
        params.append(began)
    if after is not None:
        marks = ", ".join("?" * len(after))
        where += f" AND ({', '.join(table.keys)}) > ({marks})"
        params += list(after)
    rows = conn.execute(
        f"SELECT {selected} FROM checked_{table.name} WHERE {where} ORDER BY {order} LIMIT ?",
        (*params, batch),
    ).fetchall()
    return [tuple(row) for row in rows]


def _update(
    conn: Conn,
    table: _Table,
    agent_id: str,
    key: tuple[Any, ...],
    changed: list[tuple[str, str]],
) -> None:
    sets = ", ".join(f"{column} = ?" for column, _ in changed)
    where = " AND ".join(["agent_id = ?", *(f"{k} = ?" for k in table.keys)])
    conn.execute(
        f"UPDATE {table.name} SET {sets} WHERE {where}",
        (*(value for _, value in changed), agent_id, *key),
    )


def plain_rows(conn: Conn) -> int:
    """How many stored values that belong sealed are plain."""
    total = 0
    for table in _TABLES:
        for column in table.columns:
            total += int(
                conn.execute(
                    f"SELECT count(*) FROM {table.name}"
                    f" WHERE {column} IS NOT NULL AND substr({column}, 1, 4) <> 'ed1:'"
                ).fetchone()[0]
            )
    return total


def _mark_complete(db: Database) -> bool:
    """Mark the database complete if no plain value is left; whether it is."""
    with db.writing() as conn:
        if plain_rows(conn):
            return False
        conn.execute("UPDATE encryption SET complete = 1")
    return True
