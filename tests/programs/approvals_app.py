"""A shop agent whose payments wait for a person, and the runner factories (approval kill tests).

``Shop.ask(order)`` is a turn in which the fake model calls ``pay(order)``, a tool
marked ``requires_approval``: the turn suspends there. Once decided and resumed, the
model answers ``done <order>``. ``on_event(name, payload)`` turns are answered
``noted <name>`` with no tool call.

``pay`` runs only with an approval. Before it returns, it appends one JSON line
``{"approval", "order", "nonce", "pid"}`` to the file named by
``$APPROVALS_APP_TOOL_LOG`` (O_APPEND, then fsync), and returns ``paid <order>
nonce <nonce>``: the side file shows every run of the tool, the committed history
the runs whose turn committed. With ``$APPROVALS_APP_JITTER=s``, each model answer
and each tool run waits a random 0..s seconds (so that kills land inside them);
``$APPROVALS_APP_ANNOUNCE=1`` makes the tool print ``ran <pid> <approval>`` on
stdout once its line is on disk, then wait ``$APPROVALS_APP_HOLD`` seconds more
(default 0.02), for a test to kill the process between the run and the commit.
"""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dataclasses
import random
import re
import secrets
import sys
import time
from typing import Any

from approvals_child import append_line
from child import model_stack, running
from effectful.handlers.llm import Template, Tool
from effectful.ops.types import NotHandled

from effectful_durable import (
    OnEvent,
    PersistentAgent,
    RunnerConfig,
    current_approval,
    requires_approval,
)
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

TOOL_LOG_ENV = "APPROVALS_APP_TOOL_LOG"
JITTER = float(os.environ.get("APPROVALS_APP_JITTER", "0"))
ANNOUNCE = os.environ.get("APPROVALS_APP_ANNOUNCE") == "1"
HOLD = float(os.environ.get("APPROVALS_APP_HOLD", "0.02"))
ORDER = re.compile(r"Take order (\S+)\.")
EVENT = re.compile(r"An event was sent to you: (.*?)\. Its payload")
PAID = re.compile(r"paid (\S+) nonce ([0-9a-f]+)")


def pause() -> None:
    if JITTER:
        time.sleep(random.uniform(0, JITTER))


@dataclasses.dataclass
class Shop(PersistentAgent, OnEvent):
    """You take orders; every payment waits for a person's approval."""

    @Tool.define
    @requires_approval(reason="a payment")
    def pay(self, order: str) -> str:
        """Pay for an order."""
        nonce = secrets.token_hex(8)
        approval = current_approval()
        append_line(
            os.environ[TOOL_LOG_ENV],
            {"approval": approval, "order": order, "nonce": nonce, "pid": os.getpid()},
        )
        if ANNOUNCE:
            os.write(sys.stdout.fileno(), f"ran {os.getpid()} {approval}\n".encode())
            time.sleep(HOLD)
        pause()
        return f"paid {order} nonce {nonce}"

    @Template.define
    def ask(self, order: str) -> str:
        """Take order {order}."""
        raise NotHandled


def answer(call: FakeCall) -> Reply:
    """The fake model: pay for the order, then say done; note events (module docstring)."""
    pause()
    text = call.last_user_text
    order = ORDER.search(text)
    if order is not None:
        if call.messages[-1]["role"] == "tool":
            return f"done {order[1]}"
        # A unique call id, as a real model's: ids repeat nowhere in a history.
        return ToolCall("pay", {"order": order[1]}, id=f"call_{secrets.token_hex(6)}")
    event = EVENT.search(text)
    if event is not None:
        return f"noted {event[1]}"
    return "ok"


def make_agent(agent_id: str) -> Shop:
    """The runner's agent factory."""
    return Shop(agent_id=agent_id)


def make_handlers(config: RunnerConfig) -> list[Any]:
    """The runner's handler factory: the fake model under a LiteLLMProvider."""
    return model_stack(FakeLLM(respond=answer), model=config.model or "fake")


def suspend(db: str, agent_id: str = "shop-0") -> str:
    """Run a turn of ``agent_id`` that suspends at its ``pay`` call; the approval's id."""
    from effectful.ops.semantics import handler

    from effectful_durable import PersistenceHandler, TurnSuspended

    persistence = PersistenceHandler(db)
    try:
        with running(FakeLLM(respond=answer)):
            with handler(persistence):
                Shop(agent_id=agent_id).ask("o1")
    except TurnSuspended as suspended:
        return str(suspended.approvals[0].approval_id)
    finally:
        persistence.close()
    msg = f"the turn of {agent_id} did not suspend"
    raise AssertionError(msg)


def text_of(message: dict[str, Any]) -> str:
    """A message's text, whether its content is a string or a list of blocks."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(block.get("text", "") for block in content if isinstance(block, dict))
