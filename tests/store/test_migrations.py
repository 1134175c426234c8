"""Opening files: schema creation, migrations, and refusing files that are not ours."""

import re
from pathlib import Path

import apsw
import pytest
from helpers import begin_turn, writable_connection

from effectful_durable import DurableError, NotOurDatabaseError, SchemaTooNewError, Store
from effectful_durable.store.engine.seam import APPLICATION_ID
from effectful_durable.store.engine.sqlite import row_checks
from effectful_durable.store.engine.sqlite.migrations import (
    MIGRATIONS,
    SCHEMA_VERSION,
    schema_sql,
)


def schema_of(conn: apsw.Connection) -> list[tuple[str, str, str]]:
    return conn.execute("SELECT type, name, sql FROM sqlite_schema ORDER BY type, name").fetchall()


def normalised(rows: list[tuple[str, str, str]]) -> list[tuple[str, str, str]]:
    # A table rebuilt by a migration (ALTER TABLE ... RENAME TO) is stored as
    # CREATE TABLE "name": the same table as schema.sql's CREATE TABLE name. A
    # column added by ALTER TABLE ... ADD COLUMN is spaced as SQLite writes it.
    def text(name: str, sql: str | None) -> str:
        words = " ".join((sql or "").replace(f'TABLE "{name}"', f"TABLE {name}").split())
        return re.sub(r" ?([,)]) ?", r"\1 ", words).strip()

    return [(kind, name, text(name, sql)) for kind, name, sql in rows]


class TestSchema:
    def test_fresh_database_matches_migrated_one(self, tmp_path: Path) -> None:
        """schema.sql and the chain of MIGRATIONS produce the same tables and indexes."""
        fresh = apsw.Connection(str(tmp_path / "fresh.db"))
        fresh.execute(schema_sql())
        migrated = apsw.Connection(str(tmp_path / "migrated.db"))
        row_checks.register(migrated)  # schema 4 fills the rows' checksums
        for step in MIGRATIONS:
            migrated.execute(step)
        assert normalised(schema_of(fresh)) == normalised(schema_of(migrated))
        assert len(MIGRATIONS) == SCHEMA_VERSION

    def test_new_file_is_marked_as_ours(self, db_path: Path) -> None:
        """A new database carries our application_id and the current schema version."""
        Store(db_path).close()
        conn = apsw.Connection(str(db_path))
        assert conn.pragma("application_id") == APPLICATION_ID
        assert conn.pragma("user_version") == SCHEMA_VERSION
        assert conn.pragma("journal_mode") == "wal"

    def test_empty_file_becomes_a_database(self, db_path: Path) -> None:
        """A zero-byte file holds nothing to lose and is initialised."""
        db_path.touch()
        with Store(db_path) as store:
            assert store.agents() == []

    def test_reopening_keeps_data(self, db_path: Path) -> None:
        """Opening an existing database again neither migrates nor loses anything."""
        with Store(db_path) as store:
            begin_turn(store, "a", template="t", arguments={})
        with Store(db_path) as store:
            assert [h.agent_id for h in store.handoffs()] == ["a"]


class TestRefusedFiles:
    def test_garbage_file_is_refused_and_untouched(self, db_path: Path) -> None:
        """A file that is not SQLite raises NotOurDatabaseError and keeps its bytes."""
        garbage = b"this is not a database\n" * 400
        db_path.write_bytes(garbage)
        with pytest.raises(NotOurDatabaseError, match="not an SQLite database") as info:
            Store(db_path)
        assert info.value.path == str(db_path)
        assert db_path.read_bytes() == garbage
        assert sorted(p.name for p in db_path.parent.iterdir()) == ["state.db"]

    def test_other_programs_database_is_refused_and_untouched(self, db_path: Path) -> None:
        """Another program's SQLite file is refused before any pragma changes it."""
        conn = apsw.Connection(str(db_path))
        conn.execute("CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance REAL)")
        conn.execute("INSERT INTO accounts VALUES (1, 10.5)")
        conn.close()
        before = db_path.read_bytes()
        with pytest.raises(NotOurDatabaseError, match="another program"):
            Store(db_path)
        assert db_path.read_bytes() == before
        check = apsw.Connection(str(db_path))
        assert check.pragma("journal_mode") == "delete"

    def test_foreign_application_id_is_refused(self, db_path: Path) -> None:
        """A database marked with another application_id is refused, naming the id."""
        conn = apsw.Connection(str(db_path))
        conn.pragma("application_id", 0x1234)
        conn.close()
        with pytest.raises(NotOurDatabaseError, match="0x1234"):
            Store(db_path)

    def test_newer_schema_is_refused_and_untouched(self, db_path: Path) -> None:
        """A file from a newer version raises SchemaTooNewError with both versions."""
        Store(db_path).close()
        conn = writable_connection(db_path)
        conn.pragma("user_version", SCHEMA_VERSION + 3)
        conn.pragma("wal_checkpoint(TRUNCATE)")
        conn.close()
        before = db_path.read_bytes()
        with pytest.raises(SchemaTooNewError) as info:
            Store(db_path)
        assert (info.value.found, info.value.supported) == (SCHEMA_VERSION + 3, SCHEMA_VERSION)
        assert "Upgrade" in str(info.value)
        assert db_path.read_bytes() == before

    def test_directory_is_refused(self, tmp_path: Path) -> None:
        """A directory path gets a clear error instead of an SQLite code."""
        with pytest.raises(DurableError, match="it is a directory"):
            Store(tmp_path)

    @pytest.mark.parametrize("durability", ["fast", "", None], ids=["fast", "empty", "none"])
    def test_unknown_durability_is_refused(self, db_path: Path, durability: object) -> None:
        """durability accepts only 'normal' and 'full'."""
        with pytest.raises(ValueError, match="durability must be"):
            Store(db_path, durability=durability)  # type: ignore[arg-type]
        assert not db_path.exists()


@pytest.mark.parametrize("durability", ["normal", "full"], ids=["normal", "full"])
def test_durability_sets_synchronous(db_path: Path, durability: str) -> None:
    """'normal' runs with synchronous=NORMAL and 'full' with synchronous=FULL."""
    with Store(db_path, durability=durability) as store:  # type: ignore[arg-type]
        level = store.engine.connection().pragma("synchronous")
    assert level == {"normal": 1, "full": 2}[durability]


def test_unfinished_write_gets_a_clear_readonly_error(tmp_path: Path) -> None:
    """A hot journal left by a killed writer is explained on a read-only open, and a
    read-write open rolls it back."""
    import shutil

    original, crashed = tmp_path / "a.db", tmp_path / "crashed.db"
    Store(original).close()
    conn = writable_connection(original)
    conn.pragma("journal_mode", "delete")
    conn.pragma("cache_size", 1)  # spill pages to the file mid-transaction
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("CREATE TABLE junk (x)")
    conn.executemany("INSERT INTO junk VALUES (?)", [("x" * 500,)] * 2000)
    for suffix in ("", "-journal"):  # the files as a SIGKILL would leave them
        shutil.copy(f"{original}{suffix}", f"{crashed}{suffix}")
    conn.execute("ROLLBACK")
    with pytest.raises(DurableError, match="unfinished write"):
        Store(crashed, readonly=True)
    Store(crashed).close()
    with Store(crashed, readonly=True) as store:
        assert store.agents() == []
