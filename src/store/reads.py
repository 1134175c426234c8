"""The Store's longer reads: the agents, one conversation's history, pages of ids, code versions.

Each is one read transaction on the engine; :class:`~effectful_durable.Store`
documents them.
"""

from __future__ import annotations

import json
from typing import Any

from .checked import checked_conversation, checked_rows, checked_version
from .engine.seam import Conn, Database
from .ids import validate_agent_id, validate_conversation_id
from .inflight import AgentInFlight, read_in_flight
from .parts import conversation_fields
from .records import AgentRecord
from .rows import code_version_in, decode_messages, searchable_text, state_at, storable, utc
from .sealing import MESSAGE, PLAIN, STATE, Sealer

#: Ids bound in one ``IN (...)`` list: far below SQLite's 32,766 and PostgreSQL's 65,535.
IN_LIST = 1000


def agents(conn: Conn) -> list[AgentRecord]:
    """Every agent in the database, by id."""
    rows: list[tuple[Any, ...]] = conn.execute(
        """
        SELECT agent_id, version, created_at, updated_at,
               (SELECT count(*) FROM messages AS m
                 WHERE m.agent_id = a.agent_id AND m.removed_in IS NULL),
               (SELECT s.subject FROM checked_subjects AS s
                 WHERE s.agent_id = a.agent_id AND s.conversation = '')
          FROM checked_agents AS a ORDER BY agent_id
        """
    ).fetchall()
    return [
        AgentRecord(agent_id, version, messages, utc(created), utc(updated), subject=subject)
        for agent_id, version, created, updated, messages, subject in rows
    ]


def history(
    db: Database,
    agent_id: str,
    version: int | None,
    conversation: str,
    include_compacted: bool,
    code_versions: bool,
    *,
    sealer: Sealer = PLAIN,
) -> list[dict[str, Any]]:
    """Store.history: one conversation's active messages at ``version``."""
    with db.reading() as conn:
        version, _ = checked_rows(
            db,
            conn,
            agent_id,
            version,
            "messages",
            "conversation = ? AND added_in <= ?",
            conversation,
            version,
        )
        checked_conversation(conn, agent_id, conversation, version)
        marks = _code_version_marks(conn, agent_id) if code_versions else {}
        if not include_compacted:
            bodies = conn.execute(
                """
                SELECT body, added_in, position FROM checked_messages
                 WHERE agent_id = ?1 AND conversation = ?3 AND added_in <= ?2
                   AND (removed_in IS NULL OR removed_in > ?2)
                 ORDER BY position
                """,
                (agent_id, version, conversation),
            ).fetchall()
            with sealer.one_look():
                messages = decode_messages(
                    sealer.open(body, MESSAGE, agent_id, conversation, position, table="messages")
                    for body, _, position in bodies
                )
            for message, (_, added_in, _) in zip(messages, bodies, strict=True):
                _mark_code_version(message, marks.get(added_in))
            return messages
        # Which originals a compaction replaced is read from the compactions rows.
        db.check_rows(conn, "compactions", "agent_id = ?", (agent_id,))
        rows: list[tuple[Any, ...]] = conn.execute(
            """
            SELECT m.body, c.version, s.messages, m.added_in, m.position
              FROM checked_messages AS m
              LEFT JOIN compactions AS c
                ON c.agent_id = m.agent_id AND c.version = m.removed_in
               AND m.position BETWEEN c.first_position AND c.last_position
              LEFT JOIN checked_compactions AS s
                ON s.agent_id = m.agent_id AND s.version = m.added_in
               AND s.summary_id = m.message_id
             WHERE m.agent_id = ?1 AND m.conversation = ?3 AND m.added_in <= ?2
               AND (m.removed_in IS NULL OR m.removed_in > ?2 OR c.version IS NOT NULL)
             ORDER BY m.position, m.added_in
            """,
            (agent_id, version, conversation),
        ).fetchall()
    with sealer.one_look():
        messages = decode_messages(
            sealer.open(row[0], MESSAGE, agent_id, conversation, row[4], table="messages")
            for row in rows
        )
    for message, (_, compacted_in, summary_of, added_in, _) in zip(messages, rows, strict=True):
        if compacted_in is not None:
            message["durable"] = {"compacted_in": compacted_in}
        elif summary_of is not None:
            message["durable"] = {"summary_of": summary_of}
        _mark_code_version(message, marks.get(added_in))
    return messages


def _code_version_marks(conn: Conn, agent_id: str) -> dict[int, str]:
    """The code version of each of the agent's versions committed with one."""
    rows = conn.execute(
        "SELECT version, detail FROM checked_versions WHERE agent_id = ? AND detail IS NOT NULL",
        (agent_id,),
    )
    found = ((version, code_version_in(detail)) for version, detail in rows)
    return {version: code for version, code in found if code is not None}


def _mark_code_version(message: dict[str, Any], code_version: str | None) -> None:
    if code_version is not None:
        message["durable"] = {**message.get("durable", {}), "code_version": code_version}


