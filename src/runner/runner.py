"""AgentRunner: every due alarm, event and resumption becomes one turn of its agent, in
due order per agent, until the runner is stopped, within its grace period.

This module holds the loop (claim, start, sleep), the handler stack, signals,
reloads and the stop. Beside it, each with its own promise: ``workers.py`` (the
turns in flight, and the threads that run them), ``delivery.py`` (a claim is
marked delivered in its turn's commit, and whatever else comes of it is
settled), ``heartbeat.py`` (claims stay a live runner's and leave a dead
one's), ``outages.py`` (the database's failures are survived and written
back), ``config.py`` and ``clock.py``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any

from ..agents.persistent import PersistentAgent
from ..errors import DatabaseUnavailableError, DurableError, StorageError
from ..store import Durability, Store
from ..store.alarm_queue import runner_id
from .clock import Clock, SystemClock
from .config import ConfigError, RunnerConfig, check_concurrency
from .delivery import Deliverer, Delivery, Resting, default_handlers
from .heartbeat import DEAD_AFTER, Heartbeat
from .outages import Outages
from .stack import Stack
from .workers import Workers, installed

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

log = logging.getLogger("effectful_durable.runner")

_CONTENDED = 0.05  # seconds before looking again at a due alarm another runner claimed
_CUT_OFF = 2.0  # seconds run() still waits, past the grace period, for turns in workers
# Seconds past the grace period that each wait for the database server still gets
# (a frozen server: its connection is closed then, not at statement_timeout).
_HURRY = 0.5
_JOIN = 2.0  # seconds a stop waits for its helper threads (daemons) and last writes
_JOIN_PAST_GRACE = 1.0  # the same, past the cut-off of a stop that outlasted its grace


class AgentRunner:
    """Deliver the agents' due alarms, each as a turn of its agent, until stopped.

    Each due alarm is claimed (this runner's id, a fencing token), its
    agent is built by ``agents(agent_id)`` (once per runner), and
    ``agent.on_alarm(action)`` runs under the handler stack ``handlers(config)``
    returns, with a :class:`~effectful_durable.PersistenceHandler` on ``db``
    innermost (the runner adds one if the stack has none). The alarm is marked
    delivered in the commit of that turn, fenced by the claim: a turn whose claim
    another runner took commits nothing. A thread of the runner writes its
    heartbeat every 5 seconds (one write, whatever it holds): its claims are its
    own while it beats, however long its turns; a runner whose heartbeat is 15
    seconds old (on any host), or whose process is gone (on this one), is dead,
    and the others take its claims back. A failed delivery is retried with
    exponential backoff, then the alarm is dead until re-armed. A read or write
    of the database that fails (:class:`~effectful_durable.StorageError`: a full
    or failing disk; :class:`~effectful_durable.DatabaseUnavailableError`: a
    server out of reach or frozen) is logged and tried again every
    ``poll_interval``; the runner keeps running. A delivery the database failed
    costs no attempt: its claim is given back, due when it was, and a write
    back that fails is kept and retried until it lands (see :doc:`/production`).

    Between alarms it sleeps until the earliest one is due, looking at the
    database at least every ``poll_interval`` (one indexed read of the pending
    alarms; a claim, a write, only when one is due), so that an alarm another
    process made due starts within that, on either backend. Nothing listens:
    a commit makes no sound for it (see :doc:`/production`). In the main
    thread, :meth:`run` handles signals: SIGUSR1 logs a status report and stores
    it for ``effectful-durable status``; SIGHUP re-reads the config file (a bad
    one is logged and the old config stays) and calls ``on_config_update(config)``
    on the agents that define it; SIGTERM and SIGINT stop claiming, let the turn
    in progress finish within ``grace_seconds`` (else interrupt it, which leaves
    its handoff), and return 0.

    Example::

        def make_agent(agent_id: str) -> Assistant:
            return Assistant(agent_id=agent_id)

        def make_handlers(config: RunnerConfig) -> list[Any]:
            return [LiteLLMProvider(model=config.model), RetryLLMHandler()]

        AgentRunner("state.db", agents=make_agent, handlers=make_handlers,
                    config="agents.toml").run()

    Args:
        db: The database file, or an open Store (the runner leaves it open).
        agents: Builds the agent of an id.
        handlers: Builds the handler stack, outermost first, from the config; it
            is built again after each reload. Default: ``LiteLLMProvider(model=
            config.model)`` and ``RetryLLMHandler()``.
        config: A :class:`RunnerConfig`, or the path of a TOML file (re-read on
            SIGHUP), or None for the defaults.
        clock: Where the time comes from (:class:`~effectful_durable.runner.FakeClock`
            in tests).
        durability: As for PersistenceHandler, when ``db`` is a path.
        max_concurrency: How many turns, of different agents, run at once (in
            worker threads, each with its own handler stack, so tools and
            handlers must be thread-safe); default: the config's ``concurrency``,
            1. One agent's turns never run at once and keep their order. See
            :doc:`/production`.
        tracing: OpenTelemetry traces (see :doc:`/traces`) for the
            PersistenceHandler the runner adds when ``handlers`` returns none:
            False, True (the global TracerProvider) or a TracerProvider. A
            PersistenceHandler from ``handlers`` has its own ``tracing``. Either
            way, with tracing on, each delivery is a span, the parent of its turn.
        wait_for_database: When ``db`` is a PostgreSQL URL: how long to wait
            for a server that does not answer yet; default: the config's
            ``wait_for_database``, else the Store's (5 s).

    Raises:
        ConfigError: The config file does not parse.

    .. versionadded:: 0.2.0
    """

    def __init__(
        self,
        db: str | os.PathLike[str] | Store,
        *,
        agents: Callable[[str], PersistentAgent],
        handlers: Callable[[RunnerConfig], Sequence[Any]] | None = None,
        config: RunnerConfig | str | os.PathLike[str] | None = None,
        clock: Clock | None = None,
        durability: Durability = "normal",
        max_concurrency: int | None = None,
        tracing: bool | TracerProvider = False,
        wait_for_database: float | None = None,
    ) -> None:
        if max_concurrency is not None:
            check_concurrency(max_concurrency, "max_concurrency")
        if isinstance(config, RunnerConfig):
            self.config_path: str | None = config.source
            self.config = config
        elif config is None:
            self.config_path, self.config = None, RunnerConfig()
        else:
            self.config_path = os.fspath(config)
            self.config = RunnerConfig.from_toml(self.config_path)
        if isinstance(db, Store):
            self.store = db
        else:
            timeouts: dict[str, Any] = {
                "wait_for_database": self.config.wait_for_database
                if wait_for_database is None
                else wait_for_database
            }
            if self.config.statement_timeout is not None:
                timeouts["statement_timeout"] = self.config.store_timeout
            if self.config.renewal_url is not None:
                timeouts["renewal_url"] = self.config.renewal_url
            self.store = Store(db, durability=durability, **timeouts)
        self._owns_store = not isinstance(db, Store)
        self._apply_timeout(self.config)
        self.config_generation = 1
        self.config_loaded_at = time.time()
        self.clock: Clock = clock or SystemClock()
        self.id = runner_id()
        self.turns = 0
        self.errors = 0
        self.max_concurrency = max_concurrency
        self._queue = self.store.alarm_queue
        self._delivery = Delivery()
        self._stack = Stack(
            self.store,
            handlers=handlers or default_handlers,
            agents=agents,
            delivery=self._delivery,
            clock=self.clock.now,
            tracing=tracing,
        )
        #: The agents built so far, by id.
        self.agents = self._stack.agents
        self._pending_config: RunnerConfig | None = None
        self._lock = threading.Lock()  # the counters, the running flag
        self._cut_off: float | None = None  # when run() stops waiting for stuck turns
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._interrupting = False
        self._in_main = False
        self._running = False
        self._rescued = False  # the first step looks for dead runners' claims at once
        self._signals: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._unsure_of_leases = False
        self._outages = Outages(self.store.engine.location)
        self._resting = Resting(self._queue, self._outages)
        self._deliverer = Deliverer(
            self.id,
            self._queue,
            self._outages,
            self._delivery,
            self._resting,
            config=lambda: self.config,
            persistence=lambda: self._stack.persistence,
            agent_of=lambda agent_id: self._stack.agent(agent_id, self.config),
            count=self._count,
            stopping=self._stopping,
        )
        self._workers = Workers(
            self._deliverer.deliver, lambda: self._stack.handlers, self._wake.set
        )
        self._started = time.monotonic()
        self._started_at = time.time()
        self._heartbeat = Heartbeat(
            self._queue,
            self.id,
            now=self.clock.now,
            record=lambda: self._record("running", if_missing=True, quiet=False),
            wake=self._wake.set,
            give_up=self._heartbeat_gave_up,
        )
        self._status = 0  # what run() returns
        self._stack.build(self.config)

    # -- public control ----------------------------------------------------------

    def run(self, *, until: float | None = None) -> int:
        """Deliver alarms until :meth:`stop` (or a signal); return the exit status: 0,
        or 1 if the runner stopped because its heartbeat could not be written (for a
        reason other than an outage of the database, which it rides out).

        Args:
            until: Return once the clock has passed this time, no turn is in
                flight and nothing is due (for tests and batch runs on a fake clock).
        """
        signals = self._in_main = threading.current_thread() is threading.main_thread()
        previous = self._install_signals() if signals else {}
        control = threading.Thread(target=self._control, name="runner-control", daemon=True)
        control.start()
        self._started, self._started_at = time.monotonic(), time.time()
        self._delivery.cancel.clear()
        self._cut_off = None
        where = self.store.engine.location  # the URL without its password
        log.info(
            "runner %s started on %s",
            self.id,
            where,
            extra={"runner": self.id, "db": where, "config": self.config_path},
        )
        self._running = True
        self._rescued = False
        self._status = 0
        sent = time.monotonic()
        if self._record("running"):
            self._heartbeat.landed(sent)  # the first heartbeat
        self._heartbeat.start()
        try:
            self._loop(until)
            self._workers.drain(lambda: self._cut_off)
        finally:
            # Threads that may wait for a frozen database are daemons: a stop waits
            # for them all, the last writes included, _JOIN seconds in all (less
            # past the cut-off of a stop that outlasted its grace).
            ending = time.monotonic() + _JOIN
            if self._cut_off is not None:
                ending = min(ending, max(self._cut_off, time.monotonic()) + _JOIN_PAST_GRACE)
            keeper = self._heartbeat.stop()
            last = threading.Thread(target=self._last_writes, name="runner-last", daemon=True)
            last.start()
            self._signals.put(None)
            for thread in (keeper, control, last):
                if thread is not None:
                    thread.join(timeout=max(0.0, ending - time.monotonic()))
            with self._lock:
                self._running = False
                self.store.engine.hurry(None)  # the Store may serve on: its waits as before
            for signum, old in previous.items():
                signal.signal(signum, old)
            if last.is_alive():
                log.warning("the database did not take the last writes within %g s", _JOIN)
            log.info(
                "runner %s stopped after %d turns (%d errors)",
                self.id,
                self.turns,
                self.errors,
                extra={"runner": self.id, "turns": self.turns, "errors": self.errors},
            )
        return self._status

    def stop(self, *, grace: float | None = None) -> None:
        """Stop claiming alarms; the turns in progress may finish within ``grace`` seconds.

        ``grace`` defaults to the config's ``grace_seconds``. Past it, a turn running
        in the main thread is interrupted (KeyboardInterrupt), which leaves its
        handoff; turns running in worker threads (``max_concurrency`` above 1)
        stop at their next model request or template call, as interrupted, and
        :meth:`run` returns at most 3 seconds later even if one is stuck in a
        request (ending the process then cuts it off, as a crash would). Each wait
        for a database server ends half a second past the grace at the latest,
        even a frozen server's (its connection closed), so that the writes of the
        interrupted turns and the last ones fail then instead of waiting out
        ``statement_timeout`` (until :meth:`run` returns, for every user of the
        runner's Store). Thread-safe; :meth:`run` returns once the turns end.
        """
        if self._stopping.is_set():
            return
        self._stopping.set()
        self._wake.set()
        grace = self.config.grace_seconds if grace is None else grace
        with self._lock:
            if self._running:
                self.store.engine.hurry(grace + _HURRY)
        in_flight = self._workers.running()
        if not in_flight:
            log.info("stopping", extra={"runner": self.id})
            return
        log.info(
            "stopping: waiting up to %g s for %d turn(s): %s",
            grace,
            len(in_flight),
            ", ".join(f"{p.agent_id} ({p.kind} {p.alarm_id})" for p in in_flight),
            extra={"turns": [p.alarm_id for p in in_flight]},
        )
        threading.Thread(target=self._interrupt_after, args=(grace,), daemon=True).start()

    def _heartbeat_gave_up(self, reason: str) -> None:
        """Stop, exiting 1: the heartbeat cannot be written (from its thread)."""
        log.critical(
            "runner %s stops: %s. Fix what refuses the heartbeat (its log above says), "
            "then start the runner again",
            self.id,
            reason,
            extra={"runner": self.id},
        )
        self._status = 1
        self.stop()

    def reload(self) -> bool:
        """Re-read the config file; apply it from the next turn on. False if it is bad.

        A file that does not parse is logged, and the config in force stays.
        """
        if self.config_path is None:
            log.warning("reload asked, but the runner has no config file")
            return False
        try:
            config = RunnerConfig.from_toml(self.config_path)
        except ConfigError as error:
            log.error(
                "config not reloaded, keeping generation %d: %s",
                self.config_generation,
                error,
                extra={"config": self.config_path},
            )
            return False
        self._pending_config = config
        self._wake.set()
        return True

    def status(self) -> dict[str, Any]:
        """The status report: uptime, turns, errors, alarms, agents, the turn in progress."""
        uptime = time.monotonic() - self._started
        attempts = self.turns + self.errors
        try:
            counts = self._queue.counts(self.clock.now())
        except DurableError as error:
            counts = {"error": str(error)}  # type: ignore[dict-item]
        in_flight = self._workers.running()
        return {
            "runner": self.id,
            "pid": os.getpid(),
            "uptime_seconds": round(uptime, 3),
            "turns": self.turns,
            "errors": self.errors,
            "error_rate": round(self.errors / attempts, 4) if attempts else 0.0,
            "alarms_due": counts.get("due"),
            "alarms_pending": counts.get("pending"),
            "alarms_dead": counts.get("dead"),
            "events_pending": counts.get("events_pending"),
            "events_dead": counts.get("events_dead"),
            "resumptions_pending": counts.get("resumes_pending"),
            "approvals_pending": counts.get("approvals_pending"),
            "agents_seen": len(self.agents),
            "max_concurrency": self._concurrency(),
            "in_progress": [
                {
                    "agent": p.agent_id,
                    "alarm": p.alarm_id,
                    "kind": p.kind,
                    "seconds": round(time.monotonic() - p.started, 3),
                }
                for p in in_flight
            ],
            "config": {
                "path": self.config_path,
                "generation": self.config_generation,
                "features": dict(self.config.features),
            },
        }

    def report_status(self) -> dict[str, Any]:
        """Store the status report where ``effectful-durable status`` reads it, then log
        it (so that whoever saw the line finds the report stored)."""
        report = self.status()
        self._record("running" if self._running else "stopped", report)
        log.info(
            "status: %d turns, %d errors, %s alarms due, %s pending, %s dead, %d agents%s",
            report["turns"],
            report["errors"],
            report["alarms_due"],
            report["alarms_pending"],
            report["alarms_dead"],
            report["agents_seen"],
            f", in turns {report['in_progress']}" if report["in_progress"] else "",
            extra={"status": report},
        )
        return report

    def close(self) -> None:
        """End the runner's worker threads and close the stores it opened."""
        self._workers.close()
        # The runner's own PersistenceHandler holds nothing but self.store, and a
        # store the caller passed in stays open for the caller.
        if self._owns_store:
            self.store.engine.hurry(0.0)  # a frozen server's connections: not waited for
            self.store.close()

    def __enter__(self) -> AgentRunner:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- the loop ------------------------------------------------------------------

    def _loop(self, until: float | None) -> None:
        # The handler stack stays installed between turns (installing it costs
        # milliseconds), and is installed again when a reload rebuilt it; each
        # worker thread installs its own (effectful's handlers are per thread).
        with contextlib.ExitStack() as in_force:
            stack: list[Any] | None = None
            while not self._stopping.is_set():
                self._apply_pending_config()
                if stack is not self._stack.handlers:
                    in_force.close()
                    stack = self._stack.handlers
                    in_force.enter_context(installed(stack))
                try:
                    if self._step(until):
                        return
                except (StorageError, DatabaseUnavailableError) as error:
                    if self._storage_failed(error, until):
                        return

    def _storage_failed(
        self, error: StorageError | DatabaseUnavailableError, until: float | None
    ) -> bool:
        """Log a failed read or write of the database, and wait before the next try.

        A full or failing disk, or a database server out of reach, must not end a
        runner meant to run for weeks: the runner tries again every
        ``poll_interval``, first writing back what it could not (a claim to give
        back, a failure to record), and giving back any claim whose commit it
        could not confirm. The first failure is a warning, the next ones are
        summed up every 30 s, and the return of the database is logged.

        Returns:
            True when ``until`` has passed.
        """
        self._count(errors=1)
        self._unsure_of_leases = True  # a claim's commit may have been what failed
        wait = self.config.poll_interval
        self._outages.failed(error, wait)
        return self._sleep(wait, self.clock.now(), until)

    def _step(self, until: float | None) -> bool:
        """Start one due turn, or sleep until one may be due; True when ``until`` passed."""
        now = self.clock.now()
        self._outages.write_back()
        if self._unsure_of_leases:
            running = [p.alarm_id for p in self._workers.running()]
            freed = self._queue.release_own(self.id, now, keep=running)
            self._unsure_of_leases = False
            if freed:
                log.info("gave back %d claim(s) whose commit could not be confirmed", freed)
        if not self._rescued:  # then every few seconds, in the heartbeat's thread
            self._heartbeat.rescue()
            self._rescued = True
        self._outages.answered()
        busy = self._workers.busy_agents()
        held = sorted({*busy, *self._outages.agents(), *self._resting.agents(now)})
        due = None
        if len(busy) < self._concurrency():
            # A read: claim (a write) only when one is due.
            due = self._queue.next_due(held)
            if due is not None and due <= now:
                claim = self._queue.claim(self.id, now, self.config.lease_seconds, held)
                if claim is not None:
                    self._workers.start(claim, now, concurrency=self._concurrency())
                    return False
                due = self._queue.next_due(held)
                if due is not None and due <= now:  # another runner is claiming it right now
                    due = now + _CONTENDED
        if busy and (not self._polls or (until is not None and now >= until)):
            # A fake clock jumps only once the turns in flight are done: their
            # agents' next alarms must not be skipped over. Past ``until`` the
            # same: run() returns only when nothing is due, and while every slot
            # is taken (or the due ones are the busy agents') nothing says so.
            self._workers.idle.wait(0.05)
            return False
        if not self._polls:  # a fake clock in a test has no other process to notice
            wait = 1e9
        else:
            wait = self.config.poll_interval
        for then in (due, self._resting.next_end()):
            if then is not None:
                wait = min(wait, max(then - now, 0.0))
        return self._sleep(wait, now, until)

    def _last_writes(self) -> None:
        """On the way out: what is left to write back, and the "stopped" status, unless
        the database is failing (each write would wait for it in vain)."""
        if not self._outages.down:
            with contextlib.suppress(StorageError, DatabaseUnavailableError):
                self._outages.write_back()
        if not self._outages.down:
            self._record("stopped")
        else:
            log.warning("the database is failing: the stopped status is not recorded")
        left = self._outages.left()
        if left:
            log.warning(
                "%d claim(s) left as they are, until another runner takes them back (once "
                "this runner's heartbeat is %g s old, or at once on this host): %s",
                DEAD_AFTER,
                len(left),
                ", ".join(f"{p.claim.alarm_id} of {p.claim.agent_id}" for p in left),
            )

    def _concurrency(self) -> int:
        """How many turns may run at once: the argument, else the config's ``concurrency``."""
        return self.max_concurrency or self.config.concurrency

    def _count(self, *, turns: int = 0, errors: int = 0) -> None:
        with self._lock:
            self.turns += turns
            self.errors += errors

    @property
    def _polls(self) -> bool:
        """Whether other processes may change the alarms while we sleep (not on a fake clock)."""
        return bool(getattr(self.clock, "polls", True))

    def _sleep(self, wait: float, now: float, until: float | None) -> bool:
        """Sleep ``wait`` seconds, less if ``until`` comes first or a signal wakes us.

        Returns:
            True, without sleeping, when ``until`` has passed.
        """
        if until is not None:
            if now >= until:
                return True
            wait = min(wait, until - now)
        self.clock.sleep(wait, self._wake)
        self._wake.clear()
        return False

    # -- config ------------------------------------------------------------------

    def _apply_pending_config(self) -> None:
        config, self._pending_config = self._pending_config, None
        if config is None:
            return
        try:
            self._stack.build(config)
        except Exception as error:
            log.error(
                "config not applied, keeping generation %d: %s", self.config_generation, error
            )
            return
        self.config = config
        self._apply_timeout(config)
        self.config_generation += 1
        self.config_loaded_at = time.time()
        self._stack.notify_all(config)
        log.info(
            "config reloaded: generation %d from %s",
            self.config_generation,
            self.config_path,
            extra={"config": self.config_path, "generation": self.config_generation},
        )

    def _apply_timeout(self, config: RunnerConfig) -> None:
        """Give the store the config's ``statement_timeout``, if it sets one."""
        if config.statement_timeout is not None:
            self.store.engine.statement_timeout = config.store_timeout

    # -- signals -------------------------------------------------------------------

    def _install_signals(self) -> dict[int, Any]:
        previous: dict[int, Any] = {}
        for signum in (signal.SIGUSR1, signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, self._on_signal)
        return previous

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        # Runs in the main thread between two bytecodes, maybe inside a turn's
        # transaction: hand the work to the control thread, which has its own
        # connection. SimpleQueue.put is safe here (it is reentrant).
        stop = signum in (signal.SIGINT, signal.SIGTERM)
        if stop and (self._interrupting or (self._stopping.is_set() and self._workers.running())):
            # The grace period is over, or a second Ctrl-C: interrupt the turns now.
            self._interrupting = False
            self.store.engine.hurry(_HURRY)  # a frozen server: not its statement_timeout
            if self._workers.inline:
                raise KeyboardInterrupt  # the turn runs in this thread
            self._delivery.cancel.set()  # the workers' turns, at their next request
            self._cut_off = time.monotonic()
            return
        self._signals.put(signum)

    def _control(self) -> None:
        while True:
            signum = self._signals.get()
            if signum is None:
                return
            try:
                if signum == signal.SIGUSR1:
                    self.report_status()
                elif signum == signal.SIGHUP:
                    log.info("SIGHUP: reloading %s", self.config_path)
                    self.reload()
                else:
                    log.info("%s: stopping", signal.Signals(signum).name)
                    self.stop()
            except Exception:
                log.exception("handling signal %s failed", signum)

    def _interrupt_after(self, grace: float) -> None:
        if self._workers.idle.wait(grace):
            return  # done in time
        log.warning("grace period of %g s over: interrupting the turns in progress", grace)
        self._delivery.cancel.set()  # worker threads: at their next request
        self._cut_off = time.monotonic() + _CUT_OFF
        if not (self._workers.inline and self._in_main):
            return  # a turn in another thread cannot be interrupted in a request
        self._interrupting = True
        # A real signal to the main thread, not _thread.interrupt_main(): that one
        # only sets a flag, which a blocking call (a model request) never checks.
        main = threading.main_thread().ident
        assert main is not None
        signal.pthread_kill(main, signal.SIGINT)

    def _record(
        self,
        state: Any,
        report: dict[str, Any] | None = None,
        *,
        if_missing: bool = False,
        quiet: bool = True,
    ) -> bool:
        """Store the status report (a heartbeat too); whether it landed.

        Unless ``quiet``, a failure is raised, not logged.
        """
        try:
            self._queue.record_status(
                self.id,
                state=state,
                started_at=self._started_at,
                report=report if report is not None else self.status(),
                if_missing=if_missing,
            )
        except Exception as error:  # a refused report (a foreign trigger, say) ends nothing
            if not quiet:
                raise
            log.warning("could not store the status report: %s", error)
            return False
        return True
