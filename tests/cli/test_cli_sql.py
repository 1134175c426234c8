"""The ``sql`` command: read-only queries on an agent's tables, at any version, no writes."""

import gc
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import is_postgres, persisted_rows
from sql_helpers import Tracker, sql_turn, workspace_files

from effectful_durable.cli import main
from effectful_durable.testing import ToolCall


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def db(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Agent 't' with one run at version 1 and two at version 2 (in a file, then on a server)."""
    if request.param == "sqlite":
        path = str(tmp_path_factory.mktemp("sqlcli") / "state.db")
    else:
        path = request.getfixturevalue("postgres_server").new_database()
    bot = Tracker(agent_id="t")
    run = ToolCall("sql_insert", {"table": "runs", "values": {"km": 5.0, "day": "mon"}})
    sql_turn(path, bot, run)
    blob = ToolCall(
        "sql_execute", {"statement": "INSERT INTO runs (km, day) VALUES (12.5, x'00ff')"}
    )
    sql_turn(path, bot, blob)
    yield path
    if is_postgres(path):
        gc.collect()
        request.getfixturevalue("postgres_server").drop_database(path)


def _digest(db: str) -> list[str]:
    """Hashes of the database (a file's bytes, or a server's rows) and the workspace files."""
    files = workspace_files(db)
    if is_postgres(db):
        tables = ("agents", "versions", "workspace_log", "handoffs")
        main = [repr(persisted_rows(db, f"SELECT * FROM {t} ORDER BY 1, 2")) for t in tables]
    else:
        main = [Path(db).read_bytes().hex()]
    contents = [*main, *(Path(f).read_bytes().hex() for f in files)]
    return [hashlib.sha256(c.encode()).hexdigest() for c in contents]


class TestSQLCommand:
    """``effectful-durable sql DB AGENT QUERY [PARAM ...] [--version N] [--json]``."""

    def test_table(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """Rows print as an aligned table with a header; params fill placeholders."""
        assert main(["sql", db, "t", "SELECT day, km FROM runs WHERE km > ?", "1"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split() == ["day", "km"]
        assert lines[1].split() == ["mon", "5.0"]
        assert "blob_hex=00ff" in lines[2]

    def test_json_and_version(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """--json prints columns and rows; --version reads an earlier version."""
        assert main(["sql", db, "t", "SELECT count(*) AS n FROM runs", "--json"]) == 0
        assert json.loads(capsys.readouterr().out) == {"columns": ["n"], "rows": [[2]]}
        assert main(["sql", db, "t", "SELECT count(*) FROM runs", "--version", "1", "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["rows"] == [[1]]

    def test_refusals_are_errors(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """A write, another table and an unknown agent exit 1 with one line on stderr."""
        for argv in (
            ["sql", db, "t", "DELETE FROM runs"],
            ["sql", db, "t", "SELECT * FROM messages"],
            ["sql", db, "nobody", "SELECT 1"],
            ["sql", db, "t", "SELECT 1", "--version", "9"],
        ):
            assert main(argv) == 1
            err = capsys.readouterr().err
            assert err.startswith("effectful-durable: error: ") and err.count("\n") == 1

    def test_reads_change_nothing(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """The database and the workspace files are byte-identical after reads."""
        before = _digest(db)
        main(["sql", db, "t", "SELECT * FROM runs"])
        main(["sql", db, "t", "SELECT * FROM runs", "--version", "1"])
        capsys.readouterr()
        assert _digest(db) == before
