"""Events and waiting workflows: an inbox delivered once; workflows that wait, then resume."""

import dataclasses
import itertools
import logging
import threading
import time
from typing import Any

import pytest
from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.types import NotHandled
from helpers import integrity, persisted

from effectful_durable import (
    AgentRunner,
    InvalidEventError,
    NotFoundError,
    OnEvent,
    PersistentAgent,
    Store,
    TurnSuspended,
    requires_approval,
    wait_for_event,
)
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeLLM, ToolCall


@dataclasses.dataclass
class Clerk(PersistentAgent, OnEvent):
    """You keep the books."""

    @Tool.define
    @requires_approval
    def pay(self, invoice: str) -> str:
        """Pay an invoice."""
        return f"paid {invoice}"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


def start(store_url: str, agent_id: str = "clerk") -> None:
    """Give the agent its first version, so that events for it are accepted."""
    with persisted(store_url, FakeLLM(["ready"])):
        Clerk(agent_id=agent_id).ask("hello")


def run_runner(store_url: str, llm: FakeLLM, seconds: float = 1.0) -> AgentRunner:
    clock = FakeClock(1_900_000_000.0)

    def handlers(config: Any) -> list[Any]:
        return [LiteLLMProvider(model="fake"), llm]

    runner = AgentRunner(
        store_url, agents=lambda i: Clerk(agent_id=i), handlers=handlers, clock=clock
    )
    with runner:
        runner.run(until=clock.now() + seconds)
    return runner


class TestInbox:
    """Sending: checked, idempotent, refused for agents the database does not know."""

    def test_unknown_agent_is_refused_unless_created(self, store_url: str) -> None:
        with Store(store_url) as store:
            with pytest.raises(NotFoundError, match="no agent 'ghost'.*create=True"):
                store.send_event("ghost", "hello", {"x": 1})
            assert store.events(include_delivered=True) == []
            event = store.send_event("ghost", "hello", {"x": 1}, create=True)
            assert (event.agent_id, event.name, event.payload, event.status) == (
                "ghost",
                "hello",
                {"x": 1},
                "pending",
            )
            assert store.events() == [event]

    def test_a_key_sends_once(self, store_url: str) -> None:
        """A retried sender with the same key gets the first event back; nothing is added."""
        start(store_url)
        with Store(store_url) as store:
            first = store.send_event("clerk", "invoice", {"n": 7}, key="inv-7")
            again = store.send_event("clerk", "invoice", {"n": 7}, key="inv-7")
            assert again == first
            with pytest.raises(InvalidEventError, match="key 'inv-7' was used for another"):
                store.send_event("clerk", "invoice", {"n": 8}, key="inv-7")
            other = store.send_event("clerk", "invoice", {"n": 7}, key="inv-7b")
            assert len(store.events()) == 2
            assert other.event_id != first.event_id

    @pytest.mark.parametrize(
        ("agent_id", "name", "payload", "key", "why"),
        [
            ("", "x", None, None, "agent id"),
            ("clerk", "", None, None, "name must be a non-empty"),
            ("clerk", "a\nb", None, None, "printable"),
            ("clerk", "x" * 201, None, None, "at most 200"),
            ("clerk", "x", float("nan"), None, "JSON values"),
            ("clerk", "x", {1, 2}, None, "JSON values"),
            ("clerk", "x", "y" * (64 * 1024 + 1), None, "at most 65536 bytes"),
            ("clerk", "x", None, "\x00", "key"),
        ],
    )
    def test_bad_events_are_refused_and_nothing_is_written(
        self, store_url: str, agent_id: str, name: str, payload: Any, key: Any, why: str
    ) -> None:
        start(store_url)
        with Store(store_url) as store:
            with pytest.raises(InvalidEventError, match=why):
                store.send_event(agent_id, name, payload, key=key)
            assert store.events(include_delivered=True) == []

    def test_odd_text_reads_back_exactly(self, store_url: str) -> None:
        start(store_url)
        payload = {"note": "quotes \" ' and \\ — ünï 🚀", "nested": [1, 2.5, None, True]}
        with Store(store_url) as store:
            store.send_event("clerk", "odd ✓", payload)
            (event,) = store.events()
            assert (event.name, event.payload) == ("odd ✓", payload)


