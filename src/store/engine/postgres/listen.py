"""Wake alarm runners on PostgreSQL: LISTEN on a connection of its own, in a thread.

A trigger on ``alarms`` (``schema.sql``) sends a NOTIFY on
:data:`CHANNEL` from each transaction that makes a pending alarm claimable at a
new time, and PostgreSQL delivers it only once that transaction commits. An
:class:`NotifyListener` waits for those notifications and calls ``wake``, so a
runner sleeping until its next due alarm starts a newly scheduled one at once.

A lost connection (a server restart, a network cut, ``pg_terminate_backend``)
must not stop the runner: the listener calls ``wake`` and reports
``listening`` False, so the runner polls meanwhile; it reconnects with backoff,
and once listening again calls ``wake`` once more, so that the runner reads what
was committed while nobody listened.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

#: The channel the ``alarms_due`` trigger notifies; the payload names the schema.
CHANNEL = "effectful_durable_alarms"
#: The channel the ``*_committed`` triggers notify at each commit that changes an
#: agent, its approvals, alarms, handoffs, journal steps or a runner's status
#: (schema 9); the payload names the schema.
COMMITS = "effectful_durable_commits"

_RETRY_FIRST = 0.2  # seconds before the first reconnection; doubles up to _RETRY_MAX
_RETRY_MAX = 5.0

logger = logging.getLogger("effectful_durable.store")


class NotifyListener:
    """Call ``wake`` whenever a commit makes an alarm of this database due (see above).

    Args:
        connect: Opens a new autocommit connection to the database (with TCP
            keepalives: it runs no query after LISTEN, so a peer lost without a
            word is found by them, within about a minute).
        wake: Called from the listener's thread; must be quick and thread-safe.
        location: The database, as named in log messages.
        channel: The channel to LISTEN on: :data:`CHANNEL`, or :data:`COMMITS` to
            hear of every commit (the page's live updates).
        what: What it listens for, as named in log messages.
    """

    def __init__(
        self,
        connect: Callable[[], psycopg.Connection[Any]],
        wake: Callable[[], None],
        *,
        location: str,
        channel: str = CHANNEL,
        what: str = "due alarms",
    ) -> None:
        self._connect = connect
        self._channel = channel
        self._what = what
        self._wake = wake
        self._location = location
        self._listening = threading.Event()
        self._closing = threading.Event()
        # Written to by close(), so that a wait on the connection ends at once.
        self._stop_reader, self._stop_writer = socket.socketpair()
        self._thread = threading.Thread(target=self._run, name=f"listen-{channel}", daemon=True)
        self._thread.start()

    @property
    def listening(self) -> bool:
        """Whether notifications reach the runner now; while False it must poll."""
        return self._listening.is_set()

    def close(self) -> None:
        """Stop listening and close the connection."""
        if self._closing.is_set():
            return
        self._closing.set()
        self._stop_writer.send(b"\0")
        self._thread.join(timeout=0.5)
        if not self._thread.is_alive():  # else still connecting: it ends on its own
            self._stop_reader.close()
            self._stop_writer.close()

    def _run(self) -> None:
        pause, lost = _RETRY_FIRST, False
        while not self._closing.is_set():
            listened = time.monotonic()
            try:
                with self._connect() as conn:
                    schema = conn.execute("SELECT current_schema()").fetchone()
                    conn.execute(f"LISTEN {self._channel}")
                    self._listening.set()
                    listened = time.monotonic()
                    if lost:
                        logger.info("listening for %s on %s again", self._what, self._location)
                    lost = False
                    self._wake()  # what committed before LISTEN took effect
                    self._serve(conn, None if schema is None else schema[0])
            except Exception as error:  # whatever it was, the runner must go on
                if not lost and not self._closing.is_set():
                    reason = (str(error).strip() or type(error).__name__).splitlines()[0]
                    logger.warning(
                        "cannot listen for %s on %s; polling until the connection is back: %s",
                        self._what,
                        self._location,
                        reason,
                    )
                lost = True
            finally:
                if self._listening.is_set():
                    self._listening.clear()
                    self._wake()  # the runner polls from now on
            if time.monotonic() - listened > _RETRY_MAX:  # it served a while: retry soon
                pause = _RETRY_FIRST
            self._pause(pause)
            pause = min(pause * 2, _RETRY_MAX)

    def _serve(self, conn: psycopg.Connection[Any], schema: str | None) -> None:
        """Wake the runner for each notification about ``schema``, until closed or lost."""
        with selectors.DefaultSelector() as selector:
            selector.register(conn.fileno(), selectors.EVENT_READ)
            selector.register(self._stop_reader, selectors.EVENT_READ)
            while True:
                selector.select()
                if self._closing.is_set():
                    return
                # Reading a closed connection raises: the caller reconnects.
                payloads = [notify.payload for notify in conn.notifies(timeout=0)]
                if schema in payloads:  # other schemas' runners share the channel
                    self._wake()

    def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` before reconnecting, or less if closed meanwhile."""
        if not self._closing.is_set():
            with selectors.DefaultSelector() as selector:
                selector.register(self._stop_reader, selectors.EVENT_READ)
                selector.select(seconds)
