"""Alarms: scheduled actions of agents, their versions, and the runner's queue.

An alarm is stored as spans of its life (see ``engine/sqlite/schema.sql``): a span starts at the
version that scheduled the alarm and ends at the version that delivered its last
occurrence or cancelled it. That makes the agent's pending alarms part of every
version, so rollback, fork and prune treat them as they treat messages:

- rollback to ``v`` makes the pending alarms those that were pending at ``v``:
  alarms scheduled later are cancelled, alarms delivered or cancelled later are
  pending again (a one-shot alarm whose delivery was rolled back fires again);
  a recurring alarm that stayed pending keeps its next occurrence;
- fork copies the alarms pending at ``v`` to the new agent, under new ids;
- prune deletes spans that ended at or before ``keep_from``.

Delivery state (leases, attempts, dead) is not versioned: it belongs to the
runners, not to the agent (``store/alarm_queue.py``). Times are seconds since the
epoch, UTC.
"""

from __future__ import annotations

import math
import secrets
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, NoReturn
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from ...errors import AlarmLeaseLostError, InvalidAlarmError, NotFoundError
from ..engine.seam import Conn
from ..rows import storable, utc
from ..sealing import ALARM, PLAIN, Sealer

#: Longest action text an alarm may carry.
MAX_ACTION = 4000
#: Furthest into the future an alarm may be scheduled: ten years.
MAX_DELAY = 10 * 366 * 24 * 3600.0
#: Pending alarms an agent's model may hold at once (Python code is not limited).
MAX_PENDING_FOR_MODEL = 100

type AlarmStatus = Literal["pending", "dead", "done", "cancelled"]


@dataclass(frozen=True, slots=True)
class Schedule:
    """When an alarm fires: once at ``fire_at``, or from then on every interval or cron match.

    Build it with :func:`make_schedule`, which checks it.
    """

    fire_at: float
    every: float | None = None
    cron: str | None = None
    timezone: str | None = None

    @property
    def recurring(self) -> bool:
        """Whether the alarm fires more than once."""
        return self.every is not None or self.cron is not None

    def next_after(self, fired: float, now: float, *, coalesce: bool = True) -> float | None:
        """The occurrence after the one due at ``fired``, or None for a one-shot alarm.

        With ``coalesce`` (the default), occurrences missed up to ``now`` are
        skipped: the next one is the first after ``now``. Otherwise it is the very
        next occurrence, so a runner that was down delivers each missed one.
        """
        if self.every is not None:
            if not coalesce or fired + self.every > now:
                return fired + self.every
            return fired + (math.floor((now - fired) / self.every) + 1) * self.every
        if self.cron is not None:
            start = max(fired, now) if coalesce else fired
            return cron_next(self.cron, start, self.timezone)
        return None


def cron_next(expression: str, after: float, timezone: str | None = None) -> float:
    """The first time strictly after ``after`` that matches the cron ``expression``.

    Parsed by `cronsim <https://pypi.org/project/cronsim/>`_ (five fields, Vixie
    cron semantics, DST-aware in ``timezone``; UTC by default).
    """
    zone = ZoneInfo(timezone) if timezone else UTC
    start = datetime.fromtimestamp(math.floor(after), zone)
    return next(CronSim(expression, start)).timestamp()


