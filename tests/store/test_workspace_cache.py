"""Machines that share one PostgreSQL database, each with a workspace cache of its own.

Each "machine" is a Store with its own ``workspace_dir``: the SQLite files of the
agents' tables that it keeps. Whatever one machine does to an agent (turns, delete
and re-create, fork into the id, rollback, prune, a restore of the whole database
from a backup), another machine's next read or turn shows the tables the log in the
database holds: its cache catches up or is rebuilt, never serves another commit's
tables, and never applies the log to the wrong base. Where a cache would be wrong
without its stamps (the file at the same version number as the log, holding another
commit's rows), the test says so before reading.
"""

import gc
import json
import os
import stat
from pathlib import Path
from typing import Any

import apsw
import psycopg
import pytest
from helpers import persisted
from postgres_server import PostgresServer
from sql_helpers import Tracker, sql_turn, workspace_file

from effectful_durable import SQLWorkspaceError, Store
from effectful_durable.store.copy import copy_store
from effectful_durable.store.workspace.cache import WorkspaceCache
from effectful_durable.testing import FakeLLM, ToolCall


def insert(km: float) -> ToolCall:
    return ToolCall("sql_insert", {"table": "runs", "values": {"km": km}})


class Machines:
    """Stores on one database, each with its own workspace cache under ``root``."""

    def __init__(self, url: str, root: Path) -> None:
        self.url = url
        self.root = root

    def store(self, machine: str, **options: Any) -> Store:
        return Store(self.url, workspace_dir=self.root / machine, **options)

    def turn(self, machine: str, agent_id: str, *calls: ToolCall) -> list[str]:
        """One turn of a Tracker ``agent_id`` on ``machine``: the model makes ``calls``."""
        return sql_turn(self.store(machine), Tracker(agent_id=agent_id), *calls)

    def km(self, machine: str, agent_id: str, version: int | None = None) -> list[float]:
        """The agent's runs, read on ``machine``."""
        with self.store(machine) as store:
            rows = store.sql(agent_id, "SELECT km FROM runs ORDER BY id", version=version).rows
        return [km for (km,) in rows]

    def file(self, machine: str, agent_id: str) -> str:
        return workspace_file(self.url, agent_id, workspace_dir=self.root / machine)

    def held(self, machine: str, agent_id: str) -> tuple[int, list[float]]:
        """The version the machine's file holds and its runs, read without catching it up."""
        conn = apsw.Connection(self.file(machine, agent_id), flags=apsw.SQLITE_OPEN_READONLY)
        try:
            rows = conn.execute("SELECT km FROM runs ORDER BY id").fetchall()
            return int(conn.pragma("user_version")), [km for (km,) in rows]
        finally:
            conn.close()


@pytest.fixture
def machines(postgres_url: str, tmp_path: Path) -> Machines:
    return Machines(postgres_url, tmp_path / "caches")


class TestMachines:
    """Two machines take turns on one agent: each reads and goes on from the other's."""

    def test_each_catches_up_with_the_other(self, machines: Machines) -> None:
        """Turns alternate between machines; every version reads the same on both."""
        machines.turn("a", "t", insert(1.0))
        machines.turn("a", "t", insert(2.0))
        assert machines.km("b", "t") == [1.0, 2.0]  # b builds its file from the log
        machines.turn("a", "t", insert(3.0))
        machines.turn("b", "t", insert(4.0))  # b's file catches up, then the turn
        machines.turn("a", "t", insert(5.0))  # a's file: behind by b's turn
        assert machines.held("b", "t") == (4, [1.0, 2.0, 3.0, 4.0])
        for version in range(1, 6):
            assert machines.km("a", "t", version) == machines.km("b", "t", version)
        assert machines.km("b", "t") == [1.0, 2.0, 3.0, 4.0, 5.0]
        assert os.path.dirname(machines.file("a", "t")) != os.path.dirname(machines.file("b", "t"))


