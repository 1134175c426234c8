"""SIGKILL in the middle of turns that write SQL (DESIGN promise 1 for the workspace).

Real children (``tests/programs/sql_crash_child.py``) run turns of an agent whose every turn
writes its tables, on an SQLite file and on a PostgreSQL database; the test kills
them: at a random moment of a run of turns, inside a turn after its SQL writes,
exactly between the turn's main commit and its workspace commit, and between the
workspace file's new stamp and its commit. After each kill, read through connections
of our own: the database and the workspace file pass their integrity checks, and
every committed version v holds exactly the rows of v whole turns; a workspace file
left behind by the kill is caught up by the next reader; the next child goes on from
there.
"""

import queue
import random
import signal
import subprocess
import sys
import threading
import time

import apsw
import pytest
from helpers import integrity
from paths import PROGRAMS
from sql_helpers import workspace_file

from effectful_durable import Store

CHILD = PROGRAMS / "sql_crash_child.py"
AGENT_ID = "ledger"


class Child:
    """One child process whose stdout lines are read with deadlines."""

    def __init__(self, db_path: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(db_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def expect(self, word: str, timeout: float = 120.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while True:
            line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            if line is None:
                stderr = self.proc.stderr.read() if self.proc.stderr else ""
                pytest.fail(f"child ended before {word!r}: {stderr[-2000:]}")
            head, *rest = line.split()
            if head == word:
                return rest

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for stream in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()


def file_version(db_path: str) -> int:
    """The version the workspace file holds, read without catching it up."""
    conn = apsw.Connection(workspace_file(db_path, AGENT_ID), flags=apsw.SQLITE_OPEN_READONLY)
    try:
        return int(conn.pragma("user_version"))
    finally:
        conn.close()


def check(db_path: str) -> int:
    """Every committed version holds exactly its whole turns; return the last one."""
    assert integrity(db_path) == "ok"
    with Store(db_path) as store:
        current = store.versions(AGENT_ID)[-1].version
        assert [v.version for v in store.versions(AGENT_ID)] == list(range(1, current + 1))
        for version in sorted({1, current // 2 or 1, current - 1 or 1, current}):
            entries = store.sql(
                AGENT_ID, "SELECT id, turn, square FROM entries ORDER BY id", version=version
            )
            assert entries.rows == [(k, k, k * k) for k in range(1, version + 1)], version
            totals = store.sql(AGENT_ID, "SELECT n FROM totals", version=version).rows
            assert totals == [(version,)], version
    assert file_version(db_path) == current  # the reader above caught the file up
    assert integrity(workspace_file(db_path, AGENT_ID)) == "ok"
    return current


def test_sigkill_during_sql_turns(store_url: str) -> None:
    """Kills at random moments, inside a turn, and between the two commits lose nothing."""
    db_path = store_url
    rng = random.Random(7)
    modes = ["random", "between", "block", "stamped", "random"]
    children = [Child(db_path) for _ in modes]  # imports overlap
    try:
        version = 0
        for number, child in enumerate(children):
            child.expect("loaded")
            if number == 0:
                child.send("run 3")
                version = int(child.expect("done")[0])
            mode = modes[number]
            if mode == "random":
                child.send("run 40")
                time.sleep(rng.uniform(0.2, 1.5))
                child.kill()
            elif mode in ("between", "stamped"):
                child.send(mode)
                held = int(child.expect(mode)[0])
                child.kill()
                assert held == version + 1
                assert file_version(db_path) == version  # its workspace commit never ran
            else:
                child.send("run 2")
                child.expect("done")
                child.send("block")
                child.expect("in-turn")
                child.kill()
            new = check(db_path)
            assert new >= version
            if mode in ("between", "stamped"):
                assert new == version + 1  # committed in the main database: kept
            version = new
    finally:
        for child in children:
            child.close()
