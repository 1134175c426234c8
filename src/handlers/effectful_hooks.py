"""The two places we reach into effectful 0.4's LLM internals, kept in one file.

Importing ``effectful.handlers.llm.completions`` imports litellm (seconds), so it
happens on the first turn, never when effectful_durable is imported.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

type Interpretation = Mapping[Any, Callable[..., Any]]


def keep_own_history() -> Interpretation:
    """Make a template write its messages back to its agent even when nested.

    ``LiteLLMProvider`` writes a template's messages to ``__history__`` only when no
    enclosing template has an active history, so the messages of agent B, called
    from a tool of agent A, are lost. Hiding A's history for B's call restores them.
    """
    from effectful.handlers.llm.completions import _get_history, _NoActiveHistoryException

    def no_active_history() -> Any:
        msg = "no enclosing history: each agent's turn keeps its own"
        raise _NoActiveHistoryException(msg)

    return {_get_history: no_active_history}


def system_note(note: str, applies: Callable[[], bool]) -> Interpretation:
    """Append ``note`` to the system message of every model request while ``applies()``.

    The note reaches the model without entering the agent's history.
    """
    from effectful.handlers.llm.completions import completion
    from effectful.ops.semantics import fwd

    def with_note(*args: Any, **kwargs: Any) -> Any:
        messages = kwargs.get("messages")
        if messages is None or not applies():
            return fwd()
        return fwd(*args, **{**kwargs, "messages": _add_note(list(messages), note)})

    return {completion: with_note}


def _add_note(messages: list[Any], note: str) -> list[Any]:
    block = {"type": "text", "text": note}
    if messages and messages[0].get("role") == "system":
        system = messages[0]
        content = system.get("content")
        blocks = (
            [*content, block]
            if isinstance(content, list)
            else [{"type": "text", "text": str(content or "")}, block]
        )
        return [{**system, "content": blocks}, *messages[1:]]
    return [{"role": "system", "content": [block]}, *messages]
