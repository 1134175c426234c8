"""An agent's versions, and what changed between two of them (``Store.diff``)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ...store.diff import DIFF_LIMIT
from . import BadRequest, number, render, required, store_of
from .agent import entries

#: Versions per page.
PER_PAGE = 50


def versions(request: Request) -> Response:
    """``/versions?id=``: the agent's versions, newest first, with a choice of two to compare."""
    store = store_of(request)
    agent_id = required(request, "id")
    before = number(request, "before")
    listed = store.version_page(agent_id, before=before, limit=PER_PAGE + 1)
    more = len(listed) > PER_PAGE
    listed = listed[:PER_PAGE]
    latest = store.version_page(agent_id, limit=1)[0].version
    context = {
        "agent_id": agent_id,
        "versions": listed,
        "next_before": listed[-1].version if more else None,
        "latest": latest,
    }
    return render(request, "versions.html", context)


def diff(request: Request) -> Response:
    """``/diff?id=&from=&to=``: what changed in the agent from one version to another."""
    store = store_of(request)
    agent_id = required(request, "id")
    before = number(request, "from")
    after = number(request, "to")
    if before is None or after is None:
        msg = "choose two versions to compare: the parameters 'from' and 'to'"
        raise BadRequest(msg)
    found = store.diff(agent_id, before, after, limit=DIFF_LIMIT)
    shown = [(c, entries(c.added), entries(c.removed)) for c in found.conversations]
    context = {"agent_id": agent_id, "diff": found, "shown": shown, "limit": DIFF_LIMIT}
    return render(request, "diff.html", context)
