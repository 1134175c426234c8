"""The alarms part of the store: schedules, cron, and how alarms follow versions."""

import re
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import croniter
import pytest
from cronsim import CronSim
from helpers import (
    commit_writes,
    edit_rows,
    ghost_runner,
    integrity,
    is_postgres,
    persisted_rows,
    statements_run,
)

from effectful_durable import InvalidAgentIdError, InvalidAlarmError, NotFoundError, Store
from effectful_durable.store.alarm_queue import DEAD_AFTER, AlarmQueue
from effectful_durable.store.history import HistoryChange
from effectful_durable.store.parts.alarms import (
    AlarmWrite,
    cron_next,
    make_schedule,
    new_alarm_id,
)

NOW = 1_800_000_000.0


def pending_at(conn: Any, agent_id: str, version: int) -> list[str]:
    """The ids of the alarms pending (or dead) at ``version``, sorted."""
    rows = conn.execute(
        """
        SELECT DISTINCT alarm_id FROM alarms
         WHERE agent_id = ?1 AND created_in <= ?2 AND (ended_in IS NULL OR ended_in > ?2)
           AND kind = 'alarm'
         ORDER BY alarm_id
        """,
        (agent_id, version),
    ).fetchall()
    return [alarm_id for (alarm_id,) in rows]


def beating(queue: AlarmQueue, runner: str, state: str = "running") -> None:
    """Give ``runner`` a status row: a heartbeat now (the database's time)."""
    queue.record_status(runner, state=state, started_at=NOW, report={})  # type: ignore[arg-type]


def silence(store: Store, runner: str, seconds: float) -> None:
    """Make ``runner``'s last heartbeat ``seconds`` older, through the store's own connection."""
    with store.engine.writing() as conn:
        conn.execute(
            "UPDATE runner_status SET reported_at = reported_at - ? WHERE runner_id = ?",
            (seconds, runner),
        )


def scheduled(action: str, delay: float = 60.0) -> AlarmWrite:
    write = AlarmWrite()
    write.schedule(new_alarm_id(), action, make_schedule(NOW, delay=delay), NOW)
    return write


def pending_actions(store: Store, agent_id: str) -> list[str]:
    return sorted(a.action for a in store.alarms(agent_id) if a.status == "pending")


class TestSchedule:
    """make_schedule checks what callers ask for and computes the first occurrence."""

    @pytest.mark.parametrize(
        ("kwargs", "reason"),
        [
            ({"delay": -1}, "delay must be a number of seconds >= 0"),
            ({"delay": float("nan")}, "delay must be"),
            ({"delay": 11 * 366 * 86400}, "at most"),
            ({"at": NOW - 3600}, "in the past"),
            ({"at": datetime(2030, 1, 1)}, "no timezone"),
            ({"every": 0}, "every must be"),
            ({"cron": "61 * * * *"}, "does not parse"),
            ({"cron": "* * *"}, "does not parse"),
            ({"cron": "0 9 * * *", "timezone": "Mars/Base"}, "unknown timezone"),
            ({"delay": 1, "at": NOW + 5}, "not both"),
            ({}, "give delay"),
        ],
        ids=[
            "negative",
            "nan",
            "too-far",
            "past",
            "naive",
            "zero-every",
            "bad-minute",
            "few-fields",
            "bad-zone",
            "both",
            "nothing",
        ],
    )
    def test_bad_input_is_refused(self, kwargs: dict, reason: str) -> None:
        """Each bad request raises InvalidAlarmError saying what is wrong."""
        with pytest.raises(InvalidAlarmError, match=reason):
            make_schedule(NOW, **kwargs)

    def test_interval_coalesces_missed_occurrences(self) -> None:
        """After a long gap the next occurrence is the first one after now, on the grid."""
        schedule = make_schedule(NOW, every=60)
        assert schedule.fire_at == NOW + 60
        assert schedule.next_after(NOW + 60, NOW + 60) == NOW + 120
        assert schedule.next_after(NOW + 60, NOW + 1000) == NOW + 1020
        assert schedule.next_after(NOW + 60, NOW + 1000, coalesce=False) == NOW + 120

    def test_one_shot_has_no_next(self) -> None:
        """A one-shot alarm ends after its delivery."""
        assert make_schedule(NOW, delay=5).next_after(NOW + 5, NOW + 5) is None


