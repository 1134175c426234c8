"""Where we depend on how effectful 0.4 represents agents and histories, in one file.

Importing ``effectful.handlers.llm.completions`` imports litellm (seconds), so it
happens on the first turn, never when effectful_durable is imported.
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
