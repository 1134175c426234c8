"""Waiting work across agents: approvals, the event inbox, alarms, unfinished turns,
workflow journals, and the runners' last reports."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from . import render, required, store_of

#: The most decided approvals listed (newest first).
DECIDED = 50


def waiting(request: Request) -> Response:
    """``/waiting``: everything that waits for a person or a runner, across agents."""
    store = store_of(request)
    decided = [a for a in store.approvals(status=None) if a.status != "pending"]
    context = {
        "approvals": store.approvals(),
        "decided": decided[::-1][:DECIDED],
        "decided_total": len(decided),
        "events": store.events(),
        "alarms": store.alarms(),
        "handoffs": store.handoffs(),
        "workflows": store.workflows(),
        "runners": store.runner_statuses(),
    }
    return render(request, "waiting.html", context)


def workflow(request: Request) -> Response:
    """``/workflow?name=``: one workflow's step journal."""
    name = required(request, "name")
    context = {"name": name, "steps": store_of(request).steps(name)}
    return render(request, "workflow.html", context)