CRON_CASES = [
    "*/5 * * * *",
    "0 9 * * 1-5",
    "30 2 1 * *",
    "0 0 29 2 *",
    "15 10 * * sun",
    "0 */6 1,15 * *",
    "59 23 31 12 *",
    "0 12 * jan,jul mon",
]


class TestCron:
    """Cron next-fire times come from cronsim and agree with croniter."""

    @pytest.mark.parametrize("expression", CRON_CASES)
    def test_next_fire_times_match_both_libraries(self, expression: str) -> None:
        """Ten successive occurrences equal cronsim's and croniter's, in UTC."""
        start = datetime(2026, 2, 27, 13, 7, tzinfo=UTC)
        ours, moment = [], start.timestamp()
        for _ in range(10):
            moment = cron_next(expression, moment)
            ours.append(datetime.fromtimestamp(moment, UTC))
        sim = CronSim(expression, start)
        expected = [next(sim) for _ in range(10)]
        itr = croniter.croniter(expression, start)
        other = [itr.get_next(datetime) for _ in range(10)]
        assert ours == expected == other

    def test_timezone_is_honoured_across_dst(self) -> None:
        """09:00 in Europe/Paris is 08:00 UTC in winter and 07:00 UTC in summer."""
        march = datetime(2026, 3, 27, 12, tzinfo=UTC).timestamp()
        first = cron_next("0 9 * * *", march, "Europe/Paris")
        second = cron_next("0 9 * * *", first, "Europe/Paris")
        assert datetime.fromtimestamp(first, UTC).hour == 8  # 28 March, CET
        assert (
            datetime.fromtimestamp(second, UTC).hour == 7
        )  # 29 March, CEST (DST began that night)

    def test_cron_schedule_first_fires_at_next_match(self) -> None:
        """A cron schedule with no delay first fires at the next match after now."""
        schedule = make_schedule(NOW, cron="0 * * * *")
        assert schedule.fire_at == cron_next("0 * * * *", NOW)
        assert schedule.fire_at - NOW <= 3600
        later = NOW + timedelta(days=3).total_seconds()
        assert schedule.next_after(schedule.fire_at, later) == cron_next("0 * * * *", later)


class TestTurnWrites:
    """Alarms staged in a turn commit in its transaction."""

    def test_staged_alarm_commits_with_the_turn(self, store_url: str) -> None:
        """A scheduled alarm is on disk after the commit, created in that version."""
        with Store(store_url) as store:
            version = commit_writes(store, "a", scheduled("check"))
        rows = persisted_rows(store_url, "SELECT action, created_in, status FROM alarms")
        assert rows == [("check", version, "pending")]

    def test_failed_commit_writes_no_alarm(self, store_url: str) -> None:
        """A commit that fails (stale base version) leaves no alarm behind."""
        with Store(store_url) as store:
            commit_writes(store, "a")
            with pytest.raises(Exception, match="in use"):
                store.turns.commit(
                    "a",
                    base_version=0,
                    template="t",
                    change=HistoryChange([], [], 0),
                    state=None,
                    writes=[scheduled("check")],
                )
        assert persisted_rows(store_url, "SELECT count(*) FROM alarms") == [(0,)]