class TestChangesElsewhere:
    """Another machine changes the agent's history; this machine's file never misleads."""

    def test_delete_and_recreate_with_the_same_id(self, machines: Machines) -> None:
        """A new agent with the same id, at the same version number, is read, not the old."""
        for km in (1.0, 2.0, 3.0):
            machines.turn("a", "t", insert(km))
        with machines.store("b") as store:
            store.delete("t")
        for km in (7.0, 8.0, 9.0):
            machines.turn("b", "t", insert(km))
        assert machines.held("a", "t") == (3, [1.0, 2.0, 3.0])  # same version, other commit
        assert machines.km("a", "t") == [7.0, 8.0, 9.0]
        machines.turn("a", "t", insert(10.0))  # the log goes on from the right base
        assert machines.km("b", "t") == [7.0, 8.0, 9.0, 10.0]

    def test_fork_into_an_id_the_cache_held(self, machines: Machines) -> None:
        """A fork into an id this machine once held reads as the fork's source."""
        machines.turn("a", "x", insert(1.0))
        machines.turn("a", "x", insert(2.0))
        machines.turn("b", "t", insert(5.0))
        machines.turn("b", "t", insert(6.0))
        with machines.store("b") as store:
            store.delete("x")
            store.fork("t", 1, "x")
        machines.turn("b", "x", insert(7.0))  # x at version 2 again
        assert machines.held("a", "x") == (2, [1.0, 2.0])
        assert machines.km("a", "x") == [5.0, 7.0]
        assert machines.km("a", "x", 1) == [5.0]

    def test_rollback(self, machines: Machines) -> None:
        """A rollback made elsewhere is caught up as the version it commits."""
        for km in (1.0, 2.0, 3.0):
            machines.turn("a", "t", insert(km))
        with machines.store("b") as store:
            assert store.rollback("t", 1) == 4
        assert machines.km("a", "t") == [1.0]
        machines.turn("a", "t", insert(4.0))
        assert machines.km("b", "t") == [1.0, 4.0]

    def test_prune_folding_old_steps(self, machines: Machines) -> None:
        """Files behind and ahead of the retention point read the same after a prune."""
        machines.turn("a", "t", insert(1.0))
        machines.turn("a", "t", insert(2.0))  # a's file: version 2, soon pruned
        for km in range(3, 9):
            machines.turn("b", "t", insert(float(km)))
        machines.km("c", "t")  # c's file: version 8
        with machines.store("b") as store:
            store.prune("t", keep_versions=3)  # versions 1..5 folded into a snapshot
        expected = [float(km) for km in range(1, 9)]
        assert machines.km("a", "t") == machines.km("c", "t") == expected
        assert machines.km("a", "t", 6) == expected[:6]
        machines.turn("a", "t", insert(9.0))
        assert machines.km("c", "t") == [*expected, 9.0]

    def test_a_database_restored_from_a_backup(self, machines: Machines, tmp_path: Path) -> None:
        """The database restored to version 2 and committed on from there by another
        machine: this machine's file, at the same version number, is rebuilt."""
        machines.turn("a", "t", insert(1.0))
        machines.turn("a", "t", insert(2.0))
        with machines.store("a") as store:
            store.backup(tmp_path / "backup.db")
        machines.turn("a", "t", insert(3.0))
        machines.turn("a", "t", insert(4.0))
        with psycopg.connect(machines.url, autocommit=True) as conn:
            conn.execute("TRUNCATE agents CASCADE")
        with Store(tmp_path / "backup.db", readonly=True) as backup, Store(machines.url) as db:
            copy_store(backup, db)
        machines.turn("b", "t", insert(7.0))
        machines.turn("b", "t", insert(8.0))
        assert machines.held("a", "t") == (4, [1.0, 2.0, 3.0, 4.0])  # same version, gone
        assert machines.km("a", "t") == [1.0, 2.0, 7.0, 8.0]
        assert machines.km("a", "t", 3) == [1.0, 2.0, 7.0]


class TestStamps:
    """A file's stamps vouch only for what they were written for, or for nothing."""

    def test_records_read_back_and_damaged_ones_vouch_for_nothing(self, tmp_path: Path) -> None:
        """Two records read back; a cut or a flipped byte drops the record it hits."""
        cache = WorkspaceCache(str(tmp_path), stamped=True)
        path = cache.path("t")
        cache.stamp(path, {3: 1700000000.25, 4: 1700000001.5, 0: None})
        assert cache.stamps(path) == {3: 1700000000.25, 4: 1700000001.5}
        data = Path(path + "-stamps").read_bytes()
        Path(path + "-stamps").write_bytes(data[:30])  # the second record cut
        assert cache.stamps(path) == {3: 1700000000.25}
        flipped = bytearray(data)
        flipped[5] ^= 0x01  # in the first record's version
        Path(path + "-stamps").write_bytes(bytes(flipped))
        assert cache.stamps(path) == {4: 1700000001.5}
        cache.stamp(path, {})
        assert cache.stamps(path) == {}

    def test_a_damaged_stamps_file_makes_the_file_rebuilt(self, machines: Machines) -> None:
        """With its stamps garbled, a file that was edited behind our back is not served."""
        machines.turn("a", "t", insert(1.0))
        machines.turn("a", "t", insert(2.0))
        path = machines.file("a", "t")
        conn = apsw.Connection(path)
        conn.execute("UPDATE runs SET km = 99")  # user_version stays 2
        conn.close()
        Path(path + "-stamps").write_bytes(b"\xff" * 40)
        assert machines.km("a", "t") == [1.0, 2.0]
        assert machines.held("a", "t") == (2, [1.0, 2.0])


