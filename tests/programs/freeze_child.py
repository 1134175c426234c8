"""A holder the freeze loop stops in the middle of its writes (processes/test_hold_freezes.py).

Usage: ``python tests/programs/freeze_child.py URL LEASE``

It holds agents on the PostgreSQL database at URL with holds lasting LEASE seconds
(``holds.TTL``; renewed five times a lease), and reads one JSON command a line on
stdin, answering each with one JSON line on stdout:

- ``{"setup": KIND, "agent": ID}`` makes what a write of KIND needs: the agent's
  turns, a conversation, a suspended turn with its approval decided, ...
- ``{"act": KIND, "agent": ID, "stop": N}`` makes the write. Every statement it
  sends in a transaction under its hold (from the fence on) is an event, and so is
  each ``COMMIT`` of such a transaction, just before it is sent; right after event
  N (1 for the first), the process stops itself (SIGSTOP), renewals and all, as a
  host frozen or cut off at that point would. With ``"stop": null`` it runs
  through. The answer: the events seen, and whether the write succeeded or the
  error it raised.

The statements are seen where psycopg sends them (``Connection.execute``,
``Cursor.executemany``), under the library, which is not changed for the test.
"""

import os

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

import dataclasses
import json
import signal
import sys
import threading
from typing import Any

import psycopg
from child import model_stack, running
from effectful.handlers.llm import Template, Tool
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import (
    CompactionHandler,
    PersistenceHandler,
    PersistentAgent,
    Store,
    TurnSuspended,
    migrate_states,
    migrates_state,
    requires_approval,
)
from effectful_durable.store.engine.postgres import holds
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall


@dataclasses.dataclass
class Keeper(PersistentAgent):
    """You keep notes."""

    notes: list[str] = dataclasses.field(default_factory=list)

    @Tool.define
    @requires_approval(reason="a payment")
    def pay(self, order: str) -> str:
        """Pay for an order."""
        return f"paid {order}"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


@dataclasses.dataclass
class KeeperV2(Keeper):
    """You keep notes (fields of version 2)."""

    __state_version__ = 2


@migrates_state(KeeperV2, from_version=1)
def _notes_kept(fields: dict[str, Any]) -> dict[str, Any]:
    fields["notes"] = [*fields.get("notes", []), "migrated"]
    return fields


def answer(call: FakeCall) -> Reply:
    """The model: pays when asked to, fails when told to, else answers "ok"."""
    if call.messages[-1]["role"] == "tool":
        return "done"
    text = call.last_user_text or ""
    if text.startswith("Pay"):
        return ToolCall("pay", {"order": "o1"})
    if text.startswith("Fail"):
        return RuntimeError("the model is down")
    return "ok"


