"""Agents and readers for the SQL workspace tests (imported explicitly)."""

import dataclasses
import glob
import os
from pathlib import Path
from typing import Any

import apsw
from effectful.handlers.llm import Template
from effectful.ops.types import NotHandled
from helpers import is_postgres, persisted

from effectful_durable import PersistentAgent, SQLLimits, SQLTools, Store
from effectful_durable.store.workspace.cache import WorkspaceCache
from effectful_durable.testing import FakeLLM, ToolCall


@dataclasses.dataclass
class Tracker(PersistentAgent, SQLTools):
    """You track runs."""

    __sql_schema__ = """
        CREATE TABLE runs (id INTEGER PRIMARY KEY, km REAL NOT NULL, day TEXT);
        CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
    """

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


@dataclasses.dataclass
class Builder(PersistentAgent, SQLTools):
    """You keep your own tables."""

    __sql_schema__ = "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)"
    __sql_create_tables__ = True

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


@dataclasses.dataclass
class Small(PersistentAgent, SQLTools):
    """You have tight limits."""

    __sql_schema__ = "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)"
    __sql_limits__ = SQLLimits(max_rows=3, max_result_bytes=150, max_statement_chars=100)

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


def sql_turn(db_path: Path | str, agent: Any, *calls: ToolCall, **options: Any) -> list[str]:
    """Run one turn in which the model makes ``calls`` in order; return the tool results."""
    llm = FakeLLM([*calls, "done"])
    with persisted(db_path, llm, **options):
        agent.ask("go")
    return tool_results(llm)


def tool_results(llm: FakeLLM) -> list[str]:
    """The tool results the model was shown in its last request, after the last question."""
    out = []
    messages = llm.calls[-1].messages
    last_user = max(i for i, m in enumerate(messages) if m["role"] == "user")
    for message in messages[last_user:]:
        if message["role"] == "tool":
            content = message["content"]
            if isinstance(content, list):
                content = "".join(block.get("text", "") for block in content)
            out.append(str(content))
    return out


def workspace_path(db_path: str, agent_id: str) -> str:
    """The file that holds ``agent_id``'s tables, beside the SQLite database ``db_path``."""
    return WorkspaceCache.beside(db_path).path(agent_id)


def workspace_file(db: Path | str, agent_id: str, **options: Any) -> str:
    """The file of ``agent_id``'s tables: beside an SQLite database, or in this
    machine's cache of a PostgreSQL one (``options`` for its Store: workspace_dir)."""
    if is_postgres(db):
        with Store(str(db), readonly=True, **options) as store:
            return store._workspaces.path(agent_id)
    return workspace_path(str(db), agent_id)


def workspace_files(db: Path | str, **options: Any) -> list[str]:
    """Every agent's workspace file of the database ``db`` (see :func:`workspace_file`)."""
    directory = os.path.dirname(workspace_file(db, "any", **options))
    return sorted(glob.glob(os.path.join(directory, "*.sqlite")))


def dump(path: str) -> list[tuple[Any, ...]]:
    """Schema, pragmas and every row of a SQLite file, through a fresh read-only connection."""
    conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
    try:
        out: list[tuple[Any, ...]] = [
            (
                "pragma",
                conn.pragma("user_version"),
                conn.pragma("application_id"),
                conn.pragma("journal_mode"),
            ),
        ]
        schema = conn.execute(
            "SELECT type, name, sql FROM sqlite_schema ORDER BY type, name"
        ).fetchall()
        out += schema
        for kind, name, _ in schema:
            if kind == "table" and not name.startswith("sqlite_"):
                quoted = '"' + name.replace('"', '""') + '"'
                out += [(name, *row) for row in conn.execute(f"SELECT * FROM {quoted} ORDER BY 1")]
        return out
    finally:
        conn.close()
