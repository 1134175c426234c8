"""An agent: its conversations, what waits for it, and its history as a timeline of turns.

The timeline comes from ``Store.timeline`` (one block per committed version,
newest first, paged, filtered there); this module only lays each block's messages
out for the template: every tool call beside its result, long texts folded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...errors import NotFoundError
from ...store.browse import HistoryFilter, is_error
from ...store.history import message_text
from . import BadRequest, choice, flag, number, render, required, store_of, text
from .check import breaks_of, last_check

#: Turns per page of the timeline.
PER_PAGE = 20
#: The roles the filter offers.
ROLES = ("user", "assistant", "tool", "system")


@dataclass
class Call:
    """A tool call of the model, and its result when the same block holds it."""

    call_id: str
    name: str
    arguments: Any
    result: str | None = None
    error: bool = False
    removed_in: int | None = None


@dataclass
class Entry:
    """One message as the timeline shows it."""

    role: str
    text: str
    calls: list[Call] = field(default_factory=list)
    error: bool = False
    removed_in: int | None = None
    summary_of: int | None = None


def entries(messages: list[dict[str, Any]]) -> list[Entry]:
    """``messages`` as the page shows them, each tool result moved beside its call."""
    shown: list[Entry] = []
    calls: dict[str, Call] = {}
    for message in messages:
        mark = message.get("durable") or {}
        removed = mark.get("removed_in")
        role = str(message.get("role", "?"))
        call_id = message.get("tool_call_id")
        if role == "tool" and isinstance(call_id, str) and call_id in calls:
            call = calls[call_id]
            call.result, call.error = message_text(message), is_error(message)
            continue
        entry = Entry(role, _content(message), error=is_error(message), removed_in=removed)
        for raw in message.get("tool_calls") or ():
            function = raw.get("function") if isinstance(raw, dict) else None
            if not isinstance(function, dict):
                continue
            call = Call(str(raw.get("id")), str(function.get("name")), _arguments(function))
            call.removed_in = removed
            calls[call.call_id] = call
            entry.calls.append(call)
        shown.append(entry)
    return shown


def _content(message: dict[str, Any]) -> str:
    """The message's text without its tool-call lines (those are shown as calls)."""
    if message.get("tool_calls"):
        message = {k: v for k, v in message.items() if k != "tool_calls"}
    return message_text(message)


def _arguments(function: dict[str, Any]) -> Any:
    raw = function.get("arguments")
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def agent(request: Request) -> Response:
    """``/agent?id=``: the agent's timeline in one conversation."""
    store = store_of(request)
    agent_id = required(request, "id")
    conversation = text(request, "conversation") or "default"
    before = number(request, "before")
    wanted = HistoryFilter(
        role=choice(request, "role", ROLES) or None,
        tool=text(request, "tool") or None,
        text=text(request, "text") or None,
        errors=flag(request, "errors"),
    )
    timeline = store.timeline(
        agent_id, conversation=conversation, before=before, limit=PER_PAGE, filter=wanted
    )
    conversations = store.conversations(agent_id)
    if conversation != "default" and conversation not in {c.conversation for c in conversations}:
        msg = f"agent {agent_id!r} has no conversation {conversation!r}"
        raise NotFoundError(msg)
    context = {
        "agent_id": agent_id,
        "timeline": timeline,
        "blocks": [(block, entries(block.messages)) for block in timeline.blocks],
        "conversation": conversation,
        "conversations": conversations,
        "wanted": wanted,
        "roles": ROLES,
        "waiting": waiting_for(request, agent_id),
        "code_version": store.code_versions([agent_id])[agent_id],
        "subjects": store.subjects(agent_id),
        "breaks": breaks_of(last_check(request), agent_id),
    }
    return render(request, "agent.html", context)


def waiting_for(request: Request, agent_id: str) -> dict[str, Any]:
    """What waits for the agent: pending approvals, events, alarms, unfinished turns."""
    store = store_of(request)
    return {
        "approvals": store.approvals(agent_id),
        "events": store.events(agent_id),
        "alarms": store.alarms(agent_id),
        "handoffs": [h for h in store.handoffs() if h.agent_id == agent_id],
    }


def compacted(request: Request) -> Response:
    """``/agent/compacted?id=&version=``: the originals a compaction replaced (a fragment)."""
    store = store_of(request)
    agent_id = required(request, "id")
    version = number(request, "version")
    if version is None:
        msg = "the parameter 'version' is missing: this page needs it"
        raise BadRequest(msg)
    conversation = text(request, "conversation") or "default"
    originals = store.compacted(agent_id, version, conversation=conversation)
    context = {"entries": entries(originals), "version": version}
    return render(request, "_originals.html", context)
