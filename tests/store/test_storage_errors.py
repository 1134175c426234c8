"""I/O failures reach the developer as StorageError and DiskFullError, naming the file."""

import errno
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import apsw
import pytest
from faultvfs import (
    READ_EIO,
    SHORT_WRITE,
    SYNC_EIO,
    SYNC_ENOSPC,
    WRITE_EIO,
    WRITE_ENOSPC,
    FaultVFS,
)
from helpers import commit_message, integrity, persisted_rows
from paths import ROOT

from effectful_durable import DiskFullError, DurableError, StorageError, Store
from effectful_durable.store.engine.sqlite.translate import TRANSLATIONS, translate, translated


@pytest.fixture
def vfs() -> Iterator[FaultVFS]:
    with FaultVFS() as installed:
        yield installed


class TestErrors:
    """Each fault becomes our error: the facts as attributes, a message saying what to do."""

    def test_disk_full_on_write(self, db_path: Path, vfs: FaultVFS) -> None:
        """ENOSPC on a write is DiskFullError: the file, 'full', what to do; nothing committed."""
        with Store(db_path) as store:
            commit_message(store)
            vfs.fail(WRITE_ENOSPC, nth=1)
            with pytest.raises(DiskFullError) as info:
                commit_message(store)
            vfs.clear()
            error = info.value
            assert isinstance(error, StorageError) and isinstance(error, DurableError)
            assert (error.path, error.errno, error.code) == (
                str(db_path),
                errno.ENOSPC,
                "SQLITE_FULL",
            )
            assert str(error).startswith(f"cannot write {db_path}: the disk is full")
            assert "did not commit; every earlier commit is intact. Free space on that disk" in (
                str(error)
            )
            assert isinstance(error.__cause__, apsw.FullError)
            assert commit_message(store) == 2
        assert persisted_rows(db_path, "SELECT count(*) FROM versions") == [(2,)]
        assert integrity(db_path) == "ok"

    def test_short_write_is_a_full_disk(self, db_path: Path, vfs: FaultVFS) -> None:
        """A write cut short (half the bytes land) is the full disk the unix VFS reports."""
        with Store(db_path) as store:
            commit_message(store)
            vfs.fail(SHORT_WRITE, nth=2)
            with pytest.raises(DiskFullError):
                commit_message(store)
            vfs.clear()
            assert commit_message(store) == 2
        assert integrity(db_path) == "ok"

    def test_eio_on_write_names_the_os_error(self, db_path: Path, vfs: FaultVFS) -> None:
        """EIO on a write is StorageError with errno EIO from SQLite's system_errno."""
        with Store(db_path) as store:
            commit_message(store)
            vfs.fail(WRITE_EIO, nth=1)
            with pytest.raises(StorageError) as info:
                commit_message(store)
        error = info.value
        assert not isinstance(error, DiskFullError)
        assert (error.operation, error.errno, error.code) == (
            "write",
            errno.EIO,
            "SQLITE_IOERR_WRITE",
        )
        assert f"cannot write {db_path}: Input/output error (EIO; SQLite SQLITE_IOERR_WRITE)" in (
            str(error)
        )
        assert "every earlier commit is intact" in str(error)

    @pytest.mark.parametrize(
        ("fault", "full"), [(SYNC_EIO, False), (SYNC_ENOSPC, True)], ids=["EIO", "ENOSPC"]
    )
    def test_fsync(self, db_path: Path, vfs: FaultVFS, fault: object, full: bool) -> None:
        """A failed fsync of a durability="full" commit fails it; ENOSPC there is a full disk."""
        with Store(db_path, durability="full") as store:
            commit_message(store)
            vfs.fail(fault, nth=1)  # type: ignore[arg-type]
            with pytest.raises(StorageError) as info:
                commit_message(store)
            vfs.clear()
            assert isinstance(info.value, DiskFullError) == full
            assert (info.value.operation, info.value.code) == ("sync", "SQLITE_IOERR_FSYNC")
            assert [v.version for v in store.versions("bot")] == [1]
            assert commit_message(store) == 2

    def test_read_error_is_not_masked(self, db_path: Path, vfs: FaultVFS) -> None:
        """EIO on a read is StorageError: not the 'no transaction is active' of its COMMIT."""
        with Store(db_path) as store:
            commit_message(store)
        with Store(db_path) as store:  # a cold page cache: the next SELECT reads the file
            vfs.fail(READ_EIO, nth=1)
            with pytest.raises(StorageError) as info:
                store.history("bot")
            vfs.clear()
            assert (info.value.operation, info.value.errno) == ("read", errno.EIO)
            assert [m["id"] for m in store.history("bot")] == ["m0"]

    def test_error_on_open(self, db_path: Path, vfs: FaultVFS) -> None:
        """A read that fails while a database is opened is StorageError too, and closes it."""
        Store(db_path).close()
        vfs.fail(READ_EIO, nth=1)
        with pytest.raises(StorageError):
            Store(db_path)
        vfs.clear()
        Store(db_path).close()


