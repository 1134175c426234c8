"""Tool approvals: a turn suspends at a tool call that needs one, and resumes exactly once."""

import dataclasses
import datetime
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import RetryLLMHandler
from effectful.ops.types import NotHandled
from helpers import integrity, persisted, persisted_rows, running

from effectful_durable import (
    AgentRunner,
    InvalidDecisionError,
    NotFoundError,
    PersistenceHandler,
    PersistentAgent,
    Store,
    TurnSuspended,
    current_approval,
    requires_approval,
)
from effectful_durable.errors import DurableError
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeLLM, ToolCall

#: What the tools did, in order: (tool, arguments, approval id).
RAN: list[tuple[str, dict[str, Any], str | None]] = []


@pytest.fixture(autouse=True)
def _forget_runs() -> Iterator[None]:
    RAN.clear()
    yield
    RAN.clear()


@dataclasses.dataclass
class Shop(PersistentAgent):
    """You handle refunds."""

    @Tool.define
    @requires_approval(when=lambda order, amount: amount > 100, reason="a refund above 100 EUR")
    def refund(self, order: str, amount: float) -> str:
        """Refund ``amount`` EUR on ``order``."""
        RAN.append(("refund", {"order": order, "amount": amount}, current_approval()))
        return f"refunded {amount:g} EUR on {order}"

    @Tool.define
    def lookup(self, order: str) -> str:
        """Look an order up."""
        RAN.append(("lookup", {"order": order}, current_approval()))
        return f"order {order}: 3 items, paid"

    @Tool.define
    def email(self, to: str, text: str) -> str:
        """Send an email."""
        RAN.append(("email", {"to": to, "text": text}, current_approval()))
        return f"sent to {to}"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


BIG = ToolCall("refund", {"order": "A-1", "amount": 420})


def suspend_one(store_url: str, llm: FakeLLM, bot: Shop | None = None) -> str:
    """Run a turn that looks an order up and asks for a big refund; return the approval's id."""
    bot = bot or Shop(agent_id="shop")
    with persisted(store_url, llm), pytest.raises(TurnSuspended) as suspended:
        bot.ask("refund A-1")
    (approval,) = suspended.value.approvals
    return approval.approval_id


