"""`effectful-durable check-upgrade`, `migrate-state` and `retarget` from the shell, and the
code version that `versions` and `history --json` show."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import persisted
from upgrade_helpers import PLANTS, REFUND_CALL, REFUNDS, RENAME_REFUND, edited

from effectful_durable import Store, TurnSuspended
from effectful_durable.cli import main
from effectful_durable.testing import FakeLLM, ToolCall

ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


def suspended_refund(db: str, folder: Path, code_version: str | None = None) -> str:
    """A refund that waits for approval, asked by the example's agent; its approval id."""
    shop = edited(REFUNDS, folder)
    with (
        persisted(db, FakeLLM([REFUND_CALL]), code_version=code_version),
        pytest.raises(TurnSuspended) as suspended,
    ):
        shop.SupportAgent(agent_id="support-ann").on_event("refund_request", "{}")
    return suspended.value.approvals[0].approval_id


def factory_module(folder: Path, name: str, *edits: tuple[str, str]) -> str:
    """Write ``name.py`` in ``folder``: an edited copy of the refunds example with ``make``."""
    text = REFUNDS.read_text()
    for old, new in edits:
        text = text.replace(old, new)
    text += "\n\ndef make(agent_id):\n    return SupportAgent(agent_id=agent_id)\n"
    (folder / f"{name}.py").write_text(text)
    return f"{name}:make"