def make_schedule(
    now: float,
    *,
    delay: float | None = None,
    at: datetime | float | None = None,
    every: float | None = None,
    cron: str | None = None,
    timezone: str | None = None,
    min_every: float = 0.0,
) -> Schedule:
    """Check what a caller asked for and build the :class:`Schedule`.

    Exactly one of ``delay``/``at`` may give the first occurrence; with neither, a
    recurring alarm first fires one interval (or the next cron match) from now.

    Raises:
        InvalidAlarmError: A negative or too long delay, a time in the past, an
            interval below ``min_every``, a cron string that does not parse, an
            unknown timezone, or conflicting arguments.
    """
    if delay is not None and at is not None:
        _invalid("give delay or at, not both")
    if every is not None and cron is not None:
        _invalid("give every or cron, not both")
    if timezone is not None and cron is None:
        _invalid("timezone applies to cron schedules only")
    if delay is None and at is None and every is None and cron is None:
        _invalid("give delay, at, every or cron")
    if every is not None:
        if not _finite(every) or every <= 0 or every < min_every:
            floor = f" and at least {min_every:g}" if min_every else ""
            _invalid(f"every must be a number of seconds above 0{floor}; got {every!r}")
        if every > MAX_DELAY:
            _invalid(f"every must be at most {MAX_DELAY:g} seconds (ten years); got {every!r}")
    if timezone is not None:
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            _invalid(f"unknown timezone {timezone!r}; use an IANA name such as 'Europe/Paris'")
    if cron is not None:
        if not isinstance(cron, str) or not cron.strip():
            _invalid(f"cron must be a cron expression such as '0 9 * * 1-5'; got {cron!r}")
        try:
            first_match = cron_next(cron, now, timezone)
        except (CronSimError, ValueError, StopIteration) as e:
            _invalid(f"cron expression {cron!r} does not parse: {e}")
    if delay is not None:
        if isinstance(delay, bool) or not _finite(delay) or delay < 0:
            _invalid(f"delay must be a number of seconds >= 0; got {delay!r}")
        if delay > MAX_DELAY:
            _invalid(f"delay must be at most {MAX_DELAY:g} seconds (ten years); got {delay!r}")
        fire_at = now + float(delay)
    elif at is not None:
        fire_at = _timestamp(at)
        if fire_at < now - 1.0:  # a second of slack for clocks read a moment apart
            when = datetime.fromtimestamp(fire_at, UTC).isoformat()
            _invalid(f"at={when} is in the past; give a future time")
        if fire_at > now + MAX_DELAY:
            _invalid("at must be within ten years from now")
    elif cron is not None:
        fire_at = first_match
    else:
        assert every is not None
        fire_at = now + every
    return Schedule(fire_at, float(every) if every is not None else None, cron, timezone)


def check_action(action: object) -> str:
    """Return ``action`` if it is a non-empty text of at most MAX_ACTION characters.

    Raises:
        InvalidAlarmError: It is not.
    """
    if not isinstance(action, str) or not action.strip():
        _invalid(f"action must be a non-empty text; got {action!r}")
    if len(action) > MAX_ACTION:
        _invalid(f"action must be at most {MAX_ACTION} characters; got {len(action)}")
    if not storable(action):
        _invalid("action holds a lone surrogate (\\ud800-\\udfff), which is not text")
    if "\0" in action:  # PostgreSQL's text cannot hold it
        _invalid("action holds a NUL character (\\x00), which is not text")
    return action


def new_alarm_id() -> str:
    """A new alarm id: random, so that turns can name alarms before they commit."""
    return "alm_" + secrets.token_hex(6)


@dataclass(frozen=True, slots=True)
class AlarmInfo:
    """One alarm as the database holds it (its latest span).

    ``due_at`` is the occurrence to deliver next and ``next_attempt`` when a
    runner may next try it (later than ``due_at`` after a failed delivery, or while
    a lease runs; None unless pending); ``status`` is ``"pending"``,
    ``"dead"`` (delivery failed ``attempts`` times; re-arm it), ``"done"`` (a
    one-shot alarm, delivered) or ``"cancelled"``. ``leased_by`` names the runner
    that claimed it to deliver it now, if any (a dead one's claim is taken back
    within seconds by a running runner).

    .. versionadded:: 0.2.0
    """

    alarm_id: str
    agent_id: str
    action: str
    status: AlarmStatus
    due_at: datetime
    every: float | None
    cron: str | None
    timezone: str | None
    attempts: int
    deliveries: int
    last_error: str | None
    leased_by: str | None
    created_in: int
    ended_in: int | None
    created_at: datetime
    next_attempt: datetime | None


