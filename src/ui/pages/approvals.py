"""Approvals: the inbox across agents, one approval's page, and deciding it.

The inbox lists what waits for a person, oldest first, each with the tool, its
reason, its arguments, the last messages of the turn that asked, and the forms
that decide it; then the decided ones, newest first, filtered (the audit
trail, ``Store.decisions``). Deciding calls ``Store.approve`` or ``Store.deny``
under the name the page was started with (``--by``); the browser then goes to
the approval's page, which follows the turn's resumption live: waiting for the
other approvals of its turn, for a runner, or for its workflow's next run, and
then the resumed turn's messages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import Response

from ...errors import DurableError, InvalidDecisionError
from ...store import Store
from ...store.records import ApprovalInfo, ApprovalStatus
from ...store.rows import typed_json
from ..render import Problem, link
from . import (
    BadRequest,
    choice,
    done,
    number,
    pages_of,
    posted,
    refused,
    render,
    required,
    store_of,
    text,
    writer_of,
)
from .agent import Entry, entries

#: The most pending approvals the inbox shows (the oldest).
INBOX = 50
#: Decided approvals per page of the audit trail.
PER_PAGE = 50
#: The messages shown of the turn that asked.
LAST_MESSAGES = 5
#: The statuses the audit trail's filter offers.
DECIDED = ("approved", "denied", "cancelled")


@dataclass
class Resumption:
    """What became of a decided approval's suspended turn.

    ``state`` is ``"others"`` (other approvals of its turn wait: ``others``),
    ``"runner"`` (a runner resumes it), ``"workflow"`` (the workflow's next run
    does), ``"resumed"`` (in version ``version``: ``entries``), or ``"cancelled"``.
    """

    state: str
    version: int | None = None
    others: list[ApprovalInfo] = field(default_factory=list)
    workflow: str | None = None
    entries: list[Entry] = field(default_factory=list)


@dataclass
class Card:
    """One approval as a page shows it: the question, and what became of it."""

    approval: ApprovalInfo
    asked: list[Entry]
    schema: dict[str, Any] | None = None
    resumption: Resumption | None = None

    @property
    def edited(self) -> bool:
        """Whether the tool runs (or ran) with other arguments than the model's."""
        decided = self.approval.decided_arguments
        return decided is not None and decided != self.approval.arguments


def turn_entries(store: Store, approval: ApprovalInfo, version: int) -> list[Entry]:
    """The messages ``version`` added to the approval's conversation, as the page shows them."""
    timeline = store.timeline(
        approval.agent_id, conversation=approval.conversation, before=version + 1, limit=1
    )
    blocks = [b for b in timeline.blocks if b.info.version == version]
    return entries(blocks[0].messages) if blocks else []


def asked(store: Store, approval: ApprovalInfo) -> list[Entry]:
    """The last messages of the turn that asked: why the model called the tool."""
    shown = [e for e in turn_entries(store, approval, approval.suspended_in) if e.role != "system"]
    return shown[-LAST_MESSAGES:]


def resumption(store: Store, approval: ApprovalInfo, *, messages: bool) -> Resumption | None:
    """What became of the turn of a decided approval (None while it is pending).

    With ``messages``, a resumed turn's messages are read too.
    """
    if approval.status == "pending":
        return None
    if approval.status == "cancelled":
        return Resumption("cancelled")
    if approval.ended_in is not None:
        shown = turn_entries(store, approval, approval.ended_in) if messages else []
        return Resumption("resumed", version=approval.ended_in, entries=shown)
    suspension = store.suspension(approval.agent_id, approval.conversation)
    if suspension is None or suspension.suspended_in != approval.suspended_in:
        return Resumption("runner")  # resumed just now: the next look shows it
    if suspension.pending:
        return Resumption("others", others=suspension.pending)
    if suspension.workflow is not None:
        return Resumption("workflow", workflow=suspension.workflow)
    return Resumption("runner")


def card(store: Store, approval: ApprovalInfo, *, messages: bool = True) -> Card:
    """``approval`` with what a page shows of it."""
    pending = approval.status == "pending"
    return Card(
        approval,
        asked(store, approval),
        store.approval_parameters(approval.approval_id) if pending else None,
        resumption(store, approval, messages=messages),
    )


# -- pages ---------------------------------------------------------------------------


