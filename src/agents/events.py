"""Events from the outside world: the default ``on_event`` turn, and waiting in a workflow."""

from __future__ import annotations

from typing import Any

from effectful.ops.types import Operation

from ..errors import DurableError
from ._on_event import OnEvent as OnEvent


@Operation.define
def wait_for_event(agent: Any, name: str, *, timeout: float) -> dict[str, Any] | None:
    """Wait, inside a workflow, for the next event ``name`` sent to ``agent``.

    ``agent`` is a :class:`~effectful_durable.PersistentAgent` or an agent id. It
    is a step of the workflow, journaled as template calls are: the first run
    that reaches it takes the first such event waiting in the agent's inbox, or
    else raises :class:`~effectful_durable.TurnSuspended` (the program stops;
    nothing waits in memory). An event sent later is taken by the step when it is
    sent; running the program again then replays the steps done and returns it
    here. Past ``timeout`` seconds from the first wait, with no event, the step
    ends and returns None; either way, later runs replay the same answer.

    Returns:
        ``{"event_id", "name", "payload", "sent_at"}``, or None after the timeout.

    .. versionadded:: 0.2.0
    """
    msg = "wait_for_event works inside a workflow: install PersistenceHandler(db, workflow=...)"
    raise DurableError(msg)