class TestSuspend:
    """A call that needs approval is not run: the turn commits up to it, and waits."""

    def test_turn_commits_up_to_the_call_and_raises(self, store_url: str) -> None:
        """The messages so far commit as a version; the caller gets the pending approval."""
        llm = FakeLLM([[ToolCall("lookup", {"order": "A-1"}), BIG]])
        approval_id = suspend_one(store_url, llm)
        assert [r[0] for r in RAN] == ["lookup"]  # the refund did not run
        with Store(store_url) as store:
            (approval,) = store.approvals()
            assert (approval.approval_id, approval.tool, approval.status) == (
                approval_id,
                "refund",
                "pending",
            )
            assert approval.arguments == {"order": "A-1", "amount": 420}
            assert approval.reason == "a refund above 100 EUR"
            where = (approval.agent_id, approval.suspended_in, approval.ended_in)
            assert where == ("shop", 1, None)
            roles = [m["role"] for m in store.history("shop")]
            assert roles == ["system", "user", "assistant", "tool"]  # no result for the refund
            assert store.handoffs() == []
            (version,) = store.versions("shop")
            assert version.detail == {"suspended": [approval_id]}

    def test_small_call_runs_without_asking(self, store_url: str) -> None:
        """``when`` narrows the rule: a refund of 20 runs at once."""
        llm = FakeLLM([ToolCall("refund", {"order": "B-2", "amount": 20}), "done"])
        with persisted(store_url, llm):
            assert Shop(agent_id="shop").ask("refund B-2") == "done"
        assert RAN == [("refund", {"order": "B-2", "amount": 20}, None)]

    def test_calling_again_before_a_decision_asks_nothing_and_writes_nothing(
        self, store_url: str
    ) -> None:
        """Another call while it waits raises TurnSuspended again: no model call, no write."""
        llm = FakeLLM([BIG])
        suspend_one(store_url, llm)
        with Store(store_url) as store:
            before = (store.versions("shop"), store.handoffs(), store.approvals(status=None))
        for request in ("refund A-1", "something else"):
            with persisted(store_url, llm), pytest.raises(TurnSuspended, match="waiting for appr"):
                Shop(agent_id="shop").ask(request)
        assert llm.call_count == 1
        with Store(store_url) as store:
            after = (store.versions("shop"), store.handoffs(), store.approvals(status=None))
            assert after == before

    def test_two_calls_in_one_message_wait_for_both_decisions(self, store_url: str) -> None:
        """Each call that needs approval is one row; the turn resumes once both are decided."""
        llm = FakeLLM([[BIG, ToolCall("refund", {"order": "C-3", "amount": 999})], "both handled"])
        with persisted(store_url, llm), pytest.raises(TurnSuspended) as suspended:
            Shop(agent_id="shop").ask("refund A-1 and C-3")
        first, second = (a.approval_id for a in suspended.value.approvals)
        with Store(store_url) as store:
            store.approve(first, by="ann")
        with persisted(store_url, llm), pytest.raises(TurnSuspended) as still:
            Shop(agent_id="shop").ask("refund A-1 and C-3")
        assert [a.approval_id for a in still.value.approvals if a.status == "pending"] == [second]
        with Store(store_url) as store:
            store.deny(second, by="bob", reason="C-3 was never paid")
        with persisted(store_url, llm):
            assert Shop(agent_id="shop").ask("refund A-1 and C-3") == "both handled"
        assert RAN == [("refund", {"order": "A-1", "amount": 420.0}, first)]
        assert llm.call_count == 2

    def test_handler_policy_asks_for_any_tool(self, store_url: str) -> None:
        """``needs_approval`` on the handler gates tools by name and arguments."""
        llm = FakeLLM([ToolCall("email", {"to": "boss@example.com", "text": "hi"}), "sent"])

        def policy(tool: str, arguments: dict[str, Any]) -> str | None:
            return "outside mail" if tool == "email" and "example.com" in arguments["to"] else None

        with persisted(store_url, llm, needs_approval=policy), pytest.raises(TurnSuspended) as s:
            Shop(agent_id="shop").ask("mail the boss")
        (approval,) = s.value.approvals
        assert (approval.tool, approval.reason) == ("email", "outside mail")
        assert RAN == []


