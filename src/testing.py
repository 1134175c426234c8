"""An offline, scripted stand-in for the LLM, for testing code built on templates.

Install :class:`FakeLLM` next to effectful's ``LiteLLMProvider`` and every model
request a ``Template`` makes is answered from a script instead of the network.
Each request is recorded in :attr:`FakeLLM.calls` so tests can assert on what the
model was shown.
"""

import os

# litellm fetches a remote price list on import unless told to use its local copy.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import dataclasses
import json
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import litellm
import pydantic
from effectful.handlers.llm.completions import completion
from effectful.ops.syntax import ObjectInterpretation, implements

__all__ = [
    "FakeCall",
    "FakeLLM",
    "FakeLLMError",
    "FakeLLMExhaustedError",
    "Raw",
    "Reply",
    "ToolCall",
]


class FakeLLMError(AssertionError):
    """A scripted reply does not fit the request the code under test made."""


class FakeLLMExhaustedError(FakeLLMError):
    """The model was called more times than the test scripted replies for."""


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """A scripted reply in which the model asks to call a tool.

    Args:
        name: The offered tool's name. For an Agent method tool, the bare method
            name (``"write_file"``) is enough when it picks out one offered tool
            (``"self__write_file"``).
        arguments: The tool's arguments, as Python values; JSON-encoded on send.
        id: The tool call's id; ``call_<request>_<position>`` when omitted.
    """

    name: str
    arguments: Mapping[str, Any] | None = None
    id: str | None = None


@dataclasses.dataclass(frozen=True)
class Raw:
    """A scripted reply whose content is sent verbatim, never boxed as JSON.

    Use it to simulate malformed output, e.g. broken JSON for a structured
    template.

    Args:
        content: The exact assistant message content.
    """

    content: str


type Reply = str | Raw | ToolCall | list[ToolCall] | tuple[ToolCall, ...] | BaseException | object
"""One scripted model answer. It is text, a value for a structured template, a
:class:`ToolCall` or a sequence of them, a :class:`Raw` content string, or an
exception to raise."""


@dataclasses.dataclass(frozen=True)
class FakeCall:
    """One model request, as the code under test sent it.

    Args:
        model: The model name the request named.
        messages: A deep copy of the messages sent.
        tools: The names of the tools offered.
        response_format: The structured output class, or None for a text answer.
    """

    model: str
    messages: list[dict[str, Any]]
    tools: list[str]
    response_format: type[pydantic.BaseModel] | None

    @property
    def last_user_text(self) -> str:
        """The text of the last user message, or ``""`` if there is none."""
        for message in reversed(self.messages):
            if message["role"] == "user":
                content = message["content"]
                if isinstance(content, str):
                    return content
                return "".join(b["text"] for b in content if b["type"] == "text")
        return ""


