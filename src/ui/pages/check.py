"""The last check: the report ``effectful-durable check-upgrade`` kept, as the page shows it.

The check writes its report to a file (``DB.check.json`` beside an SQLite file, or
``--report``); the page reads it on each request, so a new check shows at once.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from . import choice, render

#: The most breaks one page lists.
SHOWN = 500
KINDS = ("agent", "approval", "alarm", "event", "state", "memory", "history", "workflow")


def last_check(request: Request) -> dict[str, Any] | None:
    """The last report, or None when no check kept one; ``{"unreadable": why}`` if broken."""
    path: str | None = request.app.state.check_report
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as report:
            found: dict[str, Any] = json.load(report)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as error:
        return {"unreadable": f"{path}: {error}"}
    return found


def breaks_of(report: dict[str, Any] | None, agent_id: str) -> list[dict[str, Any]]:
    """The last report's breaks of one agent."""
    if report is None or "unreadable" in report:
        return []
    return [b for b in report.get("breaks", []) if b.get("agent_id") == agent_id]


def check(request: Request) -> Response:
    """``/check``: the last check's report, its breaks by kind."""
    report = last_check(request)
    kind = choice(request, "kind", KINDS) or None
    breaks: list[dict[str, Any]] = []
    if report is not None and "unreadable" not in report:
        breaks = [b for b in report.get("breaks", []) if kind is None or b.get("kind") == kind]
    context = {
        "report": report,
        "breaks": breaks[:SHOWN],
        "more": max(0, len(breaks) - SHOWN),
        "kind": kind,
        "kinds": KINDS,
        "path": request.app.state.check_report,
    }
    return render(request, "check.html", context)
