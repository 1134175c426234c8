"""The alarms example (examples/alarms/checkback.py) runs offline, end to end."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import integrity
from paths import ROOT

from effectful_durable import Store

EXAMPLE = ROOT / "examples" / "alarms" / "checkback.py"


@pytest.mark.slow
class TestCheckBackExample:
    """The plant-care agent schedules a check-back, and the runner delivers it."""

    def test_runs_and_delivers_every_alarm(self, db_path: Path) -> None:
        """The example exits 0; the check-back fired once and the daily alarm twice."""
        env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
        result = subprocess.run(
            [sys.executable, str(EXAMPLE), "--db", str(db_path)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        assert "runner: 3 alarm turns, 0 errors" in result.stdout
        with Store(db_path) as store:
            notes = store.state("basil-carer")["notes_sent"]
            assert notes[0] == "Time to water the basil: the soil is dry."
            assert notes[1:] == ["Daily tidy-up done (tidy your notes)"] * 2
            (daily,) = store.alarms("basil-carer")
            assert daily.cron == "0 7 * * *" and daily.deliveries == 2
            assert [v.template for v in store.versions("basil-carer")] == [
                "ask",
                "on_alarm",
                "on_alarm",
                "on_alarm",
            ]
        assert integrity(db_path) == "ok"
