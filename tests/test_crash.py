"""Crash tests for DESIGN promise 1, with real processes killed by SIGKILL.

Promise 1: no committed turn is ever lost, and no partial turn is ever visible; kill -9
at any point leaves the database at the last committed version, and integrity_check passes.

How: ``tests/crash_child.py`` runs turns of one agent on a real SQLite file, or on a
PostgreSQL database of the tests' throwaway server (PersistenceHandler over a fake
model); each turn's tool bumps a persisted counter. The tests SIGKILL it inside a turn
just after its handoff row commits, and at random moments of a 50-turn conversation.
After each kill they read the database through connections of their own, never the
child's memory: integrity_check is ok; the versions are 1..v with no
gap and no row of a later version exists; the active history is exactly v whole turns; the
counter is v; every commit the child reported is there. Then the agent goes on from v,
its next turn is told once about the turn that was cut off, and its version records that.

Importing litellm costs a child seconds, so each child serves many turns over
stdin/stdout, and the next child starts importing while the current one runs. The
random kills stop after 5 kills; ``EFFECTFUL_DURABLE_CRASH=full`` (``make crash``)
allows 20.
"""

import collections
import itertools
import os
import queue
import random
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import pytest
from crash_child import AGENT_ID, Counter, FakeModel, question
from helpers import integrity, is_postgres, persisted, persisted_rows, texts

from effectful_durable import Handoff, Store
from effectful_durable.testing import FakeLLM

CHILD = Path(__file__).with_name("crash_child.py")
LOAD_TIMEOUT = 120.0  # importing litellm, on a machine busy with other children
REPLY_TIMEOUT = 30.0
NOTE = "Note from the runtime: your previous turn did not complete."
# effectful prompts with the docstring of the template's module, then the agent's.
SYSTEM_PROMPT = Counter(agent_id=AGENT_ID).ask.__system_prompt__


class ChildError(AssertionError):
    """The child did not answer as the protocol says."""