class Events:
    """The statements sent under a hold, counted; the process stops at one of them."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        self.stop: int | None = None
        self.counting = False
        self._fenced: set[int] = set()
        self._lock = threading.Lock()

    def sent(self, conn: Any, query: Any, params: Any) -> None:
        """Called after a statement went out on ``conn`` (or before a COMMIT)."""
        text = query if isinstance(query, str) else str(query)
        words = text.split()
        first = words[0].upper() if words else ""
        fenced = id(conn) in self._fenced
        if first in ("BEGIN", "COMMIT", "ROLLBACK"):
            self._fenced.discard(id(conn))
        elif "effectful_durable_held(" in text or (
            "effectful_durable_advance(" in text and params and params[5] is not None
        ):
            self._fenced.add(id(conn))
            fenced = True
        if not (self.counting and fenced) or first in ("BEGIN", "ROLLBACK"):
            return
        with self._lock:
            self.seen.append(" ".join(words[:3])[:60])
            number = len(self.seen)
        if number == self.stop:
            os.kill(os.getpid(), signal.SIGSTOP)


events = Events()
_execute = psycopg.Connection.execute
_executemany = psycopg.Cursor.executemany


def execute(self: Any, query: Any, params: Any = None, **kwargs: Any) -> Any:
    if isinstance(query, str) and query.strip().upper() == "COMMIT":
        events.sent(self, query, params)  # just before it is sent
        return _execute(self, query, params, **kwargs)
    cursor = _execute(self, query, params, **kwargs)
    events.sent(self, query, params)
    return cursor


def executemany(self: Any, query: Any, params_seq: Any, **kwargs: Any) -> Any:
    result = _executemany(self, query, params_seq, **kwargs)
    events.sent(self.connection, query, None)
    return result


psycopg.Connection.execute = execute  # type: ignore[method-assign]
psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]


def stack(store: Store, kind: str, agent_id: str) -> list[Any]:
    handlers: list[Any] = model_stack(FakeLLM(respond=answer))
    if kind == "compaction":
        handlers.append(CompactionHandler(max_messages=6, keep_recent=2))
    workflow = f"wf-{agent_id}" if kind == "workflow" else None
    handlers.append(PersistenceHandler(store, workflow=workflow))
    return handlers


def turns(store: Store, agent_id: str, *requests: str, conversation: str | None = None) -> None:
    agent = Keeper(agent_id=agent_id)
    with running(FakeLLM(respond=answer)):
        with handler(PersistenceHandler(store)):
            for request in requests:
                if conversation is None:
                    agent.ask(request)
                else:
                    with agent.conversation(conversation):
                        agent.ask(request)


def setup(store: Store, kind: str, agent_id: str) -> None:
    if kind == "delete_conversation":
        turns(store, agent_id, "hello")
        turns(store, agent_id, "hello there", conversation="c2")
    elif kind == "approval":
        agent = Keeper(agent_id=agent_id)
        with running(FakeLLM(respond=answer)):
            with handler(PersistenceHandler(store)):
                try:
                    agent.ask("Pay order o1")
                except TurnSuspended:
                    pass
        (waiting,) = store.approvals(agent_id=agent_id)
        store.approve(waiting.approval_id)
    else:
        count = {"rollback": 3, "prune": 4, "compaction": 3, "fork": 2}.get(kind, 1)
        turns(store, agent_id, *[f"hello {n}" for n in range(count)])


def act(store: Store, kind: str, agent_id: str) -> None:
    if kind in ("turn", "failed", "workflow", "compaction", "approval"):
        agent = Keeper(agent_id=agent_id)
        handlers = stack(store, kind, agent_id)
        with handler(handlers[0]), handler(handlers[1]), handler(handlers[2]):
            if len(handlers) == 4:
                with handler(handlers[3]):
                    agent.ask("one more")
            elif kind == "approval":
                handlers[2].resume(agent)
            else:
                agent.ask("Fail now" if kind == "failed" else "one more")
    elif kind == "migration":
        migrate_states(store, agents=lambda one: KeeperV2(agent_id=one), agent_id=agent_id)
    elif kind == "rollback":
        store.rollback(agent_id, 1)
    elif kind == "fork":
        store.fork(agent_id, None, f"{agent_id}-fork")
    elif kind == "delete":
        store.delete(agent_id)
    elif kind == "delete_conversation":
        store.delete_conversation(agent_id, "c2")
    elif kind == "prune":
        store.prune(agent_id, keep_versions=1)
    else:
        raise ValueError(kind)


def main() -> None:
    url, lease = sys.argv[1], float(sys.argv[2])
    holds.TTL = lease
    holds.RENEW_EVERY = lease / 5
    with Store(url) as store:
        for line in sys.stdin:
            command = json.loads(line)
            answer_: dict[str, Any] = {}
            try:
                if "setup" in command:
                    setup(store, command["setup"], command["agent"])
                else:
                    events.seen, events.stop, events.counting = [], command["stop"], True
                    try:
                        act(store, command["act"], command["agent"])
                    finally:
                        events.counting = False
                    answer_["events"] = events.seen
                answer_["ok"] = True
            except Exception as error:
                answer_.update(ok=False, error=type(error).__name__, message=str(error))
                answer_.setdefault("events", events.seen)
            print(json.dumps(answer_), flush=True)


if __name__ == "__main__":
    main()
