"""The agents a PostgreSQL Store holds: a lease row each, renewed in the server's clock.

A turn holds its agent from its start to its commit. On PostgreSQL the hold is
a row of ``agent_holds`` (schema 11): the agent, a token of the hold's own, who
holds it, and when it was last renewed, by the server's clock. Within the
process a table of held ids decides between threads first.

- Taking is one statement (``effectful_durable_take``), with the turn's handoff
  row: a row of no other hold, or of a hold that lapsed, becomes this one's. A
  hold whose process is gone from this place (``engine/process.py``: the same
  kernel and PID namespace, and no such pid) is taken at once, so that a
  killed process's agents are free without waiting out its lease.
- Renewing: a thread of the Store's renews all its holds every
  :data:`RENEW_EVERY` seconds, one statement on a connection of its own (never
  waiting behind the pool's), made to ``renewal_url`` if given (a path around a
  pooler whose pool the workload may fill), with its own settings (a pooler
  drops those of a session). When that connection cannot be made, the
  renewals go through the Store's pool. A hold not renewed for :data:`TTL`
  seconds has lapsed: another process may take it, and it is never renewed
  again.
- Fencing: each write made under a hold names its token
  (``effectful_durable_held``) at its start and again just before its
  ``COMMIT``, in the same round trip; a hold that lapsed or was taken raises
  :class:`~effectful_durable.HoldLapsedError` and nothing of the write lands.
  The fence holds the hold's lock shared until the transaction ends, and a take
  needs it alone: a hold never changes hands while a write made under it is
  open. A take of a hold that lapsed ends the sessions of such writes (a process
  stopped or cut off in the middle of one), which could never commit. Known
  lapsed here (no renewal for :data:`TTL` seconds, suspended time included),
  a write fails before anything is sent.
- Letting go clears the row's token; after a block that failed, or a delete,
  it deletes the row of an agent the database has no version of. If that fails, or
  a take's answer was lost (it may have landed), the hold is noted as this
  process's own: its next take of the agent takes it over, and the next
  renewal lets it go (it lapses meanwhile).

Nothing of a hold lives in a server session: a broken connection, a session a
server or a pooler ends, a pooler in transaction mode change nothing, and a
turn pins no server connection while its model answers. A host powered off or
cut from the network loses its agents within :data:`TTL` seconds of its last
renewal, whatever the server believes of its sessions.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any, Protocol

import psycopg

from ....errors import AgentInUseError, DatabaseUnavailableError, DurableError, HoldLapsedError
from ..process import gone, place
from .connections import DeadlineConnection, ServerSilent, milliseconds, still_open
from .opening import unavailable

#: Seconds a hold lasts past its last renewal, by the server's clock: three renewals
#: missed. A holder that stops renewing (dead, cut off, stalled) loses its agents
#: this long after its last renewal, within DESIGN.md's promise 11 of 30 s.
TTL = 15.0
#: Seconds between two renewals of a Store's holds (one statement for all of them).
RENEW_EVERY = 5.0
_RETRY = 1.0  # seconds before a renewal that failed is tried again
_POLL_SECONDS = 0.005
_MAX_POLL_SECONDS = 0.1
_MIN_LOCK_WAIT = 0.05  # seconds a take waits at least for the writes under a lapsed hold

_HOST = socket.gethostname()

_TAKE = "SELECT * FROM effectful_durable_take(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_LET_GO = "UPDATE agent_holds SET token = NULL WHERE agent_id = ? AND token = ?"
# After a block that failed: an agent the database has no version of (whose first
# turn failed, or an id a rollback or delete did not find) keeps no row, so that
# agent_holds does not grow with ids that come and go.
_LET_GO_TIDY = """
    WITH gone AS (
        DELETE FROM agent_holds AS h
         WHERE h.agent_id = ?1 AND h.token = ?2
           AND NOT EXISTS (SELECT 1 FROM agents AS a WHERE a.agent_id = ?1)
        RETURNING 1
    )
    UPDATE agent_holds SET token = NULL
     WHERE agent_id = ?1 AND token = ?2 AND NOT EXISTS (SELECT 1 FROM gone)
