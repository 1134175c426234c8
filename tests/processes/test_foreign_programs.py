"""Other SQLite programs on our file, for DESIGN promise 1 (and 5), with real processes.

Promise 1 says the file stays an ordinary SQLite file: any SQLite program (the
``sqlite3`` shell, Python's ``sqlite3``) may open and read it at any time, after a
crash too, and the library then carries on with every committed turn; a normal end
leaves one self-contained file. Promise 5: a newer schema gets a clear error and
nothing is written. Damage is detected at the level of what we store, so a foreign
checkpoint never trips it, while a foreign edit of one row is caught when that row is
read, naming the agent, and the other agents keep working.

How: children (``tests/programs/crash_child.py``, driven line by line, and
``tests/programs/foreign_child.py``, a program that runs turns and ends without ``close()``)
run turns of one agent on a real file in ``tmp_path``; the real ``sqlite3`` shell and
Python's ``sqlite3`` module, each in a process of its own, open the file read-write
as a user would (the last to close a WAL database checkpoints it into the file). The
tests then check the file through the library, as ``crash_children.on_disk`` does.
The tests that run the shell are skipped where it is not installed, unless $CI is
set: there they fail.
"""

import ast
import hashlib
import os
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from crash_child import AGENT_ID, Counter, FakeModel, question
from crash_children import Child, Children, Kills, commits, kill_at_random, on_disk, whole_turns
from helpers import commit_message, integrity, persisted, texts
from paths import PROGRAMS, ROOT

import effectful_durable
from effectful_durable import DatabaseCorruptError, SchemaTooNewError, Store
from effectful_durable.store.engine.sqlite.migrations import SCHEMA_VERSION
from effectful_durable.testing import FakeCall, FakeLLM, Reply

FOREIGN_CHILD = PROGRAMS / "foreign_child.py"
SEED = 20250214
TIMEOUT = 120.0  # a child importing litellm on a busy machine
WAL_BOUND = 16 * 1024 * 1024

COUNT_MESSAGES = "select count(*) from messages"
STDLIB_COUNT = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1])\n"
    "print(c.execute('select count(*) from messages').fetchone())\n"
    "c.close()\n"
)
STDLIB_INTEGRITY = (
    "import sqlite3, sys\n"
    "c = sqlite3.connect(sys.argv[1])\n"
    "print(c.execute('PRAGMA integrity_check').fetchone()[0])\n"
    "c.close()\n"
)
TAKEN = (
    "a program that opened and closed the file while {} ran took the WAL from under it:"
    " its later commits are invisible to other processes, and lost if it is killed"
    " (did our process lose its POSIX locks on the file?)"
)
# Holds one read transaction (one snapshot) open for HOLD seconds while others write.
STDLIB_READER = (
    "import sqlite3, sys, time\n"
    "c = sqlite3.connect(sys.argv[1], isolation_level=None)\n"
    "c.execute('BEGIN')\n"
    "print('holding', c.execute('select count(*) from messages').fetchone()[0], flush=True)\n"
    "time.sleep(float(sys.argv[2]))\n"
    "print('still', c.execute('select count(*) from messages').fetchone()[0], flush=True)\n"
    "c.execute('COMMIT')\n"
    "print('after', c.execute('select count(*) from messages').fetchone()[0], flush=True)\n"
    "c.close()\n"
)
HOLD = 2.0


@pytest.fixture
def sqlite3_shell() -> str:
    """The ``sqlite3`` command-line shell; skipped without one, a failure when $CI is set."""
    found = shutil.which("sqlite3")
    if found is None:
        reason = "the sqlite3 shell is not installed (apt-get install sqlite3)"
        if os.environ.get("CI"):
            pytest.fail(f"{reason}, and CI is set: CI must run the foreign-program tests")
        pytest.skip(reason)
    return found


