"""Promise 3, with real processes killed by SIGKILL: a resumed workflow never repeats a model
call for a step that committed, and ends with the same result as an uninterrupted run.

tests/workflow_child.py imports everything once and forks a real child per run of a
15-step workflow (a planner, two workers in parallel threads, a reviewer with a
structured result). Every model call is logged and fsync'd before it is answered, so
calls lost to a kill are counted too. The parent kills runs at random moments, checks
the file after every kill, and compares the final output with an uninterrupted run.
"""

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pytest

from effectful_durable import Store
from tests.helpers import integrity, persisted_rows

ROOT = Path(__file__).parents[1]
STEPS = 15  # 3 plan parts, 2 workers x 3, 6 reviews
KILLS = 20


class ForkServer:
    """Drives tests/workflow_child.py: one forked child per workflow run."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "workflow_child.py")],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self.next_line(60) == "ready"

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    def next_line(self, timeout: float) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            pytest.fail(f"the fork server said nothing for {timeout} s")

    def start(self, paths: dict[str, Path], variant: str = "same") -> int:
        assert self.process.stdin is not None
        args = " ".join(str(paths[k]) for k in ("db", "out", "calls"))
        self.process.stdin.write(f"run {args} {variant}\n")
        self.process.stdin.flush()
        return int(self.next_line(30).removeprefix("pid "))

    def outcome(self) -> str:
        return self.next_line(60)

    def run(self, paths: dict[str, Path], variant: str = "same") -> str:
        self.start(paths, variant)
        return self.outcome()

    def close(self) -> None:
        self.process.kill()
        self.process.wait(10)


@pytest.fixture(scope="module")
def server() -> Iterator[ForkServer]:
    forks = ForkServer()
    try:
        yield forks
    finally:
        forks.close()


def workspace(directory: Path) -> dict[str, Path]:
    directory.mkdir()
    return {
        "db": directory / "wf.db",
        "out": directory / "out.json",
        "calls": directory / "calls.log",
    }


def calls(paths: dict[str, Path]) -> list[str]:
    if not paths["calls"].exists():
        return []
    return [json.loads(line)["text"] for line in paths["calls"].read_text().splitlines()]


def done_steps(paths: dict[str, Path]) -> int:
    if not paths["db"].exists():
        return 0
    try:
        rows = persisted_rows(
            paths["db"], "SELECT count(*) FROM workflow_steps WHERE status = 'done'"
        )
    except apsw.SQLError:  # the schema is not there yet
        return 0
    return int(rows[0][0])


def wait_for_steps(paths: dict[str, Path], count: int, server: ForkServer) -> None:
    """Wait until ``count`` steps are done, or the run ends, or 10 s pass."""
    deadline = time.monotonic() + 10
    while done_steps(paths) < count and server.lines.empty() and time.monotonic() < deadline:
        time.sleep(0.002)


def prompt_of(step: Any) -> str:
    """The user text a step's model calls carry, from the step's recorded arguments."""
    if step.template == "review":
        return f"Judge this work: {step.arguments['work']}"
    return f"Answer the question: {step.arguments['question']}"


@pytest.fixture(scope="module")
def reference(server: ForkServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """An uninterrupted run: its output and its model calls."""
    paths = workspace(tmp_path_factory.mktemp("reference") / "run")
    assert server.run(paths) == "exit 0"
    return {"output": paths["out"].read_text(), "calls": calls(paths)}


@pytest.mark.slow
class TestKilledWorkflow:
    def test_reference_run_makes_one_call_per_step(self, reference: dict[str, Any]) -> None:
        """The uninterrupted workflow calls the model once per step, no more."""
        assert len(reference["calls"]) == STEPS == len(set(reference["calls"]))

    def test_random_kills_resume_to_the_same_output(
        self, server: ForkServer, reference: dict[str, Any], tmp_path: Path
    ) -> None:
        """Killed 20 times at random moments, re-runs finish with the reference output,
        and no step that had committed is ever sent to the model again."""
        rng = random.Random(20261122)
        paths = workspace(tmp_path / "killed")
        kills, outcome = 0, ""
        done_at_kill: list[tuple[int, set[str]]] = []  # (calls logged so far, done prompts)
        while kills < KILLS or outcome != "exit 0":
            before = done_steps(paths)
            pid = server.start(paths)
            if kills < KILLS:
                # Let the run commit 0 or 1 more step, then kill it a few ms later:
                # inside a model call, in a commit, or between steps.
                wait_for_steps(paths, before + rng.choice([0, 0, 1, 1]), server)
                time.sleep(rng.uniform(0.0, 0.02))
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass  # it finished first
            outcome = server.outcome()
            assert outcome in ("exit 0", f"signal {signal.SIGKILL}"), outcome
            if outcome != "exit 0":
                kills += 1
            assert integrity(paths["db"]) == "ok"
            if paths["db"].exists() and outcome != "exit 0":
                with Store(paths["db"], readonly=True) as store:
                    steps = store.steps("wf") if store.workflows() else []
                done_at_kill.append(
                    (len(calls(paths)), {prompt_of(s) for s in steps if s.status == "done"})
                )
        assert paths["out"].read_text() == reference["output"]

        logged = calls(paths)
        assert len(logged) <= STEPS + 2 * kills  # at most two calls in flight per kill
        for logged_before, done in done_at_kill:
            repeated = done & set(logged[logged_before:])
            assert not repeated, f"committed steps called again: {sorted(repeated)}"

        store = Store(paths["db"], readonly=True)
        assert [s.status for s in store.steps("wf")] == ["done"] * STEPS
        assert store.handoffs() == []
        for agent in store.agents():
            history = store.history(agent.agent_id)
            assert len({m["id"] for m in history}) == len(history)
            users = [str(m["content"]) for m in history if m["role"] == "user"]
            assert len(users) == len(set(users)), f"{agent.agent_id} repeats a message"

    def test_finished_workflow_replays_without_calls(
        self, server: ForkServer, reference: dict[str, Any], tmp_path: Path
    ) -> None:
        """Running a finished workflow again calls the model zero times."""
        paths = workspace(tmp_path / "again")
        assert server.run(paths) == "exit 0"
        first = len(calls(paths))
        paths["out"].unlink()
        assert server.run(paths) == "exit 0"
        assert len(calls(paths)) == first
        assert paths["out"].read_text() == reference["output"]

    def test_divergence_is_detected_and_writes_nothing(
        self, server: ForkServer, tmp_path: Path
    ) -> None:
        """A program that asks for another step than the journal holds stops untouched."""
        paths = workspace(tmp_path / "diverged")
        assert server.run(paths) == "exit 0"
        tables = ("agents", "messages", "versions", "workflow_steps", "handoffs")
        before = {t: persisted_rows(paths["db"], f"SELECT count(*) FROM {t}") for t in tables}
        assert server.run(paths, "diverged") == "exit 3"
        after = {t: persisted_rows(paths["db"], f"SELECT count(*) FROM {t}") for t in tables}
        assert after == before
