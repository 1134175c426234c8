"""Waiting work across agents: approvals, the event inbox, alarms, unfinished turns,
workflow journals, and the runners' last reports."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from ..render import Problem
from . import render, required, store_of


def waiting(request: Request) -> Response:
    """``/waiting``: everything that waits for a person or a runner, across agents."""
    return waiting_page(request)


def waiting_page(request: Request, problem: Problem | None = None, status: int = 200) -> Response:
    """The waiting work page; ``problem`` is an action of its buttons the library refused."""
    store = store_of(request)
    context = {
        "approvals": store.approvals(),
        "events": store.events(),
        "alarms": store.alarms(),
        "handoffs": store.handoffs(),
        "workflows": store.workflows(),
        "runners": store.runner_statuses(),
        "problem": problem,
    }
    return render(request, "waiting.html", context, status=status, here="/waiting")


def workflow(request: Request) -> Response:
    """``/workflow?name=``: one workflow's step journal."""
    name = required(request, "name")
    context = {"name": name, "steps": store_of(request).steps(name)}
    return render(request, "workflow.html", context)
