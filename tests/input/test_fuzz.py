"""Fuzzed input (Hypothesis): accepted, or a clear error; a refusal writes nothing.

The command line with random arguments and random files as the database; agent
and conversation ids; state values of many types; the model's arguments to the
memory, SQL and alarm tools; messages of odd shapes in a history. Examples per
test are few, to keep the suite fast; ``EFFECTFUL_DURABLE_FUZZ=<n>`` runs ``n``
per test instead.

All but the command line run on SQLite and on PostgreSQL, each example on a fresh
copy of a small database (a cloned database on PostgreSQL, with a fifth of the
examples). The command line's fuzzing is about files (missing, a directory, empty,
random bytes, a file's bytes unchanged) and stays on SQLite; tests/cli/test_cli.py runs the
commands on PostgreSQL.
"""

import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pydantic
import pytest
from damage_helpers import Worker, cli
from effectful.handlers.llm import Template
from effectful.ops.semantics import handler
from effectful.ops.syntax import ObjectInterpretation, implements
from effectful.ops.types import NotHandled
from helpers import examples_on, persisted, persisted_rows
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from effectful_durable import (
    CompactionHandler,
    DurableError,
    InvalidAgentIdError,
    InvalidConversationIdError,
    PersistenceHandler,
    PersistentAgent,
    StateSerializationError,
    Store,
)
from effectful_durable.handlers.effectful_hooks import bound_agent
from effectful_durable.testing import FakeLLM, ToolCall

if TYPE_CHECKING:
    from postgres_server import PostgresServer

EXAMPLES = int(os.environ.get("EFFECTFUL_DURABLE_FUZZ", "0"))


def fuzz(examples: int) -> Any:
    return settings(
        max_examples=EXAMPLES or examples,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
        database=None,
    )


# Text with everything Python strings can hold: control characters, lone surrogates
# (what a non-UTF-8 byte in a command-line argument becomes), and a few of each.
ODD_TEXT = st.sampled_from(
    ["", " ", "\x00", "\n", "\ud800", "a\udcffb", "\u200b", "🙂", "x" * 201, "'; --", "%s"]
)
ANY_TEXT = st.one_of(
    ODD_TEXT, st.text(st.characters(codec=None, exclude_categories=()), max_size=30)
)
KEY = st.one_of(ANY_TEXT, st.integers(), st.none(), st.just(["k"]))


def build_base(db: Path | str) -> None:
    """w1 with memory, a SQL row, an alarm and two conversations."""
    script = [
        ToolCall("put_state", {"key": "city", "value": '"Paris"'}),
        ToolCall("sql_insert", {"table": "items", "values": {"name": "apples", "qty": 3}}),
        ToolCall("schedule_alarm", {"delay_seconds": 60.0, "action": "check apples"}),
        "done",
        "done in side",
    ]
    with persisted(db, FakeLLM(script)):
        w1 = Worker(agent_id="w1")
        w1.ask("start")
        with w1.conversation("side"):
            w1.ask("side")


