"""The SQL sandbox: what an agent's own SQL may do on its workspace connection.

Isolation is by construction: an agent's SQL runs on a connection to its own
workspace file, which holds nothing but its tables. On top of that every
statement is prepared first and its authorizer actions are checked against the
rules below (not string matching); the same rules are then installed as the
authorizer while it runs, so a statement is refused before it does anything.
The progress handler bounds its work, and the caller caps what comes back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import apsw
import apsw.ext

from ..engine.sqlite.damage import CORRUPTION

# Pragmas that only describe the schema; any other pragma, and any pragma given
# a value to set (other than these ones' table or index name), is refused.
READ_PRAGMAS = frozenset(
    {
        "table_info",
        "table_xinfo",
        "table_list",
        "index_list",
        "index_info",
        "index_xinfo",
        "foreign_key_list",
    }
)

# SQL functions the agent may not call. The workspace connection loads no
# extension and registers no function of ours; these are the built-in or
# commonly compiled-in ones that reach outside the database or the engine.
DENIED_FUNCTIONS = frozenset(
    {
        "load_extension",
        "fts3_tokenizer",
        "readfile",
        "writefile",
        "edit",
        "fsdir",
        "lsmode",
        "sqlite_dbpage",
    }
)

_DDL = {
    apsw.SQLITE_CREATE_TABLE: "CREATE TABLE",
    apsw.SQLITE_CREATE_INDEX: "CREATE INDEX",
    apsw.SQLITE_DROP_TABLE: "DROP TABLE",
    apsw.SQLITE_DROP_INDEX: "DROP INDEX",
    apsw.SQLITE_ALTER_TABLE: "ALTER TABLE",
}
_WRITES = {
    apsw.SQLITE_INSERT: "INSERT",
    apsw.SQLITE_UPDATE: "UPDATE",
    apsw.SQLITE_DELETE: "DELETE",
}
_NEVER = {
    apsw.SQLITE_ATTACH: "ATTACH",
    apsw.SQLITE_DETACH: "DETACH",
    apsw.SQLITE_TRANSACTION: "BEGIN/COMMIT/ROLLBACK (each turn is one transaction already)",
    apsw.SQLITE_SAVEPOINT: "SAVEPOINT/RELEASE (each statement runs in its own savepoint)",
    apsw.SQLITE_CREATE_VIEW: "CREATE VIEW",
    apsw.SQLITE_DROP_VIEW: "DROP VIEW",
    apsw.SQLITE_CREATE_TRIGGER: "CREATE TRIGGER",
    apsw.SQLITE_DROP_TRIGGER: "DROP TRIGGER",
    apsw.SQLITE_CREATE_TEMP_TABLE: "CREATE TEMP TABLE",
    apsw.SQLITE_CREATE_TEMP_INDEX: "CREATE TEMP INDEX",
    apsw.SQLITE_CREATE_TEMP_TRIGGER: "CREATE TEMP TRIGGER",
    apsw.SQLITE_CREATE_TEMP_VIEW: "CREATE TEMP VIEW",
    apsw.SQLITE_DROP_TEMP_TABLE: "DROP TEMP TABLE",
    apsw.SQLITE_DROP_TEMP_INDEX: "DROP TEMP INDEX",
    apsw.SQLITE_DROP_TEMP_TRIGGER: "DROP TEMP TRIGGER",
    apsw.SQLITE_DROP_TEMP_VIEW: "DROP TEMP VIEW",
    apsw.SQLITE_CREATE_VTABLE: "CREATE VIRTUAL TABLE",
    apsw.SQLITE_DROP_VTABLE: "DROP VIRTUAL TABLE",
    apsw.SQLITE_ANALYZE: "ANALYZE",
    apsw.SQLITE_COPY: "COPY",
}


class Refused(Exception):
    """A statement the sandbox will not run; the message is meant for the model."""


@dataclass(frozen=True)
class SQLLimits:
    """Limits on what one agent SQL statement may do and return.

    Args:
        max_rows: Rows a query returns at most; the model is told when cut.
        max_result_bytes: Bytes of result (as JSON text) at most; cut beyond.
        max_statement_chars: Characters of one statement at most.
        max_vm_steps: SQLite virtual-machine steps one statement may take.
        max_seconds: Wall-clock seconds one statement may take.
        max_value_bytes: Largest string or blob a statement may make
            (``SQLITE_LIMIT_LENGTH``), so ``zeroblob``/``randomblob`` stay small.
        max_workspace_bytes: Largest size of the agent's workspace file.

    .. versionadded:: 0.2.0
    """

    max_rows: int = 200
    max_result_bytes: int = 64 * 1024
    max_statement_chars: int = 10_000
    max_vm_steps: int = 10_000_000
    max_seconds: float = 2.0
    max_value_bytes: int = 1024 * 1024
    max_workspace_bytes: int = 256 * 1024 * 1024


@dataclass(frozen=True)
class Statement:
    """One vetted statement: its text and what kind of statement it is."""

    sql: str
    readonly: bool
    ddl: str | None  # "CREATE TABLE", ... when it changes the schema
    tables: frozenset[str]  # tables it names (read, written, created or dropped)


def harden(conn: apsw.Connection, limits: SQLLimits) -> None:
    """Turn off what the agent must never reach, on a workspace connection."""
    for option, value in (
        (apsw.SQLITE_DBCONFIG_DEFENSIVE, 1),
        (apsw.SQLITE_DBCONFIG_ENABLE_TRIGGER, 0),
        (apsw.SQLITE_DBCONFIG_ENABLE_VIEW, 0),
        (apsw.SQLITE_DBCONFIG_TRUSTED_SCHEMA, 0),
        (apsw.SQLITE_DBCONFIG_ENABLE_LOAD_EXTENSION, 0),
        (apsw.SQLITE_DBCONFIG_ENABLE_FTS3_TOKENIZER, 0),
        (apsw.SQLITE_DBCONFIG_ENABLE_ATTACH_CREATE, 0),
        (apsw.SQLITE_DBCONFIG_ENABLE_ATTACH_WRITE, 0),
    ):
        conn.config(option, value)
    conn.limit(apsw.SQLITE_LIMIT_ATTACHED, 0)
    conn.limit(apsw.SQLITE_LIMIT_LENGTH, limits.max_value_bytes)
    conn.limit(apsw.SQLITE_LIMIT_SQL_LENGTH, limits.max_statement_chars * 4)


def vet(
    conn: apsw.Connection,
    sql: str,
    params: Sequence[Any],
    *,
    write: bool,
    allow_ddl: bool,
    protected: frozenset[str] = frozenset(),
    limits: SQLLimits,
) -> Statement:
    """Prepare ``sql`` without running it and check it against the rules.

    Raises:
        Refused: It breaks a rule; the message says which, for the model.
    """
    if not isinstance(sql, str) or not sql.strip():
        msg = "the statement is empty; give one SQL statement"
        raise Refused(msg)
    if len(sql) > limits.max_statement_chars:
        msg = (
            f"the statement is {len(sql)} characters long; the limit is "
            f"{limits.max_statement_chars}. Split the work into shorter statements."
        )
        raise Refused(msg)
    actions: list[_Action] = []

    def record(code: int, a1: str | None, a2: str | None, db: str | None, _: Any) -> int:
        actions.append(_action(code, a1, a2, db))
        return apsw.SQLITE_OK

    previous = conn.authorizer
    conn.authorizer = record
    try:
        info = apsw.ext.query_info(conn, sql)  # prepares, never runs
    except CORRUPTION:
        raise  # the file is damaged, not the statement: the caller rebuilds it
    except apsw.Error as e:
        msg = f"SQL error: {e}"
        raise Refused(msg) from None
    except ValueError as e:  # a NUL, or a lone surrogate, which has no UTF-8 form
        msg = f"the statement is not valid text: {e}"
        raise Refused(msg) from None
    finally:
        conn.authorizer = previous
    if info.query_remaining is not None and _has_statement(conn, info.query_remaining):
        msg = (
            "only one statement per call is allowed; this text holds more after "
            f"{info.first_query.strip()!r}. Send each statement in its own call."
        )
        raise Refused(msg)
    if info.bindings_count != len(params):
        msg = (
            f"the statement has {info.bindings_count} parameter placeholder(s) but "
            f"{len(params)} value(s) were given in params"
        )
        raise Refused(msg)
    if not actions:
        # VACUUM, VACUUM INTO and REINDEX prepare without any authorizer action.
        msg = (
            "this kind of statement is not allowed; use SELECT (sql_query) or "
            "INSERT/UPDATE/DELETE (sql_execute)"
        )
        raise Refused(msg)
    ddl = next((_DDL[a.action] for a in actions if a.action in _DDL), None)
    if ddl is not None and write and not allow_ddl:
        msg = (
            f"{ddl} is not allowed: this agent may not change its schema. Use the "
            "tables listed in the system message."
        )
        raise Refused(msg)
    tables: set[str] = set()
    for action in actions:
        reason = _refusal(action, write=write, ddl=ddl, protected=protected)
        if reason is not None:
            raise Refused(reason)
        table = action.table
        if table and not table.lower().startswith("sqlite_"):
            tables.add(table)
    if not write and not info.is_readonly:
        msg = "sql_query only reads; use sql_execute to change data"
        raise Refused(msg)
    return Statement(info.first_query, bool(info.is_readonly), ddl, frozenset(tables))


@contextmanager
def guarded(conn: apsw.Connection, statement: Statement, limits: SQLLimits) -> Iterator[None]:
    """Run a vetted statement with the rules as authorizer and a bounded budget."""
    steps_per_call = 1000
    budget = {"calls": limits.max_vm_steps // steps_per_call}
    deadline = time.monotonic() + limits.max_seconds
    exceeded: list[str] = []

    def progress() -> bool:
        budget["calls"] -= 1
        if budget["calls"] < 0:
            exceeded.append(f"{limits.max_vm_steps:,} SQLite VM steps")
            return True
        if time.monotonic() > deadline:
            exceeded.append(f"{limits.max_seconds:g} seconds")
            return True
        return False

    def authorize(code: int, a1: str | None, a2: str | None, db: str | None, _: Any) -> int:
        action = _action(code, a1, a2, db)
        write = not statement.readonly
        reason = _refusal(action, write=write, ddl=statement.ddl, protected=frozenset())
        return apsw.SQLITE_OK if reason is None else apsw.SQLITE_DENY

    conn.authorizer = authorize
    conn.set_progress_handler(progress, steps_per_call)
    try:
        yield
    except apsw.InterruptError:
        what = exceeded[0] if exceeded else "its budget"
        msg = (
            f"the statement was stopped after {what}, its limit; nothing it did was "
            "kept. Make it cheaper (add a WHERE, a LIMIT, or an index)."
        )
        raise Refused(msg) from None
    finally:
        conn.authorizer = None
        conn.set_progress_handler(None)


@dataclass(frozen=True)
class _Action:
    """One authorizer call: its code, two arguments and database name."""

    action: int
    a1: str | None
    a2: str | None
    database_name: str | None

    @property
    def table(self) -> str | None:
        """The table the action names, if any."""
        if self.action in (apsw.SQLITE_CREATE_INDEX, apsw.SQLITE_DROP_INDEX):
            return self.a2
        if self.action in (apsw.SQLITE_READ, *_WRITES, *_DDL):
            return self.a1
        return None


def _action(code: int, a1: str | None, a2: str | None, db: str | None) -> _Action:
    if code == apsw.SQLITE_ALTER_TABLE:  # its arguments are (database, table)
        return _Action(code, a2, None, a1)
    return _Action(code, a1, a2, db)


def _refusal(
    action: _Action, *, write: bool, ddl: str | None, protected: frozenset[str]
) -> str | None:
    """Why ``action`` is refused, or None if it is allowed."""
    code, a1, a2, database = action.action, action.a1, action.a2, action.database_name
    if code in _NEVER:
        return f"{_NEVER[code]} is not allowed in the SQL workspace"
    if database not in (None, "main"):
        return f"only the agent's own tables are reachable; {database!r} is not"
    if code == apsw.SQLITE_PRAGMA:
        name = (a1 or "").lower()
        if name in READ_PRAGMAS:
            return None
        return (
            f"PRAGMA {a1} is not allowed; only these read-only pragmas are: "
            f"{', '.join(sorted(READ_PRAGMAS))}"
        )
    if code == apsw.SQLITE_FUNCTION:
        if (a2 or "").lower() in DENIED_FUNCTIONS:
            return f"the function {a2}() is not allowed in the SQL workspace"
        return None
    if code in (apsw.SQLITE_SELECT, apsw.SQLITE_RECURSIVE):
        return None
    if code == apsw.SQLITE_REINDEX:  # CREATE INDEX builds its index through it
        return None if ddl == "CREATE INDEX" else "REINDEX is not allowed in the SQL workspace"
    if code == apsw.SQLITE_READ:
        table = (a1 or "").lower()
        if table.startswith("pragma_") and table[len("pragma_") :] not in READ_PRAGMAS:
            return f"{a1} is not allowed; only the read-only schema pragmas are"
        return None
    if code in _DDL:
        if not write:
            return "sql_query only reads; schema changes are not allowed in it"
        target = a2 if code in (apsw.SQLITE_CREATE_INDEX, apsw.SQLITE_DROP_INDEX) else a1
        if (target or "").lower().startswith("sqlite_"):
            return "names starting with sqlite_ belong to SQLite and are not allowed"
        if code in (apsw.SQLITE_DROP_TABLE, apsw.SQLITE_ALTER_TABLE) and target in protected:
            return (
                f"table {target} is declared by the developer; it cannot be dropped "
                "or altered from the SQL tools"
            )
        return None
    if code in _WRITES:
        if not write:
            return "sql_query only reads; use sql_execute to change data"
        table = (a1 or "").lower()
        if table.startswith("sqlite_") and ddl is None:
            return f"writing to {a1} is not allowed: tables named sqlite_* belong to SQLite"
        return None
    return f"this statement needs a permission the SQL workspace does not grant (code {code})"


def _has_statement(conn: apsw.Connection, text: str) -> bool:
    """Whether ``text`` holds a statement, not just whitespace and comments."""
    try:
        return bool(apsw.ext.query_info(conn, text).has_vdbe)
    except apsw.Error:
        return True


def row_limits_text(limits: SQLLimits) -> str:
    """The limits as one sentence for the model."""
    return (
        f"At most {limits.max_rows} rows and {limits.max_result_bytes // 1024} KiB come "
        f"back per query; one statement per call, at most {limits.max_statement_chars} "
        "characters."
    )
