"""A short soak: worker processes SIGKILLed at random lose no turn and repeat no step.

``bench/soak.py`` (``make soak`` runs it for 2 minutes per durability setting) here runs
2 worker processes x 4 agents (one of each kind: memory, SQL, alarms, workflow steps) and
an alarm runner for 15 seconds, killing one of them with SIGKILL every second on average
and starting it again. Each process logs every turn whose call returned outside the
database; the soak's checker compares those logs with the file (see its docstring).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).parents[1] / "bench" / "soak.py"


@pytest.mark.slow
class TestShortSoak:
    """The soak's checker finds nothing lost, duplicated or damaged."""

    def test_kills_lose_and_repeat_nothing(self, tmp_path: Path) -> None:
        """After ~10 kills in 15 s: no lost turn or write, no duplicated step, integrity ok."""
        out = tmp_path / "result.json"
        run = subprocess.run(
            [
                sys.executable,
                str(SOAK),
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
        final = result["final"]
        assert final["problems"] == [], run.stdout
        assert (final["lost_turns"], final["partial_turns"], final["wrong_version"]) == (0, 0, 0)
        assert (final["duplicated_steps"], final["duplicated_turns"]) == (0, 0)
        assert (final["alarms_lost"], final["duplicated_deliveries"]) == (0, 0)
        assert final["version_gaps"] == 0
        assert result["integrity_passed"] == result["checks"] >= 2
        assert result["unexpected_exits"] == 0
        assert result["kills"] >= 5, "too few kills to test anything"
        assert final["logged_turns"] >= 20 and final["steps"] >= 2  # even on a busy machine
        assert run.returncode == 0, run.stdout
