"""A short soak: worker processes SIGKILLed at random lose no turn and repeat no step.

``bench/soak.py`` (``make soak`` runs it for 2 minutes per durability setting) here runs
2 worker processes x 4 agents (one of each kind: memory, SQL, alarms, workflow steps),
4 agents both workers drive, and an alarm runner for 15 seconds, killing one of them with
SIGKILL every second on average and starting it again. Each process logs every turn
whose call returned outside the database; the soak's checker compares those logs with
the file (see its docstring). A second test shows the checker is not blind: on a copy
of the database and logs, a deleted turn and a step's model call after it was done are
reported.
"""

import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from helpers import writable_connection
from paths import ROOT

BENCH = ROOT / "bench"
sys.path.insert(0, str(BENCH))

import soak  # noqa: E402  (bench/ is not a package)


@dataclass(frozen=True)
class Soaked:
    """A finished short soak: its printed report, its results, and its files."""

    stdout: str
    returncode: int
    result: dict[str, Any]
    directory: Path


@pytest.fixture(scope="class")
def soaked(tmp_path_factory: pytest.TempPathFactory) -> Soaked:
    """Run the short soak once for the class."""
    tmp_path = tmp_path_factory.mktemp("soak")
    out = tmp_path / "result.json"
    run = subprocess.run(
        [
            sys.executable,
            str(BENCH / "soak.py"),
            "--durability=normal",
            "--workers=2",
            "--agents=4",
            "--threads=2",
            "--duration=15",
            "--kill-every=1",
            "--check-every=5",
            "--drain=20",
            f"--dir={tmp_path}",
            f"--json={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    print(run.stdout)  # shown with -s
    assert out.exists(), run.stderr[-3000:]
    [result] = json.loads(out.read_text())
    [directory] = tmp_path.glob("soak-*")
    return Soaked(run.stdout, run.returncode, result, directory)


@pytest.mark.slow
class TestShortSoak:
    """The soak's checker finds nothing lost, duplicated or damaged, and would see it."""

    def test_kills_lose_and_repeat_nothing(self, soaked: Soaked) -> None:
        """After ~10 kills in 15 s: no lost turn or write, no duplicated step, integrity ok."""
        result, final = soaked.result, soaked.result["final"]
        assert final["problems"] == [], soaked.stdout
        assert (final["lost_turns"], final["partial_turns"], final["wrong_version"]) == (0, 0, 0)
        assert (final["duplicated_steps"], final["duplicated_turns"]) == (0, 0)
        assert (final["alarms_lost"], final["duplicated_deliveries"]) == (0, 0)
        assert (final["version_gaps"], final["uncommitted_rows"]) == (0, 0)
        assert result["integrity_passed"] == result["checks"] >= 2
        assert result["unexpected_exits"] == 0
        assert result["kills"] >= 5, "too few kills to test anything"
        assert final["logged_turns"] >= 20 and final["steps"] >= 2  # even on a busy machine
        assert soaked.returncode == 0, soaked.stdout

    def test_checker_reports_a_lost_turn_and_a_repeated_step(
        self, soaked: Soaked, tmp_path: Path
    ) -> None:
        """On a copy, a logged turn deleted from the file and a step's model call logged
        after the step was done are each found."""
        copy = tmp_path / "copy"
        shutil.copytree(soaked.directory, copy)
        db, logdir = copy / "soak-normal.db", copy / "logs-normal"
        events = [e for w in soak.read_logs(logdir).workers.values() for e in w]
        turn = next(e for e in events if e["e"] == "turn" and not e["wf"])
        step = next(e for e in events if e["e"] == "turn" and e["wf"])
        conn = writable_connection(db)
        conn.execute("DELETE FROM messages WHERE body LIKE ?", (f"%Q[{turn['m']}]%",))
        conn.close()
        with next(logdir.glob("worker-*.jsonl")).open("a") as log:
            log.write(json.dumps({"e": "call", "m": step["m"], "t": step["t"] + 1}) + "\n")
        findings = soak.check(db, logdir)
        assert findings.lost_turns == 1
        assert findings.duplicated_steps == 1
        assert findings.integrity_ok