"""
# The holds to renew (agents, tokens), after the holds whose letting go failed: one
# statement, one round trip.
_RENEW = """
    WITH let_go AS (
        UPDATE agent_holds AS h SET token = NULL
          FROM unnest(?1::text[], ?2::text[]) AS old (agent_id, token)
         WHERE h.agent_id = old.agent_id AND h.token = old.token
    )
    UPDATE agent_holds AS h SET renewed_at = extract(epoch FROM clock_timestamp())
      FROM unnest(?3::text[], ?4::text[]) AS mine (agent_id, token)
     WHERE h.agent_id = mine.agent_id AND h.token = mine.token
       AND NOT effectful_durable_lapsed(h.renewed_at, h.ttl)
    RETURNING h.agent_id
"""
# Who holds the agent, as the server sees it: the holder, what it runs, how long ago
# its hold was renewed (from the server's start, if later) and how long it has left,
# and the sessions of writes still open under a hold of it.
_HOLDER = """
    SELECT h.token IS NOT NULL, h.host, h.pid, h.place,
           extract(epoch FROM clock_timestamp())
               - greatest(h.renewed_at, extract(epoch FROM pg_postmaster_start_time())),
           effectful_durable_lapses_at(h.renewed_at, h.ttl)
               - extract(epoch FROM clock_timestamp()),
           to_char(to_timestamp(effectful_durable_lapses_at(h.renewed_at, h.ttl))
                   AT TIME ZONE 'UTC', 'HH24:MI:SS'),
           (SELECT f.template FROM handoffs AS f
             WHERE f.agent_id = h.agent_id AND f.status = 'running'
               AND f.host = h.host AND f.pid = h.pid
             ORDER BY f.started_at DESC LIMIT 1),
           ARRAY(SELECT effectful_durable_writers(effectful_durable_hold_key(h.agent_id)))
      FROM agent_holds AS h WHERE h.agent_id = ?
"""

log = logging.getLogger("effectful_durable.store")


def clock() -> float:
    """Seconds on a clock that counts the time the host spent suspended (Linux's
    ``CLOCK_BOOTTIME``; ``time.monotonic()`` elsewhere): a laptop's closed lid or a
    paused VM ages this process's holds as the server's clock does."""
    return time.clock_gettime(_CLOCK)


_CLOCK = getattr(time, "CLOCK_BOOTTIME", time.CLOCK_MONOTONIC)


@dataclass
class _Hold:
    """One agent this Store holds (or is taking): its token, the thread that holds it,
    and when (:func:`clock`) the last renewal that landed was sent."""

    agent_id: str
    token: str
    thread: threading.Thread
    renewed: float = 0.0
    taken: bool = False
    lapsed: bool = False
    #: Set once the take is answered, taken or not: another thread that wants the
    #: agent meanwhile waits for that answer rather than report a holder there is not.
    settled: threading.Event = field(default_factory=threading.Event)

    def lapsed_here(self) -> bool:
        """Whether the hold has lapsed, as far as this process can tell without asking."""
        return self.lapsed or clock() - self.renewed >= TTL


@dataclass(frozen=True)
class _Taken:
    """What a take said: whether the hold is ours, the handoff's rows, or who holds it."""

    taken: bool
    rows: list[Any] | None
    held_by: str | None = None
    held_pid: int | None = None
    held_place: str | None = None


class _Database(Protocol):
    """What the holds need of their Store's PostgresDatabase."""

    url: str
    location: str
    busy_timeout: float

    def autocommit(self) -> AbstractContextManager[Any]: ...

    def reading(self) -> AbstractContextManager[Any]: ...

    def connect(
        self, url: str | None = None, *, timeout: float | None = None
    ) -> DeadlineConnection: ...

    def as_conn(self, raw: psycopg.Connection[Any]) -> Any: ...


