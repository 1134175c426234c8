"""The runners' side of alarms: claims, heartbeats, failures, rescue, status reports.

A runner claims the earliest due alarm (its id, a random fencing token, and a
lease: an expiry); the turn that delivers the alarm commits only while the
token is still the alarm's (``parts/alarms.py``'s ``AlarmWrite``). A failed
delivery is retried later, or the alarm is dead. A claim is its runner's while
the runner lives: each runner beats (:meth:`AlarmQueue.beat`, every
:data:`HEARTBEAT_EVERY` seconds, one write whatever it holds) in its status
row, and a claim whose runner beat within :data:`DEAD_AFTER` seconds is never
claimed again, however old its lease. A runner whose heartbeat is older is
dead, on any machine: :meth:`AlarmQueue.rescue` gives its claims back (and those of a
runner process surely gone, at once: one whose pid ended in this process's own
kernel and PID namespace, ``engine/process.py``; a host name and a pid name no
process across containers or machines). A claimer that keeps no
status row (a program of its own on the queue) holds its claim for its lease.
None of this is versioned: it belongs to the runners, not to the agents (see
``parts/alarms.py``). A Store hands out its :class:`AlarmQueue` as
``store.alarm_queue``, which the runner and the command line use; the Claim it
makes is the alarms part's.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import time
from collections.abc import Collection
from typing import Any, Literal

from .engine.process import gone, place
from .engine.seam import Conn, Database
from .engine.sqlite.damage import DamageWatch, watched
from .parts.alarms import AlarmStatus, Claim, Schedule, current_version, opened_action
from .rows import legible, trace_in, utc
from .sealing import PLAIN, Sealer

#: Seconds between two heartbeats of a runner: one write, whatever it holds.
HEARTBEAT_EVERY = 5.0
#: A runner whose last heartbeat is older than this, in seconds, is dead: three
#: heartbeats missed. Its claims move to another runner within about
#: ``DEAD_AFTER`` + 2 s of its death (the rescuers look every 2 s), leaving a
#: turn half a minute's promise (DESIGN.md, 11) most of the rest.
DEAD_AFTER = 15.0


def runner_id() -> str:
    """A new runner's id: host, pid and a random suffix."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _alive_owner(db: Database) -> str:
    """SQL: the claim of alarm ``a`` is held by a runner whose heartbeat is fresh."""
    return f"""EXISTS (SELECT 1 FROM runner_status AS r
                        WHERE r.runner_id = a.lease_owner AND r.state = 'running'
                          AND r.reported_at >= {db.now_sql} - {DEAD_AFTER!r})"""


def _claimable(db: Database) -> str:
    """SQL: alarm ``a`` is not held: unleased, or its lease ran out and its runner is dead
    (a fresh heartbeat holds a claim however old its lease)."""
    return f"(a.lease_owner IS NULL OR NOT {_alive_owner(db)})"


def _not_busy(busy: Collection[str]) -> str:
    return f" AND agent_id NOT IN ({', '.join('?' * len(busy))})" if busy else ""


# Another pending alarm (``o``) of the agent of alarm ``a``; one that is leased (its
# lease running or run out: an agent has one at most), or goes before ``a`` (unless
# ``a`` is the leased one: its lease moved its due time, not its place): a resumption
# goes before every alarm and event (it ends a turn already begun, which they wait
# for), and otherwise the one due first.
_OTHER = """SELECT 1 FROM alarms AS o
             WHERE o.agent_id = a.agent_id AND o.ended_in IS NULL AND o.status = 'pending'
               AND o.alarm_id <> a.alarm_id"""
_LEASED = "o.lease_owner IS NOT NULL"
_EARLIER = """(a.lease_owner IS NULL AND CASE WHEN (o.kind = 'resume') = (a.kind = 'resume')
                                          THEN o.due_at < a.due_at
                                          ELSE o.kind = 'resume' END)"""


def _takeable(db: Database, busy: Collection[str]) -> str:
    """SQL: alarm ``a`` is one :meth:`AlarmQueue.claim` takes once it is due, and
    :meth:`AlarmQueue.next_due` looks for (one ``?`` per agent in ``busy``)."""
    return (
        f"status = 'pending'{_not_busy(busy)} AND {_claimable(db)}"
        f" AND ({_OTHER} AND ({_LEASED} OR {_EARLIER}) LIMIT 1) IS NULL"
    )


