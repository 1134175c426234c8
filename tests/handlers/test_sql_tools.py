"""SQLTools under PersistenceHandler: tools, atomic turns, versions, declarations, catch-up."""

import dataclasses
import glob
import json
import os
import shutil
import threading
from pathlib import Path

import pytest
from helpers import integrity, persisted, persisted_rows
from sql_helpers import (
    Builder,
    Small,
    Tracker,
    dump,
    sql_turn,
    workspace_file,
    workspace_files,
)

from effectful_durable import (
    DurableError,
    NotFoundError,
    PersistentAgent,
    SQLTools,
    SQLWorkspaceError,
    Store,
)
from effectful_durable.testing import FakeLLM, ToolCall


def insert(km: float, day: str = "mon") -> ToolCall:
    return ToolCall("sql_insert", {"table": "runs", "values": {"km": km, "day": day}})


def execute(statement: str, *params: object) -> ToolCall:
    return ToolCall("sql_execute", {"statement": statement, "params": list(params)})


def query(text: str, *params: object) -> ToolCall:
    return ToolCall("sql_query", {"query": text, "params": list(params)})


def rows(db: Path | str, agent_id: str, sql: str, version: int | None = None) -> list[tuple]:
    with Store(db) as store:
        return store.sql(agent_id, sql, version=version).rows


class TestTools:
    """The three tools read and write the agent's tables and answer in JSON."""

    def test_insert_query_execute(self, store_url: str) -> None:
        """sql_insert, sql_execute and sql_query work on the declared tables."""
        results = sql_turn(
            store_url,
            Tracker(agent_id="t"),
            insert(5.0),
            execute("INSERT INTO runs (km, day) VALUES (?, ?)", 10.5, "tue"),
            execute("UPDATE runs SET km = km + 1 WHERE day = ?", "mon"),
            query("SELECT day, km FROM runs WHERE km > ? ORDER BY km", 1),
            execute("DELETE FROM runs WHERE day = 'nope' RETURNING id"),
        )
        assert json.loads(results[0]) == {"changes": 1}
        assert json.loads(results[2]) == {"changes": 1}
        assert json.loads(results[3]) == {
            "columns": ["day", "km"],
            "rows": [["mon", 6.0], ["tue", 10.5]],
        }
        assert json.loads(results[4]) == {"changes": 0}
        assert rows(store_url, "t", "SELECT km, day FROM runs ORDER BY id") == [
            (6.0, "mon"),
            (10.5, "tue"),
        ]

    def test_results_are_cut_and_the_model_told(self, store_url: str) -> None:
        """A result over max_rows or max_result_bytes is cut, with a note saying so."""
        bot = Small(agent_id="s")
        results = sql_turn(
            store_url,
            bot,
            *[ToolCall("sql_insert", {"table": "t", "values": {"v": "x" * 60}}) for _ in range(5)],
            query("SELECT id FROM t"),
            query("SELECT v FROM t"),
            query("SELECT '" + "y" * 100 + "'"),
        )
        by_rows, by_bytes, too_long = (json.loads(r) if r[0] == "{" else r for r in results[5:])
        assert by_rows["rows"] == [[1], [2], [3]]
        assert "cut at 3 rows" in by_rows["note"]
        assert len(by_bytes["rows"]) == 2 and "size limit" in by_bytes["note"]
        assert too_long.startswith("error: the statement is 109 characters long; the limit is 100")

    def test_blobs_and_nulls(self, store_url: str) -> None:
        """Blobs come back as hex with their size; NULL as null."""
        results = sql_turn(
            store_url, Tracker(agent_id="t"), query("SELECT x'00ff', NULL, 1.5, 'a'")
        )
        assert json.loads(results[0])["rows"] == [
            [{"blob_hex": "00ff", "bytes": 2}, None, 1.5, "a"]
        ]

    def test_bad_input_is_an_error_the_model_reads(self, store_url: str) -> None:
        """Unknown tables, columns, params and SQL errors are tool errors; the turn goes on."""
        bot = Tracker(agent_id="t")
        results = sql_turn(
            store_url,
            bot,
            ToolCall("sql_insert", {"table": "nope", "values": {"a": 1}}),
            ToolCall("sql_insert", {"table": "runs", "values": {"speed": 1}}),
            ToolCall("sql_insert", {"table": "runs", "values": {}}),
            ToolCall("sql_insert", {"table": "runs", "values": {"km": None}}),
            query("SELEC 1"),
            query("SELECT ?", {"a": 1}),
            insert(3.0),
        )
        assert "there is no table 'nope'; the tables are: notes, runs" in results[0]
        assert "no column(s) 'speed'" in results[1]
        assert "at least one" in results[2]
        assert "NOT NULL constraint failed: runs.km" in results[3]
        assert "syntax error" in results[4]
        assert "params may hold only" in results[5]
        assert all(r.startswith("error: ") for r in results[:6])
        assert results[6] == '{"changes": 1}'
        assert rows(store_url, "t", "SELECT km FROM runs") == [(3.0,)]

    def test_without_persistence_handler(self) -> None:
        """Without PersistenceHandler the tool raises a DurableError naming the fix."""
        from effectful_durable.agents.sql_tools import workspace_query

        with pytest.raises(DurableError, match="install PersistenceHandler"):
            workspace_query(Tracker(agent_id="t"), "SELECT 1", [])


