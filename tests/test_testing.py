"""Tests for effectful_durable.testing: real templates answered offline by FakeLLM."""

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import contextlib
import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pydantic
import pytest
from effectful.handlers.llm import Agent, Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider, RetryLLMHandler
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable.testing import (
    FakeCall,
    FakeLLM,
    FakeLLMError,
    FakeLLMExhaustedError,
    Raw,
    ToolCall,
)


@dataclasses.dataclass
class Point:
    x: int
    y: int


class Forecast(pydantic.BaseModel):
    city: str
    celsius: float


@Template.define
def capital(country: str) -> str:
    """What is the capital of {country}?"""
    raise NotHandled


@Template.define
def count_letters(word: str) -> int:
    """How many letters are in {word}?"""
    raise NotHandled


@Template.define
def primes_below(n: int) -> list[int]:
    """List the primes below {n}."""
    raise NotHandled


@Template.define
def locate(place: str) -> Point:
    """Where is {place} on the grid?"""
    raise NotHandled


@Template.define
def forecast(city: str) -> Forecast:
    """What is the weather in {city}?"""
    raise NotHandled


added: list[tuple[int, int]] = []


@Tool.define
def add(a: int, b: int) -> int:
    """Add two integers."""
    added.append((a, b))
    return a + b


@Template.define
def sum_with_tool(a: int, b: int) -> int:
    """Use the add tool to compute {a} + {b}."""
    raise NotHandled


class Writer(Agent):
    """An agent that writes files."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    @Tool.define
    def write_file(self, path: str, text: str) -> str:
        """Write text to a file."""
        self.files[path] = text
        return "written"

    @Template.define
    def work(self, task: str) -> str:
        """Do this task: {task}"""
        raise NotHandled


@contextlib.contextmanager
def offline(fake: FakeLLM, *middle: Any) -> Iterator[FakeLLM]:
    """Install a LiteLLMProvider, then `middle` handlers, then `fake` innermost."""
    with contextlib.ExitStack() as stack:
        for h in (LiteLLMProvider(model="fake"), *middle, fake):
            stack.enter_context(handler(h))
        yield fake


class TestFinalAnswers:
    def test_text_answer(self) -> None:
        """A str reply is the text template's result and the request is recorded."""
        with offline(FakeLLM(["Paris"])) as fake:
            assert capital("France") == "Paris"
        [call] = fake.calls
        assert call.model == "fake"
        assert call.response_format is None
        assert call.last_user_text == "What is the capital of France?"

    def test_structured_int(self) -> None:
        """An int reply is boxed as JSON and decoded by an int template."""
        with offline(FakeLLM([5])) as fake:
            assert count_letters("hello") == 5
        assert fake.calls[0].response_format is not None

    def test_structured_dataclass(self) -> None:
        """A dataclass reply round-trips through a dataclass template."""
        with offline(FakeLLM([Point(3, 4)])):
            assert locate("the park") == Point(3, 4)

    def test_structured_pydantic_model(self) -> None:
        """A pydantic model reply round-trips through a model template."""
        reply = Forecast(city="Oslo", celsius=-3.5)
        with offline(FakeLLM([reply])):
            assert forecast("Oslo") == reply

    def test_structured_list(self) -> None:
        """A list reply is a structured value, not a list of tool calls."""
        with offline(FakeLLM([[2, 3, 5, 7]])):
            assert primes_below(10) == [2, 3, 5, 7]

    def test_text_template_rejects_non_str(self) -> None:
        """A non-str reply to a text template fails with a FakeLLMError."""
        with offline(FakeLLM([42])), pytest.raises(FakeLLMError, match="text answer"):
            capital("France")


class TestToolCalls:
    def test_free_tool_then_answer(self) -> None:
        """A scripted tool call runs the tool and its result is sent next call."""
        added.clear()
        with offline(FakeLLM([ToolCall("add", {"a": 2, "b": 3}), 5])) as fake:
            assert sum_with_tool(2, 3) == 5
        assert added == [(2, 3)]
        first, second = fake.calls
        assert "add" in first.tools
        tool_message = second.messages[-1]
        assert tool_message["role"] == "tool"
        assert tool_message["tool_call_id"] == "call_1_0"
        assert tool_message["content"] == [{"type": "text", "text": "5"}]

    def test_agent_method_tool_by_short_name(self) -> None:
        """A bare method name resolves to the agent's self__ tool."""
        writer = Writer()
        script = [ToolCall("write_file", {"path": "a.txt", "text": "hi"}, id="w1")]
        with offline(FakeLLM([*script, "done"])) as fake:
            assert writer.work("write a.txt") == "done"
        assert writer.files == {"a.txt": "hi"}
        assistant = fake.calls[1].messages[-2]
        assert assistant["tool_calls"][0]["function"]["name"] == "self__write_file"
        assert fake.calls[1].messages[-1]["tool_call_id"] == "w1"

    def test_unknown_tool_lists_offered_tools(self) -> None:
        """A tool call naming no offered tool fails and lists the offered ones."""
        with (
            offline(FakeLLM([ToolCall("delete_everything")])),
            pytest.raises(FakeLLMError, match=r"delete_everything.*'add'"),
        ):
            sum_with_tool(1, 1)


class TestScripting:
    def test_respond_callable(self) -> None:
        """respond= computes replies once the script is used up."""

        def shout(call: FakeCall) -> str:
            return call.last_user_text.upper()

        with offline(FakeLLM(["Paris"], respond=shout)) as fake:
            assert capital("France") == "Paris"
            assert capital("Peru") == "WHAT IS THE CAPITAL OF PERU?"
        assert fake.call_count == 2

    def test_exhaustion_explains_itself(self) -> None:
        """Running out of replies says how many were answered and what was asked."""
        with offline(FakeLLM(["Paris"])):
            capital("France")
            with pytest.raises(FakeLLMExhaustedError) as info:
                capital("Peru")
        assert isinstance(info.value, AssertionError)
        assert "answered 1 call(s)" in str(info.value)
        assert "What is the capital of Peru?" in str(info.value)

    def test_raw_malformed_json_is_retried(self) -> None:
        """RetryLLMHandler recovers from a Raw malformed reply on the next one."""
        with offline(FakeLLM([Raw("{not json"), 5]), RetryLLMHandler()) as fake:
            assert count_letters("hello") == 5
        assert fake.call_count == 2
        second = fake.calls[1]
        assert second.messages[-2]["content"] == "{not json"
        assert "Error decoding response" in second.last_user_text

    def test_exception_reply_is_raised(self) -> None:
        """An exception reply is raised from the model call."""
        with (
            offline(FakeLLM([TimeoutError("provider down")])),
            pytest.raises(TimeoutError, match="provider down"),
        ):
            capital("France")


class TestThreads:
    def test_calls_recorded_from_two_threads(self) -> None:
        """One FakeLLM installed in two threads records every call from both."""
        fake = FakeLLM(respond=lambda call: call.last_user_text)
        barrier = threading.Barrier(2)
        results: dict[str, list[str]] = {}

        def run(country: str) -> None:
            with offline(fake):
                barrier.wait()
                results[country] = [capital(country) for _ in range(20)]

        threads = [threading.Thread(target=run, args=(c,)) for c in ("Chad", "Fiji")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert fake.call_count == 40
        assert results == {c: [f"What is the capital of {c}?"] * 20 for c in ("Chad", "Fiji")}
