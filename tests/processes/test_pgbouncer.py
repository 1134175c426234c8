"""Promise 10: everything works behind PgBouncer in transaction mode, with its defaults.

Each test reaches the database through the session's PgBouncer only
(``pooled_url``, tests/support/pgbouncer_server.py), and checks what is on disk through a
connection of its own straight to the cluster (``postgres_url``, the same
database). Transaction mode gives each transaction whichever server connection
is free: a session setting, a prepared statement or a session advisory lock
held on one does not follow the client to the next. The library then sends no
startup ``options`` (PgBouncer refuses them), sets its timeouts per transaction,
prepares no statements on the server, and holds the agents' locks on a
connection that keeps a transaction open, which PgBouncer never hands to
another client.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pgbouncer_server
import psycopg
import pytest
from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.types import NotHandled
from helpers import Assistant, commit_message, persisted, persisted_rows, running
from paths import PROGRAMS, ROOT
from pg_faults import CuttingProxy
from pgbouncer_server import PgBouncer
from postgres_server import PostgresServer
from ui_server import serving

from effectful_durable import (
    AgentInUseError,
    AgentRunner,
    DatabaseBusyError,
    DatabaseUnavailableError,
    DurableError,
    PersistenceHandler,
    PersistentAgent,
    Store,
    TurnSuspended,
    requires_approval,
)
from effectful_durable.cli import main
from effectful_durable.runner import FakeClock
from effectful_durable.store.parts.alarms import make_schedule
from effectful_durable.testing import FakeLLM, ToolCall

pytestmark = pytest.mark.slow

CHILD = str(PROGRAMS / "pgbouncer_child.py")


# -- processes ------------------------------------------------------------------------


def start(*args: str) -> subprocess.Popen[str]:
    """A tests/programs/pgbouncer_child.py process with ``args``, talking over stdin and stdout."""
    return subprocess.Popen(
        [sys.executable, CHILD, *args],
        cwd=ROOT,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


def tell(child: subprocess.Popen[str], line: str) -> None:
    assert child.stdin is not None
    child.stdin.write(line + "\n")
    child.stdin.flush()


def hear(child: subprocess.Popen[str]) -> str:
    assert child.stdout is not None
    return child.stdout.readline().strip()


def stopped(children: list[subprocess.Popen[str]]) -> None:
    for child in children:
        if child.poll() is None:
            child.kill()
        child.wait(30)


def turns_from_processes(
    url: str, direct: str, *, processes: int, threads: int, turns: int, agents: int
) -> None:
    """Run ``turns`` turns per thread, ``threads`` threads per process, over ``agents``
    shared agents, from ``processes`` processes at once through ``url``; then check,
    through ``direct``, that every turn is a version of its agent, none lost."""
    children = [
        start("turns", url, f"p{p}", str(threads), str(turns), str(agents))
        for p in range(processes)
    ]
    try:
        for child in children:  # every one imported before any starts: they overlap
            assert hear(child) == "ready"
        for child in children:
            tell(child, "go")
        outputs = [child.communicate(timeout=600)[0] for child in children]
    finally:
        stopped(children)
    for child, output in zip(children, outputs, strict=True):
        assert child.returncode == 0, output
    expected: dict[str, set[str]] = {f"agent-{n}": set() for n in range(agents)}
    for p in range(processes):
        for t in range(threads):
            for s in range(turns):
                expected[f"agent-{(t + s) % agents}"].add(f"p{p}-t{t}-{s:04d}")
    with Store(direct, readonly=True) as store:
        for agent_id, notes in expected.items():
            versions = [v.version for v in store.versions(agent_id)]
            assert versions == list(range(1, len(notes) + 1)), agent_id
            kept = store.state(agent_id)["notes"]
            assert sorted(kept) == sorted(notes), agent_id  # each turn's note, once
            users = [m for m in store.history(agent_id) if m["role"] == "user"]
            assert len(users) == len(notes)
        assert store.handoffs() == []


class TestPooler:
    """The tests' pooled URL goes through PgBouncer, as installed."""

    def test_the_pooled_url_reaches_the_pooler(
        self, pooled_url: str, pgbouncer: PgBouncer
    ) -> None:
        """The pooled URL names the pooler's socket, which refuses startup options."""
        assert os.path.exists(
            os.path.join(pgbouncer.directory, f".s.PGSQL.{pgbouncer_server.PORT}")
        )
        assert pooled_url.startswith(pgbouncer.pooled(pgbouncer.cluster.url()).rsplit("/", 1)[0])
        with pytest.raises(psycopg.OperationalError, match="unsupported startup parameter"):
            psycopg.connect(pooled_url, options="-c lock_timeout=1000")


