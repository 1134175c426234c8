"""Agents and builders shared by the tests (imported explicitly, not via conftest)."""

import contextlib
import dataclasses
import datetime
import enum
import os
import queue
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import apsw
import pydantic
from child import running
from effectful.handlers.llm import Agent, Template, Tool
from effectful.ops.types import NotHandled
from paths import ROOT

from effectful_durable import (
    AgentInUseError,
    PersistenceHandler,
    PersistentAgent,
    StateTools,
    Store,
    ephemeral,
)
from effectful_durable.store.engine import process
from effectful_durable.store.engine.sqlite import row_checks
from effectful_durable.store.history import HistoryChange
from effectful_durable.store.records import TurnStart
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
def persisted(db_path: Path | str, llm: FakeLLM, **options: Any) -> Iterator[PersistenceHandler]:
    """Run with a PersistenceHandler on ``db_path`` over the fake model."""
    persistence = PersistenceHandler(db_path, **options)
    try:
        with running(llm, persistence):
            yield persistence
    finally:
        persistence.close()


@contextlib.contextmanager
def held_elsewhere(db: Path | str, agent_id: str) -> Iterator[None]:
    """Hold ``agent_id`` from another thread, through its own Store, for the block (as a
    running turn of it does)."""
    holding, release = threading.Event(), threading.Event()

    def turn() -> None:
        with Store(db) as store, store.agent_lock(agent_id):
            holding.set()
            release.wait(60)

    running = threading.Thread(target=turn)
    running.start()
    try:
        assert holding.wait(30)
        yield
    finally:
        release.set()
        running.join()


def commit_message(store: Store, agent_id: str = "bot", content: str | None = None) -> int:
    """Commit one turn that adds one user message (with ``content``), as the handler would."""
    with store.turns.start(agent_id, template="t", arguments={}) as start:
        message: dict[str, Any] = {"id": f"m{start.version}", "role": "user"}
        if content is not None:
            message["content"] = content
        change = HistoryChange(added=[(start.version, message)], removed=[], removed_count=0)
        return store.turns.commit(
            agent_id, base_version=start.version, template="t", change=change, state=None
        )


def begin_turn(store: Store, agent_id: str, **options: Any) -> TurnStart:
    """Start a turn of ``agent_id`` and let the agent go with its handoff left behind, as a
    turn that crashed leaves it (``options``: of ``Store.turns.start``)."""
    with store.turns.start(agent_id, **options) as start:
        return start


def added(position: int) -> HistoryChange:
    """A turn's change that adds one user message at ``position``."""
    message = {"id": f"m{position}", "role": "user", "content": str(position)}
    return HistoryChange(added=[(position, message)], removed=[], removed_count=0)


def first_turn_after(db: Path | str, agent_id: str, since: float, timeout: float) -> float:
    """Seconds from ``since`` (``time.monotonic()``) until a turn of ``agent_id``
    (``Assistant``, over the fake model) commits here, tried every 0.1 s while another
    process holds the agent; an assertion fails past ``timeout``."""
    with persisted(db, FakeLLM(respond=lambda call: "from here")):
        mine = Assistant(agent_id=agent_id)
        while True:
            try:
                mine.ask("is it free?")
                return time.monotonic() - since
            except AgentInUseError as error:
                assert "in use by process" in str(error), error
                assert time.monotonic() - since < timeout, error
                time.sleep(0.1)


def commit_writes(store: Store, agent_id: str, *writes: Any) -> int:
    """Commit an empty turn of ``agent_id`` carrying ``writes`` (TurnWrites); its version."""
    base = next((a.version for a in store.agents() if a.agent_id == agent_id), 0)
    return store.turns.commit(
        agent_id,
        base_version=base,
        template="t",
        change=HistoryChange([], [], 0),
        state=None,
        writes=list(writes),
    )