def _dead_owners(db: Database, conn: Conn, me: str, *, heartbeats: bool) -> list[tuple[str, bool]]:
    """The runners holding claims that are dead, each with whether its process is
    surely gone (its pid's place is this process's, and no process has that pid:
    ``engine/process.py``), else it stopped, or was silent ``DEAD_AFTER`` seconds,
    on any host (only if ``heartbeats``).

    One read of the claims (``alarms_leased``: as many as turns in flight) and
    their runners' status rows. A claimer without a status row is left to its
    lease; ``me`` is never dead. A runner under this host name but in another
    PID namespace or on another machine is judged by its heartbeat alone.
    """
    rows: list[tuple[Any, ...]] = conn.execute(
        f"""
        SELECT DISTINCT a.lease_owner, r.state, r.place, r.pid,
               CASE WHEN r.reported_at < {db.now_sql} - {DEAD_AFTER!r} THEN 1 ELSE 0 END
          FROM alarms AS a JOIN runner_status AS r ON r.runner_id = a.lease_owner
         WHERE a.lease_owner IS NOT NULL AND a.status = 'pending'
        """
    ).fetchall()
    dead: list[tuple[str, bool]] = []
    for owner, state, their_place, pid, silent in rows:
        owner = str(owner)
        if owner == me:
            continue
        if gone(their_place, int(pid)):
            dead.append((owner, True))
        elif heartbeats and (state == "stopped" or silent):
            dead.append((owner, False))
    return dead


def _give_back(db: Database, conn: Conn, owner: str, now: float, *, gone: bool) -> int:
    """Give back the claims of the dead runner ``owner``; how many.

    Each is due again at once, or at its own time if that was earlier, so that
    its agent's alarms keep their order; no attempt is counted. Unless the
    process is known ``gone`` (its pid ended in this process's place), the
    runner's heartbeat is checked again here, so that one that beat meanwhile
    keeps its claims.
    """
    alive = "" if gone else f" AND NOT {_alive_owner(db)}"
    conn.execute(
        f"""
        UPDATE alarms AS a SET lease_owner = NULL, lease_token = NULL,
               due_at = CASE WHEN fire_at < ?2 THEN fire_at ELSE ?2 END, updated_at = ?3
         WHERE lease_owner = ?1 AND status = 'pending'{alive}
        """,
        (owner, now, time.time()),
    )
    return conn.changes()


#: Status reports kept, however old: the most recent ones, of runners alive or gone.
KEEP_REPORTS = 10
#: Seconds a report is kept however many there are (a day): what an operator looking
#: back at yesterday's fleet needs to see.
KEEP_REPORTS_FOR = 86_400.0


def statuses(conn: Conn) -> list[dict[str, Any]]:
    """Every runner's latest status report, most recent first."""
    rows: list[tuple[Any, ...]] = conn.execute(
        """
        SELECT runner_id, host, pid, state, started_at, reported_at, report
          FROM checked_runner_status ORDER BY reported_at DESC
        """
    ).fetchall()
    return [
        {
            "runner": runner,
            "host": host,
            "pid": pid,
            "state": state,
            "started_at": utc(started),
            "reported_at": utc(reported),
            **json.loads(report),
        }
        for runner, host, pid, state, started, reported, report in rows
    ]


