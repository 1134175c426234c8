"""Where we depend on how effectful 0.4 represents agents and histories, in one file.

Importing ``effectful.handlers.llm.completions`` imports litellm (seconds), so it
happens on the first turn, never when effectful_durable is imported. This is the
one module that uses effectful's private names (``_get_history`` and
``_NoActiveHistoryException``: the running loop's history; ``_make_message``: a
tool result as effectful makes one; ``_add_cache_control_to_history``: its prompt
cache hints), for want of public ones; ``tests/test_imports.py`` allows them here
alone (``EFFECTFUL_PRIVATE``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from effectful.handlers.llm import Template

from ..agents.history import replace_history

type Interpretation = Mapping[Any, Callable[..., Any]]


def bound_agent[A](template: Template[..., Any], kind: type[A]) -> A | None:
    """The agent of type ``kind`` a template is bound to, if any.

    effectful binds a template method to its agent by putting the instance in the
    first map of the template's context and sharing the agent's ``__history__``.
    """
    history = getattr(template, "__history__", None)
    if history is None:
        return None
    for value in template.__context__.maps[0].values():
        if isinstance(value, kind) and getattr(value, "__history__", None) is history:
            return value
    return None


def set_history(agent: Any, messages: Sequence[Mapping[str, Any]]) -> None:
    """Replace the agent's history in place (templates hold a reference to it)."""
    replace_history(agent.__history__, messages)


def add_prompt_cache_hints(history: OrderedDict[str, Any]) -> None:
    """Mark a history's messages, in place, as effectful marks them for prompt caching.

    Stored messages may lack the hints; restoring them marked means the first call
    after a load replaces none of them.
    """
    from effectful.handlers.llm.completions import _add_cache_control_to_history

    _add_cache_control_to_history(history)


def keep_own_history() -> Interpretation:
    """Make a template write its messages back to its agent even when nested.

    ``LiteLLMProvider`` writes a template's messages to ``__history__`` only when no
    enclosing template has an active history, so the messages of agent B, called
    from a tool of agent A, are lost. Hiding A's history for B's call restores them.

    Empty when no history is active (an outermost call): then there is nothing to
    hide, and installing a handler would cost effectful tens of microseconds.
    """
    from effectful.handlers.llm.completions import _get_history, _NoActiveHistoryException
    from effectful.internals.runtime import get_interpretation

    if _get_history not in get_interpretation():  # type: ignore[no-untyped-call]
        return {}  # unhandled, _get_history raises _NoActiveHistoryException already

    def no_active_history() -> Any:
        msg = "no enclosing history: each agent's turn keeps its own"
        raise _NoActiveHistoryException(msg)

    return {_get_history: no_active_history}


def system_notes(notes: Callable[[], Sequence[str]]) -> Interpretation:
    """Append ``notes()`` to the system message of every model request.

    The notes reach the model without entering the agent's history; they are
    asked for anew at each request, so they can follow what the turn changes.
    """
    from effectful.handlers.llm.completions import completion
    from effectful.ops.semantics import fwd

    def with_notes(*args: Any, **kwargs: Any) -> Any:
        messages = kwargs.get("messages")
        if messages is None:
            return fwd()
        texts = notes()
        if not texts:
            return fwd()
        return fwd(*args, **{**kwargs, "messages": _add_notes(list(messages), texts)})

    return {completion: with_notes}


def _add_notes(messages: list[Any], notes: Sequence[str]) -> list[Any]:
    blocks = [{"type": "text", "text": note} for note in notes]
    if messages and messages[0].get("role") == "system":
        system = messages[0]
        content = system.get("content")
        if not isinstance(content, list):
            content = [{"type": "text", "text": str(content or "")}]
        return [{**system, "content": [*content, *blocks]}, *messages[1:]]
    return [{"role": "system", "content": blocks}, *messages]


# -- tool calls, for approvals -------------------------------------------------------


def active_history() -> OrderedDict[str, Any] | None:
    """The history the running template's loop appends to, or None outside one."""
    from effectful.handlers.llm.completions import _get_history, _NoActiveHistoryException

    try:
        history: OrderedDict[str, Any] = _get_history()
    except _NoActiveHistoryException:
        return None
    return history


def append_to_history(message: Mapping[str, Any]) -> None:
    """Append ``message`` to the running loop's history, as effectful's own calls do."""
    from effectful.handlers.llm.completions import append_message

    append_message(message)  # type: ignore[arg-type]


def tool_message(tool_call_id: str, text: str) -> dict[str, Any]:
    """A new tool-result message, as effectful makes one, holding ``text``."""
    from effectful.handlers.llm.completions import _make_message

    message: Any = _make_message(
        {"role": "tool", "content": [{"type": "text", "text": text}], "tool_call_id": tool_call_id}
    )
    return dict(message)


