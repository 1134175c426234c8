"""What a runner's turns run under: its handler stack, and the agents it built.

The stack is what the configuration's handler factory returns, with a
PersistenceHandler on the runner's Store innermost (the runner's own, unless the
factory gave one), and the delivery interpretation just outside it. A reload
builds it again; every agent is built once, by the agent factory, and told of
each configuration (``on_config_update``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..agents.persistent import PersistentAgent
from ..errors import DurableError
from ..handlers.persistence import PersistenceHandler
from ..store import Store
from .config import RunnerConfig
from .delivery import Delivery

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger("effectful_durable.runner")


class Stack:
    """A runner's handler stack in force, and its agents.

    Args:
        store: The runner's Store; the stack's PersistenceHandler must use it.
        handlers: The handler factory (outermost first).
        agents: The agent factory.
        delivery: The runner's delivery interpretation.
        clock: The runner's clock, which the PersistenceHandler reads.
        tracing: ``tracing`` for the PersistenceHandler the runner adds itself.
    """

    def __init__(
        self,
        store: Store,
        *,
        handlers: Callable[[RunnerConfig], Sequence[Any]],
        agents: Callable[[str], PersistentAgent],
        delivery: Delivery,
        clock: Callable[[], float],
        tracing: bool | TracerProvider,
    ) -> None:
        self._store = store
        self._handlers = handlers
        self._agents_factory = agents
        self._delivery = delivery
        self._clock = clock
        self._tracing = tracing
        self._own: PersistenceHandler | None = None
        self._lock = threading.Lock()
        #: The handler stack in force, outermost first (a new list after a reload).
        self.handlers: list[Any] = []
        #: The agents built so far, by id.
        self.agents: dict[str, PersistentAgent] = {}
        self._persistence: PersistenceHandler | None = None

    @property
    def persistence(self) -> PersistenceHandler:
        """The stack's PersistenceHandler."""
        if self._persistence is None:
            msg = "the runner's handler stack was not built"
            raise DurableError(msg)
        return self._persistence

    def build(self, config: RunnerConfig) -> None:
        """Build the stack for ``config`` and put it in force.

        Raises:
            DurableError: The factory's stack has more than one PersistenceHandler,
                or one on another database.
        """
        stack = list(self._handlers(config))
        found = [h for h in stack if isinstance(h, PersistenceHandler)]
        if len(found) > 1:
            msg = "the handler factory returned more than one PersistenceHandler"
            raise DurableError(msg)
        if found:
            persistence = found[0]
            if persistence.store.engine.identity != self._store.engine.identity:
                msg = (
                    "the handler factory's PersistenceHandler uses "
                    f"{persistence.store.engine.location}, but the runner delivers the alarms "
                    f"of {self._store.engine.location}"
                )
                raise DurableError(msg)
        else:
            if self._own is None:
                self._own = PersistenceHandler(self._store, tracing=self._tracing)
            persistence = self._own
            stack.append(persistence)
        persistence.clock = self._clock
        at = stack.index(persistence)
        stack.insert(at, self._delivery)  # just outside: it sees the turn already begun
        stack.append(self._delivery.at_requests())
        self._delivery.persistence = persistence
        self.handlers, self._persistence = stack, persistence

    def agent(self, agent_id: str, config: RunnerConfig) -> PersistentAgent:
        """The agent of ``agent_id``, built (and told of ``config``) on first use.

        Raises:
            DurableError: The factory returned something else.
        """
        with self._lock:
            agent = self.agents.get(agent_id)
        if agent is None:
            agent = self._agents_factory(agent_id)
            if not isinstance(agent, PersistentAgent) or agent.agent_id != agent_id:
                msg = f"the agent factory returned {agent!r} for agent id {agent_id!r}"
                raise DurableError(msg)
            notify(agent, config)
            with self._lock:
                self.agents[agent_id] = agent
        return agent

    def notify_all(self, config: RunnerConfig) -> None:
        """Tell every agent built so far of ``config``."""
        with self._lock:
            agents = list(self.agents.values())
        for agent in agents:
            notify(agent, config)


def notify(agent: PersistentAgent, config: RunnerConfig) -> None:
    """Call ``agent.on_config_update(config)`` if it has one; log what it raises."""
    hook = getattr(agent, "on_config_update", None)
    if not callable(hook):
        return
    try:
        hook(config)
    except Exception:
        log.exception("on_config_update of %s failed", agent.agent_id)
