"""Bugs that damaged files and fuzzed input found (issue 11), one test each.

Each test failed before its fix. They use only what the public API offered
before it, so that they can be run against the code without the fixes.

Bad input and the model's tool input run on SQLite and PostgreSQL. Damaged files
are about SQLite's file format (headers, pages, the WAL, workspace files beside
the database) and stay on SQLite, but for a stored value that no longer decodes.
"""

import dataclasses
import os
import struct
from pathlib import Path
from typing import Any

import apsw
import pytest
from effectful.handlers.llm import Template
from effectful.ops.semantics import handler
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled
from helpers import edit_rows, persisted, persisted_rows
from sql_helpers import Tracker, sql_turn, workspace_path

from effectful_durable import (
    AlarmTools,
    CompactionHandler,
    DurableError,
    InvalidAgentIdError,
    InvalidConversationIdError,
    NotOurDatabaseError,
    PersistenceHandler,
    PersistentAgent,
    StateSerializationError,
    StateTools,
    Store,
)
from effectful_durable.cli import main
from effectful_durable.handlers.effectful_hooks import bound_agent
from effectful_durable.testing import FakeLLM, ToolCall

PAGE = 4096


@dataclasses.dataclass
class Holder(PersistentAgent, StateTools, AlarmTools):
    """You hold a value."""

    value: Any = None

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


class Scribe(ObjectInterpretation):  # type: ignore[misc]
    """A provider that answers a template by adding messages to its agent's history."""

    def __init__(self, *turns: list[dict[str, Any]]) -> None:
        self.turns = list(turns)

    @implements(Template.__apply__)  # type: ignore[misc]
    def _apply(self, template: Any, *args: Any, **kwargs: Any) -> str:
        agent = bound_agent(template, PersistentAgent)
        if agent is None:
            return "summary"  # the summariser
        for message in self.turns.pop(0):
            agent.__history__[message.get("id", "no-id")] = message
        return "ok"


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


def two_turns(db: Path | str) -> Path | str:
    """A database (file or PostgreSQL URL) with agent 'h' at version 2."""
    with persisted(db, FakeLLM(["one", "two"])):
        agent = Holder(agent_id="h")
        agent.ask("first")
        agent.ask("second")
    return db


def flat_db(path: Path) -> Path:
    """A database file with agent 'h' at version 2, everything in the main file."""
    two_turns(path)
    with Store(path) as store:
        store.vacuum()
    return path


def patched(path: Path, offset: int, data: bytes) -> bytes:
    content = bytearray(path.read_bytes())
    content[offset : offset + len(data)] = data
    path.write_bytes(bytes(content))
    return bytes(content)


def cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(argv)
    return code, capsys.readouterr().err


