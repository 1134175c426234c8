"""The connections of a PostgreSQL Store: their options, a deadline on every answer, their check.

A server can fail in three ways a client must survive (see docs' "When the
server misbehaves"):

- It restarts, or ends a session: a connection idle in the pool is dead. The
  check of a connection taken from the pool (:func:`still_open`) reads what
  the server sent meanwhile, without a round trip, until nothing more is there:
  a server that ended the session sent its goodbye and then closed the socket,
  and only the read after the goodbye sees the close.
- It freezes (stopped, swapped out, a network path that drops everything): a
  query waits for an answer that never comes. Every wait for the server on a
  :class:`DeadlineConnection` ends after ``answer_timeout`` seconds, closes the
  connection (its state is unknown) and raises :class:`ServerSilent`. The
  server's own ``statement_timeout`` and ``idle_in_transaction_session_timeout``
  (:func:`session_options`) end what a live server runs for a client gone
  silent, freeing its locks; TCP keepalives find a peer lost without a word.
- It refuses connections for a while (starting up, too many connections): the
  callers retry until their deadline (``opening.first_connection``).

A process that must end soon (a runner stopping past its grace period) does
not wait out those deadlines: once its database is *hurried*
(:attr:`DeadlineConnection.hurry_until`), each wait for an answer ends by then,
waits in progress included, closing its connection, unless the server answers
within a tick (:data:`_POLL_INTERVAL`) of it.

A child that a process forks inherits its connections' sockets: one word sent on
them (a libpq goodbye as the child tidies up) would end the parent's sessions.
Each connection of ours is known (:class:`DeadlineConnection`), and in a forked
child its socket is pointed at ``/dev/null`` at once, so that nothing the child
does reaches the parent's sessions; the child's Store refuses to be used.

psycopg and its pool log these failures as warnings, which a program with no
logging configured prints to stderr, even for a restart it survives. Their
records about our connections and pools go to our logger
(``effectful_durable.store``) at DEBUG instead (:class:`_OursQuieted`); what
matters of them is in the errors we raise and the warnings we log.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Self

import psycopg
from psycopg import errors as pg_errors
from psycopg import waiting
from psycopg.pq import ConnStatus, TransactionStatus

#: libpq's TCP keepalives, for every connection: a peer lost without a word (a
#: network cut, a host gone) is found within about a minute, not the kernel's
#: two hours. libpq ignores them on a Unix socket.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 30,
    "keepalives_interval": 10,
    "keepalives_count": 3,
}

#: The name every pool of ours starts with (psycopg_pool names its threads after it).
POOL_PREFIX = "effectful-durable "

_POLL_INTERVAL = 0.1  # psycopg's: a wait wakes this often, so that signals are handled
_MAX_READS = 8  # still_open reads at most this many times (each drains the socket)


class ServerSilent(psycopg.OperationalError):
    """The server did not answer within the connection's ``answer_timeout``, or by
    the time its process was hurried; the connection was closed."""


class _Hurried(Exception):
    """Raised inside a wait whose process was hurried past its end."""


class DeadlineConnection(psycopg.Connection[Any]):
    """A psycopg connection whose every wait for the server ends by a deadline.

    ``answer_timeout`` (seconds, None: no deadline) bounds each round trip: a
    statement, a pipeline's sync, a COMMIT. An interrupted wait (Ctrl-C, a
    runner stopping past its grace) closes the connection at once instead of
    asking the server to cancel, which a frozen server would not answer either.
    """

    answer_timeout: float | None = None
    #: When (``time.monotonic()``) every wait for the server of this class's
    #: connections ends, those in progress too, unless answered within a tick of
    #: it: set on a process stopping past its grace (``PostgresDatabase.hurry``).
    hurry_until: float | None = None

    @classmethod
    def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
        conn = super().connect(conninfo, **kwargs)
        _connections.add(conn)
        return conn

    def wait(
        self, gen: Any, interval: float = _POLL_INTERVAL, timeout: float | None = None
    ) -> Any:
        if timeout is None:
            timeout = _unhurried.timeout if _unhurried.on else self.answer_timeout
        try:
            return waiting.wait(
                self._until_hurried(gen), self.pgconn.socket, interval=interval, timeout=timeout
            )
        except pg_errors._WaitTimeout:
            self.pgconn.finish()
            msg = f"the server did not answer within {timeout:g} s"
            raise ServerSilent(msg) from None
        except _Hurried:
            self.pgconn.finish()
            msg = "the server did not answer before the process had to stop"
            raise ServerSilent(msg) from None
        except psycopg.Error:
            raise  # the server's answer, or the connection's end: nothing to interrupt
        except BaseException:
            if self.pgconn.transaction_status == TransactionStatus.ACTIVE:
                self.pgconn.finish()  # waiting for an answer that no longer matters
            raise

    def _until_hurried(self, gen: Any) -> Any:
        """``gen`` (psycopg's protocol for one round trip), ended by :class:`_Hurried`
        at the first tick with nothing to read or write past :attr:`hurry_until`."""
        try:
            state = next(gen)
        except StopIteration as done:
            return done.value
        while True:
            ready = yield state
            if not ready:  # a tick of the wait's interval passed in silence
                until = type(self).hurry_until
                if until is not None and time.monotonic() >= until:
                    raise _Hurried
            try:
                state = gen.send(ready)
            except StopIteration as done:
                return done.value


class _Unhurried(threading.local):
    """This thread's exemption from the deadline (maintenance: a prune, a fork)."""

    on = False
    timeout: float | None = None


_unhurried = _Unhurried()


@contextmanager
def unhurried(timeout: float | None = None) -> Iterator[None]:
    """Let this thread's round trips take up to ``timeout`` seconds (None: no limit)."""
    before = _unhurried.on, _unhurried.timeout
    _unhurried.on, _unhurried.timeout = True, timeout
    try:
        yield
    finally:
        _unhurried.on, _unhurried.timeout = before


def is_unhurried() -> bool:
    """Whether this thread is in an :func:`unhurried` block."""
    return _unhurried.on


def session_options(*, busy_timeout: float, statement_timeout: float | None) -> str:
    """The server settings of our sessions, as libpq ``options``.

    ``lock_timeout`` ends a wait for a row lock at ``busy_timeout``, as SQLite's
    busy timeout does. ``statement_timeout`` and
    ``idle_in_transaction_session_timeout`` end, on the server, what a client
    that stopped answering left running or open (its locks go with it).
    """
    options = f"-c lock_timeout={milliseconds(busy_timeout)}"
    if statement_timeout is not None:
        options += (
            f" -c statement_timeout={milliseconds(statement_timeout)}"
            f" -c idle_in_transaction_session_timeout={milliseconds(statement_timeout)}"
        )
    return options


def milliseconds(seconds: float) -> int:
    """A timeout of ``seconds`` as a server setting in milliseconds (0 would mean none)."""
    return max(1, int(seconds * 1000))


def still_open(conn: psycopg.Connection[Any]) -> None:
    """Check a connection before its use, without a round trip.

    Raises:
        psycopg.OperationalError: The connection is closed, broken, in a
            transaction, or the server ended its session meanwhile.
    """
    if conn.closed or conn.broken:
        msg = "the connection is closed"
        raise psycopg.OperationalError(msg)
    pgconn = conn.pgconn
    poll = select.poll()
    poll.register(pgconn.socket, select.POLLIN)
    for _ in range(_MAX_READS):
        if not poll.poll(0):
            break
        pgconn.consume_input()  # raises OperationalError once it reads the close
    if pgconn.status != ConnStatus.OK or pgconn.transaction_status != TransactionStatus.IDLE:
        msg = "the connection is not idle"
        raise psycopg.OperationalError(msg)


# Every connection of ours that is open, so that a forked child can disown them.
_connections: weakref.WeakSet[DeadlineConnection] = weakref.WeakSet()


def _disowned_in_child() -> None:
    """Point the sockets of the parent's connections at ``/dev/null`` in a forked child."""
    sockets = []
    for conn in list(_connections):
        try:
            sockets.append(conn.pgconn.socket)
        except psycopg.OperationalError:  # closed
            continue
    if not sockets:
        return
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in sockets:
            os.dup2(devnull, fd)
    finally:
        os.close(devnull)


os.register_at_fork(after_in_child=_disowned_in_child)


class _OursQuieted(logging.Filter):
    """Pass psycopg's records about our connections and pools to our logger, at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if not any(_ours(arg) for arg in args):
            return True
        log.debug("%s: %s", record.name, record.getMessage())
        return False


def _ours(arg: object) -> bool:
    """Whether a psycopg log record's argument is one of our connections or pools."""
    if isinstance(arg, DeadlineConnection):
        return True
    if isinstance(getattr(arg, "_conn", None), DeadlineConnection):  # a pipeline, a copy
        return True
    return isinstance(arg, str) and arg.startswith(POOL_PREFIX)  # a pool's name


log = logging.getLogger("effectful_durable.store")
for _name in ("psycopg", "psycopg.pool"):
    logging.getLogger(_name).addFilter(_OursQuieted())