def shell(sqlite3: str, db: Path, sql: str) -> str:
    """``sqlite3 DB SQL``, the way a user types it; its output, stripped."""
    done = subprocess.run(
        [sqlite3, str(db), sql], capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 0, f"sqlite3 {db} {sql!r} failed: {done.stderr}"
    return done.stdout.strip()


def stdlib(script: str, *args: object) -> str:
    """Run ``script`` under Python's own ``sqlite3`` in a separate interpreter; its output."""
    done = subprocess.run(
        [sys.executable, "-c", script, *map(str, args)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"python sqlite3 failed: {done.stderr}"
    return done.stdout.strip()


def message_rows(version: int) -> int:
    """How many rows the messages table holds after ``version`` turns of the agent."""
    return len(whole_turns(version))


def wal_size(db: Path) -> int:
    """The size of the database's ``-wal`` file, 0 if there is none."""
    wal = db.with_name(db.name + "-wal")
    return wal.stat().st_size if wal.exists() else 0


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def end_cleanly(child: Child) -> None:
    """Close the child's stdin, so that it ends normally, and check that it did."""
    assert child.proc.stdin is not None
    child.proc.stdin.close()
    assert child.proc.wait(timeout=TIMEOUT) == 0


# -- 1. after a SIGKILL ----------------------------------------------------------


@pytest.mark.slow
def test_foreign_programs_read_a_killed_database_then_we_carry_on(
    sqlite3_shell: str, tmp_path: Path
) -> None:
    """After a SIGKILL mid-run, the sqlite3 shell (which recovers the WAL the kill left
    and, last to close, checkpoints it into the file) and then Python's sqlite3 read the
    file; then the library opens it with every committed turn, and a new process
    continues the agent."""
    db = tmp_path / "state.db"
    with Children(db, tmp_path / "logs", budget=2) as children:
        child = children.next()  # the next child imports meanwhile
        assert child.open() == 0
        child.send("run 5")
        assert child.expect("done") == ["5"]
        reported = kill_at_random(child, random.Random(SEED), Kills(), 5)
        assert reported >= 5, commits(child)

        from_shell = int(shell(sqlite3_shell, db, COUNT_MESSAGES))
        assert wal_size(db) == 0, "the shell did not checkpoint the WAL: nothing was tested"
        from_python = ast.literal_eval(stdlib(STDLIB_COUNT, db))
        assert from_python == (from_shell,)

        with Store(db) as store:  # the library, read-write, on the file they left
            loaded = store.turns.load(AGENT_ID)
            state = store.state(AGENT_ID)
        assert reported <= loaded.version <= reported + 1  # one commit may be unreported
        assert state == {"count": loaded.version}  # the persisted field counts the turns
        assert from_shell == message_rows(loaded.version)
        version, _ = on_disk(db)  # versions 1..v, whole turns, integrity ok
        assert version == loaded.version

        successor = children.next()
        assert successor.open() == version
        successor.send("run 3")
        assert successor.expect("done") == [str(version + 3)]
        end_cleanly(successor)
    assert on_disk(db)[0] == version + 3
    assert int(shell(sqlite3_shell, db, COUNT_MESSAGES)) == message_rows(version + 3)


# -- 2. after a normal exit without close() -----------------------------------------

CLEAN_TURNS = 30
ENDINGS = ["main-thread", "worker-thread"]


@pytest.fixture(scope="module")
def clean_exits(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, tuple[Path, "subprocess.Popen[str]"]]]:
    """The programs of the clean-exit test, one per ending, started together so that
    their imports overlap: the database and the process of each."""
    started: dict[str, tuple[Path, subprocess.Popen[str]]] = {}
    for where in ENDINGS:
        db = tmp_path_factory.mktemp(f"clean-exit-{where}") / "state.db"
        worker = ["--worker"] if where == "worker-thread" else []
        command = [sys.executable, str(FOREIGN_CHILD), str(db), str(CLEAN_TURNS), *worker]
        started[where] = (
            db,
            subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
        )
    yield started
    for _, proc in started.values():
        if proc.returncode is None:  # its test did not wait for it
            proc.kill()
            proc.communicate()


@pytest.mark.slow
@pytest.mark.parametrize("where", ENDINGS)
def test_a_normal_exit_without_close_leaves_one_self_contained_file(
    sqlite3_shell: str,
    clean_exits: dict[str, tuple[Path, "subprocess.Popen[str]"]],
    where: str,
) -> None:
    """A program that runs 30 turns and ends normally without close() leaves no WAL
    content, whether its handler is a module global or held by a daemon worker thread
    still alive at the exit: ``state.db`` alone (no -wal, no -shm) holds all 30 turns;
    the sqlite3 shell reads it, and the library then continues the agent with every
    turn there."""
    db, proc = clean_exits[where]
    stdout, stderr = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 0, stderr[-3000:]
    assert stdout.split()[-2:] == ["committed", str(CLEAN_TURNS)], stderr[-3000:]
    assert wal_size(db) == 0, f"the exit left {wal_size(db)} bytes in {db.name}-wal"

    alone = db.parent / "alone"
    alone.mkdir()
    shutil.copy2(db, alone / db.name)  # the main file only
    with Store(alone / db.name) as store:
        assert store.turns.load(AGENT_ID).version == CLEAN_TURNS
        assert texts(store.history(AGENT_ID)) == whole_turns(CLEAN_TURNS)
        assert store.state(AGENT_ID) == {"count": CLEAN_TURNS}

    assert int(shell(sqlite3_shell, db, COUNT_MESSAGES)) == message_rows(CLEAN_TURNS)
    with persisted(db, FakeLLM(respond=FakeModel())):
        assert Counter(agent_id=AGENT_ID).ask(question(CLEAN_TURNS + 1)) == (
            f"answer {CLEAN_TURNS + 1}"
        )
    assert on_disk(db)[0] == CLEAN_TURNS + 1


# -- 3. a foreign reader holding a snapshot while turns commit ------------------------


@pytest.mark.slow
def test_turns_go_on_while_a_foreign_reader_holds_a_snapshot(tmp_path: Path) -> None:
    """While Python's sqlite3, in another process, holds a read transaction open for 2 s,
    the child keeps committing turns, none failing; after the reader is gone and more
    turns ran, the WAL stays bounded, another process sees every turn the running child
    committed (the reader's close did not take the WAL from under it), and a clean exit
    leaves the WAL empty."""
    db = tmp_path / "state.db"
    child = Child(db, tmp_path / "logs")
    try:
        child.load()
        assert child.open() == 0
        child.send("run 5")
        version = 5
        assert child.expect("done") == [str(version)]

        reader = subprocess.Popen(
            [sys.executable, "-c", STDLIB_READER, str(db), str(HOLD)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        assert reader.stdout is not None
        holding = reader.stdout.readline().split()
        assert holding == ["holding", str(message_rows(version))], reader.communicate()
        while reader.poll() is None:  # turns while the snapshot is held
            child.send("run 5")
            version += 5
            assert child.expect("done") == [str(version)]
        out, err = reader.communicate(timeout=TIMEOUT)
        assert reader.returncode == 0, err
        still, after = (line.split() for line in out.splitlines())
        assert still == ["still", holding[1]]  # it really read one snapshot throughout
        assert int(after[1]) > int(holding[1])  # and turns committed meanwhile

        child.send("run 40")
        version += 40
        assert child.expect("done") == [str(version)]
        assert wal_size(db) < WAL_BOUND
        # Still running: its commits are in the file's WAL, where other programs see them.
        seen = ast.literal_eval(stdlib(STDLIB_COUNT, db))
        assert seen == (message_rows(version),), TAKEN.format("the child")
        end_cleanly(child)
    finally:
        child.close()
    assert wal_size(db) == 0, f"the exit left {wal_size(db)} bytes in {db.name}-wal"
    assert on_disk(db)[0] == version


# -- 4. a foreign write of the header --------------------------------------------------


def test_a_newer_schema_written_by_the_shell_is_refused_untouched(
    sqlite3_shell: str, tmp_path: Path
) -> None:
    """After ``PRAGMA user_version = <ours + 1000>`` through the sqlite3 shell, Store raises
    SchemaTooNewError naming that version, and the attempt leaves the file's bytes as
    they were."""
    db = tmp_path / "state.db"
    with persisted(db, FakeLLM(respond=FakeModel())):
        Counter(agent_id=AGENT_ID).ask(question(1))
    newer = SCHEMA_VERSION + 1000
    shell(sqlite3_shell, db, f"PRAGMA user_version = {newer}")
    assert shell(sqlite3_shell, db, "PRAGMA user_version") == str(newer)

    before = digest(db)
    with pytest.raises(SchemaTooNewError) as caught:
        Store(db)
    assert (caught.value.found, caught.value.supported) == (newer, SCHEMA_VERSION)
    assert digest(db) == before


# -- 5. a hand UPDATE of one row --------------------------------------------------------

DAMAGED, INTACT = "alpha", "beta"


def assert_names_damaged_row(error: DatabaseCorruptError, agent_id: str) -> None:
    """The error is the narrow one: a DamagedRowError naming the agent, its table, the
    checksum."""
    assert isinstance(error, DatabaseCorruptError)
    assert type(error).__name__ == "DamagedRowError", repr(error)
    assert type(error) is getattr(effectful_durable, "DamagedRowError", None)
    message = str(error)
    assert agent_id in message, message
    assert "messages" in message, message
    assert "checksum" in message, message


def test_a_hand_edit_of_one_row_is_caught_for_that_agent_only(
    sqlite3_shell: str, tmp_path: Path
) -> None:
    """An UPDATE of one message of agent A through the sqlite3 shell: loading A (its
    history, a turn of it through the handler) raises a DamagedRowError naming A and
    the checksum; B loads and takes a turn, in the same handler; ``effectful-durable
    check`` exits non-zero naming A."""
    db = tmp_path / "state.db"
    damaged, intact = Counter(agent_id=DAMAGED), Counter(agent_id=INTACT)
    with persisted(db, FakeLLM(respond=FakeModel())):
        for turn in (1, 2):
            damaged.ask(question(turn))
            intact.ask(question(turn))
    changed = shell(
        sqlite3_shell,
        db,
        "UPDATE messages SET body = replace(body, 'answer 1', 'answer 7')"
        f" WHERE agent_id = '{DAMAGED}' AND role = 'assistant' AND instr(body, 'answer 1');"
        " SELECT changes();",
    )
    assert changed == "1"  # one row, still valid JSON: only its checksum can tell

    with Store(db) as store:
        with pytest.raises(DatabaseCorruptError) as caught:
            store.turns.load(DAMAGED)
        assert_names_damaged_row(caught.value, DAMAGED)
        with pytest.raises(DatabaseCorruptError) as caught:
            store.history(DAMAGED)
        assert_names_damaged_row(caught.value, DAMAGED)
        assert texts(store.history(INTACT)) == whole_turns(2)

    with persisted(db, FakeLLM(respond=FakeModel())):
        with pytest.raises(DatabaseCorruptError) as caught:
            Counter(agent_id=DAMAGED).ask(question(3))
        assert_names_damaged_row(caught.value, DAMAGED)
        assert Counter(agent_id=INTACT).ask(question(3)) == "answer 3"
    with Store(db, readonly=True) as store:
        assert store.turns.load(INTACT).version == 3
        assert texts(store.history(INTACT)) == whole_turns(3)
        assert store.state(INTACT) == {"count": 3}

    check = subprocess.run(
        [sys.executable, "-m", "effectful_durable", "check", str(db)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        cwd=ROOT,
        check=False,
    )
    assert check.returncode != 0, check.stdout
    assert DAMAGED in check.stdout + check.stderr, check.stdout + check.stderr


# -- 6. the library's own readers in the running process -------------------------------

READ_TURNS = 20
ALL_TURNS = READ_TURNS + 3


def read_safely(db: Path) -> int:
    """Read the agent through a new ``Store(db, readonly=True)``, check it is whole turns,
    close it; the version read."""
    with Store(db, readonly=True) as store:
        records = [a for a in store.agents() if a.agent_id == AGENT_ID]
        version = records[0].version if records else 0
        if version:
            assert [i.version for i in store.versions(AGENT_ID)] == list(range(1, version + 1))
            assert texts(store.history(AGENT_ID)) == whole_turns(version)
    return version


class ReadingModel(FakeModel):
    """The children's model, which also reads the file safely inside each model call."""

    def __init__(self, db: Path) -> None:
        super().__init__()
        self.db = db
        self.reads: list[int] = []

    def __call__(self, call: FakeCall) -> Reply:
        self.reads.append(read_safely(self.db))
        return super().__call__(call)


def test_safe_readers_in_the_same_process_leave_the_running_agent_unharmed(
    tmp_path: Path,
) -> None:
    """Readonly Stores opened and closed in the running process, between turns and inside
    them, next to one held open throughout, see whole turns and leave the turns going.
    They leave the handler's hold on the file too: a foreign program that opens and
    closes it next does not take the WAL from under the handler, whose later turns
    another process sees while it runs. The file then holds every turn and passes
    integrity_check in another process."""
    db = tmp_path / "state.db"
    model = ReadingModel(db)
    bot = Counter(agent_id=AGENT_ID)
    with persisted(db, FakeLLM(respond=model)):
        bot.ask(question(1))
        with Store(db, readonly=True) as held:
            for turn in range(2, READ_TURNS + 1):
                assert read_safely(db) == turn - 1
                assert len(held.history(AGENT_ID)) == message_rows(turn - 1)
                assert bot.ask(question(turn)) == f"answer {turn}"
                assert held.versions(AGENT_ID)[-1].version == turn
        assert ast.literal_eval(stdlib(STDLIB_COUNT, db)) == (message_rows(READ_TURNS),)
        for turn in range(READ_TURNS + 1, ALL_TURNS + 1):
            assert bot.ask(question(turn)) == f"answer {turn}", TAKEN.format("the handler")
        seen = ast.literal_eval(stdlib(STDLIB_COUNT, db))
        assert seen == (message_rows(ALL_TURNS),), TAKEN.format("the handler")
    assert model.reads == [v for v in range(ALL_TURNS) for _ in range(2)]
    assert on_disk(db)[0] == ALL_TURNS
    assert stdlib(STDLIB_INTEGRITY, db) == "ok"
    assert integrity(db) == "ok"


def our_lock_count(db: Path) -> int:
    """How many POSIX locks this process holds on ``db`` (Linux's /proc/locks)."""
    inode = os.stat(db).st_ino
    mine = str(os.getpid())
    count = 0
    for line in Path("/proc/locks").read_text().splitlines():
        fields = line.split()
        # "1: POSIX  ADVISORY  READ 1234 08:01:5678 128 128"
        if len(fields) > 5 and fields[4] == mine and fields[5].endswith(f":{inode}"):
            count += 1
    return count


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="Linux's /proc/locks lists locks")
def test_opening_more_connections_keeps_the_locks_sqlite_holds(db_path: Path) -> None:
    """Opening a connection reads the file's header without Python's open(): closing a
    descriptor of the file would drop the locks this process's connections hold, and
    another program could then remove the WAL under them."""
    with Store(db_path) as store:
        commit_message(store, "a", "first")
        held = our_lock_count(db_path)
        assert held > 0  # a connection in WAL mode holds a shared lock while open
        with Store(db_path, readonly=True) as reader:  # a second connection, its header read
            assert len(reader.history("a")) == 1
        worker = threading.Thread(target=commit_message, args=(store, "a", "from a thread"))
        worker.start()
        worker.join()  # its connection read the header too
        assert our_lock_count(db_path) >= held
