"""The Store's actions besides deciding, each with the page that says what it will do.

Rollback and fork (``/version``: what a rollback to that version would change,
and a fork of it into a new agent), re-arming a dead alarm or event and
cancelling an alarm (buttons of the waiting work page), sending an event
(``/send-event``), resetting a workflow from a step (``/reset-workflow``: the
dry run's report first) and deleting a conversation (``/delete-conversation``:
typed confirmation). Each calls the Store function of the matching command
(``rollback``, ``fork``, ``rearm``, ``send-event``, ``reset-workflow``,
``delete-conversation``), so the page and the command line share one code path
and one set of errors. Deleting an agent, ``prune`` and ``vacuum`` are not
offered: they destroy versions for good, and stay on the command line. Erasing
for good what a person's content is (``erase``) is offered, in ``privacy``.
"""

from __future__ import annotations

import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...errors import DurableError, InvalidEventError, NotFoundError
from ...store.rows import typed_json
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
from .waiting import waiting_page

# -- rollback and fork ------------------------------------------------------------


def version(request: Request) -> Response:
    """``/version?id=&version=``: roll the agent back to this version, or fork it."""
    version = number(request, "version")
    if version is None:
        msg = "the parameter 'version' is missing: this page needs it"
        raise BadRequest(msg)
    return version_page(request, required(request, "id"), version)


def version_page(
    request: Request,
    agent_id: str,
    version: int,
    problem: Problem | None = None,
    status: int = 200,
) -> Response:
    """The page of one version: what a rollback to it changes, and the fork form."""
    store = store_of(request)
    latest = store.version_page(agent_id, limit=1)[0].version
    # The diff refuses a version the agent does not have, or no longer has (pruned).
    changes = store.diff(agent_id, latest, version, limit=0) if version != latest else None
    (info,) = store.version_page(agent_id, before=version + 1, limit=1)
    context = {
        "agent_id": agent_id,
        "info": info,
        "latest": latest,
        "changes": changes,
        "problem": problem,
    }
    here = link("/version", id=agent_id, version=version)
    return render(request, "version.html", context, status=status, here=here)


def _version_of_form(request: Request) -> tuple[str, int]:
    agent_id = posted(request, "agent", required=True)
    sent = posted(request, "version", required=True)
    if not sent.isdigit() or len(sent) > 18:
        msg = f"the field 'version' must be a whole number, not {sent!r}"
        raise BadRequest(msg)
    return agent_id, int(sent)


def rollback(request: Request) -> Response:
    """``POST /rollback``: ``Store.rollback``, then the agent's versions."""
    agent_id, version = _version_of_form(request)
    try:
        new = writer_of(request).rollback(agent_id, version)
    except DurableError as error:
        return refused(
            request,
            error,
            lambda problem, status: version_page(request, agent_id, version, problem, status),
            "rollback",
        )
    notice = f"{agent_id}: version {new} committed, equal to version {version}."
    return done(request, link("/versions", id=agent_id), notice)


def fork(request: Request) -> Response:
    """``POST /fork``: ``Store.fork`` into a new agent id, then the new agent's versions."""
    agent_id, version = _version_of_form(request)
    new_id = posted(request, "new_id")
    try:
        forked = writer_of(request).fork(agent_id, version, new_id)
    except DurableError as error:
        return refused(
            request,
            error,
            lambda problem, status: version_page(request, agent_id, version, problem, status),
            "fork",
        )
    notice = (
        f"{forked.agent_id}: version 1 committed, a copy of {agent_id} version "
        f"{forked.source_version} ({forked.messages} messages)."
    )
    return done(request, link("/versions", id=forked.agent_id), notice)


# -- alarms and events ---------------------------------------------------------------


