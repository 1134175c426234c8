"""Clocks for the runner: the system's, and a fake one that makes tests take milliseconds."""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Where the runner gets the time, and how it waits.

    .. versionadded:: 0.2.0
    """

    def now(self) -> float:
        """Seconds since the epoch."""

    def sleep(self, seconds: float, wake: threading.Event) -> None:
        """Wait ``seconds``, or less if ``wake`` is set."""


class SystemClock:
    """The real time; sleeping is waiting on the wake event.

    .. versionadded:: 0.2.0
    """

    polls = True

    def now(self) -> float:
        """``time.time()``."""
        return time.time()

    def sleep(self, seconds: float, wake: threading.Event) -> None:
        """Wait on ``wake`` for at most ``seconds``."""
        wake.wait(max(seconds, 0.0))


class FakeClock:
    """A clock for tests: it starts at ``start`` and jumps forward when the runner sleeps.

    A runner on it goes through days of alarms in milliseconds; the tests move
    it on with :meth:`advance` too. Unless ``polls`` is set, a runner on it does
    not look at the database every ``poll_interval`` but sleeps straight to the
    next due alarm: no other process schedules alarms in a test on a fake clock.
    Thread-safe.

    .. versionadded:: 0.2.0
    """

    def __init__(self, start: float = 1_800_000_000.0, *, polls: bool = False) -> None:
        self.polls = polls
        self._now = start
        self._lock = threading.Lock()

    def now(self) -> float:
        """The fake time."""
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> float:
        """Move the time forward by ``seconds`` and return it."""
        with self._lock:
            self._now += max(seconds, 0.0)
            return self._now

    def sleep(self, seconds: float, wake: threading.Event) -> None:
        """Jump ``seconds`` forward at once (unless ``wake`` is set), letting other threads run."""
        if not wake.is_set():
            self.advance(seconds)
        time.sleep(0)