@dataclass(frozen=True, slots=True)
class Claim:
    """An alarm (or event, or resumption) a claimer holds the lease of, to deliver it
    as a turn of its agent.

    Made by :meth:`AlarmQueue.claim
    <effectful_durable.store.alarm_queue.AlarmQueue.claim>`; the turn that delivers
    it commits only while ``token`` is still the alarm's (``AlarmWrite``).
    """

    alarm_id: str
    agent_id: str
    action: str
    schedule: Schedule
    attempts: int
    token: str
    lease_until: float
    kind: str = "alarm"  # or "event" (topic: its name), "resume" (topic: the conversation)
    topic: str | None = None
    #: The time it was due before the claim. A claim given back for a reason that is
    #: not the alarm's (the database failed) is due again then, keeping the agent's order.
    due_at: float | None = None


# -- staged writes of a turn --------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Add:
    alarm_id: str
    action: str
    schedule: Schedule
    now: float


@dataclass(frozen=True, slots=True)
class _Cancel:
    alarm_id: str


@dataclass(frozen=True, slots=True)
class _Deliver:
    alarm_id: str
    token: str
    next_fire: float | None
    now: float


@dataclass
class AlarmWrite:
    """What one turn does to its agent's alarms, applied in the turn's transaction.

    A TurnWrite (``store/engine/seam.py``). Operations apply in the order they
    were staged.
    """

    ops: list[_Add | _Cancel | _Deliver] = field(default_factory=list)

    def schedule(self, alarm_id: str, action: str, schedule: Schedule, now: float) -> None:
        """Stage a new alarm."""
        self.ops.append(_Add(alarm_id, action, schedule, now))

    def cancel(self, alarm_id: str) -> None:
        """Stage the cancellation of an alarm of the agent."""
        self.ops.append(_Cancel(alarm_id))

    def deliver(self, claim: Claim, next_fire: float | None, now: float) -> None:
        """Stage "this turn delivered the claimed occurrence", fenced by the claim's lease."""
        self.ops.append(_Deliver(claim.alarm_id, claim.token, next_fire, now))

    @property
    def added(self) -> list[tuple[str, str, Schedule]]:
        """The alarms this turn scheduled and did not cancel: ``(id, action, schedule)``."""
        cancelled = {op.alarm_id for op in self.ops if isinstance(op, _Cancel)}
        return [
            (op.alarm_id, op.action, op.schedule)
            for op in self.ops
            if isinstance(op, _Add) and op.alarm_id not in cancelled
        ]

    @property
    def cancelled(self) -> set[str]:
        """The ids this turn cancelled."""
        return {op.alarm_id for op in self.ops if isinstance(op, _Cancel)}

    def write(self, conn: Conn, agent_id: str, version: int, sealer: Sealer) -> None:
        """Apply the staged operations as part of ``version``.

        Raises:
            AlarmLeaseLostError: A delivery's lease was taken by another runner
                (or the alarm was cancelled meanwhile); the whole turn aborts.
        """
        for op in self.ops:
            if isinstance(op, _Add):
                insert(
                    conn, agent_id, op.alarm_id, op.action, op.schedule, version, op.now, sealer
                )
            elif isinstance(op, _Cancel):
                conn.execute(
                    """
                    UPDATE alarms SET status = 'cancelled', ended_in = ?3, lease_owner = NULL,
                           lease_token = NULL, updated_at = ?4
                     WHERE alarm_id = ?1 AND agent_id = ?2 AND ended_in IS NULL
                    """,
                    (op.alarm_id, agent_id, version, time.time()),
                )
            else:
                _deliver(conn, agent_id, op, version)


