"""``effectful-durable ui`` and ``effectful-durable diff`` as commands: what they print,
how they fail at start, and what they never import."""

import getpass
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import commit_message, edit_rows
from ui_content import DESK
from ui_server import ROOT, serving

from effectful_durable import Store
from effectful_durable.cli import main
from effectful_durable.store.engine.sqlite.migrations import SCHEMA_VERSION

pytestmark = pytest.mark.slow


def fresh_python(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60
    )


class TestDiff:
    def test_prints_each_part(
        self, sqlite_content: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The diff lists messages per conversation, alarms and approvals, one line each."""
        assert main(["diff", sqlite_content, DESK, "1", "9"]) == 0
        out = capsys.readouterr().out
        assert out.startswith("desk: v1 (turn) -> v9 (compaction)")
        assert "conversation chat: 4 messages added, 0 removed" in out
        assert "conversation default: 8 messages added, 0 removed" in out
        assert "\nalarms\n" in out and "approvals asked or used in between" in out

    def test_json_is_the_library_diff(
        self, sqlite_content: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--json prints Store.diff, every message included."""
        assert main(["diff", sqlite_content, DESK, "9", "1", "--json"]) == 0
        printed = json.loads(capsys.readouterr().out)
        with Store(sqlite_content, readonly=True) as store:
            diff = store.diff(DESK, 9, 1, limit=None)
        assert printed["before"]["version"] == 9 and printed["after"]["version"] == 1
        assert [c["removed_count"] for c in printed["conversations"]] == [
            c.removed_count for c in diff.conversations
        ]
        assert printed["alarms"][0]["op"] == "removed"

    def test_an_unknown_version(
        self, sqlite_content: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A version the agent does not have is one line and exit 1."""
        assert main(["diff", sqlite_content, DESK, "1", "99"]) == 1
        assert capsys.readouterr().err.count("\n") == 1


class TestStart:
    @pytest.mark.parametrize("case", ["foreign", "newer", "missing", "server"])
    def test_a_bad_database_is_one_line(
        self, tmp_path: Path, case: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A file that is not ours, a newer schema, no file, an unreachable server: one
        line on stderr, exit 1, nothing served."""
        db = str(tmp_path / "state.db")
        if case == "foreign":
            Path(db).write_text("not a database" * 100)
        elif case == "newer":
            with Store(db) as store:
                commit_message(store, "bot", "hi")
            edit_rows(db, f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
        elif case == "server":
            db = "postgresql://nobody@127.0.0.1:1/nothing?connect_timeout=2"
        assert main(["ui", db, "--no-browser"]) == 1
        err = capsys.readouterr().err
        assert err.startswith("effectful-durable: error: ") and err.count("\n") == 1, err

    def test_an_empty_decider_is_one_line(
        self, sqlite_content: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """--by with no name: one line, exit 1, nothing served."""
        assert main(["ui", sqlite_content, "--no-browser", "--by", " "]) == 1
        err = capsys.readouterr().err
        assert (
            err == "effectful-durable: error: --by needs a name: the decisions made in "
            "the page are kept under it\n"
        )

    def test_without_the_extra_one_line_names_it(self, sqlite_content: str) -> None:
        """Without Starlette installed, `ui` says which extra to install, in one line."""
        script = (
            "import sys\nsys.modules['starlette'] = None\n"
            "from effectful_durable.cli import main\n"
            f"sys.exit(main(['ui', {sqlite_content!r}, '--no-browser']))\n"
        )
        ran = fresh_python(script)
        assert ran.returncode == 1
        assert ran.stderr.count("\n") == 1
        assert "pip install 'effectful-durable[ui]'" in ran.stderr

    def test_other_commands_never_import_the_page(self, sqlite_content: str) -> None:
        """The command line loads neither the page's libraries nor litellm for its reads."""
        script = (
            "import sys\nfrom effectful_durable.cli import main\n"
            f"main(['agents', {sqlite_content!r}])\n"
            f"main(['diff', {sqlite_content!r}, 'desk', '1', '2'])\n"
            "print([m for m in sys.modules if m.split('.')[0] in "
            "('starlette', 'uvicorn', 'jinja2', 'litellm')])\n"
        )
        ran = fresh_python(script)
        assert ran.stdout.strip().splitlines()[-1] == "[]", ran.stdout + ran.stderr


class TestServing:
    def test_prints_an_address_that_lets_a_browser_in(self, sqlite_content: str) -> None:
        """The printed address carries the token; it opens the agents list."""
        with serving(sqlite_content) as server:
            assert server.url.startswith("http://127.0.0.1:") and "?token=" in server.url
            with server.client() as client:
                page = client.get("/")
                assert page.status_code == 200 and DESK in page.text
            assert server.process.poll() is None

    def test_decisions_are_made_as_the_user_or_by(self, sqlite_content: str) -> None:
        """The page decides as the user who started it, or as --by NAME, and says so."""
        with serving(sqlite_content) as server, server.client() as client:
            assert (
                f"You decide as <strong>{getpass.getuser()}</strong>" in client.get("/inbox").text
            )
        with serving(sqlite_content, "--by", "carol") as server, server.client() as client:
            assert "You decide as <strong>carol</strong>" in client.get("/inbox").text
        assert "(deciding as carol)" in server.output[0]

    def test_a_non_loopback_host_warns(self, sqlite_content: str) -> None:
        """--host 0.0.0.0 prints a warning that the page is reachable from elsewhere."""
        with serving(sqlite_content, "--host", "0.0.0.0", "--read-only") as server:
            with server.client() as client:
                assert "read-only" in client.get("/").text
        assert "warning: serving on 0.0.0.0" in "".join(server.output)
