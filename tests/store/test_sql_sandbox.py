"""The SQL sandbox (DESIGN promise 7): escape and abuse attempts, each refused with a
tool error the model reads, with nothing changed on disk.

The attacker, ``mallory``, is a Builder: the permissive kind of agent, allowed to create
its own tables, so the rules are shown to hold even with schema changes opted in. A
second agent, ``victim``, holds a table of secrets in its own workspace; the main
database holds ours. Each attempt is one turn in which the model makes one tool call.
After it, the tool result starts with ``error:``, every workspace file reads exactly as
before (schema, pragmas, rows), the main database gained no workspace log rows and no
schema objects, and no file appeared beside the database or in the workspace cache.
The whole suite runs on an SQLite file and on a PostgreSQL database (whose workspace
files are in this machine's cache).
"""

import gc
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import integrity, is_postgres, persisted_rows
from sql_helpers import Builder, Tracker, dump, sql_turn, workspace_files

from effectful_durable import Store
from effectful_durable.testing import ToolCall

DEEP = "SELECT " + "(" * 3000 + "1" + ")" * 3000
BOMB = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"


def attempts(db: str, victim_file: str, out: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(id, tool, arguments) of every escape or abuse attempt."""
    q, x = "sql_query", "sql_execute"
    return [
        ("our-messages", q, {"query": "SELECT * FROM messages"}),
        ("our-agents", q, {"query": "SELECT agent_id FROM agents"}),
        ("our-log", q, {"query": "SELECT * FROM workspace_log"}),
        ("our-versions-qualified", q, {"query": "SELECT * FROM main.versions"}),
        ("other-agent-table", q, {"query": "SELECT * FROM secrets"}),
        ("attach-main-db", x, {"statement": f"ATTACH DATABASE '{db}' AS ours"}),
        ("attach-other-workspace", x, {"statement": f"ATTACH '{victim_file}' AS v"}),
        ("attach-new-file", x, {"statement": f"ATTACH 'file:{out}?mode=rwc' AS n"}),
        ("attach-in-query", q, {"query": f"SELECT 1 FROM (SELECT 1); ATTACH '{db}' AS o"}),
        ("detach", x, {"statement": "DETACH DATABASE main"}),
        ("pragma-writable-schema", x, {"statement": "PRAGMA writable_schema = ON"}),
        ("pragma-read-unlisted", q, {"query": "PRAGMA writable_schema"}),
        ("pragma-journal-mode", x, {"statement": "PRAGMA journal_mode = DELETE"}),
        ("pragma-user-version", x, {"statement": "PRAGMA user_version = 99"}),
        ("pragma-max-page-count", x, {"statement": "PRAGMA max_page_count = 2147483647"}),
        ("pragma-database-list-tvf", q, {"query": "SELECT * FROM pragma_database_list"}),
        ("pragma-table-info-with-schema", q, {"query": "PRAGMA temp.table_info(notes)"}),
        ("update-sqlite-schema", x, {"statement": "UPDATE sqlite_schema SET sql = 'x'"}),
        (
            "insert-sqlite-master",
            x,
            {
                "statement": "INSERT INTO sqlite_master "
                "VALUES ('table', 't', 't', 0, 'CREATE TABLE t(a)')"
            },
        ),
        ("delete-sqlite-schema", x, {"statement": "DELETE FROM sqlite_schema"}),
        ("temp-schema-read", q, {"query": "SELECT * FROM temp.sqlite_master"}),
        (
            "temp-trigger",
            x,
            {
                "statement": "CREATE TEMP TRIGGER t AFTER INSERT ON notes "
                "BEGIN DELETE FROM notes; END"
            },
        ),
        (
            "trigger",
            x,
            {"statement": "CREATE TRIGGER t AFTER INSERT ON notes BEGIN DELETE FROM notes; END"},
        ),
        ("view", x, {"statement": "CREATE VIEW v AS SELECT * FROM notes"}),
        ("temp-table", x, {"statement": "CREATE TEMP TABLE t (id INTEGER PRIMARY KEY)"}),
        ("virtual-table", x, {"statement": "CREATE VIRTUAL TABLE f USING fts5(x)"}),
        ("sqlite-named-index", x, {"statement": "CREATE INDEX sqlite_x ON notes (body)"}),
        ("table-without-primary-key", x, {"statement": "CREATE TABLE loose (a, b)"}),
        ("create-table-as-select", x, {"statement": "CREATE TABLE c AS SELECT * FROM notes"}),
        ("drop-declared-table", x, {"statement": "DROP TABLE notes"}),
        ("alter-declared-table", x, {"statement": "ALTER TABLE notes RENAME TO gone"}),
        ("load-extension", q, {"query": "SELECT load_extension('/usr/lib/libc.so.6')"}),
        ("readfile", q, {"query": "SELECT readfile('/etc/passwd')"}),
        ("writefile", q, {"query": f"SELECT writefile('{out}', 'x')"}),
        ("fts3-tokenizer", q, {"query": "SELECT fts3_tokenizer('simple')"}),
        ("recursive-cte-bomb", q, {"query": BOMB}),
        (
            "runaway-insert",
            x,
            {
                "statement": "INSERT INTO notes (body) WITH RECURSIVE c(x) AS "
                "(SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT 'spam' FROM c"
            },
        ),
        (
            "cross-join-bomb",
            q,
            {
                "query": "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c "
                "LIMIT 100000) SELECT count(*) FROM c a, c b"
            },
        ),
        ("zeroblob", q, {"query": "SELECT zeroblob(2000000000)"}),
        ("randomblob", q, {"query": "SELECT length(randomblob(100000000))"}),
        ("printf-bomb", q, {"query": "SELECT length(printf('%.*c', 100000000, 'x'))"}),
        ("huge-update", x, {"statement": "INSERT INTO notes (body) VALUES (zeroblob(500000000))"}),
        ("expression-nesting", q, {"query": DEEP}),
        (
            "multi-statement",
            x,
            {"statement": "INSERT INTO notes (body) VALUES ('a'); DROP TABLE notes"},
        ),
        ("multi-statement-select", q, {"query": "SELECT 1; SELECT 2"}),
        ("begin", x, {"statement": "BEGIN"}),
        ("commit", x, {"statement": "COMMIT"}),
        ("rollback", x, {"statement": "ROLLBACK"}),
        ("savepoint", x, {"statement": "SAVEPOINT s"}),
        ("release", x, {"statement": "RELEASE agent_statement"}),
        ("vacuum", x, {"statement": "VACUUM"}),
        ("vacuum-into", x, {"statement": f"VACUUM INTO '{out}'"}),
        ("reindex", x, {"statement": "REINDEX"}),
        ("reindex-table", x, {"statement": "REINDEX notes"}),
        ("analyze", x, {"statement": "ANALYZE"}),
        ("write-through-query", q, {"query": "DELETE FROM notes"}),
        (
            "returning-through-query",
            q,
            {"query": "INSERT INTO notes (body) VALUES ('x') RETURNING id"},
        ),
        ("ddl-through-query", q, {"query": "CREATE TABLE q (id INTEGER PRIMARY KEY)"}),
        ("insert-into-our-table", "sql_insert", {"table": "messages", "values": {"body": "x"}}),
        (
            "insert-column-injection",
            "sql_insert",
            {"table": "notes", "values": {"body) VALUES (1); DROP TABLE notes; --": 1}},
        ),
        ("statement-too-long", q, {"query": "SELECT '" + "x" * 20_000 + "'"}),
        (
            "params-nested",
            x,
            {"statement": "INSERT INTO notes (body) VALUES (?)", "params": [[1]]},
        ),
        (
            "params-count",
            x,
            {"statement": "INSERT INTO notes (body) VALUES (?)", "params": [1, 2]},
        ),
        ("empty-statement", x, {"statement": "  -- nothing\n"}),
    ]


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def world(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    """mallory with a row in notes, victim with a secret; both committed."""
    tmp = tmp_path_factory.mktemp("sandbox")
    if request.param == "sqlite":
        db = str(tmp / "state.db")
    else:
        db = request.getfixturevalue("postgres_server").new_database()
    victim = Builder(agent_id="victim")
    sql_turn(
        db,
        victim,
        ToolCall("sql_execute", {"statement": "CREATE TABLE secrets (id INTEGER PRIMARY KEY, s)"}),
        ToolCall("sql_insert", {"table": "secrets", "values": {"s": "the password"}}),
    )
    mallory = Builder(agent_id="mallory")
    results = sql_turn(
        db, mallory, ToolCall("sql_insert", {"table": "notes", "values": {"body": "mine"}})
    )
    assert results == ['{"changes": 1}']
    files = workspace_files(db)
    assert len(files) == 2
    with Store(db) as store:
        victim_file = next(f for f in files if "secrets" in str(dump(f)))
        assert store.sql("victim", "SELECT s FROM secrets").rows == [("the password",)]
    cache = os.path.dirname(victim_file)
    yield {"db": db, "tmp": tmp, "cache": cache, "mallory": mallory, "victim_file": victim_file}
    if is_postgres(db):
        gc.collect()
        request.getfixturevalue("postgres_server").drop_database(db)


def _disk(world: dict[str, Any]) -> dict[str, Any]:
    db = world["db"]
    return {
        "files": sorted(
            {
                str(p)
                for root in (world["tmp"], world["cache"])
                for p in Path(root).rglob("*")
                if not p.name.endswith(("-wal", "-shm"))
            }
        ),
        # user_version is the agent version the file holds: each turn moves it on.
        "workspaces": {f: dump(f)[1:] for f in workspace_files(db)},
        "workspace_pragmas": {f: dump(f)[0][2:] for f in workspace_files(db)},
        "log": persisted_rows(
            db, "SELECT agent_id, version, seq, ddl, changeset FROM workspace_log ORDER BY 1, 2, 3"
        ),
        "schema": _schema(db),
    }


def _schema(db: str) -> list[tuple[Any, ...]]:
    """The main database's tables and columns, and its marks of being ours."""
    if is_postgres(db):
        return persisted_rows(
            db,
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema = 'public' ORDER BY 1, 2",
        ) + persisted_rows(db, "SELECT * FROM effectful_durable")
    return (
        persisted_rows(db, "SELECT type, name, sql FROM sqlite_schema ORDER BY name")
        + persisted_rows(db, "PRAGMA user_version")
        + persisted_rows(db, "PRAGMA application_id")
    )


ATTEMPTS = attempts("DB", "VICTIM", "OUT")


class TestEscapes:
    """Every escape or abuse attempt is a tool error, and nothing changes on disk."""

    def test_there_are_at_least_30(self) -> None:
        """The list holds at least 30 distinct attempts."""
        assert len({name for name, _, _ in ATTEMPTS}) == len(ATTEMPTS) >= 30

    @pytest.mark.parametrize("index", range(len(ATTEMPTS)), ids=[a[0] for a in ATTEMPTS])
    def test_refused(self, world: dict[str, Any], index: int) -> None:
        """The attempt is refused with an error the model reads; files are unchanged."""
        out = str(world["tmp"] / "escaped.db")
        name, tool, arguments = attempts(str(world["db"]), world["victim_file"], out)[index]
        before = _disk(world)
        started = time.monotonic()
        results = sql_turn(world["db"], world["mallory"], ToolCall(tool, arguments))
        elapsed = time.monotonic() - started
        assert len(results) == 1
        assert results[0].startswith("error: "), (name, results[0])
        assert "Nothing was changed" in results[0]
        assert "the password" not in results[0]
        assert _disk(world) == before, name
        assert not os.path.exists(out)
        assert elapsed < 15, f"{name} took {elapsed:.1f} s"

    def test_files_are_sound(self, world: dict[str, Any]) -> None:
        """After all attempts both workspace files and the database pass integrity_check."""
        assert integrity(world["db"]) == "ok"
        for path in workspace_files(world["db"]):
            assert integrity(Path(path)) == "ok"
        with Store(world["db"]) as store:
            assert store.sql("mallory", "SELECT body FROM notes").rows == [("mine",)]


class TestRules:
    """What the sandbox allows, and what it refuses without the opt-in."""

    def test_schema_changes_need_the_opt_in(self, store_url: str) -> None:
        """An agent without __sql_create_tables__ cannot create, alter or drop tables."""
        bot = Tracker(agent_id="t")
        results = sql_turn(
            store_url,
            bot,
            ToolCall("sql_execute", {"statement": "CREATE TABLE x (id INTEGER PRIMARY KEY)"}),
            ToolCall("sql_execute", {"statement": "ALTER TABLE runs ADD COLUMN y"}),
            ToolCall("sql_execute", {"statement": "DROP TABLE notes"}),
            ToolCall("sql_execute", {"statement": "CREATE INDEX i ON runs (day)"}),
        )
        assert all(r.startswith("error: ") for r in results)
        assert all("may not change its schema" in r for r in results), results
        with Store(store_url) as store:
            assert store.sql("t", "SELECT name FROM sqlite_schema ORDER BY name").rows == [
                ("notes",),
                ("runs",),
            ]

    def test_opted_in_schema_changes(self, store_url: str) -> None:
        """With the opt-in the agent creates, indexes, alters and drops tables of its own."""
        bot = Builder(agent_id="b")
        results = sql_turn(
            store_url,
            bot,
            ToolCall("sql_execute", {"statement": "CREATE TABLE t (id INTEGER PRIMARY KEY, a)"}),
            ToolCall("sql_execute", {"statement": "CREATE INDEX t_a ON t (a)"}),
            ToolCall("sql_execute", {"statement": "CREATE INDEX notes_body ON notes (body)"}),
            ToolCall("sql_execute", {"statement": "ALTER TABLE t ADD COLUMN b"}),
            ToolCall("sql_execute", {"statement": "CREATE TABLE u (id INTEGER PRIMARY KEY)"}),
            ToolCall("sql_execute", {"statement": "DROP TABLE u"}),
        )
        assert not any(r.startswith("error") for r in results), results
        with Store(store_url) as store:
            assert store.sql("b", "SELECT name FROM sqlite_schema ORDER BY name").rows == [
                ("notes",),
                ("notes_body",),
                ("t",),
                ("t_a",),
            ]

    def test_read_pragmas_and_schema_are_allowed(self, store_url: str) -> None:
        """The listed read-only pragmas and the agent's own sqlite_schema can be read."""
        results = sql_turn(
            store_url,
            Tracker(agent_id="t"),
            ToolCall("sql_query", {"query": "PRAGMA table_info(runs)"}),
            ToolCall("sql_query", {"query": "SELECT name FROM pragma_table_list ORDER BY 1"}),
            ToolCall("sql_query", {"query": "SELECT name FROM sqlite_schema ORDER BY name"}),
        )
        assert '"km"' in results[0]
        assert all(not r.startswith("error") for r in results)
        assert "messages" not in results[2] and "runs" in results[2]
