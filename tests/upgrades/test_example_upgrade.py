"""examples/multi_agent/upgrade.py: a changed step is caught by `check` before the restart."""

import os
import subprocess
import sys

import pytest
from paths import ROOT

SCRIPT = ROOT / "examples" / "multi_agent" / "upgrade.py"

pytestmark = pytest.mark.slow


def test_the_changed_step_is_caught() -> None:
    """The script stops the workflow, checks the same code (0) and an edited copy (3)."""
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "everything in flight carries over to the new code\n" in out
    assert "goes live at" in out and "(exit status 0)" in out
    assert "then diverges at step" in out and "(coder-1#0)" in out and "(exit status 3)" in out
    assert out.rstrip().endswith("the changed step was caught before the restart")