def writable_connection(db_path: Path | str) -> apsw.Connection:
    """A plain connection for a test that edits our database as the Store would.

    It keeps the rows' checksums (store/row_checks.py): a row changed through any
    other connection fails its checksum when the Store reads it.
    """
    conn = apsw.Connection(str(db_path))
    row_checks.register(conn)
    row_checks.install(conn, str(db_path))
    return conn


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

        with psycopg.connect(str(db_path)) as pg:
            return [tuple(row) for row in pg.execute(*_for_psycopg(sql, params)).fetchall()]
    conn = apsw.Connection(str(db_path), flags=apsw.SQLITE_OPEN_READONLY)
    conn.set_busy_timeout(5000)  # a writer may be recovering the WAL of a killed process
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def edit_rows(db: Path | str, sql: str, *params: Any, foreign: bool = False) -> None:
    """Change the database by hand: one statement, written as for ``persisted_rows``, in a
    transaction of an independent connection. On SQLite that connection keeps the rows'
    checksums, unless ``foreign``: then it is another program's, and the rows it changes
    fail their checksums."""
    if is_postgres(db):
        import psycopg

        with psycopg.connect(str(db)) as pg:
            pg.execute(*_for_psycopg(sql, params))
        return
    conn = apsw.Connection(str(db)) if foreign else writable_connection(db)
    try:
        with conn:
            conn.execute(sql, params)
    finally:
        conn.close()


def _for_psycopg(sql: str, params: tuple[Any, ...]) -> tuple[bytes, Any]:
    """SQLite's ``?`` or ``?N`` parameters as psycopg's."""
    query = sql.replace("%", "%%")
    if re.search(r"\?\d", query):  # ?N: the Nth parameter, however often it appears
        query = re.sub(r"\?(\d+)", r"%(\1)s", query)
        return query.encode(), {str(i): value for i, value in enumerate(params, 1)}
    return query.replace("?", "%s").encode(), params


def integrity(db_path: Path | str) -> str:
    """``PRAGMA integrity_check`` of the file, through an independent connection.

    On PostgreSQL: every table of ours reads whole ("ok"); the server checks pages itself.
    """
    if is_postgres(db_path):
        for table in ("agents", "versions", "messages", "handoffs", "workflow_steps"):
            persisted_rows(db_path, f"SELECT count(*) FROM {table}")
        return "ok"
    return str(persisted_rows(db_path, "PRAGMA integrity_check")[0][0])


#: The names of our tables in a PostgreSQL database (none before a Store opened it).
OUR_POSTGRES_TABLES = "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"


def rows_written_from_now(store: Store) -> Callable[[], int]:
    """A counter of the rows the store writes from now on: call it to read the count.

    SQLite: rows inserted, updated or deleted through this thread's connection
    (``total_changes``). PostgreSQL: row versions of our tables that transactions
    begun from now on wrote and that still live (``xmin``); a deleted row leaves no
    version to count.
    """
    if not is_postgres(store.path):
        conn = store.engine.connection()
        before = conn.total_changes()
        return lambda: conn.total_changes() - before
    [(first,)] = persisted_rows(store.path, "SELECT pg_snapshot_xmax(pg_current_snapshot())")
    tables = [name for (name,) in persisted_rows(store.path, OUR_POSTGRES_TABLES)]
    query = " + ".join(
        f"(SELECT count(*) FROM {table} WHERE xmin::text::bigint >= ?1)" for table in tables
    )
    # A fresh cluster's transaction ids are far from wrapping around: xmin < 2**32.
    return lambda: int(persisted_rows(store.path, f"SELECT {query}", int(first))[0][0])


@contextlib.contextmanager
def statements_run(store: Store) -> Iterator[list[tuple[str, Any]]]:
    """Record each statement (with its parameters) the store runs in this thread meanwhile.

    On SQLite through the connection's trace hook; on PostgreSQL by wrapping the
    backend's ``PostgresConn.execute``, which still runs every statement.
    """
    statements: list[tuple[str, Any]] = []
    if not is_postgres(store.path):

        def tracer(cursor: apsw.Cursor, sql: str, bindings: Any) -> bool:
            statements.append((sql, bindings))
            return True

        conn = store.engine.connection()
        conn.exec_trace = tracer
        try:
            yield statements
        finally:
            conn.exec_trace = None
        return
    from effectful_durable.store.engine.postgres.database import PostgresConn

    execute = PostgresConn.execute

    thread = threading.current_thread()

    def recording(self: PostgresConn, sql: str, bindings: Any = None, /) -> Any:
        if threading.current_thread() is thread:
            statements.append((sql, bindings))
        return execute(self, sql, bindings)

    PostgresConn.execute = recording  # type: ignore[method-assign]
    try:
        yield statements
    finally:
        PostgresConn.execute = execute  # type: ignore[method-assign]


