"""An agent with alarms and the runner factories the alarm tests share (also run as a child).

The fake model answers an alarm turn ``... The alarm's action: <action>`` with
``did <action>``; when the action starts with ``fail``, it raises instead; when it
starts with ``slow``, it sleeps ``SLOW_SECONDS`` first. ``--handlers
alarms_app:make_handlers`` and ``--agents alarms_app:make_agent`` plug it into
``effectful-durable run``.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import contextlib
import dataclasses
import json
import random
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from child import model_stack
from effectful.handlers.llm import Template
from effectful.ops.types import NotHandled

from effectful_durable import AgentRunner, AlarmTools, PersistentAgent, RunnerConfig
from effectful_durable.testing import FakeCall, FakeLLM, Reply

ACTION = re.compile(r"The alarm's action: (.*)", re.S)
SLOW_SECONDS = float(os.environ.get("ALARMS_APP_SLOW", "2.0"))
# With ALARMS_APP_JITTER=s, each answer waits a random 0..s seconds (crash tests).
JITTER = float(os.environ.get("ALARMS_APP_JITTER", "0"))


@dataclasses.dataclass
class Keeper(PersistentAgent, AlarmTools):
    """You keep track of things."""

    handled: int = 0

    def on_config_update(self, config: RunnerConfig) -> None:
        """Record the config in the file its features name (for the signal tests)."""
        target = config.features.get("hook_file")
        if target:
            with Path(target).open("a") as file:
                file.write(json.dumps({"agent": self.agent_id, **config.features}) + "\n")

    @Template.define
    def ask(self, question: str) -> str:
        """{question}"""
        raise NotHandled


def answer(call: FakeCall) -> Reply:
    """The fake model's answer to an alarm turn (see the module docstring)."""
    found = ACTION.search(call.last_user_text)
    if JITTER:
        time.sleep(random.uniform(0, JITTER))
    if found is None:
        return "ok"
    action = found[1].strip()
    if action.startswith("fail"):
        raise RuntimeError(f"cannot {action}")
    if action.startswith("slow"):
        time.sleep(SLOW_SECONDS)
    return f"did {action}"


def make_agent(agent_id: str) -> Keeper:
    """The runner's agent factory."""
    return Keeper(agent_id=agent_id)


def make_handlers(config: RunnerConfig) -> list[Any]:
    """The runner's handler factory: the fake model under a LiteLLMProvider."""
    return model_stack(FakeLLM(respond=answer), model=config.model or "fake")


def delivered(messages: list[dict[str, Any]]) -> list[str]:
    """The actions of the alarm turns in a history, in order."""
    actions = []
    for message in messages:
        if message["role"] != "user":
            continue
        content = message["content"]
        text = content if isinstance(content, str) else "".join(b["text"] for b in content)
        found = ACTION.search(text)
        if found:
            actions.append(found[1].strip())
    return actions


@contextlib.contextmanager
def in_threads(*runners: AgentRunner) -> Iterator[None]:
    """Run each runner in a thread of its own; stop and close them all at the end."""
    threads = [threading.Thread(target=runner.run) for runner in runners]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        for runner in runners:
            runner.stop()
        for thread in threads:
            thread.join(timeout=60)
        for runner in runners:
            runner.close()
    assert not any(thread.is_alive() for thread in threads), "a runner did not stop"