def rearm(request: Request) -> Response:
    """``POST /rearm``: a dead alarm or event pending again, due now (``Store.rearm_alarm``)."""
    alarm_id = posted(request, "alarm", required=True)
    try:
        alarm = writer_of(request).rearm_alarm(alarm_id)
    except DurableError as error:
        return refused(request, error, lambda p, s: _waiting_again(request, p, s), None)
    notice = f"{alarm_id} of {alarm.agent_id}: pending again, due now; a runner delivers it."
    return done(request, "/waiting", notice)


def cancel_alarm(request: Request) -> Response:
    """``POST /cancel-alarm``: cancel a pending or dead alarm (``Store.cancel_alarm``)."""
    alarm_id = posted(request, "alarm", required=True)
    agent_id = posted(request, "agent", required=True)
    try:
        if not writer_of(request).cancel_alarm(alarm_id, agent_id=agent_id):
            msg = (
                f"no pending or dead alarm {alarm_id!r} of agent {agent_id!r} (it was "
                "delivered or cancelled meanwhile); nothing was changed"
            )
            raise NotFoundError(msg)
    except DurableError as error:
        return refused(request, error, lambda p, s: _waiting_again(request, p, s), None)
    return done(request, "/waiting", f"{alarm_id} of {agent_id}: cancelled.")


def _waiting_again(request: Request, problem: Problem, status: int) -> Response:
    return waiting_page(request, problem, status)  # the page of these buttons


def send_event_form(request: Request) -> Response:
    """``/send-event[?id=]``: the form that sends an event to an agent's inbox."""
    return send_event_page(request, text(request, "id"))


def send_event_page(
    request: Request, agent_id: str, problem: Problem | None = None, status: int = 200
) -> Response:
    """The send-event form (for ``agent_id``, or for any agent when it is empty)."""
    if agent_id:
        store_of(request).version_page(agent_id, limit=1)  # a 404 for an unknown agent
    context = {"agent_id": agent_id, "problem": problem}
    here = link("/send-event", id=agent_id or None)
    return render(request, "send_event.html", context, status=status, here=here)


def send_event(request: Request) -> Response:
    """``POST /send-event``: ``Store.send_event``, then the events inbox."""
    agent_id = posted(request, "agent")
    fixed = posted(request, "fixed") == "1"  # the form named its agent
    key = posted(request, "key") or None
    started = time.time()
    try:
        payload = event_payload(posted(request, "payload"))
        event = writer_of(request).send_event(
            agent_id,
            posted(request, "name"),
            payload,
            key=key,
            create=posted(request, "create") == "1",
        )
    except DurableError as error:
        return refused(
            request,
            error,
            lambda p, s: send_event_page(request, agent_id if fixed else "", p, s),
            "send-event",
        )
    if event.sent_at.timestamp() < started:  # the key's earlier event came back
        when = f"{event.sent_at:%Y-%m-%d %H:%M:%S} UTC"
        notice = (
            f"{event.event_id}: sent before with key {key!r}, at {when} ({event.status}); "
            "nothing was sent again."
        )
    elif event.taken_by is not None:
        notice = (
            f"{event.event_id}: {event.name!r} to {event.agent_id} taken by "
            f"{event.taken_by}, which goes on when the workflow runs again."
        )
    else:
        notice = (
            f"{event.event_id}: {event.name!r} to {event.agent_id} pending; a runner delivers it."
        )
    return done(request, "/waiting#events", notice)


def event_payload(sent: str) -> Any:
    """The payload of the send-event form: null when empty.

    Raises:
        InvalidEventError: It is not JSON (the library checks the rest).
    """
    if not sent.strip():
        return None
    try:
        return typed_json(sent)
    except ValueError as error:
        msg = f"the payload is not valid JSON ({error}); nothing was sent"
        raise InvalidEventError(msg) from None


# -- workflows and conversations -------------------------------------------------------


def reset_workflow_form(request: Request) -> Response:
    """``/reset-workflow?name=&from=``: what a reset would do (the dry run), and its form."""
    start = number(request, "from", 1) or 1
    return reset_page(request, required(request, "name"), start)