class TestVersions:
    """Rollback, fork, prune and delete treat pending alarms as part of each version."""

    def test_rollback_cancels_later_alarms_and_restores_earlier_ones(self, store_url: str) -> None:
        """After rollback to v the pending alarms are exactly those pending at v."""
        with Store(store_url) as store:
            keep = scheduled("keep")
            v1 = commit_writes(store, "a", keep)
            kept_id = keep.added[0][0]
            cancel = AlarmWrite()
            cancel.cancel(kept_id)
            commit_writes(store, "a", cancel)
            commit_writes(store, "a", scheduled("later"))
            assert pending_actions(store, "a") == ["later"]
            v4 = store.rollback("a", v1)
            assert pending_actions(store, "a") == ["keep"]
            assert [a.alarm_id for a in store.alarms("a")] == [kept_id]
            with store.engine.reading() as conn:
                assert len(pending_at(conn, "a", 3)) == 1  # "later" was pending at 3
                assert pending_at(conn, "a", v4) == [kept_id]
            store.rollback("a", 3)
            assert pending_actions(store, "a") == ["later"]
        assert integrity(store_url) == "ok"

    def test_rollback_brings_back_a_delivered_one_shot_alarm(self, store_url: str) -> None:
        """A one-shot alarm whose delivering turn is rolled back is pending again."""
        with Store(store_url) as store:
            v1 = commit_writes(store, "a", scheduled("once", delay=0))
            queue = store.alarm_queue
            claim = queue.claim("me", NOW + 1, 60)
            assert claim is not None
            deliver = AlarmWrite()
            deliver.deliver(claim, None, NOW + 1)
            commit_writes(store, "a", deliver)
            assert store.alarms("a") == []
            store.rollback("a", v1)
            (alarm,) = store.alarms("a")
            assert (alarm.action, alarm.status, alarm.leased_by) == ("once", "pending", None)

    def test_fork_copies_pending_alarms_under_new_ids(self, store_url: str) -> None:
        """The fork gets the alarms pending at the forked version, with ids of its own."""
        with Store(store_url) as store:
            v1 = commit_writes(store, "a", scheduled("first"))
            commit_writes(store, "a", scheduled("second"))
            store.fork("a", v1, "b")
            (copied,) = store.alarms("b")
            (original, _) = store.alarms("a")
            assert copied.action == "first" and copied.created_in == 1
            assert copied.alarm_id != original.alarm_id

    def test_prune_keeps_what_later_versions_need(self, store_url: str) -> None:
        """Pruning drops spans that ended before keep_from; rollbacks after it stay exact."""
        with Store(store_url) as store:
            early = scheduled("early")
            commit_writes(store, "a", early)
            cancel = AlarmWrite()
            cancel.cancel(early.added[0][0])
            commit_writes(store, "a", cancel)  # v2: early ended here
            v3 = commit_writes(store, "a", scheduled("late"))
            commit_writes(store, "a", scheduled("later"))
            from effectful_durable.store.parts.alarms import AlarmPart

            with store.engine.writing() as conn:
                AlarmPart().prune(conn, "a", v3)
            actions = [r[0] for r in persisted_rows(store_url, "SELECT action FROM alarms")]
            assert sorted(actions) == ["late", "later"]
            store.rollback("a", v3)
            assert pending_actions(store, "a") == ["late"]

    def test_store_prune_keeps_alarms_kept_versions_need(self, store_url: str) -> None:
        """Store.prune removes ended alarms only old versions held; rollback stays exact."""
        with Store(store_url) as store:
            early = scheduled("early")
            commit_writes(store, "a", early)
            cancel = AlarmWrite()
            cancel.cancel(early.added[0][0])
            commit_writes(store, "a", cancel)
            v3 = commit_writes(store, "a", scheduled("late"))
            commit_writes(store, "a", scheduled("later"))
            store.prune("a", keep_versions=2)
            actions = sorted(r[0] for r in persisted_rows(store_url, "SELECT action FROM alarms"))
            assert actions == ["late", "later"]
            store.rollback("a", v3)
            assert pending_actions(store, "a") == ["late"]

    def test_delete_removes_alarms(self, store_url: str) -> None:
        """Deleting an agent deletes its alarms, even those scheduled before its first turn."""
        with Store(store_url) as store:
            commit_writes(store, "a", scheduled("x"))
            store.schedule_alarm("a", "y", make_schedule(NOW, delay=5), now=NOW)
            store.delete("a")
        assert persisted_rows(store_url, "SELECT count(*) FROM alarms") == [(0,)]


