"""examples/privacy.py: the customers' content is sealed in the files, and an erasure
leaves the backup made before it unreadable for the erased customer alone."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from paths import ROOT

from effectful_durable import Keys, Store

EXAMPLE = ROOT / "examples" / "privacy.py"

pytestmark = pytest.mark.processes


def test_a_customer_is_forgotten_in_the_database_and_in_the_backup(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLE), "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    ).stdout
    assert "'4711' in the database's files: False" in out
    assert "who holds customer:ann now: []" in out
    assert "bob in the backup: {'customer.address': '12 Elm Street'}" in out
    assert "ann in the backup:" in out and "was erased" in out
    files = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"4711" not in files and b"Elm Street" not in files
    keys = Keys.from_file(tmp_path / "master.key")
    with Store(tmp_path / "support.db", keys=keys) as store:
        assert [a.agent_id for a in store.agents()] == ["bob"]
        assert store.memory("bob") == {"customer.address": "12 Elm Street"}
