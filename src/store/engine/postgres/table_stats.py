"""What tells a reader of a PostgreSQL database that our tables changed: the marker the
page's watch polls (``engine/watch.py``), one statement a look, no table read.

The marker is the server's cumulative statistics of our tables: the rows each
one had inserted, updated and deleted (``pg_stat_get_tuples_inserted`` and its
siblings), summed. They count this database's tables only, so a commit to
another database of the server moves nothing; reading them is a lookup in the
server's shared memory per table, about 0.02 ms of the server's time a look
(0.002 ms for the WAL position alone: bench/bench_watch.py); nothing is
written, locked or sent by a commit for it, and no privilege is needed. The
renewals of the agents' holds (``agent_holds``) are left out: a page shows none.

A session publishes its statistics when it goes idle, at most once a second
(PostgreSQL 15: ``PGSTAT_MIN_INTERVAL``); a commit that follows its session's
last report by less than that is published later, within 10 s of it
(``PGSTAT_IDLE_INTERVAL``), or when the session next goes idle. So the WAL
position is read too, where the server lets us (managed servers may refuse
``pg_current_wal_insert_lsn()``): for :data:`PENDING` seconds after our
tables' statistics moved (a commit whose successor may be pending), every move
of the WAL counts as ours. Without it, such a commit is heard of late, never
lost; a commit to another database wakes the page only inside that window.

Where the statistics cannot tell (``track_counts`` off, or a standby, whose
replay counts nothing), the WAL position alone is the marker, and every
database's commits move it. Where neither can be read, the watch ends with
:class:`~effectful_durable.store.engine.watch.Unwatchable`: the page then
updates when reloaded.
"""

from __future__ import annotations

import functools
import logging
import re
import time
from contextlib import AbstractContextManager
from typing import Any, Protocol

import psycopg

from ..watch import Unwatchable
from .opening import first_line
from .schema import schema_sql

#: Seconds after our tables' statistics moved during which a move of the WAL position
#: counts as ours: a session's commit within a second of its last report is
#: published late (the statistics' minimum interval, 1 s, and a poll's 0.2 s).
PENDING = 1.5

# The tables left out of the marker: renewals of the agents' holds, every few
# seconds per process holding one, change nothing a page shows.
_UNSEEN = frozenset({"agent_holds"})

_WAL = (
    "CASE WHEN pg_is_in_recovery() THEN pg_last_wal_replay_lsn()"
    " ELSE pg_current_wal_insert_lsn() END"
)
# Our tables in the Store's schema, whether each is the runners' reports, and whether
# the statistics can tell of their changes here.
_TABLES = """
    SELECT c.oid, c.relname = 'runner_status'
      FROM pg_class AS c
     WHERE c.relnamespace = current_schema()::regnamespace AND c.relname = ANY(?)
       AND c.relkind IN ('r', 'p')
"""
_COUNTING = "SELECT current_setting('track_counts')::boolean AND NOT pg_is_in_recovery()"
# The rows our tables had changed (all but the runners' reports; the runners'
# reports), and the WAL position where asked ({wal}: an expression, or NULL).
_POLL = """
    SELECT coalesce(sum(s.n) FILTER (WHERE NOT t.runners), 0),
           coalesce(sum(s.n) FILTER (WHERE t.runners), 0),
           {wal}
      FROM unnest(?::oid[], ?::boolean[]) AS t (relid, runners),
           LATERAL (SELECT pg_stat_get_tuples_inserted(t.relid)
                           + pg_stat_get_tuples_updated(t.relid)
                           + pg_stat_get_tuples_deleted(t.relid) AS n) AS s
"""

log = logging.getLogger("effectful_durable.store")


class _Database(Protocol):
    """What the marker needs of its Store's PostgresDatabase."""

    location: str

    def autocommit(self) -> AbstractContextManager[Any]: ...


@functools.cache
def watched_tables() -> tuple[str, ...]:
    """The names of our tables whose changes a page may show (from ``schema.sql``)."""
    names = re.findall(r"^CREATE TABLE (\w+)", schema_sql(), flags=re.MULTILINE)
    return tuple(name for name in names if name not in _UNSEEN)


class TableStatsMarker:
    """A counter that moves when our tables changed, read by polling (``read()``).

    Args:
        db: The Store's database; each read is one statement outside a transaction.
    """

    def __init__(self, db: _Database) -> None:
        self._db = db
        self._tables: tuple[list[int], list[bool]] | None = None
        self._counting = True  # whether the statistics tell of our changes
        self._wal = True  # whether the server lets us read the WAL position
        self._seen: tuple[Any, Any, Any] | None = None
        self._window_ends = 0.0  # time.monotonic() up to which a WAL move counts
        self._moves = 0

    def read(self) -> int:
        """The marker: how many changes of ours were seen (the first read: 0).

        Raises:
            Unwatchable: Neither the statistics nor the WAL position can tell.
            DurableError: The database failed (the watch tries again).
        """
        data, runners, wal = self._poll()
        if self._seen is not None:
            seen_data, seen_runners, seen_wal = self._seen
            now = time.monotonic()
            if data != seen_data:
                self._moves += 1
                self._window_ends = now + PENDING
            elif runners != seen_runners:
                self._moves += 1
            elif wal != seen_wal and (not self._counting or now < self._window_ends):
                self._moves += 1
        self._seen = (data, runners, wal)
        return self._moves

    def _poll(self) -> tuple[Any, Any, Any]:
        """One look: our changes and the WAL position (None where not read)."""
        if self._tables is None:
            self._tables, self._counting = self._setup()
        if not (self._counting or self._wal):
            reason = "its statistics count no change here and the WAL position is refused"
            raise Unwatchable(reason)
        sql = _POLL.format(wal=_WAL if self._wal else "NULL")
        try:
            with self._db.autocommit() as conn:
                row = conn.execute(sql, self._tables).fetchone()
        except psycopg.Error as error:  # the server answered: a refusal, not an outage
            if not self._wal:
                raise Unwatchable(first_line(str(error))) from error
            self._wal = False
            how = "its tables' statistics" if self._counting else "nothing"
            log.info(
                "%s refuses the WAL position (%s): commits are watched through %s",
                self._db.location,
                first_line(str(error)),
                how,
            )
            return self._poll()
        data, runners, wal = row
        if not self._counting:
            data = runners = 0
        return data, runners, wal

    def _setup(self) -> tuple[tuple[list[int], list[bool]], bool]:
        """Our tables' OIDs and which is the runners' reports; whether the statistics
        count our changes here (``track_counts`` on, not a standby)."""
        with self._db.autocommit() as conn:
            rows = conn.execute(_TABLES, (list(watched_tables()),)).fetchall()
            counting = bool(conn.execute(_COUNTING).fetchone()[0])
        if not counting:
            log.info(
                "%s keeps no statistics of its tables' changes (track_counts is off, or "
                "it is a standby): the WAL position tells of commits, every database's",
                self._db.location,
            )
        return ([int(oid) for oid, _ in rows], [bool(runners) for _, runners in rows]), counting