class TestAtomicTurns:
    """A turn's SQL writes commit with it, a failing statement undoes only itself."""

    def test_failing_statement_rolls_back_only_itself(self, store_url: str) -> None:
        """After a failing or interrupted statement, the turn's other writes still commit."""
        results = sql_turn(
            store_url,
            Tracker(agent_id="t"),
            insert(1.0),
            execute("INSERT INTO runs (id, km) VALUES (1, 2.0)"),
            execute(
                "INSERT INTO notes (body) WITH RECURSIVE c(x) AS "
                "(SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT 'spam' FROM c"
            ),
            insert(3.0),
            execute("CREATE TABLE x (id INTEGER PRIMARY KEY)"),
            insert(4.0),
        )
        assert "UNIQUE constraint failed" in results[1]
        assert "stopped after" in results[2]
        assert rows(store_url, "t", "SELECT km FROM runs ORDER BY id") == [(1.0,), (3.0,), (4.0,)]
        assert rows(store_url, "t", "SELECT count(*) FROM notes") == [(0,)]

    def test_failed_turn_leaves_tables_unchanged(self, store_url: str) -> None:
        """A turn that raises after writing leaves the file, the log and the version as before."""
        bot = Tracker(agent_id="t")
        sql_turn(store_url, bot, insert(1.0))
        before = [dump(path) for path in workspace_files(store_url)]
        log = persisted_rows(store_url, "SELECT * FROM workspace_log")
        llm = FakeLLM([insert(2.0), execute("DELETE FROM runs"), RuntimeError("model down")])
        with persisted(store_url, llm), pytest.raises(RuntimeError):
            bot.ask("go")
        assert [dump(path) for path in workspace_files(store_url)] == before
        assert persisted_rows(store_url, "SELECT * FROM workspace_log") == log
        assert rows(store_url, "t", "SELECT km FROM runs") == [(1.0,)]
        # the agent goes on from its last commit
        sql_turn(store_url, bot, insert(5.0))
        assert rows(store_url, "t", "SELECT km FROM runs ORDER BY km") == [(1.0,), (5.0,)]

    def test_reads_see_the_turns_own_writes(self, store_url: str) -> None:
        """Within a turn, sql_query sees the rows the turn wrote before they commit."""
        results = sql_turn(
            store_url, Tracker(agent_id="t"), insert(7.0), query("SELECT km FROM runs")
        )
        assert json.loads(results[1])["rows"] == [[7.0]]


