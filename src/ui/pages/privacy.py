"""Forgetting a person: what holds a subject's content.

``/?subject=`` (the agents list's subject filter) lists what ``Store.holders``
returns, each with what it holds now.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response

from ...errors import NotFoundError
from ...store import Store
from ...store.records import ConversationInfo
from . import render, store_of


@dataclass
class Holding:
    """One thing an erasure reaches, with what it holds now: an agent whole
    (``conversation`` None) or one of its conversations."""

    agent_id: str
    conversation: str | None
    version: int | None = None  # the latest; None: no turn committed yet
    conversations: list[ConversationInfo] = field(default_factory=list)
    approvals: int = 0
    events: int = 0
    alarms: int = 0
    handoffs: int = 0
    subject: str | None = None  # the agent's own

    @property
    def messages(self) -> int:
        """The active messages it holds (of its conversations)."""
        return sum(c.messages for c in self.conversations)


def holdings(store: Store, holders: list[tuple[str, str | None]]) -> list[Holding]:
    """What each of ``holders`` (``Store.holders``' pairs) holds now: a few reads each."""
    turns = store.handoffs()
    found = []
    for agent_id, conversation in holders:
        held = Holding(agent_id, conversation, subject=store.subjects(agent_id).get(None))
        try:
            held.version = store.version_page(agent_id, limit=1)[0].version
            talks = store.conversations(agent_id)
        except NotFoundError:  # a subject named before the agent's first turn
            talks = []
        mine = [a for a in store.approvals(agent_id) if conversation in (None, a.conversation)]
        held.conversations = [c for c in talks if conversation in (None, c.conversation)]
        held.approvals = len(mine)
        held.handoffs = sum(
            1 for h in turns if h.agent_id == agent_id and conversation in (None, h.conversation)
        )
        if conversation is None:  # events and alarms are the agent's, not a conversation's
            held.events = len(store.events(agent_id))
            held.alarms = len(store.alarms(agent_id))
        found.append(held)
    return found


# -- what holds a subject -----------------------------------------------------------


def subject_page(request: Request, subject: str) -> Response:
    """``/?subject=``: what holds the subject's content (what erasing it would reach)."""
    store = store_of(request)
    held = holdings(store, store.holders(subject))
    context = {"subject": subject, "held": held}
    return render(request, "subject.html", context)
