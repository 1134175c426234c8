"""The Store's reads for browsing: agents by page, an agent's turns by page, with filters.

What the page (``ui/``) and the command line show of a large database, read a
page at a time: the agents list (``agent_page``: filtered, sorted, paged, each
agent with what waits for it), an agent's history as one block per committed
version (``timeline``: newest first, paged by version, with a filter on role,
tool, text and errors that reads the history as it goes and stops once the page
is full), the versions by page (``version_page``) and the originals a compaction
replaced (``compacted``). A row that fails its checksum refuses only what needs
it: in the agents list, that agent's line says so and the others read as usual.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from ..errors import DamagedRowError
from .checked import checked_version
from .engine.seam import Conn, Database
from .history import message_text
from .ids import validate_conversation_id
from .records import Paged, VersionInfo
from .rows import decode_messages, like_pattern, utc
from .sealing import MESSAGE, PLAIN, Sealer

#: The orders ``agent_page`` sorts by: name -> (SQL order, its reverse).
AGENT_SORTS: dict[str, str] = {
    "id": "agent_id",
    "-id": "agent_id DESC",
    "updated": "updated_at, agent_id",
    "-updated": "updated_at DESC, agent_id",
    "version": "version, agent_id",
    "-version": "version DESC, agent_id",
    "created": "created_at, agent_id",
    "-created": "created_at DESC, agent_id",
}

#: The query of the names of an agent's SQL tables (``Store.sql_tables``).
TABLE_NAMES = (
    "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%' ORDER BY name"
)

#: The longest page a browsing read returns.
MAX_PAGE = 500

# How a tool result or a retry that reports an error begins (effectful's
# ToolCallExecutionError, ToolCallDecodingError and ResultDecodingError).
_ERROR_STARTS = ("Tool execution failed", "Error decoding tool call", "Error decoding response")

# An agent that needs a person: an approval waits, an alarm or event died, or a
# turn started and did not commit (running, crashed or failed). A dead alarm has
# not ended (the table's CHECK): saying so lets the read go through the index of
# the alarms that have not (alarms_open) rather than every alarm ever done.
_ATTENTION = """
    agent_id IN (SELECT agent_id FROM approvals WHERE status = 'pending'
                 UNION SELECT agent_id FROM alarms WHERE status = 'dead' AND ended_in IS NULL
                 UNION SELECT agent_id FROM handoffs)