class TestDelivery:
    """A runner delivers each event as one committed turn of its agent."""

    def test_event_becomes_one_on_event_turn(self, store_url: str) -> None:
        start(store_url)
        with Store(store_url) as store:
            event = store.send_event("clerk", "invoice_received", {"invoice": "F-12"})
        llm = FakeLLM(["filed F-12"])
        runner = run_runner(store_url, llm)
        assert runner.turns == 1
        assert "invoice_received" in llm.calls[0].last_user_text
        assert '"invoice": "F-12"' in llm.calls[0].last_user_text
        run_runner(store_url, FakeLLM([]))  # nothing left: no model call
        with Store(store_url) as store:
            (done,) = store.events(include_delivered=True)
            assert (done.event_id, done.status, done.delivered_in) == (event.event_id, "done", 2)
            assert [v.template for v in store.versions("clerk")] == ["ask", "on_event"]
            assert integrity(store_url) == "ok"

    def test_an_event_turn_that_asks_approval_is_delivered_and_suspends(
        self, store_url: str
    ) -> None:
        """The delivery commits with the suspension; the decision then resumes the turn."""
        start(store_url)
        with Store(store_url) as store:
            store.send_event("clerk", "invoice_received", {"invoice": "F-13"})
        llm = FakeLLM([ToolCall("pay", {"invoice": "F-13"}), "paid it"])
        run_runner(store_url, llm)
        with Store(store_url) as store:
            (event,) = store.events(include_delivered=True)
            assert event.status == "done"
            (approval,) = store.approvals()
            store.approve(approval.approval_id, by="cfo")
        runner = run_runner(store_url, llm)
        assert runner.turns == 1
        with Store(store_url) as store:
            assert store.history("clerk")[-1]["content"] == "paid it"
            assert store.approvals() == []

    def test_rollback_and_fork_leave_the_inbox_alone(self, store_url: str) -> None:
        start(store_url)
        with Store(store_url) as store:
            store.send_event("clerk", "a", 1)
        run_runner(store_url, FakeLLM(["got a"]))
        with Store(store_url) as store:
            store.send_event("clerk", "b", 2)
            store.rollback("clerk", 1)
            events = {e.name: e.status for e in store.events(include_delivered=True)}
            assert events == {"a": "done", "b": "pending"}
            store.fork("clerk", 1, "twin")
            assert store.events("twin", include_delivered=True) == []


class TestWaitingWorkflows:
    """A workflow step that waits for an event or a decision: no process waits with it."""

    def program(self, store_url: str, llm: FakeLLM, timeout: float = 3600) -> Any:
        with persisted(store_url, llm, workflow="month-end") as persistence:
            clerk = Clerk(agent_id="clerk")
            clerk.ask("prepare the books")
            paid = wait_for_event(clerk, "payment", timeout=timeout)
            closing = clerk.ask(f"close the month; payment: {paid}")
            return persistence, paid, closing

    def test_wait_suspends_then_the_event_resumes_it(self, store_url: str) -> None:
        llm = FakeLLM(["prepared", "closed"])
        with pytest.raises(TurnSuspended, match="event 'payment' for agent 'clerk'") as waiting:
            self.program(store_url, llm)
        assert waiting.value.events[0][:2] == ("clerk", "payment")
        with pytest.raises(TurnSuspended):
            self.program(store_url, llm)  # not yet: no model call
        assert llm.call_count == 1
        with Store(store_url) as store:
            event = store.send_event("clerk", "payment", {"amount": 99}, key="pay-1")
            assert (event.status, event.taken_by) == ("done", "workflow 'month-end' step clerk#1")
        _, paid, closing = self.program(store_url, llm)
        assert paid is not None and paid["payload"] == {"amount": 99}
        assert closing == "closed"
        assert llm.call_count == 2  # the first step was replayed
        assert "'amount': 99" in llm.calls[1].last_user_text
        _, again, _ = self.program(store_url, llm)  # all replayed, the same answer
        assert again == paid and llm.call_count == 2

    def test_an_event_already_in_the_inbox_is_taken_at_once(self, store_url: str) -> None:
        start(store_url)
        with Store(store_url) as store:
            store.send_event("clerk", "payment", "early")
        _, paid, _ = self.program(store_url, FakeLLM(["prepared", "closed"]))
        assert paid is not None and paid["payload"] == "early"

    def test_past_the_timeout_the_wait_returns_none(self, store_url: str) -> None:
        llm = FakeLLM(["prepared", "closed without payment"])
        with pytest.raises(TurnSuspended):
            self.program(store_url, llm, timeout=0.05)
        time.sleep(0.1)
        _, paid, closing = self.program(store_url, llm, timeout=0.05)
        assert (paid, closing) == (None, "closed without payment")
        with Store(store_url) as store:  # a late event goes to the inbox
            assert store.send_event("clerk", "payment", 1).status == "pending"

    def test_a_step_waiting_for_approval_resumes_on_the_next_run(self, store_url: str) -> None:
        """Before the decision: no model call; after: the finished steps replay."""

        def program(llm: FakeLLM) -> list[str]:
            with persisted(store_url, llm, workflow="payables"):
                clerk = Clerk(agent_id="clerk")
                return [clerk.ask("list invoices"), clerk.ask("pay F-1")]

        llm = FakeLLM(["F-1 due", ToolCall("pay", {"invoice": "F-1"}), "paid F-1"])
        with pytest.raises(TurnSuspended) as suspended:
            program(llm)
        with pytest.raises(TurnSuspended):
            program(llm)
        assert llm.call_count == 2
        with Store(store_url) as store:
            (step,) = [s for s in store.steps("payables") if s.status == "running"]
            assert step.key == "clerk#1"
            store.approve(suspended.value.approvals[0].approval_id, by="cfo")
        assert program(llm) == ["F-1 due", "paid F-1"]
        assert llm.call_count == 3
        assert program(llm) == ["F-1 due", "paid F-1"]  # all replayed now
        assert llm.call_count == 3

    def test_parallel_agents_wait_at_once(self, store_url: str) -> None:
        """Two agents of one workflow, in threads, each wait for its own approval."""
        llm = FakeLLM([ToolCall("pay", {"invoice": "X"})] * 2 + ["done"] * 2)
        waits: list[TurnSuspended] = []

        def one(agent_id: str, persistence: Any) -> None:
            from effectful.ops.semantics import handler

            with handler(LiteLLMProvider(model="fake")), handler(llm), handler(persistence):
                try:
                    Clerk(agent_id=agent_id).ask("pay X")
                except TurnSuspended as suspended:
                    waits.append(suspended)

        with persisted(store_url, FakeLLM([]), workflow="fan-out") as persistence:
            threads = [threading.Thread(target=one, args=(a, persistence)) for a in ("a", "b")]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        assert sorted(w.agent_id or "" for w in waits) == ["a", "b"]
        with Store(store_url) as store:
            assert sorted(a.agent_id for a in store.approvals()) == ["a", "b"]


