"""The conversations of a PersistentAgent: which one is current, and switching between them.

The agent keeps its current conversation's messages in its one ``__history__``
(effectful binds that OrderedDict into every template of the agent, so a switch
replaces its content, never the object). Switching and deleting are effectful
operations: under :class:`~effectful_durable.PersistenceHandler` the database
answers them; without it the agent keeps the histories it leaves in memory.
"""

from __future__ import annotations

from typing import Any

from effectful.ops.types import Operation

from ..errors import DurableError
from ..store.ids import DEFAULT_CONVERSATION
from .history import history_messages, replace_history
from .state import conversation_fields, reset_conversation_state

# Keys of the framework's entries in an agent's __dict__ (dunder names cannot
# clash with dataclass fields).
_CURRENT = "__conversation__"
_PARKED = "__durable_parked__"  # histories left behind, when nothing persists them
_PARKED_FIELDS = "__durable_parked_fields__"  # per-conversation field values left behind
_CLEAR = "__durable_clear__"  # the conversation whose stored history the next turn drops
_IN_TURN = "__durable_in_turn__"


def current_conversation(agent: Any) -> str:
    """The id of the agent's current conversation."""
    current: str = agent.__dict__.get(_CURRENT, DEFAULT_CONVERSATION)
    return current


def set_current_conversation(agent: Any, conversation: str) -> None:
    agent.__dict__[_CURRENT] = conversation


def parked(agent: Any) -> dict[str, list[Any]]:
    """The histories of conversations the agent left that no database holds yet."""
    found: dict[str, list[Any]] = agent.__dict__.setdefault(_PARKED, {})
    return found


def parked_fields(agent: Any) -> dict[str, dict[str, Any]]:
    """The values of per-conversation fields in the conversations the agent left."""
    found: dict[str, dict[str, Any]] = agent.__dict__.setdefault(_PARKED_FIELDS, {})
    return found


def leave_fields(agent: Any, conversation: str) -> None:
    """Keep the per-conversation fields' values of ``conversation``, which the agent
    leaves, and give the fields their defaults."""
    names = conversation_fields(agent)
    if names:
        parked_fields(agent)[conversation] = {name: getattr(agent, name) for name in names}
        reset_conversation_state(agent)


def enter_fields(agent: Any, conversation: str) -> None:
    """Put back the per-conversation fields' values kept when the agent left
    ``conversation``, if memory holds them."""
    values = parked_fields(agent).pop(conversation, None)
    for name, value in (values or {}).items():
        object.__setattr__(agent, name, value)


def clear_pending(agent: Any) -> str | None:
    """The conversation whose stored messages the next turn in it removes, if any."""
    pending: str | None = agent.__dict__.get(_CLEAR)
    return pending


def mark_clear(agent: Any, conversation: str | None) -> None:
    if conversation is None:
        agent.__dict__.pop(_CLEAR, None)
    else:
        agent.__dict__[_CLEAR] = conversation


def set_in_turn(agent: Any, in_turn: bool) -> None:
    """Mark the agent as running a turn, during which it cannot switch conversation."""
    if in_turn:
        agent.__dict__[_IN_TURN] = True
    else:
        agent.__dict__.pop(_IN_TURN, None)


def check_not_in_turn(agent: Any, action: str) -> None:
    if agent.__dict__.get(_IN_TURN):
        msg = (
            f"cannot {action} of agent {agent.agent_id!r} during one of its turns: its "
            "history is in use. Do it between turns, e.g. around the template call."
        )
        raise DurableError(msg)


@Operation.define
def switch_conversation(agent: Any, previous: str, conversation: str) -> None:
    """Install ``conversation``'s history in ``agent``, which leaves ``previous``.

    Unhandled (no database), the history left is kept in memory and the one
    switched to is what memory holds for it, or empty.
    """
    kept = parked(agent)
    kept[previous] = history_messages(agent.__history__)
    replace_history(agent.__history__, kept.pop(conversation, []))


@Operation.define
def delete_conversation(agent: Any, conversation: str) -> None:
    """Delete ``conversation`` of ``agent``; unhandled, only from memory.

    Raises:
        NotFoundError: The agent has no such conversation (memory or database).
    """
    parked(agent).pop(conversation, None)