class TestSystemNotes:
    """The model is told its tables and columns, outside its history."""

    def test_tables_listed(self, store_url: str) -> None:
        """Every request of the turn lists the tables; none of it enters the history."""
        llm = FakeLLM([execute("CREATE TABLE mood (id INTEGER PRIMARY KEY, level INT)"), "ok"])
        bot = Builder(agent_id="b")
        with persisted(store_url, llm):
            bot.ask("go")
        first, second = (call.messages[0]["content"][-1]["text"] for call in llm.calls)
        assert "notes(id INTEGER PRIMARY KEY, body TEXT)" in first
        assert "You may also CREATE" in first
        assert "mood(id INTEGER PRIMARY KEY, level INT)" in second
        assert "mood" not in first
        history = json.dumps(list(bot.__history__.values()))
        assert "Your SQL tables" not in history

    def test_no_ddl_sentence_without_the_opt_in(self, store_url: str) -> None:
        """Agents without __sql_create_tables__ are not told they may create tables."""
        llm = FakeLLM(["ok"])
        with persisted(store_url, llm):
            Tracker(agent_id="t").ask("go")
        note = llm.calls[0].messages[0]["content"][-1]["text"]
        assert "runs(id INTEGER PRIMARY KEY, km REAL, day TEXT)" in note
        assert "CREATE" not in note


class TestDeclaration:
    """__sql_schema__ is checked at class definition and migrated forward at the next turn."""

    def test_invalid_declarations(self) -> None:
        """Bad SQL, a table without a primary key, and views are refused at class creation."""
        for schema, match in [
            ("CREATE TABLE (", "not a valid declaration"),
            ("CREATE TABLE t (a, b)", "has no PRIMARY KEY"),
            ("CREATE TABLE t (id INTEGER PRIMARY KEY); CREATE VIEW v AS SELECT 1", "not a valid"),
            ("CREATE TABLE t (id INTEGER PRIMARY KEY); DELETE FROM t", "not a valid"),
        ]:
            with pytest.raises(SQLWorkspaceError, match=match):

                class Bad(PersistentAgent, SQLTools):
                    __sql_schema__ = schema

    def test_declaration_grows(self, store_url: str) -> None:
        """New tables, columns and indexes are created at the next turn; data is kept."""
        sql_turn(store_url, Tracker(agent_id="t"), insert(1.0))

        @dataclasses.dataclass
        class Tracker2(Tracker):
            __sql_schema__ = """
                CREATE TABLE runs (id INTEGER PRIMARY KEY, km REAL NOT NULL, day TEXT,
                                   mood TEXT NOT NULL DEFAULT 'ok', pace REAL);
                CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT);
                CREATE TABLE shoes (id INTEGER PRIMARY KEY, name TEXT UNIQUE);
                CREATE INDEX runs_day ON runs (day);
            """

        results = sql_turn(
            store_url,
            Tracker2(agent_id="t"),
            query("SELECT km, mood, pace FROM runs"),
            ToolCall("sql_insert", {"table": "shoes", "values": {"name": "fast"}}),
        )
        assert json.loads(results[0])["rows"] == [[1.0, "ok", None]]
        assert rows(store_url, "t", "SELECT name FROM shoes") == [("fast",)]
        assert rows(store_url, "t", "SELECT name FROM sqlite_schema WHERE type = 'index'") == [
            ("runs_day",)
        ] or ("runs_day",) in rows(store_url, "t", "SELECT name FROM sqlite_schema")
        # the schema change is part of the version: reading version 1 shows the old tables
        assert rows(store_url, "t", "SELECT name FROM sqlite_schema WHERE name = 'shoes'", 1) == []

    def test_changed_column_is_refused(self, store_url: str) -> None:
        """A declaration that changes an existing column fails the turn with a clear error."""
        sql_turn(store_url, Tracker(agent_id="t"), insert(1.0))

        @dataclasses.dataclass
        class Changed(Tracker):
            __sql_schema__ = "CREATE TABLE runs (id INTEGER PRIMARY KEY, km TEXT, day TEXT)"

        with pytest.raises(SQLWorkspaceError, match=r"changes column runs.km \(REAL -> TEXT\)"):
            sql_turn(store_url, Changed(agent_id="t"))
        assert rows(store_url, "t", "SELECT km FROM runs") == [(1.0,)]