class TestResume:
    """After the decision the turn goes on where it stopped, and the tool runs once."""

    def test_approved_call_runs_once_and_commits_with_the_turn(self, store_url: str) -> None:
        """Calling the agent again replays the model's answers, runs the tool, asks on."""
        llm = FakeLLM([[ToolCall("lookup", {"order": "A-1"}), BIG], "refunded 420"])
        approval_id = suspend_one(store_url, llm)
        with Store(store_url) as store:
            decided = store.approve(approval_id, by="alice", note="customer is a regular")
            assert (decided.status, decided.decided_by) == ("approved", "alice")
        bot = Shop(agent_id="shop")
        with persisted(store_url, llm):
            assert bot.ask("refund A-1") == "refunded 420"
        assert [r[0] for r in RAN] == ["lookup", "refund"]  # lookup was not run again
        assert RAN[1][2] == approval_id  # current_approval() inside the tool
        assert llm.call_count == 2
        with Store(store_url) as store:
            history = store.history("shop")
            assert [m["role"] for m in history] == [
                *("system", "user", "assistant", "tool", "tool", "assistant"),
            ]
            result = history[4]["content"]
            assert result[0]["text"] == "refunded 420 EUR on A-1"
            assert "Approved by alice (customer is a regular)" in result[-1]["text"]
            second = store.versions("shop")[1]
            assert (second.added, second.removed, second.detail) == (2, 0, {"resumed": 1})
            assert store.approval(approval_id).ended_in == 2
            assert store.approvals() == []
            assert integrity(store_url) == "ok"
        # The model was shown the recorded turn, not a new user message.
        assert [m["role"] for m in llm.calls[1].messages].count("user") == 1

    def test_denied_call_is_answered_with_the_reason(self, store_url: str) -> None:
        """The model reads the denial as the tool's result; the tool never runs."""
        reason = 'Not "paid": see ticket #12\nline two — ünïcödé 🚫'
        llm = FakeLLM([BIG, "sorry, refused"])
        approval_id = suspend_one(store_url, llm)
        with Store(store_url) as store:
            store.deny(approval_id, by="bob", reason=reason)
            assert store.approval(approval_id).note == reason
        with persisted(store_url, llm):
            assert Shop(agent_id="shop").ask("refund A-1") == "sorry, refused"
        assert RAN == []
        tool_result = llm.calls[1].messages[-1]
        assert tool_result["role"] == "tool"
        assert reason in tool_result["content"][0]["text"]
        assert "bob" in tool_result["content"][0]["text"]

    def test_edited_arguments_must_fit_and_the_model_is_told(self, store_url: str) -> None:
        """Arguments that do not fit the tool's schema change nothing; fitting ones run."""
        llm = FakeLLM([BIG, "partly refunded"])
        approval_id = suspend_one(store_url, llm)
        with Store(store_url) as store:
            bad_ones = ({"order": "A-1"}, {"order": "A-1", "amount": "lots"}, ["A-1"], {"x": 1})
            for bad in bad_ones:
                with pytest.raises(InvalidDecisionError, match="nothing was changed|JSON object"):
                    store.approve(approval_id, by="alice", arguments=bad)  # type: ignore[arg-type]
                assert store.approval(approval_id).status == "pending"
            store.approve(approval_id, by="alice", arguments={"order": "A-1", "amount": 200})
        with persisted(store_url, llm):
            Shop(agent_id="shop").ask("refund A-1")
        assert RAN == [("refund", {"order": "A-1", "amount": 200.0}, approval_id)]
        told = llm.calls[1].messages[-1]["content"][-1]["text"]
        assert 'changed to {"order": "A-1", "amount": 200}' in told

    def test_explicit_resume_returns_the_suspended_calls_result(self, store_url: str) -> None:
        """``PersistenceHandler.resume(agent)`` resumes without naming the call."""
        llm = FakeLLM([BIG, "done after approval"])
        approval_id = suspend_one(store_url, llm)
        bot = Shop(agent_id="shop")
        with persisted(store_url, llm) as persistence:
            with pytest.raises(TurnSuspended):
                persistence.resume(bot)
            persistence.store.approve(approval_id, by="alice")
            assert persistence.resume(bot) == "done after approval"
            with pytest.raises(NotFoundError, match="no turn of 'shop' is suspended"):
                persistence.resume(bot)
        assert len(RAN) == 1

    def test_another_call_resumes_the_suspended_one_first(self, store_url: str) -> None:
        """A new request after the decision: the waiting turn finishes, then the new one runs."""
        llm = FakeLLM([BIG, "refund done", "hello again"])
        approval_id = suspend_one(store_url, llm)
        with Store(store_url) as store:
            store.approve(approval_id, by="alice")
        with persisted(store_url, llm):
            assert Shop(agent_id="shop").ask("anything new?") == "hello again"
        assert len(RAN) == 1
        with Store(store_url) as store:
            assert [v.template for v in store.versions("shop")] == ["ask", "ask", "ask"]
            texts = [m.get("content") for m in store.history("shop") if m["role"] == "assistant"]
            assert texts[-2:] == ["refund done", "hello again"]

    def test_a_failing_approved_tool_is_an_error_the_model_reads(self, store_url: str) -> None:
        """An approved tool that raises is, under RetryLLMHandler, a tool error, once."""

        @dataclasses.dataclass
        class Flaky(Shop):
            @Tool.define
            @requires_approval
            def wipe(self, table: str) -> str:
                """Wipe a table."""
                RAN.append(("wipe", {"table": table}, current_approval()))
                raise RuntimeError("disk on fire")

        llm = FakeLLM([ToolCall("wipe", {"table": "t"}), "it failed"])
        approval_id = suspend_one(store_url, llm, Flaky(agent_id="shop"))
        with Store(store_url) as store:
            store.approve(approval_id, by="alice")
        persistence = PersistenceHandler(store_url)
        try:
            with running(llm, RetryLLMHandler(), persistence):
                assert Flaky(agent_id="shop").ask("refund A-1") == "it failed"
        finally:
            persistence.close()
        assert [r[0] for r in RAN] == ["wipe"]
        assert "disk on fire" in str(llm.calls[1].messages[-1]["content"])


