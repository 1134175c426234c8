"""Heartbeats and rescue: a live runner's claims stay its own however long its turns,
and a dead runner's move to the living within ``DEAD_AFTER`` + ``RESCUE_EVERY`` seconds,
on any host.

A thread of the runner's own (with its own connection) writes the runner's
heartbeat every ``HEARTBEAT_EVERY`` seconds: one write of its status row,
however many claims it holds (the claim query reads it: ``store/alarm_queue.py``).
Every ``RESCUE_EVERY`` seconds it looks for the claims of dead runners and gives
them back (River's ``job_rescuer``): those of a runner process surely gone at
once (its pid ended in this process's own kernel and PID namespace: a host name
and a pid alone name no process across containers), those of a runner anywhere
whose heartbeat is ``DEAD_AFTER`` seconds old, or that stopped. It judges other
runners by their heartbeats only while its own have landed for ``TRUST_AFTER``
seconds in a row: after an outage of the database, every live runner's
heartbeat is old, and each one has one interval to beat again before anyone
takes its claims.

A heartbeat that fails is tried again every second, whatever failed. An outage of
the database (a :class:`~effectful_durable.DurableError`) is ridden out, as the
runner rides it out. Any other error (a trigger of another program's that refuses
the write, a table taken away, a bug) is logged with its traceback; if heartbeats
keep failing so for ``DEAD_AFTER`` seconds, the runner's claims are no longer its
own, and the runner is told to stop (``give_up``), as it is if the thread itself
ends on an error.

The same thread prunes the status reports of runners long gone, at the runner's
start and every ``PRUNE_EVERY`` seconds (``AlarmQueue.prune_statuses``: each start
adds one).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Literal

from ..errors import DurableError
from ..store.alarm_queue import DEAD_AFTER, HEARTBEAT_EVERY, AlarmQueue

log = logging.getLogger("effectful_durable.runner")

#: Seconds between two looks for the claims of dead runners (one read each).
RESCUE_EVERY = 2.0
#: Seconds a runner's own heartbeats must have landed, in a row, before it judges
#: others by theirs: two intervals, so that a live runner has beaten since the
#: database came back.
TRUST_AFTER = 2 * HEARTBEAT_EVERY
#: Seconds between two prunings of the status reports of runners long gone.
PRUNE_EVERY = 3600.0
_RETRY = 1.0  # seconds before trying again a heartbeat that failed

__all__ = [
    "DEAD_AFTER",
    "HEARTBEAT_EVERY",
    "PRUNE_EVERY",
    "RESCUE_EVERY",
    "TRUST_AFTER",
    "Heartbeat",
]


class Heartbeat:
    """The runner's heartbeats and its rescue of dead runners' claims.

    Args:
        queue: The Store's alarm queue.
        runner: The runner's id.
        now: The runner's clock (the time a rescued claim is due again at most).
        record: Stores the runner's full status report as "running", if it has
            none (the heartbeat found no row to beat in).
        wake: Wakes the runner's loop (a rescue freed claims it may take).
        give_up: Called once, with the reason, when heartbeats cannot be written
            for a reason other than an outage of the database (see above).
    """

    def __init__(
        self,
        queue: AlarmQueue,
        runner: str,
        *,
        now: Callable[[], float],
        record: Callable[[], object],
        wake: Callable[[], None],
        give_up: Callable[[str], object] = lambda reason: None,
    ) -> None:
        self._queue = queue
        self._runner = runner
        self._now = now
        self._record = record
        self._wake = wake
        self._give_up = give_up
        self._lock = threading.Lock()
        self._since: float | None = None  # time.monotonic() of the first in a row
        self._last = 0.0  # time.monotonic() of the last one that landed
        self._failing: Literal["outage", "fault"] | None = None  # what the last failure was
        self._faulty_since: float | None = None  # the first of the faults in a row
        self._gave_up = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def landed(self, started: float) -> None:
        """Note a heartbeat (or a full status report) that landed; it was sent at ``started``.

        One that took longer than an interval, or came more than two intervals
        after the last one (this process stalled), starts a new run of them.
        """
        ended = time.monotonic()
        with self._lock:
            if (
                self._since is None
                or ended - started > HEARTBEAT_EVERY
                or ended - self._last > 2 * HEARTBEAT_EVERY
            ):
                self._since = ended
            self._last = ended

    def failed(self) -> None:
        """Note a heartbeat that did not land: the run of them starts again."""
        with self._lock:
            self._since = None

    @property
    def trusted(self) -> bool:
        """Whether this runner's heartbeats have landed ``TRUST_AFTER`` seconds in a row."""
        now = time.monotonic()
        with self._lock:
            return (
                self._since is not None
                and now - self._since >= TRUST_AFTER
                and now - self._last <= 2 * HEARTBEAT_EVERY
            )

    def start(self) -> None:
        """Beat and rescue in a thread of their own (a daemon: the database may be frozen)."""
        self._done.clear()
        self._thread = threading.Thread(target=self._keep, name="runner-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> threading.Thread | None:
        """Stop beating; return the thread, for the caller to join within its deadline."""
        self._done.set()
        thread, self._thread = self._thread, None
        return thread

    def beat(self) -> bool:
        """Write one heartbeat (the full report if the runner has no row); whether it landed.

        A failure other than the database's is logged with its traceback; once such
        failures last ``DEAD_AFTER`` seconds, ``give_up`` is called.
        """
        started = time.monotonic()
        try:
            if not self._queue.beat(self._runner):
                self._record()
        except DurableError as error:  # an outage: ridden out, and it ends a run of faults
            self.failed()
            self._faulty_since = None
            if self._failing != "outage":
                log.warning("could not write the runner's heartbeat: %s", error)
            self._failing = "outage"
            return False
        except Exception as error:  # whatever it is, the heartbeat goes on
            self._faulted(error)
            return False
        self.landed(started)
        self._faulty_since = None
        if self._failing:
            log.info("the runner's heartbeat is written again")
            self._failing = None
        return True

    def _faulted(self, error: Exception) -> None:
        """Note a heartbeat that failed on an error no outage explains; give up once
        they have lasted ``DEAD_AFTER`` seconds."""
        self.failed()
        now = time.monotonic()
        if self._faulty_since is None:
            self._faulty_since = now
            log.error(
                "could not write the runner's heartbeat (trying again every %g s): %r",
                _RETRY,
                error,
                exc_info=error,
            )
        self._failing = "fault"
        if now - self._faulty_since >= DEAD_AFTER and not self._gave_up:
            self._gave_up = True
            self._give_up(
                f"its heartbeat could not be written for {now - self._faulty_since:.0f} s "
                f"({error!r}), and a runner silent {DEAD_AFTER:g} s is dead: its claims "
                "are no longer its own"
            )

    def rescue(self) -> int:
        """Give back the claims of dead runners (judged by heartbeats if :attr:`trusted`).

        Raises:
            StorageError, DatabaseUnavailableError: The database failed.
        """
        freed = self._queue.rescue(self._runner, self._now(), heartbeats=self.trusted)
        for owner, count in freed.items():
            log.warning(
                "runner %s is dead (its process is gone, or it stopped, or its heartbeat is "
                "more than %g s old): took back %d claim(s) of it",
                owner,
                DEAD_AFTER,
                count,
                extra={"dead_runner": owner, "claims": count},
            )
        if freed:
            self._wake()
        return sum(freed.values())

    def _prune(self) -> None:
        """Delete the status reports of runners long gone; a failure is logged, never raised."""
        try:
            pruned = self._queue.prune_statuses()
        except Exception as error:  # retention must never stop a runner
            log.warning("could not prune the status reports of runners gone: %s", error)
            return
        if pruned:
            log.info("pruned the status reports of %d runner(s) long gone", pruned)

    def _keep(self) -> None:
        try:
            self._beating()
        except BaseException as error:
            log.critical("the runner's heartbeat thread ended: %r", error, exc_info=error)
            if not self._gave_up:
                self._gave_up = True
                self._give_up(f"its heartbeat thread ended on {error!r}")

    def _beating(self) -> None:
        self._prune()
        next_beat = time.monotonic() + HEARTBEAT_EVERY
        next_rescue = time.monotonic() + RESCUE_EVERY
        next_prune = time.monotonic() + PRUNE_EVERY
        while not self._done.wait(max(min(next_beat, next_rescue) - time.monotonic(), 0.0)):
            if self._gave_up:
                return
            if time.monotonic() >= next_prune:
                self._prune()
                next_prune = time.monotonic() + PRUNE_EVERY
            if time.monotonic() >= next_beat:
                landed = self.beat()
                next_beat = time.monotonic() + (HEARTBEAT_EVERY if landed else _RETRY)
            if time.monotonic() >= next_rescue and not self._done.is_set():
                try:
                    self.rescue()
                except DurableError as error:
                    log.debug("could not look for dead runners' claims: %s", error)
                except Exception as error:  # whatever it is, the heartbeat goes on
                    log.error("could not look for dead runners' claims: %r", error, exc_info=error)
                next_rescue = time.monotonic() + RESCUE_EVERY
