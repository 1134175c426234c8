"""PersistentAgent: an effectful Agent with a stable id, whose history and fields are durable."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from effectful.handlers.llm import Agent

from ..errors import DurableError
from ..store.ids import validate_agent_id, validate_conversation_id
from . import conversations as _conversations
from .history import History, replace_history
from .state import reset_conversation_state


@dataclasses.dataclass(kw_only=True)
class PersistentAgent(Agent):  # type: ignore[no-untyped-call]  # effectful is untyped
    """An effectful :class:`~effectful.handlers.llm.Agent` that is a durable object.

    ``agent_id`` names it in the database: two instances with the same id, in one
    process or many, are the same durable agent. Under
    :class:`~effectful_durable.PersistenceHandler` its message history and its
    dataclass fields (except those marked :func:`~effectful_durable.ephemeral`)
    are restored on first use and committed after every turn. Values stored in the
    database win over constructor arguments; those only seed a new agent.

    An agent holds any number of conversations, each with its own history,
    compactions, crash handoff and workflow steps; its fields belong to the agent
    and are shared by all of them, except those declared
    :func:`~effectful_durable.per_conversation`, which hold one value per
    conversation. One that never names a conversation uses
    ``"default"``. Switch for a block with :meth:`conversation`, for good with
    :meth:`new_conversation`; :attr:`current_conversation` tells which is current.
    A class may define the hooks ``on_new_conversation(conversation_id)``,
    ``on_conversation_switched(previous, current)`` and
    ``on_conversation_deleted(conversation_id)``; they run after the event.

    Args:
        agent_id: Non-empty, printable, at most 200 characters.

    Raises:
        InvalidAgentIdError: ``agent_id`` is not valid.

    Example::

        @dataclasses.dataclass
        class Assistant(PersistentAgent):
            \"""You are a concise assistant.\"""

            topics: list[str] = dataclasses.field(default_factory=list)

            @Template.define
            def ask(self, question: str) -> str:
                \"""Answer: {question}\"""
                raise NotHandled

        bot = Assistant(agent_id="assistant")
        with bot.conversation("alice"):
            bot.ask("Hello, I am Alice.")   # alice's history; topics are shared

    .. versionadded:: 0.1.0
    .. versionchanged:: 0.2.0
       Conversations.
    """

    agent_id: str

    @functools.cached_property
    def __history__(self) -> OrderedDict[str, Any]:  # type: ignore[override]
        return History()

    def __post_init__(self) -> None:
        validate_agent_id(self.agent_id)

    @property
    def current_conversation(self) -> str:
        """The id of the conversation the agent's turns run in now.

        .. versionadded:: 0.2.0
        """
        return _conversations.current_conversation(self)

    @contextlib.contextmanager
    def conversation(self, conversation_id: str) -> Iterator[str]:
        """Run the block in ``conversation_id``, then switch back to the current one.

        The conversation is created by its first turn if it is new, and resumed
        with its history and its values of the fields declared
        :func:`~effectful_durable.per_conversation` if not. Under
        PersistenceHandler the switch reads them from the database (two indexed
        reads); without it, the agent keeps what it leaves in memory::

            with bot.conversation("c-42"):
                bot.ask("Where were we?")

        Yields:
            ``conversation_id``.

        Raises:
            InvalidConversationIdError: ``conversation_id`` is not a valid id.
            DurableError: Called during one of the agent's turns.

        .. versionadded:: 0.2.0
        """
        previous = self.current_conversation
        self._switch_to(conversation_id)
        try:
            yield conversation_id
        finally:
            self._switch_to(previous)

    def new_conversation(self, conversation_id: str | None = None, *, clear: bool = False) -> str:
        """Make ``conversation_id`` (a new unique id if None) the current conversation.

        It stays current until the next switch. An existing conversation is
        resumed with its history, unless ``clear``: then its history starts
        empty and its per-conversation fields take their defaults, and the next
        turn in it removes its stored messages, as part of that turn's version
        (so a rollback can bring them back). Calls
        ``on_new_conversation(conversation_id)`` if the class defines it.

        Returns:
            The id of the conversation.

        Raises:
            InvalidConversationIdError: ``conversation_id`` is not a valid id.
            DurableError: Called during one of the agent's turns.

        .. versionadded:: 0.2.0
        """
        if conversation_id is None:
            conversation_id = f"c-{uuid.uuid4().hex[:12]}"
        self._switch_to(conversation_id)
        if clear:
            replace_history(self.__history__, [])
            reset_conversation_state(self)
            _conversations.parked(self).pop(conversation_id, None)
            _conversations.mark_clear(self, conversation_id)
        hook = getattr(self, "on_new_conversation", None)
        if callable(hook):
            hook(conversation_id)
        return conversation_id

    def delete_conversation(self, conversation_id: str) -> None:
        """Delete one of the agent's conversations (not the current one).

        Under PersistenceHandler this commits a new version without it
        (:meth:`Store.delete_conversation <effectful_durable.Store.delete_conversation>`):
        its messages leave the active history, yet a rollback brings it back.
        Calls ``on_conversation_deleted(conversation_id)`` if the class defines it.

        Raises:
            InvalidConversationIdError: ``conversation_id`` is not a valid id.
            NotFoundError: The database holds no such conversation.
            DurableError: It is the current conversation, or a turn is running.

        .. versionadded:: 0.2.0
        """
        validate_conversation_id(conversation_id)
        _conversations.check_not_in_turn(self, "delete a conversation")
        if conversation_id == self.current_conversation:
            msg = (
                f"cannot delete conversation {conversation_id!r} of agent "
                f"{self.agent_id!r}: it is the current one. Switch to another first."
            )
            raise DurableError(msg)
        _conversations.delete_conversation(self, conversation_id)
        _conversations.parked_fields(self).pop(conversation_id, None)
        if _conversations.clear_pending(self) == conversation_id:
            _conversations.mark_clear(self, None)
        hook = getattr(self, "on_conversation_deleted", None)
        if callable(hook):
            hook(conversation_id)

    def _switch_to(self, conversation_id: str) -> None:
        validate_conversation_id(conversation_id)
        previous = self.current_conversation
        if conversation_id == previous:
            return
        _conversations.check_not_in_turn(self, "switch the conversation")
        _conversations.leave_fields(self, previous)
        try:
            _conversations.switch_conversation(self, previous, conversation_id)
        except BaseException:
            _conversations.enter_fields(self, previous)
            raise
        _conversations.enter_fields(self, conversation_id)
        _conversations.set_current_conversation(self, conversation_id)
        hook = getattr(self, "on_conversation_switched", None)
        if callable(hook):
            hook(previous, conversation_id)

    @functools.cached_property
    def __system_prompt__(self) -> str:  # type: ignore[override]
        # effectful prompts with the class docstring. Never let ours, or the one
        # @dataclass makes up for an undocumented class, leak into a user's prompt.
        for cls in type(self).__mro__:
            if cls in (PersistentAgent, Agent):
                break
            doc = cls.__dict__.get("__doc__")
            if doc and not _made_up_by_dataclass(cls, doc):
                return inspect.cleandoc(doc)
        return ""


def _made_up_by_dataclass(cls: type, doc: str) -> bool:
    if not dataclasses.is_dataclass(cls):
        return False
    try:
        signature = str(inspect.signature(cls)).replace(" -> None", "")
    except (TypeError, ValueError):
        return False
    return doc == cls.__name__ + signature
