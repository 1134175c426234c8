"""PostgreSQL when the server misbehaves: restarts, freezes, cut connections, refusals.

Each test runs on a cluster of its own module (``pg_faults.FaultyServer``), since
it restarts, freezes or limits it. The loops are sampled here; ``make
pg-faults`` (EFFECTFUL_DURABLE_PG_FAULTS=full) runs them in full: the worker and
runner loops with 12 restarts each, 50 ambiguous commits.

What each test proves is DESIGN.md's promise 8: a turn in flight fails cleanly,
the next one after the server is back succeeds, every alarm and event is
delivered once and in order, a frozen server becomes an error within a timeout,
and a commit whose answer was lost is resolved, never retried blindly.
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from paths import PROGRAMS

pytest.importorskip("psycopg")

import psycopg
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from pg_faults import CUTS, RESTARTS, CuttingProxy, FaultyServer
from pg_faults_app import Noter, answer, handlers
from postgres_server import running

from effectful_durable import (
    CommitUnknownError,
    DatabaseAccessError,
    DatabaseUnavailableError,
    PersistenceHandler,
    Store,
)
from effectful_durable.store.parts.alarms import Schedule
from effectful_durable.testing import FakeLLM

pytestmark = pytest.mark.slow

FULL = os.environ.get("EFFECTFUL_DURABLE_PG_FAULTS") == "full"
WORKER = PROGRAMS / "pg_worker_child.py"


@pytest.fixture(scope="module")
def server() -> Iterator[FaultyServer]:
    """A cluster of this module's own (it is restarted, frozen and limited)."""
    with running(FaultyServer) as faulty:
        yield faulty


@pytest.fixture
def url(server: FaultyServer) -> Iterator[str]:
    made = server.new_database()
    yield made
    server.thaw()
    server.drop_database(made)


def note(agent: Noter, text: str) -> None:
    agent.ask(f"Note {text}")


class Turns:
    """Noters' turns in this thread, on one PersistenceHandler."""

    def __init__(self, url: str, **options: Any) -> None:
        self.persistence = PersistenceHandler(url, **options)

    def __enter__(self) -> Turns:
        self._stack = [handler(h) for h in [*handlers(), self.persistence]]
        for entered in self._stack:
            entered.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for entered in reversed(self._stack):
            entered.__exit__(None, None, None)
        self.persistence.close()


# -- restarts -------------------------------------------------------------------------