def _deliver(conn: Conn, agent_id: str, op: _Deliver, version: int) -> None:
    # ``ended_in IS NULL`` (implied by 'pending') finds the row through ``alarms_open``:
    # without it SQLite's planner takes ``alarms_agent`` on agent_id alone and reads
    # every alarm and event the agent ever had, done ones included (bench_claims.py).
    if op.next_fire is None:
        conn.execute(
            """
            UPDATE alarms SET status = 'done', ended_in = ?4, lease_owner = NULL,
                   lease_token = NULL, attempts = 0, last_error = NULL,
                   deliveries = deliveries + 1, updated_at = ?5
             WHERE alarm_id = ?1 AND agent_id = ?2 AND lease_token = ?3
               AND status = 'pending' AND ended_in IS NULL
            """,
            (op.alarm_id, agent_id, op.token, version, op.now),
        )
    else:
        conn.execute(
            """
            UPDATE alarms SET fire_at = ?4, due_at = ?4, lease_owner = NULL,
                   lease_token = NULL, attempts = 0, last_error = NULL,
                   deliveries = deliveries + 1, updated_at = ?5
             WHERE alarm_id = ?1 AND agent_id = ?2 AND lease_token = ?3
               AND status = 'pending' AND ended_in IS NULL
            """,
            (op.alarm_id, agent_id, op.token, op.next_fire, op.now),
        )
    if not conn.changes():
        raise AlarmLeaseLostError(op.alarm_id, agent_id)


def insert(
    conn: Conn,
    agent_id: str,
    alarm_id: str,
    action: str,
    schedule: Schedule,
    version: int,
    now: float,
    sealer: Sealer = PLAIN,
) -> None:
    """Insert a new pending alarm whose first span starts at ``version``, its action
    sealed by ``sealer``."""
    conn.execute(
        """
        INSERT INTO alarms (alarm_id, created_in, agent_id, action, fire_at, due_at, every,
                            cron, timezone, status, created_at, updated_at)
        VALUES (?1, ?2, ?3, ?4, ?5, ?5, ?6, ?7, ?8, 'pending', ?9, ?9)
        """,
        (
            alarm_id,
            version,
            agent_id,
            sealed_action(sealer, agent_id, alarm_id, action),
            schedule.fire_at,
            schedule.every,
            schedule.cron,
            schedule.timezone,
            now,
        ),
    )


# -- reads ----------------------------------------------------------------------

_SELECT = """
    SELECT alarm_id, agent_id, action, status, fire_at, every, cron, timezone, attempts,
           deliveries, last_error, lease_owner, created_in, ended_in, created_at, due_at, kind
      FROM checked_alarms
"""


def sealed_action(sealer: Sealer, agent_id: str, alarm_id: str, action: str) -> str:
    """An alarm's action (an event's payload), sealed for its row."""
    return sealer.seal(action, ALARM, agent_id, "", alarm_id)


def opened_action(sealer: Sealer, agent_id: str, alarm_id: str, kind: str, action: str) -> str:
    """An alarm's ``action`` as stored, opened; a resumption's is the store's own
    bookkeeping (the version a turn was suspended in), never sealed."""
    if kind == "resume":
        return action
    return sealer.open(action, ALARM, agent_id, "", alarm_id, table="alarms")


def _info(row: tuple[Any, ...], sealer: Sealer) -> AlarmInfo:
    (
        alarm_id,
        agent_id,
        action,
        status,
        fire_at,
        every,
        cron,
        timezone,
        attempts,
        deliveries,
        last_error,
        owner,
        created_in,
        ended_in,
        created_at,
        due_at,
        kind,
    ) = row
    return AlarmInfo(
        alarm_id,
        agent_id,
        opened_action(sealer, agent_id, alarm_id, kind, action),
        status,
        utc(fire_at),
        every,
        cron,
        timezone,
        attempts,
        deliveries,
        last_error,
        owner,
        created_in,
        ended_in,
        utc(created_at),
        utc(due_at) if status == "pending" else None,
    )


def latest(
    conn: Conn, agent_id: str | None, *, include_ended: bool, sealer: Sealer = PLAIN
) -> list[AlarmInfo]:
    """Each alarm's latest span, by next occurrence; only pending and dead ones unless asked."""
    where = ["kind = 'alarm'"]
    params: list[Any] = []
    if agent_id is not None:
        where.append("agent_id = ?")
        params.append(agent_id)
    if include_ended:
        where.append(
            "created_in = (SELECT max(created_in) FROM alarms AS b WHERE b.alarm_id = a.alarm_id)"
        )
    else:
        where.append("ended_in IS NULL")
    sql = (
        _SELECT.replace("FROM checked_alarms", "FROM checked_alarms AS a")
        + " WHERE "
        + " AND ".join(where)
    )
    rows: list[tuple[Any, ...]] = conn.execute(
        sql + " ORDER BY fire_at, alarm_id", params
    ).fetchall()
    return sealer.listed(rows, lambda row: _info(row, sealer))