@pytest.fixture(scope="module")
def base_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small database file (``build_base``), everything in the main file."""
    path = tmp_path_factory.mktemp("fuzz") / "base.db"
    build_base(path)
    with Store(path) as store:
        store.vacuum()  # everything in the main file: its bytes are the database
    return path


@dataclasses.dataclass
class Base:
    """The small database of ``build_base`` on one backend, to take fresh copies of."""

    db: Path | str
    server: "PostgresServer | None" = None

    def fuzz(self, examples: int) -> Any:
        """``fuzz``, with fewer examples on PostgreSQL (``examples_on``)."""
        return fuzz(examples_on(self.server is not None, examples))

    @contextlib.contextmanager
    def copy(self) -> Iterator[Path | str]:
        """A fresh copy: of the file, in a new working directory; or a cloned database."""
        if self.server is None:
            with copy_of(Path(self.db)) as path:
                yield path
            return
        url = self.server.clone_database(str(self.db))
        try:
            yield url
        finally:
            self.server.drop_database(url)


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def base(request: pytest.FixtureRequest, base_db: Path) -> Iterator[Base]:
    """The base database on SQLite, then on PostgreSQL."""
    if request.param == "sqlite":
        yield Base(base_db)
        return
    server = request.getfixturevalue("postgres_server")
    url = server.new_database()
    build_base(url)
    yield Base(url, server)
    server.drop_database(url)


@contextlib.contextmanager
def copy_of(base: Path) -> Iterator[Path]:
    """A fresh copy of ``base`` in a new directory, which is also the working directory."""
    directory = Path(tempfile.mkdtemp())
    cwd = os.getcwd()
    try:
        shutil.copy(base, directory / "state.db")
        os.chdir(directory)
        yield directory / "state.db"
    finally:
        os.chdir(cwd)
        shutil.rmtree(directory, ignore_errors=True)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "-"


def logical(db: Path | str) -> list[Any]:
    """Every row of the database but the handoffs and versions (what a turn itself writes)."""
    out: list[Any] = []
    for table in ("memory", "workspace_log", "alarms"):
        out += [
            (table, *row) for row in persisted_rows(db, f"SELECT * FROM {table} ORDER BY 1, 2, 3")
        ]
    return out


# -- the command line ------------------------------------------------------------

COMMANDS = [
    "agents", "history", "conversations", "state", "memory", "versions", "handoffs",
    "workflows", "steps", "check", "sql", "alarms", "status", "rollback", "fork",
    "delete-conversation", "delete", "rearm", "reset-workflow", "prune", "vacuum", "backup",
    "approvals", "events", "approve", "deny", "send-event",
]  # fmt: skip
READS = {
    "agents", "history", "conversations", "state", "memory", "versions", "handoffs",
    "workflows", "steps", "check", "sql", "alarms", "status", "backup", "approvals", "events",
}  # fmt: skip
WORDS = st.sampled_from(
    [
        "w1", "w2", "side", "default", "--json", "--all", "--yes", "--version",
        "--conversation", "--keep", "--older-than", "--from-step", "--drop-compacted",
        "--agent", "0", "1", "2", "-1", "99", "7d", "1x", "", "--", "-h", "SELECT 1",
        "SELECT * FROM items", "copy.db", "state.db", "alm_x", "nan", "1e999",
        "--reason", "--arguments", "--create", "--key", "apr_x", "{}", "[1]", '{"a": 1}', "{",
    ]
)  # fmt: skip
# Arguments a shell can pass: no NUL, no path outside the working directory.
ARG_TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00/"), max_size=12).filter(
    lambda text: ".." not in text
)


class TestCommandLine:
    """Random arguments and random files: an exit code and one clear line, never a traceback."""

    @fuzz(150)
    @given(
        command=st.one_of(st.sampled_from(COMMANDS), ARG_TEXT),
        rest=st.lists(st.one_of(WORDS, ARG_TEXT), max_size=5),
        db=st.sampled_from(["good", "missing", "directory", "empty"]),
    )
    def test_random_arguments(self, base_db: Path, command: str, rest: list[str], db: str) -> None:
        """Exit 0, 1 or 2; a failure prints one error line; a refusal leaves the file as it was."""
        with copy_of(base_db) as path:
            target = {"good": path, "missing": path.with_name("no.db"), "directory": path.parent}
            target["empty"] = path.with_name("empty.db")
            target["empty"].touch()
            argv = [command, str(target[db]), *rest]
            before = sha(path)
            code, _, err = cli(argv)
            assert code in (0, 1, 2), (argv, code, err)
            assert "Traceback" not in err
            if code != 0:  # argparse's usage, or our one line (an argument may hold a newline)
                said = re.search(r"^effectful-durable( [\w-]+)?: error: ", err, re.MULTILINE)
                assert said, (argv, err)
            if code != 0 or command in READS:
                assert sha(path) == before, (argv, code, err)
            if code == 0 and db == "good":
                assert Store(path).check()["integrity"] == "ok"

    @fuzz(40)
    @given(
        data=st.one_of(
            st.binary(min_size=1, max_size=3000),
            st.binary(max_size=3000).map(lambda b: b"SQLite format 3\x00" + b),
            st.binary(min_size=100, max_size=100).map(
                lambda b: b"SQLite format 3\x00\x10\x00" + b[18:] + bytes(4096 - 100)
            ),
        ),
        command=st.sampled_from(
            [
                ["agents"],
                ["check"],
                ["history", "w1"],
                ["vacuum"],
                ["prune", "--keep", "1", "--yes"],
            ]
        ),
    )
    def test_random_files(self, base_db: Path, data: bytes, command: list[str]) -> None:
        """Random bytes are refused in one line by the CLI and by Store; the file keeps them."""
        with copy_of(base_db) as path:
            path.write_bytes(data)
            code, _, err = cli([command[0], str(path), *command[1:]])
            assert code == 1, (code, err)
            assert len(err.strip().splitlines()) == 1 and "effectful-durable: error: " in err
            with pytest.raises(DurableError):
                Store(path)
            with pytest.raises(DurableError):
                PersistenceHandler(path)
            assert path.read_bytes() == data


# -- agent ids, conversation ids, state values -----------------------------------


@dataclasses.dataclass
class Holder(PersistentAgent):
    """You hold a value."""

    value: Any = None
    count: int = 0
    tags: list[str] = dataclasses.field(default_factory=list)

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


def refused_without_a_write(db: Path | str, error: StateSerializationError) -> None:
    """The refusal says nothing was written, and agent 'h' is not in the database."""
    assert "Nothing was written" in str(error)
    with Store(db) as store:
        assert "h" not in [a.agent_id for a in store.agents()]


def loaded(db: Path | str) -> Holder:
    """A new Holder 'h' loaded from the database, as a new process would."""
    again = Holder(agent_id="h")
    persistence = PersistenceHandler(db)
    try:
        persistence.load(again)
    finally:
        persistence.close()
    return again


class TestIds:
    """Agent and conversation ids: valid ones work end to end, the others are refused clearly."""

    def test_agent_ids(self, base: Base) -> None:
        """An id is refused with InvalidAgentIdError, or its turn commits and reads back."""

        @base.fuzz(40)
        @given(agent_id=st.one_of(ANY_TEXT, st.text(max_size=250), st.integers(), st.none()))
        def check(agent_id: Any) -> None:
            with base.copy() as path:
                try:
                    agent = Holder(agent_id=agent_id)
                    with persisted(path, FakeLLM(["ok"])):
                        agent.ask("hi")
                except InvalidAgentIdError as e:
                    assert "agent id" in str(e) or "agent_id" in str(e)
                    with Store(path) as store:
                        assert [a.agent_id for a in store.agents()] == ["w1"]
                    return
                with Store(path) as store:
                    assert [m["role"] for m in store.history(agent_id)][-1] == "assistant"
                    assert store.versions(agent_id)[-1].version == 1
                code, _, err = cli(["history", str(path), "--", agent_id])  # "-x" is no option
                assert code == 0, err

        check()

    def test_store_reads_with_any_id(self, base: Base) -> None:
        """Store reads of any id answer, or raise a DurableError; never a driver error."""

        @base.fuzz(60)
        @given(agent_id=ANY_TEXT, conversation=ANY_TEXT)
        def check(agent_id: str, conversation: str) -> None:
            with base.copy() as path, Store(path) as store:
                for read in (
                    lambda: store.history(agent_id, conversation=conversation),
                    lambda: store.state(agent_id, conversation=conversation),
                    lambda: store.memory(agent_id),
                    lambda: store.versions(agent_id),
                    lambda: store.conversations(agent_id),
                    lambda: store.alarms(agent_id),
                    lambda: store.search_compacted(agent_id, conversation),
                    lambda: store.sql(agent_id, "SELECT 1"),
                ):
                    with contextlib.suppress(DurableError):
                        read()

        check()

    def test_conversation_ids(self, base: Base) -> None:
        """A conversation id is refused with InvalidConversationIdError, or its turn commits."""

        @base.fuzz(40)
        @given(conversation=st.one_of(ANY_TEXT, st.integers(), st.none()))
        def check(conversation: Any) -> None:
            with base.copy() as path:
                agent = Holder(agent_id="h")
                try:
                    with persisted(path, FakeLLM(["ok"])), agent.conversation(conversation):
                        agent.ask("hi")
                except InvalidConversationIdError:
                    with Store(path) as store:
                        assert [a.agent_id for a in store.agents()] == ["w1"]
                    return
                with Store(path) as store:
                    assert conversation in [c.conversation for c in store.conversations("h")]
                    assert len(store.history("h", conversation=conversation)) == 3

        check()


def unserialisable() -> st.SearchStrategy[Any]:
    return st.sampled_from(
        [object(), {1, 2}, b"\xff", 1j, lambda: 1, type, Ellipsis, iter([]), float("nan")]
    )


JSONISH = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(allow_nan=False, allow_infinity=False),
        ANY_TEXT,
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(ANY_TEXT, inner, max_size=4)
    ),
    max_leaves=12,
)


def nested(depth: int) -> Any:
    value: Any = "deep"
    for _ in range(depth):
        value = [value]
    return value


VALUES = st.one_of(
    JSONISH,
    unserialisable(),
    st.lists(unserialisable(), min_size=1, max_size=2),
    # effectful walks an agent's fields when it binds a template (deeper fails there)
    st.sampled_from([10, 100, 200]).map(nested),
    st.floats(),
    st.integers(min_value=-(2**80), max_value=2**80),
)


class TestStateValues:
    """Field values of many types: read back as committed, or StateSerializationError, no write."""

    def test_state_values(self, base: Base) -> None:
        """A field value reads back as committed, or is refused with no write."""

        @base.fuzz(60)
        @given(value=VALUES, tag=ANY_TEXT)
        def check(value: Any, tag: str) -> None:
            with base.copy() as path:
                agent = Holder(agent_id="h")
                agent.value, agent.tags = value, [tag]
                try:
                    with persisted(path, FakeLLM(["ok"])):
                        agent.ask("hi")
                except StateSerializationError as e:
                    refused_without_a_write(path, e)
                    return
                with Store(path) as store:
                    stored = store.state("h")
                assert stored["tags"] == [tag]
                again = loaded(path)
                assert again.tags == [tag]
                assert json.dumps(again.value) == json.dumps(stored["value"])

        check()


# -- the model's tool arguments --------------------------------------------------

MODEL_VALUE = st.one_of(JSONISH, st.floats(), ANY_TEXT)
SQL = st.one_of(
    ANY_TEXT,
    st.sampled_from(
        [
            "SELECT * FROM items",
            "SELECT name, qty FROM items WHERE qty > ?",
            "INSERT INTO items (name, qty) VALUES (?, ?)",
            "UPDATE items SET qty = qty + 1",
            "DELETE FROM items WHERE name = ?",
            "DROP TABLE items",
            "CREATE TABLE t (id INTEGER PRIMARY KEY)",
            "ATTACH 'x.db' AS x",
            "SELECT * FROM sqlite_schema",
            "PRAGMA writable_schema = 1",
            "SELECT load_extension('x')",
            "SELECT zeroblob(1e9)",
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT * FROM c",
            "SELECT 1; DELETE FROM items",
            "SELECT CAST(x'ff' AS TEXT)",
            "INSERT INTO items (name) VALUES (CAST(x'fffe' AS TEXT))",
            "",
        ]
    ),
)
TOOL_CALLS = st.one_of(
    st.tuples(st.just("put_state"), st.fixed_dictionaries({"key": KEY, "value": MODEL_VALUE})),
    st.tuples(
        st.just("put_state"),
        st.fixed_dictionaries({"key": KEY, "value": JSONISH.map(json.dumps)}),
    ),
    st.tuples(st.just("get_state"), st.fixed_dictionaries({"key": KEY})),
    st.tuples(st.just("delete_state_key"), st.fixed_dictionaries({"key": KEY})),
    st.tuples(st.just("list_state_keys"), st.fixed_dictionaries({"prefix": MODEL_VALUE})),
    st.tuples(st.just("add_to_context"), st.fixed_dictionaries({"item": MODEL_VALUE})),
    st.tuples(
        st.just("clear_old_context"), st.fixed_dictionaries({"older_than_seconds": MODEL_VALUE})
    ),
    st.tuples(
        st.sampled_from(["sql_query", "sql_execute"]),
        st.fixed_dictionaries(
            {"params": st.one_of(st.none(), st.lists(MODEL_VALUE, max_size=3), MODEL_VALUE)}
        ).flatmap(lambda d: SQL.map(lambda q: {"query": q, **d})),
    ),
    st.tuples(
        st.just("sql_insert"),
        st.fixed_dictionaries(
            {
                "table": st.one_of(st.just("items"), ANY_TEXT),
                "values": st.one_of(
                    st.dictionaries(st.sampled_from(["name", "qty", "id", "x"]), MODEL_VALUE),
                    MODEL_VALUE,
                ),
            }
        ),
    ),
    st.tuples(
        st.just("schedule_alarm"),
        st.fixed_dictionaries(
            {
                "delay_seconds": st.one_of(st.floats(), st.integers(), MODEL_VALUE),
                "action": MODEL_VALUE,
                "every_seconds": st.one_of(st.just(0), st.floats(), MODEL_VALUE),
            }
        ),
    ),
    st.tuples(st.just("cancel_alarm"), st.fixed_dictionaries({"alarm_id": MODEL_VALUE})),
    st.tuples(st.just("list_alarms"), st.just({})),
    st.tuples(
        st.just("recall"),
        st.fixed_dictionaries(
            {"query": MODEL_VALUE, "limit": st.one_of(st.integers(), MODEL_VALUE)}
        ),
    ),
)


class ToolCaller(ObjectInterpretation):  # type: ignore[misc]
    """A model that answers a template by calling one of its agent's tools once.

    The arguments are first checked against the tool's signature, as effectful
    decodes a model's tool call (pydantic, lax); a call that does not decode never
    reaches the tool (the model is told by effectful), and ``decoded`` is False.
    """

    def __init__(self, name: str, arguments: dict[str, Any]) -> None:
        self.name, self.arguments = name, dict(arguments)
        if name == "sql_execute" and "query" in self.arguments:
            self.arguments["statement"] = self.arguments.pop("query")
        self.result: Any = None
        self.decoded = True

    @implements(Template.__apply__)  # type: ignore[misc]
    def _apply(self, template: Any, *args: Any, **kwargs: Any) -> str:
        agent = bound_agent(template, PersistentAgent)
        tool = getattr(agent, self.name)
        try:
            bound = inspect.signature(tool).bind(**self.arguments)
            for name, value in bound.arguments.items():
                annotation = inspect.signature(tool).parameters[name].annotation
                bound.arguments[name] = pydantic.TypeAdapter(annotation).validate_python(value)
        except (TypeError, pydantic.ValidationError):
            self.decoded = False
            return "done"
        self.result = tool(*bound.args, **bound.kwargs)
        return "done"


class TestToolArguments:
    """The model's arguments to memory, SQL and alarm tools: done, or an error text, no write."""

    def test_tool_call(self, base: Base) -> None:
        """A tool call is done, or an error text the model reads with nothing written."""

        @base.fuzz(150)
        @given(call=TOOL_CALLS)
        def check(call: tuple[str, dict[str, Any]]) -> None:
            name, arguments = call
            with base.copy() as path:
                before = logical(path)
                caller = ToolCaller(name, arguments)
                persistence = PersistenceHandler(path)
                try:
                    with handler(caller), handler(persistence):
                        Worker(agent_id="w1").ask("go")
                finally:
                    persistence.close()
                result = caller.result
                if not caller.decoded:
                    assert logical(path) == before
                    return
                assert isinstance(result, str | list), result
                if isinstance(result, str) and result.startswith("error:"):
                    assert logical(path) == before, result
                with Store(path) as store:
                    assert store.check()["integrity"] == "ok"
                    # hex: the model may have stored text that is not UTF-8 (CAST), and
                    # reading that as text is refused (SQLWorkspaceError, by design).
                    store.sql("w1", "SELECT id, hex(name), qty FROM items")
                    store.memory("w1")
                    store.alarms("w1")

        check()


