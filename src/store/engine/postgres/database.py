"""The PostgreSQL backend: a connection pool, a lease per agent held, our SQL dialect.

``Store("postgresql://...")`` opens one :class:`PostgresDatabase`. The shared
modules' SQL (``?``/``?N`` parameters) runs unchanged through
:class:`PostgresConn`, which rewrites the parameters for psycopg; what only
PostgreSQL speaks (full-text search, ``FOR UPDATE``, the agents' holds, the
schema's identification) is here. See ``engine/seam.py`` for the seam.

- Transactions: a write is ``BEGIN`` (read committed) ... ``COMMIT`` on a pooled
  connection; a read is one ``REPEATABLE READ READ ONLY`` snapshot. A block
  nested in this thread's open block uses that block's connection. A turn's
  commit is a batch: its statements go with ``BEGIN`` and ``COMMIT`` in one
  pipeline, one round trip.
- One writer per agent: a hold, a lease row renewed in the server's clock
  (``holds.py``), never server session state: a host lost without a word
  loses its agents within the lease. A turn takes it with its handoff row in
  one statement, one round trip (the schema's ``effectful_durable_take``,
  which writes nothing when another process holds the agent). Each commit
  checks, in its own statements, that the hold is still its own and the
  agent's version the one it started from (fencing: a holder whose hold lapsed,
  or a writer that bypassed the hold, cannot commit over another's turn;
  ``effectful_durable_advance`` raises, so that a batch reads nothing back
  before its commit).
- A lost connection (server restart, network) fails the block in flight with
  DatabaseUnavailableError, unless it was a turn's COMMIT that landed (looked
  up by its id: :meth:`PostgresDatabase._resolve`); each connection taken from
  the pool is checked first (``connections.py``), so the next block works.
  Every wait for the server ends by ``statement_timeout``.
- The agents' SQL workspaces: their log is in this database, like every other
  part; each machine keeps its SQLite files of the agents' tables in a
  stamped cache of its own, one directory per database
  (``workspace_directory``; ``store/workspace/cache.py``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, suppress
from typing import Any

import psycopg
import psycopg_pool
from psycopg import errors as pg_errors
from psycopg.pq import TransactionStatus

from ....errors import (
    AgentInUseError,
    CommitUnknownError,
    DatabaseAccessError,
    DatabaseBusyError,
    DatabaseUnavailableError,
    DurableError,
    HoldLapsedError,
    NotOurDatabaseError,
    NotSupportedError,
    SchemaTooNewError,
)
from ..seam import (
    APPLICATION_ID,
    DEFAULT_STATEMENT_TIMEOUT,
    Conn,
    Rows,
    TurnWrite,
    forked,
    moved_by,
    redacted,
)
from ..watch import MarkerWatch
from .connections import (
    KEEPALIVES,
    POOL_PREFIX,
    DeadlineConnection,
    ServerSilent,
    is_unhurried,
    milliseconds,
    session_options,
    still_open,
    unhurried,
)
from .holds import AgentHolds
from .opening import (
    connect_timeout,
    connect_timeout_given,
    first_connection,
    opening_connection,
    pool_connections,
    unavailable,
    unavailable_reason,
    user_options,
)
from .schema import MIGRATIONS, SCHEMA_VERSION, schema_sql
from .table_stats import TableStatsMarker

_HOST = socket.gethostname()

# What PostgreSQL does not carry yet, by the name Database.require is given (every
# part a turn writes is carried now).
_UNSUPPORTED_WRITES: tuple[tuple[type[Any], str], ...] = ()
_UNSUPPORTED_PREFIXES = ("Store.vacuum",)

# The SQLSTATEs of the schema's functions (schema.sql): the agent moved during the
# turn (effectful_durable_advance); the hold the write names lapsed or was taken
# (effectful_durable_held).
_MOVED = "EDMVD"
_LAPSED = "EDLPS"
_HELD = "SELECT effectful_durable_held(%s, %s, false)"

_POLL_SECONDS = 0.005
# The client waits this much longer than the server's own statement_timeout, so
# that a live server ends a statement (and says so) before the client gives up.
_ANSWER_MARGIN = 1.0
_CLOSE = 1.0  # seconds closing waits for the pool's threads (daemons: a frozen server)
# Seconds a wait for a pooled connection lasts before it looks again whether the
# database was hurried meanwhile (psycopg_pool cannot be woken).
_GETCONN_SLICE = 0.2
_TICK = 0.1  # seconds: how soon past a hurried end a wait still ends (an answer's chance)
_UNHURRIED = "SET LOCAL statement_timeout = 0; SET LOCAL idle_in_transaction_session_timeout = 0"
# PostgreSQL 17 ends a transaction older than transaction_timeout, if the server or
# the role sets one; an unhurried block (a migration, a prune) is exempt too.
_UNHURRIED_17 = f"{_UNHURRIED}; SET LOCAL transaction_timeout = 0"
# Who holds the NOTIFY queue's lock (pg_database's object 0, in no database), or
# else waits for it.
_NOTIFY_LOCK_HOLDER = """
    SELECT a.pid, a.datname, a.application_name, a.wait_event, l.granted
      FROM pg_locks AS l JOIN pg_stat_activity AS a ON a.pid = l.pid
     WHERE l.locktype = 'object' AND l.database = 0 AND l.objid = 0
       AND l.classid = 'pg_database'::regclass
     ORDER BY l.granted DESC LIMIT 1
"""
# Another session's lock on a table of ours that writers wait for (SHARE or stronger).
_TABLE_LOCK = """
    SELECT l.mode, c.relname, l.pid, a.application_name
      FROM pg_locks AS l JOIN pg_class AS c ON c.oid = l.relation
      LEFT JOIN pg_stat_activity AS a ON a.pid = l.pid
     WHERE l.locktype = 'relation' AND l.granted AND l.pid <> pg_backend_pid()
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND c.relnamespace = current_schema()::regnamespace
       AND l.mode IN ('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock',
                      'AccessExclusiveLock')
     ORDER BY c.relname LIMIT 1
