"""One module per kind of page; each reads the Store and hands plain records to its template.

``agents`` (the list), ``agent`` (the timeline), ``versions`` (versions and the
diff of two), ``state`` (fields, memory, SQL tables and a query), ``waiting``
(approvals, events, alarms, workflows, handoffs, runners). This module holds
what they share: reading a request's parameters, refusing a bad one with a 400
page that says what was wrong.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from ...store import Store
from ..render import Pages


class BadRequest(Exception):
    """A parameter of the request is missing or malformed: a 400 page says which."""


def store_of(request: Request) -> Store:
    """The app's read-only Store."""
    store: Store = request.app.state.store
    return store


def render(request: Request, template: str, context: dict[str, Any]) -> Response:
    """The page ``template`` with ``context`` (and the app's settings)."""
    pages: Pages = request.app.state.pages
    return pages.render(request, template, context)


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