# -- messages of odd shapes ------------------------------------------------------


class Scribe(ObjectInterpretation):  # type: ignore[misc]
    """A provider that answers a template by adding ``messages`` to its agent's history.

    Each call adds ``messages``, or (if it is callable) what it returns for the
    call's number. A template of no agent (a summariser) gets "summary".
    """

    def __init__(self, messages: Any) -> None:
        self.messages = messages
        self.calls = 0

    @implements(Template.__apply__)  # type: ignore[misc]
    def _apply(self, template: Any, *args: Any, **kwargs: Any) -> str:
        agent = bound_agent(template, PersistentAgent)
        if agent is None:
            return "summary"
        added = self.messages(self.calls) if callable(self.messages) else self.messages
        self.calls += 1
        for key, message in added:
            agent.__history__[key] = message
        return "ok"


CONTENT = st.one_of(
    ANY_TEXT,
    JSONISH,
    unserialisable(),
    st.sampled_from([10, 500, 990, 1000, 1100, 5000]).map(nested),
    st.integers(min_value=1, max_value=3).map(lambda n: "x" * (n * 1_000_000)),
    st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": ANY_TEXT}), max_size=3),
)


@st.composite
def messages(draw: Any) -> list[tuple[Any, Any]]:
    out = []
    for n in range(draw(st.integers(min_value=1, max_value=3))):
        key = f"m{n}"
        message: Any = {"id": key, "role": draw(st.sampled_from(["user", "assistant", "tool"]))}
        message["content"] = draw(CONTENT)
        shape = draw(
            st.sampled_from(
                ["plain"] * 6 + ["no id", "int id", "other id", "list", "str", "extra"]
            )
        )
        if shape == "no id":
            del message["id"]
        elif shape == "int id":
            message["id"] = n
        elif shape == "other id":
            message["id"] = "elsewhere"
        elif shape == "list":
            message = [message]
        elif shape == "str":
            message = "a message that is not a dict"
        elif shape == "extra":
            message[draw(ANY_TEXT)] = draw(JSONISH)
        out.append((key, message))
    return out