class TestQueue:
    """Claims are leases; failures back off; dead alarms can be re-armed."""

    def test_claim_leases_the_earliest_due_alarm(self, store_url: str) -> None:
        """Only due alarms are claimed, earliest first, and a leased one is not claimed again."""
        with Store(store_url) as store:
            store.schedule_alarm("a", "late", make_schedule(NOW, delay=20), now=NOW)
            store.schedule_alarm("a", "soon", make_schedule(NOW, delay=10), now=NOW)
            store.schedule_alarm("b", "other", make_schedule(NOW, delay=15), now=NOW)
            queue = store.alarm_queue
            assert queue.claim("r1", NOW + 5, 30) is None
            assert queue.next_due() == NOW + 10
            claim = queue.claim("r1", NOW + 25, 30)
            assert claim is not None and claim.action == "soon" and claim.due_at == NOW + 10
            second = queue.claim("r2", NOW + 26, 30)
            assert second is not None and second.action == "other"
            assert queue.claim("r3", NOW + 27, 30) is None  # a's "late" waits for "soon"
            assert queue.next_due() == NOW + 55  # when r1's lease runs out
            again = queue.claim("r3", NOW + 55.5, 30)  # r1's lease ran out, r2's not yet
            assert again is not None and again.action == "soon"
            assert not queue.release(claim, NOW)  # r1's token is stale

    def test_one_agents_alarms_go_one_at_a_time_in_due_order(self, store_url: str) -> None:
        """While an alarm of an agent is leased, its agent's later alarms wait, whoever
        claims; given back (the database failed), it goes first again."""
        with Store(store_url) as store:
            for n, action in enumerate(["first", "second", "third"]):
                store.schedule_alarm("a", action, make_schedule(NOW, delay=n), now=NOW)
            queue = store.alarm_queue
            first = queue.claim("r1", NOW + 5, 30)
            assert first is not None and first.action == "first"
            assert queue.claim("r2", NOW + 5, 30) is None
            assert queue.release(first, first.due_at or NOW)
            again = queue.claim("r2", NOW + 5, 30)
            assert again is not None and again.action == "first"
            assert queue.release_own("r2", NOW + 6) == 1  # its commit was in doubt
            actions = []
            while (claim := queue.claim("r3", NOW + 7, 30)) is not None:
                actions.append(claim.action)
                queue.finish(claim)
        assert actions == ["first", "second", "third"]

    def test_fail_then_dead_then_rearm(self, store_url: str) -> None:
        """A failure sets the retry time; a final one makes the alarm dead; rearm revives it."""
        with Store(store_url) as store:
            alarm_id = store.schedule_alarm("a", "x", make_schedule(NOW, delay=0), now=NOW)
            queue = store.alarm_queue
            claim = queue.claim("r", NOW, 30)
            assert claim is not None
            assert queue.fail(claim, "boom", NOW + 10) == "pending"
            assert queue.claim("r", NOW + 5, 30) is None
            claim = queue.claim("r", NOW + 10, 30)
            assert claim is not None and claim.attempts == 1
            assert queue.fail(claim, "boom again", None) == "dead"
            assert queue.next_due() is None
            (dead,) = store.alarms("a")
            assert (dead.status, dead.attempts, dead.last_error) == ("dead", 2, "boom again")
            store.rearm_alarm(alarm_id, at=NOW + 20)
            (alive,) = store.alarms("a")
            assert (alive.status, alive.attempts) == ("pending", 0)
            with pytest.raises(NotFoundError):
                store.rearm_alarm("alm_nope")

    def test_next_due_stops_at_the_first_claimable_alarm(self, postgres_url: str) -> None:
        """On PostgreSQL, next_due reads the pending alarms in due order and stops at
        the first claimable one, not all of them against every leased one: 1,000
        pending of 200 agents, 32 of them leased (four runners' turns in flight)."""
        with Store(postgres_url) as store:
            for n in range(1000):
                store.schedule_alarm(
                    f"agent-{n % 200}", f"job {n}", make_schedule(NOW, at=NOW + n)
                )
            queue = store.alarm_queue
            held: list[str] = []
            for n in range(32):
                claim = queue.claim(f"runner-{n % 4}", NOW + 1000, 300, held)
                assert claim is not None
                held.append(claim.agent_id)
            with store.engine.reading() as conn:
                conn.execute("ANALYZE alarms")  # a table the planner has weighed
            busy = held[:8]
            with statements_run(store) as statements:
                assert queue.next_due(busy) == NOW + 32  # agent-32's first: the earliest free
            [(query, bindings)] = statements
            with store.engine.reading() as conn:
                [plan] = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {query}", bindings).get
        nodes, read = [plan["Plan"]], 0
        while nodes:
            node = nodes.pop()
            nodes += node.get("Plans", [])
            if node.get("Alias") == "a":  # the pending alarms the answer is looked for in
                read += node["Actual Rows"] * node["Actual Loops"]
        assert read < 50, plan

    def test_delivery_is_fenced_by_the_lease(self, store_url: str) -> None:
        """A delivery whose lease another runner took aborts the whole turn."""
        with Store(store_url) as store:
            store.schedule_alarm("a", "x", make_schedule(NOW, delay=0), now=NOW)
            queue = store.alarm_queue
            stale = queue.claim("r1", NOW, 30)
            assert stale is not None
            assert queue.claim("r2", NOW + 31, 30) is not None
            deliver = AlarmWrite()
            deliver.deliver(stale, None, NOW + 32)
            with pytest.raises(Exception, match="lease"):
                commit_writes(store, "a", deliver)
            assert store.agents() == []  # the turn committed nothing

    def test_cancel_outside_a_turn_ends_at_the_current_version(self, store_url: str) -> None:
        """A cancel outside a turn belongs to the agent's current version (or the
        alarm's own, for an alarm scheduled before the agent's first commit)."""
        with Store(store_url) as store:
            early = store.schedule_alarm("a", "early", make_schedule(NOW, delay=5), now=NOW)
            assert store.cancel_alarm(early)
            commit_writes(store, "a", scheduled("in a turn"))
            v2 = commit_writes(store, "a")
            (late,) = [a.alarm_id for a in store.alarms("a")]
            assert not store.cancel_alarm(late, agent_id="b")  # not b's
            assert store.cancel_alarm(late, agent_id="a")
            assert not store.cancel_alarm(late)  # already ended
            ended = {a.action: a.ended_in for a in store.alarms("a", include_ended=True)}
        assert ended == {"early": 0, "in a turn": v2}

    def test_leases_of_runners_gone_from_this_place_are_freed(self, store_url: str) -> None:
        """rescue frees the claims of runners whose pid ended here (this kernel and PID
        namespace), due at their own time; a live runner's claim stays, and so does
        that of a runner with the same host name and an ended pid in another place
        (another machine, or container), without heartbeats to judge it by."""
        now = time.time()  # leases shown while they run
        with Store(store_url) as store:
            for agent, action in zip("abc", ("dead", "alive", "elsewhere"), strict=True):
                store.schedule_alarm(agent, action, make_schedule(now, delay=0), now=now)
            queue = store.alarm_queue
            owners = ["dead", "alive", "elsewhere"]
            ghost_runner(store, "dead")
            queue.record_status("alive", state="running", started_at=now, report={})
            ghost_runner(store, "elsewhere", place="another-boot/1:4026531836")
            claims = [queue.claim(owner, now, 3600) for owner in owners]
            assert all(claims)
            assert queue.rescue("me", now + 10, heartbeats=False) == {"dead": 1}
            leased = {
                a.action: (a.leased_by, a.next_attempt)
                for agent in "abc"
                for a in store.alarms(agent)
            }
        assert leased["dead"] == (None, datetime.fromtimestamp(now, UTC))
        assert leased["alive"][0] == "alive" and leased["elsewhere"][0] == "elsewhere"

    def test_a_heartbeat_holds_claims_past_their_lease(self, store_url: str) -> None:
        """A claim whose runner beats is never claimed again, however old its lease (nor
        counted by next_due); once its heartbeat is DEAD_AFTER old, it is claimable."""
        with Store(store_url) as store:
            store.schedule_alarm("a", "long turn", make_schedule(NOW, delay=0), now=NOW)
            store.schedule_alarm("a", "after it", make_schedule(NOW, delay=1), now=NOW)
            queue = store.alarm_queue
            beating(queue, "r1")
            held = queue.claim("r1", NOW, 30)
            assert held is not None and held.action == "long turn"
            assert queue.beat("r1")
            assert queue.claim("r2", NOW + 3600, 30) is None  # the lease ran out long ago
            assert queue.next_due() is None
            (leased, _) = store.alarms("a")
            assert leased.leased_by == "r1"
            silence(store, "r1", DEAD_AFTER + 1)
            again = queue.claim("r2", NOW + 3600, 30)
            assert again is not None and again.action == "long turn"
            assert not queue.release(held, NOW)  # r1's token is stale

    def test_rescue_frees_the_claims_of_silent_and_stopped_runners(self, store_url: str) -> None:
        """rescue gives back, due at their own time, the claims of runners whose heartbeat
        is DEAD_AFTER old or that stopped, on any host; a beating runner's, a claimer's
        without a status row, and its own stay; without heartbeats, none of them moves."""
        with Store(store_url) as store:
            queue = store.alarm_queue
            owners = ["h1:1:silent", "h2:2:stopped", "h3:3:beating", "h4:4:rowless", "h5:5:me"]
            for n, owner in enumerate(owners):
                store.schedule_alarm(f"a{n}", owner, make_schedule(NOW, delay=0), now=NOW)
                if owner != "h4:4:rowless":
                    beating(queue, owner, state="stopped" if "stopped" in owner else "running")
                assert queue.claim(owner, NOW + n, 3600) is not None
            silence(store, "h1:1:silent", DEAD_AFTER + 1)
            silence(store, "h5:5:me", DEAD_AFTER + 1)
            assert queue.rescue("h5:5:me", NOW + 10, heartbeats=False) == {}
            freed = queue.rescue("h5:5:me", NOW + 10)
            assert freed == {"h1:1:silent": 1, "h2:2:stopped": 1}
            leased = {a.action: (a.leased_by, a.next_attempt) for a in store.alarms()}
        assert leased["h1:1:silent"] == (None, datetime.fromtimestamp(NOW, UTC))
        assert leased["h2:2:stopped"] == (None, datetime.fromtimestamp(NOW, UTC))
        for kept in owners[2:]:
            assert leased[kept][0] == kept

    def test_a_heartbeat_without_a_row_says_so(self, store_url: str) -> None:
        """beat writes only a running runner's row: none, or a stopped one, is False;
        a report recorded only if missing never replaces one."""
        with Store(store_url) as store:
            queue = store.alarm_queue
            assert not queue.beat("r1")
            beating(queue, "r1")
            assert queue.beat("r1")
            queue.record_status("r1", state="stopped", started_at=NOW, report={"turns": 3})
            assert not queue.beat("r1")
            queue.record_status(
                "r1", state="running", started_at=NOW, report={"turns": 0}, if_missing=True
            )
            (report,) = store.runner_statuses()
        assert (report["state"], report["turns"]) == ("stopped", 3)

    def test_a_runners_status_report_replaces_its_last(self, store_url: str) -> None:
        """Each runner keeps one status row: its latest report."""
        with Store(store_url) as store:
            queue = store.alarm_queue
            for turns in (1, 2):
                queue.record_status("r1", state="running", started_at=NOW, report={"turns": turns})
            queue.record_status("r2", state="stopped", started_at=NOW, report={"turns": 0})
            reports = {r["runner"]: (r["state"], r["turns"]) for r in store.runner_statuses()}
        assert reports == {"r1": ("running", 2), "r2": ("stopped", 0)}

    def test_text_no_database_holds_is_refused_before_it_reaches_one(self, store_url: str) -> None:
        """A NUL in an action is refused; an id holding a NUL or a lone surrogate names no
        alarm; an invalid agent id is refused; a delivery's error is stored legibly."""
        with Store(store_url) as store:
            with pytest.raises(InvalidAlarmError, match="NUL"):
                store.schedule_alarm("a", "x\0y", make_schedule(NOW, delay=0), now=NOW)
            alarm_id = store.schedule_alarm("a", "x", make_schedule(NOW, delay=0), now=NOW)
            for odd in (alarm_id + "\0", "\ud800"):
                assert not store.cancel_alarm(odd)
                with pytest.raises(NotFoundError):
                    store.rearm_alarm(odd)
            with pytest.raises(InvalidAgentIdError):
                store.alarms("a\0")
            queue = store.alarm_queue
            claim = queue.claim("r", NOW, 30)
            assert claim is not None
            assert queue.fail(claim, "RuntimeError: \0 and \ud800", None) == "dead"
            (dead,) = store.alarms("a")
        assert dead.last_error == "RuntimeError: \\x00 and \\ud800"


