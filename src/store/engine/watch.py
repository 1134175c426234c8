"""Noticing other processes' commits: a cheap change marker, polled by one thread.

Each engine names a marker that moves with every commit to our tables and costs
no table read: SQLite's ``PRAGMA data_version``, which changes whenever another
connection committed to the file (sqlite.org/pragma.html#pragma_data_version);
on PostgreSQL the server's statistics of our tables, helped by the WAL position
where the server lets us read it (``postgres/table_stats.py``). A writer cannot tell
that someone watches: nothing is written, locked or sent by a commit for it. One
thread looks a few times a second, however many pages are open.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

#: Seconds between two looks: a commit is noticed within this.
INTERVAL = 0.2

logger = logging.getLogger("effectful_durable.store")


class Unwatchable(Exception):
    """The marker cannot be read, and looking again will not change that (a server
    that refuses what it would read): the watch ends."""


class MarkerWatch:
    """Call ``wake`` soon after the marker ``read`` returns has moved.

    Args:
        read: Returns the marker; called from the watching thread. It may raise:
            the watch logs it once, keeps looking, and calls ``wake`` when the
            marker can be read again (what committed meanwhile is unknown); on
            :class:`Unwatchable` it logs why and ends.
        wake: Called from the watching thread; must be quick and thread-safe.
        interval: Seconds between two looks.
        location: The database, as named in log messages.
    """

    def __init__(
        self,
        read: Callable[[], object],
        wake: Callable[[], None],
        *,
        interval: float = INTERVAL,
        location: str = "",
    ) -> None:
        self._read = read
        self._wake = wake
        self._interval = interval
        self._location = location
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="commit-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop watching (before the Database closes its connections)."""
        self._stop.set()
        self._thread.join(timeout=10.0)

    def _run(self) -> None:
        seen: object = None
        failing = False
        while not self._stop.wait(self._interval if not failing else 1.0):
            try:
                marker = self._read()
            except Unwatchable as error:
                logger.warning(
                    "cannot watch %s for commits: %s. Open pages show new commits when reloaded",
                    self._location,
                    error,
                )
                return
            except Exception as error:  # whatever it was, the watch must go on
                if not failing:
                    logger.warning("cannot watch %s for commits: %s", self._location, error)
                failing, seen = True, None
                continue
            if failing:
                logger.info("watching %s for commits again", self._location)
                failing = False
                self._wake()  # what was committed while the marker could not be read
            elif seen is not None and marker != seen:
                self._wake()
            seen = marker
