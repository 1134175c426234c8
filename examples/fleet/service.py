"""The fleet's web service: each request runs one turn of its user's agent.

    FLEET_DB=postgresql://... uvicorn service:app --port 8000     # from examples/fleet

    POST /users/{user}/ask  {"text": "..."}  -> {"agent_id", "version", "reply"}
    GET  /users/{user}                       -> {"agent_id", "inbox", "reminders"}

A request's turn runs in a worker thread (Starlette's thread pool), under the
model's handlers and one PersistenceHandler that every thread shares: the turn
commits in one transaction, and its reply names the version it committed.
Another process's turns of the same agent (a runner delivering its reminder, an
event, or a second copy of this service) move the agent on: the next turn here
reads it again first.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import contextlib
import re
import threading
from collections.abc import AsyncIterator
from typing import Any

from assistant import Assistant, model_stack
from effectful.ops.semantics import handler
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from effectful_durable import (
    AgentInUseError,
    DatabaseUnavailableError,
    NotFoundError,
    PersistenceHandler,
    Store,
)

USER = re.compile(r"[a-z0-9][a-z0-9_-]{0,39}")  # what may follow "user-" in an agent id


class Agents:
    """The users' agents in this process: one Assistant per user, one turn at a time.

    Two requests of one user queue here, in this process. A turn of the same
    agent in another process (a runner's) holds the agent in the database; a
    request then waits for it, up to ``wait`` seconds. (A service with many users
    would keep the recent ones only: an agent it no longer holds is read again
    from the database at its next turn.)
    """

    def __init__(self, db: str, *, wait: float = 30.0) -> None:
        # This process holds at most pool_size + 1 connections (the one more renews
        # its holds on agents). Through PgBouncer they are the pooler's clients, and
        # it shares a few server connections among all the fleet's.
        self.store = Store(db, pool_size=8)
        self.persistence = PersistenceHandler(self.store, wait=wait)
        self._agents: dict[str, tuple[Assistant, threading.Lock]] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.store.close()

    def _agent(self, user: str) -> tuple[Assistant, threading.Lock]:
        with self._lock:
            if user not in self._agents:
                self._agents[user] = (Assistant(agent_id=f"user-{user}"), threading.Lock())
            return self._agents[user]

    def ask(self, user: str, text: str) -> dict[str, Any]:
        """Run one turn, ``ask(text)``, of the user's agent; what it committed."""
        bot, lock = self._agent(user)
        with lock, contextlib.ExitStack() as stack:
            for interpretation in [*model_stack(), self.persistence]:  # outermost first
                stack.enter_context(handler(interpretation))
            reply = bot.ask(text)
            version = self.persistence.load(bot)  # the version this turn committed
        return {"agent_id": bot.agent_id, "version": version, "reply": reply}

    def show(self, user: str) -> dict[str, Any]:
        """The user's agent's fields as the database holds them now.

        Raises:
            NotFoundError: The database holds no agent of that user yet.
        """
        agent_id = f"user-{user}"
        return {"agent_id": agent_id, **self.store.state(agent_id)}


async def ask(request: Request) -> JSONResponse:
    user = request.path_params["user"]
    if not USER.fullmatch(user):
        return JSONResponse({"error": f"no user {user!r}"}, status_code=404)
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or not isinstance(body.get("text"), str):
        return JSONResponse({"error": 'send {"text": "..."}'}, status_code=400)
    agents: Agents = request.app.state.agents
    try:
        # The turn blocks (model calls, the database): a worker thread runs it.
        answer = await run_in_threadpool(agents.ask, user, body["text"])
    except AgentInUseError as error:  # a turn elsewhere held the agent past `wait`
        return JSONResponse({"error": str(error)}, status_code=409)
    except DatabaseUnavailableError as error:  # the server is out of reach or frozen
        return JSONResponse({"error": str(error)}, status_code=503)
    return JSONResponse(answer)


async def show(request: Request) -> JSONResponse:
    user = request.path_params["user"]
    if not USER.fullmatch(user):
        return JSONResponse({"error": f"no user {user!r}"}, status_code=404)
    agents: Agents = request.app.state.agents
    try:
        return JSONResponse(await run_in_threadpool(agents.show, user))
    except NotFoundError:
        return JSONResponse({"error": f"no user {user!r} yet"}, status_code=404)


async def health(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    db = os.environ.get("FLEET_DB")
    if not db:
        msg = "set FLEET_DB to the database: a postgresql:// URL (or an SQLite file)"
        raise RuntimeError(msg)
    app.state.agents = Agents(db)
    try:
        yield
    finally:
        app.state.agents.close()


app = Starlette(
    routes=[
        Route("/users/{user}/ask", ask, methods=["POST"]),
        Route("/users/{user}", show, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ],
    lifespan=lifespan,
)