class TestVersions:
    """Store.sql reads any version; rollback, fork, prune and delete carry the tables."""

    def _three_versions(self, db: str) -> Tracker:
        bot = Tracker(agent_id="t")
        sql_turn(db, bot, insert(1.0), insert(2.0))
        sql_turn(db, bot, execute("UPDATE runs SET km = km * 10"), insert(3.0))
        sql_turn(db, bot, execute("DELETE FROM runs WHERE km > 15"))
        return bot

    def test_read_every_version(self, store_url: str) -> None:
        """Store.sql(version=v) shows the tables exactly as version v left them."""
        self._three_versions(store_url)
        sql = "SELECT id, km FROM runs ORDER BY id"
        assert rows(store_url, "t", sql, 1) == [(1, 1.0), (2, 2.0)]
        assert rows(store_url, "t", sql, 2) == [(1, 10.0), (2, 20.0), (3, 3.0)]
        assert rows(store_url, "t", sql, 3) == [(1, 10.0), (3, 3.0)]
        assert rows(store_url, "t", sql) == [(1, 10.0), (3, 3.0)]
        with Store(store_url) as store, pytest.raises(NotFoundError):
            store.sql("t", sql, version=9)

    def test_readonly_store_writes_nothing(self, store_url: str) -> None:
        """A read-only Store reads any version without touching the workspace file."""
        self._three_versions(store_url)
        path = workspace_file(store_url, "t")
        os.remove(path)  # even when the file is missing
        with Store(store_url, readonly=True) as store:
            assert store.sql("t", "SELECT count(*) FROM runs").rows == [(2,)]
            assert store.sql("t", "SELECT count(*) FROM runs", version=2).rows == [(3,)]
        assert not os.path.exists(path)

    def test_rollback(self, store_url: str) -> None:
        """rollback(v) commits a version whose tables equal version v's, and the agent goes on."""
        bot = self._three_versions(store_url)
        with Store(store_url) as store:
            assert store.rollback("t", 1) == 4
        assert rows(store_url, "t", "SELECT id, km FROM runs ORDER BY id") == [(1, 1.0), (2, 2.0)]
        log = persisted_rows(store_url, "SELECT ddl IS NULL FROM workspace_log WHERE version = 4")
        assert log == [(1,)]  # one inverse changeset, no snapshot
        sql_turn(store_url, bot, insert(9.0))
        assert rows(store_url, "t", "SELECT km FROM runs ORDER BY id") == [(1.0,), (2.0,), (9.0,)]

    def test_rollback_across_schema_changes(self, store_url: str) -> None:
        """Rolling back past a CREATE, ALTER or DROP restores the schema and rows of v."""
        bot = Builder(agent_id="b")
        sql_turn(
            store_url, bot, ToolCall("sql_insert", {"table": "notes", "values": {"body": "a"}})
        )
        sql_turn(
            store_url,
            bot,
            execute("CREATE TABLE tags (id INTEGER PRIMARY KEY, tag TEXT)"),
            execute("INSERT INTO tags (tag) VALUES ('x')"),
        )
        sql_turn(
            store_url,
            bot,
            execute("ALTER TABLE tags ADD COLUMN n INT"),
            execute("UPDATE tags SET n = 3"),
        )
        sql_turn(store_url, bot, execute("DROP TABLE tags"))
        with Store(store_url) as store:
            assert store.sql("b", "SELECT * FROM tags", version=3).rows == [(1, "x", 3)]
            assert store.sql("b", "SELECT * FROM tags", version=2).rows == [(1, "x")]
            store.rollback("b", 3)
            assert store.sql("b", "SELECT * FROM tags").rows == [(1, "x", 3)]
            store.rollback("b", 1)
            assert store.sql("b", "SELECT name FROM sqlite_schema").rows == [("notes",)]
            store.rollback("b", 2)
            assert store.sql("b", "SELECT * FROM tags").rows == [(1, "x")]
            assert store.sql("b", "SELECT body FROM notes").rows == [("a",)]
        results = sql_turn(store_url, bot, query("SELECT tag FROM tags"))
        assert json.loads(results[0])["rows"] == [["x"]]

    def test_fork(self, store_url: str) -> None:
        """fork gives the new agent the tables as of v, in a file of its own."""
        self._three_versions(store_url)
        with Store(store_url) as store:
            store.fork("t", 2, "copy")
            assert store.sql("copy", "SELECT km FROM runs ORDER BY id").rows == [
                (10.0,),
                (20.0,),
                (3.0,),
            ]
        sql_turn(store_url, Tracker(agent_id="copy"), execute("DELETE FROM runs"))
        assert rows(store_url, "copy", "SELECT count(*) FROM runs") == [(0,)]
        assert rows(store_url, "t", "SELECT count(*) FROM runs") == [(2,)]

    def test_prune_keeps_later_versions_exact(self, store_url: str) -> None:
        """After Store.prune, every kept version reads back and rolls back the same."""
        bot = Tracker(agent_id="t")
        for turn in range(1, 9):
            sql_turn(
                store_url,
                bot,
                insert(float(turn)),
                execute("DELETE FROM runs WHERE km < ?", turn - 2),
            )
        sql = "SELECT id, km FROM runs ORDER BY id"
        expected = {v: rows(store_url, "t", sql, v) for v in range(1, 9)}
        with Store(store_url) as store:
            store.prune("t", keep_versions=3)
            # the steps of versions 1..5 were folded into one snapshot at version 5
            assert persisted_rows(
                store_url, "SELECT DISTINCT version FROM workspace_log ORDER BY 1"
            ) == [
                (5,),
                (6,),
                (7,),
                (8,),
            ]
            for version in (6, 7, 8):
                assert store.sql("t", sql, version=version).rows == expected[version]
            with pytest.raises(NotFoundError):
                store.sql("t", sql, version=4)
            store.rollback("t", 6)
            assert store.sql("t", sql).rows == expected[6]
        os.remove(workspace_file(store_url, "t"))  # rebuilt from the snapshot and later steps
        assert rows(store_url, "t", sql) == expected[6]

    def test_prune_folds_only_when_it_pays(self, store_url: str) -> None:
        """A snapshot is rewritten only once the steps it replaces outweigh it."""
        from effectful_durable.store.workspace.part import WorkspacePart

        bot = Tracker(agent_id="t")
        big = "x" * 2000
        sql_turn(store_url, bot, *[insert(float(k), big) for k in range(5)])
        sql_turn(store_url, bot, insert(9.0))
        with Store(store_url) as store, store.engine.writing() as conn:
            [part] = [p for p in store._parts if isinstance(p, WorkspacePart)]
            part.prune(conn, "t", 3)  # version 2's step is small: no fold
        versions = persisted_rows(
            store_url, "SELECT DISTINCT version FROM workspace_log ORDER BY 1"
        )
        assert versions == [(1,), (2,)]

    def test_delete_removes_the_file(self, store_url: str) -> None:
        """Store.delete removes the workspace file and the log; a new agent starts empty."""
        self._three_versions(store_url)
        path = workspace_file(store_url, "t")
        assert os.path.exists(path)
        with Store(store_url) as store:
            store.delete("t")
        assert not os.path.exists(path)
        assert persisted_rows(store_url, "SELECT count(*) FROM workspace_log") == [(0,)]
        results = sql_turn(store_url, Tracker(agent_id="t"), query("SELECT count(*) FROM runs"))
        assert json.loads(results[0])["rows"] == [[0]]


