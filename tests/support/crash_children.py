"""The parent's side of crash_child.py's protocol: children killed with SIGKILL, and
what must be on disk after each kill (tests/processes/test_crash.py, and the suites that
drive the same protocol: test_memory_crash.py, test_foreign_programs.py).

A :class:`Child` is one ``programs/crash_child.py`` process (or another program that
speaks its protocol), whose stdout lines are read with deadlines; :class:`Children`
starts them ahead of need so that their imports of litellm overlap. :func:`on_disk`
checks a database holds whole committed turns of crash_child's agent only, and
:func:`kill_at_random` kills a child at a random moment of a conversation.
"""

import collections
import itertools
import queue
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

from crash_child import AGENT_ID, Counter, question
from helpers import integrity, persisted_rows, texts
from paths import PROGRAMS

from effectful_durable import Handoff, Store

CHILD = PROGRAMS / "crash_child.py"
LOAD_TIMEOUT = 120.0  # importing litellm, on a machine busy with other children
REPLY_TIMEOUT = 30.0
#: The conversation the random kills cut: this many turns.
TURNS = 50
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


# -- kills at random moments --------------------------------------------------------


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
