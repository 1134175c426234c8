"""Noticing other processes' commits to an SQLite file: ``PRAGMA data_version``, polled.

``PRAGMA data_version`` changes on a connection whenever another connection has
committed to the file since it was last asked (sqlite.org/pragma.html#pragma_data_version).
Asking takes a read lock for as long as SQLite needs to look at the WAL's index,
no table is read, and nothing is written or checkpointed: a writer cannot tell
that someone watches. One thread asks a few times a second, however many pages
are open.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import apsw

from ....errors import DurableError

#: Seconds between two looks: a commit is noticed within this.
INTERVAL = 0.2

logger = logging.getLogger("effectful_durable.store")


class DataVersionWatch:
    """Call ``wake`` soon after each commit of another connection to the file.

    Args:
        connection: This thread's connection to the file (the Database's): called
            from the watching thread, which gets a connection of its own.
        wake: Called from the watching thread; must be quick and thread-safe.
        interval: Seconds between two looks.
    """

    def __init__(
        self,
        connection: Callable[[], apsw.Connection],
        wake: Callable[[], None],
        *,
        interval: float = INTERVAL,
        location: str = "",
    ) -> None:
        self._connection = connection
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
        seen: int | None = None
        failing = False
        while not self._stop.wait(self._interval if not failing else 1.0):
            try:
                version = int(self._connection().pragma("data_version"))
            except (apsw.Error, DurableError) as error:
                if not failing:
                    logger.warning("cannot watch %s for commits: %s", self._location, error)
                failing, seen = True, None
                continue
            if failing:
                logger.info("watching %s for commits again", self._location)
                failing = False
                self._wake()  # what was committed while the file could not be read
            elif seen is not None and version != seen:
                self._wake()
            seen = version
