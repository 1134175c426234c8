"""Page checksums: every page of the database file carries a CRC-32 that each read checks."""

import shutil
import threading
import time
from pathlib import Path

import apsw
import pytest

from effectful_durable import DatabaseCorruptError, Store
from effectful_durable.store.checksums import RESERVE, checksum
from tests.helpers import commit_message, integrity, writable_connection

SCHEMA2 = Path(__file__).parent.parent / "fixtures" / "schema2.db"
TEXT = "the meeting moved to Thursday at nine"


def pages(path: Path) -> list[bytes]:
    data = path.read_bytes()
    size = int.from_bytes(data[16:18])
    return [data[i : i + size] for i in range(0, len(data), size)]


def bad_pages(path: Path) -> list[int]:
    """Numbers of the file's pages whose checksum does not match."""
    return [n for n, page in enumerate(pages(path), 1) if page[-RESERVE:] != checksum(page)]


@pytest.fixture
def written(db_path: Path) -> Path:
    """A database with 50 turns, all in the file (closing the last connection checkpoints)."""
    with Store(db_path) as store:
        for i in range(50):
            commit_message(store, "bot", f"{TEXT} ({i})")
    assert not Path(f"{db_path}-wal").exists()
    return db_path


def test_new_database_checksums_every_page(written: Path) -> None:
    """A new file reserves RESERVE bytes per page and every page's checksum matches."""
    assert written.read_bytes()[20] == RESERVE
    assert len(pages(written)) > 5
    assert bad_pages(written) == []
    assert integrity(written) == "ok"


def test_a_changed_letter_is_refused_not_read(written: Path) -> None:
    """A byte flipped inside a message that still reads as text: SQLite alone returns the
    changed value; the Store refuses the file and leaves its bytes as they were."""
    data = written.read_bytes().replace(b"Thursday at nine (7)", b"Shursday at nine (7)")
    written.write_bytes(data)  # a letter changed: valid text, valid JSON
    plain = apsw.Connection(str(written), flags=apsw.SQLITE_OPEN_READONLY)
    assert plain.execute("SELECT count(*) FROM messages WHERE body LIKE '%Shursday%'").get == 1
    plain.close()
    with Store(written) as store, pytest.raises(DatabaseCorruptError, match="checksum"):
        store.history("bot")
    assert written.read_bytes() == data


def test_backup_carries_checksums(written: Path, tmp_path: Path) -> None:
    """Store.backup writes a copy whose every page has its checksum, also when the copy
    is larger than SQLite's page cache (pages then leave it before the first page)."""
    copy = tmp_path / "copy.db"
    with Store(written) as store:
        for i in range(40):  # 4 MB, twice the default page cache; the last ones in the WAL
            commit_message(store, "bot", f"{i}" + "x" * 100_000)
        store.backup(copy)
    assert copy.read_bytes()[20] == RESERVE
    assert bad_pages(copy) == []
    with Store(copy) as store:
        assert len(store.history("bot")) == 90


def test_older_file_gains_checksums_on_vacuum(tmp_path: Path) -> None:
    """A file made before checksums works unchecked; Store.vacuum gives it checksums."""
    old = tmp_path / "old.db"
    shutil.copy(SCHEMA2, old)
    assert old.read_bytes()[20] == 0
    with Store(old) as store:
        agents = {a.agent_id: a.version for a in store.agents()}
        histories = {agent: store.history(agent) for agent in agents}
        store.vacuum()
    assert old.read_bytes()[20] == RESERVE
    assert bad_pages(old) == []
    with Store(old) as store:
        assert {a.agent_id: a.version for a in store.agents()} == agents
        assert {agent: store.history(agent) for agent in agents} == histories


def test_a_waiting_writer_does_not_stall_the_lock_holder(db_path: Path) -> None:
    """A thread waiting out the busy timeout sleeps without the GIL: the thread holding
    the write lock keeps most of its speed (with the GIL held it got a tenth or less)."""
    Store(db_path).close()
    holder, waiter = writable_connection(db_path), writable_connection(db_path)
    waiter.set_busy_timeout(5_000)

    def spin(seconds: float) -> int:
        count, end = 0, time.perf_counter() + seconds
        while time.perf_counter() < end:
            count += 1
        return count

    alone = spin(0.3)
    holder.execute("BEGIN IMMEDIATE")
    waiting = threading.Thread(target=waiter.execute, args=("BEGIN IMMEDIATE",))
    waiting.start()
    time.sleep(0.05)
    contended = spin(0.3)
    holder.execute("COMMIT")
    waiting.join()
    waiter.execute("COMMIT")
    assert contended > alone / 3