@pytest.mark.processes
class TestFailedSync:
    """A commit whose fsync failed: gone for this process; whole or absent after it stops."""

    CHILD = """
import os, sys
import apsw
from effectful_durable import DiskFullError, Store
from effectful_durable.store.history import HistoryChange
from faultvfs import SYNC_ENOSPC, FaultVFS

def commit(store):
    with store.turns.start("bot", template="t", arguments={}) as start:
        message = {"id": f"m{start.version}", "role": "user"}
        change = HistoryChange(added=[(start.version, message)], removed=[], removed_count=0)
        return store.turns.commit(
            "bot", base_version=start.version, template="t", change=change, state=None
        )

vfs = FaultVFS()
store = Store(sys.argv[1], durability="full")
commit(store)
vfs.fail(SYNC_ENOSPC, nth=1)
try:
    commit(store)
except DiskFullError:
    print([v.version for v in store.versions("bot")])
if sys.argv[2] == "close":
    try:  # the disk still full: SQLite ignores the failed checkpoint; apsw reports it
        store.close()
    except apsw.IOError:
        pass
vfs.clear()
if sys.argv[2] == "commit-again":
    print(commit(store))
sys.stdout.flush()  # os._exit flushes nothing, and a pipe's stdout is buffered
os._exit(0)  # dies: no close, no checkpoint
"""

    @pytest.mark.parametrize("then", ["die", "close", "commit-again"])
    def test_outcome(self, db_path: Path, then: str) -> None:
        """The process goes on at version 1; the file reopens at version 1 or 2, whole.

        Its frames may be whole in the WAL (the disk may have kept them): this
        process's WAL index never counts them and its next commit overwrites
        them, but SQLite could recover them once no process has the file open.
        Either way the database holds whole versions only.
        """
        out = subprocess.run(
            [sys.executable, "-c", self.CHILD, str(db_path), then],
            capture_output=True, text=True, check=True, cwd=ROOT,
        ).stdout.split()  # fmt: skip
        assert out[0] == "[1]"
        with Store(db_path) as store:
            found = [v.version for v in store.versions("bot")]
            assert found in ([1], [1, 2]) and (then != "commit-again" or found == [1, 2])
            assert [m["id"] for m in store.history("bot")] == [f"m{v - 1}" for v in found]
        assert integrity(db_path) == "ok"


class TestTranslation:
    """One table maps driver errors to ours; the rest pass through untouched."""

    def test_other_errors_pass(self) -> None:
        """A constraint error is not ours to translate."""
        conn = apsw.Connection(":memory:")
        conn.execute("CREATE TABLE t (x PRIMARY KEY); INSERT INTO t VALUES (1)")
        with pytest.raises(apsw.ConstraintError), translated("db", conn):
            conn.execute("INSERT INTO t VALUES (1)")
        assert translate(apsw.ConstraintError("x"), "db", None) is None

    def test_the_table_is_ordered_and_extendable(self) -> None:
        """Rows are (driver error class, builder); the first match wins."""
        assert [kind for kind, _ in TRANSLATIONS][:2] == [apsw.FullError, apsw.IOError]
        error = translate(apsw.exception_for(apsw.SQLITE_IOERR), "state.db", None)
        assert isinstance(error, StorageError) and error.errno is None
        assert "cannot read or write state.db: an I/O error (SQLite SQLITE_IOERR)" in str(error)
