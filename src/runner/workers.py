"""The turns in flight: a table of them, and who runs each, in due order per agent.

One turn at a time runs in the runner's own thread (so that a signal can
interrupt it); more run in worker threads, started as needed and kept for the
runner's life, each under a handler stack of its own (effectful's handlers are
per thread), installed again when a reload rebuilt the stack.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from effectful.ops.semantics import handler

from ..store.parts.alarms import Claim

log = logging.getLogger("effectful_durable.runner")


@dataclasses.dataclass
class InProgress:
    """A turn in flight: the claim it delivers, and since when."""

    agent_id: str
    alarm_id: str
    kind: str
    started: float  # time.monotonic()
    started_at: float  # epoch seconds
    claim: Claim


@contextlib.contextmanager
def installed(stack: Sequence[Any]) -> Iterator[None]:
    """Install the handler ``stack`` (outermost first) in this thread for the block."""
    with contextlib.ExitStack() as stack_of_handlers:
        for interpretation in stack:
            stack_of_handlers.enter_context(handler(interpretation))
        yield


class Workers:
    """The turns in flight, and the threads that run them.

    Args:
        deliver: Runs one claimed turn to its end (never raises but for an
            interruption).
        stack: The handler stack in force (rebuilt by a reload).
        wake: Wakes the runner's loop (a turn ended).
    """

    def __init__(
        self,
        deliver: Callable[[Claim, float], object],
        stack: Callable[[], list[Any]],
        wake: Callable[[], None],
    ) -> None:
        self._deliver = deliver
        self._stack = stack
        self._wake = wake
        self._in_flight: dict[str, InProgress] = {}  # by alarm id
        self._lock = threading.Lock()
        self._tasks: queue.SimpleQueue[tuple[Claim, float] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        #: Set while no turn is in flight.
        self.idle = threading.Event()
        self.idle.set()
        #: Whether a turn runs in the runner's own thread right now (a signal may
        #: interrupt it there).
        self.inline = False

    def start(self, claim: Claim, now: float, *, concurrency: int) -> None:
        """Run the claimed turn: here when one turn runs at a time, else in a worker."""
        started = InProgress(
            claim.agent_id, claim.alarm_id, claim.kind, time.monotonic(), time.time(), claim
        )
        with self._lock:
            self._in_flight[claim.alarm_id] = started
            self.idle.clear()
        if concurrency == 1:
            self.inline = True
            try:
                self._run(claim, now)
            finally:
                self.inline = False
            return
        with self._lock:
            if len(self._threads) < len(self._in_flight):  # they live as long as the runner
                thread = threading.Thread(
                    target=self._work, name=f"runner-worker-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
        self._tasks.put((claim, now))

    def running(self) -> list[InProgress]:
        """The turns in flight."""
        with self._lock:
            return list(self._in_flight.values())

    def busy_agents(self) -> list[str]:
        """The agents of the turns in flight, sorted."""
        with self._lock:
            return sorted({p.agent_id for p in self._in_flight.values()})

    def drain(self, cut_off: Callable[[], float | None]) -> None:
        """Wait for the turns in flight; past ``cut_off()`` (a stop that outlasted its
        grace), leave those still in a model request to be cut off."""
        while self.running():
            if self.idle.wait(0.1):
                break
            end = cut_off()
            if end is not None and time.monotonic() > end:
                left = self.running()
                log.warning(
                    "%d turn(s) still in a model request past the grace period; leaving "
                    "them to be cut off (their handoffs tell the next turns): %s",
                    len(left),
                    ", ".join(p.alarm_id for p in left),
                )
                return

    def close(self) -> None:
        """End the worker threads (each after its turn in flight)."""
        for _ in self._threads:
            self._tasks.put(None)

    def _work(self) -> None:
        """A worker thread: run claimed turns, under a handler stack of its own."""
        with contextlib.ExitStack() as in_force:
            stack: list[Any] | None = None
            while True:
                task = self._tasks.get()
                if task is None:
                    return
                if stack is not self._stack():
                    in_force.close()
                    stack = self._stack()
                    in_force.enter_context(installed(stack))
                self._run(*task)

    def _run(self, claim: Claim, now: float) -> None:
        try:
            self._deliver(claim, now)
        except BaseException:
            log.exception("delivering %s failed", claim.alarm_id)
        finally:
            with self._lock:
                self._in_flight.pop(claim.alarm_id, None)
                if not self._in_flight:
                    self.idle.set()
            self._wake()