class TestCheckCommand:
    @pytest.mark.processes
    def test_a_real_process(self, tmp_path: Path) -> None:
        """In a process of its own: exit 3 and JSON for a renamed tool, 0 for the same code."""
        db = str(tmp_path / "state.db")
        approval = suspended_refund(db, tmp_path)
        broken = factory_module(tmp_path, "shop_renamed", RENAME_REFUND)
        same = factory_module(tmp_path, "shop_same")
        command = [sys.executable, "-m", "effectful_durable", "check-upgrade", db, "--json"]
        done = subprocess.run(
            [*command, "--agents", broken], cwd=tmp_path, env=ENV, capture_output=True, text=True
        )
        assert done.returncode == 3, done.stderr
        report = json.loads(done.stdout)
        assert report["ok"] is False
        assert {(b["kind"], b["subject"]) for b in report["breaks"]} == {
            ("approval", approval),
            ("history", "default"),
        }
        done = subprocess.run(
            [*command, "--agents", same], cwd=tmp_path, env=ENV, capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["ok"] is True
        saved = json.loads(Path(f"{db}.check.json").read_text())
        assert saved["ok"] is True and saved["in_flight"]["approvals"] == 1

    def test_words_and_report(
        self,
        store_url: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """The report in words: each break with its way forward; --report keeps the JSON."""
        monkeypatch.chdir(tmp_path)
        suspended_refund(store_url, tmp_path, code_version="v1")
        broken = factory_module(tmp_path, "shop_words", RENAME_REFUND)
        report = tmp_path / "report.json"
        assert (
            main(
                [
                    "check-upgrade",
                    store_url,
                    "--agents",
                    broken,
                    "--code-version",
                    "v2",
                    "--report",
                    str(report),
                ]
            )
            == 3
        )
        out = capsys.readouterr().out
        assert "code versions in flight: v1 (1)" in out and "new code: v2" in out
        assert "no tool 'refund'" in out and "-> deny it" in out
        assert "nothing was written" in out
        assert json.loads(report.read_text())["code_version"] == "v2"

    def test_usage(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """No --agents, an unloadable factory, a missing file: one line each; check
        itself only checks the file, and takes none of check-upgrade's flags."""
        db = str(tmp_path / "state.db")
        suspended_refund(db, tmp_path)
        assert main(["check-upgrade", db, "--workflow", "x:y"]) == 2
        assert "the following arguments are required: --agents" in capsys.readouterr().err
        assert main(["check", db, "--agents", "x:y"]) == 2
        assert "unrecognized arguments: --agents x:y" in capsys.readouterr().err
        assert main(["check-upgrade", db, "--agents", "no_such_module:make"]) == 1
        assert "cannot load --agents 'no_such_module:make'" in capsys.readouterr().err
        assert main(["check-upgrade", str(tmp_path / "none.db"), "--agents", "x:y"]) == 1
        assert "nothing was created" in capsys.readouterr().err
        assert not (tmp_path / "none.db").exists()


class TestRepairs:
    def test_retarget(
        self,
        store_url: str,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        """`retarget` points a waiting approval at the renamed tool; a bad one changes nothing."""
        monkeypatch.chdir(tmp_path)
        approval = suspended_refund(store_url, tmp_path)
        renamed = factory_module(tmp_path, "shop_retarget", RENAME_REFUND)
        assert main(["retarget", store_url, approval, "refund_now", "--agents", renamed]) == 1
        assert "has no tool 'refund_now'" in capsys.readouterr().err
        bad = ["--arguments", '{"order": "A-1002"}']
        assert (
            main(["retarget", store_url, approval, "pay_refund", "--agents", renamed, *bad]) == 1
        )
        assert "missing a required argument: 'amount'" in capsys.readouterr().err
        assert main(["retarget", store_url, approval, "pay_refund", "--agents", renamed]) == 0
        assert "now asks to run pay_refund" in capsys.readouterr().out
        with Store(store_url, readonly=True) as store:
            found = store.approval(approval)
        assert (found.tool, found.status) == ("pay_refund", "pending")
        assert "re-targeted from refund to pay_refund" in str(found.reason)

    def test_migrate_state(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`migrate-state --dry-run` says, `migrate-state` commits, a second run finds nothing."""
        monkeypatch.chdir(tmp_path)
        db = str(tmp_path / "plants.db")
        carer = edited(PLANTS, tmp_path).PlantCarer(agent_id="basil")
        with persisted(db, FakeLLM([ToolCall("notify", {"message": "water"}), "ok"])):
            carer.ask("basil")
        text = PLANTS.read_text().replace(
            "    notes_sent: list[str]", "    __state_version__ = 2\n    notes: list[str]"
        )
        text += (
            "\n\n@migrates_state(PlantCarer, from_version=1)\n"
            "def rename(fields):\n    fields['notes'] = fields.pop('notes_sent')\n"
            "    return fields\n\n\n"
            "def make(agent_id):\n    return PlantCarer(agent_id=agent_id)\n"
        )
        text = text.replace("    Store,\n)", "    Store,\n    migrates_state,\n)")
        (tmp_path / "plants_v2.py").write_text(text)
        assert main(["migrate-state", db, "--agents", "plants_v2:make", "--dry-run"]) == 0
        assert (
            "basil: fields from state version 1 to 2: would be migrated" in capsys.readouterr().out
        )
        assert main(["migrate-state", db, "--agents", "plants_v2:make"]) == 0
        assert "version 2 committed" in capsys.readouterr().out
        assert main(["migrate-state", db, "--agents", "plants_v2:make"]) == 0
        assert "every agent's fields are at" in capsys.readouterr().out


class TestCodeVersion:
    def test_versions_and_history(
        self, store_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Each turn records the handler's code_version; versions and history --json show it."""
        carer = edited(PLANTS, tmp_path).PlantCarer(agent_id="basil")
        with persisted(store_url, FakeLLM(["one"]), code_version="abc123"):
            carer.ask("first")
        first = len(carer.__history__)
        with persisted(store_url, FakeLLM(["two"])):
            carer.ask("second")
        with Store(store_url, readonly=True) as store:
            assert [v.code_version for v in store.versions("basil")] == ["abc123", None]
        assert main(["versions", store_url, "basil"]) == 0
        out = capsys.readouterr().out
        assert "code_version" in out.splitlines()[0] and "abc123" in out
        assert main(["history", store_url, "basil", "--json"]) == 0
        marks = [m.get("durable") for m in json.loads(capsys.readouterr().out)]
        assert marks == [{"code_version": "abc123"}] * first + [None] * (len(marks) - first)
        assert len(marks) > first

    def test_bad_code_version(self, tmp_path: Path) -> None:
        """A code_version that is not a short text is refused when the handler is made."""
        from effectful_durable import PersistenceHandler

        with pytest.raises(ValueError, match="code_version must be"):
            PersistenceHandler(str(tmp_path / "x.db"), code_version="")


@pytest.mark.processes
def test_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal the check draws its progress, redrawn in place, and ends the line."""
    import pty

    db = str(tmp_path / "state.db")
    suspended_refund(db, tmp_path)
    same = factory_module(tmp_path, "shop_tty")
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "effectful_durable", "check-upgrade", db, "--agents", same],
            cwd=tmp_path,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=120,
        )
        os.close(follower)
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 4096)
            except OSError:  # the terminal's other end is closed: all was read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(leader)
    assert done.returncode == 0, done.stdout
    assert b"\rchecking [##############################] 1/1 agents" in drawn
    assert drawn.endswith(b"\r\n")
    assert "checking" not in done.stdout  # the bar is on the terminal, the report on stdout


def test_handlers_name_the_new_code_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """--handlers: the code version of the stack's PersistenceHandler is the new code's."""
    monkeypatch.chdir(tmp_path)
    db = str(tmp_path / "state.db")
    suspended_refund(db, tmp_path, code_version="v1")
    same = factory_module(tmp_path, "shop_stack")
    (tmp_path / "stack.py").write_text(
        "from effectful_durable import PersistenceHandler\n\n\n"
        f"def handlers(config):\n    return [PersistenceHandler({db!r}, code_version='v2')]\n"
    )
    assert (
        main(["check-upgrade", db, "--agents", same, "--handlers", "stack:handlers", "--json"])
        == 0
    )
    report = json.loads(capsys.readouterr().out)
    assert (report["code_version"], report["code_versions"]) == ("v2", {"v1": 1})
