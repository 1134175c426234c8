"""One module per kind of page; each reads the Store and hands plain records to its template.

``agents`` (the list), ``agent`` (the timeline), ``versions`` (versions and the
diff of two), ``state`` (fields, memory, SQL tables and a query), ``waiting``
(approvals, events, alarms, workflows, handoffs, runners), ``approvals`` (the
inbox, one approval, and deciding), ``actions`` (the Store's other actions,
each with the page that says what it will do), ``privacy`` (what holds a
subject, erasing it, the receipts). This module holds what they
share: reading a request's parameters, refusing a bad one with a 400 page that
says what was wrong, and what every action does: read its checked form, call
the read-write Store, then send the browser on with a notice, or show the
library's error on the form.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from ...errors import AgentInUseError, DurableError, NotFoundError
from ...store import Store
from ..guard import form_of, session_of
from ..render import Pages, Problem


class BadRequest(Exception):
    """A parameter of the request is missing or malformed: a 400 page says which."""


def store_of(request: Request) -> Store:
    """The app's read-only Store."""
    store: Store = request.app.state.store
    return store


def pages_of(request: Request) -> Pages:
    """The app's templates and settings."""
    pages: Pages = request.app.state.pages
    return pages


def render(
    request: Request,
    template: str,
    context: dict[str, Any],
    *,
    status: int = 200,
    here: str | None = None,
) -> Response:
    """The page ``template`` with ``context`` (and the app's settings)."""
    return pages_of(request).render(request, template, context, status=status, here=here)


# -- actions ------------------------------------------------------------------------


def writer_of(request: Request) -> Store:
    """The read-write Store the actions call (the guard let no write in without one)."""
    writer: Store | None = request.app.state.writer
    if writer is None:  # pragma: no cover - the guard refuses every write first
        msg = "the page is read-only"
        raise RuntimeError(msg)
    return writer


def posted(request: Request, name: str, *, required: bool = False) -> str:
    """The field ``name`` of the action's form ("" when absent)."""
    value = form_of(request).get(name, "")
    if "\0" in value:
        msg = f"the field {name!r} holds a NUL character"
        raise BadRequest(msg)
    if required and not value:
        msg = f"the field {name!r} is missing: this form needs it"
        raise BadRequest(msg)
    return value


def done(request: Request, address: str, notice: str) -> Response:
    """An action's answer: the browser goes on to ``address``, which says ``notice`` once."""
    pages_of(request).notices.add(session_of(request), notice)
    return RedirectResponse(address, status_code=303)


def refused(
    request: Request,
    error: DurableError,
    show: Callable[[Problem, int], Response],
    form: str | None,
) -> Response:
    """An action the library refused: its page again, with the error on the form ``form``
    and what was sent (``show(problem, status)`` renders it). Where that page cannot be
    shown any more (its agent or approval is gone), a page with the error alone."""
    status = 404 if isinstance(error, NotFoundError) else 409 if busy(error) else 400
    problem = Problem(page_words(str(error)), form, dict(form_of(request)))
    try:
        return show(problem, status)
    except DurableError:
        context = {
            "title": "Nothing was changed",
            "message": "",
            "advice": "Go back to the page you came from, and look again.",
            "status": status,
            "problem": Problem(problem.message),
        }
        return render(request, "error.html", context, status=status, here="/")


def busy(error: DurableError) -> bool:
    """Whether ``error`` is about the moment, not the input: an agent in use."""
    return isinstance(error, AgentInUseError)


def page_words(message: str) -> str:
    """A library error in the page's words where it speaks of Python calls."""
    for python, page in (
        (
            "wait for that turn to finish, pass wait=<seconds> to PersistenceHandler to "
            "wait for it, or fork the agent to run a copy.",
            "try again once that turn has finished.",
        ),
        ("`effectful-durable approvals` (Store.approvals())", "the approvals inbox"),
        ("Store.approvals() lists them", "the approvals inbox lists them"),
        ("Store.agents() lists the agents it holds", "the agents list shows them"),
        ("Store.workflows() lists the journals it holds", "the waiting work page lists them"),
        ("Store.alarms() lists them", "the waiting work page lists them"),
        ("(Store.agents() lists them)", "(the agents list shows them)"),
        ("pass create=True (--create)", "tick “a new agent”"),
        ("Store.conversations() lists the ones it has", "its page lists them"),
        ("invalid agent_id", "invalid agent id"),
    ):
        message = message.replace(python, page)
    return message


def text(request: Request, name: str, default: str = "") -> str:
    """The parameter ``name`` as text (``default`` when absent)."""
    value = request.query_params.get(name, default)
    if "\0" in value:
        msg = f"the parameter {name!r} holds a NUL character"
        raise BadRequest(msg)
    return value


def required(request: Request, name: str) -> str:
    """The parameter ``name``, which must be given."""
    value = text(request, name)
    if not value:
        msg = f"the parameter {name!r} is missing: this page needs it"
        raise BadRequest(msg)
    return value


def number(
    request: Request, name: str, default: int | None = None, *, least: int = 1
) -> int | None:
    """The parameter ``name`` as a whole number >= ``least`` (``default`` when absent)."""
    value = request.query_params.get(name, "")
    if value == "":
        return default
    try:
        found = int(value)
    except ValueError:
        found = None
    if found is None or found < least or len(value) > 18:
        msg = f"the parameter {name!r} must be a whole number from {least}, not {value!r}"
        raise BadRequest(msg)
    return found


def choice(request: Request, name: str, allowed: Collection[str], default: str = "") -> str:
    """The parameter ``name``, which must be one of ``allowed`` (or absent)."""
    value = text(request, name, default)
    if value and value not in allowed:
        msg = f"the parameter {name!r} must be one of {', '.join(allowed)}; not {value!r}"
        raise BadRequest(msg)
    return value


def flag(request: Request, name: str) -> bool:
    """Whether the checkbox parameter ``name`` is on (``1``, ``on`` or ``true``)."""
    return text(request, name).lower() in ("1", "on", "true", "yes")
