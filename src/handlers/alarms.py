"""PersistenceHandler's alarm operations: stage alarms on the running turn, or write them now."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.alarms import alarm_delivered, alarms_of, cancel_alarm_of, schedule_alarm_for
from ..agents.persistent import PersistentAgent
from ..errors import InvalidAlarmError
from ..store.parts import alarms as store_alarms
from ..store.parts.alarms import AlarmWrite, Claim

if TYPE_CHECKING:
    from ..store import Store
    from .turn import Turn

#: The shortest interval the model may repeat an alarm at.
MODEL_MIN_EVERY = 60.0


class AlarmHandling(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Answer the alarm operations for PersistenceHandler (a base class of it).

    ``clock`` gives the time alarms are scheduled from; an AgentRunner sets it to
    its own clock, so that tests can run days of alarms in milliseconds.
    """

    store: Store
    clock: Callable[[], float] = time.time

    def _turn_of(self, agent: PersistentAgent) -> Turn | None:
        raise NotImplementedError

    def _tells(self, agent: PersistentAgent) -> bool:
        earlier = getattr(super(), "_tells", None)
        return (earlier is not None and bool(earlier(agent))) or id(agent) in self._announced()

    def _system_notes(self, turn: Turn) -> list[str]:
        earlier = getattr(super(), "_system_notes", None)
        notes: list[str] = list(earlier(turn)) if earlier is not None else []
        claim = self._announced().get(id(turn.agent))
        if claim is not None:
            due = _utc(claim.schedule.fire_at)
            notes.append(
                f"Note from the runtime: this turn delivers your alarm {claim.alarm_id}, "
                f"due {due}; it is now {_utc(self.clock())}."
            )
        return notes

    @contextlib.contextmanager
    def delivering(self, agent: PersistentAgent, claim: Claim) -> Iterator[None]:
        """Tell the turns of ``agent`` in this thread, from their start, which alarm they
        deliver (the runner's note to the model)."""
        announced = self._announced()
        announced[id(agent)] = claim
        try:
            yield
        finally:
            announced.pop(id(agent), None)

    def _announced(self) -> dict[int, Claim]:
        local: threading.local | None = self.__dict__.get("_alarm_local")
        if local is None:  # not setdefault: that would build a local on every call
            local = self.__dict__.setdefault("_alarm_local", threading.local())
        announced: dict[int, Claim] | None = getattr(local, "announced", None)
        if announced is None:
            announced = local.announced = {}
        return announced

    def _alarm_write(self, turn: Turn) -> AlarmWrite:
        write = turn.staged.get("alarms")
        if not isinstance(write, AlarmWrite):
            write = turn.staged["alarms"] = AlarmWrite()
        return write

    @implements(schedule_alarm_for)  # type: ignore[untyped-decorator]
    def _schedule_alarm_for(
        self,
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
        if not isinstance(agent, PersistentAgent):
            return fwd()  # type: ignore[no-any-return]
        now = self.clock()
        turn = self._turn_of(agent)
        try:
            store_alarms.check_action(action)
            schedule = store_alarms.make_schedule(
                now,
                delay=delay,
                at=at,
                every=every,
                cron=cron,
                timezone=timezone,
                min_every=MODEL_MIN_EVERY if from_model else 0.0,
            )
            if from_model:
                self._check_room(agent, turn)
        except InvalidAlarmError as error:
            if from_model:
                return f"error: {error.reason}. Nothing was scheduled."
            raise
        if turn is None:
            alarm_id = self.store.schedule_alarm(agent.agent_id, action, schedule, now=now)
        else:
            alarm_id = store_alarms.new_alarm_id()
            self._alarm_write(turn).schedule(alarm_id, action, schedule, now)
        if not from_model:
            return alarm_id
        repeat = f", then every {schedule.every:g} s" if schedule.every else ""
        return f"scheduled {alarm_id}, due {_utc(schedule.fire_at)}{repeat}"

    def _check_room(self, agent: PersistentAgent, turn: Turn | None) -> None:
        staged = self._alarm_write(turn).added if turn is not None else []
        pending = self.store.turns.pending_alarms(agent.agent_id)
        if pending + len(staged) >= store_alarms.MAX_PENDING_FOR_MODEL:
            msg = (
                f"you already have {store_alarms.MAX_PENDING_FOR_MODEL} pending alarms; "
                "cancel some first"
            )
            raise InvalidAlarmError(msg)

    @implements(cancel_alarm_of)  # type: ignore[untyped-decorator]
    def _cancel_alarm_of(self, agent: Any, alarm_id: str) -> bool:
        if not isinstance(agent, PersistentAgent):
            return fwd()  # type: ignore[no-any-return]
        turn = self._turn_of(agent)
        if turn is None:
            return self.store.cancel_alarm(alarm_id, agent_id=agent.agent_id)
        write = self._alarm_write(turn)
        if alarm_id in write.cancelled:
            return False
        staged = any(added_id == alarm_id for added_id, _, _ in write.added)
        if not staged:
            found = self.store.turns.open_alarm(alarm_id)
            if found is None or found.agent_id != agent.agent_id:
                return False  # never another agent's alarm (DESIGN promise 7)
        write.cancel(alarm_id)
        return True

    @implements(alarms_of)  # type: ignore[untyped-decorator]
    def _alarms_of(self, agent: Any) -> list[dict[str, Any]]:
        if not isinstance(agent, PersistentAgent):
            return fwd()  # type: ignore[no-any-return]
        listed = [
            {
                "alarm_id": alarm.alarm_id,
                "due": _utc(alarm.due_at.timestamp()),
                "every": alarm.every,
                "cron": alarm.cron,
                "status": alarm.status,
                "action": alarm.action,
            }
            for alarm in self.store.alarms(agent.agent_id)
        ]
        turn = self._turn_of(agent)
        if turn is not None:
            write = self._alarm_write(turn)
            listed = [alarm for alarm in listed if alarm["alarm_id"] not in write.cancelled]
            listed += [
                {
                    "alarm_id": alarm_id,
                    "due": _utc(schedule.fire_at),
                    "every": schedule.every,
                    "cron": schedule.cron,
                    "status": "pending",
                    "action": action,
                }
                for alarm_id, action, schedule in write.added
            ]
        return listed

    @implements(alarm_delivered)  # type: ignore[untyped-decorator]
    def _alarm_delivered(
        self, agent: Any, claim: Claim, next_fire: float | None, now: float
    ) -> None:
        if not isinstance(agent, PersistentAgent):
            fwd()
            return None
        turn = self._turn_of(agent)
        if turn is None:
            msg = f"alarm {claim.alarm_id} can only be delivered inside a turn of its agent"
            raise RuntimeError(msg)
        self._alarm_write(turn).deliver(claim, next_fire, now)
        return None


def _utc(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
