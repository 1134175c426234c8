"""The alarm commands of effectful-durable: alarms, status, rearm, and run's errors."""

import json
import logging
import time
from pathlib import Path

import pytest
from helpers import run_cli_in_fresh_python

from effectful_durable import Store
from effectful_durable.cli import main
from effectful_durable.store.alarms import make_schedule


@pytest.fixture
def db(store_url: str) -> str:
    """A database with a pending alarm, a dead one and a runner status report."""
    now = time.time()
    with Store(store_url) as store:
        store.schedule_alarm("bot", "check back", make_schedule(now, delay=3600))
        store.schedule_alarm("bot", "tidy notes", make_schedule(now, cron="0 3 * * *"))
        store.schedule_alarm("other", "broken", make_schedule(now, delay=0))
        queue = store.alarm_queue
        claim = queue.claim("host:1:x", now, 60)
        assert claim is not None
        queue.fail(claim, "RuntimeError: model down", None)
        queue.record_status(
            "host:1:x", state="running", started_at=now, report={"turns": 3, "errors": 1}
        )
    return str(store_url)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


class TestAlarms:
    """``alarms`` lists pending and dead alarms; ``rearm`` revives a dead one."""

    def test_table(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """The table shows each alarm's id, agent, status, cron and last error."""
        code, out, _ = run(capsys, "alarms", db)
        assert code == 0
        lines = out.splitlines()
        assert lines[0].split()[:4] == ["alarm_id", "agent_id", "status", "due_at"]
        assert any("dead" in line and "model down" in line for line in lines)
        assert any("0 3 * * *" in line for line in lines)
        assert len(lines) == 4

    def test_json_and_agent_filter(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """--json prints every field; --agent keeps one agent's alarms."""
        _, out, _ = run(capsys, "alarms", db, "--agent", "bot", "--json")
        alarms = json.loads(out)
        assert {a["action"] for a in alarms} == {"check back", "tidy notes"}
        assert alarms[0]["due_at"].endswith("+00:00")

    def test_rearm(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """rearm makes the dead alarm pending again with no attempts."""
        _, out, _ = run(capsys, "alarms", db, "--agent", "other", "--json")
        (dead,) = json.loads(out)
        code, out, _ = run(capsys, "rearm", db, dead["alarm_id"])
        assert code == 0 and "pending again" in out
        _, out, _ = run(capsys, "alarms", db, "--agent", "other", "--json")
        (alive,) = json.loads(out)
        assert (alive["status"], alive["attempts"]) == ("pending", 0)
        code, _, err = run(capsys, "rearm", db, "alm_nope")
        assert code == 1 and "no pending or dead alarm" in err


class TestRearmWords:
    """``rearm`` refusals name commands, not Python calls, and call an event an event."""

    def test_unknown_or_delivered_event(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """An event id nothing waits for: the refusal says event, and names ``events``."""
        with Store(db) as store:
            delivered = store.send_event("bot", "paid", {"n": 1}, create=True).event_id
            claim = store.alarm_queue.claim("host:1:y", time.time(), 60, ["other"])
            assert claim is not None and claim.alarm_id == delivered
            assert store.alarm_queue.finish(claim)
        for event_id, says in ((delivered, "was delivered"), ("evt_0000", "no pending or dead")):
            code, _, err = run(capsys, "rearm", db, event_id)
            assert code == 1
            assert f"event {event_id!r}" in err and says in err, err
            assert f"`effectful-durable events {db}` lists them" in err
            assert "alarm" not in err and "Store." not in err and "()" not in err

    def test_unknown_alarm(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """An alarm id nothing waits for: the refusal names ``alarms``."""
        code, _, err = run(capsys, "rearm", db, "alm_nope")
        assert code == 1
        assert "no pending or dead alarm 'alm_nope'" in err
        assert f"`effectful-durable alarms {db}` lists them" in err
        assert "Store." not in err and "()" not in err


class TestStatus:
    """``status`` prints each runner's last report."""

    def test_text_and_json(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """The report is printed as key: value lines, or as JSON."""
        code, out, _ = run(capsys, "status", db)
        assert code == 0
        assert out.splitlines()[0].startswith("runner host:1:x")
        assert "  turns: 3" in out and "  state: running" in out
        assert "  alarms_dead: 1" in out.split("waiting in")[1]  # counted now, not reported
        _, out, _ = run(capsys, "status", db, "--json")
        report = json.loads(out)
        assert report["runners"][0]["errors"] == 1
        assert (report["waiting"]["alarms_pending"], report["waiting"]["alarms_dead"]) == (2, 1)


class TestRun:
    """``run`` reports bad arguments as errors, not tracebacks."""

    def test_bad_factory_is_an_error(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """An --agents spec that does not import is one error line and exit 1."""
        code, _, err = run(capsys, "run", db, "--agents", "no_such_module:make")
        assert code == 1 and "cannot load --agents 'no_such_module:make'" in err
        code, _, err = run(capsys, "run", db, "--agents", "nocolon")
        assert code == 1 and "MODULE:FUNCTION" in err

    def test_the_callers_logging_is_given_back(
        self, db: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """``run`` called as a function leaves the root logger as it found it, also when
        it fails: a handler left on this test's stderr broke every later test's logging."""
        root = logging.getLogger()
        before = (list(root.handlers), root.level)
        code, _, _ = run(
            capsys, "run", db, "--agents", "no_such_module:make", "--log-level", "debug"
        )
        assert code == 1
        assert (list(root.handlers), root.level) == before

    def test_bad_config_is_an_error(
        self, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A config file that does not parse stops run before it starts."""
        config = tmp_path / "bad.toml"
        config.write_text("[runner]\nlease = 3\n")
        argv = ["run", db, "--agents", "alarms_app:make_agent", "--config", str(config)]
        code, _, err = run(capsys, *argv)
        assert code == 1 and "unknown key(s) ['lease'] in [runner]" in err


@pytest.mark.processes
class TestImports:
    """The read commands never import litellm."""

    @pytest.mark.parametrize("command", ["alarms", "status"])
    def test_no_litellm(self, db: str, command: str) -> None:
        """alarms and status run without loading litellm or effectful's LLM layer."""
        result = run_cli_in_fresh_python(command, db)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[-1] == "loaded: []"