def _could_name_one(alarm_id: str) -> bool:
    """Whether ``alarm_id`` is text both databases hold: no NUL, no lone surrogate."""
    return "\0" not in alarm_id and storable(alarm_id)


def open_alarm(
    conn: Conn, alarm_id: str, *, any_kind: bool = False, sealer: Sealer = PLAIN
) -> AlarmInfo | None:
    """The pending or dead alarm ``alarm_id`` (or event or resumption, if ``any_kind``)."""
    if not _could_name_one(alarm_id):
        return None
    kind = "" if any_kind else " AND kind = 'alarm'"
    row: tuple[Any, ...] | None = conn.execute(
        f"{_SELECT} WHERE alarm_id = ? AND ended_in IS NULL{kind}", (alarm_id,)
    ).fetchone()
    return None if row is None else _info(row, sealer)


def pending_count(conn: Conn, agent_id: str) -> int:
    """How many pending alarms the agent has."""
    count = conn.execute(
        """
        SELECT count(*) FROM alarms
         WHERE agent_id = ? AND ended_in IS NULL AND status = 'pending' AND kind = 'alarm'
        """,
        (agent_id,),
    ).get
    return int(count)


# -- writes outside a turn ------------------------------------------------------


def current_version(conn: Conn, agent_id: str) -> int:
    """The agent's version (0 before its first commit): out-of-turn changes belong to it."""
    row: tuple[Any, ...] | None = conn.execute(
        "SELECT version FROM checked_agents WHERE agent_id = ?", (agent_id,)
    ).fetchone()
    return 0 if row is None else int(row[0])


def cancel(conn: Conn, alarm_id: str, agent_id: str | None, sealer: Sealer = PLAIN) -> bool:
    """Cancel an open alarm outside a turn, as part of its agent's current version."""
    found = open_alarm(conn, alarm_id, any_kind=agent_id is None, sealer=sealer)
    if found is None or (agent_id is not None and found.agent_id != agent_id):
        return False
    # An alarm scheduled before the agent's first commit opened at version 0.
    ended_in = max(found.created_in, current_version(conn, found.agent_id))
    conn.execute(
        """
        UPDATE alarms SET status = 'cancelled', ended_in = ?2,
               lease_owner = NULL, lease_token = NULL, updated_at = ?3
         WHERE alarm_id = ?1 AND ended_in IS NULL
        """,
        (alarm_id, ended_in, time.time()),
    )
    return True


def rearm(conn: Conn, alarm_id: str, at: float, sealer: Sealer = PLAIN) -> AlarmInfo:
    """Make a dead (or pending) alarm pending again, due at ``at``, with no attempts.

    Raises:
        NotFoundError: No pending or dead alarm has that id.
    """
    changed = 0
    if _could_name_one(alarm_id):
        conn.execute(
            """
            UPDATE alarms SET status = 'pending', fire_at = ?2, due_at = ?2, attempts = 0,
                   last_error = NULL, lease_owner = NULL, lease_token = NULL, updated_at = ?3
             WHERE alarm_id = ?1 AND ended_in IS NULL
            """,
            (alarm_id, at, time.time()),
        )
        changed = conn.changes()
    if not changed:
        raise NotFoundError(_not_rearmed(conn, alarm_id))
    found = open_alarm(conn, alarm_id, any_kind=True, sealer=sealer)
    assert found is not None
    return found