class AgentHolds:
    """The agents one PostgreSQL Store holds, and the thread that renews their leases.

    Args:
        db: The Store's database.
        renewal_url: Where the renewals connect, if not to the Store's own URL.
    """

    def __init__(self, db: _Database, *, renewal_url: str | None = None) -> None:
        self._db = db
        self._renewal_url = renewal_url
        self._held: dict[str, _Hold] = {}
        # Tokens of holds of ours that may still be in the table, by agent: a letting
        # go that failed, a take whose answer was lost. The next take of the agent may
        # take them over; the renewals let them go.
        self._unreleased: dict[str, set[str]] = {}
        self._mutex = threading.Lock()
        self._changed = threading.Condition(self._mutex)
        self._closed = False
        self._idle = False  # whether the renewals wait for a hold to renew
        self._thread: threading.Thread | None = None
        self._conn: DeadlineConnection | None = None  # the renewals' own
        self._using = threading.Lock()  # held while the renewals' connection is used
        self._failing: str | None = None  # how renewing fails now, once logged

    # -- taking and letting go ---------------------------------------------------

    def acquire(
        self, agent_id: str, *, wait: float, handoff: Sequence[Any] | None = None
    ) -> list[Any] | None:
        """Hold ``agent_id`` and write the ``handoff`` row: its rows (None without one).

        Raises:
            AgentInUseError: Another thread or process held it for longer than ``wait``
                s, or a write made under an earlier hold of it stayed open that long.
        """
        deadline = time.monotonic() + wait
        pause = _POLL_SECONDS
        with self._mutex:
            ours = set(self._unreleased.get(agent_id, ()))
        at_once = True  # one more try without waiting: the holder went, or let go
        while True:
            hold, other = self._reserve(agent_id)
            if other is not None and not other.taken:
                # Another thread of ours is asking: its answer first, within the wait;
                # past it, who holds the agent now, as the database says.
                if other.settled.wait(max(deadline - time.monotonic(), 0.0)):
                    continue
                name = other.thread.name
                holder = self._holder(agent_id)
                asking = f"thread {name!r} of this process, which is taking it"
                raise AgentInUseError(agent_id, asking if holder is None else holder)
            if hold is not None:
                lock_wait = max(min(self._db.busy_timeout, deadline - time.monotonic()), 0.0)
                try:
                    taken = self._take(hold, handoff, ours, max(lock_wait, _MIN_LOCK_WAIT))
                except BaseException:
                    self._unreserve(hold)
                    self._left(agent_id, hold.token)  # the take may have landed
                    raise
                if taken.taken:
                    self._started(hold, ours)
                    return taken.rows
                self._unreserve(hold)
                if at_once and (
                    taken.held_by is None or gone(taken.held_place, taken.held_pid or 0)
                ):
                    at_once = False
                    if taken.held_by is not None:
                        ours.add(taken.held_by)
                    continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                if other is not None:
                    name = other.thread.name
                    raise AgentInUseError(agent_id, f"thread {name!r} of this process")
                raise AgentInUseError(agent_id, self._holder(agent_id) or "another process")
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, _MAX_POLL_SECONDS)

    def release(self, agent_id: str, *, tidy: bool = False) -> None:
        """Let ``agent_id`` go (``tidy``: deleting its row if the database has no
        version of it); if the database cannot be told now, the next renewal tells it
        (the hold lapses meanwhile)."""
        with self._mutex:
            hold = self._held.pop(agent_id)
        try:
            with self._db.autocommit() as conn:
                conn.execute(_LET_GO_TIDY if tidy else _LET_GO, (agent_id, hold.token))
        except DurableError as error:
            log.debug("could not let agent %r go yet: %s", agent_id, error)
            self._left(agent_id, hold.token)

    def _left(self, agent_id: str, token: str) -> None:
        """Note a hold of ours that may still be in the table, for the renewals to let go."""
        with self._changed:
            self._unreleased.setdefault(agent_id, set()).add(token)
            if self._idle:
                self._changed.notify_all()

    def token(self, agent_id: str) -> str | None:
        """The token a write of ``agent_id`` names, if this Store holds it.

        Raises:
            HoldLapsedError: The hold is known here to have lapsed.
        """
        with self._mutex:
            hold = self._held.get(agent_id)
        if hold is None or not hold.taken:
            return None
        if hold.lapsed_here():
            hold.lapsed = True
            ago = clock() - hold.renewed
            reason = (
                f"this process could not renew it for {ago:.1f} s, and a hold lapses "
                f"{TTL:g} s after its last renewal"
            )
            raise HoldLapsedError(agent_id, reason)
        return hold.token

    def lapsed(self, agent_id: str) -> None:
        """Note that the database refused a write under ``agent_id``'s hold."""
        with self._mutex:
            hold = self._held.get(agent_id)
            if hold is not None:
                hold.lapsed = True

    def close(self) -> None:
        """Stop renewing (the holds lapse); close the renewals' connection."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()
            conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()

    def _reserve(self, agent_id: str) -> tuple[_Hold | None, _Hold | None]:
        """A new hold of ``agent_id`` for this thread, or another thread's hold of it."""
        with self._mutex:
            other = self._held.get(agent_id)
            if other is not None:
                return None, other
            hold = _Hold(agent_id, secrets.token_hex(8), threading.current_thread())
            self._held[agent_id] = hold
            return hold, None

    def _unreserve(self, hold: _Hold) -> None:
        with self._mutex:
            if self._held.get(hold.agent_id) is hold:
                del self._held[hold.agent_id]
        hold.settled.set()

    def _take(
        self, hold: _Hold, handoff: Sequence[Any] | None, ours: set[str], lock_wait: float
    ) -> _Taken:
        """Try the hold once, with the handoff row if given; once more if the
        connection broke (the same token takes its own row again).

        A write under an earlier hold of the agent that stays open for ``lock_wait``
        seconds (and that this role may not end) keeps the hold from being taken.
        """
        if handoff is None:
            conversation = template = arguments = started = note = None
        else:
            _, conversation, template, arguments, _, _, started, note = handoff
        values = (
            hold.agent_id,
            hold.token,
            _HOST,
            os.getpid(),
            place(),
            TTL,
            sorted(ours),
            handoff is not None,
            conversation,
            template,
            arguments,
            started,
            note,
            lock_wait,
        )
        for attempt in (1, 2):
            sent = clock()
            try:
                with self._db.autocommit() as conn:
                    taken, base, held_by, _, held_pid, held_place = conn.execute(
                        _TAKE, values
                    ).fetchone()
            except DatabaseUnavailableError as error:
                if attempt == 2 or isinstance(error.__cause__, ServerSilent):
                    raise
                continue
            if taken:
                hold.renewed = sent
                rows = None if handoff is None else ([] if base is None else [(base,)])
                return _Taken(True, rows)
            return _Taken(False, None, held_by, held_pid, held_place)
        raise AssertionError  # not reached

    def _holder(self, agent_id: str) -> str | None:
        """Who holds the agent, in words: the process, its host and place, what it
        runs, when its hold lapses by the server's clock; or the sessions of writes
        still open under an earlier hold. None: nobody, and no such write."""
        try:
            with self._db.reading() as conn:
                row = conn.execute(_HOLDER, (agent_id,)).fetchone()
        except DurableError:
            return "another process"
        if row is None:
            return None
        held, host, pid, where, ago, left, at, template, writers = row
        who = f"process {pid} on {host} (place {where or 'unknown'})"
        if not held or left <= 0:
            if not writers:
                return None
            sessions = ", ".join(str(writer) for writer in writers)
            how = "let go of" if not held else f"whose hold lapsed {-left:.1f} s ago"
            return (
                f"a write made under the hold of {who}, {how}, still open on the "
                f"server (backend {sessions}), which this database role may not end; "
                "it ends when the server's timeouts end it"
            )
        running = f"running {template}; " if template else ""
        return (
            f"{who} ({running}its hold renewed {ago:.1f} s ago lapses in {left:.1f} s, "
            f"at {at} UTC by the server's clock, unless renewed)"
        )

    # -- renewing ----------------------------------------------------------------

    def _started(self, hold: _Hold, ours: set[str]) -> None:
        """``hold`` was taken (maybe over holds of ``ours``): renew it from now on.

        The renewals' connection is made here the first time, so that a process
        that cannot have one more connection fails at its first turn, not a
        lease later; the hold is let go then. Later, the renewals make it again
        themselves, should it break, or renew through the pool meanwhile.
        """
        if self._thread is None:
            try:
                with self._using:
                    self._connection()
            except DurableError:
                self.release(hold.agent_id)
                hold.settled.set()
                raise
        with self._changed:
            hold.taken = True
            hold.settled.set()
            self._forget(hold.agent_id, ours)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._renewing, name="effectful-durable-holds", daemon=True
                )
                self._thread.start()
            elif self._idle:
                self._changed.notify_all()

    def _forget(self, agent_id: str, tokens: set[str]) -> None:
        """``tokens`` of ``agent_id`` are no longer in the table as ours; hold ``_mutex``."""
        left = self._unreleased.get(agent_id, set()) - tokens
        if left:
            self._unreleased[agent_id] = left
        else:
            self._unreleased.pop(agent_id, None)

    def _renewing(self) -> None:
        next_renewal = time.monotonic() + RENEW_EVERY
        while True:
            with self._changed:
                while not self._closed and not (self._held or self._unreleased):
                    self._idle = True  # woken by the next hold (a take costs no wake-up else)
                    self._changed.wait()
                    self._idle = False
                    next_renewal = time.monotonic() + RENEW_EVERY
                left = next_renewal - time.monotonic()
                if not self._closed and left > 0:
                    self._changed.wait(left)
                    continue
                if self._closed:
                    return
                holds = [hold for hold in self._held.values() if hold.taken and not hold.lapsed]
                unreleased = [(a, t) for a, tokens in self._unreleased.items() for t in tokens]
            landed = self._renew(holds, unreleased)
            next_renewal = time.monotonic() + (RENEW_EVERY if landed else _RETRY)

    def _renew(self, holds: list[_Hold], unreleased: list[tuple[str, str]]) -> bool:
        """Renew ``holds`` and let the ``unreleased`` (agent, token) go, in one round
        trip; whether it landed."""
        sent = clock()
        values = (
            [agent_id for agent_id, _ in unreleased],
            [token for _, token in unreleased],
            [hold.agent_id for hold in holds],
            [hold.token for hold in holds],
        )
        try:
            rows = self._renewed(values)
        except DurableError as error:
            self._failed(
                "failing",
                "could not renew this process's hold on %d agent(s) (%s) in %s: %s. A hold "
                "lapses %g s after its last renewal; its turn cannot commit then. If a "
                "pooler's pool is full, give renewals a path of their own (renewal_url: "
                "the docs' production page, 'Renewals')",
                len(holds),
                ", ".join(repr(h.agent_id) for h in holds[:5]) or "none",
                self._db.location,
                getattr(error, "reason", error),
                TTL,
            )
            return False
        renewed = {str(agent_id) for (agent_id,) in rows}
        with self._mutex:
            for agent_id, token in unreleased:
                self._forget(agent_id, {token})
            # A hold let go meanwhile was not renewed, and is no one's concern now.
            holds = [hold for hold in holds if self._held.get(hold.agent_id) is hold]
        for hold in holds:
            if hold.agent_id in renewed:
                hold.renewed = sent
            elif not hold.lapsed:
                hold.lapsed = True
                log.warning(
                    "this process's hold on agent %r lapsed (not renewed for %.1f s): its "
                    "turn will not commit, and another process may take the agent",
                    hold.agent_id,
                    sent - hold.renewed,
                    extra={"agent": hold.agent_id},
                )
        return True

    def _renewed(self, values: tuple[list[str], ...]) -> list[Any]:
        """Send the renewal on the renewals' own connection, or through the pool when
        that connection cannot be made: the agents renewed.

        Raises:
            DurableError: Neither way answered.
        """
        with self._using:
            try:
                conn = self._connection()
            except DurableError as error:
                own: DurableError | None = error
            else:
                own = None
                try:
                    rows: list[Any] = self._sent(self._db.as_conn(conn), values)
                except psycopg.Error as error:
                    self._drop()
                    raise unavailable(error, self._db.url, self._db.location) from error
        if own is None:
            if self._failing is not None:
                log.info("this process's holds on agents are renewed again")
                self._failing = None
            return rows
        self._failed(
            "pooled",
            "could not make the connection that renews this process's holds on agents "
            "(%s): %s. They are renewed through the Store's pool meanwhile, which a busy "
            "pool delays; see the docs' production page, 'Renewals'",
            self._db.location if self._renewal_url is None else "renewal_url",
            getattr(own, "reason", own),
        )
        with self._db.autocommit() as pooled:
            return self._sent(pooled, values)

    def _sent(self, conn: Any, values: tuple[list[str], ...]) -> list[Any]:
        """The renewal on ``conn`` (a PostgresConn), after its own settings, in one
        round trip: a pooler's server session may carry anyone's. The server ends it
        within half a renewal period, before the client gives up on its answer."""
        wait = milliseconds(RENEW_EVERY / 2)
        conn.settings = (
            f"SELECT set_config('lock_timeout', '{wait}', true),"
            f" set_config('statement_timeout', '{wait}', true)"
        )
        rows: list[Any] = conn.execute(_RENEW, values).fetchall()
        return rows

    def _failed(self, how: str, message: str, *args: Any) -> None:
        """Log ``message`` once while renewing fails this way (``how``)."""
        if self._failing != how:
            log.warning(message, *args)
        self._failing = how

    def _connection(self) -> DeadlineConnection:
        """The renewals' connection, checked (a server or pooler may have ended it), or
        a new one, made within a renewal period; hold ``_using``. Each of its waits
        for an answer ends within a renewal period too.

        Raises:
            DatabaseUnavailableError, DatabaseAccessError: No connection could be made.
        """
        if self._conn is not None:
            try:
                still_open(self._conn)
            except psycopg.OperationalError:
                self._drop()
        if self._conn is None:
            self._conn = self._db.connect(self._renewal_url, timeout=RENEW_EVERY)
            self._conn.answer_timeout = RENEW_EVERY
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
