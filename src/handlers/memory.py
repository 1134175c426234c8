"""PersistenceHandler's memory: StateTools' reads and staged writes, and the digest."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.memory import (
    AgentMemory,
    MemoryDigest,
    MemoryLimits,
    StateTools,
    TurnMemory,
    agent_memory,
    memory_digest,
)
from ..agents.persistent import PersistentAgent
from ..store.ids import validate_agent_id

if TYPE_CHECKING:
    from ..store import Store
    from .turn import Turn

PART = "memory"  # the key of the turn's staged memory in Turn.staged


class MemoryHandling(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Answer ``agent_memory`` for persistent agents; tell the model its memory.

    A base of PersistenceHandler. Reads see the committed memory (the database)
    plus what the agent's running turn staged; writes go into the turn's staged
    changes, which the turn commits in its one transaction or drops when it fails.
    """

    if TYPE_CHECKING:
        store: Store

        def _turn_of(self, agent: PersistentAgent) -> Turn | None: ...

        def _turns(self) -> list[Turn]: ...

    @implements(agent_memory)  # type: ignore[untyped-decorator]
    def _agent_memory(self, agent: Any) -> AgentMemory:
        if not isinstance(agent, PersistentAgent):
            return fwd()  # type: ignore[no-any-return]
        return self._memory_of(agent)

    def _memory_of(self, agent: PersistentAgent) -> AgentMemory:
        validate_agent_id(agent.agent_id)
        limits = getattr(agent, "__memory_limits__", None)
        if not isinstance(limits, MemoryLimits):
            limits = MemoryLimits()
        turn = self._turn_of(agent)
        if turn is None:
            return AgentMemory(agent.agent_id, self.store.turns.memory, limits)
        staged = turn.staged.get(PART)
        if not isinstance(staged, TurnMemory):
            staged = TurnMemory()
            turn.staged[PART] = staged

        def live() -> bool:
            return any(running is turn for running in self._turns())

        return AgentMemory(agent.agent_id, self.store.turns.memory, limits, staged, live)

    def _tells(self, agent: PersistentAgent) -> bool:
        """A StateTools agent with a digest is told its memory on every request."""
        earlier = getattr(super(), "_tells", None)
        return (earlier is not None and bool(earlier(agent))) or (
            isinstance(agent, StateTools)
            and isinstance(getattr(agent, "__memory_digest__", None), MemoryDigest)
        )

    def _system_notes(self, turn: Turn) -> list[str]:
        """Add the memory digest of a StateTools agent to what the model is told."""
        earlier = getattr(super(), "_system_notes", None)
        notes: list[str] = list(earlier(turn)) if earlier is not None else []
        agent = turn.agent
        digest = (
            getattr(agent, "__memory_digest__", None) if isinstance(agent, StateTools) else None
        )
        if not isinstance(digest, MemoryDigest):
            return notes
        memory = self._memory_of(agent)
        staged = turn.staged[PART]
        assert isinstance(staged, TurnMemory)
        if staged.digest is None or staged.digest[0] != staged.revision:
            staged.digest = (staged.revision, memory_digest(memory, digest))
        text = staged.digest[1]
        return [*notes, text] if text else notes
