"""The last check: the report ``effectful-durable check-upgrade`` kept, as the page shows it.

The check writes its report to a file (``DB.check.json`` beside an SQLite file, or
``--report``); the page reads it on each request, so a new check shows at once, back
into the check's own type (:class:`~effectful_durable.UpgradeReport`, from
``upgrades/report.py``, which imports only the standard library).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

from ...upgrades.report import KINDS, Break, UpgradeReport
from . import choice, render

#: The most breaks one page lists.
SHOWN = 500


@dataclass(frozen=True)
class LastCheck:
    """What the page knows of the last check: its report, or why its file cannot be
    read as one (both None when no check kept a report)."""

    report: UpgradeReport | None = None
    unreadable: str | None = None


def last_check(request: Request) -> LastCheck:
    """The last report the check kept, if any, read from its file."""
    path: str | None = request.app.state.check_report
    if not path:
        return LastCheck()
    try:
        with open(path, encoding="utf-8") as kept:
            return LastCheck(UpgradeReport.from_json(json.load(kept)))
    except FileNotFoundError:
        return LastCheck()
    except (OSError, ValueError) as error:
        return LastCheck(unreadable=f"{path}: {error}")


def breaks_of(found: LastCheck, agent_id: str) -> list[Break]:
    """The last report's breaks of one agent."""
    if found.report is None:
        return []
    return [b for b in found.report.breaks if b.agent_id == agent_id]


def check(request: Request) -> Response:
    """``/check``: the last check's report, its breaks by kind."""
    found = last_check(request)
    kind = choice(request, "kind", KINDS) or None
    breaks: list[Break] = []
    if found.report is not None:
        breaks = [b for b in found.report.breaks if kind is None or b.kind == kind]
    context = {
        "last_check": found,
        "breaks": breaks[:SHOWN],
        "more": max(0, len(breaks) - SHOWN),
        "kind": kind,
        "kinds": KINDS,
        "path": request.app.state.check_report,
    }
    return render(request, "check.html", context)
