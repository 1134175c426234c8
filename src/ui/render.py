"""Templates: the Jinja environment (autoescape on), its filters, and rendering a page.

Pages hand plain records to their template; everything shown is escaped by Jinja,
and nothing that came from the database is ever marked safe.
"""

from __future__ import annotations

import json
import urllib.parse
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
from starlette.requests import Request
from starlette.responses import HTMLResponse

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
    env.filters.update(pretty=_pretty, compact=_compact, when=_when, iso=_iso)
    env.globals.update(link=link)
    return env


class Pages:
    """Renders the page templates for a request, with the app's settings in every page."""

    def __init__(self, *, read_only: bool, location: str) -> None:
        self.env = environment()
        self.read_only = read_only
        self.location = location

    def render(
        self,
        request: Request | None,
        template: str,
        context: dict[str, Any],
        *,
        status: int = 200,
    ) -> HTMLResponse:
        """The page ``template`` with ``context``, as an HTML response."""
        page = self.env.get_template(template).render(
            request=request,
            read_only=self.read_only,
            database=self.location,
            here=_here(request),
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
