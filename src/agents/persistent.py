"""PersistentAgent: an effectful Agent with a stable id, whose history and fields are durable."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections import OrderedDict
from typing import Any

from effectful.handlers.llm import Agent

from ..store.ids import validate_agent_id
from .history import History


@dataclasses.dataclass(kw_only=True)
class PersistentAgent(Agent):  # type: ignore[no-untyped-call]  # effectful is untyped
    """An effectful :class:`~effectful.handlers.llm.Agent` that is a durable object.

    ``agent_id`` names it in the database: two instances with the same id, in one
    process or many, are the same durable agent. Under
    :class:`~effectful_durable.PersistenceHandler` its message history and its
    dataclass fields (except those marked :func:`~effectful_durable.ephemeral`)
    are restored on first use and committed after every turn. Values stored in the
    database win over constructor arguments; those only seed a new agent.

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

    .. versionadded:: 0.1.0
    """

    agent_id: str

    @functools.cached_property
    def __history__(self) -> OrderedDict[str, Any]:  # type: ignore[override]
        return History()

    def __post_init__(self) -> None:
        validate_agent_id(self.agent_id)

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
