"""Retention: prune keeps every later version exact; vacuum, the WAL bound, and backups."""

import datetime
import os
import threading
import time
from pathlib import Path
from typing import Any

import apsw
import pytest
from helpers import (
    Assistant,
    commit_writes,
    integrity,
    is_postgres,
    persisted,
    persisted_rows,
    running,
)

from effectful_durable import (
    AgentInUseError,
    CompactionHandler,
    DurableError,
    NotFoundError,
    PersistenceHandler,
    Store,
)
from effectful_durable.cli import main
from effectful_durable.store import retention
from effectful_durable.store import store as store_module
from effectful_durable.store.engine.sqlite.connection import WAL_SIZE_LIMIT
from effectful_durable.store.history import ActiveHistory, plan_change
from effectful_durable.store.parts.alarms import AlarmWrite, make_schedule, new_alarm_id
from effectful_durable.testing import FakeCall, FakeLLM


def echo(call: FakeCall) -> str:
    return f"re: {call.last_user_text}"


def snapshot(store: Store, agent_id: str, versions: range) -> dict[int, Any]:
    """Everything readable about each version: history (both views), state, version row."""
    infos = {v.version: v for v in store.versions(agent_id)}
    return {
        v: (
            store.history(agent_id, v),
            store.history(agent_id, v, include_compacted=True),
            store.state(agent_id, v),
            infos[v],
        )
        for v in versions
    }


def run_turns(store_url: str, count: int, *, agent_id: str = "bot", **options: Any) -> None:
    """``count`` turns of an Assistant; its ``turns`` field changes every third turn."""
    with persisted(store_url, FakeLLM(respond=echo), **options) as persistence:
        bot = Assistant(agent_id=agent_id)
        persistence.load(bot)
        for n in range(count):
            if n % 3 == 0:
                bot.turns += 1
            bot.ask(f"question {n} " + "x" * 200)


