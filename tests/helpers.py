"""Agents and builders shared by the tests (imported explicitly, not via conftest)."""

import contextlib
import dataclasses
import datetime
import enum
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import apsw
import pydantic
from effectful.handlers.llm import Agent, Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent, StateTools, Store, ephemeral
from effectful_durable.store.checksums import checksum_vfs
from effectful_durable.store.history import HistoryChange
from effectful_durable.testing import FakeLLM


class Mood(enum.Enum):
    CALM = "calm"
    BUSY = "busy"


@dataclasses.dataclass
class Address:
    city: str
    since: datetime.date


class Preferences(pydantic.BaseModel):
    tone: str = "plain"
    tags: list[str] = []


@dataclasses.dataclass
class Assistant(PersistentAgent):
    """You are a helpful assistant."""

    turns: int = 0
    notes: list[str] = dataclasses.field(default_factory=list)
    mood: Mood = Mood.CALM
    address: Address | None = None
    preferences: Preferences = dataclasses.field(default_factory=Preferences)
    last_seen: datetime.datetime | None = None
    scratch: Any = ephemeral(default=None)

    @Tool.define
    def remember(self, note: str) -> str:
        """Remember a note for later."""
        self.notes.append(note)
        return f"noted: {note}"

    @Template.define
    def ask(self, question: str) -> str:
        """Answer the question: {question}"""
        raise NotHandled


@dataclasses.dataclass
class Manager(PersistentAgent):
    """You delegate research to your researcher."""

    researcher: Assistant = ephemeral(default=None)

    @Tool.define
    def delegate(self, question: str) -> str:
        """Ask the researcher a question."""
        return self.researcher.ask(question)

    @Template.define
    def plan(self, goal: str) -> str:
        """Make a plan for: {goal}"""
        raise NotHandled


@dataclasses.dataclass
class Keeper(PersistentAgent, StateTools):
    """You keep what you learn."""

    @Tool.define
    def note_by_code(self, key: str, value: int) -> str:
        """Store a value through the developer's API."""
        self.__memory__.put(key, value)
        return "ok"

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


class PlainBot(Agent):
    """A plain effectful agent, not persistent."""

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


@contextlib.contextmanager
def running(llm: FakeLLM, *handlers: Any) -> Iterator[None]:
    """Install a fake provider stack: LiteLLMProvider, the fake model, then ``handlers``."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(handler(LiteLLMProvider(model="fake")))
        stack.enter_context(handler(llm))
        for extra in handlers:
            stack.enter_context(handler(extra))
        yield


@contextlib.contextmanager
def persisted(db_path: Path | str, llm: FakeLLM, **options: Any) -> Iterator[PersistenceHandler]:
    """Run with a PersistenceHandler on ``db_path`` over the fake model."""
    persistence = PersistenceHandler(db_path, **options)
    try:
        with running(llm, persistence):
            yield persistence
    finally:
        persistence.close()


def commit_message(store: Store, agent_id: str = "bot", content: str | None = None) -> int:
    """Commit one turn that adds one user message (with ``content``), as the handler would."""
    start = store.begin_turn(agent_id, template="t", arguments={})
    message: dict[str, Any] = {"id": f"m{start.version}", "role": "user"}
    if content is not None:
        message["content"] = content
    change = HistoryChange(added=[(start.version, message)], removed=[], removed_count=0)
    return store.commit_turn(
        agent_id, base_version=start.version, template="t", change=change, state=None
    )


def commit_writes(store: Store, agent_id: str, *writes: Any) -> int:
    """Commit an empty turn of ``agent_id`` carrying ``writes`` (TurnWrites); its version."""
    base = next((a.version for a in store.agents() if a.agent_id == agent_id), 0)
    return store.commit_turn(
        agent_id,
        base_version=base,
        template="t",
        change=HistoryChange([], [], 0),
        state=None,
        writes=list(writes),
    )


def writable_connection(db_path: Path | str) -> apsw.Connection:
    """A plain connection for a test that edits our database: it keeps the page checksums.

    A page written to the file through any other VFS fails its checksum when the
    Store reads it (store/checksums.py).
    """
    return apsw.Connection(str(db_path), vfs=checksum_vfs())


def is_postgres(db: Path | str) -> bool:
    """Whether ``db`` (a test's ``store_url``) names a PostgreSQL database."""
    return str(db).startswith("postgresql://")


def persisted_rows(db_path: Path | str, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Query the database through a fresh, independent connection (SQLite or PostgreSQL).

    ``sql`` is written for SQLite with ``?`` or ``?N`` parameters; on PostgreSQL they
    become psycopg's.
    """
    if is_postgres(db_path):
        import psycopg

        query = sql.replace("%", "%%")
        if re.search(r"\?\d", query):  # ?N: the Nth parameter, however often it appears
            query = re.sub(r"\?(\d+)", r"%(\1)s", query)
            bound: Any = {str(i): value for i, value in enumerate(params, 1)}
        else:
            query, bound = query.replace("?", "%s"), params
        with psycopg.connect(str(db_path)) as pg:
            return [tuple(row) for row in pg.execute(query.encode(), bound).fetchall()]
    conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
    conn.set_busy_timeout(5000)  # a writer may be recovering the WAL of a killed process
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def integrity(db_path: Path | str) -> str:
    """``PRAGMA integrity_check`` of the file, through an independent connection.

    On PostgreSQL: every table of ours reads whole ("ok"); the server checks pages itself.
    """
    if is_postgres(db_path):
        for table in ("agents", "versions", "messages", "handoffs", "workflow_steps"):
            persisted_rows(db_path, f"SELECT count(*) FROM {table}")
        return "ok"
    return str(persisted_rows(db_path, "PRAGMA integrity_check")[0][0])


def texts(messages: list[dict[str, Any]]) -> list[str]:
    """The text of each message, content blocks joined, for compact assertions."""
    out = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(block.get("text", "") for block in content)
        out.append(f"{message['role']}:{content or ''}")
    return out


def in_new_process(script: str) -> str:
    """Run ``script`` in a fresh interpreter at the repository root; return its stdout."""
    prelude = "import os\nos.environ['LITELLM_LOCAL_MODEL_COST_MAP'] = 'True'\n"
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[1],
    ).stdout


def run_cli_in_fresh_python(command: str, db: str) -> subprocess.CompletedProcess[str]:
    """Run ``effectful-durable COMMAND DB`` in a new interpreter; its last output line
    lists the modules of litellm and of effectful's LLM layer it loaded (``loaded: []``)."""
    script = (
        "import runpy, sys\n"
        f"sys.argv = ['effectful-durable', '{command}', sys.argv[1]]\n"
        "try:\n"
        "    runpy.run_module('effectful_durable', run_name='__main__')\n"
        "except SystemExit as exit:\n"
        "    assert exit.code == 0, exit.code\n"
        "loaded = [m for m in sys.modules if m.startswith('litellm')\n"
        "          or m == 'effectful.handlers.llm.completions']\n"
        "print('loaded:', loaded)\n"
    )
    root = Path(__file__).parents[1]
    return subprocess.run(
        [sys.executable, "-c", script, db], capture_output=True, text=True, cwd=root
    )