class TestDamagedFiles:
    def test_one_byte_file_is_not_taken_for_new(self, db_path: Path) -> None:
        """A file of one byte is not SQLite: refused and left as it is."""
        db_path.write_bytes(b"x")
        with pytest.raises(NotOurDatabaseError):
            Store(db_path).close()
        assert db_path.read_bytes() == b"x"

    @pytest.mark.parametrize(
        ("offset", "data"),
        [
            (18, b"\x03"),  # file format write version: SQLite then writes nothing
            (47, b"\x09"),  # schema format: SQLite cannot read it
            (60, b"\xfc"),  # user_version negative
            (36, struct.pack(">I", 1)),  # a freelist count without a freelist
            (20, b"\x08"),  # reserved bytes per page
        ],
        ids=["write-version", "schema-format", "user-version", "freelist", "reserved"],
    )
    def test_damaged_header_is_refused_on_open(
        self, db_path: Path, offset: int, data: bytes
    ) -> None:
        """A damaged header field is a DurableError on opening, and the file keeps its bytes."""
        damaged = patched(flat_db(db_path), offset, data)
        with pytest.raises(DurableError, match="damaged"):
            Store(db_path).close()
        assert db_path.read_bytes() == damaged

    def test_user_version_naming_an_older_schema(self, db_path: Path) -> None:
        """A user_version flipped to 2 on a schema-3 file: refused, not a failed migration."""
        damaged = patched(flat_db(db_path), 60, struct.pack(">I", 2))
        with pytest.raises(DurableError, match="damaged"):
            Store(db_path).close()
        assert db_path.read_bytes() == damaged

    @pytest.mark.parametrize(
        "body",
        [
            pytest.param(
                "CAST(x'ff' AS TEXT)",
                marks=pytest.mark.sqlite_only("PostgreSQL's text holds only valid UTF-8"),
            ),
            "'{'",
        ],
        ids=["utf8", "json"],
    )
    def test_damaged_value_is_a_durable_error(self, store_url: str, body: str) -> None:
        """A stored message that no longer decodes is a DurableError, not a driver error."""
        two_turns(store_url)
        edit_rows(
            store_url, f"UPDATE messages SET body = {body} WHERE role = 'user'", foreign=True
        )
        with Store(store_url) as store, pytest.raises(DurableError, match="damaged"):
            store.history("h")

    def test_damaged_page_found_while_reading(self, db_path: Path) -> None:
        """A zeroed page of the messages is a DurableError when read, and the file is unchanged."""
        flat_db(db_path)
        conn = apsw.Connection(str(db_path))
        root = conn.execute("SELECT rootpage FROM sqlite_schema WHERE name = 'messages'").get
        conn.close()
        damaged = patched(db_path, (root - 1) * PAGE, bytes(PAGE))
        with Store(db_path) as store, pytest.raises(DurableError, match="damaged"):
            store.history("h")
        assert db_path.read_bytes() == damaged

    def test_refused_file_keeps_its_wal(self, db_path: Path) -> None:
        """Refusing another program's database does not checkpoint its WAL into it."""
        other = apsw.Connection(str(db_path))
        other.pragma("journal_mode", "wal")
        other.execute("CREATE TABLE theirs (x); INSERT INTO theirs VALUES (1)")
        other.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)
        other.close()  # as if killed: the rows stay in the WAL
        before = [Path(f"{db_path}{s}").read_bytes() for s in ("", "-wal")]
        with pytest.raises(NotOurDatabaseError):
            Store(db_path).close()
        assert [Path(f"{db_path}{s}").read_bytes() for s in ("", "-wal")] == before

    def test_cli_check_says_it_in_one_line(
        self, db_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """check on a file with damage in an index prints one error line."""
        flat_db(db_path)
        conn = apsw.Connection(str(db_path))
        [index, *_] = conn.execute(
            "SELECT rootpage FROM sqlite_schema WHERE type = 'index' AND tbl_name = 'messages'"
        ).get
        conn.close()
        patched(db_path, (index - 1) * PAGE + 100, bytes(PAGE - 100))
        code, err = cli(["check", str(db_path)], capsys)
        assert code == 1 and len(err.strip().splitlines()) == 1, err

    def test_damaged_workspace_file_is_rebuilt(self, db_path: Path) -> None:
        """An agent's SQL workspace file that is not SQLite any more is rebuilt from the log."""
        insert = ToolCall("sql_insert", {"table": "runs", "values": {"km": 5.0}})
        sql_turn(db_path, Tracker(agent_id="t"), insert)
        path = workspace_path(str(db_path), "t")
        for suffix in ("-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        Path(path).write_bytes(b"garbage" * 1000)
        with Store(db_path) as store:
            assert store.sql("t", "SELECT km FROM runs").rows == [(5.0,)]


class TestBadInput:
    def test_cli_argument_that_is_not_utf8(
        self, store_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """An agent id from a non-UTF-8 argument (a lone surrogate) gets one error line."""
        two_turns(store_url)
        code, err = cli(["history", str(store_url), "\udcff"], capsys)
        assert code == 1 and err.startswith("effectful-durable: error: ")

    def test_store_read_of_an_invalid_id(self, store_url: str) -> None:
        """Store reads of an id holding a lone surrogate raise InvalidAgentIdError."""
        with Store(two_turns(store_url)) as store, pytest.raises(InvalidAgentIdError):
            store.history("a\ud800")

    @pytest.mark.parametrize(
        ("agent_id", "conversation", "error"),
        [
            ("h\x00", "default", InvalidAgentIdError),
            ("h\ud800", "default", InvalidAgentIdError),
            ("h", "side\x00", InvalidConversationIdError),
        ],
        ids=["nul-agent", "surrogate-agent", "nul-conversation"],
    )
    def test_search_with_an_invalid_id(
        self, store_url: str, agent_id: str, conversation: str, error: type[Exception]
    ) -> None:
        """search_compacted of an invalid agent or conversation id raises its id's error
        (a driver error on PostgreSQL, whose text cannot hold a NUL, before the fix)."""
        with Store(two_turns(store_url)) as store, pytest.raises(error):
            store.search_compacted(agent_id, "one", conversation=conversation)

    def test_agent_lock_of_an_invalid_id(self, store_url: str) -> None:
        """Store.agent_lock of an id holding a lone surrogate raises InvalidAgentIdError
        (a UnicodeEncodeError on entering the block before the fix)."""
        with Store(store_url) as store, pytest.raises(InvalidAgentIdError):
            with store.agent_lock("a\ud800"):
                pass

    def test_backup_to_an_empty_path(
        self, store_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A backup to the path "" is a DurableError, and leaves no partial file (a
        FileNotFoundError from linking the copy into place before the fix)."""
        monkeypatch.chdir(tmp_path)
        with Store(two_turns(store_url)) as store, pytest.raises(DurableError, match="empty"):
            store.backup("")
        for directory in (tmp_path, tmp_path.parent):  # where a partial copy went
            assert [p for p in directory.iterdir() if ".partial-" in p.name] == []

    def test_state_field_of_bytes_that_are_not_utf8(self, store_url: str) -> None:
        """A bytes field that pydantic cannot store as JSON is a StateSerializationError."""
        agent = Holder(agent_id="h")
        agent.value = b"\xff"
        with persisted(store_url, FakeLLM(["ok"])), pytest.raises(StateSerializationError):
            agent.ask("hi")

    def test_lone_surrogates_commit_and_read_back(self, store_url: str) -> None:
        """A lone surrogate in an argument, a field and a message is stored and read back."""
        agent = Holder(agent_id="h")
        agent.value = "field \ud800"
        with persisted(store_url, FakeLLM(["answer \udfff"])):
            agent.ask("question \udcff")
        with Store(store_url) as store:
            assert store.state("h")["value"] == "field \ud800"
            assert store.history("h")[-1]["content"] == "answer \udfff"

    def test_message_without_an_id_is_refused(self, store_url: str) -> None:
        """A message with no id cannot be loaded back: refused at commit, nothing written."""
        persistence = PersistenceHandler(store_url)
        try:
            with (
                handler(Scribe([{"role": "user", "content": "hi"}])),
                handler(persistence),
                pytest.raises(StateSerializationError, match="no string 'id'"),
            ):
                Holder(agent_id="h").ask("hi")
        finally:
            persistence.close()
        with Store(store_url) as store:
            assert store.agents() == []

    def test_message_content_of_odd_shapes_prints(
        self, store_url: str, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """history prints a message whose content blocks are not dicts."""
        persistence = PersistenceHandler(store_url)
        try:
            odd = {"id": "m", "role": "user", "content": [None, 3, ["x"]]}
            with handler(Scribe([odd])), handler(persistence):
                Holder(agent_id="h").ask("hi")
        finally:
            persistence.close()
        code, err = cli(["history", str(store_url), "h"], capsys)
        assert code == 0, err

    def test_message_nested_deeper_than_sqlite_json_compacts(self, store_url: str) -> None:
        """A message nested 1,005 deep compacts like any other (SQLite's JSON stops at 1,000)."""
        deep = {"type": "data", "v": nested(1005)}
        turns = [
            [{"id": f"u{n}", "role": "user", "content": [{"type": "text", "text": "t"}, deep]}]
            for n in range(5)
        ]
        persistence = PersistenceHandler(store_url)
        compaction = CompactionHandler(max_messages=4, keep_recent=1)
        try:
            with handler(Scribe(*turns)), handler(compaction), handler(persistence):
                agent = Holder(agent_id="h")
                for _ in range(5):
                    agent.ask("hi")
        finally:
            persistence.close()
        with Store(store_url) as store:
            assert "compaction" in [v.kind for v in store.versions("h")]


def tool_results(llm: FakeLLM) -> list[str]:
    out = []
    for call in llm.calls:
        message = call.messages[-1]
        if message["role"] == "tool":
            out.append("".join(block["text"] for block in message["content"]))
    return out


class TestToolInput:
    @pytest.mark.parametrize(
        "query", ["SELECT 1\x00", "SELECT '\ud800'"], ids=["nul", "lone-surrogate"]
    )
    def test_sql_statement_that_is_not_text(self, store_url: str, query: str) -> None:
        """A statement holding a NUL or a lone surrogate is an error the model reads."""
        [result] = sql_turn(
            store_url, Tracker(agent_id="t"), ToolCall("sql_query", {"query": query})
        )
        assert result.startswith("error: the statement is not valid text")

    @pytest.mark.parametrize(
        "call",
        [
            ToolCall("list_state_keys", {"prefix": "\ud800"}),
            ToolCall("cancel_alarm", {"alarm_id": "\ud800"}),
            ToolCall("schedule_alarm", {"delay_seconds": 60, "action": "a\ud800"}),
        ],
        ids=["list_state_keys", "cancel_alarm", "schedule_alarm"],
    )
    def test_lone_surrogate_in_a_tool_argument(self, store_url: str, call: ToolCall) -> None:
        """A lone surrogate in a memory or alarm tool's argument is an error the model reads."""
        llm = FakeLLM([call, "done"])
        with persisted(store_url, llm):
            Holder(agent_id="h").ask("go")
        [result] = tool_results(llm)
        assert result.startswith("error: ")
        assert persisted_rows(
            store_url, "SELECT (SELECT count(*) FROM alarms) + (SELECT count(*) FROM memory)"
        ) == [(0,)]

    def test_search_of_a_query_holding_a_nul(self, store_url: str) -> None:
        """search_compacted (recall) with a NUL in the query finds nothing, without an error."""
        with Store(two_turns(store_url)) as store:
            assert store.search_compacted("h", "one\x00") == []