"""


@dataclass(frozen=True, slots=True)
class AgentSummary:
    """One agent as the agents list shows it: its version and what waits for it.

    ``handoff`` is the status of an interrupted turn (``"running"`` or
    ``"failed"``, the first of its conversations'), None if there is none.
    ``damaged`` says which row of the agent fails its checksum (then the counts
    are 0): the agent cannot be read until it is repaired.

    .. versionadded:: 0.2.0
    """

    agent_id: str
    version: int
    created_at: datetime | None
    updated_at: datetime | None
    messages: int = 0
    conversations: int = 0
    approvals_pending: int = 0
    events_waiting: int = 0
    alarms_pending: int = 0
    alarms_dead: int = 0
    handoff: str | None = None
    damaged: str | None = None

    @property
    def needs_attention(self) -> bool:
        """Whether a person should look (an approval waits, something died, a turn broke)."""
        return bool(self.approvals_pending or self.alarms_dead or self.handoff or self.damaged)


@dataclass(frozen=True, slots=True)
class TablePage(Paged):
    """One page of the rows of an agent's SQL table (values as SQLite returns them).

    .. versionadded:: 0.2.0
    """

    table: str
    columns: tuple[str, ...]
    rows: list[tuple[Any, ...]]
    total: int
    page: int
    per_page: int


@dataclass(frozen=True, slots=True)
class AgentPage(Paged):
    """One page of the agents list: its agents, and how many match in all.

    .. versionadded:: 0.2.0
    """

    agents: list[AgentSummary]
    total: int
    page: int
    per_page: int


@dataclass(frozen=True, slots=True)
class HistoryFilter:
    """What a message must be for the timeline to show it: every given test must hold.

    ``role`` is the message's role; ``tool`` a tool's name, which a call to it and
    its result match; ``text`` occurs in the message's text or tool calls, in any
    case; ``errors`` keeps the tool results and retries that report an error.

    .. versionadded:: 0.2.0
    """

    role: str | None = None
    tool: str | None = None
    text: str | None = None
    errors: bool = False

    @property
    def empty(self) -> bool:
        """Whether it keeps every message."""
        return not (self.role or self.tool or self.text or self.errors)

    def matches(self, message: dict[str, Any], calls: dict[str, str]) -> bool:
        """Whether ``message`` passes; ``calls`` maps tool call ids to tool names."""
        if self.role and message.get("role") != self.role:
            return False
        if self.errors and not is_error(message):
            return False
        if self.tool and self.tool not in tools_of(message, calls):
            return False
        return not self.text or self.text.casefold() in message_text(message).casefold()


@dataclass(frozen=True, slots=True)
class TurnBlock:
    """One committed version of an agent, as a block of its timeline.

    ``messages`` are those the version added to the conversation, in order (all
    of them, or those the filter kept; ``matched`` counts them, ``total`` all the
    version added there). A message later compacted, rolled back or deleted carries
    ``"durable": {"removed_in": <version>}``. A rollback or a fork lists no
    messages: it restores or copies them (``info.added``).

    .. versionadded:: 0.2.0
    """

    info: VersionInfo
    messages: list[dict[str, Any]]
    total: int
    compacted: int = 0


@dataclass(frozen=True, slots=True)
class Timeline:
    """A page of an agent's timeline in one conversation, newest version first.

    ``next_before`` is the ``before`` of the next (older) page, None on the last;
    ``latest`` is the agent's current version.

    .. versionadded:: 0.2.0
    """

    agent_id: str
    conversation: str
    latest: int
    blocks: list[TurnBlock]
    next_before: int | None
    filter: HistoryFilter = field(default_factory=HistoryFilter)


def is_error(message: dict[str, Any]) -> bool:
    """Whether ``message`` reports an error to the model: a failed tool call, or a
    response the model must make again (effectful's retry messages)."""
    if message.get("role") not in ("tool", "user"):
        return False
    return message_text(message).lstrip().startswith(_ERROR_STARTS)


def tools_of(message: dict[str, Any], calls: dict[str, str]) -> set[str]:
    """The tools a message calls, or whose result it is (``calls``: call id -> tool)."""
    names: set[str] = set()
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(function.get("name"), str):
            names.add(function["name"])
    called = message.get("tool_call_id")
    if isinstance(called, str) and called in calls:
        names.add(calls[called])
    return names


def _record_calls(message: dict[str, Any], calls: dict[str, str]) -> None:
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict) and isinstance(call.get("id"), str):
            calls[call["id"]] = str(function.get("name"))


def agent_page(
    db: Database, *, text: str, attention: bool, sort: str, page: int, per_page: int
) -> AgentPage:
    """Store.agent_page: one page of the agents, with what waits for each."""
    order = AGENT_SORTS.get(sort)
    if order is None:
        msg = f"sort must be one of {', '.join(AGENT_SORTS)}; not {sort!r}"
        raise ValueError(msg)
    check_page(page, per_page)
    where, params = ["1 = 1"], []
    if text:
        where.append("lower(agent_id) LIKE ? ESCAPE '\\'")
        params.append(f"%{like_pattern(text.lower())}%")
    if attention:
        where.append(_ATTENTION)
    condition = " AND ".join(where)
    count = f"SELECT count(*) FROM agents WHERE {condition}"
    paged = f"FROM agents WHERE {condition} ORDER BY {order} LIMIT ? OFFSET ?"
    window = [*params, per_page, (page - 1) * per_page]
    with db.reading() as conn:
        if len(where) == 1:  # all agents: counted, and their page read through an index
            total = int(conn.execute(count, params).get)
            ids = [
                str(agent_id) for (agent_id,) in conn.execute(f"SELECT agent_id {paged}", window)
            ]
        else:  # a filter reads every agent: once for both the count and the page
            rows = conn.execute(f"SELECT agent_id, count(*) OVER () {paged}", window).fetchall()
            ids = [str(agent_id) for agent_id, _ in rows]
            if rows:
                total = int(rows[0][1])
            else:  # past the last page, or none match
                total = 0 if page == 1 else int(conn.execute(count, params).get)
    return AgentPage(_summaries_of(db, ids), total, page, per_page)


def _summaries_of(db: Database, ids: list[str]) -> list[AgentSummary]:
    """The summaries of ``ids``, in that order; one line per agent whose rows are damaged."""
    try:
        with db.reading() as conn:
            found = _summaries(conn, ids)
    except DamagedRowError:
        found = {}
        for agent_id in ids:  # one by one: only the damaged agent's line says so
            try:
                with db.reading() as conn:
                    found |= _summaries(conn, [agent_id])
            except DamagedRowError as error:
                found[agent_id] = AgentSummary(agent_id, 0, None, None, damaged=str(error))
    return [found[agent_id] for agent_id in ids if agent_id in found]


def timeline(
    db: Database,
    agent_id: str,
    conversation: str,
    before: int | None,
    limit: int,
    filter: HistoryFilter | None,
    *,
    sealer: Sealer = PLAIN,
) -> Timeline:
    """Store.timeline: a page of the agent's history, one block per version, newest first."""
    validate_conversation_id(conversation)
    check_page(1, limit)
    if before is not None and before < 1:
        msg = f"before must be a version >= 1, not {before}"
        raise ValueError(msg)
    wanted = filter if filter is not None and not filter.empty else None
    with db.reading() as conn:
        latest = checked_version(db, conn, agent_id, None)
        start = latest + 1 if before is None else min(before, latest + 1)
        if wanted is None:
            blocks, next_before = _plain_page(conn, agent_id, conversation, start, limit, sealer)
        else:
            blocks, next_before = _filtered_page(
                conn, agent_id, conversation, start, limit, wanted, sealer
            )
    return Timeline(agent_id, conversation, latest, blocks, next_before, wanted or HistoryFilter())


def version_page(
    db: Database, agent_id: str, *, before: int | None, limit: int
) -> list[VersionInfo]:
    """Store.version_page: the agent's versions before ``before``, newest first."""
    check_page(1, limit)
    with db.reading() as conn:
        latest = checked_version(db, conn, agent_id, None)
        start = latest + 1 if before is None else before
        rows = conn.execute(
            f"{VERSION_SELECT} WHERE agent_id = ? AND version < ? ORDER BY version DESC LIMIT ?",
            (agent_id, start, limit),
        ).fetchall()
    return [version_info(agent_id, row) for row in rows]


def compacted(
    db: Database, agent_id: str, version: int, *, conversation: str, sealer: Sealer = PLAIN
) -> list[dict[str, Any]]:
    """Store.compacted: the originals the compaction that made ``version`` replaced."""
    validate_conversation_id(conversation)
    with db.reading() as conn:
        checked_version(db, conn, agent_id, version)
        bodies = conn.execute(
            """
            SELECT m.body, m.position FROM checked_messages AS m
              JOIN compactions AS c ON c.agent_id = m.agent_id AND c.version = m.removed_in
             WHERE m.agent_id = ?1 AND m.conversation = ?2 AND m.removed_in = ?3
               AND m.position BETWEEN c.first_position AND c.last_position
             ORDER BY m.position, m.added_in
            """,
            (agent_id, conversation, version),
        ).fetchall()
    return decode_messages(
        sealer.open(body, MESSAGE, agent_id, conversation, position, table="messages")
        for body, position in bodies
    )


VERSION_SELECT = """
    SELECT version, kind, template, added, removed, state IS NOT NULL,
           detail, committed_at, conversation
      FROM checked_versions
"""


def version_info(agent_id: str, row: Sequence[Any]) -> VersionInfo:
    """A :data:`VERSION_SELECT` row as a VersionInfo."""
    version, kind, template, added, removed, changed, detail, committed, conversation = row
    return VersionInfo(
        agent_id,
        version,
        kind,
        template,
        added,
        removed,
        bool(changed),
        json.loads(detail) if detail else None,
        utc(committed),
        conversation,
    )


def check_page(page: int, per_page: int) -> None:
    """Raise ValueError unless ``page`` >= 1 and ``per_page`` from 1 to :data:`MAX_PAGE`."""
    if not 1 <= per_page <= MAX_PAGE:
        msg = f"a page holds 1 to {MAX_PAGE} rows, not {per_page}"
        raise ValueError(msg)
    if page < 1:
        msg = f"pages count from 1, not {page}"
        raise ValueError(msg)


def _summaries(conn: Conn, ids: list[str]) -> dict[str, AgentSummary]:
    """The summary of each agent of ``ids``, in one read."""
    if not ids:
        return {}
    marks = ", ".join("?" * len(ids))
    rows = conn.execute(
        f"""
        SELECT a.agent_id, a.version, a.created_at, a.updated_at,
               (SELECT count(*) FROM messages AS m
                 WHERE m.agent_id = a.agent_id AND m.removed_in IS NULL),
               (SELECT count(*) FROM conversations AS c
                 WHERE c.agent_id = a.agent_id AND c.removed_in IS NULL),
               (SELECT count(*) FROM approvals AS p
                 WHERE p.agent_id = a.agent_id AND p.status = 'pending'),
               (SELECT count(*) FROM alarms AS e
                 WHERE e.agent_id = a.agent_id AND e.ended_in IS NULL AND e.kind = 'event'),
               (SELECT count(*) FROM alarms AS e
                 WHERE e.agent_id = a.agent_id AND e.status = 'pending' AND e.kind = 'alarm'),
               (SELECT count(*) FROM alarms AS e
                 WHERE e.agent_id = a.agent_id AND e.status = 'dead')
          FROM checked_agents AS a WHERE a.agent_id IN ({marks})
        """,
        ids,
    ).fetchall()
    handoffs: dict[str, str] = {}
    for agent_id, status, _ in conn.execute(
        f"""
        SELECT agent_id, status, arguments FROM checked_handoffs
         WHERE agent_id IN ({marks}) ORDER BY status, conversation
        """,
        ids,
    ):
        handoffs.setdefault(str(agent_id), str(status))
    summaries = {}
    for agent_id, version, created, updated, *counts in rows:
        messages, conversations, approvals, events, pending, dead = map(int, counts)
        summaries[str(agent_id)] = AgentSummary(
            str(agent_id),
            int(version),
            utc(created),
            utc(updated),
            messages,
            conversations,
            approvals,
            events,
            pending,
            dead,
            handoffs.get(str(agent_id)),
        )
    return summaries


def _versions_before(
    conn: Conn, agent_id: str, conversation: str, start: int, limit: int
) -> list[VersionInfo]:
    """Up to ``limit`` versions before ``start`` that changed ``conversation`` (or all:
    rollbacks and forks), newest first."""
    rows = conn.execute(
        f"""{VERSION_SELECT}
         WHERE agent_id = ? AND version < ? AND (conversation = ? OR conversation IS NULL)
         ORDER BY version DESC LIMIT ?
        """,
        (agent_id, start, conversation, limit),
    ).fetchall()
    return [version_info(agent_id, row) for row in rows]


def _plain_page(
    conn: Conn, agent_id: str, conversation: str, start: int, limit: int, sealer: Sealer
) -> tuple[list[TurnBlock], int | None]:
    """The unfiltered blocks of up to ``limit`` versions before ``start``."""
    infos = _versions_before(conn, agent_id, conversation, start, limit + 1)
    more = len(infos) > limit
    infos = infos[:limit]
    shown = [i for i in infos if i.kind not in ("rollback", "fork")]
    by_version: dict[int, list[dict[str, Any]]] = {i.version: [] for i in shown}
    if shown:
        added = _messages_added(conn, agent_id, conversation, shown, sealer)
        for version, removed_in, message in added:
            by_version[version].append(_marked(message, removed_in))
    blocks = [
        TurnBlock(info, by_version.get(info.version, []), len(by_version.get(info.version, [])))
        for info in infos
    ]
    blocks = _with_compactions(conn, agent_id, conversation, blocks)
    return blocks, (infos[-1].version if more else None)


def _filtered_page(
    conn: Conn,
    agent_id: str,
    conversation: str,
    start: int,
    limit: int,
    wanted: HistoryFilter,
    sealer: Sealer,
) -> tuple[list[TurnBlock], int | None]:
    """The blocks of the newest ``limit`` versions before ``start`` with a message
    that passes ``wanted``, reading messages newest version first until found.
    Sealed bodies cannot be prefiltered in SQL: each is opened and matched here."""
    prefilter, params = ("", []) if sealer.enabled else _prefilter(wanted)
    found = conn.execute(
        f"""
        SELECT added_in, removed_in, body, position FROM checked_messages
         WHERE agent_id = ? AND conversation = ? AND added_in < ? {prefilter}
         ORDER BY added_in DESC, position
        """,
        (agent_id, conversation, start, *params),
    )
    rows = (
        (added, removed, sealer.open(body, MESSAGE, agent_id, conversation, position,
                                     table="messages"))
        for added, removed, body, position in found
    )  # fmt: skip
    matched: dict[int, list[dict[str, Any]]] = {}
    calls: dict[str, str] = {}
    next_before = None
    for version, group in _by_version(rows):
        messages = decode_messages(body for _, body in group)
        for message in messages:  # a result's call is in its turn, or in an earlier one
            _record_calls(message, calls)
        if wanted.tool:
            calls |= _earlier_calls(conn, agent_id, conversation, version, messages, calls, sealer)
        kept = [
            _marked(message, removed_in)
            for message, (removed_in, _) in zip(messages, group, strict=True)
            if wanted.matches(message, calls)
        ]
        if not kept:
            continue
        if len(matched) == limit:
            next_before = min(matched)
            break
        matched[version] = kept
    if not matched:
        return [], None
    marks = ", ".join("?" * len(matched))
    infos = [
        version_info(agent_id, row)
        for row in conn.execute(
            f"{VERSION_SELECT} WHERE agent_id = ? AND version IN ({marks}) ORDER BY version DESC",
            (agent_id, *matched),
        )
    ]
    blocks = [TurnBlock(info, matched[info.version], info.added) for info in infos]
    return blocks, next_before


def _prefilter(wanted: HistoryFilter) -> tuple[str, list[Any]]:
    """SQL that keeps a superset of the rows ``wanted`` passes, and its parameters.

    The stored body is compact JSON (``rows.StorableJSON``): a text with no
    character JSON escapes, and no letter SQL's ``lower`` cannot fold (ASCII
    only), occurs in it as it is; other texts are looked for in Python alone.
    A tool's results name no tool: they are matched through their calls, so with a
    tool every message is read (no clause may leave a call out).
    """
    clauses: list[str] = []
    params: list[Any] = []
    if wanted.tool:
        return "", params
    if wanted.role:
        clauses.append("role = ?")
        params.append(wanted.role)
    text = wanted.text
    if text and text.isascii() and text.isprintable() and json.dumps(text)[1:-1] == text:
        clauses.append("lower(body) LIKE ? ESCAPE '\\'")
        params.append(f"%{like_pattern(text.lower())}%")
    if wanted.errors:
        clauses.append("role IN ('tool', 'user') AND body LIKE '%Error%'")
    return "".join(f" AND {clause}" for clause in clauses), params


def _by_version(rows: Any) -> Iterator[tuple[int, list[tuple[int | None, str]]]]:
    """Rows ``(added_in, removed_in, body)`` grouped by ``added_in``, in the order they come."""
    current: int | None = None
    group: list[tuple[int | None, str]] = []
    for added_in, removed_in, body in rows:
        if added_in != current:
            if current is not None:
                yield current, group
            current, group = added_in, []
        group.append((removed_in, body))
    if current is not None:
        yield current, group


def _earlier_calls(
    conn: Conn,
    agent_id: str,
    conversation: str,
    version: int,
    messages: list[dict[str, Any]],
    calls: dict[str, str],
    sealer: Sealer,
) -> dict[str, str]:
    """The tool names of results in ``messages`` whose call an earlier version made
    (a turn suspended for an approval, resumed in a later one)."""
    missing = [
        m["tool_call_id"]
        for m in messages
        if isinstance(m.get("tool_call_id"), str) and m["tool_call_id"] not in calls
    ]
    if not missing:
        return {}
    found: dict[str, str] = {}
    rows = conn.execute(
        """
        SELECT body, position FROM checked_messages
         WHERE agent_id = ? AND conversation = ? AND added_in < ? AND role = 'assistant'
         ORDER BY added_in DESC LIMIT 50
        """,
        (agent_id, conversation, version),
    )
    bodies = (
        sealer.open(body, MESSAGE, agent_id, conversation, position, table="messages")
        for body, position in rows
    )
    for message in decode_messages(bodies):
        _record_calls(message, found)
    return {call: found[call] for call in missing if call in found}


def _messages_added(
    conn: Conn, agent_id: str, conversation: str, versions: list[VersionInfo], sealer: Sealer
) -> Iterator[tuple[int, int | None, dict[str, Any]]]:
    """``(added_in, removed_in, message)`` of the messages ``versions`` (turns and
    compactions of the conversation) added to it, by version and position.

    No index leads with ``added_in``, and a query by it reads every row of the
    conversation. So the rows are read from the conversation's end backwards (its
    primary key, by position), where a recent version's messages are, a few more
    than the versions added (``added`` counts exactly the rows each inserted), and
    further back, twice as many at a time, only until all are found: the first
    page of a long history costs what a short one's does.
    """
    wanted = {v.version for v in versions}
    expected = sum(v.added for v in versions)
    found: list[tuple[Any, ...]] = []
    last: tuple[Any, ...] | None = None
    batch = expected + 8
    while len(found) < expected:
        after = "" if last is None else "AND (position, added_in) < (?, ?)"
        rows = conn.execute(
            f"""
            SELECT added_in, position, removed_in, body FROM checked_messages
             WHERE agent_id = ? AND conversation = ? {after}
             ORDER BY position DESC, added_in DESC LIMIT ?
            """,
            (agent_id, conversation, *(() if last is None else last), batch),
        ).fetchall()
        found += [row for row in rows if row[0] in wanted]
        if len(rows) < batch:
            break
        last, batch = (rows[-1][1], rows[-1][0]), batch * 2
    found.sort(key=lambda row: (row[0], row[1]))
    messages = decode_messages(
        sealer.open(body, MESSAGE, agent_id, conversation, position, table="messages")
        for _, position, _, body in found
    )
    for (added_in, _, removed_in, _), message in zip(found, messages, strict=True):
        yield int(added_in), removed_in, message


def _marked(message: dict[str, Any], removed_in: int | None) -> dict[str, Any]:
    if removed_in is not None:
        message["durable"] = {"removed_in": int(removed_in)}
    return message


def _with_compactions(
    conn: Conn, agent_id: str, conversation: str, blocks: list[TurnBlock]
) -> list[TurnBlock]:
    """The blocks, each compaction's with the number of originals it replaced."""
    versions = [b.info.version for b in blocks if b.info.kind == "compaction"]
    if not versions:
        return blocks
    marks = ", ".join("?" * len(versions))
    counts = dict(
        conn.execute(
            f"SELECT version, messages FROM checked_compactions "
            f"WHERE agent_id = ? AND version IN ({marks})",
            (agent_id, *versions),
        ).fetchall()
    )
    return [
        replace(b, compacted=int(counts.get(b.info.version, 0))) if b.info.kind == "compaction"
        else b
        for b in blocks
    ]  # fmt: skip
