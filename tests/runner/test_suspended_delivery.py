"""An event or alarm for a conversation whose turn waits for approval waits too.

Such a delivery cannot start a turn: the conversation's suspended turn must resume
first. The runner puts the claim back, without counting a turn or an attempt, and
delivers it once the suspended turn has resumed.
"""

import dataclasses
from typing import Any

from effectful.handlers.llm import Tool
from effectful.handlers.llm.completions import LiteLLMProvider

from effectful_durable import (
    AgentRunner,
    OnEvent,
    PersistentAgent,
    RunnerConfig,
    Store,
    requires_approval,
)
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

START = 1_800_000_000.0
RAN: list[tuple[str, float]] = []


@dataclasses.dataclass
class Till(PersistentAgent, OnEvent):
    """You pay refunds."""

    @Tool.define
    @requires_approval(when=lambda order, amount: amount > 100, reason="large refund")
    def refund(self, order: str, amount: float) -> str:
        """Refund ``amount`` on ``order``."""
        RAN.append((order, amount))
        return f"refunded {amount} on {order}"


def answer(call: FakeCall) -> Reply:
    if call.messages[-1]["role"] == "tool":
        return "done"
    order = next(word for word in ("big", "small", "tiny") if word in call.last_user_text)
    return ToolCall("refund", {"order": order, "amount": 500 if order == "big" else 5})


def runner(store_url: str, clock: FakeClock, model: FakeLLM) -> AgentRunner:
    def handlers(config: RunnerConfig) -> list[Any]:
        return [LiteLLMProvider(model="fake"), model]

    return AgentRunner(
        store_url, agents=lambda agent_id: Till(agent_id=agent_id), handlers=handlers, clock=clock
    )


class TestEventBehindASuspendedTurn:
    def test_waits_without_turns_then_is_delivered_after_the_resumption(
        self, store_url: str
    ) -> None:
        """The later events are not turns while the first waits; after the approval, the
        suspended turn resumes and then the events are delivered, each once, in the
        order they were sent."""
        RAN.clear()
        clock, model = FakeClock(START), FakeLLM(respond=answer)
        with Store(store_url) as store:
            store.send_event("till", "request", "big", create=True)
            store.send_event("till", "request", "small", create=True)
            store.send_event("till", "request", "tiny", create=True)
        with runner(store_url, clock, model) as first:
            first.run(until=START + 3600)
            assert (first.turns, first.errors) == (1, 0)  # the suspended one only
        assert model.call_count == 1 and RAN == []
        with Store(store_url) as store:
            held = [e for e in store.events("till") if e.payload != "big"]
            assert [(e.status, e.attempts) for e in held] == [("pending", 0)] * 2
            (waiting,) = store.approvals("till")
            store.approve(waiting.approval_id, by="alice")
        with runner(store_url, clock, model) as second:
            second.run(until=START + 7200)
            assert (second.turns, second.errors) == (3, 0)
        assert RAN == [("big", 500.0), ("small", 5.0), ("tiny", 5.0)]
        with Store(store_url) as store:
            assert store.events("till") == []
            details = [v.detail for v in store.versions("till")]
            assert details[:2] == [{"suspended": [waiting.approval_id]}, {"resumed": 1}]