class TestRestarts:
    @pytest.mark.parametrize("how", RESTARTS)
    def test_no_turn_fails_once_the_server_is_back(
        self, server: FaultyServer, url: str, how: str
    ) -> None:
        """After a restart (fast, immediate, the postmaster killed), every turn works:
        the connections the restart ended are found out before a turn uses them."""
        with Turns(url) as turns:
            agents = [Noter(agent_id=f"a{n}") for n in range(3)]
            for agent in agents:
                note(agent, "before")
            server.restart_as(how)
            time.sleep(0.5)  # what the old sessions were sent has arrived
            for agent in agents:
                note(agent, "after")  # on a pooled connection the restart ended
            note(agents[0], "again")
            store = turns.persistence.store
            assert [store.state(a.agent_id)["notes"] for a in agents] == [
                ["before", "after", "again"],
                ["before", "after"],
                ["before", "after"],
            ]

    def test_a_turn_started_while_the_server_is_down_waits_for_it(
        self, server: FaultyServer, url: str
    ) -> None:
        """A turn started while the server is down waits for it (up to
        statement_timeout) and commits once it is back."""
        with Turns(url, statement_timeout=10.0) as turns:
            agent = Noter(agent_id="patient")
            note(agent, "before")
            server.down()
            restart = threading.Timer(1.5, server.up)
            restart.start()
            try:
                started = time.monotonic()
                note(agent, "during")
                assert time.monotonic() - started >= 1.0
            finally:
                restart.join()
            assert turns.persistence.store.state("patient")["notes"] == ["before", "during"]

    def test_a_worker_survives_restarts(self, server: FaultyServer, url: str, tmp_path: Path):
        """4 agents turn in threads while the server restarts (every kind, at random
        moments): only turns in flight at a restart fail, none once the server
        accepts connections; what committed is what was reported, once; after a
        failure the agent in memory is at its last commit; nothing is printed."""
        restarts = 12 if FULL else 3
        out = tmp_path / "outcomes.jsonl"
        child = subprocess.Popen(
            [sys.executable, str(WORKER), url, "4", str(out)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        windows = []
        try:
            assert child.stdout is not None and child.stdout.readline() == "started\n"
            kinds = [RESTARTS[n % len(RESTARTS)] for n in range(restarts)]
            random.shuffle(kinds)
            for how in kinds:
                time.sleep(random.uniform(0.5, 1.5))
                down = time.time()
                server.restart_as(how)
                windows.append((down, time.time()))
            time.sleep(3.0)
        finally:
            _, stderr = child.communicate("stop\n", timeout=120)
        assert child.returncode == 0, stderr
        assert stderr == "", stderr  # no logging configured: a survived restart prints nothing
        records = [json.loads(line) for line in out.read_text().splitlines()]
        failed = [r for r in records if not r["ok"]]
        for record in failed:
            # in flight during a restart: started before the server was back
            assert any(record["start"] <= up and record["end"] >= down for down, up in windows), (
                record
            )
            assert record["error"] in ("DatabaseUnavailableError", "CommitUnknownError"), record
        with Store(url) as store:
            for agent in ("w0", "w1", "w2", "w3"):
                reported = [r["note"] for r in records if r["agent"] == agent and r["ok"]]
                assert reported, agent
                assert store.state(agent)["notes"] == reported  # in order, once each
            for record in failed:
                version = record["version"]
                state = store.state(record["agent"], version) if version else {"notes": []}
                assert state["notes"] == record["notes"], record
        last_up = windows[-1][1]
        for agent in ("w0", "w1", "w2", "w3"):  # each carried on after the last restart
            assert any(r["ok"] and r["start"] > last_up for r in records if r["agent"] == agent)
        print(
            f"worker: {restarts} restarts ({', '.join(kinds)}), "
            f"{len(records) - len(failed)} turns committed, {len(failed)} failed in flight "
            f"({sum(r['error'] == 'CommitUnknownError' for r in failed)} unknown commits)"
        )


# -- the runner -----------------------------------------------------------------------


def start_runner(url: str, config: Path, concurrency: int, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "effectful_durable",
            "run",
            url,
            "--agents",
            "pg_faults_app:make_agent",
            "--handlers",
            "pg_faults_app:make_handlers",
            "--config",
            str(config),
            "--concurrency",
            str(concurrency),
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class Log:
    """A child's stderr, read line by line as it comes."""

    def __init__(self, child: subprocess.Popen[str]) -> None:
        self.child = child
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.child.stderr is not None
        for line in self.child.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while not any(text in line for line in self.lines):
            if time.monotonic() > deadline or self.child.poll() is not None:
                raise AssertionError(f"no {text!r} in:\n{''.join(self.lines)}")
            time.sleep(0.05)

    def read(self, timeout: float = 60.0) -> str:
        """Everything, once the child has ended."""
        self.child.wait(timeout=timeout)
        self._reader.join(timeout=5)
        return "".join(self.lines)


def write_config(path: Path, **runner: object) -> Path:
    lines = ["[runner]"] + [f"{key} = {value!r}" for key, value in runner.items()]
    path.write_text("\n".join(lines).replace("'", '"') + "\n")
    return path


class TestRunner:
    @pytest.mark.parametrize("concurrency", [1, 4] if FULL else [4])
    def test_every_alarm_and_event_once_in_order_through_restarts(
        self, server: FaultyServer, url: str, tmp_path: Path, concurrency: int
    ) -> None:
        """``run`` delivers 4 agents' alarms and events while the server restarts:
        each exactly once, per agent in due order, none started later than
        poll_interval (and a second of slack) after the server is back, no attempt
        counted for an outage, and no traceback in the log."""
        restarts = 12 if FULL else 3
        poll = 0.2
        config = write_config(tmp_path / "runner.toml", poll_interval=poll, grace_seconds=5)
        agents = [f"r{n}" for n in range(4)]
        runner = start_runner(url, config, concurrency)
        log = Log(runner)
        windows: list[tuple[float, float]] = []
        events = 0
        try:
            log.wait_for("started on")
            start = time.time() + 0.5
            spread = restarts * 1.5 + 2
            expected: dict[str, list[tuple[float, str]]] = {agent: [] for agent in agents}
            with Store(url) as store:  # an alarm every 2 s per agent: a turn takes ~0.1-0.5 s
                for offset, agent in enumerate(agents):
                    for n in range(int(spread / 2.0) + 1):
                        due = start + n * 2.0 + offset * 0.5 + random.uniform(0, 0.1)
                        action = f"{agent}-a{n:03d}"
                        store.schedule_alarm(agent, action, Schedule(due), now=due)
                        expected[agent].append((due, action))
            kinds = [RESTARTS[n % len(RESTARTS)] for n in range(restarts)]
            random.shuffle(kinds)
            for how in kinds:
                time.sleep(random.uniform(0.5, 1.2))
                with Store(url) as store:  # an event, due when sent
                    agent = random.choice(agents)
                    text = f"{agent}-e{events:03d}"
                    sent = store.send_event(agent, "note", text, create=True)
                    expected[agent].append((sent.sent_at.timestamp(), text))  # its due time
                    events += 1
                down = time.time()
                server.restart_as(how)
                windows.append((down, time.time()))
            deadline = time.time() + 60
            with Store(url) as store:
                while time.time() < deadline:
                    counts = store.alarm_queue.counts(time.time() + 3600)
                    if counts["pending"] == 0 and counts["events_pending"] == 0:
                        break
                    time.sleep(0.2)
        finally:
            runner.send_signal(signal.SIGTERM)
            text = log.read()
        (tmp_path / "runner.log").write_text(text)  # kept by pytest, for a failure's story
        assert runner.returncode == 0, text
        assert "Traceback" not in text, text
        assert "failed, retrying" not in text and "is dead" not in text, text
        worst = 0.0
        with Store(url) as store:
            for agent in agents:
                wanted = [text for _, text in sorted(expected[agent])]
                assert store.state(agent)["notes"] == wanted, agent
                for alarm in store.alarms(agent, include_ended=True):
                    assert (alarm.status, alarm.deliveries) == ("done", 1), alarm
                late, which = lateness(store, agent, expected[agent], windows, text, concurrency)
                assert late <= poll + 1.0, (which, windows, str(tmp_path / "runner.log"))
                worst = max(worst, late)
        delivered = sum(len(wanted) for wanted in expected.values())
        print(
            f"runner --concurrency {concurrency}: {restarts} restarts, {delivered} alarms and "
            f"events delivered once each, in order; {text.count('the database failed;')} "
            f"outages met; longest wait for a start with the server up and a turn free: "
            f"{worst:.2f} s"
        )

    def test_sigterm_while_the_server_is_frozen(
        self, server: FaultyServer, url: str, tmp_path: Path
    ) -> None:
        """SIGTERM during a freeze: ``run`` exits within grace + 5 s, after saying
        what it waits for."""
        grace, timeout = 3, 2
        config = write_config(
            tmp_path / "runner.toml", poll_interval=0.2, grace_seconds=grace,
            statement_timeout=timeout,
        )  # fmt: skip
        with Store(url) as store:
            store.schedule_alarm("f", "f-first", Schedule(time.time()))
        runner = start_runner(url, config, 1)
        try:
            with Store(url) as store:
                deadline = time.time() + 30
                while store.alarm_queue.counts(time.time())["pending"] and time.time() < deadline:
                    time.sleep(0.1)
                # Due during the freeze: the runner's look at the database meets it.
                store.schedule_alarm("f", "f-second", Schedule(time.time() + 1.0))
            server.freeze()
            time.sleep(1.0 + timeout + 2.0)
            stopped = time.monotonic()
            runner.send_signal(signal.SIGTERM)
            _, log = runner.communicate(timeout=grace + 30)
            took = time.monotonic() - stopped
        finally:
            server.thaw()
            if runner.poll() is None:
                runner.kill()
        assert runner.returncode == 0, log
        assert took <= grace + 5, (took, log)
        assert "did not answer within" in log, log
        assert "Traceback" not in log, log


def lateness(
    store: Store,
    agent: str,
    expected: list[tuple[float, str]],
    windows: list[tuple[float, float]],
    log: str,
    concurrency: int,
) -> tuple[float, str]:
    """How long, at worst, one of the agent's alarms and events waited for the start
    of its delivery (the one that ended done) while it could have started, and
    which: from its time (when it was due, once the agent's previous delivery
    committed), the time the server was up and the runner had a turn free."""
    committed = {v.version: v.committed_at.timestamp() for v in store.versions(agent)}
    ids, done = {}, {}
    for alarm in store.alarms(agent, include_ended=True):
        ids[alarm.alarm_id], done[alarm.action] = alarm.action, committed[alarm.ended_in or 0]
    for event in store.events(agent, include_delivered=True):
        ids[event.event_id], done[event.payload] = (
            event.payload,
            committed[event.delivered_in or 0],
        )
    turns = in_flight(log)
    started = {ids[item]: start for item, start, _ in turns if item in ids}  # the last
    worst, previous = (0.0, ""), 0.0
    for due, action in sorted(expected):
        ready = max(due, previous)
        waited = 0.0
        for step in range(int((started[action] - ready) / 0.01)):
            moment = ready + step * 0.01
            up = not any(down <= moment <= back for down, back in windows)
            free = sum(start <= moment < end for _, start, end in turns) < concurrency
            waited += 0.01 if up and free else 0.0
        if waited > worst[0]:
            worst = (waited, f"{action}: ready {ready:.2f}, started {started[action]:.2f}")
        previous = done[action]
    return worst


def in_flight(log: str) -> list[tuple[str, float, float]]:
    """Each delivery the runner's log tells of: what, when it started, when it ended."""
    turns, running = [], {}
    for when, what, item in EVENTS.findall(log):
        moment = datetime.strptime(when, "%Y-%m-%d %H:%M:%S,%f").timestamp()
        if what == "delivering":
            running[item] = moment
        elif item in running:
            turns.append((item, running.pop(item), moment))
    turns += [(item, start, float("inf")) for item, start in running.items()]
    return sorted(turns, key=lambda turn: turn[1])


EVENTS = re.compile(
    r"^(\S+ \S+) \S+ effectful_durable\.runner: "
    r"(delivering|delivered|the database failed during the delivery of) (?:alarm|event) (\S+)",
    re.M,
)


# -- a frozen server -------------------------------------------------------------------


class TestFrozenServer:
    def test_a_turn_fails_within_the_timeout_and_the_next_works(
        self, server: FaultyServer, url: str
    ) -> None:
        """A turn meeting a frozen server fails within statement_timeout (+1 s), saying
        so; the agent in memory is at its last commit; after SIGCONT a turn works."""
        with Turns(url, statement_timeout=1.0) as turns:
            agent = Noter(agent_id="frozen")
            note(agent, "one")
            server.freeze()
            try:
                started = time.monotonic()
                with pytest.raises(DatabaseUnavailableError, match="did not answer within"):
                    note(agent, "two")
                took = time.monotonic() - started
            finally:
                server.thaw()
            assert took < 1.0 + 1.0 + 1.5, took  # the deadline, its margin, the turn
            assert agent.notes == ["one"]
            note(agent, "three")
            assert turns.persistence.store.state("frozen")["notes"] == ["one", "three"]


# -- a commit whose answer was lost ---------------------------------------------------


class TestAmbiguousCommit:
    def test_each_turn_commits_once_wherever_the_commit_is_cut(
        self, server: FaultyServer, url: str
    ) -> None:
        """A proxy cuts the connection around a turn's commit (before it is sent, just
        after, a moment after, or once answered): a turn reported committed is there
        and the agent in memory at its version; one reported failed is not there, and
        doing it again adds it once."""
        proxy = CuttingProxy(server)
        cuts = 50 if FULL else 12
        try:
            with Turns(proxy.url(url)) as turns:
                agent = Noter(agent_id="cut")
                reported, retried = [], 0
                for n in range(cuts):
                    text = f"n{n:03d}"
                    proxy.arm(random.choice(CUTS))
                    try:
                        note(agent, text)
                    except DatabaseUnavailableError as error:
                        assert "did not commit" in str(error) or "found that" in str(error)
                        assert text not in agent.notes
                        note(agent, text)  # the retry the error invites
                        retried += 1
                    assert proxy.wait_cut(), "the commit was not cut"
                    reported.append(text)
                    assert agent.notes == reported
                store = turns.persistence.store
                assert store.state("cut")["notes"] == reported
                assert agent.__durable__.version == store.versions("cut")[-1].version
        finally:
            proxy.close()
        assert proxy.cuts == cuts
        print(f"ambiguous commits: {cuts} cut, {retried} reported not committed and retried")

    def test_a_turn_start_whose_answer_was_lost(self, server: FaultyServer, url: str) -> None:
        """The start of a turn (the agent's hold and its handoff row, one statement)
        cut once answered is tried again; the row it wrote is the turn's own, and
        the model is not told of a turn that did not complete."""
        proxy = CuttingProxy(server)
        llm = FakeLLM(respond=answer)
        persistence = PersistenceHandler(proxy.url(url))
        try:
            with (
                handler(LiteLLMProvider(model="fake")),
                handler(llm),
                handler(persistence),
            ):
                agent = Noter(agent_id="started")
                note(agent, "one")
                proxy.arm("answered", holding=b"effectful_durable_take")
                note(agent, "two")
                assert proxy.wait_cut(0)
            assert persistence.store.state("started")["notes"] == ["one", "two"]
            assert persistence.store.handoffs() == []
            told = [m["content"] for m in llm.calls[-1].messages if m["role"] == "system"]
            assert not any("did not complete" in str(text) for text in told)
        finally:
            persistence.close()
            proxy.close()

    @pytest.mark.parametrize("cut", ["before", "answered"])
    def test_a_commit_that_cannot_be_looked_up(
        self, server: FaultyServer, url: str, cut: str
    ) -> None:
        """When the server cannot be reached to look the commit up, the turn raises
        CommitUnknownError; the agent's next turn goes on from the database:
        from the commit if it landed, and without it if not."""
        proxy = CuttingProxy(server)
        try:
            with Turns(proxy.url(url), statement_timeout=1.0) as turns:
                agent = Noter(agent_id="unknown")
                note(agent, "one")
                proxy.arm(cut, then_refuse=True)
                with pytest.raises(CommitUnknownError) as raised:
                    note(agent, "two")
                assert raised.value.agent_id == "unknown" and raised.value.version == 2
                assert agent.notes == ["one"]  # its last known commit
                proxy.allow()
                note(agent, "three")
                landed = ["two"] if cut == "answered" else []
                assert agent.notes == ["one", *landed, "three"]
                assert turns.persistence.store.state("unknown")["notes"] == agent.notes
        finally:
            proxy.close()


# -- refusals --------------------------------------------------------------------------


class TestRefusals:
    def test_a_role_limited_to_one_connection(self, server: FaultyServer, url: str) -> None:
        """A role with CONNECTION LIMIT 1: a turn fails in one line that says a process
        needs at least 2 connections."""
        server.admin("CREATE ROLE single LOGIN CONNECTION LIMIT 1")
        try:
            database = url.rsplit("/", 1)[1]
            server.admin(f'ALTER DATABASE "{database}" OWNER TO single')
            single = server.url(database, user="single")
            with Turns(single, statement_timeout=1.0):
                with pytest.raises(DatabaseUnavailableError) as raised:
                    note(Noter(agent_id="one"), "x")
            message = str(raised.value)
            assert "too many connections for role" in message
            assert "at least 2 connections" in message and "\n" not in message
        finally:
            server.drop_database(url)  # with the tables single owns
            server.admin("DROP ROLE single")

    def test_a_server_out_of_connections(self, server: FaultyServer, url: str) -> None:
        """Every slot taken (max_connections): opening waits, then fails in one line
        that says how many connections a process needs."""
        taken = []
        try:
            while True:
                try:
                    taken.append(psycopg.connect(url))
                except psycopg.OperationalError:
                    break
            started = time.monotonic()
            with pytest.raises(DatabaseUnavailableError) as raised:
                Store(url, wait_for_database=1.0)
            assert time.monotonic() - started < 5
        finally:
            for conn in taken:
                conn.close()
        message = str(raised.value)
        assert "too many" in message and "at least 2 connections" in message
        assert "\n" not in message

    def test_no_create_privilege(self, server: FaultyServer, url: str, tmp_path: Path) -> None:
        """A role that may not create tables in schema public (PostgreSQL 15's default)
        gets one line naming the GRANT, from Store and from ``run``."""
        server.admin("CREATE ROLE plain LOGIN")
        try:
            plain = server.url(url.rsplit("/", 1)[1], user="plain")
            with pytest.raises(DatabaseAccessError, match="GRANT CREATE ON SCHEMA") as raised:
                Store(plain)
            assert raised.value.problem == "not-permitted"
            runner = start_runner(plain, write_config(tmp_path / "r.toml"), 1)
            _, log = runner.communicate(timeout=60)
            assert runner.returncode == 1
            (line,) = log.strip().splitlines()
            assert line.startswith("effectful-durable: error:") and "GRANT CREATE" in line
        finally:
            server.admin("DROP ROLE plain")
