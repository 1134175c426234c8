"""The effectful-durable command: every subcommand, its output, its errors, and no litellm.

Reads, repairs and their errors run on PostgreSQL too (``each_db``, ``TestOnPostgres``);
what is about files (missing, empty or foreign files, a file's bytes left as they
were, vacuum, backup) stays on SQLite.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from postgres_server import PostgresServer

from effectful_durable import CompactionHandler, PersistenceHandler, Store
from effectful_durable.cli import main
from effectful_durable.store.copy import copy_store
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall
from tests.helpers import (
    Assistant,
    Keeper,
    free_port,
    persisted,
    persisted_rows,
    run_cli_in_fresh_python,
    running,
)

READS = [
    ["agents"],
    ["history", "bot"],
    ["history", "talker", "--all"],
    ["state", "bot"],
    ["memory", "bot"],
    ["versions", "bot"],
    ["handoffs"],
    ["workflows"],
    ["steps", "wf"],
    ["check"],
    ["alarms"],
    ["alarms", "--all", "--agent", "bot"],
    ["status"],
]


def reply(call: FakeCall) -> str:
    text = call.last_user_text
    return "SUMMARY of the chat" if "Summarise the conversation" in text else f"re: {text}"


@pytest.fixture(scope="module")
def template_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A database built once: 'bot' at version 2, 'talker' compacted at version 5,
    'planner' made by a one-step workflow 'wf', and a failed first turn of 'flaky'."""
    path = tmp_path_factory.mktemp("cli") / "template.db"
    with persisted(path, FakeLLM(["Paris.", "About two million."])):
        bot = Assistant(agent_id="bot")
        bot.ask("What is the capital of France?")
        bot.turns = 2
        bot.ask("How many people live there?")
    persistence = PersistenceHandler(path)
    try:
        compaction = CompactionHandler(max_messages=8, keep_recent=3)
        with running(FakeLLM(respond=reply), compaction, persistence):
            talker = Assistant(agent_id="talker")
            for n in range(4):
                talker.ask(f"question {n}")
    finally:
        persistence.close()
    with persisted(path, FakeLLM(["1. outline 2. draft"]), workflow="wf"):
        Assistant(agent_id="planner").ask("Plan the weekly report")
    with persisted(path, FakeLLM([RuntimeError("model down")])), pytest.raises(RuntimeError):
        Assistant(agent_id="flaky").ask("hello?")
    return path


@pytest.fixture
def db(template_db: Path, tmp_path: Path) -> str:
    """A fresh copy of the template database for one test."""
    copy = tmp_path / "state.db"
    for suffix in ("", "-wal"):  # the WAL too, should a reader have kept it alive
        if Path(f"{template_db}{suffix}").exists():
            shutil.copy(f"{template_db}{suffix}", f"{copy}{suffix}")
    return str(copy)


@pytest.fixture(params=["sqlite", "postgres"])
def each_db(request: pytest.FixtureRequest, db: str) -> str:
    """A fresh copy of the template database: the file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return db
    url: str = request.getfixturevalue("postgres_url")
    with Store(db, readonly=True) as source, Store(url) as target:
        copy_store(source, target)
    return url


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Run the command in this process; return exit code, stdout and stderr."""
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def aligned(out: str) -> bool:
    """Whether every cell of a printed table starts where its column's header does."""
    lines = out.splitlines()
    starts = [i for i, c in enumerate(lines[0]) if c != " " and (i == 0 or lines[0][i - 1] == " ")]
    return all(
        line[start] != " " and (start == 0 or line[start - 1] == " ")
        for line in lines[1:]
        for start in starts
    )


def table(out: str) -> list[list[str]]:
    """The whitespace-split cells of each printed line."""
    return [line.split() for line in out.splitlines()]


