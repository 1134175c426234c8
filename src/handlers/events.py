"""PersistenceHandler's events: a workflow step that waits for an event sent to an agent."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.conversations import current_conversation
from ..agents.events import wait_for_event
from ..agents.persistent import PersistentAgent
from ..errors import InvalidEventError, TurnSuspended
from ..store.parts.alarms import MAX_DELAY
from ..store.parts.events import check_event

if TYPE_CHECKING:
    from ..store import Store
    from .journal import Journal
    from .turn import Turn


class EventHandling(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Answer ``wait_for_event`` for PersistenceHandler (a base class of it)."""

    store: Store
    journal: Journal | None

    def _turns(self) -> list[Turn]:
        raise NotImplementedError

    @implements(wait_for_event)  # type: ignore[untyped-decorator]
    def _wait_for_event(self, agent: Any, name: str, *, timeout: float) -> dict[str, Any] | None:
        journal = self.journal
        if journal is None:
            return fwd()  # type: ignore[no-any-return]  # the operation's own error
        agent_id = agent.agent_id if isinstance(agent, PersistentAgent) else agent
        check_event(agent_id, name, None, None)
        if isinstance(timeout, bool) or not isinstance(timeout, int | float):
            msg = f"timeout must be a number of seconds; got {timeout!r}"
            raise InvalidEventError(msg)
        if not math.isfinite(timeout) or not 0 < timeout <= MAX_DELAY:
            msg = f"timeout must be above 0 and at most ten years; got {timeout}"
            raise InvalidEventError(msg)
        turns = self._turns()
        conversation = current_conversation(agent) if isinstance(agent, PersistentAgent) else None
        parent = turns[-1].step if turns else None
        step = journal.next_wait(name, timeout, agent_id, parent, conversation)
        replayed, result = journal.replay(step, nested=bool(turns))
        if replayed:
            return result  # type: ignore[no-any-return]
        done, result_json, deadline = self.store.turns.wait_event(
            journal.workflow, step.key, agent_id, name, timeout
        )
        if not done:
            journal.log(None, step, "waiting")
            raise TurnSuspended(agent_id, [], [(agent_id, name, deadline)])
        journal.log(None, step, "done")
        taken: dict[str, Any] | None = json.loads(result_json) if result_json else None
        return taken
