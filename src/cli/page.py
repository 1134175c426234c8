"""The page: ``ui`` serves a local, live page over DB, from the ``ui`` extra (Starlette,
uvicorn, Jinja2), which it imports only when it runs."""

from __future__ import annotations

import argparse

from .command import Family, fail, flag, report_path, unusable

COMMANDS = Family("The page")

# The libraries of the ui extra: without one of them, `ui` says which extra to install.
_UI_LIBRARIES = frozenset({"starlette", "uvicorn", "jinja2", "markupsafe", "anyio", "h11"})


@COMMANDS.command(
    "ui",
    "serve a local, live page over the database",
    flag("--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"),
    flag("--port", type=int, default=0, metavar="N", help="the port (default: a free one)"),
    flag("--no-browser", action="store_true", help="do not open a browser"),
    flag("--read-only", action="store_true", help="offer no action, refuse any"),
    flag("--by", metavar="NAME", help="who decides in the page (default: your user name)"),
    flag(
        "--check-report",
        metavar="FILE",
        help="the report of `check-upgrade` to show (default: DB.check.json beside an "
        "SQLite file)",
    ),
)
def ui(args: argparse.Namespace) -> int:
    """Serve the page until Ctrl-C."""
    try:
        from ..ui import serve
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] not in _UI_LIBRARIES:
            raise
        return fail(
            f"the page needs the ui extra ({missing.name} is not installed): "
            "pip install 'effectful-durable[ui]'"
        )
    problem = unusable(args.db)
    if problem:
        return fail(problem)
    args.check_report = report_path(args.db, args.check_report)
    try:
        return serve(args)
    except OSError as error:  # the address cannot be listened on
        return fail(str(error))