"""

log = logging.getLogger("effectful_durable.store")


class PostgresDatabase:
    """One PostgreSQL database, as a Store's Database (see engine/seam.py).

    Raises:
        NotOurDatabaseError: Its schema holds tables, and none of them is ours.
        SchemaTooNewError: A newer effectful-durable made its tables.
        DatabaseAccessError: The server refused the URL's database, role or
            credentials, or the URL is invalid (at once: retrying cannot help).
        DatabaseUnavailableError: The server could not be reached within
            ``busy_timeout`` (at least 5 s).
    """

    kind = "postgresql"
    # The server's clock, not the clients': runners on many machines compare their
    # heartbeats on it, whatever their own clocks say.
    now_sql = "(extract(epoch FROM clock_timestamp())::float8)"

    def __init__(
        self,
        url: str,
        *,
        busy_timeout: float,
        readonly: bool,
        pool_size: int = 10,
        workspace_dir: str | None = None,
        statement_timeout: float | None = DEFAULT_STATEMENT_TIMEOUT,
        wait_for_database: float | None = None,
        renewal_url: str | None = None,
    ) -> None:
        for name, value in (
            ("busy_timeout", busy_timeout),
            ("statement_timeout", statement_timeout),
            ("wait_for_database", wait_for_database),
        ):
            if value is not None and (not isinstance(value, (int, float)) or value < 0):
                msg = f"{name} must be a number of seconds >= 0, not {value!r}"
                raise ValueError(msg)
        if pool_size < 1:
            msg = f"pool_size must be >= 1, not {pool_size!r}"
            raise ValueError(msg)
        self.url = self.identity = url
        self.location = redacted(url)
        self.busy_timeout = busy_timeout
        self.readonly = readonly
        self._local = threading.local()
        self._closed = False
        self._pid = os.getpid()
        self._deleted: set[str] = set()  # agents deleted under a hold of this Store
        # The user's own options (the URL's, else PGOPTIONS) go first: libpq would
        # otherwise drop them for ours.
        options = session_options(busy_timeout=busy_timeout, statement_timeout=statement_timeout)
        if readonly:
            options += " -c default_transaction_read_only=on"
        if own := user_options(url):
            options = f"{own} {options}"
        self._connect_kwargs: dict[str, Any] = {
            "autocommit": True,
            "application_name": f"effectful-durable {_HOST} {os.getpid()}",
            "options": options,
            **KEEPALIVES,
        }
        self._statement_timeout = statement_timeout
        if not connect_timeout_given(url):
            # A connection attempt to a frozen server ends, as every wait does.
            self._connect_kwargs["connect_timeout"] = connect_timeout(self._connection_wait)
        #: Our connections' class: each wait for an answer ends by its deadline.
        self._connection_class: type[DeadlineConnection] = type(
            "Connection", (DeadlineConnection,), {}
        )
        self.statement_timeout = statement_timeout
        wait = max(busy_timeout, 5.0) if wait_for_database is None else wait_for_database
        started = time.monotonic()
        # In this thread, so that a refusal is raised at once, in the server's words;
        # the pool's own attempts only log why they fail (opening.py).
        first, pooled = opening_connection(
            url,
            self.location,
            self._connect_kwargs,
            timeout=wait,
            connection_class=self._connection_class,
        )
        #: Whether the URL reaches a pooler in transaction mode (PgBouncer): each
        #: transaction then sets the sessions' settings itself, and nothing is
        #: prepared on the server.
        self.pooled = pooled
        self._unhurried_sql = _UNHURRIED_17 if first.info.server_version >= 170000 else _UNHURRIED
        if pooled:
            # A statement prepared on one server session is unknown to the next.
            self._connect_kwargs["prepare_threshold"] = None
            first.prepare_threshold = None
        self._pool_class = pool_connections(first, self._connection_class, lambda: self._closed)
        self._pool = psycopg_pool.ConnectionPool(
            url,
            connection_class=self._pool_class,
            min_size=1,
            max_size=pool_size,
            kwargs=self._connect_kwargs,
            open=False,
            timeout=self._connection_wait,
            name=f"{POOL_PREFIX}{self.location}",
        )
        try:
            self._pool.open(wait=True, timeout=max(wait - (time.monotonic() - started), 1.0))
        except psycopg_pool.PoolTimeout as e:
            self._pool.close()
            raise unavailable(e, url, self.location, opening=True) from e
        try:
            with unhurried():  # a migration may take its time
                self._prepare()
            #: This machine's directory of the agents' SQL workspace files (their
            #: cache: see store/workspace/cache.py), one per database.
            self.workspace_directory = os.path.join(
                workspace_dir or user_cache_root(), self._cache_name()
            )
        except BaseException:
            self._pool.close()
            raise
        self._holds = AgentHolds(self, renewal_url=renewal_url)

    def close(self) -> None:
        """Close the pool and the holds' renewals (the holds left lapse); in a forked
        child, only forget them (they are the parent's)."""
        self._closed = True
        if os.getpid() != self._pid:
            return
        self._holds.close()
        # Hurried, the pool's threads that are connecting to a frozen server are left
        # to end on their own (daemons).
        self._pool.close(timeout=0.0 if self._hurry_left() is not None else _CLOSE)

    def hurry(self, seconds: float | None) -> None:
        """End every wait for the server within ``seconds`` from now (or by an earlier
        end already set), the waits in progress included; None: no such end.

        For a process that must stop soon whatever the server does (a runner
        stopping past its grace period): a wait the server does not answer by
        then, within a tick, closes its connection and raises
        DatabaseUnavailableError instead of waiting out ``statement_timeout``; a
        wait for a pooled connection ends too, and no new connection is made past
        it. A server that answers still takes the writes.
        """
        cls = self._connection_class
        if seconds is None:
            cls.hurry_until = None
            return
        until = time.monotonic() + max(seconds, 0.0)
        cls.hurry_until = until if cls.hurry_until is None else min(cls.hurry_until, until)

    def _hurry_left(self) -> float | None:
        """Seconds left until the end :meth:`hurry` set (<= 0: past it); None if none."""
        until = self._connection_class.hurry_until
        return None if until is None else until - time.monotonic()

    @property
    def statement_timeout(self) -> float | None:
        """The longest a statement may run, and a call wait for the server, in seconds.

        The server ends a statement past it (``statement_timeout``), and a
        transaction left idle as long (``idle_in_transaction_session_timeout``);
        the client waits for each answer one second more, then closes the
        connection and raises DatabaseUnavailableError (a frozen server). A call
        also waits this long for a connection. Set, it applies to each wait from
        then on (the server's settings: to new connections). None: no limit.
        """
        return self._statement_timeout

    @statement_timeout.setter
    def statement_timeout(self, seconds: float | None) -> None:
        self._statement_timeout = seconds
        answer = None if seconds is None else seconds + _ANSWER_MARGIN
        self._connection_class.answer_timeout = answer

    @property
    def session_settings(self) -> str:
        """The statement that gives a transaction our sessions' settings, through a
        pooler (elsewhere, the connections' startup options carry them)."""
        settings = {"lock_timeout": milliseconds(self.busy_timeout)}
        if self._statement_timeout is not None and not is_unhurried():
            timeout = milliseconds(self._statement_timeout)
            settings["statement_timeout"] = timeout
            settings["idle_in_transaction_session_timeout"] = timeout
        calls = [f"set_config('{name}', '{value}', true)" for name, value in settings.items()]
        if self.readonly:
            calls.append("set_config('transaction_read_only', 'on', true)")
        return f"SELECT {', '.join(calls)}"

    def unhurried(self) -> AbstractContextManager[None]:
        """Lift the statement timeout, client's and server's, in this thread's block."""
        return unhurried()

    @property
    def _connection_wait(self) -> float:
        """How long a call waits for a connection: the server restarting, the pool busy."""
        if self._statement_timeout is None:
            return max(self.busy_timeout, 5.0)
        return max(self._statement_timeout, 1.0)

    # -- connections and transactions ------------------------------------------

    def connect(
        self, url: str | None = None, *, timeout: float | None = None
    ) -> DeadlineConnection:
        """A new connection outside the pool (the holds' renewals, a commit's check),
        within ``timeout`` seconds or else the time a call waits for a connection
        (none once hurried past its end); to ``url`` if given, without our sessions'
        settings (whoever uses it sets its own: it may reach a pooler) and without
        prepared statements."""
        self._not_forked()
        kwargs = self._connect_kwargs
        if url is not None:
            kwargs = {**kwargs, "prepare_threshold": None}
            kwargs.pop("options", None)
        wait = self._connection_wait if timeout is None else timeout
        left = self._hurry_left()
        if left is not None:
            if left <= 0:
                reason = "no new connection: the process is stopping"
                raise DatabaseUnavailableError(self.location, reason)
            wait = min(wait, left)
        return first_connection(
            self.url if url is None else url,
            self.location if url is None else redacted(url),
            kwargs,
            timeout=wait,
            connection_class=self._connection_class,
            opening=False,
        )

    def as_conn(self, raw: psycopg.Connection[Any]) -> PostgresConn:
        """``raw``, a connection of :meth:`connect`'s, as the Store's SQL runs on it."""
        return PostgresConn(raw)

    def _not_forked(self) -> None:
        """Refuse to use the connections of the process that opened this database in
        a child it forked: they are the parent's sessions (and the pool's threads and
        the holds' renewals did not come along).

        Raises:
            DurableError: This is a forked child of the process that opened it.
        """
        if os.getpid() != self._pid:
            raise DurableError(forked(self.location, self._pid))

    @contextmanager
    def _transaction(self, begin: str | None, *, batch: bool = False) -> Iterator[PostgresConn]:
        """A pooled connection in a transaction started by ``begin`` (None: autocommit),
        its statements pipelined with the commit if ``batch``.

        A connection the server closed while the pool held it fails at ``BEGIN``,
        before anything of the block was sent: the block then gets a new one. A
        COMMIT whose answer was lost is resolved (:meth:`_resolve`).
        """
        if self._closed:
            msg = f"Store({self.location!r}) is closed; open a new Store to use it"
            raise DurableError(msg)
        self._not_forked()
        open_conn: PostgresConn | None = getattr(self._local, "conn", None)
        if open_conn is not None:  # nested in this thread's block: see what it sees
            yield open_conn
            return
        raw: DeadlineConnection | None = None
        try:
            raw = self._checked_out(None if batch else begin)
            conn = PostgresConn(raw)
            if begin is None and self.pooled:  # each statement its own transaction
                conn.settings = self.session_settings
            self._local.conn = conn
            committing = False
            try:
                if begin is None:
                    yield conn
                    return
                if batch:
                    # One round trip: BEGIN, the block's statements and COMMIT
                    # go out together, and the pipeline's end waits for them
                    # (raising the first error; the server skips what follows).
                    with raw.pipeline() as conn.pipeline:
                        raw.execute(begin)
                        if self.pooled:
                            raw.execute(self.session_settings)
                        yield conn
                        committing = True
                        self._commit(raw, conn)
                else:
                    yield conn
                    committing = True
                    if conn.holds:  # the last fence and the COMMIT: one round trip
                        with raw.pipeline():
                            self._commit(raw, conn)
                    else:
                        raw.execute("COMMIT")
            except BaseException as error:
                lost = raw.closed or raw.broken
                if (batch or conn.holds) and not raw.closed:
                    # psycopg does not learn that a failed pipeline skipped
                    # preparing its later statements, and would name them
                    # to the server ever after: the pool replaces the connection.
                    raw.close()
                elif not lost and raw.info.transaction_status != TransactionStatus.IDLE:
                    with suppress(psycopg.Error):  # the pool discards it then
                        raw.execute("ROLLBACK")
                if committing and lost and isinstance(error, psycopg.Error):
                    self._resolve(conn, error)  # returns if the commit landed
                    return
                if committing and _waited_at_commit(error):
                    waited_for = self._commit_lock()
                    raise DatabaseBusyError(
                        self.location, self.busy_timeout, waited_for=waited_for
                    ) from error
                raise
            finally:
                conn.pipeline = None
                self._local.conn = None
        except psycopg.Error as e:
            ours = self._translated(e)
            if ours is e:
                raise
            raise ours from e
        except psycopg_pool.PoolTimeout as e:
            raise self._no_connection() from e
        finally:
            if raw is not None:
                self._pool.putconn(raw)

    @staticmethod
    def _commit(raw: DeadlineConnection, conn: PostgresConn) -> None:
        """Send the COMMIT of ``conn``'s transaction, after the last fence of each hold
        it wrote under (:meth:`fence`): a hold that lapsed since the first, or was
        taken, makes the server skip the COMMIT (the write lands only while its hold
        does), and what is left of the transaction (the wait for the COMMIT) is
        bounded by the lease."""
        for agent_id, token in conn.holds:
            raw.execute(_HELD, (agent_id, token))
        raw.execute("COMMIT")

    def _no_connection(self) -> DatabaseUnavailableError:
        """What to raise when the pool had no connection to give in time: why, if a
        connection attempt of the pool's failed meanwhile."""
        failure = self._pool_class.last_failure  # type: ignore[attr-defined]
        if failure is not None:
            return unavailable(failure, self.url, self.location)
        reason = f"no connection within {self._connection_wait:g} s"
        return DatabaseUnavailableError(self.location, reason)

    def _checked_out(self, begin: str | None) -> DeadlineConnection:
        """A connection from the pool, checked, in a transaction ``begin`` started (if given).

        Each connection is checked before use (:func:`still_open`, no round trip):
        one that the server closed while the pool held it (a restart) is dropped
        for the next, until the call's wait for a connection is over. Here, not
        as the pool's ``check``: the pool sleeps a growing while after each
        failed check (1 s, 2 s, ...), which a restart would make seconds long. A
        session the server ends just after the check fails at ``BEGIN``, before
        anything of the block was sent: a new connection is taken, once. In an
        :meth:`unhurried` block the transaction has no server-side timeout.

        Raises:
            psycopg_pool.PoolTimeout: No connection within the call's wait.
        """
        deadline = time.monotonic() + self._connection_wait
        retried = False
        while True:
            raw = self._getconn(deadline)
            try:
                still_open(raw)
            except psycopg.OperationalError:
                raw.close()
                self._pool.putconn(raw)  # discarded
                continue
            if begin is None:
                return raw
            try:
                raw.execute(f"{begin}; {self.session_settings}" if self.pooled else begin)
                if is_unhurried():
                    raw.execute(self._unhurried_sql)
            except psycopg.OperationalError as error:
                ended = (raw.closed or raw.broken) and not isinstance(error, ServerSilent)
                self._pool.putconn(raw)  # discarded if lost
                if retried or not ended:
                    raise
                retried = True
                continue
            return raw

    def _getconn(self, deadline: float) -> DeadlineConnection:
        """A connection from the pool, waiting until ``deadline`` (``time.monotonic()``)
        at most, or a tick past the end :meth:`hurry` set (even if set meanwhile).

        Raises:
            psycopg_pool.PoolTimeout: None came in time.
        """
        while True:
            end = deadline
            left = self._hurry_left()
            if left is not None:
                end = min(end, time.monotonic() + max(left, _TICK))
            wait = end - time.monotonic()
            try:
                conn: DeadlineConnection = self._pool.getconn(
                    timeout=max(min(wait, _GETCONN_SLICE), 0.001)
                )
            except psycopg_pool.PoolTimeout:
                if time.monotonic() >= end:
                    raise
                continue
            return conn

    def _resolve(self, conn: PostgresConn, error: psycopg.Error) -> None:
        """Tell whether the COMMIT ``conn`` sent, then lost, landed: return if it did.

        A turn's commit carries an id of its own (:meth:`advance`): on a new
        connection, the session that sent it is ended (so that nothing of it is
        still on its way), and the version's row tells whether it committed.

        Raises:
            DatabaseUnavailableError: It did not land (nothing was written), or
                it was no turn's commit, which cannot be checked.
            CommitUnknownError: The check could not reach the server either.
        """
        reason = unavailable_reason(error, self.url)
        fence = conn.fence
        if fence is None:
            raise DatabaseUnavailableError(
                self.location,
                reason,
                outcome=(
                    "The connection broke while committing: the operation may have "
                    "committed; every earlier commit is intact"
                ),
                advice="Look before repeating it, once the server answers",
            ) from error
        agent_id, version, commit_id = fence
        try:
            landed = self._landed(agent_id, version, commit_id, conn.backend)
        except (DurableError, psycopg.Error) as check:
            log.warning(
                "the commit of version %d of %s is in doubt: %s; the check failed: %s",
                version,
                agent_id,
                reason,
                check,
            )
            raise CommitUnknownError(
                self.location, reason, agent_id=agent_id, version=version
            ) from error
        if landed:
            log.info(
                "the connection broke while committing version %d of %s (%s); "
                "a new connection found the commit done",
                version,
                agent_id,
                reason,
            )
            return
        raise DatabaseUnavailableError(
            self.location,
            reason,
            outcome=(
                f"The connection broke while committing version {version} of agent "
                f"{agent_id!r}, and a new connection found that it did not commit: "
                "nothing of it was written; every earlier commit is intact"
            ),
        ) from error

    def _landed(self, agent_id: str, version: int, commit_id: str, backend: int) -> bool:
        """Whether ``version`` of ``agent_id`` committed with ``commit_id``, asked on a
        new connection once the session ``backend`` (the one that sent it) is over.

        Through a pooler ``backend`` is the pooler's, not the server's, and the
        server session may serve another client by now: instead of ending it, the
        check waits until no session of this process is committing. The pooler
        may add to the name a session has on the server (PgBouncer's
        ``application_name_add_host``: ``<name> - <address>``), and the server
        cuts names at 63 bytes: a session is this process's if its name is ours,
        cut so, or ours followed by a space.
        """
        name = self._connect_kwargs["application_name"]
        with self.connect() as check:
            in_flight: tuple[str, tuple[Any, ...]]
            if self.pooled:
                in_flight = (
                    "SELECT 1 FROM pg_stat_activity"
                    " WHERE (application_name = left(%s, 63)"
                    " OR starts_with(application_name, %s || ' '))"
                    " AND pid <> pg_backend_pid() AND state = 'active' AND query = 'COMMIT'",
                    (name, name),
                )
            else:
                check.execute(
                    """
                    SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                     WHERE pid = %s AND pid <> pg_backend_pid() AND application_name = %s
                    """,
                    (backend, name),
                )
                in_flight = ("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (backend,))
            left = self._hurry_left()
            wait = self._connection_wait if left is None else min(self._connection_wait, left)
            deadline = time.monotonic() + wait
            while check.execute(*in_flight).fetchone():
                if time.monotonic() > deadline:
                    msg = f"the session that sent the commit (backend {backend}) did not end"
                    raise DurableError(msg)
                time.sleep(_POLL_SECONDS)
            row = check.execute(
                "SELECT commit_id FROM versions WHERE agent_id = %s AND version = %s",
                (agent_id, version),
            ).fetchone()
        return row is not None and row[0] == commit_id

    def _translated(self, error: psycopg.Error) -> BaseException:
        """What to raise for ``error`` of a statement: ours, or the error itself."""
        if isinstance(error, pg_errors.LockNotAvailable):
            return DatabaseBusyError(self.location, self.busy_timeout)
        if isinstance(error, pg_errors.ReadOnlySqlTransaction):
            msg = (
                f"{self.location} is open read-only (readonly=True); open Store(url) to change it"
            )
            return DurableError(msg)
        if isinstance(error, psycopg.OperationalError | pg_errors.IdleInTransactionSessionTimeout):
            # The session is over: the server, a pooler or a taker of an agent whose
            # hold lapsed (effectful_durable_take) ended it; nothing of the
            # transaction it was in committed.
            return unavailable(error, self.url, self.location)
        if error.sqlstate == _LAPSED:  # effectful_durable_held (schema.sql)
            agent_id = error.diag.message_primary or ""
            self._holds.lapsed(agent_id)
            return HoldLapsedError(agent_id, error.diag.message_detail or "")
        if error.sqlstate == _MOVED:  # effectful_durable_advance (schema.sql)
            # The message is the agent's id; the detail "moved to version N during ..."
            version = (error.diag.message_detail or "").split()[3:4] or ["0"]
            return AgentInUseError(error.diag.message_primary or "", moved_by(int(version[0])))
        return error

    def _commit_lock(self) -> str:
        """What a commit that timed out waiting for a lock waited for, in words, as
        far as the server's lock table (``pg_locks``) tells.

        A batch's statements go with its COMMIT, so that a lock a statement waited
        for looks like one the commit waited for. Blamed, in this order: the
        server's NOTIFY lock (pg_database's object 0, in no database: async.c,
        ``PreCommit_Notify``), held by any database's notifying commit until its
        commit record is flushed, if a session holds it or waits for it; else a
        lock on one of our tables that writers wait for (``SHARE`` and stronger:
        a ``LOCK TABLE``, a plain ``CREATE INDEX``), held by another session.
        """
        try:
            with self.connect() as conn:
                notify = conn.execute(_NOTIFY_LOCK_HOLDER).fetchone()
                table = None if notify is not None else conn.execute(_TABLE_LOCK).fetchone()
        except (DurableError, psycopg.Error):
            notify = table = None
        if notify is not None:
            pid, database, application, waiting, granted = notify
            what = (
                "the server's NOTIFY lock (one for the whole server, taken by a commit "
                "that notified)"
            )
            holder = f"backend {pid} of database {database!r}"
            if application:
                holder += f" ({application})"
            if waiting:
                holder += f", itself waiting for {waiting}"
            return f"{what}, {'held' if granted else 'waited for'} by {holder}"
        if table is not None:
            mode, relation, pid, application = table
            words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", str(mode).removesuffix("Lock")).upper()
            holder = f"backend {pid}" + (f" ({application!r})" if application else "")
            return f"a {words} lock on table {relation}, held by {holder}"
        return "a lock another session held (let go before the server's lock table named it)"

    def writing(self, *, batch: bool = False) -> Any:
        """``BEGIN`` ... ``COMMIT`` on a pooled connection, ``ROLLBACK`` if the block raises.

        A ``batch`` runs in pipeline mode: one round trip for the whole transaction,
        unless the block reads rows (each read waits for its statement's answer).
        """
        return self._transaction("BEGIN", batch=batch and _pipelines())

    def autocommit(self) -> Any:
        """A pooled connection whose statements each commit on their own."""
        return self._transaction(None)

    def reading(self) -> Any:
        """One read-only snapshot (repeatable read), or this thread's open block."""
        return self._transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")

    def _prepare(self) -> None:
        """Refuse a database that is not ours or is newer; create or migrate our tables.

        Each migration step commits on its own, with the version it reaches, under a
        lock that makes every other Store opening the database wait for it.
        """
        while True:
            with self.writing() as conn:
                conn.execute("SELECT pg_advisory_xact_lock(?)", (_key("schema", ""),))
                version = self._schema_version(conn)
                if version is None:
                    with self._permitted(conn, "create our tables in"):
                        conn.execute(schema_sql())
                    conn.execute(
                        "INSERT INTO effectful_durable VALUES (?, ?, ?)",
                        (APPLICATION_ID, SCHEMA_VERSION, time.time()),
                    )
                    return
                if version > SCHEMA_VERSION:
                    raise SchemaTooNewError(self.location, found=version, supported=SCHEMA_VERSION)
                if version == SCHEMA_VERSION:
                    return
                if self.readonly:
                    msg = (
                        f"{self.location} has schema {version}; open it read-write once "
                        f"(Store(url)) to migrate it to schema {SCHEMA_VERSION}"
                    )
                    raise DurableError(msg)
                with self._permitted(conn, f"migrate our tables to schema {version + 1} in"):
                    conn.execute(MIGRATIONS[version])
                conn.execute("UPDATE effectful_durable SET schema_version = ?", (version + 1,))

    @contextmanager
    def _permitted(self, conn: PostgresConn, what: str) -> Iterator[None]:
        """Turn the server's refusal of a schema change into advice that names the GRANT.

        PostgreSQL 15 no longer lets every role create tables in schema ``public``.
        """
        schema, role = conn.execute("SELECT current_schema(), current_user").fetchone()
        try:
            yield
        except pg_errors.InsufficientPrivilege as error:
            reason = (
                f"role {role!r} may not {what} schema {schema!r}: {error.diag.message_primary}"
            )
            advice = (
                f'Have the schema\'s owner run GRANT CREATE ON SCHEMA "{schema}" TO "{role}", '
                "or open the Store once as a role that may (the owner of the schema, or of "
                "our tables for a migration); later Stores need no more than reading and "
                "writing the tables"
            )
            raise DatabaseAccessError(
                self.location, reason, problem="not-permitted", advice=advice
            ) from error

    def _schema_version(self, conn: PostgresConn) -> int | None:
        """Our schema version in this database, or None if it is empty.

        Raises:
            NotOurDatabaseError: It holds another program's tables.
        """
        schema = conn.execute("SELECT current_schema()").fetchone()[0]
        if schema is None:
            reason = "its search_path names no schema to hold our tables"
            raise NotOurDatabaseError(self.location, reason)
        marker = conn.execute("SELECT to_regclass('effectful_durable')").fetchone()[0]
        if marker is None:
            tables = conn.execute(
                "SELECT count(*) FROM pg_tables WHERE schemaname = ?", (schema,)
            ).fetchone()[0]
            if tables:
                reason = f"its schema {schema!r} holds {tables} tables of another program"
                raise NotOurDatabaseError(self.location, reason)
            if self.readonly:
                msg = f"{self.location} is empty: it holds no effectful-durable database yet"
                raise DurableError(msg)
            return None
        row = conn.execute(
            "SELECT application_id, schema_version FROM effectful_durable"
        ).fetchone()
        if row is None or row[0] != APPLICATION_ID:
            reason = "its table effectful_durable does not name this library"
            raise NotOurDatabaseError(self.location, reason)
        return int(row[1])

    def _cache_name(self) -> str:
        """This database's directory in a workspace cache: its name and a digest of its identity.

        The identity is the cluster's system identifier (or, where the role may not
        read it, the server's host and port as this machine reaches it), the
        database's OID and our schema: a database restored or cloned into a new one
        gets its own directory, and so does each schema of one database. Whatever
        the name, a file is trusted only while the log holds the commit it is
        stamped with (store/workspace/cache.py).
        """
        with self.reading() as conn:
            oid, schema, name = conn.execute(
                "SELECT oid, current_schema(), datname FROM pg_database"
                " WHERE datname = current_database()"
            ).fetchone()
            conn.execute("SAVEPOINT identity")
            try:
                server = str(conn.execute("SELECT system_identifier FROM pg_control_system()").get)
            except psycopg.OperationalError:
                raise
            except psycopg.DatabaseError:  # not granted (or not there) on some services
                conn.execute("ROLLBACK TO SAVEPOINT identity")
                server = f"{conn.raw.info.host}:{conn.raw.info.port}"
        digest = hashlib.blake2b(f"{server}\0{oid}\0{schema}".encode(), digest_size=8).hexdigest()
        readable = re.sub(r"[^A-Za-z0-9_.-]", "_", str(name))[:40]
        return f"{readable}-{digest}"

    # -- the agents' holds -------------------------------------------------------

    @contextmanager
    def agent_lock(
        self, agent_id: str, *, wait: float, handoff: Sequence[Any] | None = None
    ) -> Iterator[list[Any] | None]:
        """Hold the agent against every other thread and process (a lease row:
        ``holds.py``); the ``handoff`` row is written in the same statement."""
        self._not_forked()  # the parent's holds came along, and none of its renewals
        rows = self._holds.acquire(agent_id, wait=wait, handoff=handoff)
        failed = True  # a first turn that failed, a rollback of an id never seen: no row
        try:
            yield rows
            failed = False
        finally:
            self._holds.release(agent_id, tidy=failed or agent_id in self._deleted)
            self._deleted.discard(agent_id)

    def fence(self, conn: Conn, agent_id: str) -> None:
        """Refuse this transaction's writes unless this Store's hold on ``agent_id``
        is still its own (nothing to check if it holds none).

        Raises:
            HoldLapsedError: The hold lapsed, or another process took the agent.
        """
        hold = self._holds.token(agent_id)
        if hold is not None:
            conn.execute("SELECT effectful_durable_held(?, ?)", (agent_id, hold))
            if isinstance(conn, PostgresConn):
                conn.holds.append((agent_id, hold))

    def agent_deleted(self, conn: Conn, agent_id: str) -> None:
        """``agent_id`` is deleted in ``conn``'s transaction, under this Store's hold:
        letting the hold go deletes its row too."""
        self._deleted.add(agent_id)

    def scrub(self, tables: Sequence[str]) -> bool:
        """Rewrite ``tables`` (``VACUUM FULL``, each locked meanwhile): the space of rows
        deleted is not overwritten otherwise, nor their words in a search index."""
        with unhurried(), self.connect() as conn:
            conn.prepare_threshold = None
            for table in tables:
                conn.execute(f"VACUUM FULL {table}")
        return True

    def prune_holds(self, conn: Conn) -> None:
        """Delete the lease rows of holds let go of agents that are gone."""
        conn.execute(
            """
            DELETE FROM agent_holds AS h WHERE h.token IS NULL
               AND NOT EXISTS (SELECT 1 FROM agents AS a WHERE a.agent_id = h.agent_id)
            """
        )

    def agent_version(self, conn: Conn, agent_id: str) -> int | None:
        """The agent's committed version, or None."""
        row = conn.execute("SELECT version FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
        return None if row is None else int(row[0])

    def latest_state(self, conn: Conn, agent_id: str) -> tuple[bool, str | None]:
        """Not kept: the caller finds the state from the versions (one indexed range)."""
        return False, None

    def insert(
        self, conn: Conn, table: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]
    ) -> None:
        """Insert ``rows`` (the values of ``columns``) into ``table``."""
        marks = ", ".join("?" * len(columns))
        conn.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks})", rows)

    def advance(
        self,
        conn: Conn,
        agent_id: str,
        base_version: int,
        version: int,
        *,
        state_in: int | None = None,
    ) -> None:
        """Move the agent's version, fenced by the agent's hold if this Store holds it,
        and by the version: a function of the schema raises, so that no answer needs
        reading before the commit (a batch stays one round trip). The hold is fenced
        again by the COMMIT itself (the schema's ``agents_fenced``, a check deferred
        to it).

        The commit gets an id of its own, kept in its versions' rows
        (``versions.commit_id``): if the connection breaks while committing, a
        new connection tells whether it landed (:meth:`_resolve`).
        """
        commit_id = secrets.token_hex(8)
        hold = self._holds.token(agent_id)
        if hold is not None and isinstance(conn, PostgresConn) and conn.pipeline is None:
            # A write of several round trips: its first fence bounds it (the
            # advance's own fence does not, a pipeline being in the server's hands).
            self.fence(conn, agent_id)
        conn.execute(
            "SELECT effectful_durable_advance(?, ?, ?, ?, ?, ?)",
            (agent_id, base_version, version, time.time(), commit_id, hold),
        )
        if isinstance(conn, PostgresConn):
            conn.fence = (agent_id, version, commit_id)

    # -- what differs from SQLite --------------------------------------------------

    def require(self, feature: str) -> None:
        """Refuse the parts not carried on PostgreSQL yet."""
        if feature.startswith(_UNSUPPORTED_PREFIXES):
            raise NotSupportedError(feature, "PostgreSQL")

    def check_writes(self, writes: Sequence[TurnWrite]) -> None:
        """Refuse a turn's write of a part not carried on PostgreSQL yet."""
        for write in writes:
            for kind, feature in _UNSUPPORTED_WRITES:
                if isinstance(write, kind):
                    raise NotSupportedError(feature, "PostgreSQL")

    def serialize(self, conn: Conn, scope: str, key: str) -> None:
        # Read committed lets two writers read the same max(number): one waits here.
        conn.execute("SELECT pg_advisory_xact_lock(?)", (_key(scope, key),))

    def watch_commits(self, wake: Callable[[], None]) -> MarkerWatch:
        """Poll the server's statistics of our tables in a thread of its own, one
        statement a look (``table_stats.py``, engine/watch.py): a commit to another
        database of the server wakes nobody. No LISTEN: a notifying commit locks
        the whole server (schema.py, schema 10), and a pooler in transaction mode
        would not deliver it.
        """
        return MarkerWatch(TableStatsMarker(self).read, wake, location=self.location)

    def select_for_claim(self, conn: Conn, query: str, params: Sequence[Any]) -> Rows:
        # Runners on many machines claim at once: each skips the rows the others
        # are claiming instead of queueing behind them (and, under read committed,
        # claiming the same row again once they commit).
        return conn.execute(f"{query} FOR UPDATE SKIP LOCKED", params)

    def index_compacted(
        self,
        conn: Conn,
        agent_id: str,
        version: int,
        first_position: float,
        last_position: float,
        conversation: str,
    ) -> None:
        # The text of the originals, for RecallTools: text blocks, plain content and
        # tool-call arguments, as the SQLite backend indexes them. Read here rather
        # than with jsonb, which cannot hold the NUL or lone surrogate a message may.
        rows = conn.execute(
            """
            SELECT position, body FROM messages
             WHERE agent_id = ?1 AND conversation = ?5 AND removed_in = ?2
               AND position BETWEEN ?3 AND ?4
            """,
            (agent_id, version, first_position, last_position, conversation),
        ).fetchall()
        conn.executemany(
            "INSERT INTO compacted_text (agent_id, position, version, text, words)"
            " VALUES (?1, ?2, ?3, ?4, to_tsvector('english', ?4))",
            [(agent_id, position, version, _searchable(body)) for position, body in rows],
        )

    def check_rows(self, conn: Conn, table: str, where: str, params: Sequence[Any]) -> None:
        """Nothing to do: the server checks its own pages."""

    def active_messages(
        self, conn: Conn, agent_id: str, conversation: str
    ) -> Iterable[tuple[float, str]]:
        rows: Iterable[tuple[float, str]] = conn.execute(
            """
            SELECT position, body FROM messages
             WHERE agent_id = ? AND conversation = ? AND removed_in IS NULL
             ORDER BY position
            """,
            (agent_id, conversation),
        )
        return rows

    def search_compacted(
        self, conn: Conn, agent_id: str, words: list[str], limit: int, conversation: str
    ) -> list[str]:
        # Every word must occur: the words' queries ANDed, each word taken as text.
        query = " && ".join(["plainto_tsquery('english', ?)"] * len(words))
        rows = conn.execute(
            f"""
            SELECT m.body FROM compacted_text AS t
              JOIN messages AS m
                ON m.agent_id = t.agent_id AND m.position = t.position
               AND m.removed_in = t.version,
                   (SELECT {query} AS q) AS query
             WHERE t.agent_id = ? AND m.conversation = ? AND t.words @@ query.q
               AND numnode(query.q) > 0
             ORDER BY ts_rank(t.words, query.q) DESC, t.version, t.position LIMIT ?
            """,
            (*words, agent_id, conversation, limit),
        ).fetchall()
        return [str(body) for (body,) in rows]

    def columns(self, conn: Conn) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for table, column in conn.execute(
            """
            SELECT table_name, column_name FROM information_schema.columns
             WHERE table_schema = current_schema() ORDER BY table_name, ordinal_position
            """
        ):
            found.setdefault(str(table), []).append(str(column))
        return found

    def check(self) -> dict[str, Any]:
        """The schema version and row counts ("integrity" is "ok" when they read)."""
        with unhurried(), self.reading() as conn:  # counting a large table takes its time
            facts: dict[str, Any] = {
                "integrity": "ok",
                "schema": conn.execute("SELECT schema_version FROM effectful_durable").get,
            }
            for table in (
                "agents",
                "conversations",
                "versions",
                "messages",
                "workflow_steps",
                "memory",
            ):
                facts[table] = conn.execute(f"SELECT count(*) FROM {table}").get
            facts["bytes"] = conn.execute("SELECT pg_database_size(current_database())").get
        return facts