class TestTurns:
    """Turns from many processes through the pooler all commit, and none is lost."""

    def test_turns_from_three_processes_all_commit(
        self, pooled_url: str, postgres_url: str
    ) -> None:
        """Three processes of two threads run 12 turns per thread over four shared agents
        through the pooler at once: each of the 72 turns is a version on disk."""
        turns_from_processes(pooled_url, postgres_url, processes=3, threads=2, turns=12, agents=4)


class TestAgentLock:
    """The agents' locks hold through the pooler, and go with a process that dies."""

    def test_an_agent_in_a_turn_is_refused_to_another_process(
        self, pooled_url: str, postgres_url: str
    ) -> None:
        """While a process is inside a turn of an agent, every turn of it that another
        process tries meanwhile gets AgentInUseError naming the holder, however the
        pooler deals out its server connections; the holder's turn then commits, and
        the next turn commits on top of it."""
        child = start("hold", pooled_url, "shared")
        persistence = PersistenceHandler(pooled_url)
        try:
            assert hear(child) == "in-turn"
            refused = []

            def attempts(thread: int) -> None:
                with running(FakeLLM(respond=lambda call: "parent"), persistence):
                    for n in range(10):
                        try:
                            Assistant(agent_id="shared").ask("from the parent")
                        except AgentInUseError as error:
                            refused.append(error)
                        # Another agent's turn between two tries keeps the pooler's
                        # server connections moving between its clients.
                        Assistant(agent_id=f"other-{thread}").ask(f"step {n}")

            threads = [threading.Thread(target=attempts, args=(t,)) for t in range(3)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(120)
            assert len(refused) == 30
            assert all(error.agent_id == "shared" for error in refused)
            assert f"process {child.pid} " in str(refused[0])
            tell(child, "go")
            assert hear(child) == "committed"
            assert child.wait(30) == 0
            with running(FakeLLM(["after the child"]), persistence):
                Assistant(agent_id="shared").ask("after the child")
        finally:
            stopped([child])
            persistence.close()
        with Store(postgres_url, readonly=True) as store:
            assert [v.version for v in store.versions("shared")] == [1, 2]
            contents = [m.get("content") for m in store.history("shared")]
            assert contents[-3] == "child answer" and contents[-1] == "after the child"
            for thread in range(3):
                assert [v.version for v in store.versions(f"other-{thread}")] == list(range(1, 11))

    def test_a_waiting_turn_commits_after_the_holder(
        self, pooled_url: str, postgres_url: str
    ) -> None:
        """A turn that may wait for its agent (``wait=``) waits for another process's turn
        to commit, then commits on top of it."""
        child = start("hold", pooled_url, "shared")
        try:
            assert hear(child) == "in-turn"
            threading.Timer(0.5, tell, args=(child, "go")).start()
            with persisted(pooled_url, FakeLLM(["second answer"]), wait=30):
                Assistant(agent_id="shared").ask("second")
            assert hear(child) == "committed"
        finally:
            stopped([child])
        with Store(postgres_url, readonly=True) as store:
            assert [v.version for v in store.versions("shared")] == [1, 2]
            contents = [m.get("content") for m in store.history("shared")]
            assert contents[-3] == "child answer" and contents[-1] == "second answer"

    def test_the_lock_of_a_killed_process_is_freed(
        self, pooled_url: str, postgres_url: str
    ) -> None:
        """When the process inside an agent's turn is SIGKILLed, a turn of that agent that
        was refused before the kill commits within 15 s of it, as the agent's first
        version."""
        child = start("hold", pooled_url, "shared")
        persistence = PersistenceHandler(pooled_url, wait=60)
        try:
            assert hear(child) == "in-turn"
            with Store(pooled_url) as store, pytest.raises(AgentInUseError):
                with store.agent_lock("shared"):
                    pass
            child.send_signal(signal.SIGKILL)
            child.wait(30)
            killed = time.monotonic()
            with running(FakeLLM(["after the kill"]), persistence):
                Assistant(agent_id="shared").ask("after the kill")
            waited = time.monotonic() - killed
            print(
                f"the killed holder's agent: its next turn committed {waited:.2f} s after the kill"
            )
            assert waited < 15, f"the agent was free {waited:.1f} s after the kill"
        finally:
            stopped([child])
            persistence.close()
        with Store(postgres_url, readonly=True) as store:
            assert [v.version for v in store.versions("shared")] == [1]
            assert store.history("shared")[-1]["content"] == "after the kill"


# -- approvals ---------------------------------------------------------------------------


@dataclasses.dataclass
class Till(PersistentAgent):
    """You take refunds; each one waits for a person."""

    @Tool.define
    @requires_approval(reason="a refund")
    def refund(self, order: str) -> str:
        """Refund an order."""
        return f"refunded {order}"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


REFUND = ToolCall("refund", {"order": "A-1"})


def suspended(url: str, llm: FakeLLM) -> str:
    """Run a turn of ``till`` that waits for an approval; the approval's id."""
    with persisted(url, llm), pytest.raises(TurnSuspended) as waiting:
        Till(agent_id="till").ask("refund A-1")
    (approval,) = waiting.value.approvals
    return approval.approval_id


class TestApprovals:
    """A turn waits for a decision, and resumes once, all through the pooler."""

    def test_an_approved_call_resumes_in_the_next_call(
        self, pooled_url: str, postgres_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A call approved with the command line runs once when the agent is called
        again, and the turn commits with its result."""
        llm = FakeLLM([REFUND, "refund done"])
        approval_id = suspended(pooled_url, llm)
        assert main(["approvals", pooled_url, "--json"]) == 0
        [listed] = json.loads(capsys.readouterr().out)
        assert listed["approval_id"] == approval_id
        assert main(["approve", pooled_url, approval_id, "--by", "alice"]) == 0
        assert "approved by alice" in capsys.readouterr().out
        with persisted(pooled_url, llm):
            assert Till(agent_id="till").ask("refund A-1") == "refund done"
        with Store(postgres_url, readonly=True) as store:
            assert store.approval(approval_id).decided_by == "alice"
            assert store.approvals() == []
            history = store.history("till")
            assert history[-1]["content"] == "refund done"
            assert history[-2]["content"][0]["text"] == "refunded A-1"
            assert [v.version for v in store.versions("till")] == [1, 2]

    def test_a_runner_resumes_a_denied_call(self, pooled_url: str, postgres_url: str) -> None:
        """A runner resumes a turn whose call was denied: the model reads the reason."""
        llm = FakeLLM([REFUND, "sorry"])
        approval_id = suspended(pooled_url, llm)
        clock = FakeClock(1_900_000_000.0)

        def handlers(config: Any) -> list[Any]:
            return [LiteLLMProvider(model="fake"), llm]

        with Store(pooled_url) as store:
            store.deny(approval_id, by="bob", reason="not paid yet")
            with AgentRunner(
                pooled_url, agents=lambda i: Till(agent_id=i), handlers=handlers, clock=clock
            ) as runner:
                runner.run(until=clock.now() + 2)
                assert runner.turns == 1
        with Store(postgres_url, readonly=True) as store:
            history = store.history("till")
            assert history[-1]["content"] == "sorry"
            assert "not paid yet" in json.dumps(history[-2]["content"])
            assert store.alarm_queue.counts(0.0)["resumes_pending"] == 0


# -- the runner ---------------------------------------------------------------------------


class TestRunner:
    """``effectful-durable run`` through the pooler delivers alarms and events."""

    def test_alarms_and_events_are_delivered_once_in_order(
        self, pooled_url: str, postgres_url: str, tmp_path: Path
    ) -> None:
        """Alarms and events sent before the runner starts and while it runs are each
        delivered once, in order, as turns of their agents; the runner stops cleanly."""
        agents = ["n0", "n1", "n2"]
        with Store(pooled_url) as store:
            for agent_id in agents:
                store.send_event(agent_id, "ping", f"{agent_id}-e0", create=True)
                store.schedule_alarm(
                    agent_id, f"{agent_id}-a0", make_schedule(time.time(), delay=0)
                )
        config = tmp_path / "runner.toml"
        config.write_text("[runner]\npoll_interval = 0.2\n")
        runner = subprocess.Popen(
            [
                sys.executable, "-m", "effectful_durable", "run", pooled_url,
                "--agents", "pg_faults_app:make_agent",
                "--handlers", "pg_faults_app:make_handlers",
                "--config", str(config), "--concurrency", "2",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        try:
            notes = wait_for_notes(postgres_url, agents, 2, runner)
            with Store(pooled_url) as store:
                for n in (1, 2, 3):
                    for agent_id in agents:
                        store.send_event(agent_id, "ping", f"{agent_id}-e{n}")
                        when = make_schedule(time.time(), delay=0)
                        store.schedule_alarm(agent_id, f"{agent_id}-a{n}", when)
            notes = wait_for_notes(postgres_url, agents, 8, runner)
            runner.send_signal(signal.SIGTERM)
            output, _ = runner.communicate(timeout=60)
        finally:
            stopped([runner])
        assert runner.returncode == 0, output
        for agent_id in agents:
            kept = notes[agent_id]
            events = [note for note in kept if "-e" in note]
            alarms = [note for note in kept if "-a" in note]
            assert events == [f"{agent_id}-e{n}" for n in range(4)], kept
            assert alarms == [f"{agent_id}-a{n}" for n in range(4)], kept
        with Store(postgres_url, readonly=True) as store:
            assert store.events() == [] and store.alarms() == []


def wait_for_notes(
    direct: str, agents: list[str], count: int, runner: subprocess.Popen[str]
) -> dict[str, list[str]]:
    """Each agent's notes once each has ``count``, read straight from the cluster."""
    deadline = time.monotonic() + 90
    while True:
        rows = persisted_rows(direct, "SELECT agent_id FROM agents")
        notes: dict[str, list[str]] = {}
        if len(rows) == len(agents):
            with Store(direct, readonly=True) as store:
                notes = {agent_id: store.state(agent_id)["notes"] for agent_id in agents}
            if all(len(kept) >= count for kept in notes.values()):
                return notes
        if time.monotonic() > deadline or runner.poll() is not None:
            runner.kill()
            output = runner.communicate()[0]
            raise AssertionError(f"not delivered: {notes}\n{output}")
        time.sleep(0.2)


# -- the command line and the page ---------------------------------------------------------


def two_turns(url: str) -> None:
    """Two turns of ``bot`` through ``url``."""
    with persisted(url, FakeLLM(["first answer", "second answer"])):
        bot = Assistant(agent_id="bot")
        bot.ask("first question")
        bot.ask("second question")


class TestCommandLine:
    """The command's reads and writes work through the pooler."""

    def test_reads(self, pooled_url: str, capsys: pytest.CaptureFixture[str]) -> None:
        """agents, history, versions, state, status and check read the pooled database."""
        two_turns(pooled_url)
        assert main(["agents", pooled_url, "--json"]) == 0
        [agent] = json.loads(capsys.readouterr().out)
        assert (agent["agent_id"], agent["version"]) == ("bot", 2)
        assert main(["history", pooled_url, "bot", "--json"]) == 0
        history = json.loads(capsys.readouterr().out)
        assert history[-1]["content"] == "second answer"
        assert main(["versions", pooled_url, "bot", "--json"]) == 0
        assert [v["version"] for v in json.loads(capsys.readouterr().out)] == [1, 2]
        assert main(["state", pooled_url, "bot", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["turns"] == 0
        for command in ("status", "check", "handoffs", "alarms", "events"):
            assert main([command, pooled_url]) == 0, command
        capsys.readouterr()

    def test_writes(
        self, pooled_url: str, postgres_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """rollback, fork and send-event write the pooled database."""
        two_turns(pooled_url)
        assert main(["rollback", pooled_url, "bot", "1"]) == 0
        assert main(["fork", pooled_url, "bot", "twin"]) == 0
        assert main(["send-event", pooled_url, "bot", "ping", '{"n": 1}']) == 0
        capsys.readouterr()
        with Store(postgres_url, readonly=True) as store:
            assert [v.version for v in store.versions("bot")] == [1, 2, 3]
            assert store.history("bot")[-1]["content"] == "first answer"
            assert store.history("twin")[-1]["content"] == "first answer"
            assert [event.payload for event in store.events("bot")] == [{"n": 1}]


def next_commit(client: httpx.Client, found: threading.Event) -> None:
    """Read the page's live stream until its first commit event, then set ``found``."""
    with client.stream("GET", "/-/live", timeout=60) as events:
        for line in events.iter_lines():
            if line == "event: commit":
                found.set()
                return


class TestPage:
    """``effectful-durable ui`` serves the agents through the pooler, live."""

    def test_pages_and_live_stream(self, pooled_url: str) -> None:
        """The agents and an agent's pages read the pooled database, and an open page's
        stream announces a commit made meanwhile, which the page then shows."""
        two_turns(pooled_url)
        with serving(pooled_url) as server, server.client() as client:
            assert "bot" in client.get("/").text
            assert "second answer" in client.get("/agent?id=bot").text
            assert "bot" in client.get("/versions?id=bot").text
            found = threading.Event()
            reader = threading.Thread(target=next_commit, args=(client, found))
            reader.start()
            with Store(pooled_url) as store:
                # A commit made before the stream opened is not announced: commit
                # again each second until one is.
                for n in range(30):
                    commit_message(store, "w", f"made while the page is open ({n})")
                    if found.wait(1.0):
                        break
            reader.join(timeout=60)
            assert found.is_set(), "".join(server.output)
            assert "made while the page is open (0)" in client.get("/agent?id=w").text


# -- the session's settings ------------------------------------------------------------------


@pytest.fixture(scope="module")
def ignoring(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    """A PgBouncer that drops libpq's startup options instead of refusing them
    (``ignore_startup_parameters = options``, as some deployments set it)."""
    with pgbouncer_server.running(
        postgres_server, {"ignore_startup_parameters": "options"}
    ) as bouncer:
        yield bouncer


@pytest.fixture(params=["refused", "ignored"])
def settings_url(request: pytest.FixtureRequest, postgres_url: str) -> str:
    """The test's database through a PgBouncer that refuses startup options (the
    default), then through one that ignores them: either way none reaches the server."""
    name = "pgbouncer" if request.param == "refused" else "ignoring"
    bouncer: PgBouncer = request.getfixturevalue(name)
    return bouncer.pooled(postgres_url)


class TestSettings:
    """The timeouts and the read-only mode apply through the pooler, per transaction,
    whether it refuses the startup options or ignores them."""

    def test_a_held_row_lock_is_a_busy_error_after_busy_timeout(
        self, settings_url: str, postgres_url: str
    ) -> None:
        """A turn whose commit waits for a row lock another session holds fails with
        DatabaseBusyError after busy_timeout (1 s), not after the statement timeout
        (30 s); once the lock is let go the next turn commits."""
        with persisted(settings_url, FakeLLM(["one"])):
            Assistant(agent_id="bot").ask("one")
        with psycopg.connect(postgres_url) as holder:
            holder.execute("SELECT 1 FROM agents WHERE agent_id = 'bot' FOR UPDATE")
            started = time.monotonic()
            with (
                persisted(settings_url, FakeLLM(["two"]), busy_timeout=1, statement_timeout=30),
                pytest.raises(DatabaseBusyError),
            ):
                Assistant(agent_id="bot").ask("two")
            assert time.monotonic() - started < 10
        with persisted(settings_url, FakeLLM(["three"]), busy_timeout=1):
            Assistant(agent_id="bot").ask("three")
        with Store(postgres_url, readonly=True) as store:
            assert [v.version for v in store.versions("bot")] == [1, 2]

    def test_a_statement_past_statement_timeout_is_ended_by_the_server(
        self, settings_url: str, postgres_url: str
    ) -> None:
        """A read blocked behind a table lock is ended by the server's statement timeout
        (1 s; busy_timeout is 30 s): DatabaseUnavailableError within seconds."""
        with Store(settings_url, busy_timeout=30, statement_timeout=1) as store:
            commit_message(store, "bot", "hello")
            with psycopg.connect(postgres_url) as holder:
                holder.execute("LOCK TABLE agents IN ACCESS EXCLUSIVE MODE")
                started = time.monotonic()
                with pytest.raises(DatabaseUnavailableError) as ended:
                    store.agents()
                assert time.monotonic() - started < 5
            assert "statement timeout" in str(ended.value)
            assert [a.agent_id for a in store.agents()] == ["bot"]  # and it carries on

    def test_an_agents_take_waits_for_a_row_lock_no_longer_than_busy_timeout(
        self, settings_url: str, postgres_url: str
    ) -> None:
        """Taking an agent (one statement outside a transaction, with the turn's handoff
        row) that waits for its hold's row, locked by another session, fails with
        DatabaseBusyError after busy_timeout (1 s), not at the client's deadline (6 s)."""
        with Store(settings_url, busy_timeout=1, statement_timeout=5) as store:
            commit_message(store, "bot", "before")  # its turn's hold leaves the hold's row
            with psycopg.connect(postgres_url) as holder:
                locked = holder.execute(
                    "SELECT 1 FROM agent_holds WHERE agent_id = 'bot' FOR UPDATE"
                )
                assert locked.fetchall() == [(1,)]
                started = time.monotonic()
                with pytest.raises(DatabaseBusyError), store.agent_lock("bot"):
                    pass
                assert time.monotonic() - started < 4
            commit_message(store, "bot", "after")
            with store.agent_lock("bot"):
                pass

    def test_an_agents_take_is_ended_by_the_servers_statement_timeout(
        self, settings_url: str, postgres_url: str
    ) -> None:
        """Taking an agent blocked behind a table lock is ended by the server's statement
        timeout (1 s; busy_timeout is 30 s), which says so: the statement ended there,
        not only the client's wait."""
        with Store(settings_url, busy_timeout=30, statement_timeout=1) as store:
            with store.agent_lock("bot"):
                pass
            with psycopg.connect(postgres_url) as holder:
                holder.execute("LOCK TABLE agent_holds IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(DatabaseUnavailableError) as ended, store.agent_lock("bot"):
                    pass
            assert "statement timeout" in str(ended.value), ended.value
            commit_message(store, "bot", "after")

    def test_a_read_only_store_stays_read_only(self, settings_url: str) -> None:
        """A read-only Store through the pooler cannot write, even through SQL of its own."""
        with Store(settings_url) as store:
            commit_message(store, "bot", "hello")
        with Store(settings_url, readonly=True) as store:
            with pytest.raises(DurableError, match="read-only"):
                store.send_event("bot", "ping")
            assert [a.agent_id for a in store.agents()] == ["bot"]

    def test_no_setting_stays_on_the_server_connections(self, settings_url: str) -> None:
        """After turns with short timeouts and a read-only Store's reads, every server
        connection the pooler hands a plain client has the server's defaults: the
        library's settings lasted their transactions only."""
        with persisted(settings_url, FakeLLM(["a", "b"]), busy_timeout=0.5, statement_timeout=3):
            Assistant(agent_id="bot").ask("one")
            Assistant(agent_id="bot").ask("two")
        with Store(settings_url, readonly=True) as store:
            store.agents()
            store.history("bot")
        seen = set()
        with psycopg.connect(settings_url, autocommit=True) as plain:
            for _ in range(20):
                seen.add(
                    plain.execute(
                        "SELECT current_setting('lock_timeout'),"
                        " current_setting('statement_timeout'),"
                        " current_setting('idle_in_transaction_session_timeout'),"
                        " current_setting('default_transaction_read_only')"
                    ).fetchone()
                )
        assert seen == {("0", "0", "0", "off")}


@pytest.fixture
def same_lock_timeout(ignoring: PgBouncer, postgres_url: str) -> str:
    """The test's database through the PgBouncer that ignores startup options, with the
    database's own ``lock_timeout`` set to 5 s: the default busy_timeout, as if the
    server applied our options."""
    name = urllib.parse.urlsplit(postgres_url).path.lstrip("/")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(f"ALTER DATABASE \"{name}\" SET lock_timeout = '5s'")
    return ignoring.pooled(postgres_url)


class TestDetection:
    """A pooler is told from a server by nothing that can match by chance."""

    def test_a_database_whose_lock_timeout_is_the_busy_timeout_is_seen_pooled(
        self, same_lock_timeout: str, postgres_url: str
    ) -> None:
        """Behind a PgBouncer that ignores the startup options, a database whose own
        lock_timeout is the busy_timeout (5 s) is still reached through a pooler: two
        Stores commit 30 rounds each with no prepared statement colliding, and the
        statement timeout is the server's, in force."""
        with Store(same_lock_timeout) as first, Store(same_lock_timeout) as second:
            assert (first.engine.pooled, second.engine.pooled) == (True, True)
            for n in range(30):
                commit_message(first, "first", f"round {n}")
                commit_message(second, "second", f"round {n}")
        with Store(same_lock_timeout, statement_timeout=1) as store:
            with psycopg.connect(postgres_url) as holder:
                holder.execute("LOCK TABLE agents IN ACCESS EXCLUSIVE MODE")
                with pytest.raises(DatabaseUnavailableError) as ended:
                    store.agents()
            assert "statement timeout" in str(ended.value), ended.value
        with Store(postgres_url, readonly=True) as store:
            assert {a.agent_id: a.version for a in store.agents()} == {"first": 30, "second": 30}


# -- a commit whose answer was lost ---------------------------------------------------------


@pytest.fixture(scope="module")
def adding_host(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    """A PgBouncer that adds each client's address to its ``application_name`` on the
    server (``application_name_add_host = 1``)."""
    with pgbouncer_server.running(postgres_server, {"application_name_add_host": 1}) as bouncer:
        yield bouncer


#: A deferred trigger that makes each COMMIT of a new version last 2 s on the server.
SLOW_COMMIT = """
CREATE FUNCTION slow_commit() RETURNS trigger LANGUAGE plpgsql AS
    $$ BEGIN PERFORM pg_sleep(2); RETURN NULL; END $$;
CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON versions
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION slow_commit();
"""


class TestInDoubtCommit:
    def test_a_commit_still_landing_is_waited_for_under_a_renamed_session(
        self, adding_host: PgBouncer, postgres_url: str
    ) -> None:
        """Through a PgBouncer that renames the server sessions after their clients, a
        turn whose connection is cut while its COMMIT still runs on the server is
        looked up once that COMMIT ended: found committed, once, not reported as a
        commit that did not land."""
        proxy = CuttingProxy(adding_host, port=pgbouncer_server.PORT)
        try:
            with Store(proxy.url(postgres_url)) as store:
                commit_message(store, "bot", "one")
                with psycopg.connect(postgres_url, autocommit=True) as conn:
                    conn.execute(SLOW_COMMIT)
                proxy.arm("landing")  # "after" may cut it before PgBouncer forwards it
                assert commit_message(store, "bot", "two") == 2
                assert proxy.wait_cut(0)
        finally:
            proxy.close()
        with Store(postgres_url, readonly=True) as store:
            assert [m["content"] for m in store.history("bot")] == ["one", "two"]


# -- prepared statements ---------------------------------------------------------------------

#: Our turn processes: each may pin a server connection with its agents' lock connection.
PROCESSES = 3


@pytest.fixture(scope="module")
def small_pool(postgres_server: PostgresServer) -> Iterator[PgBouncer]:
    """A PgBouncer with as few server connections per database as the turns need.

    default_pool_size is lowered from 20 (its one change to the defaults), so that
    server connections are certain to move between clients: each of the PROCESSES
    processes' lock connection may pin one, and the other two serve every pooled
    transaction of all of them. With 20, few enough turns could each find "their"
    server connection free again and hide a prepared statement left on it.
    """
    with pgbouncer_server.running(
        postgres_server, {"default_pool_size": PROCESSES + 2}
    ) as bouncer:
        yield bouncer


class TestPreparedStatements:
    """No statement is prepared on a server connection that the next transaction may miss."""

    def test_a_client_that_prepares_fails_through_this_pooler(
        self, small_pool: PgBouncer, postgres_url: str
    ) -> None:
        """The control: psycopg preparing its statements (prepare_threshold=0) fails here
        once two clients share the pooler's server connections."""
        url = small_pool.pooled(postgres_url)
        with (
            psycopg.connect(url, autocommit=True, prepare_threshold=0) as first,
            psycopg.connect(url, autocommit=True, prepare_threshold=0) as second,
            pytest.raises(psycopg.errors.DatabaseError, match="prepared statement"),
        ):
            for n in range(10):
                first.execute("SELECT %s::int + 1", (n,))
                second.execute("SELECT %s::int + 2", (n,))

    def test_many_turns_from_processes_prepare_nothing(
        self, small_pool: PgBouncer, postgres_url: str
    ) -> None:
        """Three processes of two threads run 15 turns per thread (each statement far
        more often than psycopg's prepare threshold of 5) while the pooler moves their
        transactions between its server connections: every turn commits."""
        turns_from_processes(
            small_pool.pooled(postgres_url),
            postgres_url,
            processes=PROCESSES,
            threads=2,
            turns=15,
            agents=4,
        )