@watched(lambda queue: queue._damage, name="Store.alarm_queue")
class AlarmQueue:
    """The runners' side of the alarms of one Store (``store.alarm_queue``): claim,
    fail, release, rescue, report.

    Alarms, events and the resumptions of decided turns wait here as rows of one
    queue; :class:`~effectful_durable.AgentRunner` claims them and delivers each
    one as a turn of its agent. A claimer of your own takes the earliest due row
    with :meth:`claim` and ends it as the runner does: the turn that delivers it
    commits it (the claim's token fences that commit), or ``fail(claim, error,
    retry_at)`` records a failed delivery (due again at ``retry_at``; dead when it
    is None), :meth:`release` gives it back, :meth:`finish` ends a row that needs
    no turn. A claimer that keeps no status row (:meth:`record_status`,
    :meth:`beat`) holds its claim for its lease. Each method is one short
    transaction on the calling thread's connection.

    Example::

        claim = store.alarm_queue.claim("my-claimer", time.time(), lease=60.0)
        if claim is not None:
            store.alarm_queue.release(claim, due_at=time.time() + 30)

    .. versionadded:: 0.2.0
    """

    def __init__(self, db: Database, damage: DamageWatch, sealer: Sealer = PLAIN) -> None:
        self._db = db
        self._damage = damage
        self._sealer = sealer

    def next_due(self, busy: Collection[str] = ()) -> float | None:
        """When the earliest pending alarm of an agent not in ``busy`` becomes claimable.

        What :meth:`claim` would take, but for the time: an alarm waits while another
        alarm of its agent is leased, or goes before it (a resumption goes before its
        agent's alarms and events, whenever it is due); a leased one's lease, when it
        runs out, is the time it may be claimed again, unless its runner's heartbeat
        still holds it (then it counts not at all). So a runner never finds due what
        a claim would not take, and tries no claim, a write, in vain.
        One indexed read (the agents a runner is running turns of are few): the
        pending alarms in due order, until the first claimable one. Not ``min(due_at)``:
        PostgreSQL answers that by joining every pending alarm with every leased one
        (no index order through the ``NOT EXISTS``), 5 to 140 ms a look with
        thousands pending and 32 turns in flight, where this takes under 1 ms
        (bench/README.md, ``bench_runners.py``); SQLite plans both alike. The other
        alarms of a candidate's agent are a scalar subquery, as in :meth:`claim`
        (``NOT EXISTS`` would be an anti-join reading every pending alarm per look).
        """
        with self._db.reading() as conn:
            due = conn.execute(
                f"""
                SELECT due_at FROM alarms AS a WHERE {_takeable(self._db, busy)}
                 ORDER BY due_at LIMIT 1
                """,
                tuple(busy),
            ).get
            return None if due is None else float(due)

    def claim(
        self, owner: str, now: float, lease: float, busy: Collection[str] = ()
    ) -> Claim | None:
        """Lease the earliest claimable alarm to ``owner`` until ``now + lease``, or None.

        A leased alarm is claimable again once its lease ran out and its runner's
        heartbeat is stale or missing: a runner that beats keeps its claims however
        long its turns (a runner that died is rescued sooner: :meth:`rescue`).
        One agent's alarms go one at a time, in the order they are due, whichever
        runners deliver them: an alarm is claimable only while no other alarm of its
        agent is leased (a lease that ran out holds the rest back too: its alarm goes
        first again), and none of them is due earlier (one that another runner is
        claiming at this moment is not yet seen as leased). Alarms
        of the agents in ``busy`` (whose turns the runner is running) are left for
        later too, and an agent with many due alarms takes one of the runner's turns
        at a time.
        The lease moves the alarm's ``due_at`` to its end, so a lease that runs out
        makes the alarm claimable again through the same index. An alarm another
        runner is claiming at this moment is skipped, never waited for
        (``Database.select_for_claim``).

        The check of the agent's other alarms is a scalar subquery, not ``NOT EXISTS``:
        PostgreSQL turns ``NOT EXISTS`` into an anti-join, and once done rows outnumber
        pending ones its statistics make it read every pending alarm of every agent per
        claim (a materialized scan of ``alarms_due``); a scalar subquery is looked up
        per candidate, through ``alarms_agent``, as SQLite does either way
        (bench/README.md, ``bench_claims.py``).
        """
        with self._db.writing() as conn:
            row: tuple[Any, ...] | None = self._db.select_for_claim(
                conn,
                f"""
                SELECT alarm_id, agent_id, action, fire_at, every, cron, timezone, attempts,
                       kind, topic, due_at
                  FROM checked_alarms AS a
                 WHERE due_at <= ? AND {_takeable(self._db, busy)}
                 ORDER BY due_at LIMIT 1
                """,
                (now, *busy),
            ).fetchone()
            if row is None:
                return None
            alarm_id, agent_id, action, *when, attempts, kind, topic, due_at = row
            token = secrets.token_hex(8)
            until = now + lease
            # The open row of its id, found through ``alarms_open``, whose size is the work
            # pending, not the primary key's, which grows with the work done.
            conn.execute(
                """
                UPDATE alarms SET lease_owner = ?2, lease_token = ?3, due_at = ?4, updated_at = ?5
                 WHERE alarm_id = ?1 AND ended_in IS NULL
                """,
                (alarm_id, owner, token, until, time.time()),
            )
            schedule = Schedule(*when)  # fire_at, every, cron, timezone
            action = opened_action(self._sealer, agent_id, alarm_id, kind, action)
            return Claim(
                alarm_id, agent_id, action, schedule, attempts, token, until, kind, topic, due_at
            )

    def release(self, claim: Claim, due_at: float) -> bool:
        """Give a claim back without counting an attempt; due again at ``due_at``."""
        with self._db.writing() as conn:
            conn.execute(
                """
                UPDATE alarms SET lease_owner = NULL, lease_token = NULL, due_at = ?3,
                       updated_at = ?4
                 WHERE alarm_id = ?1 AND lease_token = ?2 AND status = 'pending'
                """,
                (claim.alarm_id, claim.token, due_at, time.time()),
            )
            return bool(conn.changes())

    def release_own(self, owner: str, now: float, keep: Collection[str] = ()) -> int:
        """Give back every lease of ``owner`` but those of the alarms in ``keep``; how many.

        For a runner that cannot tell whether a claim of its own committed (the
        connection broke while committing it): the alarm is due again at once, at its
        scheduled time if that was earlier, without counting an attempt.
        """
        with self._db.writing() as conn:
            kept = ", ".join(f"?{n}" for n in range(4, 4 + len(keep)))
            others = f" AND alarm_id NOT IN ({kept})" if keep else ""
            conn.execute(
                f"""
                UPDATE alarms SET lease_owner = NULL, lease_token = NULL,
                       due_at = CASE WHEN fire_at < ?2 THEN fire_at ELSE ?2 END, updated_at = ?3
                 WHERE lease_owner = ?1 AND status = 'pending'{others}
                """,
                (owner, now, time.time(), *keep),
            )
            return conn.changes()

    def finish(self, claim: Claim) -> bool:
        """End a claimed row that needs no turn (a resumption someone else already made)."""
        with self._db.writing() as conn:
            conn.execute(
                """
                UPDATE alarms SET status = 'done', lease_owner = NULL, lease_token = NULL,
                       ended_in = CASE WHEN created_in > ?3 THEN created_in ELSE ?3 END,
                       updated_at = ?4
                 WHERE alarm_id = ?1 AND lease_token = ?2 AND status = 'pending'
                """,
                (claim.alarm_id, claim.token, current_version(conn, claim.agent_id), time.time()),
            )
            return bool(conn.changes())

    def fail(self, claim: Claim, error: str, retry_at: float | None) -> AlarmStatus | None:
        """Record a failed delivery: retry at ``retry_at``, or dead when it is None.

        Returns:
            The alarm's new status, or None if the lease was lost meanwhile.
        """
        with self._db.writing() as conn:
            status: AlarmStatus = "pending" if retry_at is not None else "dead"
            told = legible(error[:2000])
            conn.execute(
                """
                UPDATE alarms SET status = ?3, attempts = attempts + 1, last_error = ?4,
                       due_at = coalesce(?5, due_at), lease_owner = NULL, lease_token = NULL,
                       updated_at = ?6
                 WHERE alarm_id = ?1 AND lease_token = ?2 AND status = 'pending'
                """,
                (claim.alarm_id, claim.token, status, told, retry_at, time.time()),
            )
            return status if conn.changes() else None

    def scheduled_by(self, claim: Claim) -> str | None:
        """The ``traceparent`` of the turn that scheduled the claimed alarm, if it was traced.

        A traced turn keeps its trace context in its version's detail (``"trace"``);
        the alarm's row names that version (``created_in``).
        """
        with self._db.reading() as conn:
            row = conn.execute(
                """
                SELECT v.detail, v.state IS NOT NULL
                  FROM alarms a JOIN checked_versions v
                    ON v.agent_id = a.agent_id AND v.version = a.created_in
                 WHERE a.alarm_id = ? AND a.agent_id = ? AND a.status = 'pending'
                 ORDER BY a.created_in DESC LIMIT 1
                """,
                (claim.alarm_id, claim.agent_id),
            ).fetchone()
        return trace_in(row[0]) if row else None

    def rescue(self, me: str, now: float, *, heartbeats: bool = True) -> dict[str, int]:
        """Give back the claims of dead runners (see ``_dead_owners``); how many, by runner.

        A read, then a write only for each dead runner found. ``heartbeats``
        False: only the runners whose process is surely gone.
        """
        with self._db.reading() as conn:
            dead = _dead_owners(self._db, conn, me, heartbeats=heartbeats)
        freed = {}
        for owner, ended in dead:
            with self._db.writing() as conn:
                count = _give_back(self._db, conn, owner, now, gone=ended)
            if count:
                freed[owner] = count
        return freed

    def beat(self, runner: str) -> bool:
        """A running runner's heartbeat: its status row's time is now; False if it has no row.

        One write of one row, whatever the runner holds: its claims are its own
        while it beats (see :meth:`claim`, :meth:`rescue`).
        """
        with self._db.writing() as conn:
            conn.execute(
                f"""
                UPDATE runner_status SET reported_at = {self._db.now_sql}
                 WHERE runner_id = ? AND state = 'running'
                """,
                (runner,),
            )
            return bool(conn.changes())

    def prune_statuses(self) -> int:
        """Delete the status reports of runners long gone; how many.

        Each runner's start adds a report under a new id, and ``statuses`` reads
        them all. Kept: the :data:`KEEP_REPORTS` most recent, every one reported
        within :data:`KEEP_REPORTS_FOR` seconds (by the database's clock: a live
        runner's is seconds old), and every one of a runner that still holds a claim
        (its report is what lets the others take the claim back: ``_dead_owners``).
        """
        with self._db.writing() as conn:
            conn.execute(
                f"""
                DELETE FROM runner_status
                 WHERE reported_at < {self._db.now_sql} - ?1
                   AND runner_id NOT IN (SELECT r.runner_id FROM runner_status AS r
                                          ORDER BY r.reported_at DESC LIMIT ?2)
                   AND NOT EXISTS (SELECT 1 FROM alarms AS a
                                    WHERE a.lease_owner = runner_status.runner_id
                                      AND a.status = 'pending')
                """,
                (KEEP_REPORTS_FOR, KEEP_REPORTS),
            )
            return conn.changes()

    def counts(self, now: float) -> dict[str, int]:
        """Pending, due and dead alarms and events, resumptions due, approvals pending."""
        with self._db.reading() as conn:
            row: Any = conn.execute(
                """
                SELECT count(*) FILTER (WHERE status = 'pending' AND kind = 'alarm'),
                       count(*) FILTER (WHERE status = 'pending' AND kind = 'alarm'
                                          AND fire_at <= ?1),
                       count(*) FILTER (WHERE status = 'dead' AND kind = 'alarm'),
                       count(*) FILTER (WHERE status = 'pending' AND kind = 'event'),
                       count(*) FILTER (WHERE status = 'dead' AND kind = 'event'),
                       count(*) FILTER (WHERE status = 'pending' AND kind = 'resume'),
                       count(*) FILTER (WHERE status = 'dead' AND kind = 'resume'),
                       (SELECT count(*) FROM approvals WHERE status = 'pending')
                  FROM alarms WHERE ended_in IS NULL
                """,
                (now,),
            ).fetchone()
            names = (
                "pending",
                "due",
                "dead",
                "events_pending",
                "events_dead",
                "resumes_pending",
                "resumes_dead",
                "approvals_pending",
            )
            return dict(zip(names, row, strict=True))

    def record_status(
        self,
        runner: str,
        *,
        state: Literal["running", "stopped"],
        started_at: float,
        report: dict[str, Any],
        if_missing: bool = False,
    ) -> None:
        """Store a runner's latest status report (only if it has none, if ``if_missing``).

        Its time (``reported_at``) is the database's: it is a heartbeat too (:meth:`beat`).
        """
        with self._db.writing() as conn:
            update = (
                "NOTHING"
                if if_missing
                else """UPDATE SET
                       host = excluded.host, pid = excluded.pid, place = excluded.place,
                       state = excluded.state, started_at = excluded.started_at,
                       reported_at = excluded.reported_at, report = excluded.report"""
            )
            conn.execute(
                f"""
                INSERT INTO runner_status
                       (runner_id, host, pid, place, state, started_at, reported_at, report)
                VALUES (?, ?, ?, ?, ?, ?, {self._db.now_sql}, ?)
                ON CONFLICT (runner_id) DO {update}
                """,
                (
                    runner,
                    socket.gethostname(),
                    os.getpid(),
                    place(),
                    state,
                    started_at,
                    json.dumps(report, ensure_ascii=False, default=str),
                ),
            )
