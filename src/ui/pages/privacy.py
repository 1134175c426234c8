"""Forgetting a person: what holds a subject's content, erasing it, and the receipts.

``/?subject=`` (the agents list's subject filter) lists what ``Store.holders``
returns, each with what it holds now; ``/erase`` says exactly what an erasure of
a subject, an agent or one of its conversations would reach, and asks for its
name typed to confirm; ``POST /erase`` calls ``Store.erase`` (the ``erase``
command's function) through the read-write Store, then shows the receipt;
``/erasures`` lists ``Store.erasures()`` and ``/erasure?id=`` shows one receipt,
which never holds any of the erased content.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

from starlette.requests import Request
from starlette.responses import Response

from ...errors import DurableError, NotFoundError
from ...store import Store
from ...store.records import ConversationInfo, ErasureReceipt
from ..render import Problem, link
from . import (
    BadRequest,
    done,
    number,
    posted,
    refused,
    render,
    required,
    store_of,
    text,
    writer_of,
)

#: Receipts per page of ``/erasures``.
PER_PAGE = 50


@dataclass(frozen=True)
class Target:
    """What an erasure is asked to erase: a subject's holdings, an agent, or one of its
    conversations (the arguments of ``Store.erase``)."""

    subject: str | None = None
    agent_id: str | None = None
    conversation: str | None = None

    @property
    def typed(self) -> str:
        """What a person types to confirm it: the subject, the conversation's or the
        agent's id."""
        return self.subject or self.conversation or self.agent_id or ""

    @property
    def here(self) -> str:
        """The address of its erase page."""
        if self.subject is not None:
            return link("/erase", subject=self.subject)
        return link("/erase", id=self.agent_id, conversation=self.conversation)


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


def fingerprint(holders: list[tuple[str, str | None]]) -> str:
    """A short digest of what holds a subject: the erase form carries the one it showed,
    so that an erasure of more than the page showed is refused."""
    body = json.dumps(sorted([a, c or ""] for a, c in holders))
    return hashlib.sha256(body.encode()).hexdigest()[:16]


# -- what holds a subject -----------------------------------------------------------


def subject_page(request: Request, subject: str) -> Response:
    """``/?subject=``: what holds the subject's content (what erasing it would reach)."""
    store = store_of(request)
    held = holdings(store, store.holders(subject))
    context = {"subject": subject, "held": held}
    return render(request, "subject.html", context)


# -- erasing ------------------------------------------------------------------------


def erase_form(request: Request) -> Response:
    """``/erase?subject=`` or ``/erase?id=[&conversation=]``: what erasing it reaches, and
    the form that confirms it."""
    subject, agent_id = text(request, "subject"), text(request, "id")
    return erase_page(request, _target(subject, agent_id, text(request, "conversation")))


def _target(subject: str, agent_id: str, conversation: str) -> Target:
    """The erasure a request names, or a 400 page: a subject, or an agent (and one of its
    conversations)."""
    if bool(subject) == bool(agent_id):
        msg = "name a subject (subject=) or an agent (id=), not both and not neither"
        raise BadRequest(msg)
    if subject and conversation:
        msg = "a subject's erasure takes no conversation: it erases all the subject holds"
        raise BadRequest(msg)
    if subject:
        return Target(subject=subject)
    return Target(agent_id=agent_id, conversation=conversation or None)


def erase_page(
    request: Request, target: Target, problem: Problem | None = None, status: int = 200
) -> Response:
    """What erasing ``target`` reaches, counted now, and the typed confirmation."""
    store = store_of(request)
    holders: list[tuple[str, str | None]] = []
    if target.subject is not None:
        holders = store.holders(target.subject)
        held = holdings(store, holders)
    else:
        held = [_held(store, target)]
    context = {
        "target": target,
        "held": held,
        "fingerprint": fingerprint(holders),
        "problem": problem,
    }
    return render(request, "erase.html", context, status=status, here=target.here)


def _held(store: Store, target: Target) -> Holding:
    """What the agent (or its conversation) ``target`` names holds now; NotFoundError
    unless it holds anything."""
    held = holdings(store, [(target.agent_id or "", target.conversation)])[0]
    if held.version is None and not held.handoffs and not store.subjects(held.agent_id):
        msg = f"no agent {held.agent_id!r} (the agents list shows them)"
        raise NotFoundError(msg)
    if held.conversation is not None and not held.conversations:
        msg = f"agent {held.agent_id!r} has no conversation {held.conversation!r}"
        raise NotFoundError(msg)
    return held


def erase(request: Request) -> Response:
    """``POST /erase``: ``Store.erase`` once the name was typed, then the receipt."""
    target = _target(
        posted(request, "subject"), posted(request, "agent"), posted(request, "conversation")
    )
    writer = writer_of(request)
    try:
        if posted(request, "typed") != target.typed:
            msg = f"type {target.typed!r} to confirm; nothing was erased"
            raise DurableError(msg)
        if target.subject is not None:
            now = writer.holders(target.subject)
            if fingerprint(now) != posted(request, "holders"):
                msg = (
                    f"what the subject holds changed since the page was shown (now "
                    f"{_holders_said(now)}); nothing was erased. Look at the list again."
                )
                raise DurableError(msg)
        else:  # only what its page could show
            _held(store_of(request), target)
        receipt = writer.erase(
            subject=target.subject, agent=target.agent_id, conversation=target.conversation
        )
    except DurableError as error:
        return refused(request, error, lambda p, s: erase_page(request, target, p, s), "erase")
    notice = f"Erased {_erased(receipt)}; receipt {receipt.erasure_id} kept."
    if receipt.scrubbed_at is None:
        notice += " The files are not scrubbed yet: the next erasure scrubs them first."
    return done(request, link("/erasure", id=receipt.erasure_id), notice)


def _holders_said(holders: list[tuple[str, str | None]]) -> str:
    agents = sum(1 for _, c in holders if c is None)
    talks = len(holders) - agents
    return f"{_count(agents, 'agent')} and {_count(talks, 'conversation')}"


def _erased(receipt: ErasureReceipt) -> str:
    rows = sum(receipt.counts.values())
    return (
        f"{_count(len(receipt.agents), 'agent')} and "
        f"{_count(len(receipt.conversations), 'conversation')} ({_count(rows, 'row')})"
    )


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


# -- the receipts -----------------------------------------------------------------------


def erasures(request: Request) -> Response:
    """``/erasures``: every erasure's receipt, newest first, a page at a time."""
    receipts = store_of(request).erasures()[::-1]
    page = number(request, "page", 1) or 1
    pages = max(1, -(-len(receipts) // PER_PAGE))
    if page > pages:
        msg = f"there is no page {page}: the {len(receipts)} receipts fill {pages}"
        raise BadRequest(msg)
    context = {
        "receipts": receipts[(page - 1) * PER_PAGE : page * PER_PAGE],
        "total": len(receipts),
        "page": page,
        "pages": pages,
    }
    return render(request, "erasures.html", context)


def erasure(request: Request) -> Response:
    """``/erasure?id=``: one receipt, whole (none of what was erased)."""
    wanted = required(request, "id")
    receipts = store_of(request).erasures()
    by_digest = {r.digest: r.erasure_id for r in receipts}
    for receipt in receipts:
        if receipt.erasure_id == wanted:
            context = {"receipt": receipt, "previous": by_digest.get(receipt.previous or "")}
            return render(request, "erasure.html", context)
    msg = f"no erasure {wanted!r} (the erasures page lists them)"
    raise NotFoundError(msg)
