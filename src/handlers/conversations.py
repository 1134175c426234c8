"""PersistenceHandler's side of conversations: switching and deleting through the store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.conversations import (
    clear_pending,
    current_conversation,
    delete_conversation,
    mark_clear,
    parked,
    switch_conversation,
)
from ..agents.persistent import PersistentAgent
from ..errors import NotFoundError

if TYPE_CHECKING:
    from ..store import Store


class ConversationHandling(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Answer the conversation operations of PersistentAgents from the database.

    A switch reads the new conversation's history at once (one indexed read of its
    active messages) when the agent is already loaded from this database;
    otherwise its next turn does. A deletion commits a version without it.
    """

    store: Store

    @implements(switch_conversation)  # type: ignore[untyped-decorator]
    def _switch_conversation(self, agent: Any, previous: str, conversation: str) -> None:
        if not isinstance(agent, PersistentAgent) or not self._loaded_here(agent):
            fwd()  # not ours yet: memory keeps it, and its next turn loads from here
            return
        parked(agent).pop(previous, None)
        self._load_conversation(agent, conversation)

    @implements(delete_conversation)  # type: ignore[untyped-decorator]
    def _delete_conversation(self, agent: Any, conversation: str) -> None:
        if not isinstance(agent, PersistentAgent):
            fwd()
            return
        in_memory = parked(agent).pop(conversation, None) is not None
        try:
            version = self.store.delete_conversation(agent.agent_id, conversation)
        except NotFoundError:
            if in_memory:
                return  # it only ever lived in memory
            raise
        self._advanced(agent, version)

    def _begin_conversation(self, agent: PersistentAgent) -> list[Any] | None:
        """At a turn's start: empty the history of a conversation marked to clear.

        Returns:
            The history a failed turn goes back to (empty), or None when not cleared.
        """
        if clear_pending(agent) != current_conversation(agent):
            return None
        agent.__history__.clear()
        return []

    def _commit_conversation(self, agent: PersistentAgent) -> None:
        """After a turn's commit: a pending clear of its conversation is done."""
        if clear_pending(agent) == current_conversation(agent):
            mark_clear(agent, None)

    # Provided by PersistenceHandler.
    def _loaded_here(self, agent: PersistentAgent) -> bool:
        raise NotImplementedError

    def _load_conversation(self, agent: PersistentAgent, conversation: str) -> None:
        raise NotImplementedError

    def _advanced(self, agent: PersistentAgent, version: int) -> None:
        raise NotImplementedError
