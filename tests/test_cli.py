"""The effectful-durable command: every subcommand, its errors, and no litellm."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from effectful_durable import Store
from effectful_durable.cli import main
from effectful_durable.testing import FakeLLM
from tests.helpers import Assistant, persisted

ROOT = Path(__file__).parents[1]


@pytest.fixture
def db(db_path: Path) -> str:
    """A database with agent 'bot' at version 2 and a one-step workflow 'wf'."""
    with persisted(db_path, FakeLLM(["first answer", "second answer"])):
        bot = Assistant(agent_id="bot")
        bot.ask("first question")
        bot.turns = 2
        bot.ask("second question")
    with persisted(db_path, FakeLLM(["planned"]), workflow="wf"):
        Assistant(agent_id="planner").ask("plan it")
    return str(db_path)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestReads:
    def test_agents_table_and_json(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """agents prints one row per agent, or JSON records with --json."""
        code, out, _ = run(capsys, "agents", db)
        assert code == 0
        assert out.splitlines()[0].split() == ["agent_id", "version", "messages", "updated_at"]
        assert out.splitlines()[1].split()[:3] == ["bot", "2", "5"]
        code, out, _ = run(capsys, "agents", db, "--json")
        assert [a["agent_id"] for a in json.loads(out)] == ["bot", "planner"]

    def test_history_at_a_version(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """history prints one line per message, at the latest or a given version."""
        _, out, _ = run(capsys, "history", db, "bot")
        assert [line.split()[0] for line in out.splitlines()] == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        assert "second answer" in out
        _, out, _ = run(capsys, "history", db, "bot", "--version", "1")
        assert "second" not in out and len(out.splitlines()) == 3

    def test_state_versions_handoffs(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """state prints JSON fields; versions lists versions; handoffs is empty."""
        _, out, _ = run(capsys, "state", db, "bot", "--version", "1")
        assert json.loads(out)["turns"] == 0
        _, out, _ = run(capsys, "versions", db, "bot")
        assert [line.split()[:2] for line in out.splitlines()[1:]] == [
            ["1", "turn"],
            ["2", "turn"],
        ]
        _, out, _ = run(capsys, "handoffs", db, "--json")
        assert json.loads(out) == []

    def test_workflows_and_steps(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """workflows counts steps; steps lists them with key and status."""
        _, out, _ = run(capsys, "workflows", db)
        assert out.splitlines()[1].split()[:3] == ["wf", "1", "1"]
        _, out, _ = run(capsys, "steps", db, "wf", "--json")
        [step] = json.loads(out)
        assert (step["key"], step["status"], step["result"]) == ("planner#0", "done", "planned")

    def test_check(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """check reports integrity 'ok' and exits 0."""
        code, out, _ = run(capsys, "check", db, "--json")
        facts = json.loads(out)
        assert code == 0 and facts["integrity"] == "ok" and facts["agents"] == 2


class TestMaintenance:
    def test_rollback_fork_delete(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """rollback, fork and delete change the database as Store would."""
        assert run(capsys, "rollback", db, "bot", "1")[0] == 0
        assert len(Store(db).history("bot")) == 3
        code, out, _ = run(capsys, "fork", db, "bot", "twin", "--version", "2")
        assert code == 0 and "twin: version 1, 5 messages" in out
        assert run(capsys, "delete", db, "twin", "--yes")[0] == 0
        assert [a.agent_id for a in Store(db).agents()] == ["bot", "planner"]

    def test_delete_needs_yes(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """delete without --yes refuses with exit 2 and deletes nothing."""
        code, _, err = run(capsys, "delete", db, "bot")
        assert code == 2 and "--yes" in err
        assert len(Store(db).agents()) == 2

    def test_reset_workflow(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """reset-workflow forgets steps and names the agents it rolled back."""
        code, out, _ = run(capsys, "reset-workflow", db, "wf")
        assert code == 0 and "rolled back: planner" in out
        assert Store(db).workflows() == []


class TestErrors:
    def test_garbage_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A file that is not a database is an error, and stays unchanged."""
        garbage = tmp_path / "notes.txt"
        garbage.write_text("not a database\n" * 100)
        code, _, err = run(capsys, "agents", str(garbage))
        assert code == 1 and "is not an effectful-durable database" in err
        assert garbage.read_text() == "not a database\n" * 100

    def test_missing_file_is_not_created(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A read of a missing file says so and creates nothing."""
        code, _, err = run(capsys, "agents", str(tmp_path / "missing.db"))
        assert code == 1 and "no database at" in err
        assert list(tmp_path.iterdir()) == []

    def test_unknown_agent(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown agent is a one-line error, not a traceback."""
        code, _, err = run(capsys, "versions", db, "nobody")
        assert code == 1 and err.startswith("effectful-durable: error: no agent 'nobody'")


def test_command_never_imports_litellm(db: str) -> None:
    """python -m effectful_durable runs without loading litellm."""
    script = (
        "import runpy, sys; sys.argv = ['effectful-durable', 'agents', sys.argv[1]]\n"
        "try:\n    runpy.run_module('effectful_durable', run_name='__main__')\n"
        "except SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
        "print('litellm' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, db], capture_output=True, text=True, check=True, cwd=ROOT
    ).stdout
    assert out.splitlines()[-1] == "False"
