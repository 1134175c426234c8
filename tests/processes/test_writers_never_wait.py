"""Promise 10 on PostgreSQL: no transaction that writes takes a lock shared with anything
outside its database, and readers find new work by polling.

A transaction that sent a NOTIFY takes, at commit, one lock for the whole server
(async.c, ``PreCommit_Notify``), held until its commit record is flushed and, with
a synchronous standby, acknowledged. Here another database of the same server
holds it: its session wrote, notified and commits towards a standby that never
answers. Our turns, a runner's start and an event's delivery must not notice.
"""

import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from alarms_app import in_threads
from effectful.ops.semantics import handler
from helpers import commit_message
from pg_faults_app import handlers, make_agent, make_handlers
from postgres_server import PostgresServer, running
from ui_server import ROOT, serving

from effectful_durable import AgentRunner, DatabaseBusyError, PersistenceHandler, Store
from effectful_durable.store.parts.alarms import make_schedule

#: The channels the schema-9 triggers notified: pages and runners listened on them.
OLD_CHANNELS = ("effectful_durable_commits", "effectful_durable_alarms")
#: The lock PreCommit_Notify takes: pg_database's object 0, in no database.
NOTIFY_LOCK = """
    SELECT pid FROM pg_locks
     WHERE locktype = 'object' AND database = 0 AND objid = 0
       AND classid = 'pg_database'::regclass AND mode = 'AccessExclusiveLock' AND granted
"""


@pytest.fixture(scope="module")
def own_server() -> Iterator[PostgresServer]:
    """A cluster of this module's own: it is given a synchronous standby that never
    answers, which no other test may meet."""
    with running(PostgresServer) as server:
        yield server


class NotifyLockHolder:
    """A session of another database that wrote, notified, and waits in COMMIT for a
    synchronous standby that is not there, holding the server's NOTIFY lock."""

    def __init__(self, server: PostgresServer) -> None:
        self.server = server
        self.url = server.new_database()
        self.pid: int | None = None
        self._thread = threading.Thread(target=self._commit, daemon=True)

    def __enter__(self) -> "NotifyLockHolder":
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE t (x int)")
        self.server.admin("ALTER SYSTEM SET synchronous_standby_names = 'ghost'")
        self.server.admin("SELECT pg_reload_conf()")
        self._thread.start()
        deadline = time.monotonic() + 30
        while self.holder() is None:
            assert time.monotonic() < deadline, "the other database never took the lock"
            time.sleep(0.05)
        return self

    def _commit(self) -> None:
        with psycopg.connect(self.url) as conn:
            self.pid = conn.info.backend_pid
            conn.execute("INSERT INTO t VALUES (1)")
            conn.execute("NOTIFY elsewhere")
            conn.commit()  # waits for the standby until cancelled

    def holder(self) -> int | None:
        with psycopg.connect(self.server.url(), autocommit=True) as conn:
            row = conn.execute(NOTIFY_LOCK).fetchone()
        return None if row is None else int(row[0])

    def __exit__(self, *exc: object) -> None:
        self.server.admin("ALTER SYSTEM RESET synchronous_standby_names")
        self.server.admin("SELECT pg_reload_conf()")
        if self.pid is not None:
            self.server.admin(f"SELECT pg_cancel_backend({self.pid})")
        self._thread.join(timeout=30)
        self.server.drop_database(self.url)


@pytest.fixture
def ours(own_server: PostgresServer) -> Iterator[str]:
    """Our database on that server, whose commits need no standby (as another
    database's settings may say of it)."""
    url = own_server.new_database()
    name = urllib.parse.urlsplit(url).path.lstrip("/")
    own_server.admin(f'ALTER DATABASE "{name}" SET synchronous_commit = local')
    yield url
    own_server.drop_database(url)


def turns(url: str, agent_id: str, count: int) -> list[float]:
    """Seconds each of ``count`` turns of a Noter took, through the handler stack."""
    seconds = []
    persistence = PersistenceHandler(url)
    model, fake = handlers()
    try:
        with handler(model), handler(fake), handler(persistence):
            noter = make_agent(agent_id)
            for i in range(count):
                started = time.monotonic()
                noter.ask(f"Note {i}")
                seconds.append(time.monotonic() - started)
    finally:
        persistence.close()
    return seconds