def reset_page(
    request: Request, name: str, start: int, problem: Problem | None = None, status: int = 200
) -> Response:
    """The dry run's report of resetting ``name`` from step ``start``, and the form."""
    store = store_of(request)
    plan = store.reset_workflow(name, start, dry_run=True)
    steps = [s for s in store.steps(name) if s.number >= start]
    context = {"name": name, "plan": plan, "steps": steps, "problem": problem}
    here = link("/reset-workflow", name=name, **{"from": start})
    return render(request, "reset_workflow.html", context, status=status, here=here)


def reset_workflow(request: Request) -> Response:
    """``POST /reset-workflow``: ``Store.reset_workflow``, after the same dry run again."""
    name = posted(request, "name", required=True)
    sent = posted(request, "from", required=True)
    if not sent.isdigit() or not 1 <= int(sent) <= 10**9:
        msg = f"the field 'from' must be a step number from 1, not {sent!r}"
        raise BadRequest(msg)
    start = int(sent)
    writer = writer_of(request)
    try:
        plan = writer.reset_workflow(name, start, dry_run=True)
        if plan.deleted and posted(request, "delete") != "1":
            names = ", ".join(repr(agent_id) for agent_id in plan.deleted)
            msg = (
                f"the reset would delete {names} (created by the steps it forgets) with all "
                "their versions, for good; tick the box to confirm. Nothing was changed."
            )
            raise DurableError(msg)
        reset = writer.reset_workflow(name, start)
    except DurableError as error:
        return refused(
            request,
            error,
            lambda p, s: reset_page(request, name, start, p, s),
            "reset-workflow",
        )
    parts = [f"{name}: steps {start} and later forgotten ({reset.steps})."]
    parts += [f"{agent_id} rolled back." for agent_id in reset.rolled_back]
    parts += [f"{agent_id} deleted (the workflow created it)." for agent_id in reset.deleted]
    return done(request, "/waiting#workflows", " ".join(parts))


def delete_conversation_form(request: Request) -> Response:
    """``/delete-conversation?id=&conversation=``: what deleting it does, and the form."""
    agent_id = required(request, "id")
    return delete_page(request, agent_id, required(request, "conversation"))


def delete_page(
    request: Request,
    agent_id: str,
    conversation: str,
    problem: Problem | None = None,
    status: int = 200,
) -> Response:
    """What deleting one conversation of the agent does, and its typed confirmation."""
    store = store_of(request)
    found = {c.conversation: c for c in store.conversations(agent_id)}
    if conversation not in found:
        msg = f"agent {agent_id!r} has no conversation {conversation!r}"
        raise NotFoundError(msg)
    latest = store.version_page(agent_id, limit=1)[0].version
    context = {
        "agent_id": agent_id,
        "conversation": found[conversation],
        "latest": latest,
        "problem": problem,
    }
    here = link("/delete-conversation", id=agent_id, conversation=conversation)
    return render(request, "delete_conversation.html", context, status=status, here=here)


def delete_conversation(request: Request) -> Response:
    """``POST /delete-conversation``: ``Store.delete_conversation``, once its id was typed."""
    agent_id = posted(request, "agent", required=True)
    conversation = posted(request, "conversation", required=True)
    try:
        if posted(request, "typed") != conversation:
            msg = f"type the conversation's id, {conversation!r}, to confirm; nothing was deleted"
            raise DurableError(msg)
        new = writer_of(request).delete_conversation(agent_id, conversation)
    except DurableError as error:
        return refused(
            request,
            error,
            lambda p, s: delete_page(request, agent_id, conversation, p, s),
            "delete-conversation",
        )
    notice = (
        f"{agent_id}: version {new} committed without conversation {conversation!r} "
        f"(roll back to version {new - 1} to bring it back)."
    )
    return done(request, link("/agent", id=agent_id), notice)