class TestDecisions:
    """A decision is recorded once; bad ones are clear errors that change nothing."""

    def test_second_decision_and_unknown_id_change_nothing(self, store_url: str) -> None:
        approval_id = suspend_one(store_url, FakeLLM([BIG]))
        with Store(store_url) as store:
            store.approve(approval_id, by="alice")
            before = store.approvals(status=None)
            with pytest.raises(InvalidDecisionError, match="approved already by alice"):
                store.deny(approval_id, by="bob", reason="too late")
            with pytest.raises(InvalidDecisionError, match="approved already"):
                store.approve(approval_id, by="bob")
            with pytest.raises(NotFoundError, match="no approval 'apr_nope'"):
                store.approve("apr_nope", by="bob")
            with pytest.raises(NotFoundError):
                store.deny("\0\ud800", by="bob", reason="x")
            assert store.approvals(status=None) == before

    def test_a_denial_needs_a_reason_of_text(self, store_url: str) -> None:
        approval_id = suspend_one(store_url, FakeLLM([BIG]))
        with Store(store_url) as store:
            for reason in ("", "   ", "a\0b", "x" * 2001, 42):
                with pytest.raises(InvalidDecisionError):
                    store.deny(approval_id, by="bob", reason=reason)  # type: ignore[arg-type]
            assert store.approval(approval_id).status == "pending"

    def test_two_deciders_at_once_one_wins(self, store_url: str) -> None:
        """Threads racing to decide one approval: exactly one decision is recorded."""
        approval_id = suspend_one(store_url, FakeLLM([BIG]))
        outcomes: list[str] = []
        barrier = threading.Barrier(4)

        def decide(n: int) -> None:
            with Store(store_url) as store:
                barrier.wait()
                try:
                    if n % 2:
                        store.approve(approval_id, by=f"decider-{n}")
                    else:
                        store.deny(approval_id, by=f"decider-{n}", reason="no")
                    outcomes.append(f"decider-{n}")
                except InvalidDecisionError:
                    outcomes.append("refused")

        threads = [threading.Thread(target=decide, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert outcomes.count("refused") == 3
        (winner,) = [o for o in outcomes if o != "refused"]
        with Store(store_url) as store:
            assert store.approval(approval_id).decided_by == winner
            assert len(store.approvals(status=None)) == 1


class TestAuditTrail:
    """What the page's inbox reads: the decisions, filtered, and the tool's schema."""

    def test_decisions_newest_first_filtered(self, store_url: str) -> None:
        """Decided approvals, newest decision first, by decision, decider (any case),
        agent id text (any case) and time; pending ones are not listed."""
        ann = suspend_one(store_url, FakeLLM([BIG]), Shop(agent_id="shop-ann"))
        ben = suspend_one(store_url, FakeLLM([BIG]), Shop(agent_id="shop-ben"))
        waiting = suspend_one(store_url, FakeLLM([BIG]), Shop(agent_id="cleo"))
        with Store(store_url) as store:
            store.approve(ann, by="Alice", note="fine")
            denied = store.deny(ben, by="bob", reason="no")
            assert denied.decided_at is not None

            def listed(**wanted: Any) -> list[str]:
                return [a.approval_id for a in store.decisions(**wanted).approvals]

            assert listed() == [ben, ann]
            assert listed(status="approved") == [ann]
            assert listed(status="cancelled") == []
            assert listed(by="ALICE") == [ann] and listed(by="al") == []
            assert listed(agent_text="ANN") == [ann] and listed(agent_text="%") == []
            assert listed(since=denied.decided_at) == [ben]
            assert listed(until=denied.decided_at) == [ann]
            page = store.decisions(per_page=1, page=2)
            assert ([a.approval_id for a in page.approvals], page.total, page.pages) == (
                [ann],
                2,
                2,
            )
            assert waiting not in listed()
            for bad in ({"status": "pending"}, {"page": 0}, {"per_page": 501}):
                with pytest.raises(ValueError):
                    store.decisions(**bad)  # type: ignore[arg-type]

    def test_the_tools_parameters(self, store_url: str) -> None:
        """The JSON schema an approval's edited arguments must fit, as the model saw it."""
        approval_id = suspend_one(store_url, FakeLLM([BIG]))
        with Store(store_url, readonly=True) as store:
            schema = store.approval_parameters(approval_id)
            assert schema["type"] == "object"
            assert set(schema["properties"]) == {"order", "amount"}
            assert schema["properties"]["amount"]["type"] == "number"
            with pytest.raises(NotFoundError, match="no approval 'apr_nope'"):
                store.approval_parameters("apr_nope")


class TestVersions:
    """Rollback and fork know what a suspension is."""

    def test_rollback_before_the_suspension_cancels_it(self, store_url: str) -> None:
        llm = FakeLLM(["hi", BIG, "fresh start"])
        bot = Shop(agent_id="shop")
        with persisted(store_url, llm):
            bot.ask("hello")
        approval_id = suspend_one(store_url, llm, bot)
        with Store(store_url) as store:
            store.rollback("shop", 1)
            cancelled = store.approval(approval_id)
            assert (cancelled.status, cancelled.ended_in) == ("cancelled", 3)
            with pytest.raises(InvalidDecisionError, match="cancelled already"):
                store.approve(approval_id, by="alice")
        with persisted(store_url, llm):
            assert Shop(agent_id="shop").ask("start over") == "fresh start"
        assert RAN == []

    def test_rollback_into_a_resumed_suspension_asks_again(self, store_url: str) -> None:
        llm = FakeLLM([BIG, "done", "done again"])
        approval_id = suspend_one(store_url, llm)
        with Store(store_url) as store:
            store.approve(approval_id, by="alice")
        with persisted(store_url, llm):
            Shop(agent_id="shop").ask("refund A-1")
        with Store(store_url) as store:
            store.rollback("shop", 1)
            again = store.approval(approval_id)
            assert (again.status, again.decided_by, again.ended_in) == ("pending", None, None)
            assert again.note == "asked again: rolled back to version 1"
            store.approve(approval_id, by="carol")
        with persisted(store_url, llm):
            assert Shop(agent_id="shop").ask("refund A-1") == "done again"
        assert [r[2] for r in RAN] == [approval_id, approval_id]  # the docs say so

    def test_fork_of_a_suspended_version_is_refused(self, store_url: str) -> None:
        llm = FakeLLM(["hi", BIG])
        bot = Shop(agent_id="shop")
        with persisted(store_url, llm):
            bot.ask("hello")
        suspend_one(store_url, llm, bot)
        with Store(store_url) as store:
            with pytest.raises(DurableError, match="fork version 1 or one after"):
                store.fork("shop", 2, "copy")
            assert [a.agent_id for a in store.agents()] == ["shop"]
            store.fork("shop", 1, "copy")

    @pytest.mark.parametrize("rule", ["keep", "older-than"])
    def test_prune_deletes_decided_approvals_with_their_versions(
        self, store_url: str, rule: str
    ) -> None:
        """A decision whose turn resumed goes with the versions up to its resumption (and
        its resumption's row of the runners' queue); one that waits, decided or not, stays."""
        llm = FakeLLM([BIG, "refunded", "hi", BIG, BIG])
        resumed = suspend_one(store_url, llm)  # version 1
        with Store(store_url) as store:
            store.approve(resumed, by="alice")
        with persisted(store_url, llm):
            bot = Shop(agent_id="shop")
            bot.ask("refund A-1")  # 2
            bot.ask("hello")  # 3
        waiting = suspend_one(store_url, llm, Shop(agent_id="other"))
        decided = suspend_one(store_url, llm, Shop(agent_id="third"))
        with Store(store_url) as store:
            store.deny(decided, by="bob", reason="no")  # decided, its turn not resumed yet
            if rule == "keep":
                store.prune(keep_versions=1)
            else:
                store.prune(older_than=datetime.timedelta(0))
            left = {a.approval_id: a.status for a in store.approvals(status=None)}
            assert left == {waiting: "pending", decided: "denied"}
            assert store.alarm_queue.counts(0.0)["resumes_pending"] == 1  # the denied one's
        assert persisted_rows(store_url, "SELECT count(*) FROM alarms WHERE kind = 'resume'") == [
            (1,)
        ]


class TestRunner:
    """A runner resumes decided turns: exactly once, whoever else tries."""

    def test_runner_resumes_a_decided_turn(self, store_url: str) -> None:
        llm = FakeLLM([BIG, "refunded by the runner"])
        approval_id = suspend_one(store_url, llm)
        clock = FakeClock(1_900_000_000.0)

        def handlers(config: Any) -> list[Any]:
            from effectful.handlers.llm.completions import LiteLLMProvider

            return [LiteLLMProvider(model="fake"), llm]

        with Store(store_url) as store:
            with AgentRunner(
                store_url, agents=lambda i: Shop(agent_id=i), handlers=handlers, clock=clock
            ) as runner:
                runner.run(until=clock.now() + 1)
                assert runner.turns == 0  # nothing decided yet: nothing to resume
                store.approve(approval_id, by="alice")
                runner.run(until=clock.now() + 2)
                assert runner.turns == 1
            assert len(RAN) == 1
            assert store.history("shop")[-1]["content"] == "refunded by the runner"
            assert store.alarm_queue.counts(0.0)["resumes_pending"] == 0
        # The caller who comes back later finds nothing to resume: it is a new turn.
        with persisted(store_url, FakeLLM(["new"])):
            assert Shop(agent_id="shop").ask("refund A-1") == "new"
        assert len(RAN) == 1


def test_a_backup_carries_the_suspension_and_the_inbox(store_url: str, tmp_path: Any) -> None:
    """A copy made while a turn waits resumes there, with its decision and its events."""
    llm = FakeLLM([BIG, "resumed in the copy"])
    approval_id = suspend_one(store_url, llm)
    with Store(store_url) as store:
        store.send_event("shop", "ping", {"n": 1}, key="k1")
        store.approve(approval_id, by="alice")
        store.backup(tmp_path / "copy.db")
    copy = str(tmp_path / "copy.db")
    with Store(copy) as copied:
        assert copied.approval(approval_id).status == "approved"
        assert [e.name for e in copied.events()] == ["ping"]
        assert copied.send_event("shop", "ping", {"n": 1}, key="k1").status == "pending"
    with persisted(copy, llm):
        assert Shop(agent_id="shop").ask("refund A-1") == "resumed in the copy"
    assert len(RAN) == 1