def _not_rearmed(conn: Conn, alarm_id: str) -> str:
    """Why ``alarm_id`` cannot be re-armed, in the words of what it names (alarm or event)."""
    row = None
    if _could_name_one(alarm_id):
        row = conn.execute("SELECT kind FROM alarms WHERE alarm_id = ?", (alarm_id,)).fetchone()
    kind = (
        str(row[0]) if row is not None else ("event" if alarm_id.startswith("evt_") else "alarm")
    )
    if kind == "event":
        if row is None:
            return f"no pending or dead event {alarm_id!r}; Store.events() lists them"
        return (
            f"event {alarm_id!r} was delivered, and cannot be re-armed: send a new one "
            "(Store.events() lists them)"
        )
    return (
        f"no pending or dead alarm {alarm_id!r}; Store.alarms() lists them "
        "(done and cancelled alarms cannot be re-armed: schedule a new one)"
    )


# -- the VersionedPart ----------------------------------------------------------


class AlarmPart:
    """How alarms follow rollback, fork, prune and delete (see the module docstring)."""

    def rollback(self, conn: Conn, agent_id: str, to_version: int, new_version: int) -> None:
        """Make the pending alarms those that were pending at ``to_version``."""
        now = time.time()
        note = f"rolled back to version {to_version}"
        conn.execute(
            """
            UPDATE alarms SET status = 'cancelled', ended_in = ?3, last_error = ?4,
                   lease_owner = NULL, lease_token = NULL, updated_at = ?5
             WHERE agent_id = ?1 AND ended_in IS NULL AND created_in > ?2 AND kind = 'alarm'
            """,
            (agent_id, to_version, new_version, note, now),
        )
        conn.execute(
            """
            INSERT INTO alarms (alarm_id, created_in, agent_id, action, fire_at, due_at,
                                every, cron, timezone, status, deliveries, created_at,
                                updated_at)
            SELECT alarm_id, ?3, agent_id, action, fire_at, fire_at, every, cron, timezone,
                   'pending', deliveries, created_at, ?4
              FROM checked_alarms AS a
             WHERE agent_id = ?1 AND created_in <= ?2 AND ended_in > ?2 AND kind = 'alarm'
               AND NOT EXISTS (SELECT 1 FROM alarms AS b
                                WHERE b.alarm_id = a.alarm_id AND b.ended_in IS NULL)
            """,
            (agent_id, to_version, new_version, now),
        )

    def fork(
        self, conn: Conn, agent_id: str, version: int, new_agent_id: str, sealer: Sealer
    ) -> None:
        """Copy the alarms pending at ``version`` to the new agent, under new ids."""
        rows: list[tuple[Any, ...]] = conn.execute(
            """
            SELECT alarm_id, action, fire_at, every, cron, timezone, created_at FROM checked_alarms
             WHERE agent_id = ?1 AND created_in <= ?2 AND (ended_in IS NULL OR ended_in > ?2)
               AND kind = 'alarm'
             ORDER BY fire_at
            """,
            (agent_id, version),
        ).fetchall()
        for alarm_id, action, fire_at, every, cron, timezone, created_at in rows:
            schedule = Schedule(fire_at, every, cron, timezone)
            plain = opened_action(sealer, agent_id, alarm_id, "alarm", action)
            insert(conn, new_agent_id, new_alarm_id(), plain, schedule, 1, created_at, sealer)

    def prune(self, conn: Conn, agent_id: str, keep_from: int) -> None:
        """Delete spans that ended at or before ``keep_from``: no later version holds them."""
        conn.execute(
            "DELETE FROM alarms WHERE agent_id = ? AND ended_in <= ?", (agent_id, keep_from)
        )

    def delete(self, conn: Conn, agent_id: str) -> None:
        """Delete all the agent's alarms (they may exist before its first commit)."""
        conn.execute("DELETE FROM alarms WHERE agent_id = ?", (agent_id,))


def _timestamp(at: datetime | float) -> float:
    if isinstance(at, datetime):
        if at.tzinfo is None:
            _invalid(f"at={at.isoformat()} has no timezone; pass an aware datetime")
        return at.timestamp()
    if isinstance(at, bool) or not _finite(at):
        _invalid(f"at must be an aware datetime or seconds since the epoch; got {at!r}")
    return float(at)


def _finite(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _invalid(reason: str) -> NoReturn:
    raise InvalidAlarmError(reason)