class FakeLLM(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Answers effectful's ``completion`` operation from a script, offline.

    Install it with a ``LiteLLMProvider`` (whose model name is only recorded),
    innermost so that other handlers of ``completion`` still see each request.
    Replies are used in order, one per model request; when the script runs out,
    ``respond`` is asked. Handlers are thread-local, so install it in each
    thread; one instance may serve several threads at once.

    Example::

        @Template.define
        def capital(country: str) -> str:
            \"\"\"What is the capital of {country}?\"\"\"
            raise NotHandled

        fake = FakeLLM(["Paris"])
        with handler(LiteLLMProvider(model="fake")), handler(fake):
            assert capital("France") == "Paris"
        assert fake.calls[0].last_user_text == "What is the capital of France?"

    Args:
        script: Replies for the first requests, in order.
        respond: Computes the reply to each request the script does not cover.
    """

    #: Every request the fake model received, in order.
    calls: list[FakeCall]

    def __init__(
        self,
        script: Iterable[Reply] = (),
        *,
        respond: Callable[[FakeCall], Reply] | None = None,
    ) -> None:
        self.calls = []
        self._script = iter(script)
        self._respond = respond
        self._lock = threading.Lock()

    @property
    def call_count(self) -> int:
        """How many model requests were made so far."""
        return len(self.calls)

    @implements(completion)  # type: ignore[untyped-decorator]
    def _completion(self, model: str, *args: Any, **kwargs: Any) -> litellm.ModelResponse:
        """Record the request and answer it with the next reply.

        Args:
            model: The model name.
            *args: ``messages``, if passed positionally.
            **kwargs: ``messages``, ``response_format``, ``tools`` and config.

        Returns:
            A ``litellm.ModelResponse`` holding one assistant message.

        Raises:
            FakeLLMExhaustedError: No scripted reply is left and no ``respond``.
            FakeLLMError: A reply does not fit the request.
            BaseException: The reply itself, when it is an exception (KeyboardInterrupt too).
        """
        messages = kwargs["messages"] if "messages" in kwargs else args[0]
        call = FakeCall(
            model=model,
            # effectful replaces messages rather than mutating them: a list copy suffices.
            messages=list(messages),
            tools=[spec["function"]["name"] for spec in kwargs.get("tools") or ()],
            response_format=kwargs.get("response_format"),
        )
        with self._lock:
            self.calls.append(call)
            number = len(self.calls)
            reply = next(self._script, _NO_REPLY)
        if reply is _NO_REPLY:
            if self._respond is None:
                raise _exhausted(call, answered=number - 1)
            reply = self._respond(call)
        if isinstance(reply, BaseException):
            raise reply
        return litellm.ModelResponse(
            id=f"fake-{number}",
            model=model,
            choices=[litellm.Choices(index=0, message=_message(reply, call, number))],
        )


_NO_REPLY = object()


def _exhausted(call: FakeCall, answered: int) -> FakeLLMExhaustedError:
    """Build the error for a request the test gave no reply for."""
    return FakeLLMExhaustedError(
        f"FakeLLM has no reply for model call #{answered + 1}: the script answered "
        f"{answered} call(s) and no respond= callable was given. "
        f"Last user message: {call.last_user_text!r}"
    )


def _message(reply: Reply, call: FakeCall, number: int) -> litellm.Message:
    """Turn a reply into the assistant message answering `call`."""
    tool_calls = _tool_calls(reply)
    if not tool_calls:
        return litellm.Message(role="assistant", content=_content(reply, call))
    encoded = [
        _encode_tool_call(tc, call.tools, default_id=f"call_{number}_{i}")
        for i, tc in enumerate(tool_calls)
    ]
    return litellm.Message(role="assistant", content=None, tool_calls=encoded)


def _tool_calls(reply: Reply) -> list[ToolCall]:
    """The tool calls `reply` asks for; empty when it is a final answer."""
    if isinstance(reply, ToolCall):
        return [reply]
    if isinstance(reply, list | tuple) and all(isinstance(r, ToolCall) for r in reply):
        return list(reply)
    return []


def _content(reply: Reply, call: FakeCall) -> str:
    """The message content for a final answer to `call`."""
    if isinstance(reply, Raw):
        return reply.content
    if call.response_format is not None:
        return json.dumps({"value": _jsonable(reply)})
    if isinstance(reply, str):
        return reply
    msg = (
        f"the template asks for a text answer, but the reply is {reply!r}; "
        "script a str (or Raw) for it"
    )
    raise FakeLLMError(msg)


def _encode_tool_call(tc: ToolCall, offered: list[str], default_id: str) -> dict[str, Any]:
    """Encode one scripted tool call as an OpenAI tool call."""
    return {
        "id": tc.id or default_id,
        "type": "function",
        "function": {
            "name": _resolve_tool(tc.name, offered),
            "arguments": json.dumps(_jsonable(dict(tc.arguments or {}))),
        },
    }


def _resolve_tool(name: str, offered: list[str]) -> str:
    """The offered tool `name` refers to, directly or as an ``x__name`` suffix."""
    if name in offered:
        return name
    matches = [tool for tool in offered if tool.endswith(f"__{name}")]
    if len(matches) == 1:
        return matches[0]
    msg = f"scripted tool call {name!r} matches none of the offered tools {offered}"
    if matches:
        msg = f"scripted tool call {name!r} is ambiguous between {matches}"
    raise FakeLLMError(msg)


def _jsonable(value: object) -> Any:
    """`value` as JSON-ready Python data, the way pydantic serializes its type."""
    return pydantic.TypeAdapter(type(value)).dump_python(value, mode="json")
