"""A keeper agent that puts a person's marker into every kind of content the library
stores: messages, a compacted original, fields, memory, SQL workspace rows, an
approval's arguments, an event's payload, an alarm's action, the workflow journal, a
failed turn's handoff, a fork, and a conversation of another agent (the erasure and
encryption tests share it)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from effectful.handlers.llm import Template, Tool
from effectful.ops.types import NotHandled
from helpers import running

from effectful_durable import (
    AlarmTools,
    CompactionHandler,
    Keys,
    PersistenceHandler,
    PersistentAgent,
    RecallTools,
    SQLTools,
    StateTools,
    Store,
    TurnSuspended,
    requires_approval,
)
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

#: Run from inside a turn (a tool's call), with everything before it committed.
DURING_TURN: list[Callable[[], None]] = []

MARKERS = {"ann": "AnnSecret4711", "bob": "BobKept0815"}


@dataclasses.dataclass
class Keeper(PersistentAgent, StateTools, SQLTools, AlarmTools, RecallTools):
    """You keep track of things for one person."""

    __sql_schema__ = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT)"

    notes: list[str] = dataclasses.field(default_factory=list)

    @Tool.define
    def remember(self, text: str) -> str:
        """Keep ``text`` in the agent's notes."""
        self.notes.append(text)
        for scan in DURING_TURN:
            scan()
        return "kept"

    @Tool.define
    @requires_approval(reason="a payment")
    def pay(self, order: str) -> str:
        """Pay for an order."""
        return f"paid {order}"

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


def reply(call: FakeCall) -> Any:
    """The model: each request names what to do with the text after its first word."""
    text = call.last_user_text.removeprefix("Answer: ")
    if "Summarise the conversation" in text:
        return "SUMMARY: " + text[-200:]
    if call.messages[-1]["role"] == "tool":
        return f"done with {text}"
    verb, _, rest = text.partition(" ")
    if verb == "put":
        return ToolCall("put_state", {"key": "secret", "value": f'"{rest}"'})
    if verb == "add":
        return ToolCall("sql_insert", {"table": "items", "values": {"name": rest}})
    if verb == "remind":
        return ToolCall("schedule_alarm", {"delay_seconds": 3600.0, "action": text})
    if verb == "remember":
        return ToolCall("remember", {"text": rest})
    if verb == "pay":
        return ToolCall("pay", {"order": rest})
    if verb == "fail":
        return RuntimeError(f"the model is down ({rest})")
    return f"answer to {text}"


def fill(url: str, who: str, keys: Keys | None = None) -> None:
    """Put ``who``'s marker into every kind of content, for agents whose subject is them."""
    mark = MARKERS[who]
    with Store(url, keys=keys) as store:
        store.set_subject(who, f"user:{who}")
        store.set_subject("shared", f"user:{who}", conversation=f"with-{who}")
    persistence = PersistenceHandler(url, keys=keys)
    compaction = CompactionHandler(max_messages=10, keep_recent=3)
    try:
        with running(FakeLLM(respond=reply), compaction, persistence):
            agent = Keeper(agent_id=who)
            for verb in ("hello", "put", "add", "remind", "remember", "tell", "more", "again"):
                agent.ask(f"{verb} {mark}")
            shared = Keeper(agent_id="shared")
            with shared.conversation(f"with-{who}"):
                shared.ask(f"hello {mark}")
        with Store(url, keys=keys) as store:
            store.fork(who, None, f"{who}-copy")
            store.send_event(who, "note", {"text": mark})
        with running(
            FakeLLM(respond=reply), PersistenceHandler(url, workflow=f"wf-{who}", keys=keys)
        ):
            with pytest.raises(TurnSuspended):
                Keeper(agent_id=who).ask(f"pay {mark}")
        with running(FakeLLM(respond=reply), PersistenceHandler(url, keys=keys)):
            failing = Keeper(agent_id=who)
            with failing.conversation("side"), pytest.raises(RuntimeError):
                failing.ask(f"fail {mark}")
    finally:
        persistence.close()


def what_reads_back(store: Store, agent_id: str) -> dict[str, Any]:
    """Everything a person's agent reads back as, to compare before and after."""
    return {
        "versions": [(v.version, v.kind, v.template) for v in store.versions(agent_id)],
        "history": store.history(agent_id),
        "compacted": store.history(agent_id, include_compacted=True),
        "state": store.state(agent_id),
        "memory": store.memory(agent_id),
        "sql": store.sql(agent_id, "SELECT name FROM items ORDER BY id").rows,
        "alarms": [(a.action, a.status) for a in store.alarms(agent_id)],
        "events": [e.payload for e in store.events(agent_id)],
        "approvals": [(a.tool, a.arguments) for a in store.approvals(agent_id=agent_id)],
        "steps": [
            (s.agent_id, s.arguments)
            for w in store.workflows()
            for s in store.steps(w.workflow)
            if s.agent_id == agent_id
        ],
    }


def make(agent_id: str) -> Keeper:
    """The agents' factory, as the commands load it (``--agents keeper:make``)."""
    return Keeper(agent_id=agent_id)
