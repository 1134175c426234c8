"""An agent whose event turns take as long as its runner is told (tests/runner/test_heartbeats).

``--agents heartbeat_app:make_agent --handlers heartbeat_app:make_handlers`` plug
it into ``effectful-durable run``. Each event turn's model call appends a line
``<host> <pid> <time> <payload>`` to the file ``HEARTBEAT_APP_STARTS`` names (so that a
test counts how often, and where, a turn began), then sleeps before answering:
the payload's ``"seconds"`` if it has them, else ``HEARTBEAT_APP_SECONDS``.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import contextlib
import dataclasses
import json
import re
import socket
import time
from typing import Any

from child import model_stack

from effectful_durable import OnEvent, PersistentAgent, RunnerConfig
from effectful_durable.testing import FakeCall, FakeLLM

PAYLOAD = re.compile(r"Its payload, as JSON: (.*?)\. Handle it", re.S)
SECONDS = float(os.environ.get("HEARTBEAT_APP_SECONDS", "0"))
STARTS = os.environ.get("HEARTBEAT_APP_STARTS")


@dataclasses.dataclass
class Waiter(PersistentAgent, OnEvent):
    """You handle events."""


def answer(call: FakeCall) -> str:
    """Note where the turn began, take the time the runner was told, answer."""
    found = PAYLOAD.search(call.last_user_text)
    payload = found[1] if found else "?"
    seconds = SECONDS
    with contextlib.suppress(ValueError, TypeError, KeyError):
        seconds = float(json.loads(payload)["seconds"])
    if STARTS:
        line = f"{socket.gethostname()} {os.getpid()} {time.time():.3f} {payload}\n"
        descriptor = os.open(STARTS, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, line.encode())
        finally:
            os.close(descriptor)
    time.sleep(seconds)
    return f"handled {payload}"


def make_agent(agent_id: str) -> Waiter:
    """The runner's agent factory."""
    return Waiter(agent_id=agent_id)


def make_handlers(config: RunnerConfig) -> list[Any]:
    """The runner's handler factory: the fake model under a LiteLLMProvider."""
    return model_stack(FakeLLM(respond=answer))