class TestNothingNotifies:
    """No write of ours sends a notification, on any channel."""

    def test_writes_of_every_kind_notify_nobody(self, postgres_url: str) -> None:
        """Turns, alarms scheduled, claimed, released and re-armed, events, a rollback,
        a fork, a deletion and a runner's status: a session listening on the channels
        the old triggers used hears nothing, and no trigger but the commit's fence is left."""
        with psycopg.connect(postgres_url, autocommit=True) as listener:
            for channel in OLD_CHANNELS:
                listener.execute(f"LISTEN {channel}")
            turns(postgres_url, "a", 2)
            with Store(postgres_url) as store:
                alarm = store.schedule_alarm("a", "later", make_schedule(time.time(), delay=0))
                queue = store.alarm_queue
                claim = queue.claim("r", time.time() + 1, 30)
                assert claim is not None and queue.release(claim, time.time())
                store.cancel_alarm(alarm)
                store.send_event("a", "ping", {"n": 1})
                store.rollback("a", 1)
                store.fork("a", None, "b")
                store.delete("b")
                queue.record_status("r", state="running", started_at=time.time(), report={})
            with psycopg.connect(postgres_url) as conn:
                found = conn.execute("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal")
                assert found.fetchall() == [("agents_fenced",)]  # a turn's last fence
            listener.execute("SELECT pg_notify('effectful_durable_commits', 'mark')")
            heard = [n.payload for n in listener.notifies(timeout=10, stop_after=1)]
            assert heard == ["mark"]


class TestAnotherDatabaseHoldsTheNotifyLock:
    """While another database's commit holds the server's NOTIFY lock, we go on."""

    def test_the_lock_is_real(self, own_server: PostgresServer, ours: str) -> None:
        """A notifying commit of ours would wait for it (lock_timeout ends the wait):
        the other tests of this class meet a real holder."""
        with NotifyLockHolder(own_server), psycopg.connect(ours) as conn:
            conn.execute("SET lock_timeout = '500ms'")
            conn.execute("CREATE TABLE t (x int)")
            conn.execute("NOTIFY here")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                conn.commit()

    def test_turns_commit_at_their_usual_speed(
        self, own_server: PostgresServer, ours: str
    ) -> None:
        """Turns through the handler stack take as long as before the holder came,
        far from the 5 s a turn waited for it (DatabaseBusyError) before schema 10."""
        before = turns(ours, "bot", 5)
        with NotifyLockHolder(own_server) as holder:
            during = turns(ours, "bot", 10)
            assert holder.holder() is not None  # still held: it was there throughout
        assert max(during) < 2.0 + 3 * max(before), (before, during)
        with Store(ours) as store:
            assert versions(store)["bot"] == 15

    def test_a_runner_starts_and_delivers_an_event_within_5_s(
        self, own_server: PostgresServer, ours: str
    ) -> None:
        """A runner started while the lock is held records its status, and delivers an
        event sent then, within 5 s of the send."""
        with NotifyLockHolder(own_server):
            runner = AgentRunner(ours, agents=make_agent, handlers=make_handlers)
            with in_threads(runner), Store(ours) as store:
                sent = time.monotonic()
                store.send_event("k", "ping", "hello", create=True)
                while versions(store).get("k", 0) < 1 and time.monotonic() - sent < 30:
                    time.sleep(0.02)
                delivered = time.monotonic() - sent
                assert [s["state"] for s in store.runner_statuses()] == ["running"]
        assert delivered < 5.0