def indexes_and_scans(store: Store, sql: str, bindings: Any) -> tuple[set[str], set[str]]:
    """The indexes the database's plan for ``sql`` reads, and the tables it reads whole."""
    with store.engine.reading() as conn:
        if not is_postgres(store.path):
            details = [row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {sql}", bindings)]
            return (
                {m for d in details for m in re.findall(r"USING (?:COVERING )?INDEX (\w+)", d)},
                {d.split()[1] for d in details if d.startswith("SCAN ")},
            )
        [[plan]] = conn.execute(f"EXPLAIN (FORMAT JSON) {sql}", bindings).fetchone()
    indexes, scans = set(), set()
    nodes = [plan["Plan"]]
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        if "Index Name" in node:
            indexes.add(node["Index Name"])
        if node["Node Type"] == "Seq Scan":
            scans.add(node["Relation Name"])
    return indexes, scans


def pad_messages(db: Path | str, agent_id: str, count: int) -> None:
    """Add ``count`` archived messages in other conversations of ``agent_id``, straight into
    the table, and ANALYZE it: a table large enough for PostgreSQL's planner to weigh."""
    edit_rows(
        db,
        """
        WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)
        INSERT INTO messages
              (agent_id, conversation, position, added_in, removed_in, message_id, role, body)
        SELECT ?, 'padding-' || (i % 100), i * 1.0, 1, 2, 'm' || i, 'user', '{}' FROM n
        """,
        count,
        agent_id,
    )
    edit_rows(db, "ANALYZE messages")


class NewDatabases:
    """Makes new, empty databases of one backend: the ``new_databases`` fixture."""

    def __init__(self, make: Callable[[], AbstractContextManager[str]], *, postgres: bool) -> None:
        self._make, self.postgres = make, postgres

    def __call__(self) -> AbstractContextManager[str]:
        """A new database (a file path or a URL), dropped on PostgreSQL when the block ends."""
        return self._make()

    def examples(self, count: int) -> int:
        """How many Hypothesis examples to run on this backend (``examples_on``)."""
        return examples_on(self.postgres, count)


def examples_on(postgres: bool, count: int) -> int:
    """``count`` Hypothesis examples on SQLite, a fifth on PostgreSQL, where each one
    costs several times as much (a database made or cloned and dropped, turns over a
    socket)."""
    return max(count // 5, 2) if postgres else count


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
        cwd=ROOT,
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
    return subprocess.run(
        [sys.executable, "-c", script, db], capture_output=True, text=True, cwd=ROOT
    )


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (it was free a moment ago)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class StderrLines:
    """A child process whose stderr is read line by line in a thread, and waited for
    with deadlines (``expect``)."""

    #: Seconds ``expect`` waits by default.
    patience = 30.0

    def __init__(self, proc: "subprocess.Popen[str]") -> None:
        self.proc = proc
        self.log: list[str] = []
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.log.append(line.rstrip())
            self._lines.put(line.rstrip())
        self._lines.put(None)

    def expect(self, text: str, timeout: float | None = None) -> str:
        """Wait for a log line containing ``text``."""
        deadline = time.monotonic() + (self.patience if timeout is None else timeout)
        while True:
            try:
                line = self._lines.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                line = ""
            if line is None or time.monotonic() > deadline:
                log = "\n".join(self.log[-30:])
                raise AssertionError(f"no log line with {text!r}; last lines:\n{log}")
            if text in line:
                return line

    def text(self) -> str:
        """Everything it logged so far."""
        return "\n".join(self.log)


def wait_until(
    condition: Callable[[], object], timeout: float, what: str, poll: float = 0.1
) -> float:
    """Wait for ``condition()``; the seconds it took."""
    started = time.monotonic()
    while not condition():
        assert time.monotonic() - started < timeout, f"{what} within {timeout:g} s"
        time.sleep(poll)
    return time.monotonic() - started


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (it is not our child: no zombie to reap)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


#: A pid no process has: above the kernel's largest pid_max (2**22).
ENDED_PID = 2**22 + 1


def ghost_runner(store: Store, runner: str, *, place: str | None = None) -> None:
    """A status row of a runner, beating now, whose process ended: ``ENDED_PID`` in
    ``place`` (this process's kernel and PID namespace, unless given)."""
    store.alarm_queue.record_status(runner, state="running", started_at=time.time(), report={})
    with store.engine.writing() as conn:
        conn.execute(
            "UPDATE runner_status SET pid = ?, place = ? WHERE runner_id = ?",
            (ENDED_PID, place or process.place(), runner),
        )
