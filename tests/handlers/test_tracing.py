"""OpenTelemetry traces: the span tree of turns, tools, failures, replays and deliveries.

Spans go to the SDK's in-memory exporter through a TracerProvider of the test's
own (never the global one), so tests do not see each other's spans.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import litellm
import pytest
from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider, RetryLLMHandler, completion
from effectful.ops.semantics import fwd
from effectful.ops.types import NotHandled
from helpers import Assistant, Manager, persisted, running
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from effectful_durable import (
    AgentRunner,
    AlarmTools,
    CompactionHandler,
    OnEvent,
    PersistenceHandler,
    PersistentAgent,
    Store,
    TurnSuspended,
    requires_approval,
)
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeCall, FakeLLM, Raw, ToolCall


class Spans:
    """A TracerProvider writing to memory, and the tree of what it recorded."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))

    @property
    def finished(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [span for span in self.finished if span.name.startswith(prefix)]

    def children(self, parent: ReadableSpan) -> list[str]:
        """The names of ``parent``'s children, in the order they started."""
        spans = sorted(self.finished, key=lambda span: span.start_time or 0)
        return [
            span.name
            for span in spans
            if span.parent is not None and span.parent.span_id == parent.context.span_id
        ]

    def clear(self) -> None:
        self.exporter.clear()


@pytest.fixture
def spans() -> Iterator[Spans]:
    recorded = Spans()
    yield recorded
    recorded.provider.shutdown()


def attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def trace_id_of(traceparent: str) -> tuple[int, int]:
    """(trace id, span id) of a W3C traceparent."""
    _, trace_id, span_id, _ = traceparent.split("-")
    return int(trace_id, 16), int(span_id, 16)


@dataclasses.dataclass
class Counter(PersistentAgent):
    """You count."""

    @Template.define
    def number(self, question: str) -> int:
        """Answer with a number: {question}"""
        raise NotHandled


@dataclasses.dataclass
class Fragile(PersistentAgent):
    """Your tool breaks."""

    @Tool.define
    def explode(self, secret: str) -> str:
        """Explode."""
        raise ValueError(f"tool exploded: {secret}")  # as errors often do: repeats input

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


class TestTurn:
    """A turn is one invoke_agent span; its load, model calls and commit are its children."""

    def test_plain_turn(self, store_url: str, spans: Spans) -> None:
        """A first turn: load, chat, commit under invoke_agent, with the GenAI attributes."""
        with persisted(store_url, FakeLLM(["hello", "again"]), tracing=spans.provider):
            bot = Assistant(agent_id="bot")
            bot.ask("hi")
            (turn,) = spans.named("invoke_agent")
            assert turn.name == "invoke_agent Assistant"
            assert turn.parent is None
            assert spans.children(turn) == [
                "effectful_durable.load",
                "chat fake",
                "effectful_durable.commit",
            ]
            assert attributes(turn) == {
                "gen_ai.operation.name": "invoke_agent",
                "gen_ai.agent.id": "bot",
                "gen_ai.agent.name": "Assistant",
                "gen_ai.conversation.id": "default",
                "effectful_durable.template": "ask",
                "effectful_durable.base_version": 0,
                "effectful_durable.version": 1,
                "effectful_durable.outcome": "committed",
            }
            (chat,) = spans.named("chat")
            chat_attributes = attributes(chat)
            assert chat_attributes["gen_ai.operation.name"] == "chat"
            assert chat_attributes["gen_ai.request.model"] == "fake"
            assert chat_attributes["gen_ai.response.id"] == "fake-1"
            assert chat_attributes["effectful_durable.attempt"] == 1
            (load,) = spans.named("effectful_durable.load")
            assert attributes(load)["effectful_durable.messages"] == 0
            assert attributes(load)["effectful_durable.load.ms"] >= 0
            (commit,) = spans.named("effectful_durable.commit")
            # system, user, assistant messages + the version, agent and handoff rows
            assert attributes(commit)["effectful_durable.commit.rows"] == 6
            assert attributes(commit)["effectful_durable.commit.bytes"] > 100
            spans.clear()
            bot.ask("again")  # loaded already: no load span
            (turn,) = spans.named("invoke_agent")
            assert spans.children(turn) == ["chat fake", "effectful_durable.commit"]
            assert attributes(turn)["effectful_durable.version"] == 2
        with Store(store_url) as store:
            (first, second) = store.versions("bot")
            assert first.detail is not None and "trace" in first.detail

    def test_token_usage_is_recorded(self, db_path: Path, spans: Spans) -> None:
        """The usage the provider reports becomes gen_ai.usage.input/output_tokens."""

        def with_usage(*args: Any, **kwargs: Any) -> Any:
            response = fwd()
            response.usage = litellm.Usage(prompt_tokens=42, completion_tokens=7, total_tokens=49)
            return response

        persistence = PersistenceHandler(db_path, tracing=spans.provider)
        with running(FakeLLM(["ok"]), {completion: with_usage}, persistence):
            Assistant(agent_id="bot").ask("hi")
        persistence.close()
        (chat,) = spans.named("chat")
        assert attributes(chat)["gen_ai.usage.input_tokens"] == 42
        assert attributes(chat)["gen_ai.usage.output_tokens"] == 7

    def test_retries_are_numbered(self, db_path: Path, spans: Spans) -> None:
        """A reply RetryLLMHandler retries gives a second chat span, attempt 2."""
        persistence = PersistenceHandler(db_path, tracing=spans.provider)
        with running(FakeLLM([Raw("not a number"), 42]), RetryLLMHandler(), persistence):
            assert Counter(agent_id="c").number("how many?") == 42
        persistence.close()
        chats = spans.named("chat")
        assert [attributes(c)["effectful_durable.attempt"] for c in chats] == [1, 2]

    def test_tracing_needs_no_sdk(self, db_path: Path) -> None:
        """tracing=True with no SDK configured (the API's no-op tracer) runs turns as usual."""
        with persisted(db_path, FakeLLM(["ok"]), tracing=True):
            Assistant(agent_id="bot").ask("hi")
        with Store(db_path) as store:
            assert [v.version for v in store.versions("bot")] == [1]

    def test_code_version(self, db_path: Path, spans: Spans) -> None:
        """A handler's code_version is an attribute of each turn's span, as of its version."""
        persisted_with = persisted(
            db_path, FakeLLM(["hello"]), tracing=spans.provider, code_version="3f2c1ab"
        )
        with persisted_with:
            Assistant(agent_id="bot").ask("hi")
        (turn,) = spans.named("invoke_agent")
        assert attributes(turn)["effectful_durable.code_version"] == "3f2c1ab"
        with Store(str(db_path), readonly=True) as store:
            assert store.versions("bot")[-1].code_version == "3f2c1ab"


class TestToolTurn:
    """Each tool call is an execute_tool span; its arguments only when asked for."""

    def test_tool_turn(self, db_path: Path, spans: Spans) -> None:
        """chat, execute_tool, chat; no arguments recorded by default."""
        script = [ToolCall("remember", {"note": "the code is 1234"}), "noted"]
        with persisted(db_path, FakeLLM(script), tracing=spans.provider):
            Assistant(agent_id="bot").ask("remember the code")
        (turn,) = spans.named("invoke_agent")
        assert spans.children(turn) == [
            "effectful_durable.load",
            "chat fake",
            "execute_tool remember",
            "chat fake",
            "effectful_durable.commit",
        ]
        (tool,) = spans.named("execute_tool")
        assert attributes(tool) == {
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "remember",
            "gen_ai.tool.type": "function",
            "gen_ai.tool.call.id": "call_1_0",
            "effectful_durable.outcome": "ok",
        }
        assert not any("1234" in str(attributes(span)) for span in spans.finished)

    def test_tool_arguments_when_opted_in_are_cut(self, db_path: Path, spans: Spans) -> None:
        """With trace_tool_arguments, the arguments are recorded, cut to 1,024 characters
        with the marker that says so (arguments that fit are recorded whole)."""
        script = [
            ToolCall("remember", {"note": "x" * 5000}),
            ToolCall("remember", {"note": "y" * 1012}),
            ToolCall("remember", {"note": "z" * 1013}),
            "noted",
        ]
        with persisted(
            db_path, FakeLLM(script), tracing=spans.provider, trace_tool_arguments=True
        ):
            Assistant(agent_id="bot").ask("remember")
        cut, whole, over = (
            attributes(s)["gen_ai.tool.call.arguments"] for s in spans.named("execute_tool")
        )
        assert cut.startswith('{"note": "xxx')
        assert cut.endswith("xxx... (5012 characters)")
        assert len(cut) == 1024
        assert whole == json.dumps({"note": "y" * 1012})  # 1,024 characters: kept whole
        assert len(over) == 1024 and over.endswith("zzz... (1025 characters)")

    def test_failing_tool(self, db_path: Path, spans: Spans) -> None:
        """A tool that raises is a failed execute_tool span; the turn still commits."""
        script = [ToolCall("explode", {"secret": "s3cret"}), "it broke"]
        persistence = PersistenceHandler(db_path, tracing=spans.provider)
        with running(FakeLLM(script), RetryLLMHandler(), persistence):
            Fragile(agent_id="f").ask("go")
        persistence.close()
        (tool,) = spans.named("execute_tool")
        assert tool.status.status_code == StatusCode.ERROR
        # RetryLLMHandler turned the error into a message: its type is not known here.
        assert attributes(tool)["error.type"] == "ToolCallExecutionError"
        assert attributes(tool)["effectful_durable.outcome"] == "failed"
        assert "s3cret" not in str(attributes(tool))
        (turn,) = spans.named("invoke_agent")
        assert attributes(turn)["effectful_durable.outcome"] == "committed"

    @pytest.mark.parametrize("opted_in", [False, True], ids=["arguments-off", "arguments-on"])
    def test_tool_error_that_ends_the_turn(
        self, db_path: Path, spans: Spans, opted_in: bool
    ) -> None:
        """Without RetryLLMHandler a tool's error fails the turn: its message (which may
        repeat the model's arguments) is in no span unless trace_tool_arguments is on,
        in the turn's span as in the tool's; the error's type is in both."""
        script = [ToolCall("explode", {"secret": "WHY-SECRET-42"}), "unreached"]
        persistence = PersistenceHandler(
            db_path, tracing=spans.provider, trace_tool_arguments=opted_in
        )
        with running(FakeLLM(script), persistence):
            with pytest.raises(Exception, match="WHY-SECRET-42"):
                Fragile(agent_id="f").ask("go")
        persistence.close()
        (tool,) = spans.named("execute_tool")
        (turn,) = spans.named("invoke_agent")
        assert attributes(tool)["error.type"] == "ValueError"
        assert attributes(turn)["error.type"] == "ToolCallExecutionError"
        for span in (tool, turn):
            assert span.status.status_code == StatusCode.ERROR
            assert attributes(span)["effectful_durable.outcome"] == "failed"
            recorded = f"{span.status.description} {[e.attributes for e in span.events]}"
            assert ("WHY-SECRET-42" in recorded) is opted_in, span.name
            assert [e.name for e in span.events] == (["exception"] if opted_in else [])


class TestNestedTurn:
    def test_agent_called_from_a_tool(self, db_path: Path, spans: Spans) -> None:
        """A turn of agent B run by a tool of agent A is a child of that tool's span;
        each model request is recorded once, in the turn it belongs to."""
        script = [ToolCall("delegate", {"question": "q"}), "research", "the plan"]
        with persisted(db_path, FakeLLM(script), tracing=spans.provider):
            Manager(agent_id="m", researcher=Assistant(agent_id="r")).plan("goal")
        manager, researcher = sorted(
            spans.named("invoke_agent"), key=lambda span: span.start_time or 0
        )
        assert attributes(manager)["gen_ai.agent.id"] == "m"
        assert spans.children(manager) == [
            "effectful_durable.load",
            "chat fake",
            "execute_tool delegate",
            "chat fake",
            "effectful_durable.commit",
        ]
        (tool,) = spans.named("execute_tool")
        assert researcher.parent is not None and researcher.parent.span_id == tool.context.span_id
        assert spans.children(researcher) == [
            "effectful_durable.load",
            "chat fake",
            "effectful_durable.commit",
        ]
        assert len(spans.named("chat")) == 3


@dataclasses.dataclass
class Till(PersistentAgent):
    """You refund."""

    @Tool.define
    @requires_approval
    def refund(self, order: str) -> str:
        """Refund an order."""
        return f"refunded {order}"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


class TestApproval:
    def test_suspended_then_resumed(self, db_path: Path, spans: Spans) -> None:
        """A tool waiting for approval suspends the turn; the resumed turn runs it, and
        links to the suspended turn."""
        llm = FakeLLM([ToolCall("refund", {"order": "A-1"}), "refunded"])
        with persisted(db_path, llm, tracing=spans.provider) as persistence:
            till = Till(agent_id="till")
            with pytest.raises(TurnSuspended) as suspended:
                till.ask("refund A-1")
            (turn,) = spans.named("invoke_agent")
            assert attributes(turn)["effectful_durable.outcome"] == "suspended"
            assert attributes(turn)["effectful_durable.version"] == 1
            (tool,) = spans.named("execute_tool")
            assert attributes(tool)["effectful_durable.outcome"] == "awaiting_approval"
            spans.clear()
            (approval,) = suspended.value.approvals
            persistence.store.approve(approval.approval_id, by="ann")
            assert persistence.resume(till) == "refunded"
        waited = turn
        (turn,) = spans.named("invoke_agent")
        assert attributes(turn)["effectful_durable.outcome"] == "committed"
        (link,) = turn.links
        assert (link.context.trace_id, link.context.span_id) == (
            waited.context.trace_id,
            waited.context.span_id,
        )
        assert dict(link.attributes or {}) == {"effectful_durable.link": "suspended"}
        (tool,) = spans.named("execute_tool")
        assert attributes(tool)["effectful_durable.outcome"] == "ok"


class TestFailedTurn:
    """A failed turn's span is an error; the next turn links to it."""

    def test_failed_turn_and_the_turn_after(self, db_path: Path, spans: Spans) -> None:
        """The model's error fails chat and invoke_agent; the next turn links to it."""
        llm = FakeLLM([RuntimeError("provider down"), "fine now"])
        with persisted(db_path, llm, tracing=spans.provider):
            bot = Assistant(agent_id="bot")
            with pytest.raises(RuntimeError, match="provider down"):
                bot.ask("hi")
            (failed,) = spans.named("invoke_agent")
            assert failed.status.status_code == StatusCode.ERROR
            assert attributes(failed)["effectful_durable.outcome"] == "failed"
            assert attributes(failed)["error.type"] == "RuntimeError"
            assert [event.name for event in failed.events] == ["exception"]
            (chat,) = spans.named("chat")
            assert chat.status.status_code == StatusCode.ERROR
            assert "effectful_durable.commit" not in spans.children(failed)
            spans.clear()
            bot.ask("again")
        (after,) = spans.named("invoke_agent")
        (link,) = after.links
        assert link.context.span_id == failed.context.span_id
        assert link.context.trace_id == failed.context.trace_id
        assert dict(link.attributes or {}) == {"effectful_durable.link": "failed"}


class TestReplay:
    """A journaled step that is done replays: a replay span, no model call."""

    def test_replayed_workflow(self, db_path: Path, spans: Spans) -> None:
        """Run again, the workflow's two steps are replay spans, and no chat span is made."""
        with persisted(db_path, FakeLLM(["one", "two"]), workflow="w", tracing=spans.provider):
            bot = Assistant(agent_id="bot")
            bot.ask("first")
            bot.ask("second")
        turns = spans.named("invoke_agent")
        assert [attributes(t)["effectful_durable.step"] for t in turns] == ["bot#0", "bot#1"]
        assert {attributes(t)["effectful_durable.workflow"] for t in turns} == {"w"}
        spans.clear()
        with persisted(db_path, FakeLLM([]), workflow="w", tracing=spans.provider):
            bot = Assistant(agent_id="bot")
            assert bot.ask("first") == "one"
            assert bot.ask("second") == "two"
        assert spans.named("chat") == spans.named("invoke_agent") == []
        replays = spans.named("effectful_durable.replay")
        assert [attributes(r) for r in replays] == [
            {
                "effectful_durable.workflow": "w",
                "effectful_durable.step": f"bot#{n}",
                "effectful_durable.template": "ask",
                "effectful_durable.replayed": True,
                "effectful_durable.outcome": "replayed",
                "gen_ai.agent.id": "bot",
            }
            for n in (0, 1)
        ]


class TestCompaction:
    def test_compaction_span_inside_the_turn(self, db_path: Path, spans: Spans) -> None:
        """A compaction is a span of the turn, holding the summariser's model call."""
        llm = FakeLLM(
            respond=lambda call: "summary" if "Summarise" in call.last_user_text else "ok"
        )
        persistence = PersistenceHandler(db_path, tracing=spans.provider)
        compaction = CompactionHandler(max_messages=5, keep_recent=2)
        with running(llm, compaction, persistence):
            bot = Assistant(agent_id="bot")
            for n in range(3):
                bot.ask(f"question {n}")
        persistence.close()
        (compacted,) = spans.named("effectful_durable.compaction")
        assert attributes(compacted)["effectful_durable.outcome"] == "compacted"
        assert attributes(compacted)["gen_ai.agent.id"] == "bot"
        assert spans.children(compacted) == ["chat fake"]
        (turn,) = [
            t for t in spans.named("invoke_agent") if t.context.span_id == compacted.parent.span_id
        ]
        assert "effectful_durable.compaction" in spans.children(turn)


# -- the runner ---------------------------------------------------------------------------


@dataclasses.dataclass
class Planner(PersistentAgent, AlarmTools, OnEvent):
    """You plan."""

    @Template.define
    def ask(self, question: str) -> str:
        """{question}"""
        raise NotHandled


START = 1_900_000_000.0


def _runner(store_url: str, spans: Spans, llm: FakeLLM, clock: FakeClock) -> AgentRunner:
    def handlers(config: Any) -> list[Any]:
        return [LiteLLMProvider(model="fake"), llm]

    return AgentRunner(
        store_url,
        agents=lambda agent_id: Planner(agent_id=agent_id),
        handlers=handlers,
        clock=clock,
        tracing=spans.provider,
    )


class TestRunner:
    """A delivery is a span, the parent of its turn; an alarm links to its scheduler."""

    def test_alarm_delivery_links_to_the_turn_that_scheduled_it(
        self, store_url: str, spans: Spans
    ) -> None:
        """The delivery and its turn link to the traced turn that scheduled the alarm."""

        def respond(call: FakeCall) -> Any:
            if call.messages[-1]["role"] == "tool":
                return "scheduled"
            if "plan" in call.last_user_text:
                return ToolCall("schedule_alarm", {"delay_seconds": 60, "action": "check"})
            return "checked"

        clock = FakeClock(START)
        persistence = PersistenceHandler(store_url, tracing=spans.provider)
        persistence.clock = clock.now
        with running(FakeLLM(respond=respond), persistence):
            Planner(agent_id="p").ask("plan a check")
        persistence.close()
        (scheduler,) = spans.named("invoke_agent")
        spans.clear()
        with _runner(store_url, spans, FakeLLM(respond=respond), clock) as runner:
            runner.run(until=START + 61)
            assert runner.turns == 1
        (delivery,) = spans.named("effectful_durable.deliver")
        (turn,) = spans.named("invoke_agent")
        assert delivery.name == "effectful_durable.deliver alarm"
        assert delivery.parent is None
        assert turn.parent is not None and turn.parent.span_id == delivery.context.span_id
        assert attributes(delivery)["effectful_durable.outcome"] == "delivered"
        assert attributes(delivery)["effectful_durable.delivery.kind"] == "alarm"
        assert attributes(delivery)["gen_ai.agent.id"] == "p"
        assert attributes(turn)["effectful_durable.template"] == "on_alarm"
        for span in (delivery, turn):
            (link,) = span.links
            assert link.context.span_id == scheduler.context.span_id
            assert dict(link.attributes or {}) == {"effectful_durable.link": "scheduled_by"}

    def test_event_delivery(self, store_url: str, spans: Spans) -> None:
        """An event's delivery span holds its on_event turn, and names the topic."""
        with persisted(store_url, FakeLLM(["ready"])):
            Planner(agent_id="p").ask("hello")
        with Store(store_url) as store:
            store.send_event("p", "invoice", {"n": 1})
        clock = FakeClock(START)
        with _runner(store_url, spans, FakeLLM(["filed"]), clock) as runner:
            runner.run(until=START + 1)
            assert runner.turns == 1
        (delivery,) = spans.named("effectful_durable.deliver")
        assert delivery.name == "effectful_durable.deliver event"
        assert attributes(delivery)["effectful_durable.event.topic"] == "invoice"
        assert delivery.links == ()
        (turn,) = spans.named("invoke_agent")
        assert turn.parent is not None and turn.parent.span_id == delivery.context.span_id
        assert attributes(turn)["effectful_durable.template"] == "on_event"
        assert spans.children(delivery) == ["invoke_agent Planner"]

    def test_failed_delivery(self, db_path: Path, spans: Spans) -> None:
        """A delivery whose turn fails says so; the turn span is the error."""
        with Store(db_path) as store:
            from effectful_durable.store.alarms import make_schedule

            store.schedule_alarm("p", "x", make_schedule(START, delay=0), now=START)
        clock = FakeClock(START)
        with _runner(str(db_path), spans, FakeLLM([RuntimeError("down")]), clock) as runner:
            runner.run(until=START + 1)
        (delivery,) = spans.named("effectful_durable.deliver")
        assert attributes(delivery)["effectful_durable.outcome"] == "failed"
        (turn,) = spans.named("invoke_agent")
        assert turn.status.status_code == StatusCode.ERROR


# -- a crash ---------------------------------------------------------------------------------

_CHILD = textwrap.dedent(
    """
    import os, sys, time
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from effectful.handlers.llm.completions import LiteLLMProvider
    from effectful.ops.semantics import handler
    from opentelemetry.sdk.trace import TracerProvider
    from helpers import Assistant
    from effectful_durable import PersistenceHandler
    from effectful_durable.testing import FakeLLM

    def block(call):
        print("in-turn", flush=True)
        time.sleep(120)

    persistence = PersistenceHandler({db!r}, tracing=TracerProvider())
    with handler(LiteLLMProvider(model="fake")), handler(FakeLLM(respond=block)), handler(
        persistence
    ):
        Assistant(agent_id="bot").ask("never answered")
    """
)


@pytest.mark.slow
def test_resumed_turn_links_to_the_turn_killed_mid_flight(db_path: Path, spans: Spans) -> None:
    """A turn SIGKILLed in its model call leaves its traceparent; the next turn links to it."""
    code = _CHILD.format(db=str(db_path))
    child = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "in-turn"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    with Store(db_path) as store:
        (handoff,) = store.handoffs()
    assert handoff.status == "running" and handoff.trace is not None
    assert handoff.interrupted is None  # the trace context is not an earlier turn
    with persisted(db_path, FakeLLM(["back"]), tracing=spans.provider):
        Assistant(agent_id="bot").ask("again")
    (turn,) = spans.named("invoke_agent")
    (link,) = turn.links
    assert (link.context.trace_id, link.context.span_id) == trace_id_of(handoff.trace)
    assert dict(link.attributes or {}) == {"effectful_durable.link": "interrupted"}
    with Store(db_path) as store:
        (version,) = store.versions("bot")
        assert version.detail is not None
        assert version.detail["recovered"]["status"] == "running"
        assert "trace" not in json.dumps(version.detail["recovered"])


# -- off, and not installed ----------------------------------------------------------------


def _python(code: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.mark.slow
def test_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    """Turns with tracing off (the default) never import opentelemetry or our tracing module."""
    done = _python(
        f"""
        import sys
        from helpers import Assistant, persisted
        from effectful_durable.testing import FakeLLM
        with persisted({str(tmp_path / "s.db")!r}, FakeLLM(["a", "b"])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            bot.ask("two")
        ours = [m for m in sys.modules if m.startswith("effectful_durable") and "tracing" in m]
        loaded = [m for m in sys.modules if m.startswith("opentelemetry")] + ours
        print(loaded)
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_tracing_without_opentelemetry_says_what_to_install(tmp_path: Path) -> None:
    """tracing=True without the OpenTelemetry API raises ImportError naming the extra."""
    done = _python(
        f"""
        import sys
        sys.modules["opentelemetry"] = None  # as if not installed
        from effectful_durable import PersistenceHandler
        try:
            PersistenceHandler({str(tmp_path / "s.db")!r}, tracing=True)
        except ImportError as error:
            print(error)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'effectful-durable[otel]'" in done.stdout
