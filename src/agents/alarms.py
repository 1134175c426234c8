"""AlarmTools: let an agent, and the code around it, schedule its own future turns."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from effectful.handlers.llm import Tool
from effectful.ops.types import Operation

from ..errors import DurableError
from ..store.parts.alarms import Claim
from ._on_alarm import OnAlarm


def _no_handler(agent: Any, what: str) -> DurableError:
    msg = (
        f"cannot {what} for {getattr(agent, 'agent_id', agent)!r}: install "
        "PersistenceHandler (alarms live in its database)"
    )
    return DurableError(msg)


@Operation.define
def schedule_alarm_for(
    agent: Any,
    action: str,
    *,
    delay: float | None,
    at: datetime | float | None,
    every: float | None,
    cron: str | None,
    timezone: str | None,
    from_model: bool,
) -> str:
    """Schedule an alarm of ``agent``; PersistenceHandler answers it."""
    raise _no_handler(agent, "schedule an alarm")


@Operation.define
def cancel_alarm_of(agent: Any, alarm_id: str) -> bool:
    """Cancel a pending alarm of ``agent``; PersistenceHandler answers it."""
    raise _no_handler(agent, "cancel an alarm")


@Operation.define
def alarms_of(agent: Any) -> list[dict[str, Any]]:
    """The agent's pending and dead alarms, the running turn's changes included."""
    raise _no_handler(agent, "list alarms")


@Operation.define
def alarm_delivered(agent: Any, claim: Claim, next_fire: float | None, now: float) -> None:
    """Stage on the agent's running turn that it delivers ``claim`` (the runner calls it)."""
    raise _no_handler(agent, "deliver an alarm")


class AlarmTools(OnAlarm):
    """Let the model schedule, list and cancel alarms: future turns of its own agent.

    Mix it into a :class:`~effectful_durable.PersistentAgent`. The model gets three
    tools, ``schedule_alarm(delay_seconds, action)``, ``list_alarms()`` and
    ``cancel_alarm(alarm_id)``; Python code gets :meth:`schedule`. An alarm
    scheduled during a turn commits with that turn, or not at all. An
    :class:`~effectful_durable.AgentRunner` delivers each due alarm as a turn of
    the agent by calling its ``on_alarm(action)`` template; the default one below
    asks the model to carry out the action, and a class may define its own::

        @dataclasses.dataclass
        class Assistant(PersistentAgent, AlarmTools):
            \"""You are a helpful assistant.\"""

            @Template.define
            def ask(self, question: str) -> str:
                \"""{question}\"""
                raise NotHandled

    Bad input from the model (a negative delay, an empty or over-long action, an
    unknown id) is answered with an ``error: ...`` text it can act on, and nothing
    is written. The model may hold at most 100 pending alarms and repeat at most
    every 60 seconds.

    .. versionadded:: 0.2.0
    """

    @Tool.define
    def schedule_alarm(self, delay_seconds: float, action: str, every_seconds: float = 0) -> str:
        """Schedule a future turn of yours: after `delay_seconds` you will be asked to do `action`.

        Write `action` as an instruction to your future self, with what you will
        need to know then. Give `every_seconds` (at least 60) to repeat it at that
        interval after the first time; 0 means once. Returns the alarm's id.
        """
        return str(
            schedule_alarm_for(
                self,
                action,
                delay=delay_seconds,
                at=None,
                every=every_seconds or None,
                cron=None,
                timezone=None,
                from_model=True,
            )
        )

    @Tool.define
    def list_alarms(self) -> list[str]:
        """List your pending alarms: id, when it is next due (UTC), repetition and action."""
        lines = []
        for alarm in alarms_of(self):
            repeat = ""
            if alarm["every"]:
                repeat = f", every {alarm['every']:g} s"
            elif alarm["cron"]:
                repeat = f", cron '{alarm['cron']}'"
            state = "" if alarm["status"] == "pending" else f" [{alarm['status']}]"
            lines.append(
                f"{alarm['alarm_id']}: due {alarm['due']}{repeat}{state}: {alarm['action']}"
            )
        return lines or ["no pending alarms"]

    @Tool.define
    def cancel_alarm(self, alarm_id: str) -> str:
        """Cancel one of your pending alarms by its id (as list_alarms shows it)."""
        if not isinstance(alarm_id, str) or not alarm_id.strip():
            return "error: give the id of one of your alarms, as list_alarms shows it."
        if alarm_id.strip().isprintable() and cancel_alarm_of(self, alarm_id.strip()):
            return f"cancelled {alarm_id.strip()}"
        return (
            f"error: you have no pending alarm {alarm_id!r}; list_alarms shows your "
            "alarms. Nothing was cancelled."
        )

    def schedule(
        self,
        action: str,
        *,
        delay: float | None = None,
        at: datetime | float | None = None,
        every: float | None = None,
        cron: str | None = None,
        timezone: str | None = None,
    ) -> str:
        """Schedule an alarm of this agent from Python, inside or outside a turn.

        Inside one of the agent's turns it commits with the turn; outside, it is
        written at once, as part of the agent's current version. Under
        :class:`~effectful_durable.PersistenceHandler` only.

        Args:
            action: What ``on_alarm(action)`` is called with when it fires.
            delay: Seconds from now to the first occurrence.
            at: Time of the first occurrence: an aware datetime or epoch seconds.
            every: Repeat at this interval, in seconds.
            cron: Repeat at the times this five-field cron expression matches.
            timezone: IANA zone the cron expression is read in (default UTC).

        Returns:
            The alarm's id.

        Raises:
            InvalidAlarmError: The time, interval, cron string or action is not valid.

        .. versionadded:: 0.2.0
        """
        return str(
            schedule_alarm_for(
                self,
                action,
                delay=delay,
                at=at,
                every=every,
                cron=cron,
                timezone=timezone,
                from_model=False,
            )
        )