def tool_name(tool_call: Any) -> str:
    """The name of a decoded tool call's tool as its class defines it (``refund``)."""
    name: str = tool_call.name
    return name.removeprefix("self__")


def tool_failed(message: Any) -> bool:
    """Whether a tool-result ``message`` is the error RetryLLMHandler returns for a tool
    that raised (effectful's ``ToolCallExecutionError`` feedback: plain text content)."""
    content = message.get("content") if isinstance(message, Mapping) else None
    return isinstance(content, str) and content.startswith("Tool execution failed:")


def tool_arguments(tool_call: Any) -> dict[str, Any]:
    """A decoded tool call's arguments, as JSON values."""
    import pydantic_core

    arguments: dict[str, Any] = pydantic_core.to_jsonable_python(
        dict(tool_call.bound_args.arguments), fallback=repr
    )
    return arguments


def tool_parameters(tool_call: Any) -> dict[str, Any]:
    """The JSON schema of the tool's parameters, as the model was offered it."""
    import pydantic
    from effectful.handlers.llm.encoding import Encodable

    tool = tool_call.tool
    adapter: Any = pydantic.TypeAdapter(Encodable[type(tool)])  # type: ignore[misc, arg-type]
    spec = adapter.dump_python(tool, mode="json", context={tool_call.name: tool})
    parameters: dict[str, Any] = spec["function"]["parameters"]
    return parameters


def env_tools(env: Mapping[str, Any]) -> dict[str, Any]:
    """The tools a template's model loop offers, by the name the model calls them."""
    from effectful.handlers.llm.completions import collect_tools

    return dict(collect_tools(env))


def decode_tool_call(raw: Mapping[str, Any], tools: Mapping[str, Any]) -> Any:
    """A recorded tool call (``raw``, as an assistant message holds it), decoded as
    effectful decodes the model's, against ``tools``.

    Raises:
        LookupError: ``tools`` has no tool of its name.
        TypeError: It passes an argument the tool does not take (effectful asserts
            this, and asserts vanish under -O), or misses one.
        ValueError: A value does not fit its parameter (pydantic's ValidationError).
    """
    import inspect
    import json

    import pydantic
    from effectful.handlers.llm.encoding import DecodedToolCall, Encodable

    function = raw.get("function") or {}
    name = str(function.get("name"))
    tool = tools.get(name)
    if tool is None:
        msg = f"no tool {name!r}"
        raise LookupError(msg)
    arguments = json.loads(function.get("arguments") or "{}")
    parameters = inspect.signature(tool).parameters
    unknown = [key for key in arguments if key not in parameters]
    if unknown:
        msg = f"it has no parameter {', '.join(map(repr, unknown))}"
        raise TypeError(msg)
    encoding: Any = pydantic.TypeAdapter(Encodable[DecodedToolCall])  # type: ignore[arg-type, type-arg]
    return encoding.validate_python(dict(raw), context=dict(tools))


def with_arguments(raw: Mapping[str, Any], name: str, arguments: Mapping[str, Any]) -> Any:
    """The recorded tool call ``raw`` naming ``name`` with ``arguments`` (JSON values)."""
    import json

    function = {**(raw.get("function") or {}), "name": name}
    function["arguments"] = json.dumps(dict(arguments))
    return {**raw, "function": function}


def stand_in_call(raw: Mapping[str, Any], why: str) -> Any:
    """A decoded tool call for ``raw`` whose tool is not looked up, for a call that
    never runs (its result is recorded, or a person denied it): its tool raises
    ``DurableError(why)`` if anything calls it."""
    import inspect
    import json

    from effectful.handlers.llm.encoding import DecodedToolCall

    from ..errors import DurableError

    function = raw.get("function") or {}
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        arguments = {}
    if not isinstance(arguments, dict) or not all(str(k).isidentifier() for k in arguments):
        arguments = {}
    signature = inspect.Signature(
        [inspect.Parameter(str(k), inspect.Parameter.KEYWORD_ONLY) for k in arguments]
    )

    def gone(**_: Any) -> Any:
        raise DurableError(why)

    gone.__name__ = str(function.get("name"))
    setattr(gone, _STAND_IN, why)
    return DecodedToolCall(
        tool=gone,  # type: ignore[arg-type]
        bound_args=signature.bind(**arguments),
        id=raw.get("id"),  # type: ignore[arg-type]
        name=str(function.get("name")),
    )


_STAND_IN = "__durable_stand_in__"


def stand_in_reason(tool_call: Any) -> str | None:
    """Why ``tool_call`` is a stand-in (:func:`stand_in_call`), or None if it is not one."""
    why = getattr(tool_call.tool, _STAND_IN, None)
    return why if isinstance(why, str) else None
