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
  waiting behind the pool's). A hold not renewed for :data:`TTL` seconds has
  lapsed: another process may take it, and it is never renewed again.
- Fencing: each write made under a hold names its token
  (``effectful_durable_held``, inside the commit's own statements); a hold that
  lapsed or was taken raises :class:`~effectful_durable.HoldLapsedError` and
  nothing of the write lands. Known lapsed here (no renewal for :data:`TTL`
  seconds), a write fails before anything is sent.
- Letting go clears the row's token. If that fails, or a take's answer was
  lost (it may have landed), the hold is noted as this process's own: its next
  take of the agent takes it over, and the next renewal lets it go (it lapses
  meanwhile).

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
from .connections import ServerSilent, still_open
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

_HOST = socket.gethostname()

_TAKE = "SELECT * FROM effectful_durable_take(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
_LET_GO = "UPDATE agent_holds SET token = NULL WHERE agent_id = ? AND token = ?"
# The holds to renew (agents, tokens), then the holds whose letting go failed: one
# statement on the renewals' own connection (psycopg's parameters).
_RENEW = """
    WITH let_go AS (
        UPDATE agent_holds AS h SET token = NULL
          FROM unnest(%s::text[], %s::text[]) AS old (agent_id, token)
         WHERE h.agent_id = old.agent_id AND h.token = old.token
    )
    UPDATE agent_holds AS h SET renewed_at = extract(epoch FROM clock_timestamp())
      FROM unnest(%s::text[], %s::text[]) AS mine (agent_id, token)
     WHERE h.agent_id = mine.agent_id AND h.token = mine.token
       AND NOT effectful_durable_lapsed(h.renewed_at, h.ttl)
    RETURNING h.agent_id
"""
_HOLDER = """
    SELECT h.host, h.pid, extract(epoch FROM clock_timestamp()) - h.renewed_at, h.ttl,
           (SELECT f.template FROM handoffs AS f
             WHERE f.agent_id = h.agent_id AND f.status = 'running'
               AND f.host = h.host AND f.pid = h.pid
             ORDER BY f.started_at DESC LIMIT 1)
      FROM agent_holds AS h WHERE h.agent_id = ? AND h.token IS NOT NULL
"""

log = logging.getLogger("effectful_durable.store")


@dataclass
class _Hold:
    """One agent this Store holds (or is taking): its token, the thread that holds it,
    and when (``time.monotonic()``) the last renewal that landed was sent."""

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
        return self.lapsed or time.monotonic() - self.renewed >= TTL


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

    def autocommit(self) -> AbstractContextManager[Any]: ...

    def reading(self) -> AbstractContextManager[Any]: ...

    def connect(self) -> psycopg.Connection[Any]: ...


class AgentHolds:
    """The agents one PostgreSQL Store holds, and the thread that renews their leases."""

    def __init__(self, db: _Database) -> None:
        self._db = db
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
        self._conn: psycopg.Connection[Any] | None = None  # the renewals' own
        self._using = threading.Lock()  # held while the renewals' connection is used
        self._failing = False

    # -- taking and letting go ---------------------------------------------------

    def acquire(
        self, agent_id: str, *, wait: float, handoff: Sequence[Any] | None = None
    ) -> list[Any] | None:
        """Hold ``agent_id`` and write the ``handoff`` row: its rows (None without one).

        Raises:
            AgentInUseError: Another thread or process held it for longer than ``wait`` s.
        """
        deadline = time.monotonic() + wait
        pause = _POLL_SECONDS
        with self._mutex:
            ours = set(self._unreleased.get(agent_id, ()))
        at_once = True  # one more try without waiting: the holder went, or let go
        while True:
            hold, other = self._reserve(agent_id)
            if other is not None and not other.taken:
                other.settled.wait()  # another thread of ours is asking: its answer first
                continue
            if hold is not None:
                try:
                    taken = self._take(hold, handoff, ours)
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
                raise AgentInUseError(agent_id, self._holder(agent_id))
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, _MAX_POLL_SECONDS)

    def release(self, agent_id: str) -> None:
        """Let ``agent_id`` go; if the database cannot be told now, the next renewal
        tells it (the hold lapses meanwhile)."""
        with self._mutex:
            hold = self._held.pop(agent_id)
        try:
            with self._db.autocommit() as conn:
                conn.execute(_LET_GO, (agent_id, hold.token))
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
            ago = time.monotonic() - hold.renewed
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

    def _take(self, hold: _Hold, handoff: Sequence[Any] | None, ours: set[str]) -> _Taken:
        """Try the hold once, with the handoff row if given; once more if the
        connection broke (the same token takes its own row again)."""
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
        )
        for attempt in (1, 2):
            sent = time.monotonic()
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

    def _holder(self, agent_id: str) -> str:
        """Who holds the agent: the process and host, what it runs, when it renewed."""
        try:
            with self._db.reading() as conn:
                row = conn.execute(_HOLDER, (agent_id,)).fetchone()
        except DurableError:
            return "another process"
        if row is None:
            return "another process"
        host, pid, ago, ttl, template = row
        running = f"running {template}; " if template else ""
        renewed = f"its hold renewed {ago:.1f} s ago, lasting {ttl:g} s"
        return f"process {pid} on {host} ({running}{renewed})"

    # -- renewing ----------------------------------------------------------------

    def _started(self, hold: _Hold, ours: set[str]) -> None:
        """``hold`` was taken (maybe over holds of ``ours``): renew it from now on.

        The renewals' connection is made here the first time, so that a process
        that cannot have one more connection fails at its first turn, not a
        lease later; the hold is let go then. Later, the renewals make it again
        themselves, should it break.
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
        sent = time.monotonic()
        values = (
            [agent_id for agent_id, _ in unreleased],
            [token for _, token in unreleased],
            [hold.agent_id for hold in holds],
            [hold.token for hold in holds],
        )
        try:
            with self._using:
                try:
                    rows = self._connection().execute(_RENEW, values).fetchall()
                except psycopg.Error as error:
                    self._drop()
                    raise unavailable(error, self._db.url, self._db.location) from error
        except DurableError as error:
            if not self._failing:
                names = ", ".join(repr(h.agent_id) for h in holds[:5]) or "none"
                log.warning(
                    "could not renew this process's hold on %d agent(s) (%s) in %s: %s. A "
                    "hold lapses %g s after its last renewal; its turn cannot commit then",
                    len(holds),
                    names,
                    self._db.location,
                    getattr(error, "reason", error),
                    TTL,
                )
            self._failing = True
            return False
        if self._failing:
            log.info("this process's holds on agents are renewed again")
            self._failing = False
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

    def _connection(self) -> psycopg.Connection[Any]:
        """The renewals' connection, checked (a server or pooler may have ended it), or
        a new one; hold ``_using``.

        Raises:
            DatabaseUnavailableError, DatabaseAccessError: No connection could be made.
        """
        if self._conn is not None:
            try:
                still_open(self._conn)
            except psycopg.OperationalError:
                self._drop()
        if self._conn is None:
            self._conn = self._db.connect()
        return self._conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
