"""Calls that meet a decided, suspended turn of another call, which must resume first.

The runner's delivery of an event (or alarm) is marked done in the commit of the
turn that delivers it. When the agent's conversation holds a suspended turn whose
approvals are all decided, the delivering call resumes that turn first (it commits
on its own), then runs its own turn: the delivery belongs to that second turn.

A resumption (the runner's, or ``PersistenceHandler.resume``) reads the suspended
turn, then calls it again. If meanwhile another process resumed it and a later
turn suspended and was decided, the resumption resumes that later turn; it never
runs the call it read as a new turn.
"""

import time
from pathlib import Path
from typing import Any

import pytest
from approvals_app import TOOL_LOG_ENV, Shop, answer, suspend, text_of
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler

from effectful_durable import (
    AgentRunner,
    PersistenceHandler,
    RunnerConfig,
    Store,
    TurnSuspended,
)
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeCall, FakeLLM, Reply

START = 1_800_000_000.0


@pytest.fixture(autouse=True)
def _tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOOL_LOG_ENV, str(tmp_path / "tool-runs.jsonl"))


class TestEventAfterResumeFirst:
    """An event that arrives while the agent's turn waits for a decision."""

    def test_event_marked_done_by_its_own_turn(self, store_url: str) -> None:
        """The event's delivery commits with its on_event turn, not the resumed turn."""
        approval_id = suspend(store_url)
        with Store(store_url) as store:
            event = store.send_event("shop-0", "restock", {"nonce": "pl-1"})
            time.sleep(0.01)  # the event is due before the resumption
            store.approve(approval_id, by="alice")
            failures = []

            def answer_once_failing(call: FakeCall) -> Reply:
                if "restock" in call.last_user_text and not failures:
                    failures.append(call)
                    raise RuntimeError("the model is down")
                return answer(call)

            def handlers(config: RunnerConfig) -> list[Any]:
                return [LiteLLMProvider(model="fake"), FakeLLM(respond=answer_once_failing)]

            config = RunnerConfig(backoff_base=1.0)
            with AgentRunner(
                store_url,
                agents=lambda agent_id: Shop(agent_id=agent_id),
                handlers=handlers,
                config=config,
                clock=FakeClock(START),
            ) as runner:
                runner.run(until=START + 3600)
            assert failures, "the event's turn never ran"
            (done,) = store.events(include_delivered=True)
            assert (done.event_id, done.status) == (event.event_id, "done")
            versions = store.versions("shop-0")
            assert [v.template for v in versions] == ["ask", "ask", "on_event"]
            assert versions[1].detail == {"resumed": 1}
            assert done.delivered_in == 3  # by its own turn, which its retry committed
            history = store.history("shop-0")
            assert sum("pl-1" in text_of(m) for m in history) == 1


class TestStaleResumption:
    """A resumption whose suspended turn was resumed elsewhere, and a later one decided."""

    def test_resumes_the_later_turn_and_repeats_nothing(self, store_url: str) -> None:
        """It resumes the decided later turn; the call it read never runs again as a new turn."""
        persistence = PersistenceHandler(store_url)
        store = persistence.store
        shop = Shop(agent_id="shop-0")
        with (
            handler(LiteLLMProvider(model="fake")),
            handler(FakeLLM(respond=answer)),
            handler(persistence),
        ):
            with pytest.raises(TurnSuspended) as first:
                shop.ask("o1")
            store.approve(first.value.approvals[0].approval_id, by="alice")
            stale = store.suspension("shop-0")  # what a runner read, before:
            assert stale is not None
            assert shop.ask("o1") == "done o1"  # another process resumed it,
            with pytest.raises(TurnSuspended) as second:
                shop.ask("o2")  # and a later turn suspended, and was decided
            store.approve(second.value.approvals[0].approval_id, by="bob")
            # The runner now calls the turn it read again (resume_queued's next step).
            assert persistence._resume_call(shop, stale) == "done o2"
        persistence.close()
        with Store(store_url) as reader:
            versions = reader.versions("shop-0")
            assert [v.detail for v in versions] == [
                {"suspended": [first.value.approvals[0].approval_id]},
                {"resumed": 1},
                {"suspended": [second.value.approvals[0].approval_id]},
                {"resumed": 3},
            ]
            assert [a.arguments["order"] for a in reader.approvals(status=None)] == ["o1", "o2"]
            assert reader.suspension("shop-0") is None
