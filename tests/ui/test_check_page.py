"""The last check in the page, in a real browser: the agents list's banner and code
versions, the report at /check, and an agent's own breaks. Screenshots are saved."""

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import enter, shot, text_of, wait_for
from ui_server import ROOT, Server, serving

pytestmark = pytest.mark.slow

TEAM = ROOT / "examples" / "multi_agent"
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def new_code(folder: Path) -> Path:
    """A copy of the team's code with one coder's steps reordered and a field retyped."""
    folder.mkdir()
    shutil.copy(TEAM / "offline_model.py", folder)
    text = (TEAM / "workflow.py").read_text()
    for old, new in (
        ("    for module in modules:\n", "    for module in reversed(modules):\n"),
        ("written: list[str]", "written: list[int]"),
    ):
        assert old in text
        text = text.replace(old, new)
    (folder / "workflow.py").write_text(text)
    return folder


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The page over the team's workflow stopped midway, checked against changed code."""
    folder = tmp_path_factory.mktemp("check")
    db = str(folder / "team.db")
    subprocess.run(
        [sys.executable, str(TEAM / "workflow.py"), "--db", db, "--out", str(folder / "p"),
         "--stop-after", "8"],
        check=False, capture_output=True, env=ENV, timeout=300,
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "effectful_durable", "check-upgrade", db,
         "--agents", "workflow:agent", "--workflow", "workflow:program",
         "--code-version", "textkit-demo-2"],
        cwd=new_code(folder / "new"), capture_output=True, text=True, env=ENV, timeout=300,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    with serving(db) as server:
        yield server


class TestLastCheck:
    def test_agents_list(self, driver: Any, checked: Server) -> None:
        """The banner says the new code would break, and each agent shows its code version."""
        enter(driver, checked)
        wait_for(driver, lambda d: "would break" in text_of(d))
        page = text_of(driver)
        assert "The last check" in page and "new code textkit-demo-2" in page
        assert "textkit-demo-1" in page  # the Code column
        shot(driver, "check-agents")

    def test_report(self, driver: Any, checked: Server) -> None:
        """/check: the counts, the workflow's divergence, and each break with its way forward."""
        enter(driver, checked)
        driver.get(f"{checked.base}/check")
        wait_for(driver, lambda d: "Last check" in text_of(d))
        page = text_of(driver)
        assert "diverges at step" in page and "coder-1#0" in page
        assert "textkit-demo-1 · 3 agents" in page
        assert "no longer fits Coder.written" in page and "migrate-state" in page
        shot(driver, "check-report")
        driver.get(f"{checked.base}/check?kind=state")
        wait_for(driver, lambda d: "coder-2" in text_of(d))

    def test_agent(self, driver: Any, checked: Server) -> None:
        """An agent's page names its code version and what the last check found of it."""
        enter(driver, checked)
        driver.get(f"{checked.base}/agent?id=coder-1")
        wait_for(driver, lambda d: "The last check says" in text_of(d))
        page = text_of(driver)
        assert "code textkit-demo-1" in page and "written" in page
        shot(driver, "check-agent")


def test_no_report_yet(tmp_path: Path) -> None:
    """Without a report, /check says how to make one; an unreadable one, or JSON that is
    no report of the check, is said as such."""
    db = str(tmp_path / "empty.db")
    from effectful_durable import Store

    Store(db).close()
    with serving(db) as server, server.client() as client:
        page = client.get("/check").text
        assert "No check has kept a report" in page
        assert "effectful-durable check-upgrade DB --agents MODULE:FUNC" in page
        Path(f"{db}.check.json").write_text("{not json")
        assert "cannot be read" in client.get("/check").text
        assert "cannot be read" in client.get("/").text
        Path(f"{db}.check.json").write_text('{"breaks": []}')
        assert "not a report of effectful-durable check-upgrade" in client.get("/check").text
        assert "cannot be read" in client.get("/").text