class Child:
    """One ``crash_child.py`` process, whose stdout lines are read with deadlines."""

    def __init__(
        self,
        db_path: Path | str,
        log_dir: Path,
        *,
        durability: str = "normal",
        keep_versions: int | None = None,
        script: Path = CHILD,
    ) -> None:
        log_dir.mkdir(parents=True, exist_ok=True)
        self._stderr_file = (log_dir / f"child-{time.monotonic_ns()}.stderr").open("w+")
        keep = ["--keep-versions", str(keep_versions)] if keep_versions else []
        self.proc = subprocess.Popen(
            [sys.executable, str(script), str(db_path), "--durability", durability, *keep],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr_file,
            text=True,
            bufsize=1,
        )
        self.transcript: list[tuple[float, str]] = []  # every line, with when it arrived
        self._lines: queue.Queue[str | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.transcript.append((time.monotonic(), line.strip()))
            self._lines.put(line.strip())
        self._lines.put(None)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str, *, timeout: float = REPLY_TIMEOUT) -> list[str]:
        """Wait for the next line starting with ``word`` and return its other words.

        ``committed`` lines before it are skipped, unless ``word`` is ``committed``.
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                self._fail(f"printed no {word!r} line within {timeout:.0f} s")
            if line is None:
                self._fail(f"closed stdout before printing {word!r}")
            head, *rest = line.split()
            if head == word:
                return rest
            if head != "committed":
                self._fail(f"printed {line!r} while {word!r} was expected")

    def load(self) -> None:
        self.expect("loaded", timeout=LOAD_TIMEOUT)

    def open(self) -> int:
        """Open the database and return the version the child found on disk."""
        self.send("open")
        return int(self.expect("ready")[0])

    def kill(self) -> None:
        """SIGKILL the child and wait until it is dead and all it printed is read."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=REPLY_TIMEOUT)
        assert self.proc.returncode == -signal.SIGKILL, self.proc.returncode
        self._reader.join(timeout=REPLY_TIMEOUT)

    def close(self) -> None:
        """Kill the child if it still runs and release its pipes and files."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=REPLY_TIMEOUT)
        self._reader.join(timeout=REPLY_TIMEOUT)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()
        self._stderr_file.close()

    def _fail(self, what: str) -> NoReturn:
        self._stderr_file.flush()
        self._stderr_file.seek(0)
        stderr = self._stderr_file.read()[-3000:]
        msg = f"crash child {self.pid} {what} (exit status {self.proc.poll()}).\n{stderr}"
        raise ChildError(msg)


class Children:
    """Children started ahead of need, so their imports overlap; all are killed on exit."""

    def __init__(
        self,
        db_path: Path | str,
        log_dir: Path,
        *,
        budget: int,
        ahead: int = 1,
        keep_versions: int | None = None,
        script: Path = CHILD,
    ) -> None:
        self._db_path, self._log_dir = db_path, log_dir
        self._keep_versions = keep_versions
        self._script = script
        self._budget = budget
        self._ahead = ahead
        self._warming: collections.deque[Child] = collections.deque()
        self._started: list[Child] = []

    def __enter__(self) -> "Children":
        return self

    def __exit__(self, *exc_info: object) -> None:
        for child in self._started:
            child.close()

    @property
    def started(self) -> int:
        return len(self._started)

    def next(self) -> Child:
        """The next loaded child; raises if ``budget`` children were already taken."""
        self._top_up()
        if not self._warming:
            msg = f"all {self._budget} children were used"
            raise ChildError(msg)
        child = self._warming.popleft()
        self._top_up()
        child.load()
        return child

    def _top_up(self) -> None:
        while len(self._warming) < self._ahead and len(self._started) < self._budget:
            child = Child(
                self._db_path,
                self._log_dir,
                keep_versions=self._keep_versions,
                script=self._script,
            )
            self._started.append(child)
            self._warming.append(child)


# -- what must be on disk -------------------------------------------------------


def turn_texts(turn: int) -> list[str]:
    """The messages one committed turn leaves in the history, as ``texts`` shows them."""
    return [
        f"user:Answer: {question(turn)}",
        "assistant:",  # the call of bump(turn=...)
        f"tool:turn {turn}: count {turn}",
        f"assistant:answer {turn}",
    ]


def whole_turns(version: int) -> list[str]:
    """The active history after ``version`` committed turns."""
    if version == 0:
        return []
    return [f"system:{SYSTEM_PROMPT}"] + [t for k in range(1, version + 1) for t in turn_texts(k)]


def on_disk(db_path: Path | str) -> tuple[int, Handoff | None]:
    """Check the file holds whole committed turns only; return its version and handoff.

    Every read goes through connections of this process, never the child's memory.
    """
    assert integrity(db_path) == "ok"
    with Store(db_path, readonly=True) as store:
        records = [a for a in store.agents() if a.agent_id == AGENT_ID]
        version = records[0].version if records else 0
        handoffs = store.handoffs()
        if version:
            infos = store.versions(AGENT_ID)
            assert [i.version for i in infos] == list(range(1, version + 1))
            assert {(i.kind, i.template) for i in infos} == {("turn", "ask")}
            history = store.history(AGENT_ID)
            assert texts(history) == whole_turns(version)
            assert len({m["id"] for m in history}) == len(history)
            assert store.state(AGENT_ID) == {"count": version}
    # No row of an uncommitted version exists, active or not.
    [(later_rows,)] = persisted_rows(
        db_path,
        "SELECT (SELECT count(*) FROM versions WHERE version > ?1)"
        " + (SELECT count(*) FROM messages WHERE added_in > ?1 OR removed_in > ?1)",
        version,
    )
    assert later_rows == 0
    assert len(handoffs) <= 1
    handoff = handoffs[0] if handoffs else None
    if handoff is not None:
        assert (handoff.agent_id, handoff.status, handoff.base_version) == (
            AGENT_ID,
            "running",
            version,
        )
        assert handoff.arguments == {"question": question(version + 1)}
    return version, handoff


def commits(child: Child) -> list[tuple[float, int]]:
    """When the child reported each committed version, and which."""
    reported = [(at, line.split()) for at, line in child.transcript]
    assert all(words for _, words in reported), child.transcript
    return [(at, int(words[1])) for at, words in reported if words[0] == "committed"]


def note_count(call_messages: list[dict[str, Any]]) -> int:
    """How many times the handoff note is in the request's system message."""
    [system] = [m for m in call_messages if m["role"] == "system"]
    return sum(block["text"].count(NOTE) for block in system["content"])