class TestCatchUp:
    """The workspace file is a view of the log: behind, missing or ahead, it is rebuilt."""

    def test_behind_file_catches_up(self, store_url: str, tmp_path: Path) -> None:
        """A file one version behind (a crash between the commits) is caught up by the next use."""
        bot = Tracker(agent_id="t")
        sql_turn(store_url, bot, insert(1.0))
        path = workspace_file(store_url, "t")
        saved = tmp_path / "saved.sqlite"
        _copy(path, saved)
        sql_turn(store_url, bot, insert(2.0), execute("UPDATE runs SET day = 'x'"))
        _copy(saved, Path(path))  # the file as if the second workspace commit never happened
        assert dump(path)[0][1] == 1
        assert rows(store_url, "t", "SELECT km, day FROM runs ORDER BY id") == [
            (1.0, "x"),
            (2.0, "x"),
        ]
        assert dump(path)[0][1] == 2
        _copy(saved, Path(path))
        results = sql_turn(store_url, bot, query("SELECT count(*) FROM runs"))
        assert json.loads(results[0])["rows"] == [[2]]
        assert integrity(Path(path)) == "ok"

    def test_missing_ahead_and_foreign_files(self, store_url: str) -> None:
        """A deleted, a diverged and an ahead file are all rebuilt from the log."""
        bot = Tracker(agent_id="t")
        sql_turn(store_url, bot, insert(1.0))
        sql_turn(store_url, bot, insert(2.0))
        path = workspace_file(store_url, "t")
        want = [(1.0,), (2.0,)]
        os.remove(path)
        assert rows(store_url, "t", "SELECT km FROM runs ORDER BY id") == want
        assert not os.path.exists(path)  # a read computes it in memory, creates nothing
        sql_turn(store_url, bot)  # version 3: the turn rebuilds the file from the log
        assert dump(path)[0][1] == 3
        # diverged: a row the log does not know about makes the replay conflict
        import apsw

        conn = apsw.Connection(path)
        conn.execute("UPDATE runs SET km = 99.0 WHERE id = 2")
        conn.pragma("user_version", 1)
        conn.close()
        assert rows(store_url, "t", "SELECT km FROM runs ORDER BY id") == want
        conn = apsw.Connection(path)
        conn.pragma("user_version", 50)
        conn.close()
        assert rows(store_url, "t", "SELECT km FROM runs ORDER BY id") == want

    def test_not_a_workspace_file(self, store_url: str) -> None:
        """Another file in the workspace's place is moved aside, not overwritten, and rebuilt."""
        sql_turn(store_url, Tracker(agent_id="t"), insert(1.0))
        path = workspace_file(store_url, "t")
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.remove(path + suffix)
        import apsw

        foreign = apsw.Connection(path)
        foreign.execute("CREATE TABLE theirs (a)")
        foreign.close()
        with Store(store_url) as store:
            assert store.sql("t", "SELECT km FROM runs").rows == [(1.0,)]
        [aside] = [p for p in glob.glob(path + ".damaged-*") if not p.endswith("-stamps")]
        assert dump(aside)[1][1] == "theirs"
        with Store(store_url, readonly=True) as store:  # a reader never moves a file
            assert store.sql("t", "SELECT km FROM runs").rows == [(1.0,)]


