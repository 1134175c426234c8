"""What changed in an agent between two of its versions: ``Store.diff``.

One function, used by the page's diff and by ``effectful-durable diff``. Every
part of the record that versions carry is compared: the messages of each
conversation, the shared fields and each conversation's own, the memory's keys
and notes, the rows of the SQL tables, the alarms pending, and the approvals
asked or used in between. Each read takes the rows that differ between the two
versions (those one version holds and the other does not), never both versions
whole, so its cost follows what changed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from .browse import VERSION_SELECT, version_info
from .checked import checked_rows, checked_version
from .engine.seam import Conn, Database
from .parts import approvals as _approvals
from .parts import conversation_fields
from .parts.alarms import opened_action
from .parts.memory import opened
from .records import ApprovalInfo, VersionInfo
from .rows import decode_messages, state_at, utc
from .sealing import MESSAGE, PLAIN, STATE, Sealer
from .workspace.diff import TableChange, table_changes

# A row of a versioned table is held by version ?N when this holds (columns: added, removed).
_HELD = "({a} <= ?{n} AND ({r} IS NULL OR {r} > ?{n}))"

#: The most messages (and rows per table) ``Store.diff`` lists by default.
DIFF_LIMIT = 200


@dataclass(frozen=True, slots=True)
class ValueChange:
    """A field, memory key or note that one version holds and the other does not, or
    holds with another value (``before``/``after``: None where absent).

    .. versionadded:: 0.2.0
    """

    name: str
    op: Literal["added", "removed", "changed"]
    before: Any = None
    after: Any = None


@dataclass(frozen=True, slots=True)
class MessagesChange:
    """The messages of one conversation that one version holds and the other does not.

    ``added``/``removed`` list the first of them, in order; the counts are of all.

    .. versionadded:: 0.2.0
    """

    conversation: str
    added_count: int
    removed_count: int
    added: list[dict[str, Any]]
    removed: list[dict[str, Any]]
    fields: list[ValueChange]


@dataclass(frozen=True, slots=True)
class AlarmChange:
    """An alarm pending at one version and not at the other (scheduled, or ended).

    .. versionadded:: 0.2.0
    """

    alarm_id: str
    op: Literal["added", "removed"]
    action: str
    fire_at: Any
    every: float | None
    cron: str | None


@dataclass(frozen=True, slots=True)
class VersionDiff:
    """What changed in an agent from version ``before`` to version ``after``.

    Either may be the older: the diff reads from ``before`` to ``after``.
    ``conversations`` holds those whose messages or own fields differ;
    ``fields`` the shared fields; ``memory`` the keys and ``notes`` the context
    notes (named by when they were added); ``tables`` the SQL tables' rows;
    ``alarms`` those pending at one version only; ``approvals`` those asked or
    resumed by a version in between.

    .. versionadded:: 0.2.0
    """

    agent_id: str
    before: VersionInfo
    after: VersionInfo
    conversations: list[MessagesChange]
    fields: list[ValueChange]
    memory: list[ValueChange]
    notes: list[ValueChange]
    tables: list[TableChange]
    alarms: list[AlarmChange]
    approvals: list[ApprovalInfo]

    @property
    def empty(self) -> bool:
        """Whether the two versions hold the same record."""
        return not (
            self.conversations
            or self.fields
            or self.memory
            or self.notes
            or self.tables
            or self.alarms
            or self.approvals
        )


def diff(
    db: Database,
    agent_id: str,
    before: int,
    after: int,
    *,
    limit: int | None,
    sealer: Sealer = PLAIN,
) -> VersionDiff:
    """Store.diff: what changed in the agent from version ``before`` to version ``after``."""
    if limit is not None and limit < 0:
        msg = f"limit must be >= 0 or None, not {limit}"
        raise ValueError(msg)
    with db.reading() as conn:
        checked_rows(db, conn, agent_id, min(before, after), "messages", "1 = 1")
        checked_version(db, conn, agent_id, max(before, after))
        infos = {
            row[0]: version_info(agent_id, row)
            for row in conn.execute(
                f"{VERSION_SELECT} WHERE agent_id = ? AND version IN (?, ?)",
                (agent_id, before, after),
            )
        }
        conversations = _messages(conn, agent_id, before, after, limit, sealer)

        def state(version: int) -> str | None:
            found = state_at(conn, agent_id, version)
            return None if found is None else sealer.open(
                found, STATE, agent_id, table="versions", version=version
            )  # fmt: skip

        fields = _values(_json(state(before)), _json(state(after)))
        conversations = _with_own_fields(conn, agent_id, before, after, conversations, sealer)
        memory, notes = _memory(conn, agent_id, before, after, sealer)
        tables = table_changes(conn, agent_id, before, after, limit=limit, sealer=sealer)
        alarms = _alarms(conn, agent_id, before, after, sealer)
        approvals = _approvals.between(
            conn, agent_id, min(before, after), max(before, after), sealer
        )
    return VersionDiff(
        agent_id,
        infos[before],
        infos[after],
        conversations,
        fields,
        memory,
        notes,
        tables,
        alarms,
        approvals,
    )


def _json(text: str | None) -> dict[str, Any]:
    value = json.loads(text) if text else {}
    return value if isinstance(value, dict) else {}


def _values(before: dict[str, Any], after: dict[str, Any]) -> list[ValueChange]:
    """The names whose values differ between two mappings, in name order."""
    changes = []
    for name in sorted(before.keys() | after.keys()):
        if name not in after:
            changes.append(ValueChange(name, "removed", before[name], None))
        elif name not in before:
            changes.append(ValueChange(name, "added", None, after[name]))
        elif before[name] != after[name]:
            changes.append(ValueChange(name, "changed", before[name], after[name]))
    return changes


def _differing(columns: tuple[str, str]) -> str:
    """SQL true for a row held by exactly one of the versions ?1 and ?2."""
    a, r = columns
    return f"{_HELD.format(a=a, r=r, n=1)} <> {_HELD.format(a=a, r=r, n=2)}"


def _messages(
    conn: Conn, agent_id: str, before: int, after: int, limit: int | None, sealer: Sealer
) -> list[MessagesChange]:
    """Per conversation, the messages ``after`` holds and ``before`` does not, and back.

    A message that left and came back as a new row (a rollback restores a copy)
    is the same on both sides and cancels out.
    """
    rows = conn.execute(
        f"""
        SELECT conversation, {_HELD.format(a="added_in", r="removed_in", n=2)},
               message_id, body, position FROM checked_messages
         WHERE agent_id = ?3 AND {_differing(("added_in", "removed_in"))}
         ORDER BY conversation, position, added_in
        """,
        (before, after, agent_id),
    ).fetchall()
    sides: dict[str, tuple[list[tuple[str, str]], list[tuple[str, str]]]] = {}
    for conversation, held_after, message_id, body, position in rows:
        added, removed = sides.setdefault(str(conversation), ([], []))
        plain = sealer.open(body, MESSAGE, agent_id, conversation, position, table="messages")
        (added if held_after else removed).append((str(message_id), plain))
    changes = []
    for conversation, (added, removed) in sorted(sides.items()):
        same = set(added) & set(removed)
        added = [row for row in added if row not in same]
        removed = [row for row in removed if row not in same]
        if not (added or removed):
            continue
        shown = slice(None) if limit is None else slice(limit)
        changes.append(
            MessagesChange(
                conversation,
                len(added),
                len(removed),
                decode_messages(body for _, body in added[shown]),
                decode_messages(body for _, body in removed[shown]),
                [],
            )
        )
    return changes


def _with_own_fields(
    conn: Conn,
    agent_id: str,
    before: int,
    after: int,
    changes: list[MessagesChange],
    sealer: Sealer,
) -> list[MessagesChange]:
    """``changes`` with each conversation's own fields compared, and the conversations
    whose fields alone changed added."""
    rows = conn.execute(
        f"""
        SELECT DISTINCT conversation FROM conversation_fields
         WHERE agent_id = ?3 AND {_differing(("added_in", "removed_in"))}
        """,
        (before, after, agent_id),
    ).fetchall()
    by_name = {change.conversation: change for change in changes}
    for (conversation,) in rows:
        fields = _values(
            _json(conversation_fields.state_at(conn, agent_id, conversation, before, sealer)),
            _json(conversation_fields.state_at(conn, agent_id, conversation, after, sealer)),
        )
        if not fields:
            continue
        old = by_name.get(conversation) or MessagesChange(conversation, 0, 0, [], [], [])
        by_name[conversation] = MessagesChange(
            conversation, old.added_count, old.removed_count, old.added, old.removed, fields
        )
    return [by_name[name] for name in sorted(by_name)]


def _memory(
    conn: Conn, agent_id: str, before: int, after: int, sealer: Sealer
) -> tuple[list[ValueChange], list[ValueChange]]:
    """The memory keys and the notes whose values differ between the versions."""
    rows = conn.execute(
        f"""
        SELECT kind, key, {_HELD.format(a="added_in", r="removed_in", n=2)}, value
          FROM checked_memory
         WHERE agent_id = ?3 AND {_differing(("added_in", "removed_in"))}
         ORDER BY kind, key
        """,
        (before, after, agent_id),
    ).fetchall()
    sides: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {"key": ({}, {}), "note": ({}, {})}
    for kind, key, held_after, value in rows:
        old, new = sides[str(kind)]
        decoded = json.loads(opened(sealer, agent_id, kind, key, value))
        if kind == "note":  # named by when it was added: {"at": <seconds>, "text": ...}
            key, decoded = utc(decoded["at"]).isoformat(timespec="seconds"), decoded["text"]
        (new if held_after else old)[str(key)] = decoded
    return _values(*sides["key"]), _values(*sides["note"])


def _alarms(
    conn: Conn, agent_id: str, before: int, after: int, sealer: Sealer
) -> list[AlarmChange]:
    """The alarms pending at one of the versions only: scheduled, or ended, in between."""
    rows = conn.execute(
        f"""
        SELECT alarm_id, {_HELD.format(a="created_in", r="ended_in", n=2)},
               action, fire_at, every, cron FROM checked_alarms
         WHERE agent_id = ?3 AND kind = 'alarm'
           AND {_differing(("created_in", "ended_in"))}
         ORDER BY fire_at, alarm_id
        """,
        (before, after, agent_id),
    ).fetchall()
    sides: dict[str, set[bool]] = {}  # an alarm that ended and came back cancels out
    for alarm_id, after_holds, *_ in rows:
        sides.setdefault(str(alarm_id), set()).add(bool(after_holds))
    return [
        AlarmChange(
            str(alarm_id),
            "added" if after_holds else "removed",
            opened_action(sealer, agent_id, alarm_id, "alarm", action),
            utc(fire_at),
            every,
            cron,
        )  # fmt: skip
        for alarm_id, after_holds, action, fire_at, every, cron in rows
        if len(sides[str(alarm_id)]) == 1
    ]
