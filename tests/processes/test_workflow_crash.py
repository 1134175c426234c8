"""Promise 3, with real processes killed by SIGKILL, on a real SQLite file and on a
PostgreSQL database: a resumed workflow never repeats a model call for a step that
committed, and ends with the same result as an uninterrupted run.

tests/programs/workflow_child.py imports everything once and forks one real child process per
run of a 16-step workflow: a planner, two workers in parallel threads, a reviewer
with a dataclass result and a pydantic summary. Every model call is logged with its
step (template and arguments) and fsync'd before it is answered, so calls cut off by
a kill are counted too. The parent kills runs at random moments, reads the journal
and checks the database after every kill, and compares the end with an uninterrupted
run. Every test runs on both backends (the module's ``backend`` fixture).
"""

import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
import pytest
from helpers import integrity, is_postgres, persisted_rows
from paths import PROGRAMS, ROOT
from workflow_child import DIVERGED, PARTS, STEPS, WORKERS, database

from effectful_durable import Store

KILLS = 24  # at least 20, spread over the whole workflow
THREADS = len(WORKERS)  # at most this many model calls are in flight at once
DELAY_MS = 10  # per model call, so that kills land in calls, commits and between steps
SEED = 20261122
MAX_RUNS = 200  # a run loop that never finishes fails instead of hanging
SIGKILLED = f"signal {signal.SIGKILL}"


