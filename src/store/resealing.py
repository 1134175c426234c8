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

import contextlib
import json
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from ..errors import AgentInUseError, KeyUnavailableError
from .engine.seam import Conn, Database
from .holds import fenced, hold
from .sealing import (
    ALARM,
    APPROVAL,
    FIELDS,
    HANDOFF,
    JOURNAL,
    MEMORY,
    MESSAGE,
    PER_CONVERSATION,
    PREFIX,
    STATE,
    WORKSPACE,
    Sealer,
    is_sealed,
    key_id_of,
)
from .workspace.log import RESET


@dataclass
class ResealReport:
    """What :meth:`~effectful_durable.Store.reseal` did.

    ``agents``: how many agents' rows were gone through; ``sealed``: the values
    sealed (again, or for the first time), by table; ``keys``: the new data keys
    made (``rotate``); ``complete``: whether every row is sealed now, and the
    database marked so; ``busy``: the agents skipped because a turn held them for
    longer than ``wait``; ``unindexed``: the entries taken out of the full-text
    index of compacted originals (plain words); ``scrubbed``: whether the files
    were scrubbed of what the values were before; ``shredded``: the SQL workspace
    files of this machine overwritten and deleted (once complete).

    .. versionadded:: 0.2.0
    """

    agents: int
    sealed: dict[str, int]
    keys: int
    complete: bool
    busy: list[str]
    unindexed: int
    scrubbed: bool
    shredded: int = 0