def agent_ids(conn: Conn, after: str | None, limit: int) -> list[str]:
    """Store.agent_ids: a page of agent ids, in order, after ``after``."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        msg = f"limit must be an int >= 1, not {limit!r}"
        raise ValueError(msg)
    if after is None:
        rows = conn.execute(
            "SELECT agent_id FROM checked_agents ORDER BY agent_id LIMIT ?", (limit,)
        )
    else:
        rows = conn.execute(
            "SELECT agent_id FROM checked_agents WHERE agent_id > ? ORDER BY agent_id LIMIT ?",
            (after, limit),
        )
    return [agent_id for (agent_id,) in rows]


def code_versions(db: Database, agent_ids: list[str]) -> dict[str, str | None]:
    """Store.code_versions: the code version of each agent's latest turn, one read per
    :data:`IN_LIST` agents."""
    found: dict[str, str | None] = dict.fromkeys(agent_ids)
    for start in range(0, len(agent_ids), IN_LIST):
        chunk = agent_ids[start : start + IN_LIST]
        marks = ", ".join("?" * len(chunk))
        with db.reading() as conn:
            rows = conn.execute(
                f"""
                SELECT agent_id, detail FROM checked_versions
                 WHERE (agent_id, version) IN (
                    SELECT agent_id, max(version) FROM versions
                     WHERE agent_id IN ({marks}) AND kind = 'turn' GROUP BY agent_id)
                """,
                chunk,
            ).fetchall()
        for agent_id, detail in rows:
            found[agent_id] = code_version_in(detail)
    return found


def search_compacted(
    db: Database,
    agent_id: str,
    query: str,
    limit: int,
    conversation: str,
    *,
    sealer: Sealer = PLAIN,
) -> list[dict[str, Any]]:
    """Store.search_compacted: compacted messages that match ``query``, best first."""
    validate_agent_id(agent_id)  # PostgreSQL's text cannot even hold some invalid ids
    validate_conversation_id(conversation)
    words = query.replace("\0", " ").split()
    if not words or not storable(" ".join(words)):  # a lone surrogate is in no stored text
        return []
    if sealer.enabled:
        return _search_sealed(db, sealer, agent_id, words, limit, conversation)
    with db.reading() as conn:
        bodies = db.search_compacted(conn, agent_id, words, limit, conversation)
    return decode_messages(bodies)


def _search_sealed(
    db: Database, sealer: Sealer, agent_id: str, words: list[str], limit: int, conversation: str
) -> list[dict[str, Any]]:
    """search_compacted where content is sealed: no index of plain words exists, so the
    conversation's compacted originals are opened and matched here, every word as a
    case-insensitive substring, the most mentions first (then the newest)."""
    with db.reading() as conn:
        rows = conn.execute(
            """
            SELECT m.position, m.body FROM checked_messages AS m
              JOIN compactions AS c
                ON c.agent_id = m.agent_id AND c.version = m.removed_in
               AND m.position BETWEEN c.first_position AND c.last_position
             WHERE m.agent_id = ?1 AND m.conversation = ?2
            """,
            (agent_id, conversation),
        ).fetchall()
    wanted = [word.casefold() for word in words]
    found: list[tuple[int, float, dict[str, Any]]] = []
    with sealer.one_look():
        opened = [
            sealer.open(body, MESSAGE, agent_id, conversation, position, table="messages")
            for position, body in rows
        ]
    for (position, _), plain in zip(rows, opened, strict=True):
        message = json.loads(plain)
        text = searchable_text(message).casefold()
        if all(word in text for word in wanted):
            found.append((sum(text.count(word) for word in wanted), position, message))
    found.sort(key=lambda hit: (-hit[0], -hit[1]))
    return [message for _, _, message in found[:limit]]


def state(
    db: Database,
    agent_id: str,
    version: int | None,
    conversation: str,
    *,
    sealer: Sealer = PLAIN,
) -> dict[str, Any]:
    """Store.state: the shared fields, and ``conversation``'s own, at ``version``."""
    validate_conversation_id(conversation)
    with db.reading() as conn:
        version = checked_version(db, conn, agent_id, version)
        shared = state_at(conn, agent_id, version)
        if shared is not None:
            shared = sealer.open(shared, STATE, agent_id, table="versions", version=version)
        own = conversation_fields.state_at(conn, agent_id, conversation, version, sealer)
    values: dict[str, Any] = json.loads(shared) if shared is not None else {}
    return values | json.loads(own) if own is not None else values


def in_flight(db: Database, agent_ids: list[str], sealer: Sealer = PLAIN) -> list[AgentInFlight]:
    """Store.in_flight: what the agents hold at their latest versions, set-wise."""
    if len(agent_ids) > IN_LIST:
        msg = f"in_flight reads at most {IN_LIST} agents a call, not {len(agent_ids)}"
        raise ValueError(msg)
    if not agent_ids:
        return []
    with sealer.one_look(), db.reading() as conn:
        return read_in_flight(conn, agent_ids, sealer)