class ForkServer:
    """Drives tests/programs/workflow_child.py: one forked child process per workflow run.

    The server runs in its own process group, so that closing it also kills a
    child that a failed test left running.
    """

    def __init__(self, log: Path) -> None:
        self.log = log
        with log.open("w") as stderr:
            self.process = subprocess.Popen(
                [sys.executable, str(PROGRAMS / "workflow_child.py")],
                cwd=ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=stderr,
                text=True,
                start_new_session=True,
            )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        ready = self.next_line(90)
        assert ready == "ready threads=1", f"the fork server must be single-threaded: {ready}"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def next_line(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            tail = self.log.read_text()[-2000:]
            pytest.fail(f"the fork server said nothing for {timeout} s; its stderr:\n{tail}")

    def start(self, directory: Path, variant: str = "same", delay_ms: int = DELAY_MS) -> int:
        """Fork a child that runs the workflow once in ``directory``; return its pid."""
        assert self.process.stdin is not None
        self.process.stdin.write(f"run {directory} {variant} {delay_ms}\n")
        self.process.stdin.flush()
        line = self.next_line(30)
        assert line.startswith("pid "), line
        return int(line.removeprefix("pid "))

    def finished(self) -> bool:
        """Whether the running child has ended (its outcome is waiting to be read)."""
        return not self.lines.empty()

    def outcome(self, directory: Path) -> str:
        """``exit 0`` etc. once the child has ended and was reaped."""
        line = self.next_line(60)
        if line not in ("exit 0", SIGKILLED):
            error = directory / "error.txt"
            line += "\n" + (error.read_text() if error.exists() else "(no error.txt)")
        return line

    def run(self, directory: Path, variant: str = "same") -> str:
        self.start(directory, variant)
        return self.outcome(directory)

    def close(self) -> None:
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # the server and any child of it
        except ProcessLookupError:
            pass
        self.process.wait(10)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    forks = ForkServer(tmp_path_factory.mktemp("server") / "stderr.log")
    try:
        yield forks
    finally:
        forks.close()


# -- reading what the runs left behind ---------------------------------------------


def step_id(template: str, arguments: Any) -> str:
    """A step's identity as both the journal and the call log know it."""
    return json.dumps([template, arguments], sort_keys=True)


def events(directory: Path, kind: str = "call") -> list[dict[str, Any]]:
    """The call log's ``call`` (or ``answer``) lines, each with the step's identity."""
    log = directory / "calls.log"
    text = log.read_text() if log.exists() else ""
    # A line the child is still writing has no newline yet: it is not an event.
    found = [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]
    return [{**e, "id": step_id(*e["step"])} for e in found if e["event"] == kind]


def called(directory: Path, pid: int) -> bool:
    """Whether the run ``pid`` has sent the model a request yet."""
    return any(c["pid"] == pid for c in events(directory))


def has_tables(db: Path | str) -> bool:
    """Whether a run has made the database's tables yet."""
    if is_postgres(db):
        sql = "SELECT to_regclass('effectful_durable') IS NOT NULL"
    else:
        sql = "SELECT count(*) FROM sqlite_schema WHERE name = 'workflow_steps'"
    return bool(persisted_rows(db, sql)[0][0])


def journal(db: Path | str | None) -> list[Any]:
    """The journal's steps, through a read-only Store ([] before the first step)."""
    if db is None or not has_tables(db):
        return []
    with Store(db, readonly=True) as store:
        return store.steps("wf") if store.workflows() else []


def readable(directory: Path) -> Path | str | None:
    """The database to read after a kill, or None if the run made none yet.

    A run killed while it switched its new file to WAL leaves a hot rollback journal,
    which a read-only connection cannot roll back (apsw.ReadOnlyError). Read a copy,
    recovered by a read-write connection, so the file stays as the next run finds it.
    """
    db = database(directory)
    if isinstance(db, str):
        return db if has_tables(db) else None
    if not db.exists():
        return None
    if not (directory / "wf.db-journal").exists():
        return db
    copy = Path(tempfile.mkdtemp(dir=directory.parent, prefix="recovered-"))
    for file in directory.glob("wf.db*"):
        shutil.copy(file, copy)
    recovered = apsw.Connection(str(copy / "wf.db"))
    try:
        recovered.execute("SELECT count(*) FROM sqlite_schema").fetchall()  # rolls it back
    finally:
        recovered.close()
    return copy / "wf.db"


def done_count(directory: Path) -> int:
    """Steps done so far, read while a child may be writing (a timing hint only)."""
    db = database(directory)
    sql = "SELECT count(*) FROM workflow_steps WHERE status = 'done'"
    try:
        return int(persisted_rows(db, sql)[0][0]) if has_tables(db) else 0
    except apsw.Error:  # no file yet
        return 0


def dump(db: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, through an independent connection."""
    if is_postgres(db):
        sql = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    else:
        sql = "SELECT name FROM sqlite_schema WHERE type = 'table'"
    tables = persisted_rows(db, sql)
    return {
        name: sorted(persisted_rows(db, f'SELECT * FROM "{name}"'), key=repr) for (name,) in tables
    }


def wait_until(condition: Callable[[], bool], server: ForkServer, timeout: float = 10) -> None:
    """Poll until ``condition()`` holds or the child ends (or ``timeout`` passes)."""
    deadline = time.monotonic() + timeout
    while not condition() and not server.finished() and time.monotonic() < deadline:
        time.sleep(0.001)


def kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it finished first


def worker_of(identity: str) -> str | None:
    """The worker whose step this is (its task starts with its name), or None."""
    template, arguments = json.loads(identity)
    owner = str(arguments.get("question", "")).split(" ")[0]
    return owner if template == "ask" and owner in WORKERS else None


def phase(done: int) -> str:
    """Which part of the workflow was running, from the number of steps done."""
    if done < PARTS:
        return "plan"
    if done < PARTS + THREADS * PARTS:
        return "parallel work"
    return "review" if done < STEPS - 1 else "summary"


@dataclass
class Kill:
    """What one kill interrupted, read right after the killed child was reaped."""

    pid: int
    logged_before: int  # model calls in the log when the child died
    done: set[str]  # identities of the steps done in the journal at that moment
    hot_journal: bool  # killed while the new file was switched to WAL
    lost: list[str] = field(default_factory=list)  # its calls whose step was not done
    moment: str = ""


def examine_kill(directory: Path, pid: int) -> Kill:
    """Check the file after a kill and record what the killed run left undone."""
    db = readable(directory)
    if db is not None:
        assert integrity(db) == "ok"
    steps = journal(db)
    assert {s.status for s in steps} <= {"done", "running"}
    calls = events(directory)
    done = {step_id(s.template, s.arguments) for s in steps if s.status == "done"}
    hot_journal = isinstance(db, Path) and db.parent != directory
    record = Kill(pid, len(calls), done, hot_journal)
    record.lost = [c["id"] for c in calls if c["pid"] == pid and c["id"] not in done]
    answered = {a["id"] for a in events(directory, "answer") if a["pid"] == pid}
    if any(lost not in answered for lost in record.lost):
        record.moment = "inside a model call"
    elif record.lost:
        record.moment = "after an answer, before its commit"
    elif any(c["pid"] == pid for c in calls):
        record.moment = "between steps"
    else:
        record.moment = "before its first call (startup, replay)"
    return record


def assert_resumed_like(directory: Path, reference: dict[str, Any], kills: list[Kill]) -> None:
    """The end state of a killed-and-resumed workflow matches the uninterrupted run."""
    assert (directory / "out.json").read_text() == reference["output"]
    calls = events(directory)
    ids = [c["id"] for c in calls]
    for k in kills:
        repeated = k.done & set(ids[k.logged_before :])
        assert not repeated, f"committed steps were sent to the model again: {repeated}"
        assert len(k.lost) <= THREADS, k
    # Each step's model call is answered and committed exactly once; every other
    # call is one a kill cut off before its step committed.
    assert len(calls) == len(reference["calls"]) + sum(len(k.lost) for k in kills)
    assert len(calls) <= len(reference["calls"]) + THREADS * len(kills)
    assert Counter(ids) == Counter(reference["ids"]) + Counter(i for k in kills for i in k.lost)

    db = database(directory)
    assert integrity(db) == "ok"
    with Store(db, readonly=True) as store:
        steps = store.steps("wf")
        assert [s.status for s in steps] == ["done"] * STEPS
        assert sorted((s.key, s.template, s.arguments, s.result) for s in steps) == sorted(
            reference["journal"]
        )
        assert store.handoffs() == []
        versions = {a.agent_id: a.version for a in store.agents()}
        assert versions == reference["versions"]  # one version per step: no extra turn
        for agent_id in versions:
            history = store.history(agent_id)
            assert len({m["id"] for m in history}) == len(history), agent_id
            users = [json.dumps(m["content"]) for m in history if m["role"] == "user"]
            assert len(users) == len(set(users)), f"{agent_id} holds a message twice"
            shown = [(m["role"], m.get("content")) for m in history]
            assert shown == reference["histories"][agent_id]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> Callable[[Path], Path]:
    """Makes a run directory whose database is a new SQLite file, or a new PostgreSQL
    database (named in its ``db.url``) on the tests' server."""

    def new_run_directory(directory: Path) -> Path:
        directory.mkdir()
        if request.param == "postgres":
            url = request.getfixturevalue("postgres_server").new_database()
            (directory / "db.url").write_text(url)
        return directory

    return new_run_directory


@pytest.fixture(scope="module")
def reference(
    server: ForkServer,
    backend: Callable[[Path], Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    """An uninterrupted run on a fresh database: its output, calls, journal and agents."""
    directory = backend(tmp_path_factory.mktemp("reference") / "run")
    assert server.run(directory) == "exit 0"
    with Store(database(directory), readonly=True) as store:
        steps = store.steps("wf")
        versions = {a.agent_id: a.version for a in store.agents()}
        histories = {
            agent_id: [(m["role"], m.get("content")) for m in store.history(agent_id)]
            for agent_id in versions
        }
    calls = events(directory)
    return {
        "directory": directory,
        "output": (directory / "out.json").read_text(),
        "calls": calls,
        "ids": [c["id"] for c in calls],
        "journal": [(s.key, s.template, s.arguments, s.result) for s in steps],
        "step_ids": [step_id(s.template, s.arguments) for s in steps],
        "versions": versions,
        "histories": histories,
    }


def copy_of(reference: dict[str, Any], directory: Path, request: pytest.FixtureRequest) -> Path:
    """A finished workflow's directory and database, copied after its run ended."""
    shutil.copytree(reference["directory"], directory)
    (directory / "calls.log").unlink()
    (directory / "out.json").unlink()
    db = database(directory)
    if isinstance(db, str):
        clone = request.getfixturevalue("postgres_server").clone_database(db)
        (directory / "db.url").write_text(clone)
    return directory


@pytest.mark.slow
class TestUninterrupted:
    def test_reference_run_calls_the_model_once_per_step(self, reference: dict[str, Any]) -> None:
        """An uninterrupted run makes exactly one model call per journal step, all done."""
        assert len(reference["calls"]) == STEPS == len(reference["journal"])
        assert sorted(reference["ids"]) == sorted(reference["step_ids"])
        assert len(set(reference["ids"])) == STEPS  # so calls map to steps one to one
        assert reference["versions"] == {"planner": PARTS + 1, "reviewer": THREADS * PARTS} | {
            worker: PARTS for worker in WORKERS
        }

    def test_finished_workflow_replays_without_calls_or_writes(
        self,
        server: ForkServer,
        reference: dict[str, Any],
        tmp_path: Path,
        request: pytest.FixtureRequest,
    ) -> None:
        """Running a finished workflow again makes zero model calls, changes no row and
        gives the same output."""
        directory = copy_of(reference, tmp_path / "again", request)
        before = dump(database(directory))
        assert server.run(directory) == "exit 0"
        assert events(directory) == []
        assert (directory / "out.json").read_text() == reference["output"]
        assert dump(database(directory)) == before


@pytest.mark.slow
class TestKilledWorkflow:
    def test_random_kills_resume_to_the_same_result(
        self,
        server: ForkServer,
        reference: dict[str, Any],
        backend: Callable[[Path], Path],
        tmp_path: Path,
    ) -> None:
        """Killed 24 times at random moments and re-run each time, the workflow ends
        with the reference output, and no committed step is ever called again."""
        rng = random.Random(SEED)
        directory = backend(tmp_path / "killed")
        kills: list[Kill] = []
        for _ in range(MAX_RUNS):
            pid = server.start(directory)
            if len(kills) < KILLS:
                # Sweep the whole workflow: wait for a number of steps done that grows
                # with each kill, and half the time for the run's first model call too
                # (past its replay), then kill a random few milliseconds later.
                target = min(int((len(kills) + rng.random()) * STEPS / KILLS), STEPS - 1)
                wait_until(lambda: done_count(directory) >= target, server)  # noqa: B023
                if rng.random() < 0.5:
                    wait_until(lambda: called(directory, pid), server)  # noqa: B023
                time.sleep(rng.uniform(0, 2.5 * DELAY_MS / 1000))
                kill(pid)
            outcome = server.outcome(directory)
            assert outcome in ("exit 0", SIGKILLED), outcome
            if outcome == SIGKILLED:
                kills.append(examine_kill(directory, pid))
            elif len(kills) >= KILLS:
                break
        else:
            pytest.fail(f"no run finished after {MAX_RUNS} runs")

        assert len(kills) >= 20
        assert_resumed_like(directory, reference, kills)
        moments = Counter(k.moment for k in kills)
        phases = Counter(phase(len(k.done)) for k in kills)
        assert moments["inside a model call"] >= 1, moments
        assert {"plan", "parallel work", "review"} <= set(phases), phases
        calls = len(events(directory))
        print(
            f"\n{len(kills)} kills ({sum(k.hot_journal for k in kills)} with a hot journal),"
            f" phases {dict(phases)}, moments {dict(moments)}; model calls:"
            f" {calls} (uninterrupted {len(reference['calls'])}, bound"
            f" {len(reference['calls']) + THREADS * len(kills)})"
        )

    def test_parallel_workers_killed_mid_call_both_resume(
        self,
        server: ForkServer,
        reference: dict[str, Any],
        backend: Callable[[Path], Path],
        tmp_path: Path,
    ) -> None:
        """Killed while both parallel workers wait on the model, each worker redoes
        exactly its unfinished step, and the workflow ends as if never killed."""
        directory = backend(tmp_path / "parallel")
        kills: list[Kill] = []
        for _ in range(PARTS):

            def both_workers_waiting(pid: int) -> bool:
                """Each worker has a call in flight, for a step no earlier kill cut off."""
                answered = {a["id"] for a in events(directory, "answer") if a["pid"] == pid}
                cut_off = {i for k in kills for i in k.lost}
                waiting = {
                    worker_of(c["id"])
                    for c in events(directory)
                    if c["pid"] == pid and c["id"] not in answered | cut_off
                }
                return waiting >= set(WORKERS)

            # A slow model keeps both calls in flight long enough to kill them, though a
            # worker's first call comes after a few hundred ms of effectful's own work.
            pid = server.start(directory, delay_ms=800)
            wait_until(lambda: both_workers_waiting(pid), server)  # noqa: B023
            kill(pid)
            assert server.outcome(directory) == SIGKILLED
            kills.append(examine_kill(directory, pid))
            assert len(kills[-1].lost) == THREADS, kills[-1]
            assert kills[-1].moment == "inside a model call"
        assert server.run(directory) == "exit 0"
        assert_resumed_like(directory, reference, kills)
        # Each kill cut off one step per worker, and those were exactly the steps redone.
        assert [sorted(str(worker_of(i)) for i in k.lost) for k in kills] == [
            list(WORKERS)
        ] * PARTS
        assert len({i for k in kills for i in k.lost}) == THREADS * PARTS


@pytest.mark.slow
class TestDivergence:
    @pytest.mark.parametrize("variant", sorted(DIVERGED))
    def test_changed_step_is_refused_and_writes_nothing(
        self,
        server: ForkServer,
        reference: dict[str, Any],
        tmp_path: Path,
        request: pytest.FixtureRequest,
        variant: str,
    ) -> None:
        """A program that asks a recorded step with other arguments stops with
        WorkflowDivergedError before any model call, leaving every row as it was."""
        directory = copy_of(reference, tmp_path / variant, request)
        before = dump(database(directory))
        outcome = server.run(directory, variant)
        assert outcome.startswith("exit 3"), outcome
        error = (directory / "error.txt").read_text()
        assert error.startswith("WorkflowDivergedError")
        assert DIVERGED[variant] in error
        assert events(directory) == []
        assert dump(database(directory)) == before
        assert integrity(database(directory)) == "ok"
        # The refused run broke nothing: the real program still replays to the end.
        assert server.run(directory) == "exit 0"
        assert (directory / "out.json").read_text() == reference["output"]
        assert events(directory) == []