# Indexes that hold no done row (partial on open or pending rows), and the keys that
# find one alarm's spans: a read through them never grows with the done rows.
_OPEN_ONLY = {"alarms_due", "alarms_open", "alarms_leased"}


def done_rows_read(store: Store, sql: str, bindings: Any) -> list[str]:
    """Each step of ``sql``'s plan that reads the alarms table beyond its open rows."""
    with store.engine.reading() as conn:
        if not is_postgres(store.path):
            details = [str(row[3]) for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", bindings)]
            return [
                d
                for d in details
                if d.startswith(("SCAN", "SEARCH"))
                and not re.search(rf"INDEX ({'|'.join(_OPEN_ONLY)})\b", d)
                and not re.search(r"INDEX sqlite_autoindex_alarms_1 \(alarm_id=", d)
                and not re.search(r"INDEX alarms_agent \(agent_id=\? AND ended_in=", d)
                and ("alarms" in d or "USING" not in d)
            ]
        [[plan]] = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", bindings).fetchone()
    wrong, nodes = [], [plan["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        index, condition = node.get("Index Name", ""), node.get("Index Cond", "")
        if node.get("Relation Name") == "alarms" and node["Node Type"] == "Seq Scan":
            wrong.append("Seq Scan on alarms")
        elif index == "alarms_agent" and "ended_in IS NULL" not in condition:
            wrong.append(f"{node['Node Type']} using alarms_agent: {condition}")
        elif index == "alarms_pkey" and "alarm_id =" not in condition:
            wrong.append(f"{node['Node Type']} using alarms_pkey: {condition}")
    return wrong


class TestDoneRows:
    """What runners and senders do reads no done alarm or event: its cost stays flat."""

    def test_claims_deliveries_and_sends_skip_done_rows(self, store_url: str) -> None:
        """Every statement of a schedule, claim, delivery, poll and send, among 4,000 done
        rows of the same agent, reads the alarms table only through its open rows."""
        with Store(store_url) as store:
            commit_writes(store, "bot")
        edit_rows(
            store_url,
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 4000)
            INSERT INTO alarms (alarm_id, created_in, agent_id, action, fire_at, due_at,
                                status, ended_in, deliveries, created_at, updated_at, kind)
            SELECT 'alm_done' || i, 1, 'bot', 'done', ?1, ?1, 'done', 1, 1, ?1, ?1,
                   CASE WHEN i % 2 = 0 THEN 'alarm' ELSE 'event' END
              FROM n
            """,
            NOW,
        )
        if is_postgres(store_url):  # as autovacuum would; SQLite plans without statistics
            edit_rows(store_url, "ANALYZE alarms")
        with Store(store_url) as store:
            with statements_run(store) as statements:
                now = time.time()
                write = AlarmWrite()
                write.schedule(new_alarm_id(), "look", make_schedule(now, delay=0), now)
                commit_writes(store, "bot", write)
                for kind in ("alarm", "event"):
                    claim = store.alarm_queue.claim("r", time.time(), 30)
                    assert claim is not None and claim.kind == kind
                    deliver = AlarmWrite()
                    deliver.deliver(claim, None, time.time())
                    commit_writes(store, "bot", deliver)
                    if kind == "alarm":
                        store.send_event("bot", "paid", {"n": 1})
                assert store.alarm_queue.next_due() is None
                store.alarm_queue.counts(time.time())
            wrong = {
                sql: reads
                for sql, bindings in statements
                if "alarms" in sql and (reads := done_rows_read(store, sql, bindings))
            }
        assert wrong == {}

    def test_a_claim_looks_up_the_candidates_agent_only(self, store_url: str) -> None:
        """Among 20,000 done rows and 300 pending alarms of other agents, the claim reads the
        due candidate and its agent's open alarms, never every pending alarm: in SQLite's
        plan, and in PostgreSQL's plan for the values and its generic plan (a prepared
        statement's, after five runs)."""
        with Store(store_url) as store:
            commit_writes(store, "bot")
        edit_rows(
            store_url,
            """
            WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 20300)
            INSERT INTO alarms (alarm_id, created_in, agent_id, action, fire_at, due_at,
                                status, ended_in, deliveries, created_at, updated_at)
            SELECT 'alm_' || i, 1, 'agent-' || (i % 300), 'x', ?1 + i, ?1 + i,
                   CASE WHEN i <= 20000 THEN 'done' ELSE 'pending' END,
                   CASE WHEN i <= 20000 THEN 1 END, 0, ?1, ?1
              FROM n
            """,
            time.time() + 3600,
        )
        if is_postgres(store_url):
            edit_rows(store_url, "ANALYZE alarms")
        with Store(store_url) as store:
            now = time.time()
            write = AlarmWrite()
            write.schedule(new_alarm_id(), "look", make_schedule(now, delay=0), now)
            commit_writes(store, "bot", write)
            with statements_run(store) as statements:
                claim = store.alarm_queue.claim("r", time.time(), 30)
            assert claim is not None and claim.agent_id == "bot"
            [(sql, bindings)] = [(s, b) for s, b in statements if "due_at <=" in s]
            if not is_postgres(store_url):
                plan = store.engine.connection().execute(f"EXPLAIN QUERY PLAN {sql}", bindings)
                details = [str(r[3]) for r in plan]
                assert [d for d in details if d.startswith("SCAN")] == []
                return
        import psycopg

        prepared = re.sub(r"\bchecked_", "", sql).replace("?", "$1")
        with psycopg.connect(store_url) as pg:
            pg.execute(f"PREPARE claim AS {prepared}".encode())
            for mode in ("force_custom_plan", "force_generic_plan"):
                pg.execute(f"SET plan_cache_mode = {mode}".encode())
                [[plan]] = pg.execute(
                    f"EXPLAIN (FORMAT JSON) EXECUTE claim({time.time()!r})".encode()
                ).fetchone()
                assert whole_reads(plan["Plan"]) == [], mode


def whole_reads(node: dict[str, Any]) -> list[str]:
    """The steps of a PostgreSQL plan that read a table, or an index, whole."""
    reads = "Relation Name" in node or "Index Name" in node
    found = [] if "Index Cond" in node or not reads else [node["Node Type"]]
    if node["Node Type"] == "Bitmap Heap Scan":
        found = []  # its Bitmap Index Scan below says how it reads
    for child in node.get("Plans", []):
        found += whole_reads(child)
    return found


class TestStatusReports:
    """Each runner's start adds a status report; a start prunes those of runners long gone."""

    def test_a_runner_start_keeps_what_an_operator_needs(self, store_url: str) -> None:
        """After 30 runners gone two days ago, 3 gone an hour ago and one gone two days
        ago that still holds a claim, a runner's start leaves its own report, the
        claim holder's, the last day's, and the most recent up to KEEP_REPORTS."""
        from effectful_durable import AgentRunner
        from effectful_durable.runner import FakeClock
        from effectful_durable.store.alarm_queue import KEEP_REPORTS

        with Store(store_url) as store:
            queue = store.alarm_queue
            for n in range(30):
                beating(queue, f"old-{n:02d}", state="stopped")
                silence(store, f"old-{n:02d}", 2 * 86_400 + n)
            for n in range(3):
                beating(queue, f"recent-{n}", state="stopped")
                silence(store, f"recent-{n}", 3600 + n)
            commit_writes(store, "a", scheduled("wake", delay=0))
            beating(queue, "claimer")
            assert queue.claim("claimer", NOW + 1, 30) is not None
            silence(store, "claimer", 3 * 86_400)
            clock = FakeClock(time.time())
            with AgentRunner(
                store, agents=lambda agent_id: None, handlers=lambda config: [], clock=clock
            ) as runner:
                runner.run(until=clock.now())
            kept = [status["runner"] for status in store.runner_statuses()]
        old = [f"old-{n:02d}" for n in range(KEEP_REPORTS - 4)]  # the most recent of them
        assert sorted(kept) == sorted(
            [runner.id, *(f"recent-{n}" for n in range(3)), *old, "claimer"]
        ), kept
