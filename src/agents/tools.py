"""Tool mixins that give an agent's model access to its own durable record."""

from __future__ import annotations

from typing import Any

from effectful.handlers.llm import Tool
from effectful.ops.types import Operation

from ..errors import DurableError
from ..store.history import message_text


@Operation.define
def search_compacted(agent: Any, query: str, limit: int) -> list[dict[str, Any]]:
    """The agent's compacted messages matching ``query``; PersistenceHandler answers it."""
    msg = (
        f"cannot search the compacted messages of {getattr(agent, 'agent_id', agent)!r}: "
        "install PersistenceHandler to use RecallTools"
    )
    raise DurableError(msg)


class RecallTools:
    """Let the model search the messages compaction took out of its context.

    Mix it into a :class:`~effectful_durable.PersistentAgent`; with
    :class:`~effectful_durable.CompactionHandler` summarising old messages and
    :class:`~effectful_durable.PersistenceHandler` keeping the originals, the model
    gets a ``recall`` tool over them (SQLite full-text search)::

        @dataclasses.dataclass
        class Assistant(PersistentAgent, RecallTools):
            ...

    .. versionadded:: 0.1.0
    """

    @Tool.define
    def recall(self, query: str, limit: int = 5) -> list[str]:
        """Search your earlier conversation that was summarised out of your context.

        Give a few words the messages you need contain. Returns up to `limit`
        (at most 50) matching messages, best match first, as "role: text".
        """
        found = search_compacted(self, query, max(1, min(limit, 50)))
        return [f"{message.get('role')}: {message_text(message)}" for message in found]