class TestThreads:
    """Agents in parallel threads write their own tables; nothing is lost or mixed."""

    def test_parallel_agents(self, store_url: str) -> None:
        """Four threads, one agent each, eight SQL turns each: every row is there."""
        from effectful.handlers.llm.completions import LiteLLMProvider
        from effectful.ops.semantics import handler

        from effectful_durable import PersistenceHandler
        from effectful_durable.testing import FakeCall

        persistence = PersistenceHandler(store_url, wait=10.0)
        errors: list[BaseException] = []

        def respond(call: FakeCall) -> object:
            if call.messages[-1]["role"] == "tool":
                return "ok"
            turn = int(call.last_user_text.rsplit(" ", 1)[1])
            return [
                insert(float(turn)),
                execute("UPDATE notes SET body = ? WHERE id = 1", str(turn)),
                execute("INSERT OR IGNORE INTO notes (id, body) VALUES (1, '0')"),
            ]

        def work(number: int) -> None:
            try:
                bot = Tracker(agent_id=f"agent-{number}")
                with handler(LiteLLMProvider(model="fake")), handler(FakeLLM(respond=respond)):
                    with handler(persistence):
                        for turn in range(1, 9):
                            bot.ask(f"turn {turn}")
            except BaseException as error:  # reported below
                errors.append(error)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        persistence.close()
        assert errors == []
        with Store(store_url) as store:
            for number in range(4):
                agent_id = f"agent-{number}"
                assert store.sql(agent_id, "SELECT km FROM runs ORDER BY id").rows == [
                    (float(k),) for k in range(1, 9)
                ]
                assert store.sql(agent_id, "SELECT body FROM notes").rows == [("8",)]
                assert store.versions(agent_id)[-1].version == 8
        assert integrity(store_url) == "ok"


def _copy(source: str | Path, target: Path) -> None:
    for suffix in ("-wal", "-shm"):
        if os.path.exists(str(target) + suffix):
            os.remove(str(target) + suffix)
    import apsw

    src = apsw.Connection(str(source))
    src.pragma("wal_checkpoint", "TRUNCATE")
    src.close()
    shutil.copyfile(source, target)
