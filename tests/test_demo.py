"""The multi-agent example (examples/multi_agent) runs offline, builds a working textkit,
replays every step on a re-run, and resumes after Ctrl-C.

Each demo run is a child process that pays ~4 s to import litellm, so the runs are
shared through module-scoped fixtures.
"""

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DEMO = Path(__file__).parents[1] / "examples" / "multi_agent" / "workflow.py"
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

pytestmark = pytest.mark.slow


def demo_command(folder: Path, *options: str) -> list[str]:
    """The command that runs the demo offline into ``folder``."""
    db, project = folder / "demo.db", folder / "project"
    return [sys.executable, str(DEMO), "--db", str(db), "--out", str(project), *options]


def run_demo(folder: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Run the demo to the end and capture its output."""
    return subprocess.run(
        demo_command(folder, *options), capture_output=True, text=True, env=ENV, timeout=300
    )


def model_calls(stdout: str) -> int:
    """The number on the demo's last ``model calls: N`` line."""
    found = re.findall(r"^model calls: (\d+)$", stdout, re.MULTILINE)
    assert found, stdout
    return int(found[-1])


def journal(stdout: str) -> list[tuple[str, str]]:
    """The journal lines of the output, as (outcome, step key)."""
    return re.findall(r"^\s*(live|replayed|failed)  (\S+) ", stdout, re.MULTILINE)


def snapshot(project: Path) -> dict[str, bytes]:
    """Every file the agents wrote, by relative path."""
    return {
        path.relative_to(project).as_posix(): path.read_bytes()
        for path in sorted(project.rglob("*"))
        if path.is_file() and not {"__pycache__", ".pytest_cache"} & set(path.parts)
    }


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """One uninterrupted run into a fresh folder, and the files it wrote."""
    folder = tmp_path_factory.mktemp("built")
    result = run_demo(folder)
    return {"folder": folder, "result": result, "files": snapshot(folder / "project")}


@pytest.fixture(scope="module")
def rerun(built: dict[str, Any]) -> dict[str, Any]:
    """The same command again, after the first run finished."""
    result = run_demo(built["folder"])
    return {"result": result, "files": snapshot(built["folder"] / "project")}


class TestFirstRun:
    def test_exits_zero_having_run_every_step_live(self, built: dict[str, Any]) -> None:
        """A fresh run succeeds, runs every step live and exercises the review-fix loop."""
        result = built["result"]
        assert result.returncode == 0, result.stdout + result.stderr
        steps = journal(result.stdout)
        assert {outcome for outcome, _ in steps} == {"live"}
        assert {key for _, key in steps} >= {"architect#0", "coder-1#0", "coder-2#0", "reviewer#0"}
        assert "sent redact back" in result.stdout
        assert model_calls(result.stdout) > 0

    def test_writes_a_textkit_whose_own_tests_pass(self, built: dict[str, Any]) -> None:
        """The generated package and tests exist, and pytest passes in that folder."""
        project = built["folder"] / "project"
        for name in ("slugify", "wrap", "redact"):
            assert f"textkit/{name}.py" in built["files"]
            assert f"tests/test_{name}.py" in built["files"]
        assert "textkit/__init__.py" in built["files"]
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=project,
            capture_output=True,
            text=True,
            env={**ENV, "PYTHONDONTWRITEBYTECODE": "1"},
            timeout=120,
        )
        assert tests.returncode == 0, tests.stdout + tests.stderr
        assert re.search(r"\d+ passed", tests.stdout)


class TestRerun:
    def test_replays_every_step_without_a_model_call(
        self, built: dict[str, Any], rerun: dict[str, Any]
    ) -> None:
        """Running again after completion replays every step and calls no model."""
        result = rerun["result"]
        assert result.returncode == 0, result.stdout + result.stderr
        assert model_calls(result.stdout) == 0
        first_steps = {key for _, key in journal(built["result"].stdout)}
        assert set(journal(result.stdout)) == {("replayed", key) for key in first_steps}

    def test_leaves_the_files_as_they_were(
        self, built: dict[str, Any], rerun: dict[str, Any]
    ) -> None:
        """The re-run ends with byte-identical files."""
        assert rerun["files"] == built["files"]


@pytest.mark.skipif(sys.platform == "win32", reason="sends SIGINT")
class TestCtrlC:
    def test_next_run_resumes_and_ends_the_same(
        self, tmp_path: Path, built: dict[str, Any]
    ) -> None:
        """After Ctrl-C mid-run, the next run replays what finished and builds the same files."""
        child = subprocess.Popen(
            demo_command(tmp_path, "--slow", "0.2"),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=ENV,
        )
        assert child.stdout is not None
        seen = []
        for line in child.stdout:  # stop it once coder-1 has finished its first module
            seen.append(line)
            if re.match(r"\s*live  coder-1#1 ", line):
                child.send_signal(signal.SIGINT)
                break
        seen.append(child.stdout.read())
        assert child.wait(timeout=60) == 130, "".join(seen)
        assert "interrupted" in "".join(seen)

        resumed = run_demo(tmp_path)
        assert resumed.returncode == 0, resumed.stdout + resumed.stderr
        outcomes = dict((key, outcome) for outcome, key in journal(resumed.stdout))
        assert outcomes["architect#0"] == outcomes["coder-1#0"] == "replayed"
        assert outcomes["coder-1#1"] == "live"
        assert model_calls(resumed.stdout) < model_calls(built["result"].stdout)
        assert snapshot(tmp_path / "project") == built["files"]


class TestFileTools:
    @pytest.fixture(scope="class")
    def workflow(self) -> ModuleType:
        """examples/multi_agent/workflow.py, imported without running it."""
        sys.path.insert(0, str(DEMO.parent))  # for its sibling offline_model.py
        try:
            spec = importlib.util.spec_from_file_location("multi_agent_workflow", DEMO)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
        finally:
            sys.path.remove(str(DEMO.parent))
        return module

    @pytest.mark.parametrize(
        "path", ["../escape.py", "/etc/passwd", "textkit/../../escape.py", ".", "link/x.py"]
    )
    def test_refuse_paths_outside_the_project(
        self, workflow: ModuleType, tmp_path: Path, path: str
    ) -> None:
        """write_file and read_file refuse a path that leads out of the project folder."""
        project = tmp_path / "project"
        project.mkdir()
        (project / "link").symlink_to(tmp_path)
        coder = workflow.Coder(agent_id="coder-test", project=project)
        with pytest.raises(ValueError, match="not a file inside the project folder"):
            coder.write_file(path, "print('hi')\n")
        with pytest.raises(ValueError, match="not a file inside the project folder"):
            coder.read_file(path)
        assert not (tmp_path / "escape.py").exists()

    def test_write_then_read_inside_the_project(
        self, workflow: ModuleType, tmp_path: Path
    ) -> None:
        """A relative path inside the folder is written, read back and remembered."""
        coder = workflow.Coder(agent_id="coder-test", project=tmp_path)
        assert coder.write_file("textkit/a.py", "x = 1\n") == "saved textkit/a.py (1 lines)"
        assert coder.read_file("textkit/a.py") == "x = 1\n"
        assert coder.list_files() == ["textkit/a.py"]
        assert coder.written == ["textkit/a.py"]
