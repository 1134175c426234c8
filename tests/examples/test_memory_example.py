"""examples/memory_agent.py: what the agent decided to keep survives between runs."""

import os
import subprocess
import sys
from pathlib import Path

from paths import ROOT

from effectful_durable import Store

EXAMPLE = ROOT / "examples" / "memory_agent.py"


def run(db: Path) -> str:
    return subprocess.run(
        [sys.executable, str(EXAMPLE), "--db", str(db)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    ).stdout


class TestMemoryExample:
    def test_three_sessions_remember_the_user_and_their_runs(self, tmp_path: Path) -> None:
        """Each run is a session; facts and runs stored in earlier ones are used later."""
        db = tmp_path / "coach.db"
        first, second, third = run(db), run(db), run(db)
        assert "memory: {'user.drink': 'tea', 'user.name': 'Alice'}" in first
        assert "You are Alice, and you drink tea." in second
        assert "You have run 13.5 km over 2 runs" in third
        with Store(db) as store:
            assert store.memory("coach") == {"user.drink": "tea", "user.name": "Alice"}
            assert store.sql("coach", "SELECT session, km FROM runs ORDER BY id").rows == [
                (1, 5.5),
                (2, 8.0),
            ]
            assert store.state("coach")["sessions"] == 3
