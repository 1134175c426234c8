"""What a page of agents holds in flight, read in a few set-wise reads: their fields, the
tool calls and results of their active histories, their own fields per conversation
and their memory. ``effectful-durable check-upgrade`` reads a database this way."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .engine.seam import Conn
from .parts.approvals import DENIAL_OPENS
from .parts.memory import opened
from .rows import code_version_in, decode_messages, state_at
from .sealing import FIELDS, MESSAGE, PLAIN, STATE, Sealer

# Messages are stored as compact JSON (history.message_json): an assistant message that
# calls tools holds this text, and one that calls none does not.
# A tool result's JSON text names its call near its start or its end (effectful writes
# it after the content); reading that much of each result, not all of it, keeps a
# page's reads small (a result can be megabytes).
_RESULT_HEAD = 400
_CALL_ID = re.compile(r'"tool_call_id"\s*:\s*"((?:[^"\\]|\\.)*)"')
# A person's denial, as the resumed turn answers a denied call (parts/approvals.py),
# opens the result's text.
#: What the JSON text of an assistant message that calls tools holds.
_CALLS = '"tool_calls":[{'
_DENIED = re.compile(r'"text"\s*:\s*"' + re.escape(json.dumps(DENIAL_OPENS)[1:-1]))


@dataclass(frozen=True, slots=True)
class ConversationInFlight:
    """One conversation's active context, as far as a check needs it.

    ``calls`` are the tool calls its assistant messages made, ``(call id, tool name
    as the model called it)``; ``answered`` the call ids a tool result answers;
    ``fields`` the JSON of its own fields (declared per conversation), if any;
    ``denied`` the call ids answered by a person's denial (they never ran).

    .. versionadded:: 0.2.0
    """

    conversation: str
    calls: tuple[tuple[str, str], ...] = ()
    answered: frozenset[str] = frozenset()
    fields: str | None = None
    denied: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class AgentInFlight:
    """An agent's latest version as a check needs it: its fields (JSON), its
    conversations' tool calls and results, its memory's keys, and the code version
    its latest turn was committed with.

    .. versionadded:: 0.2.0
    """

    agent_id: str
    version: int
    state: str | None
    conversations: tuple[ConversationInFlight, ...]
    memory: dict[str, Any]
    code_version: str | None = None


def read_in_flight(
    conn: Conn, agent_ids: Sequence[str], sealer: Sealer = PLAIN
) -> list[AgentInFlight]:
    """The agents ``agent_ids`` (those that exist), in that order: eight reads in all
    (and one more for an agent whose latest state no kept version holds, or a tool
    result that names its call only in its middle).

    Each read takes the range of ids from the first to the last, an index range
    however many they are: pass a page of :meth:`Store.agent_ids
    <effectful_durable.Store.agent_ids>`, or any other agents in that range are read
    (and dropped) too. Where content is sealed, the active messages are read whole
    and opened: their text cannot be searched in SQL.
    """
    ids = list(agent_ids)
    wanted = set(ids)
    span = (min(ids), max(ids))

    def rows(sql: str) -> list[tuple[Any, ...]]:
        found: list[tuple[Any, ...]] = conn.execute(sql, span).fetchall()
        return [row for row in found if row[0] in wanted]

    versions = dict(
        rows("SELECT agent_id, version FROM checked_agents WHERE agent_id BETWEEN ? AND ?")
    )
    states = dict(
        rows(
            """
            SELECT agent_id, state FROM checked_versions
             WHERE (agent_id, version) IN (
                SELECT agent_id, max(version) FROM versions
                 WHERE agent_id BETWEEN ? AND ? AND state IS NOT NULL GROUP BY agent_id)
            """
        )
    )
    codes = {
        agent_id: code_version_in(detail)
        for agent_id, detail in rows(
            """
            SELECT agent_id, detail FROM checked_versions
             WHERE (agent_id, version) IN (
                SELECT agent_id, max(version) FROM versions
                 WHERE agent_id BETWEEN ? AND ? AND kind = 'turn' GROUP BY agent_id)
            """
        )
    }
    if sealer.enabled:
        states = {
            agent_id: sealer.open(state, STATE, agent_id, table="versions")
            for agent_id, state in states.items()
        }
    calls: dict[tuple[str, str], list[tuple[str, str]]] = defaultdict(list)
    if sealer.enabled:
        assistants = [
            (agent_id, conversation, body)
            for agent_id, conversation, _, body in _opened(rows, sealer, "assistant")
            if _CALLS in body
        ]
    else:
        assistants = rows(
            """
            SELECT agent_id, conversation, body FROM checked_messages
             WHERE agent_id BETWEEN ? AND ? AND removed_in IS NULL AND role = 'assistant'
               AND body LIKE '%"tool\\_calls":[{%' ESCAPE '\\'
            """
        )
    decoded = decode_messages(body for _, _, body in assistants)
    for (agent_id, conversation, _), message in zip(assistants, decoded, strict=True):
        for call in message.get("tool_calls") or []:
            name = (call.get("function") or {}).get("name")
            calls[agent_id, conversation].append((str(call.get("id")), str(name)))
    answered: dict[tuple[str, str], set[str]] = defaultdict(set)
    denied: dict[tuple[str, str], set[str]] = defaultdict(set)
    results = (
        _opened(rows, sealer, "tool")
        if sealer.enabled
        else rows(
            f"""
            SELECT agent_id, conversation, message_id,
                   CASE WHEN length(body) <= {2 * _RESULT_HEAD} THEN body
                        ELSE substr(body, 1, {_RESULT_HEAD}) || ' '
                             || substr(body, length(body) - {_RESULT_HEAD - 1}) END
              FROM checked_messages
             WHERE agent_id BETWEEN ? AND ? AND removed_in IS NULL AND role = 'tool'
            """
        )
    )
    for agent_id, conversation, message_id, text in results:
        head = text if not sealer.enabled else text[:_RESULT_HEAD] + " " + text[-_RESULT_HEAD:]
        named = _CALL_ID.search(head)
        if named is not None:
            call_id = json.loads(f'"{named[1]}"')
            answered[agent_id, conversation].add(call_id)
            if _DENIED.search(text, 0, _RESULT_HEAD) is not None:
                denied[agent_id, conversation].add(call_id)
            continue
        # Named in the middle of a long result, or not at all: rare, so read it whole.
        whole = (
            [(text,)]
            if sealer.enabled
            else conn.execute(
                """
            SELECT body FROM checked_messages
             WHERE agent_id = ? AND conversation = ? AND message_id = ? AND removed_in IS NULL
            """,
                (agent_id, conversation, message_id),
            ).fetchall()
        )
        for (body,) in whole:
            call_id = json.loads(body).get("tool_call_id")
            if call_id is not None:
                answered[agent_id, conversation].add(str(call_id))
                if _DENIED.search(body, 0, _RESULT_HEAD) is not None:
                    denied[agent_id, conversation].add(str(call_id))
    conversations: dict[str, set[str]] = defaultdict(set)
    for agent_id, conversation in rows(
        """
        SELECT agent_id, conversation FROM checked_conversations
         WHERE agent_id BETWEEN ? AND ? AND removed_in IS NULL
        """
    ):
        conversations[agent_id].add(conversation)
    fields: dict[tuple[str, str], str] = {}
    for agent_id, conversation, state in rows(
        """
        SELECT agent_id, conversation, state FROM checked_conversation_fields
         WHERE agent_id BETWEEN ? AND ? AND removed_in IS NULL
        """
    ):
        fields[agent_id, conversation] = sealer.open(
            state, FIELDS, agent_id, conversation, table="conversation_fields"
        )
        conversations[agent_id].add(conversation)
    memory: dict[str, dict[str, Any]] = defaultdict(dict)
    for agent_id, key, value in rows(
        """
        SELECT agent_id, key, value FROM checked_memory
         WHERE agent_id BETWEEN ? AND ? AND kind = 'key' AND removed_in IS NULL
        """
    ):
        memory[agent_id][key] = json.loads(opened(sealer, agent_id, "key", key, value))
    found: list[AgentInFlight] = []
    for agent_id in ids:
        if agent_id not in versions:
            continue
        state = states.get(agent_id)
        if state is None:  # no kept version holds one: what retention kept, if anything
            state = state_at(conn, agent_id, versions[agent_id])
            if state is not None:
                state = sealer.open(state, STATE, agent_id, table="retention")
        held = tuple(
            ConversationInFlight(
                name,
                tuple(calls.get((agent_id, name), ())),
                frozenset(answered.get((agent_id, name), ())),
                fields.get((agent_id, name)),
                frozenset(denied.get((agent_id, name), ())),
            )
            for name in sorted(conversations.get(agent_id, ()))
        )
        found.append(
            AgentInFlight(
                agent_id,
                versions[agent_id],
                state,
                held,
                memory.get(agent_id, {}),
                codes.get(agent_id),
            )
        )
    return found


def _opened(
    rows: Callable[[str], list[tuple[Any, ...]]], sealer: Sealer, role: str
) -> list[tuple[Any, ...]]:
    """The active messages of ``role`` of the agents read, each opened whole:
    ``(agent, conversation, message id, text)``."""
    found = rows(
        f"""
        SELECT agent_id, conversation, message_id, position, body FROM checked_messages
         WHERE agent_id BETWEEN ? AND ? AND removed_in IS NULL AND role = '{role}'
        """
    )
    return [
        (agent_id, conversation, message_id, sealer.open(body, MESSAGE, agent_id, conversation,
                                                           position, table="messages"))
        for agent_id, conversation, message_id, position, body in found
    ]  # fmt: skip
