"""You are a user's personal assistant. Note what they tell you, remind them when asked."""

# The docstring above heads the agent's system prompt (effectful prompts a template
# with its module's docstring). This module is the one piece of the fleet that both
# the web service (service.py) and the runners load:
#
#     effectful-durable run URL --agents assistant:make_agent --handlers assistant:handlers
#
# It runs offline: the model is FakeLLM with a scripted `respond` function, which
# waits FLEET_MODEL_SECONDS (0.05 s by default) per request, as a real model would
# wait longer. With a real model, return LiteLLMProvider(model=...) and
# RetryLLMHandler() from model_stack() instead, and keep everything else.

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import dataclasses
import json
import re
import time
from typing import Any

from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.types import NotHandled

from effectful_durable import AlarmTools, OnEvent, PersistentAgent, RunnerConfig
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

MODEL_SECONDS = float(os.environ.get("FLEET_MODEL_SECONDS", "0.05"))


# -- The agent: one per user (agent_id "user-ann"), turns from the service and runners --
@dataclasses.dataclass
class Assistant(PersistentAgent, AlarmTools, OnEvent):
    """You are a user's personal assistant. Note what they tell you, remind them when asked."""

    # Persisted fields: each commits with the turn that changed it, or not at all.
    inbox: list[str] = dataclasses.field(default_factory=list)  # events, as noted
    reminders: list[str] = dataclasses.field(default_factory=list)  # what was sent

    @Tool.define
    def note(self, text: str) -> str:
        """Keep a note of something that happened, for the user to read later."""
        self.inbox.append(text)
        return f"noted ({len(self.inbox)} notes)"

    @Tool.define
    def remind(self, message: str) -> str:
        """Send the user a reminder now."""
        self.reminders.append(message)
        return "sent"

    @Template.define
    def ask(self, text: str) -> str:
        """The user says: {text}"""
        raise NotHandled

    # From AlarmTools: the tools schedule_alarm, list_alarms and cancel_alarm, and
    # on_alarm(action), the turn a runner runs when an alarm is due. From OnEvent:
    # on_event(name, payload), the turn a runner runs for an event sent to the agent.


def make_agent(agent_id: str) -> Assistant:
    """The runners' agent factory (``--agents assistant:make_agent``)."""
    return Assistant(agent_id=agent_id)


# -- The scripted model: what a real one would plausibly do with these prompts ----------
ASKED = re.compile(r"The user says: (.*)", re.S)
REMIND = re.compile(r"remind me in (\d+(?:\.\d+)?) seconds? to (.*)", re.I | re.S)
ALARM = re.compile(r"The alarm's action: (.*)", re.S)
EVENT = re.compile(r"sent to you: (.*?)\. Its payload, as JSON: (.*)\. Handle it", re.S)


def model(call: FakeCall) -> Reply:
    """Answer a request of the assistant's turns from what it asks."""
    time.sleep(MODEL_SECONDS)  # a real model takes 0.5 to 5 s
    last = call.messages[-1]
    if last["role"] == "tool":  # a tool answered: end the turn with what it said
        return f"Done: {text_of(last)}."
    text = call.last_user_text
    if found := ALARM.search(text):  # an alarm is due: send the reminder
        return ToolCall("remind", {"message": found[1].strip()})
    if found := EVENT.search(text):  # an event arrived: note it
        payload = json.loads(found[2])
        return ToolCall("note", {"text": f"{found[1]}: {payload.get('text', payload)}"})
    asked = ASKED.search(text)
    request = asked[1].strip() if asked else text
    if found := REMIND.search(request):  # schedule a turn of our own for later
        return ToolCall(
            "schedule_alarm",
            {"delay_seconds": float(found[1]), "action": found[2].strip()},
        )
    return f"Noted: {request}"


def text_of(message: dict[str, Any]) -> str:
    content = message["content"]
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content)


def model_stack() -> list[Any]:
    """The model's handlers, outermost first; a real deployment returns LiteLLMProvider
    and RetryLLMHandler. Built anew for each turn of the service (FakeLLM keeps every
    request it answered)."""
    return [LiteLLMProvider(model="fake"), FakeLLM(respond=model)]


def handlers(config: RunnerConfig) -> list[Any]:
    """The runners' handler stack (``--handlers assistant:handlers``); the runner adds
    the PersistenceHandler innermost."""
    return model_stack()