# -- (a) a kill inside one turn ---------------------------------------------------

COMMITTED = 3  # turns committed before the killed one


@dataclass(frozen=True)
class Crash:
    """A database as a SIGKILL inside turn ``COMMITTED + 1`` left it, and who was killed."""

    db_path: Path | str
    durability: str
    pid: int


@pytest.fixture(
    scope="class", params=["normal", "full", "postgres"], ids=["normal", "full", "postgres"]
)
def crash(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Crash:
    """Commit COMMITTED turns in a child, then kill it inside the next one.

    On SQLite with either durability, and on a PostgreSQL database.
    """
    directory = tmp_path_factory.mktemp(f"crash-{request.param}")
    if request.param == "postgres":
        db: Path | str = request.getfixturevalue("postgres_server").new_database()
        durability = "normal"
    else:
        db, durability = directory / "state.db", request.param
    child = Child(db, directory / "logs", durability=durability)
    try:
        child.load()
        assert child.open() == 0
        child.send(f"run {COMMITTED}")
        assert child.expect("done") == [str(COMMITTED)]
        child.send("block")
        assert child.expect("in-turn") == [str(COMMITTED + 1)]
        child.kill()
    finally:
        child.close()
    return Crash(db, durability, child.pid)


def copy_database(db: Path | str, directory: Path, request: pytest.FixtureRequest) -> Path | str:
    """Copy a database that no process uses any more, as a crash left it.

    An SQLite file is copied with its WAL; a PostgreSQL database is cloned on its server.
    """
    if is_postgres(db):
        return str(request.getfixturevalue("postgres_server").clone_database(str(db)))
    db_path = Path(db)
    directory.mkdir()
    for source in db_path.parent.glob(db_path.name + "*"):
        if not source.name.endswith(("-shm", "-lock")):
            shutil.copy2(source, directory / source.name)
    return directory / db_path.name


@dataclass(frozen=True)
class Recovery:
    """The crashed database after two more turns run by this process, and their requests."""

    db_path: Path | str
    llm: FakeLLM
    handoffs_after_retry: list[Handoff]


@pytest.fixture(scope="class")
def recovery(
    crash: Crash, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Recovery:
    """Continue the killed agent on a copy of its database: the retried turn, then one more."""
    db_path = copy_database(crash.db_path, tmp_path_factory.mktemp("recovery") / "copy", request)
    llm = FakeLLM(respond=FakeModel())
    bot = Counter(agent_id=AGENT_ID)
    with persisted(db_path, llm, durability=crash.durability):
        bot.ask(question(COMMITTED + 1))
        with Store(db_path, readonly=True) as store:
            handoffs_after_retry = store.handoffs()
        bot.ask(question(COMMITTED + 2))
    return Recovery(db_path, llm, handoffs_after_retry)


@pytest.mark.slow
class TestKillInsideTurn:
    """SIGKILL after a turn's handoff commit and before its commit."""

    def test_database_stays_at_last_committed_version(self, crash: Crash) -> None:
        """The file holds exactly the turns committed before the kill, intact."""
        version, _ = on_disk(crash.db_path)
        assert version == COMMITTED

    def test_handoff_names_the_cut_off_turn(self, crash: Crash) -> None:
        """The handoff row still shows the killed turn running, with its template and arguments."""
        with Store(crash.db_path, readonly=True) as store:
            [handoff] = store.handoffs()
        assert handoff.status == "running"
        assert handoff.template == "ask"
        assert handoff.arguments == {"question": question(COMMITTED + 1)}
        assert (handoff.base_version, handoff.pid, handoff.error) == (COMMITTED, crash.pid, None)

    def test_next_turn_sees_committed_history_only(self, recovery: Recovery) -> None:
        """The first request after the crash holds the committed turns and the new question."""
        first = recovery.llm.calls[0].messages
        assert first[0]["role"] == "system"
        assert first[0]["content"][0]["text"] == SYSTEM_PROMPT
        assert texts(first[1:]) == whole_turns(COMMITTED)[1:] + [
            f"user:Answer: {question(COMMITTED + 1)}"
        ]

    def test_next_turn_is_told_once(self, recovery: Recovery) -> None:
        """Each request of the retried turn carries the note once; the turn after has none."""
        calls = recovery.llm.calls
        assert len(calls) == 4  # two turns: the bump call, then the answer
        assert [note_count(call.messages) for call in calls] == [1, 1, 0, 0]
        first_system = calls[0].messages[0]["content"]
        assert question(COMMITTED + 1) in first_system[-1]["text"]
        assert "`ask`" in first_system[-1]["text"]

    def test_recovery_clears_handoff_and_is_recorded(self, recovery: Recovery) -> None:
        """After the retried turn commits, the handoff is gone and its version records it."""
        assert recovery.handoffs_after_retry == []
        version, handoff = on_disk(recovery.db_path)
        assert (version, handoff) == (COMMITTED + 2, None)
        with Store(recovery.db_path, readonly=True) as store:
            infos = store.versions(AGENT_ID)
            history = store.history(AGENT_ID)
        recovered = infos[COMMITTED].detail["recovered"]
        assert recovered["template"] == "ask"
        assert recovered["arguments"] == {"question": question(COMMITTED + 1)}
        assert recovered["status"] == "running"
        assert [i.detail for i in infos if i.version != COMMITTED + 1] == [None] * (version - 1)
        assert NOTE not in str(history)  # the note reached the model, never the history


# -- (b) random kills during a long conversation -------------------------------------

TURNS = 50
SEED = 20240601
# Each kill costs a child start (seconds); one more child then finishes.
MAX_KILLS = 20 if os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full" else 5


@dataclass
class Kills:
    """What the random kills hit, and how fast the children ran turns."""

    versions: list[int] = field(default_factory=list)  # on disk after each kill
    inside_turn: int = 0  # kills that left the turn's handoff running
    unreported: int = 0  # kills after a commit and before the child reported it
    pace: list[float] = field(default_factory=lambda: [0.020])  # seconds per turn seen

    def delay(self, rng: random.Random) -> float:
        """A random moment within the next turn and a quarter, at the recent pace."""
        return rng.uniform(0, 1.25) * statistics.median(self.pace[-9:])

    def summary(self, starts: int) -> str:
        return (
            f"{len(self.versions)} kills ({self.inside_turn} inside a turn, {self.unreported}"
            f" between a commit and its report), {starts} child starts, median turn"
            f" {statistics.median(self.pace) * 1000:.0f} ms; versions after the kills:"
            f" {self.versions}"
        )


def kill_at_random(child: Child, rng: random.Random, kills: Kills, version: int) -> int:
    """Let the child run the rest of the conversation, SIGKILL it at a random moment.

    The kill comes after 0-3 reported commits and a random part of a turn. A turn takes
    ~20 ms on an idle machine and several times that on a busy one, so the delay follows
    the pace measured so far: a fixed 0-80 ms window would land four turns in on one
    machine and always inside the first turn on another.

    Returns:
        The last version the child reported committed.
    """
    child.send(f"run {TURNS - version}")
    for _ in range(min(rng.randint(0, 3), TURNS - version - 1)):
        child.expect("committed")
    time.sleep(kills.delay(rng))
    child.kill()
    reported = commits(child)
    kills.pace += [b - a for (a, _), (b, _) in itertools.pairwise(reported)]
    return reported[-1][1] if reported else version


@pytest.mark.slow
class TestRandomKills:
    """A 50-turn conversation whose process is SIGKILLed again and again at random moments."""

    def test_every_kill_leaves_whole_committed_turns(self, store_url: str, tmp_path: Path) -> None:
        """After every kill the database holds whole committed turns, and the next run goes on."""
        db_path = store_url
        rng = random.Random(SEED)
        kills = Kills()
        recovered: set[int] = set()  # versions that must record a recovered handoff
        Store(db_path).close()  # create the schema once, before children race to open it
        version = 0
        with Children(db_path, tmp_path / "logs", budget=MAX_KILLS + 1) as children:
            while version < TURNS and len(kills.versions) < MAX_KILLS:
                child = children.next()
                assert child.open() == version  # the next run continues from the file
                reported = kill_at_random(child, rng, kills, version)
                version, handoff = on_disk(db_path)
                # No turn the child saw committed is lost; at most one was not reported yet.
                assert reported <= version <= reported + 1
                kills.versions.append(version)
                kills.unreported += version - reported
                if handoff is not None:
                    kills.inside_turn += 1
                    recovered.add(handoff.base_version + 1)
            if version < TURNS:
                child = children.next()
                assert child.open() == version
                child.send(f"run {TURNS - version}")
                assert child.expect("done") == [str(TURNS)]
            starts = children.started
        version, handoff = on_disk(db_path)
        assert (version, handoff) == (TURNS, None)
        with Store(db_path, readonly=True) as store:
            infos = store.versions(AGENT_ID)
        assert {i.version for i in infos if i.detail} == recovered
        assert all(i.detail["recovered"]["status"] == "running" for i in infos if i.detail)
        print("\n" + kills.summary(starts))


KEEP = 4


def pruned_on_disk(db_path: Path | str) -> int:
    """Check a file pruned as it goes: whole turns, K to 1.5 K exact versions; its version."""
    assert integrity(db_path) == "ok"
    with Store(db_path, readonly=True) as store:
        records = [a for a in store.agents() if a.agent_id == AGENT_ID]
        version = records[0].version if records else 0
        if not version:
            return 0
        kept = [i.version for i in store.versions(AGENT_ID)]
        assert kept == list(range(kept[0], version + 1))
        assert min(version, KEEP) <= len(kept) <= KEEP + KEEP // 2 - 1, kept
        for v in kept:
            assert texts(store.history(AGENT_ID, v)) == whole_turns(v)
            assert store.state(AGENT_ID, v) == {"count": v}
    return version


@pytest.mark.slow
class TestRandomKillsWhilePruning:
    """Kills of a conversation pruned as it goes (keep_versions=4) leave whole, exact versions."""

    def test_every_kill_leaves_whole_kept_versions(self, store_url: str, tmp_path: Path) -> None:
        """After every kill the kept versions are contiguous, exact, and at most 1.5 K."""
        db_path = store_url
        rng = random.Random(SEED + 1)
        kills = Kills()
        Store(db_path).close()
        version = 0
        budget = min(MAX_KILLS, 6)
        with Children(
            db_path, tmp_path / "logs", budget=budget + 1, keep_versions=KEEP
        ) as children:
            while version < TURNS and len(kills.versions) < budget:
                child = children.next()
                assert child.open() == version
                reported = kill_at_random(child, rng, kills, version)
                version = pruned_on_disk(db_path)
                assert reported <= version <= reported + 1
                kills.versions.append(version)
            if version < TURNS:
                child = children.next()
                assert child.open() == version
                child.send(f"run {TURNS - version}")
                assert child.expect("done") == [str(TURNS)]
        assert pruned_on_disk(db_path) == TURNS
        print("\n" + kills.summary(budget + 1))