def same_json(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


class TestOddMessages:
    """Messages of odd shapes: committed and read back exactly, or refused without a write."""

    def test_odd_messages(self, base: Base) -> None:
        """Messages of odd shapes read back exactly, or are refused with no write."""

        @base.fuzz(60)
        @given(added=messages())
        def check(added: list[tuple[Any, Any]]) -> None:
            with base.copy() as path:
                persistence = PersistenceHandler(path)
                agent = Holder(agent_id="h")
                try:
                    with handler(Scribe(added)), handler(persistence):
                        agent.ask("hi")
                except StateSerializationError as e:
                    refused_without_a_write(path, e)
                    return
                finally:
                    persistence.close()
                with Store(path) as store:
                    history = store.history("h")
                assert len(history) == len(added)
                for stored, (_, message) in zip(history, added, strict=True):
                    assert same_json(stored, message)
                again = loaded(path)
                assert list(again.__history__) == [key for key, _ in added]
                code, _, err = cli(["history", str(path), "h", "--all"])
                assert code == 0, err

        check()

    def test_deep_message_is_compacted(self, base: Base) -> None:
        """A message nested deeper than SQLite's JSON functions read (1,000) compacts like any.

        It stays in the history, unsearchable by recall; the compaction commits.
        """

        def turn(n: int) -> list[tuple[str, Any]]:
            content: Any = f"message {n}"
            if n == 0:
                content = [{"type": "text", "text": "deep"}, {"type": "data", "v": nested(1005)}]
            return [
                (f"u{n}", {"id": f"u{n}", "role": "user", "content": content}),
                (f"a{n}", {"id": f"a{n}", "role": "assistant", "content": "ok"}),
            ]

        with base.copy() as path:
            persistence = PersistenceHandler(path)
            compaction = CompactionHandler(max_messages=6, keep_recent=2)
            agent = Holder(agent_id="h")
            try:
                with handler(Scribe(turn)), handler(compaction), handler(persistence):
                    for _ in range(4):
                        agent.ask("hi")
            finally:
                persistence.close()
            with Store(path) as store:
                kinds = [v.kind for v in store.versions("h")]
                every = store.history("h", include_compacted=True)
            assert "compaction" in kinds
            assert same_json(every[0]["content"][1]["v"], nested(1005))