class TestReads:
    def test_agents(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """agents prints a header and one aligned row per agent, times in UTC to the second."""
        code, out, err = run(capsys, "agents", db)
        assert code == 0 and err == ""
        rows = table(out)
        assert rows[0] == ["agent_id", "version", "messages", "created_at", "updated_at"]
        assert [row[:3] for row in rows[1:]] == [
            ["bot", "2", "5"],
            ["planner", "1", "3"],
            ["talker", "5", "5"],
        ]
        assert datetime.fromisoformat(rows[1][4]).microsecond == 0
        assert rows[1][4].endswith("Z")
        assert aligned(out)

    def test_history(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """history prints one line per message: role, then its text on one line."""
        code, out, _ = run(capsys, "history", db, "bot")
        assert code == 0
        lines = out.splitlines()
        assert [line.split()[0] for line in lines] == [
            "system",
            "user",
            "assistant",
            "user",
            "assistant",
        ]
        assert lines[2].split(maxsplit=1)[1] == "Paris."
        assert all(len(line) <= 100 for line in lines)

    def test_history_at_a_version(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """history --version N prints the messages as they were at version N."""
        _, out, _ = run(capsys, "history", db, "bot", "--version", "1")
        assert len(out.splitlines()) == 3 and "two million" not in out

    def test_history_all_marks_compaction(
        self, db: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """history --all adds the compacted originals and marks them and the summary."""
        _, active, _ = run(capsys, "history", db, "talker")
        _, everything, _ = run(capsys, "history", db, "talker", "--all")
        assert "[compacted" not in active and len(active.splitlines()) == 5
        lines = everything.splitlines()
        assert len(lines) == 10
        assert sum(line.split()[1:4] == ["[compacted", "in", "v5]"] for line in lines) == 5
        [summary] = [line for line in lines if "[summary of 5]" in line]
        role, text = summary.split("[summary of 5]")
        assert role.strip() == "user" and text.strip().startswith("Summary of the earlier")
        assert all(len(line) <= 100 for line in lines)

    def test_state(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """state prints one field per line with its JSON value, at any version."""
        _, out, _ = run(capsys, "state", db, "bot")
        rows = {row[0]: " ".join(row[1:]) for row in table(out)[1:]}
        assert rows["turns"] == "2" and rows["mood"] == '"calm"'
        _, out, _ = run(capsys, "state", db, "bot", "--version", "1")
        assert ["turns", "0"] in table(out)

    def test_versions(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """versions lists kind, template, counts and the compaction's detail."""
        _, out, _ = run(capsys, "versions", db, "talker")
        rows = table(out)
        assert aligned(out)
        assert rows[0][:7] == [
            "version",
            "kind",
            "conversation",
            "template",
            "added",
            "removed",
            "state_changed",
        ]
        assert [row[:6] for row in rows[1:]] == [
            ["1", "turn", "default", "ask", "3", "0"],
            ["2", "turn", "default", "ask", "2", "0"],
            ["3", "turn", "default", "ask", "2", "0"],
            ["4", "turn", "default", "ask", "2", "0"],
            ["5", "compaction", "default", "summarize_context", "1", "5"],
        ]
        assert out.splitlines()[-1].split()[-1].startswith("summary_id=summary-")

    def test_handoffs(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """handoffs shows the turn that failed, with its error."""
        _, out, _ = run(capsys, "handoffs", db)
        [header, row] = out.splitlines()
        assert header.split()[:4] == ["agent_id", "conversation", "status", "template"]
        assert row.split()[:5] == ["flaky", "default", "failed", "ask", "0"]
        assert "model down" in row

    def test_workflows_and_steps(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """workflows counts steps by status; steps lists key, status and result."""
        _, out, _ = run(capsys, "workflows", db)
        assert table(out)[1][:5] == ["wf", "1", "1", "0", "0"]
        _, out, _ = run(capsys, "steps", db, "wf")
        row = table(out)[1]
        assert row[:5] == ["1", "planner#0", "ask", "done", "1"]
        assert out.rstrip().endswith("1. outline 2. draft")

    def test_check(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """check reports integrity ok, the schema, counts and the file size, and exits 0."""
        code, out, _ = run(capsys, "check", db)
        facts = dict(table(out))
        assert code == 0 and facts["integrity"] == "ok"
        assert (facts["agents"], facts["versions"]) == ("3", "8")
        assert {"schema", "messages", "bytes"} <= facts.keys()

    def test_check_failure_exits_1(
        self, db: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """check exits 1 and says why when the integrity check finds damage."""
        damaged: dict[str, Any] = {"integrity": "*** in database main ***", "schema": 1}
        monkeypatch.setattr(Store, "check", lambda self: damaged)
        code, _, err = run(capsys, "check", db)
        assert code == 1 and "failed PRAGMA integrity_check" in err

    def test_reads_change_nothing(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """Every read command leaves the database file byte for byte as it was."""
        before = Path(db).read_bytes()
        for argv in READS:
            assert run(capsys, argv[0], db, *argv[1:])[0] == 0, argv
        assert Path(db).read_bytes() == before


class TestJson:
    @pytest.mark.parametrize("argv", READS, ids=[" ".join(argv) for argv in READS])
    def test_every_read_prints_json(
        self, db: str, capsys: pytest.CaptureFixture[str], argv: list[str]
    ) -> None:
        """Every read command takes --json and prints one JSON document."""
        code, out, _ = run(capsys, argv[0], db, *argv[1:], "--json")
        assert code == 0
        json.loads(out)

    def test_records_and_times(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """Records print as objects with their fields, and datetimes as ISO strings in UTC."""
        _, out, _ = run(capsys, "agents", db, "--json")
        agents = json.loads(out)
        assert [a["agent_id"] for a in agents] == ["bot", "planner", "talker"]
        assert set(agents[0]) == {
            "agent_id",
            "version",
            "messages",
            "created_at",
            "updated_at",
            "subject",
        }
        assert datetime.fromisoformat(agents[0]["updated_at"]).utcoffset() is not None
        _, out, _ = run(capsys, "steps", db, "wf", "--json")
        [step] = json.loads(out)
        assert step["key"] == "planner#0" and step["result"] == "1. outline 2. draft"

    def test_history_and_state(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """history --json prints the messages themselves; state --json the fields."""
        _, out, _ = run(capsys, "history", db, "talker", "--all", "--json")
        marks = [m.get("durable") for m in json.loads(out)]
        assert marks.count({"compacted_in": 5}) == 5 and {"summary_of": 5} in marks
        _, out, _ = run(capsys, "state", db, "bot", "--json")
        assert json.loads(out)["notes"] == []


@pytest.fixture
def memory_db(tmp_path: Path) -> str:
    """Agent 'keeper' at version 2: two keys, then one more key, a note and a deletion."""
    path = tmp_path / "memory.db"
    script = [
        [
            ToolCall("put_state", {"key": "user.name", "value": '"Alice"'}),
            ToolCall("put_state", {"key": "essay", "value": json.dumps("long " * 20)}),
        ],
        "done",
        [
            ToolCall("put_state", {"key": "count", "value": "2"}),
            ToolCall("delete_state_key", {"key": "essay"}),
            ToolCall("add_to_context", {"item": "Likes tea."}),
        ],
        "done",
    ]
    with persisted(path, FakeLLM(script)):
        keeper = Keeper(agent_id="keeper")
        keeper.ask("one")
        keeper.ask("two")
    return str(path)


class TestMemoryCommand:
    """``memory DB AGENT``: the keys and notes an agent kept, at any version."""

    def test_table(self, memory_db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """The keys print as key, bytes and JSON value; the notes below them with their time."""
        code, out, _ = run(capsys, "memory", memory_db, "keeper")
        assert code == 0
        keys, notes = out.split("\n\n")
        assert table(keys) == [
            ["key", "bytes", "value"],
            ["count", "1", "2"],
            ["user.name", "7", '"Alice"'],
        ]
        assert aligned(keys)
        assert notes.splitlines()[0].split() == ["note", "added", "text"]
        assert notes.splitlines()[1].endswith("Likes tea.")

    def test_version_and_json(self, memory_db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """--version N prints what version N held; --json prints keys and notes as JSON."""
        code, out, _ = run(capsys, "memory", memory_db, "keeper", "--version", "1", "--json")
        assert code == 0
        assert json.loads(out) == {
            "keys": {"essay": "long " * 20, "user.name": "Alice"},
            "notes": [],
        }
        _, out, _ = run(capsys, "memory", memory_db, "keeper", "--json")
        [note] = json.loads(out)["notes"]
        assert note["text"] == "Likes tea."
        assert datetime.fromisoformat(note["at"]).utcoffset() is not None

    def test_errors(self, memory_db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown agent or version is one error line and exit code 1."""
        code, _, err = run(capsys, "memory", memory_db, "nobody")
        assert code == 1 and "no agent 'nobody'" in err
        code, _, err = run(capsys, "memory", memory_db, "keeper", "--version", "9")
        assert code == 1 and "versions 1 to 2" in err

    def test_reads_change_nothing(
        self, memory_db: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """The memory command leaves the file byte for byte as it was."""
        before = Path(memory_db).read_bytes()
        assert run(capsys, "memory", memory_db, "keeper")[0] == 0
        assert Path(memory_db).read_bytes() == before


class TestMaintenance:
    def test_rollback(self, each_db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """rollback commits a new version equal to the old one and says so."""
        code, out, _ = run(capsys, "rollback", each_db, "bot", "1")
        assert code == 0 and out == "bot: version 3 committed, equal to version 1\n"
        with Store(each_db, readonly=True) as store:
            assert len(store.history("bot")) == 3
            assert store.state("bot")["turns"] == 0
        _, out, _ = run(capsys, "versions", each_db, "bot")
        assert table(out)[-1][:2] == ["3", "rollback"] and table(out)[-1][-1] == "to=1"

    def test_fork(self, each_db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """fork copies an agent at a version, latest by default, into a new agent."""
        code, out, _ = run(capsys, "fork", each_db, "bot", "twin")
        assert code == 0
        assert out == "twin: version 1 committed, a copy of bot version 2 (5 messages)\n"
        _, out, _ = run(capsys, "fork", each_db, "bot", "early", "--version", "1")
        assert out == "early: version 1 committed, a copy of bot version 1 (3 messages)\n"
        with Store(each_db, readonly=True) as store:
            assert store.history("twin") == store.history("bot")
        _, out, _ = run(capsys, "versions", each_db, "early")
        assert out.splitlines()[-1].endswith("from=bot version=1")

    def test_delete(self, each_db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """delete --yes removes the agent."""
        code, out, _ = run(capsys, "delete", each_db, "bot", "--yes")
        assert code == 0 and out == "bot: deleted\n"
        with Store(each_db, readonly=True) as store:
            assert [a.agent_id for a in store.agents()] == ["planner", "talker"]

    def test_delete_needs_yes(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """delete without --yes refuses with exit 2, a clear message, and no change."""
        before = Path(db).read_bytes()
        code, out, err = run(capsys, "delete", db, "bot")
        assert code == 2 and out == ""
        assert err.startswith("effectful-durable: error: delete removes agent 'bot'")
        assert "--yes" in err
        assert Path(db).read_bytes() == before

    def test_reset_workflow(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """reset-workflow asks for --yes before deleting the agent the workflow created."""
        before = Path(db).read_bytes()
        code, out, err = run(capsys, "reset-workflow", db, "wf")
        assert code == 2 and out == ""
        assert "would delete 'planner'" in err and "--yes" in err
        assert Path(db).read_bytes() == before
        code, out, _ = run(capsys, "reset-workflow", db, "wf", "--yes")
        assert code == 0
        assert out.splitlines() == [
            "wf: steps 1 and later forgotten",
            "planner: deleted (the workflow created it)",
        ]
        with Store(db, readonly=True) as store:
            assert store.workflows() == []

    def test_reset_workflow_from_a_later_step(
        self, each_db: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """reset-workflow --from-step past the last step touches no agent."""
        code, out, _ = run(capsys, "reset-workflow", each_db, "wf", "--from-step", "2")
        assert code == 0 and out == "wf: steps 2 and later forgotten\n"
        with Store(each_db, readonly=True) as store:
            assert len(store.steps("wf")) == 1


class TestRetention:
    def test_prune_needs_yes_and_a_rule(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """prune without --yes, or without --keep or --older-than, is a usage error."""
        before = Path(db).read_bytes()
        code, _, err = run(capsys, "prune", db, "--keep", "1")
        assert code == 2 and "every agent" in err and "--yes" in err
        code, _, err = run(capsys, "prune", db, "bot", "--yes")
        assert code == 2 and "--keep N, --older-than AGE" in err
        code, _, err = run(capsys, "prune", db, "--older-than", "soon", "--yes")
        assert code == 2 and "7d" in err
        assert Path(db).read_bytes() == before

    def test_prune_then_vacuum(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """prune --keep 1 leaves one version per agent; vacuum gives the space back."""
        code, out, _ = run(capsys, "prune", db, "--keep", "1", "--yes")
        assert code == 0
        assert out.splitlines()[0].startswith("pruned 2 agents: ")  # bot and talker
        assert "wf: journal deleted" not in out  # planner's version 1 is its latest
        with Store(db, readonly=True) as store:
            assert [len(store.versions(a.agent_id)) for a in store.agents()] == [1, 1, 1]
        code, out, _ = run(capsys, "vacuum", db)
        assert code == 0 and "bytes given back" in out
        code, out, _ = run(capsys, "prune", db, "talker", "--older-than", "7d", "--yes")
        assert code == 0 and out.startswith("pruned 0 agents")

    def test_backup(self, db: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """backup writes a copy that reads back the same, and refuses an existing target."""
        target = tmp_path / "copy.db"
        code, out, _ = run(capsys, "backup", db, str(target))
        assert code == 0 and str(target) in out
        with Store(db, readonly=True) as source, Store(target, readonly=True) as copy:
            assert copy.history("talker", include_compacted=True) == source.history(
                "talker", include_compacted=True
            )
        code, _, err = run(capsys, "backup", db, str(target))
        assert code == 1 and "exists" in err

    def test_fork_names_the_version_it_copied(
        self, each_db: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """fork without --version says which version it copied: the latest."""
        code, out, _ = run(capsys, "fork", each_db, "bot", "twin")
        assert code == 0 and "a copy of bot version 2" in out


class TestErrors:
    def test_garbage_file(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """A file that is not a database is an error; it stays unchanged, nothing beside it."""
        garbage = tmp_path / "notes.txt"
        content = b"not a database\n" * 100
        garbage.write_bytes(content)
        for argv in (["agents"], ["check"], ["rollback", "bot", "1"]):
            code, out, err = run(capsys, argv[0], str(garbage), *argv[1:])
            assert code == 1 and out == ""
            assert err.startswith("effectful-durable: error: ")
            assert "is not an effectful-durable database" in err
        assert garbage.read_bytes() == content
        assert list(tmp_path.iterdir()) == [garbage]

    @pytest.mark.parametrize(
        "command", [["agents"], ["fork", "bot", "twin"]], ids=["read", "write"]
    )
    def test_missing_file_is_not_created(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
    ) -> None:
        """A missing database file is an error that says so, and nothing is created."""
        code, _, err = run(capsys, command[0], str(tmp_path / "missing.db"), *command[1:])
        assert code == 1
        assert err == (
            f"effectful-durable: error: no database at {tmp_path / 'missing.db'}: "
            "the file does not exist (nothing was created)\n"
        )
        assert list(tmp_path.iterdir()) == []

    def test_directory_and_empty_file(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A directory or an empty file is a one-line error, and stays as it was."""
        code, _, err = run(capsys, "agents", str(tmp_path))
        assert code == 1 and "is a directory" in err
        empty = tmp_path / "empty.db"
        empty.touch()
        code, _, err = run(capsys, "rollback", str(empty), "bot", "1")
        assert code == 1 and "is an empty file" in err
        assert empty.stat().st_size == 0 and list(tmp_path.iterdir()) == [empty]

    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["versions", "nobody"], "no agent 'nobody'"),
            (["history", "bot", "--version", "9"], "agent 'bot' has no version 9"),
            (["rollback", "bot", "7"], "agent 'bot' has no version 7"),
            (["steps", "nope"], "no workflow 'nope'"),
            (["fork", "bot", "talker"], "cannot fork into 'talker'"),
            (["fork", "bot", ""], "invalid agent id ''"),
            (["delete", "nobody", "--yes"], "no agent 'nobody'"),
        ],
        ids=["agent", "version", "rollback", "workflow", "fork-exists", "fork-invalid", "delete"],
    )
    def test_not_found(
        self, db: str, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
    ) -> None:
        """A DurableError is one line on stderr and exit code 1, not a traceback."""
        code, out, err = run(capsys, argv[0], db, *argv[1:])
        assert code == 1 and out == ""
        assert err.startswith(f"effectful-durable: error: {message}")
        assert len(err.splitlines()) == 1

    def test_agent_in_use(self, each_db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """A repair of an agent whose turn is running fails with AgentInUseError's message."""
        with Store(each_db) as store, store.agent_lock("bot"):
            code, _, err = run(capsys, "rollback", each_db, "bot", "1")
        assert code == 1 and "agent 'bot' is in use" in err
        assert "run the command again once that turn has finished" in err

    @pytest.mark.parametrize(
        "argv",
        [
            ["versions", "nobody"],
            ["steps", "nope"],
            ["fork", "bot", ""],
            ["prune", "nobody", "--keep", "1", "--yes"],
            ["history", "bot", "--version", "9"],
        ],
        ids=["agent", "workflow", "agent-id", "prune", "version"],
    )
    def test_errors_speak_the_command_line(
        self, each_db: str, capsys: pytest.CaptureFixture[str], argv: list[str]
    ) -> None:
        """Error messages name commands and options, never Python calls or keywords."""
        _, _, err = run(capsys, argv[0], each_db, *argv[1:])
        assert err.startswith("effectful-durable: error: ")
        for python in ("Store", "()", "wait=", "busy_timeout", "agent_id"):
            assert python not in err, err
        if "lists" in err:
            assert (
                f"`effectful-durable {'workflows' if 'workflow' in err else 'agents'} {each_db}`"
                in err
            )

    def test_busy_and_in_use_messages_speak_the_command_line(self) -> None:
        """The messages of a busy database and of an agent in use are reworded for the shell."""
        from effectful_durable import AgentInUseError, DatabaseBusyError
        from effectful_durable.cli.command import cli_words

        for error in (AgentInUseError("bot", "process 1 on host"), DatabaseBusyError("x.db", 5)):
            text = cli_words(str(error), "x.db")
            assert "wait=" not in text and "busy_timeout" not in text, text

    @pytest.mark.parametrize(
        "argv",
        [[], ["history"], ["rollback", "x.db", "bot", "one"], ["bogus", "x.db"]],
        ids=["nothing", "no-db", "bad-int", "unknown-command"],
    )
    def test_usage_errors_return_2(
        self, capsys: pytest.CaptureFixture[str], argv: list[str]
    ) -> None:
        """A usage error prints argparse's message and returns 2 instead of exiting."""
        code, _, err = run(capsys, *argv)
        assert code == 2 and "usage: effectful-durable" in err

    def test_help_returns_0(self, capsys: pytest.CaptureFixture[str]) -> None:
        """--help lists every subcommand and returns 0."""
        code, out, _ = run(capsys, "--help")
        assert code == 0
        for command in (
            "agents",
            "history",
            "conversations",
            "check",
            "rollback",
            "fork",
            "delete-conversation",
            "reset-workflow",
            "prune",
            "vacuum",
            "backup",
        ):
            assert command in out


class TestOnPostgres:
    """The same commands on a PostgreSQL copy of the template database."""

    @pytest.fixture
    def pg(self, template_db: Path, postgres_url: str) -> str:
        with Store(template_db, readonly=True) as source, Store(postgres_url) as target:
            copy_store(source, target)
        return postgres_url

    @pytest.mark.parametrize("argv", READS, ids=" ".join)
    def test_every_read_prints_what_it_prints_for_the_file(
        self, db: str, pg: str, argv: list[str], capsys: pytest.CaptureFixture[str]
    ) -> None:
        """Each read prints the same on both backends (check: the facts each one has)."""
        if argv == ["check"]:
            code, out, err = run(capsys, argv[0], pg, *argv[1:])
            assert (code, err) == (0, ""), err
            return
        code, out, err = run(capsys, argv[0], db, *argv[1:])
        on_file = code, out.replace(db, pg), err  # "no runner has reported on <db> yet"
        on_server = run(capsys, argv[0], pg, *argv[1:])
        assert on_server == on_file

    def test_rollback_and_prune(self, pg: str, capsys: pytest.CaptureFixture[str]) -> None:
        code, out, _ = run(capsys, "rollback", pg, "talker", "2")
        assert code == 0 and "talker" in out
        assert run(capsys, "prune", pg, "--keep", "1", "--yes")[0] == 0
        with Store(pg, readonly=True) as store:
            assert [v.version for v in store.versions("talker")] == [6]

    def test_an_empty_database_is_refused_and_left_empty(
        self, postgres_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """No command makes our tables in an empty database."""
        for argv in (["agents"], ["rollback", "bot", "1"]):
            code, _, err = run(capsys, argv[0], postgres_url, *argv[1:])
            assert code == 1 and "holds no effectful-durable database" in err
        assert persisted_rows(
            postgres_url, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
        ) == [(0,)]

    def test_a_password_is_never_printed(
        self, pg: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        secret = pg.replace("postgres@", "postgres:hunter2@", 1)
        code, _, err = run(capsys, "history", secret, "nobody")
        assert code == 1 and "hunter2" not in err and ":***@" in err
        code, out, _ = run(capsys, "status", secret)  # "no runner has reported on <url>"
        assert code == 0 and "hunter2" not in out and ":***@" in out


class TestPostgresConnectionErrors:
    """The command run as a user runs it, against a server that cannot be used: one
    line on stderr, at once when retrying cannot help."""

    def cli(self, *argv: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
        """``python -m effectful_durable ARGV``, with no stored password to find."""
        env = {name: value for name, value in os.environ.items() if name != "PGPASSWORD"}
        env["PGPASSFILE"] = str(tmp_path / "no-pgpass")
        started = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "effectful_durable", *argv],
            capture_output=True,
            text=True,
            env=env,
            cwd=Path(__file__).parents[2],
            timeout=60,
        )
        print(f"{' '.join(argv[:1])}: exit {done.returncode} after "
              f"{time.monotonic() - started:.2f} s: {done.stderr.strip()}")  # fmt: skip
        return done

    def one_error_line(self, done: subprocess.CompletedProcess[str]) -> str:
        assert done.returncode == 1
        assert done.stdout == ""
        [line] = done.stderr.splitlines()  # no log lines of psycopg_pool above it
        assert line.startswith("effectful-durable: error: ")
        return line

    def test_no_server_on_the_port(self, tmp_path: Path) -> None:
        """Nothing listening: after the wait, one line saying so and to retry."""
        url = f"postgresql://postgres@127.0.0.1:{free_port()}/agents"
        line = self.one_error_line(self.cli("agents", url, tmp_path=tmp_path))
        assert f"cannot reach the database {url}: " in line
        assert "Connection refused" in line and "then retry" in line

    def test_a_missing_database(self, postgres_server: PostgresServer, tmp_path: Path) -> None:
        """A running server without the database: one line naming it, at once."""
        line = self.one_error_line(
            self.cli("agents", postgres_server.url("no_such_db"), tmp_path=tmp_path)
        )
        assert 'database "no_such_db" does not exist' in line
        assert "createdb" in line and "retry" not in line.replace("retrying will not", "")

    def test_a_missing_role(self, postgres_server: PostgresServer, tmp_path: Path) -> None:
        line = self.one_error_line(
            self.cli("history", postgres_server.url(user="nobody_here"), "bot", tmp_path=tmp_path)
        )
        assert 'role "nobody_here" does not exist' in line

    def test_a_wrong_password(self, postgres_server: PostgresServer, tmp_path: Path) -> None:
        """A refused password: one line saying so, without the password."""
        role = postgres_server.new_password_role("right horse")
        url = postgres_server.url(user=role, password="wrong-horse")
        line = self.one_error_line(self.cli("agents", url, tmp_path=tmp_path))
        assert f'password authentication failed for user "{role}"' in line
        assert "wrong-horse" not in line and ":***@" in line
        line = self.one_error_line(
            self.cli("rollback", postgres_server.url(user=role), "bot", "1", tmp_path=tmp_path)
        )
        assert "asks for a password and none was given" in line

    def test_library_warnings_stay_off_the_terminal(self, db: str) -> None:
        """What psycopg_pool logs while a command runs (a reconnection, say) is not printed."""
        script = (
            "import logging, sys\n"
            "from effectful_durable import Store, cli\n"
            "agents = Store.agents\n"
            "def logging_agents(store):\n"
            "    logging.getLogger('psycopg.pool').warning('error connecting in pool')\n"
            "    return agents(store)\n"
            "Store.agents = logging_agents\n"
            "sys.exit(cli.main(['agents', sys.argv[1]]))\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script, db], capture_output=True, text=True, timeout=60
        )
        assert (done.returncode, done.stderr) == (0, "")
        assert "planner" in done.stdout


class TestImports:
    def test_command_never_imports_litellm(self, db: str) -> None:
        """python -m effectful_durable runs without loading litellm or effectful's LLM layer."""
        result = run_cli_in_fresh_python("agents", db)
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0].split()[:3] == ["agent_id", "version", "messages"]
        assert result.stdout.splitlines()[-1] == "loaded: []"

    def test_console_script(self, db: str) -> None:
        """The installed effectful-durable script runs main and passes on its exit code."""
        script = Path(sys.executable).parent / "effectful-durable"
        if not script.exists():
            pytest.skip("the console script is not installed in this environment")
        ok = subprocess.run([script, "agents", db], capture_output=True, text=True)
        assert ok.returncode == 0 and "planner" in ok.stdout
        missing = subprocess.run([script, "state", db, "nobody"], capture_output=True, text=True)
        assert missing.returncode == 1
        assert missing.stderr.startswith("effectful-durable: error: no agent 'nobody'")
