"""The application: routes, the guard in front of them, error pages, and its lifespan.

Every GET reads the read-only Store and changes nothing. The actions are POSTs,
let in by the guard (this page's origin, its session's form token, not
``--read-only``), that call the read-write Store through the same function as
the matching command. The store's blocking calls run in Starlette's thread pool
(each thread with its own connection). Errors are pages: an unknown agent or
version is a 404, a malformed parameter a 400, a row that fails its checksum a
page naming that row, an action the library refused its form again with the
library's error; no page ever shows a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from ..errors import DamagedRowError, DurableError, NotFoundError
from ..store import Store
from .guard import PUBLIC, Guard
from .live import CommitFeed, stream
from .pages import (
    BadRequest,
    actions,
    agent,
    agents,
    approvals,
    check,
    privacy,
    state,
    versions,
    waiting,
)
from .render import Pages

STATIC = Path(__file__).parent / "static"

logger = logging.getLogger("effectful_durable.ui")


def make_app(
    store: Store,
    *,
    token: str,
    port: int,
    writer: Store | None = None,
    by: str = "",
    hosts: frozenset[str] = frozenset(),
    location: str = "",
    check_report: str | None = None,
) -> Starlette:
    """The page's ASGI application over ``store`` (opened read-only by the caller).

    Args:
        store: The database to show; the app closes nothing of it.
        token: The secret of the address the command prints.
        port: The port served, which names the session cookie.
        writer: The same database opened read-write, for the actions; None makes
            the page read-only: it offers no action and refuses any.
        by: The name decisions are made under (``Store.approve``'s ``by``).
        hosts: Host names allowed besides the loopback ones.
        location: The database as the pages name it (a URL without its password).
        check_report: The file ``effectful-durable check-upgrade`` keeps its report
            in, shown by ``/check``, the agents list and each agent's page.
    """
    read_only = writer is None
    pages = Pages(read_only=read_only, location=location or store.path, by=by)
    feed = CommitFeed()

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        feed.start(store)
        try:
            yield
        finally:
            feed.stop()

    def refuse(request: Request, status: int, title: str, message: str, advice: str) -> Response:
        return pages.error(request, status, title, message, advice)

    routes = [
        Route("/", agents.agents),
        Route("/agent", agent.agent),
        Route("/agent/compacted", agent.compacted),
        Route("/versions", versions.versions),
        Route("/diff", versions.diff),
        Route("/state", state.state),
        Route("/table", state.table),
        Route("/waiting", waiting.waiting),
        Route("/check", check.check),
        Route("/workflow", waiting.workflow),
        Route("/inbox", approvals.inbox),
        Route("/approval", approvals.approval),
        Route("/version", actions.version),
        Route("/send-event", actions.send_event_form),
        Route("/reset-workflow", actions.reset_workflow_form),
        Route("/delete-conversation", actions.delete_conversation_form),
        Route("/erase", privacy.erase_form),
        Route("/erasures", privacy.erasures),
        Route("/erasure", privacy.erasure),
        # The actions: each a POST the guard checked (origin, form token, not read-only).
        Route("/approve", approvals.approve, methods=["POST"]),
        Route("/deny", approvals.deny, methods=["POST"]),
        Route("/rollback", actions.rollback, methods=["POST"]),
        Route("/fork", actions.fork, methods=["POST"]),
        Route("/rearm", actions.rearm, methods=["POST"]),
        Route("/cancel-alarm", actions.cancel_alarm, methods=["POST"]),
        Route("/send-event", actions.send_event, methods=["POST"]),
        Route("/reset-workflow", actions.reset_workflow, methods=["POST"]),
        Route("/delete-conversation", actions.delete_conversation, methods=["POST"]),
        Route("/erase", privacy.erase, methods=["POST"]),
        Route("/-/live", stream),
        Mount(PUBLIC.rstrip("/"), StaticFiles(directory=STATIC), name="static"),
    ]
    guard = Middleware(
        Guard,
        token=token,
        cookie=f"effectful_durable_ui_{port}",
        hosts=hosts,
        read_only=read_only,
        refuse=refuse,
    )

    async def bad_request(request: Request, error: Exception) -> Response:
        return pages.error(request, 400, "Bad request", str(error), "Check the address.")

    async def not_found(request: Request, error: Exception) -> Response:
        return pages.error(request, 404, "Not found", str(error), "")

    async def http_error(request: Request, error: Exception) -> Response:
        status = error.status_code if isinstance(error, HTTPException) else 500
        what = "No such page" if status == 404 else "The page cannot answer that"
        return pages.error(request, status, what, f"{request.method} {request.url.path}", "")

    async def durable_error(request: Request, error: Exception) -> Response:
        if isinstance(error, ValueError):  # an invalid agent id, say: the request's fault
            return await bad_request(request, error)
        if isinstance(error, DamagedRowError):
            return pages.error(
                request,
                500,
                "A stored row is damaged",
                str(error),
                "Other agents read as usual; `effectful-durable check DB` lists the damaged rows.",
            )
        return pages.error(request, 500, "The database refused", str(error), "")

    async def server_error(request: Request, error: Exception) -> Response:
        logger.error("the page failed on %s", request.url.path, exc_info=error)
        return pages.error(
            request,
            500,
            "Something went wrong",
            "The page failed to answer; the terminal running `effectful-durable ui` says why.",
            "",
        )

    handlers = {
        BadRequest: bad_request,
        ValueError: bad_request,  # the store's own checks of a value (an id, a page)
        NotFoundError: not_found,
        DurableError: durable_error,
        HTTPException: http_error,
        Exception: server_error,
    }
    app = Starlette(
        routes=routes,
        middleware=[guard],
        exception_handlers=handlers,
        lifespan=lifespan,
    )
    app.state.store = store
    app.state.check_report = check_report
    app.state.writer = writer
    app.state.pages = pages
    app.state.feed = feed
    return app