class PostgresConn:
    """A pooled psycopg connection in one of the Store's transactions, as a Conn."""

    in_transaction = True

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        #: The block's pipeline, in a batch (``writing(batch=True)``).
        self.pipeline: psycopg.Pipeline | None = None
        #: The server process of the session, to end it if its COMMIT is in doubt.
        self.backend: int = raw.info.backend_pid
        #: The turn this transaction commits, if it advanced an agent:
        #: ``(agent_id, version, commit_id)`` (PostgresDatabase.advance).
        self.fence: tuple[str, int, str] | None = None
        #: The holds ``(agent_id, token)`` this transaction writes under, fenced at
        #: its start (:meth:`PostgresDatabase.fence`) and again with its COMMIT
        #: (:meth:`PostgresDatabase._commit`); a turn's commit is fenced in its
        #: COMMIT by the schema (:meth:`PostgresDatabase.advance`).
        self.holds: list[tuple[str, str]] = []
        #: Outside a transaction through a pooler: the statement that gives each
        #: statement our sessions' settings (``session_settings``), sent before it in
        #: one pipeline, so that both run in one implicit transaction.
        self.settings: str | None = None
        self._last: psycopg.Cursor[Any] | None = None

    def execute(self, statements: str, bindings: Any = None, /) -> PostgresRows:
        """Run one statement written with ``?``/``?N`` parameters."""
        query, numbered = _rewritten(statements)
        with self._settled():
            cursor = self.raw.execute(query, _params(bindings, numbered))
        self._last = cursor
        return PostgresRows(cursor, self.pipeline)

    def executemany(self, statements: str, sequenceofbindings: Iterable[Any], /) -> None:
        """Run one statement for each set of parameters (pipelined by psycopg)."""
        query, numbered = _rewritten(statements)
        params = [_params(bindings, numbered) for bindings in sequenceofbindings]
        if not params:
            return
        cursor = self.raw.cursor()
        with self._settled():
            cursor.executemany(query, params)
        self._last = cursor

    @contextmanager
    def _settled(self) -> Iterator[None]:
        """The block's statements after :attr:`settings`, in one round trip (if set)."""
        if self.settings is None:
            yield
            return
        with self.raw.pipeline():  # its end sends one Sync and waits for every answer
            self.raw.execute(self.settings)
            yield

    def changes(self) -> int:
        """Rows changed by the last INSERT, UPDATE or DELETE (in a batch, this waits
        for the answers so far)."""
        if self._last is None:
            return 0
        _answered(self._last, self.pipeline)
        return max(self._last.rowcount, 0)