def test_a_failed_delivery_is_logged_as_an_event(
    store_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The runner's log calls a failed event delivery an event, not an alarm."""
    start(store_url)
    with Store(store_url) as store:
        event_id = store.send_event("clerk", "invoice", {"n": 1}).event_id
    caplog.set_level(logging.WARNING, logger="effectful_durable")
    run_runner(store_url, FakeLLM([RuntimeError("model down")]))
    assert f"delivery 1 of event {event_id} failed, retrying in" in caplog.text
    assert "alarm" not in caplog.text


def test_two_runners_deliver_each_event_once(store_url: str) -> None:
    """Two runners (threads, real clock) share 40 events of 4 agents: each is one turn."""
    from alarms_app import in_threads

    for agent_id in ("a", "b", "c", "d"):
        start(store_url, agent_id)
    with Store(store_url) as store:
        for n in range(40):
            store.send_event("abcd"[n % 4], "tick", {"n": n}, key=f"tick-{n}")

    def handlers(config: Any) -> list[Any]:
        return [LiteLLMProvider(model="fake"), FakeLLM(itertools.repeat("ok"))]

    runners = [
        AgentRunner(store_url, agents=lambda i: Clerk(agent_id=i), handlers=handlers)
        for _ in range(2)
    ]
    with Store(store_url) as store, in_threads(*runners):
        deadline = time.monotonic() + 60
        while store.events() and time.monotonic() < deadline:
            time.sleep(0.05)
    with Store(store_url) as store:
        events = store.events(include_delivered=True)
        assert [e.status for e in events] == ["done"] * 40
        for agent_id in "abcd":
            turns = [v for v in store.versions(agent_id) if v.template == "on_event"]
            assert len(turns) == 10
            delivered = {e.delivered_in for e in events if e.agent_id == agent_id}
            assert delivered == {v.version for v in turns}
        assert integrity(store_url) == "ok"
    assert sum(r.turns for r in runners) == 40


def test_an_event_for_an_agent_waiting_for_a_decision_is_put_back(store_url: str) -> None:
    """No turn can begin while the conversation waits: the event is put back, not leased."""
    with persisted(store_url, FakeLLM([ToolCall("pay", {"invoice": "F-9"})])):
        with pytest.raises(TurnSuspended):
            Clerk(agent_id="clerk").ask("pay F-9")
    with Store(store_url) as store:
        sent = store.send_event("clerk", "reminder", {"invoice": "F-9"})
    runner = run_runner(store_url, FakeLLM([]))
    assert runner.turns == 0
    with Store(store_url) as store:
        (event,) = store.events()
        assert (event.event_id, event.status, event.attempts) == (sent.event_id, "pending", 0)
        assert store.alarms(include_ended=True) == []  # events are not listed as alarms
        assert store.alarm_queue.counts(0.0)["events_pending"] == 1