def inbox(request: Request) -> Response:
    """``/inbox``: the approvals that wait, oldest first, and the decided ones, filtered."""
    store = store_of(request)
    status = cast(ApprovalStatus | None, choice(request, "status", DECIDED) or None)
    by = text(request, "by").strip()
    agent = text(request, "agent").strip()
    since, until = day(request, "since"), day(request, "until")
    page = number(request, "page", 1) or 1
    waiting = store.approvals()
    decided = store.decisions(
        status=status,
        by=by or None,
        agent_text=agent or None,
        since=since,
        until=None if until is None else until + timedelta(days=1),
        page=page,
        per_page=PER_PAGE,
    )
    if page > decided.pages:
        msg = f"there is no page {page}: the {decided.total} decisions shown fill {decided.pages}"
        raise BadRequest(msg)
    context = {
        "cards": [card(store, a) for a in waiting[:INBOX]],
        "waiting_total": len(waiting),
        "decided": [card(store, a, messages=False) for a in decided.approvals],
        "found": decided,
        "wanted": {
            "status": status or "",
            "by": by,
            "agent": agent,
            "since": since.date().isoformat() if since else "",
            "until": until.date().isoformat() if until else "",
        },
        "statuses": DECIDED,
    }
    return render(request, "inbox.html", context)


def day(request: Request, name: str) -> datetime | None:
    """The parameter ``name``, a day ``YYYY-MM-DD``, as its first moment in UTC."""
    value = text(request, name)
    if not value:
        return None
    try:
        found = date.fromisoformat(value)
    except ValueError:
        msg = f"the parameter {name!r} must be a day as YYYY-MM-DD, not {value!r}"
        raise BadRequest(msg) from None
    return datetime(found.year, found.month, found.day, tzinfo=UTC)


def approval(request: Request) -> Response:
    """``/approval?id=``: one approval, its decision and its turn's resumption."""
    return approval_page(request, required(request, "id"))


def approval_page(
    request: Request, approval_id: str, problem: Problem | None = None, status: int = 200
) -> Response:
    """The page of ``approval_id``; ``problem`` is a decision the library refused."""
    store = store_of(request)
    found = store.approval(approval_id)
    context = {"shown": card(store, found), "problem": problem}
    here = link("/approval", id=approval_id)
    return render(request, "approval.html", context, status=status, here=here)


# -- decisions -------------------------------------------------------------------


def approve(request: Request) -> Response:
    """``POST /approve``: approve, with a note and the arguments as the form sent them."""
    approval_id = posted(request, "approval", required=True)
    form = f"approve-{approval_id}"
    note = posted(request, "note")
    try:
        arguments = edited_arguments(posted(request, "arguments"))
        decided = writer_of(request).approve(
            approval_id, by=pages_of(request).by, arguments=arguments, note=note or None
        )
    except DurableError as error:
        return refused_decision(request, approval_id, error, form)
    changed = decided.decided_arguments not in (None, decided.arguments)
    what = f"{decided.tool} of {decided.agent_id}"
    notice = f"Approved {what} as {decided.decided_by}" + (
        ", with the arguments you edited." if changed else "."
    )
    return done(request, link("/approval", id=approval_id), notice)


def deny(request: Request) -> Response:
    """``POST /deny``: deny, with the reason the model reads."""
    approval_id = posted(request, "approval", required=True)
    try:
        decided = writer_of(request).deny(
            approval_id, reason=posted(request, "reason"), by=pages_of(request).by
        )
    except DurableError as error:
        return refused_decision(request, approval_id, error, f"deny-{approval_id}")
    notice = f"Denied {decided.tool} of {decided.agent_id} as {decided.decided_by}."
    return done(request, link("/approval", id=approval_id), notice)


def edited_arguments(sent: str) -> Any:
    """The arguments of an approval's form: None when left empty (the model's own).

    Raises:
        InvalidDecisionError: They are not JSON (the library checks the rest).
    """
    if not sent.strip():
        return None
    try:
        return typed_json(sent)  # approve() refuses what does not fit the tool
    except ValueError as error:
        msg = f"the arguments are not valid JSON ({error}); nothing was changed"
        raise InvalidDecisionError(msg) from None


def refused_decision(
    request: Request, approval_id: str, error: DurableError, form: str
) -> Response:
    """The approval's page again with the library's error: on the form while the
    approval waits, above the page once it was decided (by whoever came first)."""

    def show(problem: Problem, status: int) -> Response:
        still = store_of(request).approval(approval_id).status == "pending"
        if not still:
            problem = Problem(problem.message, None, problem.values)
            status = 409
        return approval_page(request, approval_id, problem, status)

    return refused(request, error, show, form)