class PostgresRows:
    """A psycopg cursor's rows, read as apsw's Cursor is."""

    def __init__(self, cursor: psycopg.Cursor[Any], pipeline: psycopg.Pipeline | None) -> None:
        self._cursor = cursor
        self._pipeline = pipeline

    def fetchone(self) -> Any:
        _answered(self._cursor, self._pipeline)
        return self._cursor.fetchone() if self._cursor.description else None

    def fetchall(self) -> list[Any]:
        _answered(self._cursor, self._pipeline)
        return self._cursor.fetchall() if self._cursor.description else []

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    @property
    def get(self) -> Any:
        rows = self.fetchall()
        if not rows:
            return None
        if len(rows) == 1:
            return rows[0][0] if len(rows[0]) == 1 else rows[0]
        return rows


def _answered(cursor: psycopg.Cursor[Any], pipeline: psycopg.Pipeline | None) -> None:
    """Wait for the answer to ``cursor``'s statement, if it was sent in ``pipeline``."""
    if pipeline is not None and cursor.pgresult is None:
        pipeline.sync()


@functools.cache
def _pipelines() -> bool:
    """Whether psycopg's libpq has pipeline mode (14 or newer); without it a batch is
    sent statement by statement, as any other transaction."""
    return psycopg.Pipeline.is_supported()