class TestPrune:
    """Store.prune deletes what only old versions need and keeps the rest exact."""

    def test_kept_versions_read_back_exactly(self, store_url: str) -> None:
        """After prune(keep_versions=5) the last five versions read back exactly as before."""
        run_turns(store_url, 20)
        with Store(store_url) as store:
            before = snapshot(store, "bot", range(16, 21))
            result = store.prune("bot", keep_versions=5)
            assert result.agents == ("bot",) and result.versions == 15
            assert snapshot(store, "bot", range(16, 21)) == before
            assert [v.version for v in store.versions("bot")] == list(range(16, 21))

    def test_pruned_version_is_a_clear_error(self, store_url: str) -> None:
        """Reading, rolling back to or forking a pruned version says it was pruned."""
        run_turns(store_url, 6)
        with Store(store_url) as store:
            store.prune(keep_versions=2)
            for read in (store.history, store.state, store.rollback):
                with pytest.raises(NotFoundError, match="version 3 of agent 'bot' was pruned"):
                    read("bot", 3)
            with pytest.raises(NotFoundError, match="keeps versions 5 to 6"):
                store.fork("bot", 1, "copy")

    def test_rollback_and_fork_from_the_oldest_kept_version(self, store_url: str) -> None:
        """Rollback to and fork from the oldest kept version reproduce it exactly."""
        run_turns(store_url, 12)
        with Store(store_url) as store:
            history, state = store.history("bot", 9), store.state("bot", 9)
            store.prune("bot", keep_versions=4)
            new = store.rollback("bot", 9)
            assert (store.history("bot", new), store.state("bot", new)) == (history, state)
            copy = store.fork("bot", 9, "copy")
            assert (copy.source_id, copy.source_version) == ("bot", 9)
            assert (store.history("copy"), store.state("copy")) == (history, state)

    def test_state_of_pruned_versions_is_carried(self, store_url: str) -> None:
        """Kept versions that did not change the state still read the one set before them."""
        run_turns(store_url, 3)  # state changes at version 1 only
        run_turns(store_url, 8, agent_id="other")
        with Store(store_url) as store:
            store.rollback("bot", 3)  # version 4, state copied
            expected = store.state("bot", 3)
            store.prune("bot", keep_versions=1)
            assert store.state("bot") == expected
            assert persisted_rows(
                store_url, "SELECT count(*) FROM versions WHERE agent_id = 'bot'"
            )
            [(carried,)] = persisted_rows(store_url, "SELECT state FROM retention")
            assert carried is not None

    def test_rows_removed_by_rollback_are_pruned_and_kept_ones_stay(self, store_url: str) -> None:
        """Rows that only pruned versions showed are deleted; rolled-back-to rows survive."""
        run_turns(store_url, 6)
        with Store(store_url) as store:
            store.rollback("bot", 2)  # version 7 drops the rows of versions 3-6
            store.rollback("bot", 6)  # version 8 brings copies of them back
            before = snapshot(store, "bot", range(7, 9))
            rows_before = persisted_rows(store_url, "SELECT count(*) FROM messages")[0][0]
            result = store.prune("bot", keep_versions=2)
            assert result.messages > 0
            assert persisted_rows(store_url, "SELECT count(*) FROM messages")[0][0] < rows_before
            assert snapshot(store, "bot", range(7, 9)) == before
            assert store.rollback("bot", 7) == 9 and store.history("bot") == before[7][0]

    def test_older_than_and_both_rules(self, store_url: str) -> None:
        """older_than prunes versions committed before it; with keep_versions, both must agree."""
        run_turns(store_url, 4)
        moment = datetime.datetime.now(datetime.UTC)
        time.sleep(0.01)
        run_turns(store_url, 4)
        with Store(store_url) as store:
            store.prune(older_than=moment, keep_versions=6)  # keep_versions keeps 3..8
            assert store.versions("bot")[0].version == 3
            store.prune(older_than=moment)
            assert store.versions("bot")[0].version == 5
            store.prune(older_than=datetime.timedelta(days=1))  # nothing that old
            assert store.versions("bot")[0].version == 5

    def test_latest_version_is_always_kept(self, store_url: str) -> None:
        """Even a cutoff in the future keeps the latest version."""
        run_turns(store_url, 3)
        with Store(store_url) as store:
            history = store.history("bot")
            store.prune(older_than=datetime.datetime.now(datetime.UTC) + datetime.timedelta(1))
            assert [v.version for v in store.versions("bot")] == [3]
            assert store.history("bot") == history

    def test_bad_rules_are_refused(self, store_url: str) -> None:
        """No rule, keep_versions < 1 and a naive datetime are ValueErrors; nothing changes."""
        run_turns(store_url, 2)
        with Store(store_url) as store:
            with pytest.raises(ValueError, match="needs a rule"):
                store.prune()
            with pytest.raises(ValueError, match="keep_versions"):
                store.prune(keep_versions=0)
            with pytest.raises(ValueError, match="time zone"):
                store.prune(older_than=datetime.datetime.now())
            with pytest.raises(NotFoundError, match="no agent 'nobody'"):
                store.prune("nobody", keep_versions=1)
            assert len(store.versions("bot")) == 2

    def test_running_agent_is_refused_or_skipped(self, store_url: str) -> None:
        """prune(agent) of an agent in a turn raises; prune() of all skips it and says so."""
        run_turns(store_url, 3)
        run_turns(store_url, 3, agent_id="idle")
        with Store(store_url) as store:
            held, release = threading.Event(), threading.Event()

            def hold() -> None:
                with store.agent_lock("bot"):
                    held.set()
                    release.wait(10)

            thread = threading.Thread(target=hold)
            thread.start()
            held.wait(10)
            try:
                with pytest.raises(AgentInUseError):
                    store.prune("bot", keep_versions=1)
                result = store.prune(keep_versions=1)
            finally:
                release.set()
                thread.join()
            assert (result.agents, result.skipped) == (("idle",), ("bot",))
            assert len(store.versions("bot")) == 3

    def test_every_part_is_told_the_retention_point(
        self, store_url: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Each VersionedPart's prune runs in the same transaction with the retention point."""
        calls: list[tuple[str, int, bool]] = []

        class Recorder:
            def prune(self, conn: apsw.Connection, agent_id: str, keep_from: int) -> None:
                calls.append((agent_id, keep_from, conn.in_transaction))

        if is_postgres(store_url):
            from effectful_durable.store import store as postgres_module

            monkeypatch.setattr(postgres_module, "PARTS", (Recorder(),))
        else:
            monkeypatch.setattr(store_module, "PARTS", (Recorder(),))
        run_turns(store_url, 7)
        with Store(store_url) as store:
            store.prune(keep_versions=3)
        assert calls == [("bot", 5, True)]


class TestCompactionOriginals:
    """Compaction originals stay readable and searchable unless drop_compacted."""

    def build(self, store_url: str) -> None:
        llm = FakeLLM(respond=echo)
        compaction = CompactionHandler(max_messages=8, keep_recent=3, summarizer=lambda t: "S")
        with running(llm, compaction, PersistenceHandler(store_url)):
            bot = Assistant(agent_id="bot")
            bot.ask("remember the codeword zebra " + "y" * 500)
            for n in range(15):
                bot.ask(f"question {n} " + "x" * 500)

    def test_originals_kept_by_default(self, store_url: str) -> None:
        """Without drop_compacted, every kept version's full view and recall are unchanged."""
        self.build(store_url)
        with Store(store_url) as store:
            latest = store.versions("bot")[-1].version
            before = snapshot(store, "bot", range(latest - 2, latest + 1))
            store.prune("bot", keep_versions=3)
            assert snapshot(store, "bot", range(latest - 2, latest + 1)) == before
            assert store.search_compacted("bot", "zebra")

    @pytest.mark.sqlite_only("it measures the database file and vacuums it")
    def test_pruned_database_is_a_fraction_of_its_size(self, store_url: str) -> None:
        """prune(drop_compacted) and vacuum leave a fraction of the file; kept versions exact."""
        for n in range(6):
            llm = FakeLLM(respond=echo)
            compaction = CompactionHandler(max_messages=8, keep_recent=3, summarizer=lambda t: "S")
            with running(llm, compaction, PersistenceHandler(store_url)):
                bot = Assistant(agent_id=f"bot-{n}")
                for q in range(30):
                    bot.ask(f"question {q} " + "x" * 1000)
        with Store(store_url) as store:
            kept = {
                a.agent_id: {
                    v: (store.history(a.agent_id, v), store.state(a.agent_id, v))
                    for v in range(a.version - 2, a.version + 1)
                }
                for a in store.agents()
            }
            size = os.path.getsize(store_url)
            store.prune(keep_versions=3, drop_compacted=True)
            assert store.vacuum() > 0
            after = os.path.getsize(store_url)
            assert after < size / 3, (size, after)
            for i, versions in kept.items():
                for v, expected in versions.items():
                    assert (store.history(i, v), store.state(i, v)) == expected
            # Originals of the kept versions' compactions stay searchable; older ones went,
            # from the messages and from the full-text index.
            assert store.search_compacted("bot-0", "question 0") == []
            assert store.search_compacted("bot-0", "question 27")
            assert persisted_rows(
                store_url,
                """SELECT count(*) FROM compacted_text AS t JOIN retention AS r
                    ON r.agent_id = t.agent_id AND t.version <= r.kept_from""",
            ) == [(0,)]
        assert integrity(store_url) == "ok"


class TestPruneAsYouGo:
    """PersistenceHandler(keep_versions=K) prunes in the commits of turns."""

    def test_versions_stay_bounded_and_exact(self, store_url: str) -> None:
        """Over 40 turns, an agent holds K to 1.5 K versions and they all read back."""
        with persisted(store_url, FakeLLM(respond=echo), keep_versions=6) as persistence:
            bot = Assistant(agent_id="bot")
            counts = []
            for n in range(40):
                bot.turns = n
                bot.ask(f"q{n}")
                counts.append(len(persistence.store.versions("bot")))
            expected = persistence.store.history("bot")
        assert max(counts) <= 6 + 3 - 1 and min(counts[10:]) >= 6
        with Store(store_url) as store:
            first = store.versions("bot")[0].version
            assert store.state("bot", first)["turns"] == first - 1
            assert store.history("bot") == expected
            store.rollback("bot", first)
        run_turns(store_url, 1, keep_versions=6)  # a new handler continues from the rollback

    def test_bad_keep_versions_is_refused(self, store_url: str) -> None:
        """keep_versions must be a positive integer."""
        for bad in (0, -1, 2.5, True):
            with pytest.raises(ValueError, match="keep_versions"):
                PersistenceHandler(store_url, keep_versions=bad)


class TestJournals:
    """Finished workflows' journals go once every version they committed is pruned."""

    def test_finished_journal_goes_with_its_versions(self, store_url: str) -> None:
        """A done journal stays while a step's version is kept and goes once all are pruned."""
        run_turns(store_url, 3, workflow="wf")
        with Store(store_url) as store:
            assert store.prune(keep_versions=1).workflows == ()
            assert [w.workflow for w in store.workflows()] == ["wf"]
        run_turns(store_url, 2)
        with Store(store_url) as store:
            assert store.prune(keep_versions=1).workflows == ("wf",)
            assert store.workflows() == []

    def test_unfinished_journal_stays(self, store_url: str) -> None:
        """A journal with a failed step is never pruned."""
        run_turns(store_url, 2, workflow="wf")
        with Store(store_url) as store:
            with store.turns.start("bot", template="ask", arguments={}, step=("wf", "bot#9")):
                store.turns.fail("bot", "boom", step=("wf", "bot#9"))
        run_turns(store_url, 3)
        with Store(store_url) as store:
            assert store.prune(keep_versions=1).workflows == ()
            assert [w.workflow for w in store.workflows()] == ["wf"]


class TestVacuumAndWal:
    """vacuum gives space back; the WAL stays bounded."""

    def test_vacuum_shrinks_and_keeps_everything(self, db_path: Path) -> None:
        """After a prune, vacuum shrinks the file and every kept version reads back."""
        run_turns(db_path, 30)
        with Store(db_path) as store:
            store.rollback("bot", 1)  # removes everything but the first turn
            before = snapshot(store, "bot", range(31, 32))
            store.prune(keep_versions=1)
            assert store.vacuum() > 0
            assert snapshot(store, "bot", range(31, 32)) == before
            assert not os.path.exists(f"{db_path}-wal") or os.path.getsize(f"{db_path}-wal") == 0
        assert integrity(db_path) == "ok"

    def test_wal_shrinks_back_after_a_large_transaction(self, db_path: Path) -> None:
        """One 30 MB commit grows the WAL; under steady load after it, the WAL is cut back
        to WAL_SIZE_LIMIT (without the limit it would stay 30 MB for good)."""
        store = Store(db_path)
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                with Store(db_path, readonly=True) as other:
                    other.agents()

        thread = threading.Thread(target=reader)
        thread.start()
        history = ActiveHistory()
        sizes = []
        try:
            for version in range(1, 121):
                body = "z" * (30_000_000 if version == 1 else 200_000)
                messages = [
                    *history.messages,
                    {"id": f"m{version}", "role": "user", "content": body},
                ]
                change, history = plan_change(history, messages)
                store.turns.commit(
                    "bot", base_version=version - 1, template="t", change=change, state=None
                )
                sizes.append(os.path.getsize(f"{db_path}-wal"))
        finally:
            stop.set()
            thread.join()
            store.close()
        assert sizes[0] > 25_000_000
        # Checkpoints that overlap the reader cannot reset the WAL, so on a busy
        # machine it may grow again between resets: assert that it was cut back.
        assert min(sizes[60:]) <= WAL_SIZE_LIMIT, sizes[60:]


class TestBackup:
    """backup copies a live database consistently and never overwrites."""

    def test_backup_while_agents_commit(self, db_path: Path, tmp_path: Path) -> None:
        """Threads keep committing during backups; each copy opens, passes integrity_check
        and holds every agent exactly as the source held it at that version."""
        store = Store(db_path)
        stop = threading.Event()
        errors: list[BaseException] = []

        def writer(agent_id: str) -> None:
            history = ActiveHistory()
            version = 0
            try:
                while not stop.is_set() or version < 20:
                    messages = [
                        *history.messages,
                        {"id": f"{agent_id}-{version}", "role": "user", "content": "w" * 2000},
                    ]
                    change, history = plan_change(history, messages)
                    version = store.turns.commit(
                        agent_id,
                        base_version=version,
                        template="t",
                        change=change,
                        state=f'{{"n": {version + 1}}}',
                    )
            except BaseException as error:  # surfaced by the assertion below
                errors.append(error)

        threads = [threading.Thread(target=writer, args=(f"w{n}",)) for n in range(3)]
        for thread in threads:
            thread.start()
        copies = []
        try:
            for n in range(3):
                time.sleep(0.05)
                copy = tmp_path / f"backup-{n}.db"
                store.backup(copy)
                copies.append(copy)
        finally:
            stop.set()
            for thread in threads:
                thread.join()
        assert errors == []
        for copy in copies:
            assert integrity(copy) == "ok"
            with Store(copy, readonly=True) as backup:
                for agent in backup.agents():
                    v = agent.version
                    assert backup.history(agent.agent_id) == store.history(agent.agent_id, v)
                    assert backup.state(agent.agent_id) == {"n": v}
        assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []
        store.close()

    def test_backup_never_overwrites(self, db_path: Path, tmp_path: Path) -> None:
        """An existing target or a missing directory is refused and left as it was."""
        run_turns(db_path, 1)
        target = tmp_path / "taken.db"
        target.write_bytes(b"precious")
        with Store(db_path) as store:
            with pytest.raises(DurableError, match="exists"):
                store.backup(target)
            with pytest.raises(DurableError, match="does not exist"):
                store.backup(tmp_path / "nowhere" / "b.db")
        assert target.read_bytes() == b"precious"


def test_prune_agent_is_a_noop_at_the_same_point(store_url: str) -> None:
    """Pruning again at the same retention point deletes nothing."""
    run_turns(store_url, 5)
    with Store(store_url) as store:
        store.prune(keep_versions=2)
        again = store.prune(keep_versions=2)
        assert (again.versions, again.messages, again.agents) == (0, 0, ())
        with store.engine.reading() as conn:
            assert retention.kept_from(conn, "bot") == 4


class TestReports:
    """fork and reset_workflow say what they did."""

    def test_fork_of_latest_names_the_version(self, store_url: str) -> None:
        """fork(agent, None, new) records which version it copied."""
        run_turns(store_url, 3)
        with Store(store_url) as store:
            copy = store.fork("bot", None, "twin")
            assert (copy.agent_id, copy.version, copy.source_id, copy.source_version) == (
                "twin",
                1,
                "bot",
                3,
            )

    def test_reset_workflow_dry_run_and_pruned_target(self, store_url: str) -> None:
        """A dry run changes nothing; a reset whose target version was pruned changes nothing."""
        run_turns(store_url, 2)
        run_turns(store_url, 3, workflow="wf")
        with Store(store_url) as store:
            plan = store.reset_workflow("wf", dry_run=True)
            assert (plan.rolled_back, plan.deleted, plan.steps) == (("bot",), (), 3)
            assert store.agents()[0].version == 5 and len(store.steps("wf")) == 3
            store.prune(keep_versions=2)
            with pytest.raises(NotFoundError, match="version 2 of agent 'bot' was pruned"):
                store.reset_workflow("wf")
            assert store.agents()[0].version == 5 and len(store.steps("wf")) == 3


def deliver_next(store: Store, agent_id: str) -> None:
    """Claim the earliest due alarm or event, and commit its delivery as a turn of its agent."""
    claim = store.alarm_queue.claim("runner", time.time(), 30)
    assert claim is not None and claim.agent_id == agent_id
    write = AlarmWrite()
    write.deliver(claim, None, time.time())
    commit_writes(store, agent_id, write)


def runners_rows(store_url: str) -> list[tuple[str, str]]:
    return [
        (str(kind), str(status))
        for kind, status in persisted_rows(
            store_url, "SELECT kind, status FROM alarms ORDER BY kind, status"
        )
    ]


class TestPruneWhatRunnersLeave:
    """prune deletes done alarms and events, decided approvals (test_approvals.py) and the
    handoffs of failed or crashed turns past its rules; what waits stays."""

    @pytest.mark.parametrize("rule", ["keep", "older-than", "cli"])
    def test_done_alarms_and_events_go_with_their_versions(
        self, store_url: str, rule: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A delivered alarm, a delivered event and a cancelled alarm go; a pending alarm
        and a dead event stay, with every kept version."""
        with Store(store_url) as store:
            now = time.time()
            write = AlarmWrite()
            write.schedule(new_alarm_id(), "ping", make_schedule(now, delay=0), now)
            write.schedule(new_alarm_id(), "later", make_schedule(now, delay=3600), now)
            dropped = new_alarm_id()
            write.schedule(dropped, "dropped", make_schedule(now, delay=7200), now)
            commit_writes(store, "bot", write)  # 1
            deliver_next(store, "bot")  # 2
            store.send_event("bot", "paid", {"order": 1})
            deliver_next(store, "bot")  # 3
            assert store.cancel_alarm(dropped)
            store.send_event("bot", "refund", {"order": 2})
            claim = store.alarm_queue.claim("runner", time.time(), 30)
            assert claim is not None and store.alarm_queue.fail(claim, "boom", None) == "dead"
            commit_writes(store, "bot")  # 4
            assert len(runners_rows(store_url)) == 5
            if rule == "keep":
                store.prune(keep_versions=1)
            elif rule == "older-than":
                store.prune(older_than=datetime.timedelta(0))
        if rule == "cli":
            assert main(["prune", store_url, "--older-than", "0s", "--yes"]) == 0
            assert "pruned 1 agents: 3 versions" in capsys.readouterr().out
        assert runners_rows(store_url) == [("alarm", "pending"), ("event", "dead")]
        with Store(store_url) as store:
            assert [a.action for a in store.alarms("bot")] == ["later"]
            assert [e.name for e in store.events("bot")] == ["refund"]

    def test_failed_and_crashed_turns_handoffs_go_past_the_rules(self, store_url: str) -> None:
        """keep_versions drops a handoff whose turn started from a pruned version;
        older_than one that failed (or, crashed, started) before the cutoff; the last
        failed turn of an agent stays under keep_versions alone."""
        with Store(store_url) as store:
            for _ in range(3):
                commit_writes(store, "bot")
            for conversation, fail in (("old", True), ("crashed", False)):
                with store.turns.start(
                    "bot", template="ask", arguments=[], conversation=conversation
                ):
                    if fail:
                        store.turns.fail("bot", "boom", conversation=conversation)
            commit_writes(store, "bot")  # 4
            with store.turns.start("bot", template="ask", arguments=[]):
                store.turns.fail("bot", "the last one")

            def left() -> list[str]:
                return [h.conversation for h in store.handoffs()]

            assert left() == ["crashed", "default", "old"]
            result = store.prune(keep_versions=2)  # handoffs from version 3 stay
            assert (result.versions, result.handoffs) == (2, 0)
            assert left() == ["crashed", "default", "old"]
            result = store.prune(keep_versions=1)  # ... not any more
            assert (result.versions, result.handoffs, left()) == (1, 2, ["default"])
            result = store.prune(keep_versions=1, older_than=datetime.timedelta(days=1))
            assert (result.handoffs, left()) == (0, ["default"])
            result = store.prune(older_than=datetime.timedelta(0))
            assert (result.agents, result.handoffs, left()) == (("bot",), 1, [])

    def test_a_first_turn_that_never_committed(self, store_url: str) -> None:
        """An agent with a failed first turn and nothing else goes with older_than, from
        prune() of every agent and prune of that agent, and stays with keep_versions."""
        with Store(store_url) as store:
            for agent in ("new-1", "new-2"):
                with store.turns.start(agent, template="ask", arguments=[]):
                    store.turns.fail(agent, "boom")
            assert store.prune(keep_versions=1).handoffs == 0
            result = store.prune(older_than=datetime.timedelta(0))
            assert (result.agents, result.handoffs) == (("new-1", "new-2"), 2)
            with store.turns.start("new-1", template="ask", arguments=[]):
                store.turns.fail("new-1", "boom")
            assert store.prune("new-1", older_than=datetime.timedelta(0)).handoffs == 1
            assert store.handoffs() == []
            with pytest.raises(NotFoundError):
                store.prune("new-1", older_than=datetime.timedelta(0))

    def test_a_running_first_turn_is_skipped(self, store_url: str) -> None:
        """The handoff of a first turn that is running stays: its agent is skipped."""
        with Store(store_url) as store, store.turns.start("new", template="ask", arguments=[]):
            with Store(store_url) as other:
                result = other.prune(older_than=datetime.timedelta(0))
            assert (result.skipped, len(store.handoffs())) == (("new",), 1)
