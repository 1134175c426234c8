"""Templates: the Jinja environment (autoescape on), its filters, and rendering a page.

Pages hand plain records to their template; everything shown is escaped by Jinja,
and nothing that came from the database is ever marked safe.
"""

from __future__ import annotations

import json
import shlex
import threading
import urllib.parse
from collections import OrderedDict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

from .guard import form_token_of, session_of

TEMPLATES = Path(__file__).parent / "templates"


def _pretty(value: Any) -> str:
    """A JSON value as indented JSON text (for a folded block)."""
    try:
        return json.dumps(value, indent=2, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return repr(value)


def _compact(value: Any, width: int = 80) -> str:
    """A JSON value on one line, cut at ``width`` characters."""
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def _when(moment: datetime | None) -> str:
    """A time as ``2026-11-28 04:21:17 UTC``."""
    if moment is None:
        return "-"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _iso(moment: datetime | None) -> str:
    return "" if moment is None else moment.astimezone(UTC).isoformat(timespec="seconds")


def link(path: str, **params: Any) -> str:
    """``path`` with ``params`` as its query string (None and empty values left out)."""
    query = {k: v for k, v in params.items() if v is not None and v != "" and v is not False}
    return path + ("?" + urllib.parse.urlencode(query) if query else "")


def environment() -> jinja2.Environment:
    """The page's Jinja environment: autoescape on, undefined names an error."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters.update(pretty=_pretty, compact=_compact, when=_when, iso=_iso, shell=shlex.quote)
    env.globals.update(link=link)
    return env


@dataclass(frozen=True)
class Problem:
    """Why an action was refused, shown on its form (``form``, the form's id) with what
    was sent (``values``), or above the page when that form is no longer shown."""

    message: str
    form: str | None = None
    values: dict[str, str] = field(default_factory=dict)


class Notices:
    """What the next page a browser session opens says once: the outcome of its action."""

    #: Sessions remembered at most (the oldest is forgotten first), notices per session.
    SESSIONS, PER_SESSION = 1000, 5

    def __init__(self) -> None:
        self._waiting: OrderedDict[str, list[str]] = OrderedDict()
        self._lock = threading.Lock()

    def add(self, session: str, text: str) -> None:
        """Say ``text`` on the session's next page."""
        with self._lock:
            said = self._waiting.setdefault(session, [])
            said[:] = [*said, text][-self.PER_SESSION :]
            self._waiting.move_to_end(session)
            while len(self._waiting) > self.SESSIONS:
                self._waiting.popitem(last=False)

    def take(self, session: str) -> list[str]:
        """What the session's page says now (then forgotten)."""
        with self._lock:
            return self._waiting.pop(session, [])


class Pages:
    """Renders the page templates for a request, with the app's settings in every page.

    Args:
        read_only: The page offers no action.
        location: The database as the pages name it.
        by: The name decisions are made under.
    """

    def __init__(self, *, read_only: bool, location: str, by: str = "") -> None:
        self.env = environment()
        self.read_only = read_only
        self.location = location
        self.by = by
        self.notices = Notices()

    def render(
        self,
        request: Request | None,
        template: str,
        context: dict[str, Any],
        *,
        status: int = 200,
        here: str | None = None,
    ) -> HTMLResponse:
        """The page ``template`` with ``context``, as an HTML response.

        ``here`` is the address the page fetches again when a commit lands (default:
        the request's own; a page answering a form gives the page the form is on).
        """
        notices: list[str] = []
        if request is not None and "hx-request" not in request.headers:
            notices = self.notices.take(session_of(request))
        context = {"problem": None, **context}
        page = self.env.get_template(template).render(
            request=request,
            read_only=self.read_only,
            database=self.location,
            by=self.by,
            here=here or _here(request),
            csrf=form_token_of(request) if request is not None else "",
            notices=notices,
            **context,
        )
        return HTMLResponse(page, status_code=status)

    def error(
        self, request: Request | None, status: int, title: str, message: str, advice: str = ""
    ) -> HTMLResponse:
        """An error page: what was wrong, and what to do."""
        context = {"title": title, "message": message, "advice": advice, "status": status}
        return self.render(request, "error.html", context, status=status)


def _here(request: Request | None) -> str:
    """The request's path and query, for the page to refresh itself when a commit lands."""
    if request is None:
        return "/"
    query = request.url.query
    return request.url.path + ("?" + query if query else "")