def _waited_at_commit(error: BaseException) -> bool:
    """Whether ``error`` is a lock wait that COMMIT itself timed out in: a statement's
    lock wait names the statement or the row in its context, a commit's names none."""
    return isinstance(error, pg_errors.LockNotAvailable) and not error.diag.context


_NUMBERED = re.compile(r"\?(\d+)")
# The shared SQL reads rows through SQLite's checked_<table> views (sqlite/row_checks.py);
# PostgreSQL checks its own pages, so here they are the tables themselves.
_CHECKED = re.compile(r"\bchecked_(?=\w)")


@functools.lru_cache(maxsize=512)
def _rewritten(sql: str) -> tuple[str, bool]:
    """``sql`` with ``?N`` as ``%(N)s`` (numbered) or ``?`` as ``%s``, ``%`` escaped, and
    the ``checked_`` views as their tables."""
    sql = _CHECKED.sub("", sql.replace("%", "%%"))
    if _NUMBERED.search(sql):
        return _NUMBERED.sub(r"%(\1)s", sql), True
    return sql.replace("?", "%s"), False


def _params(bindings: Any, numbered: bool) -> Any:
    if bindings is None:
        return None
    if numbered:
        return {str(i): value for i, value in enumerate(bindings, 1)}
    return tuple(bindings)


def _searchable(body: str) -> str:
    """A message's words for full-text search, as text PostgreSQL can hold."""
    message = json.loads(body)
    content = message.get("content")
    if isinstance(content, list):
        content = " ".join(
            block["text"]
            for block in content
            if isinstance(block, dict) and isinstance(block.get("text"), str)
        )
    parts = [content if isinstance(content, str) else ""]
    if message.get("tool_calls") is not None:
        parts.append(json.dumps(message["tool_calls"], ensure_ascii=False))
    text = " ".join(part for part in parts if part).replace("\0", " ")
    return text.encode("utf-8", "replace").decode("utf-8")  # a lone surrogate becomes "?"


def user_cache_root() -> str:
    """Where a PostgreSQL Store keeps workspace files unless told: the user's cache directory.

    ``$XDG_CACHE_HOME/effectful-durable/workspaces``, or ``~/.cache/...`` when
    ``XDG_CACHE_HOME`` is unset or not absolute (as the XDG base directory spec says).
    """
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):
        base = os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "effectful-durable", "workspaces")


def _key(scope: str, name: str) -> int:
    """A signed 64-bit advisory-lock key for ``name`` in ``scope``."""
    digest = hashlib.blake2b(f"effectful-durable {scope}\0{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, signed=True)
