"""The agents list: every agent with what waits for it, filtered, sorted and paged."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...store.browse import AGENT_SORTS
from . import BadRequest, choice, flag, number, render, store_of, text
from .check import last_check

#: Agents per page.
PER_PAGE = 50

#: The orders offered, as the page names them.
SORTS = {
    "id": "id, A to Z",
    "-updated": "last commit, newest first",
    "updated": "last commit, oldest first",
    "-version": "most versions first",
    "created": "created, oldest first",
    "-created": "created, newest first",
    "-id": "id, Z to A",
    "version": "fewest versions first",
}


def agents(request: Request) -> Response:
    """``/``: the agents list."""
    query = text(request, "q")
    attention = flag(request, "attention")
    sort = choice(request, "sort", AGENT_SORTS, "id") or "id"
    page = number(request, "page", 1) or 1
    found = store_of(request).agent_page(
        text=query, attention=attention, sort=sort, page=page, per_page=PER_PAGE
    )
    if page > found.pages:
        msg = f"there is no page {page}: the {found.total} agents shown fill {found.pages}"
        raise BadRequest(msg)
    context = {
        "found": found,
        "q": query,
        "attention": attention,
        "sort": sort,
        "sorts": SORTS,
        "code_versions": store_of(request).code_versions([a.agent_id for a in found.agents]),
        "last_check": last_check(request),
    }
    return render(request, "agents.html", context)
