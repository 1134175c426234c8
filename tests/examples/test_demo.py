"""The multi-agent example (examples/multi_agent) runs offline, builds a working textkit,
replays every step on a re-run, and resumes after Ctrl-C.

Each demo run is a child process that pays seconds to import litellm, so the four runs
happen once, two at a time, in a module-scoped fixture. On a PostgreSQL database two
more runs (a first and a re-run) show the same journal and the same files.
"""

import dataclasses
import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pytest
from paths import ROOT

if TYPE_CHECKING:
    from postgres_server import PostgresServer

DEMO = ROOT / "examples" / "multi_agent" / "workflow.py"
ENV = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(sys.platform == "win32", reason="presses Ctrl-C with SIGINT"),
]


@dataclasses.dataclass
class Outcome:
    """How a demo run ended: its exit status and its output (stdout and stderr)."""

    returncode: int
    output: str


@dataclasses.dataclass
class Runs:
    """Four demo runs: into ``built`` (once, then again), and into another folder
    (interrupted with Ctrl-C, then resumed)."""

    built: Path
    first: Outcome
    first_files: dict[str, bytes]
    again: Outcome
    again_files: dict[str, bytes]
    stopped: Outcome
    resumed: Outcome
    resumed_files: dict[str, bytes]


def start(folder: Path, *options: str, db: str = "") -> subprocess.Popen[str]:
    """Start the demo, offline, with its project folder in ``folder`` and its database
    there too, or at ``db``."""
    db, project = db or str(folder / "demo.db"), folder / "project"
    return subprocess.Popen(
        [sys.executable, str(DEMO), "--db", db, "--out", str(project), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=ENV,
        # A shell starts background jobs with SIGINT ignored, and the child would
        # inherit that and never see Ctrl-C: give it the default disposition.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def finish(child: subprocess.Popen[str], before: str = "") -> Outcome:
    """Wait for the demo to end."""
    output, _ = child.communicate(timeout=300)
    return Outcome(child.returncode, before + output)


def interrupt(child: subprocess.Popen[str], pattern: str) -> Outcome:
    """Press Ctrl-C as soon as the demo prints a line matching ``pattern``."""
    assert child.stdout is not None
    lines = []
    for line in child.stdout:
        lines.append(line)
        if re.match(pattern, line):
            child.send_signal(signal.SIGINT)
            break
    return finish(child, "".join(lines))


def model_calls(output: str) -> int:
    """The number on the demo's last ``model calls: N`` line."""
    found = re.findall(r"^model calls: (\d+)$", output, re.MULTILINE)
    assert found, output
    return int(found[-1])


def journal(output: str) -> dict[str, str]:
    """The journal lines of the output: step key -> its last outcome."""
    lines = re.findall(r"^\s*(live|replayed|failed)  (\S+) ", output, re.MULTILINE)
    return {key: outcome for outcome, key in lines}


def snapshot(project: Path) -> dict[str, bytes]:
    """Every file the agents wrote, by relative path."""
    return {
        path.relative_to(project).as_posix(): path.read_bytes()
        for path in sorted(project.rglob("*"))
        if path.is_file() and not {"__pycache__", ".pytest_cache"} & set(path.parts)
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    """The four runs, two children at a time (each pays seconds to import litellm)."""
    built, stopped = tmp_path_factory.mktemp("built"), tmp_path_factory.mktemp("stopped")
    first_child = start(built)
    # Stop the second run once coder-1 has finished its first module.
    stopped_outcome = interrupt(start(stopped, "--slow", "0.2"), r"\s*live  coder-1#1 ")
    first = finish(first_child)
    first_files = snapshot(built / "project")
    again_child, resumed_child = start(built), start(stopped)
    again, resumed = finish(again_child), finish(resumed_child)
    return Runs(
        built,
        first,
        first_files,
        again,
        snapshot(built / "project"),
        stopped_outcome,
        resumed,
        snapshot(stopped / "project"),
    )


@dataclasses.dataclass
class PostgresRuns:
    """Two demo runs on a PostgreSQL database: a first one, then again."""

    first: Outcome
    first_files: dict[str, bytes]
    again: Outcome
    again_files: dict[str, bytes]


@pytest.fixture(scope="module")
def postgres_runs(
    tmp_path_factory: pytest.TempPathFactory, postgres_server: "PostgresServer"
) -> PostgresRuns:
    """A first run and a re-run of the demo with ``--db`` a PostgreSQL URL."""
    folder, url = tmp_path_factory.mktemp("postgres"), postgres_server.new_database()
    first = finish(start(folder, db=url))
    first_files = snapshot(folder / "project")
    again = finish(start(folder, db=url))
    postgres_server.drop_database(url)
    return PostgresRuns(first, first_files, again, snapshot(folder / "project"))


class TestFirstRun:
    def test_exits_zero_having_run_every_step_live(self, runs: Runs) -> None:
        """A fresh run succeeds, runs every step live and exercises the review-fix loop."""
        assert runs.first.returncode == 0, runs.first.output
        steps = journal(runs.first.output)
        assert set(steps.values()) == {"live"}
        assert {"architect#0", "coder-1#0", "coder-2#0", "reviewer#0"} <= steps.keys()
        assert "sent redact back" in runs.first.output
        assert model_calls(runs.first.output) > 0

    def test_writes_a_textkit_whose_own_tests_pass(self, runs: Runs) -> None:
        """The generated package and tests exist, and pytest passes in that folder."""
        for name in ("slugify", "wrap", "redact"):
            assert f"textkit/{name}.py" in runs.first_files
            assert f"tests/test_{name}.py" in runs.first_files
        assert "textkit/__init__.py" in runs.first_files
        tests = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
            cwd=runs.built / "project",
            capture_output=True,
            text=True,
            env={**ENV, "PYTHONDONTWRITEBYTECODE": "1"},
            timeout=120,
        )
        assert tests.returncode == 0, tests.stdout + tests.stderr
        assert re.search(r"\d+ passed", tests.stdout)


class TestRerun:
    def test_replays_every_step_without_a_model_call(self, runs: Runs) -> None:
        """Running again after completion replays every step and calls no model."""
        assert runs.again.returncode == 0, runs.again.output
        assert model_calls(runs.again.output) == 0
        first_steps = journal(runs.first.output).keys()
        assert journal(runs.again.output) == dict.fromkeys(first_steps, "replayed")

    def test_leaves_the_files_as_they_were(self, runs: Runs) -> None:
        """The re-run ends with byte-identical files."""
        assert runs.again_files == runs.first_files


class TestCtrlC:
    def test_stops_with_status_130(self, runs: Runs) -> None:
        """Ctrl-C mid-run stops every thread, fails the running steps, and exits 130."""
        assert runs.stopped.returncode == 130, runs.stopped.output
        assert "interrupted" in runs.stopped.output
        assert "failed" in journal(runs.stopped.output).values()

    def test_next_run_resumes_and_ends_the_same(self, runs: Runs) -> None:
        """The next run replays what finished, redoes the rest, and writes the same files."""
        assert runs.resumed.returncode == 0, runs.resumed.output
        steps = journal(runs.resumed.output)
        assert steps["architect#0"] == steps["coder-1#0"] == "replayed"
        assert steps["coder-1#1"] == "live"
        assert model_calls(runs.resumed.output) < model_calls(runs.first.output)
        assert runs.resumed_files == runs.first_files


class TestOnPostgres:
    def test_first_run_writes_what_it_writes_with_a_file(
        self, runs: Runs, postgres_runs: PostgresRuns
    ) -> None:
        """On a PostgreSQL URL the first run runs the same steps live and writes the same
        files as with a database file."""
        assert postgres_runs.first.returncode == 0, postgres_runs.first.output
        assert journal(postgres_runs.first.output) == journal(runs.first.output)
        assert postgres_runs.first_files == runs.first_files

    def test_rerun_replays_every_step(self, postgres_runs: PostgresRuns) -> None:
        """A re-run on the same database replays every step without a model call."""
        assert postgres_runs.again.returncode == 0, postgres_runs.again.output
        assert model_calls(postgres_runs.again.output) == 0
        steps = journal(postgres_runs.first.output).keys()
        assert journal(postgres_runs.again.output) == dict.fromkeys(steps, "replayed")
        assert postgres_runs.again_files == postgres_runs.first_files


@pytest.fixture(scope="module")
def workflow() -> ModuleType:
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


class TestFileTools:
    @pytest.mark.parametrize(
        "path", ["../escape.py", "{tmp}/escape.py", "textkit/../../escape.py", ".", "link/x.py"]
    )
    def test_refuse_paths_outside_the_project(
        self, workflow: ModuleType, tmp_path: Path, path: str
    ) -> None:
        """write_file and read_file refuse a path that leads out of the project folder."""
        project = tmp_path / "project"
        project.mkdir()
        (project / "link").symlink_to(tmp_path)
        coder = workflow.Coder(agent_id="coder-test", project=project)
        path = path.format(tmp=tmp_path)  # "{tmp}/…" is an absolute path outside the project
        with pytest.raises(ValueError, match="not a file inside the project folder"):
            coder.write_file(path, "print('hi')\n")
        with pytest.raises(ValueError, match="not a file inside the project folder"):
            coder.read_file(path)
        assert not (tmp_path / "escape.py").exists()
        assert not (tmp_path / "x.py").exists()

    def test_write_then_read_inside_the_project(
        self, workflow: ModuleType, tmp_path: Path
    ) -> None:
        """A relative path inside the folder is written, read back and remembered."""
        coder = workflow.Coder(agent_id="coder-test", project=tmp_path)
        assert coder.write_file("textkit/a.py", "x = 1\n") == "saved textkit/a.py (1 lines)"
        assert coder.read_file("textkit/a.py") == "x = 1\n"
        assert coder.list_files() == ["textkit/a.py"]
        assert coder.written == ["textkit/a.py"]
