"""The agents list: every agent with what waits for it and its subject, filtered, sorted and
paged; or, filtered by a subject, what holds that subject's content (``privacy``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...errors import DamagedRowError
from ...store import Store
from ...store.browse import AGENT_SORTS
from . import BadRequest, choice, flag, number, render, store_of, text
from .check import last_check
from .privacy import subject_page

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
    """``/``: the agents list (``?subject=``: what holds that subject)."""
    subject = text(request, "subject")
    if subject:
        return subject_page(request, subject)
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
    store = store_of(request)
    context = {
        "found": found,
        "q": query,
        "attention": attention,
        "sort": sort,
        "sorts": SORTS,
        "code_versions": store.code_versions([a.agent_id for a in found.agents]),
        "subjects": subjects_of(store, [a.agent_id for a in found.agents]),
        "last_check": last_check(request),
    }
    return render(request, "agents.html", context)


def subjects_of(store: Store, agent_ids: list[str]) -> dict[str, dict[str | None, str] | str]:
    """Each agent's subjects (``Store.subjects``), or why they cannot be read (a damaged
    row, which refuses that agent's line only). One read an agent: the Store has no
    read of a page of agents' subjects at once."""
    found: dict[str, dict[str | None, str] | str] = {}
    for agent_id in agent_ids:
        try:
            found[agent_id] = store.subjects(agent_id)
        except DamagedRowError as error:
            found[agent_id] = str(error)
    return found