class TestDatabases:
    """Each database has a directory of its own in a machine's cache."""

    def test_two_databases_with_the_same_agent_ids(
        self, postgres_server: PostgresServer, tmp_path: Path
    ) -> None:
        """Agent t in two databases of one server: one cache directory, two files, no mixing."""
        urls = [postgres_server.new_database() for _ in range(2)]
        try:
            first, second = (Machines(url, tmp_path) for url in urls)
            first.turn("m", "t", insert(1.0))
            second.turn("m", "t", insert(2.0))
            first.turn("m", "t", insert(3.0))
            assert first.km("m", "t") == [1.0, 3.0]
            assert second.km("m", "t") == [2.0]
            assert first.file("m", "t") != second.file("m", "t")
        finally:
            gc.collect()
            for url in urls:
                postgres_server.drop_database(url)

    def test_a_copy_into_a_new_database(
        self, machines: Machines, postgres_server: PostgresServer
    ) -> None:
        """A copy reads the same, and turns on it leave the original's tables alone."""
        machines.turn("m", "t", insert(1.0))
        machines.turn("m", "t", insert(2.0))
        url = postgres_server.new_database()
        try:
            with machines.store("m", readonly=True) as source, Store(url) as target:
                copy_store(source, target)
            copy = Machines(url, machines.root)
            assert copy.km("m", "t") == [1.0, 2.0]
            assert copy.km("m", "t", 1) == [1.0]
            copy.turn("m", "t", insert(3.0))
            assert machines.km("m", "t") == [1.0, 2.0]
            assert copy.km("m", "t") == [1.0, 2.0, 3.0]
        finally:
            gc.collect()
            postgres_server.drop_database(url)


class TestWhereFilesLive:
    def test_the_default_cache_is_private_and_named_after_the_database(
        self, postgres_url: str
    ) -> None:
        """Without workspace_dir, files go under $XDG_CACHE_HOME, in a 0700 directory."""
        sql_turn(postgres_url, Tracker(agent_id="t"), insert(1.0))
        path = Path(workspace_file(postgres_url, "t"))
        root = Path(os.environ["XDG_CACHE_HOME"], "effectful-durable", "workspaces")
        assert path.parent.parent == root
        assert path.parent.name.startswith(postgres_url.rsplit("/", 1)[1] + "-")
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700

    def test_a_role_that_may_not_read_the_servers_identifier(
        self, postgres_url: str, tmp_path: Path
    ) -> None:
        """Without pg_control_system(), the directory is named after the server's address."""
        role = f"plain_{os.getpid()}"
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("REVOKE EXECUTE ON FUNCTION pg_control_system() FROM PUBLIC")
            conn.execute(f"CREATE ROLE {role} LOGIN")
            conn.execute(f"GRANT ALL ON SCHEMA public TO {role}")
        url = postgres_url.replace("postgres@", f"{role}@", 1)
        try:
            sql_turn(url, Tracker(agent_id="t"), insert(1.0))
            with Store(url, readonly=True) as store:
                assert store.sql("t", "SELECT km FROM runs").rows == [(1.0,)]
            with Store(url, readonly=True) as mine, Store(postgres_url, readonly=True) as su:
                assert mine._workspaces.directory != su._workspaces.directory
        finally:
            gc.collect()
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(f"DROP OWNED BY {role}")
                conn.execute(f"DROP ROLE {role}")

    def test_a_directory_that_cannot_be_made_fails_the_turn_clearly(
        self, postgres_url: str, tmp_path: Path
    ) -> None:
        """A workspace_dir under a file fails the turn with an error naming what to do."""
        (tmp_path / "file").write_text("not a directory")
        store = Store(postgres_url, workspace_dir=tmp_path / "file" / "cache")
        with persisted(store, FakeLLM([insert(1.0), "done"])):
            with pytest.raises(SQLWorkspaceError, match="Pass workspace_dir= to Store"):
                Tracker(agent_id="t").ask("go")

    def test_sqlite_refuses_workspace_dir(self, db_path: Path, tmp_path: Path) -> None:
        """An SQLite database keeps its files beside it: workspace_dir is refused."""
        with pytest.raises(ValueError, match="workspace_dir is for PostgreSQL"):
            Store(db_path, workspace_dir=tmp_path)

    def test_a_deleted_cache_is_rebuilt(self, machines: Machines) -> None:
        """The cache may be deleted at any time: the next turn rebuilds it from the log."""
        machines.turn("a", "t", insert(1.0))
        for path in Path(machines.file("a", "t")).parent.iterdir():
            path.unlink()
        results = machines.turn("a", "t", ToolCall("sql_query", {"query": "SELECT km FROM runs"}))
        assert json.loads(results[0])["rows"] == [[1.0]]