#: What holds sealed content, per table: the columns of its key after the owner
#: (the agent), other columns its values are sealed for, the sealed columns, and
#: each value's kind, conversation and place.
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
    #: Columns read for ``place`` besides the key's.
    context: tuple[str, ...] = ()
    #: The rows whose values are never sealed (they hold nothing of anyone's).
    plain: str | None = None
    #: The owner's column: "" for rows of no agent (a free template's steps).
    owner: str = "agent_id"
    #: The sealed columns that hold bytes.
    binary: tuple[str, ...] = ()


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
    _Table(
        "memory",
        ("kind", "key", "added_in"),
        ("value",),
        lambda key, _: (MEMORY, "", f"{key[0]}:{key[1]}"),
        "added_in",
    ),
    _Table(
        "conversation_fields",
        ("conversation", "added_in"),
        ("state",),
        lambda key, _: (FIELDS, str(key[0]), ""),
        "added_in",
    ),
    _Table(
        "approvals",
        ("conversation", "approval_id"),
        ("turn_arguments", "arguments", "decided_arguments"),
        lambda key, column: (APPROVAL, str(key[0]), f"{key[1]}:{column}"),
    ),
    _Table(
        "alarms",
        ("alarm_id", "created_in"),
        ("action",),
        lambda key, _: (ALARM, "", str(key[0])),
        plain="kind = 'resume'",
    ),
    _Table(
        "workflow_steps",
        ("workflow", "step_key"),
        ("arguments", "result"),
        lambda key, column: (
            JOURNAL,
            str(key[2] or ""),
            json.dumps([key[0], key[1], column]),
        ),
        context=("conversation",),
        owner="coalesce(agent_id, '')",
    ),
    _Table(
        "workspace_log",
        ("version", "seq"),
        ("ddl", "changeset"),
        lambda key, _: (WORKSPACE, "", f"{key[0]}:{key[1]}"),
        "version",
        plain=f"coalesce(ddl, '') = '{RESET}'",
        binary=("changeset",),
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

    def needs(value: str | bytes | None) -> bool:
        if value is None:
            return False
        if not is_sealed(value):
            return True
        return rotate and key_id_of(value) not in fresh

    if agents is None:
        with db.reading() as conn:
            found = conn.execute(
                """
                SELECT agent_id FROM agents UNION SELECT agent_id FROM handoffs
                 UNION SELECT agent_id FROM alarms ORDER BY agent_id
                """
            ).fetchall()
        agents = [str(a) for (a,) in found]
        agents += _free_steps_owner(db)
    for agent_id in agents:
        began = 0
        if agent_id:
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
                    # Copies sealed with the keys of before: the next load makes anew.
                    conn.execute("DELETE FROM history_snapshots WHERE agent_id = ?", (agent_id,))
                    began = db.agent_version(conn, agent_id) or 0
            except AgentInUseError:
                report.busy.append(agent_id)
                continue
        for table in _TABLES if agent_id else _FREE_STEPS:
            after: tuple[Any, ...] | None = None
            while True:
                try:
                    with _writing(db, agent_id, wait) as conn:
                        rows = _page(conn, table, agent_id, after, batch, began)
                        for row in rows:
                            named = len(table.keys) + len(table.context)
                            key, values = row[:named], row[named:]
                            changed: list[tuple[str, str | bytes]] = []
                            for column, value in zip(table.columns, values, strict=True):
                                if not needs(value):
                                    continue
                                kind, conversation, where = table.place(key, column)
                                scope = conversation if kind in PER_CONVERSATION else ""
                                current_fresh(agent_id, scope)
                                place = (kind, agent_id, conversation, where)
                                sealed: str | bytes
                                if column in table.binary:
                                    data = sealer.open_bytes(
                                        bytes(value), *place, table=table.name
                                    )
                                    sealed = sealer.seal_bytes(data, *place)
                                else:
                                    plain = sealer.open(value, *place, table=table.name)
                                    sealed = sealer.seal(plain, *place)
                                changed.append((column, sealed))
                            if changed:
                                _update(conn, table, agent_id, key[: len(table.keys)], changed)
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
    report.scrubbed = db.scrub([*(t.name for t in _TABLES), "compacted_text", "history_snapshots"])
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
    selected = ", ".join((*table.keys, *table.context, *table.columns))
    order = ", ".join(table.keys) or "agent_id"
    where = f"{table.owner} = ?"
    params: list[Any] = [agent_id]
    if table.plain is not None:
        where += f" AND NOT ({table.plain})"
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
    changed: list[tuple[str, str | bytes]],
) -> None:
    sets = ", ".join(f"{column} = ?" for column, _ in changed)
    where = " AND ".join([f"{table.owner} = ?", *(f"{k} = ?" for k in table.keys)])
    conn.execute(
        f"UPDATE {table.name} SET {sets} WHERE {where}",
        (*(value for _, value in changed), agent_id, *key),
    )


#: The journal's steps of free templates, of no agent: sealed under the database's key.
_FREE_STEPS = tuple(table for table in _TABLES if table.name == "workflow_steps")


def _free_steps_owner(db: Database) -> list[str]:
    """``[""]`` if the journal holds steps of free templates, which no agent owns."""
    with db.reading() as conn:
        found = conn.execute("SELECT 1 FROM workflow_steps WHERE agent_id IS NULL LIMIT 1")
        return [""] if found.fetchone() is not None else []


@contextlib.contextmanager
def _writing(db: Database, agent_id: str, wait: float) -> Iterator[Conn]:
    """A batch's transaction: under the agent's hold, or (no agent) a plain write."""
    if not agent_id:
        with db.writing() as conn:
            yield conn
        return
    with hold(db, agent_id, wait=wait), fenced(db, agent_id) as conn:
        yield conn


def plain_rows(conn: Conn) -> int:
    """How many stored values that belong sealed are plain."""
    total = 0
    for table in _TABLES:
        for column in table.columns:
            plain = f" AND NOT ({table.plain})" if table.plain else ""
            start = PREFIX.encode() if column in table.binary else PREFIX
            total += int(
                conn.execute(
                    f"SELECT count(*) FROM {table.name}"
                    f" WHERE {column} IS NOT NULL AND substr({column}, 1, 4) <> ?{plain}",
                    (start,),
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