class TestTheRealWait:
    """A commit that waited for a lock held outside this database says which."""

    def test_a_notifying_trigger_of_the_users_names_the_notify_lock(
        self, own_server: PostgresServer, ours: str
    ) -> None:
        """With a NOTIFY trigger of the user's own on ``agents``, a turn's commit waits
        for the other database's holder: DatabaseBusyError names the NOTIFY lock and
        the database and backend that hold it, not "another writer"."""
        Store(ours).close()  # our tables
        with psycopg.connect(ours, autocommit=True) as conn:
            conn.execute(
                "CREATE FUNCTION mine() RETURNS trigger LANGUAGE plpgsql AS"
                " $$ BEGIN PERFORM pg_notify('mine', ''); RETURN NULL; END $$"
            )
            conn.execute(
                "CREATE TRIGGER mine AFTER INSERT OR UPDATE ON agents"
                " FOR EACH STATEMENT EXECUTE FUNCTION mine()"
            )
        with NotifyLockHolder(own_server) as holder, Store(ours, busy_timeout=1) as store:
            with pytest.raises(DatabaseBusyError) as raised:
                commit_message(store, "mine", "blocked")
        assert raised.value.waited_for is not None
        assert "NOTIFY lock" in str(raised.value), raised.value
        other = urllib.parse.urlsplit(holder.url).path.lstrip("/")
        assert f"database {other!r}" in str(raised.value), raised.value
        assert "another writer" not in str(raised.value)
        with Store(ours) as store:
            assert "mine" not in versions(store)  # nothing of it was written


class TestOurOwnWait:
    """A commit that waited for a lock of this database says which, and blames nothing else."""

    def test_a_table_lock_is_named_not_the_notify_lock(self, postgres_url: str) -> None:
        """While another session holds ``LOCK TABLE versions IN SHARE MODE`` (what a
        plain CREATE INDEX takes), a turn's batched commit fails after busy_timeout
        with DatabaseBusyError naming that lock, its table and its holder: the
        server's NOTIFY lock is not blamed, for no session holds or waits for it."""
        with Store(postgres_url, busy_timeout=1) as store:
            commit_message(store, "bot", "one")
            with psycopg.connect(postgres_url, application_name="index builder") as holder:
                holder.execute("LOCK TABLE versions IN SHARE MODE")
                pid = holder.info.backend_pid
                with pytest.raises(DatabaseBusyError) as raised:
                    commit_message(store, "bot", "two")
            message = str(raised.value)
            assert "NOTIFY" not in message, message
            assert "SHARE lock on table versions" in message, message
            assert f"backend {pid}" in message, message
            assert "'index builder'" in message, message
            assert commit_message(store, "bot", "two") == 2


def versions(store: Store) -> dict[str, int]:
    """Each agent's committed version."""
    return {agent.agent_id: agent.version for agent in store.agents()}


#: A child committing one turn of agent ``w`` through the Store alone, then
#: printing the wall-clock time of its commit.
WRITER = """
import sys, time
from effectful_durable import Store
from effectful_durable.store.history import HistoryChange
with Store(sys.argv[1]) as store:
    with store.turns.start("w", template="t", arguments={}) as start:
        message = {"id": f"m{start.version}", "role": "user", "content": "news"}
        change = HistoryChange([(float(start.version), message)], [], 0)
        base = start.version
        store.turns.commit("w", base_version=base, template="t", change=change, state=None)
    print(time.time(), flush=True)
"""


class TestPageLive:
    """An open page hears of another process's commit within a second, by polling."""

    def test_a_commit_reaches_an_open_page_within_a_second(self, postgres_url: str) -> None:
        """The page's live stream announces a turn committed by another process less
        than a second after its commit, three times in a row."""
        with Store(postgres_url) as store:
            commit_message(store, "w", "first")
        lags: list[float] = []
        with serving(postgres_url) as server, server.client() as client:
            for _ in range(3):
                heard: list[float] = []
                reader = threading.Thread(target=first_event, args=(client, heard))
                reader.start()
                time.sleep(1.0)  # the stream is open
                child = subprocess.run(
                    [sys.executable, "-c", WRITER, postgres_url],
                    capture_output=True,
                    text=True,
                    cwd=ROOT,
                    timeout=120,
                    check=True,
                )
                reader.join(timeout=30)
                assert heard, "no commit event within 30 s"
                lags.append(heard[0] - float(child.stdout.split()[-1]))
        assert max(lags) < 1.0, lags


def first_event(client: Any, heard: list[float]) -> None:
    """Read the page's live stream until its first commit event; note when it came."""
    with client.stream("GET", "/-/live", timeout=30) as events:
        for line in events.iter_lines():
            if line == "event: commit":
                heard.append(time.time())
                return
