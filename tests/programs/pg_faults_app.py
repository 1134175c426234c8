"""Agents for the PostgreSQL fault tests (tests/processes/test_pg_faults.py), also run as children.

``Noter`` notes what each turn asks (a tool call, then an answer), for the
worker loop (``tests/programs/pg_worker_child.py``) and the ambiguous commits. For ``run``,
``make_agent``/``make_handlers`` give agents whose alarm and event turns the
fake model answers at once (``--agents pg_faults_app:make_agent``).
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dataclasses
import json
import re
from typing import Any

from child import model_stack
from effectful.handlers.llm import Template, Tool
from effectful.ops.types import NotHandled

from effectful_durable import AlarmTools, OnEvent, PersistentAgent, RunnerConfig
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

NOTE = re.compile(r"Note (\S+)")
ALARM = re.compile(r"The alarm's action: (\S+)")
EVENT = re.compile(r"Its payload, as JSON: (.*?)\. Handle it", re.S)


@dataclasses.dataclass
class Noter(PersistentAgent, AlarmTools, OnEvent):
    """You note what you are asked to."""

    notes: list[str] = dataclasses.field(default_factory=list)

    @Tool.define
    def note(self, text: str) -> str:
        """Note ``text``."""
        self.notes.append(text)
        return "noted"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


def answer(call: FakeCall) -> Reply:
    """A tool call noting what the turn asks, then a short answer."""
    if call.messages[-1]["role"] == "tool":
        return "done"
    text = call.last_user_text
    found = NOTE.search(text) or ALARM.search(text)
    if found is None and (event := EVENT.search(text)):
        return ToolCall("note", {"text": json.loads(event[1])})
    return ToolCall("note", {"text": found[1] if found else text})


def handlers() -> list[Any]:
    """The handler stack of a thread that runs Noters (the fake model outermost)."""
    return model_stack(FakeLLM(respond=answer))


def make_agent(agent_id: str) -> Noter:
    """The runner's agent factory."""
    return Noter(agent_id=agent_id)


def make_handlers(config: RunnerConfig) -> list[Any]:
    """The runner's handler factory."""
    return handlers()
