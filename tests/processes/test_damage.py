"""Torn and damaged files: each damaged copy is recovered to a committed state or refused clearly.

One database is built (three agents' turns, a compaction, memory, a SQL table,
alarms, two conversations, a failed turn; checkpointed halfway, the later commits
in the WAL) and copies of it are damaged in every way listed below. Each copy is
then opened every way a user can (the command line's reads, ``Store`` with every
read of every agent, a turn). The promise, for each copy: every read answers
as it did before the damage (the WAL's cases: the file holds a state some commit
held), or is refused with a DurableError that says what to do; a refusal of the
whole file leaves its bytes as they were, a row that fails its checksum refuses
only the reads that need it; never a traceback, never a raw apsw error, never a
wrong value returned.

``EFFECTFUL_DURABLE_DAMAGE=full`` tries 25 times as many sampled cases, and a
truncation point every 97 bytes (about 8,000 cases: minutes instead of seconds).
"""

import collections
import os
import random
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from damage_helpers import (
    FRAME_HEADER,
    WAL_HEADER,
    Outcome,
    Transcript,
    Worker,
    build,
    case_path,
    checkpointed,
    committed_states,
    found_damage,
    frames,
    probe,
    read_everything,
    restore,
)
from helpers import persisted
from sql_helpers import workspace_path

from effectful_durable import DatabaseCorruptError, Store
from effectful_durable.store.alarms import make_schedule
from effectful_durable.testing import FakeLLM, ToolCall

FULL = os.environ.get("EFFECTFUL_DURABLE_DAMAGE") == "full"
PAGE = 4096

type Files = dict[str, bytes]
type Damage = Callable[[Files], Files]


@dataclass(frozen=True)
class Built:
    live: Files  # with the WAL holding the later commits
    flat: Files  # everything checkpointed into the main file
    states: set[str]
    rows: list[tuple[object, ...]]  # w1's SQL table as committed
    workspace: str  # the key of w1's workspace file in the Files
    reads: Transcript  # what every read returns from ``flat``

    def probe(self, db_path: Path) -> Outcome:
        """Probe a damaged copy of ``flat``: each read must answer as from ``flat``, or refuse."""
        return probe(db_path, self.states, self.reads)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    path = tmp_path_factory.mktemp("damage") / "state.db"
    live = build(path)
    flat = checkpointed(live)
    with Store(path) as store:
        rows = store.sql("w1", "SELECT * FROM items ORDER BY id").rows
    name = "-workspaces/" + os.path.basename(workspace_path(str(path), "w1"))
    assert name in flat
    with case_path(tmp_path_factory.mktemp("baseline")) as flat_path:
        restore(flat, flat_path)
        with Store(flat_path) as store:
            reads = read_everything(store)
    assert not found_damage(reads)
    return Built(live, flat, committed_states(live), rows, name, reads)


def changed(files: Files, name: str, data: bytes | None) -> Files:
    out = dict(files)
    if data is None:
        out.pop(name, None)
    else:
        out[name] = data
    return out


def truncated(name: str, size: int) -> Damage:
    return lambda files: changed(files, name, files[name][:size])


def flipped(name: str, offset: int, mask: int = 0xFF) -> Damage:
    def damage(files: Files) -> Files:
        data = bytearray(files[name])
        data[offset] ^= mask
        return changed(files, name, bytes(data))

    return damage


def zeroed(name: str, start: int, length: int) -> Damage:
    def damage(files: Files) -> Files:
        data = bytearray(files[name])
        data[start : start + length] = bytes(len(data[start : start + length]))
        return changed(files, name, bytes(data))

    return damage


def removed(*names: str) -> Damage:
    def damage(files: Files) -> Files:
        return {k: v for k, v in files.items() if k not in names}

    return damage


def run_cases(
    tmp_path: Path, base: Files, cases: dict[str, Damage], check: Callable[[Path], Outcome]
) -> collections.Counter[str]:
    """Damage a copy of ``base`` each way; assert every outcome keeps the promise; count them."""
    counts: collections.Counter[str] = collections.Counter()
    problems = []
    for name, damage in cases.items():
        with case_path(tmp_path) as db_path:
            restore(damage(base), db_path)
            outcome = check(db_path)
        counts[outcome.kind] += 1
        problems += [f"{name}: {problem}" for problem in outcome.problems]
    print(f"\n{len(cases)} cases: {dict(counts)}")
    assert not problems, "\n".join(problems[:20])
    return counts


def sample(population: range, k: int, seed: int) -> list[int]:
    """``k`` of ``population`` (all when it is no bigger), 25 times as many when FULL."""
    k = k * 25 if FULL else k
    return list(population) if len(population) <= k else random.Random(seed).sample(population, k)


class TestMainFile:
    """The main file torn or damaged (everything checkpointed into it, no WAL)."""

    def test_truncated(self, built: Built, tmp_path: Path) -> None:
        """Cut at every page boundary and mid-page: refused clearly (nothing opens cut off)."""
        size = len(built.flat[""])
        points = set(range(PAGE, size, PAGE))  # every page boundary
        points |= {1, 16, 99, 100, 101, PAGE // 2, PAGE - 1, size - 1}
        points |= {p + d for p in sample(range(PAGE, size, PAGE), 12, 1) for d in (1, PAGE // 2)}
        if FULL:
            points |= set(range(1, size, 97))
        cases = {f"truncated to {n}": truncated("", n) for n in sorted(points)}
        counts = run_cases(
            tmp_path, built.flat, cases, lambda p: probe(p, built.states, built.reads)
        )
        assert counts["wrong"] == 0

    def test_empty_file_is_a_new_database(self, built: Built, tmp_path: Path) -> None:
        """A file cut to 0 bytes holds nothing: the CLI refuses it, Store starts afresh in it."""
        with case_path(tmp_path) as db_path:
            restore(truncated("", 0)(built.flat), db_path)
            outcome = probe(db_path, built.states)
        assert outcome.errors[0].endswith(
            "is an empty file, not an effectful-durable database yet"
        )
        assert outcome.kind == "wrong" and outcome.problems == []  # new: no committed state

    def test_header_bytes(self, built: Built, tmp_path: Path) -> None:
        """Each header byte flipped (^ 0xff; ^ 0x01 too when FULL): recovered or refused."""
        cases = {
            f"header byte {i} ^ {m:#x}": flipped("", i, m)
            for i in range(100)
            for m in ((0xFF, 0x01) if FULL else (0xFF,))
        }
        counts = run_cases(
            tmp_path, built.flat, cases, lambda p: probe(p, built.states, built.reads)
        )
        assert counts["wrong"] == 0

    def test_zeroed_pages(self, built: Built, tmp_path: Path) -> None:
        """Each page but the first overwritten with zeros: recovered or refused."""
        pages = len(built.flat[""]) // PAGE
        cases = {f"page {k + 1} zeroed": zeroed("", k * PAGE, PAGE) for k in range(1, pages)}
        counts = run_cases(
            tmp_path, built.flat, cases, lambda p: probe(p, built.states, built.reads)
        )
        assert counts["wrong"] == 0

    def test_flipped_bytes_in_data_pages(self, built: Built, tmp_path: Path) -> None:
        """Bytes flipped across the data pages: never a traceback, a refusal leaves the bytes."""
        size = len(built.flat[""])
        offsets = sample(range(PAGE, size), 100, 2)
        cases = {f"byte {i} flipped": flipped("", i) for i in offsets}
        counts = run_cases(
            tmp_path, built.flat, cases, lambda p: probe(p, built.states, built.reads)
        )
        assert counts["wrong"] == 0


class TestWal:
    """The WAL (holding the later commits) deleted, cut or damaged; the -shm too."""

    def test_deleted(self, built: Built, tmp_path: Path) -> None:
        """Without its WAL (and -shm) the database opens at its last checkpoint."""
        cases = {"no -wal": removed("-wal"), "no -wal, no -shm": removed("-wal", "-shm")}
        counts = run_cases(tmp_path, built.live, cases, lambda p: probe(p, built.states))
        assert counts == {"recovered": 2}

    def test_truncated(self, built: Built, tmp_path: Path) -> None:
        """Cut at commit ends, inside commits, mid-frame: an earlier commit, never part of one."""
        wal = built.live["-wal"]
        ends = [end for end, _ in frames(wal)]
        commits = [end for end, commit in frames(wal) if commit]
        points = {0, 1, WAL_HEADER - 1, WAL_HEADER, *commits}  # every commit's end
        points |= {ends[k] for k in sample(range(len(ends)), 15, 3)}  # frames inside commits
        points |= {ends[k] - PAGE // 2 for k in sample(range(len(ends)), 10, 4)}  # mid-frame
        cases = {f"wal cut to {n}": truncated("-wal", n) for n in sorted(points)}
        counts = run_cases(tmp_path, built.live, cases, lambda p: probe(p, built.states))
        assert counts == {"recovered": len(cases)}

    def test_damaged_frames(self, built: Built, tmp_path: Path) -> None:
        """A byte flipped in the WAL header, a frame header or a frame body: an earlier commit."""
        wal = built.live["-wal"]
        starts = [end - FRAME_HEADER - PAGE for end, _ in frames(wal)]
        cases = {f"wal header byte {i}": flipped("-wal", i) for i in sample(range(32), 12, 5)}
        for k in sample(range(len(starts)), 2, 6):
            for i in range(FRAME_HEADER):
                cases[f"frame {k} header byte {i}"] = flipped("-wal", starts[k] + i)
        for k in sample(range(len(starts)), 20, 7):
            offset = starts[k] + FRAME_HEADER + random.Random(k).randrange(PAGE)
            cases[f"frame {k} body byte {offset}"] = flipped("-wal", offset)
        counts = run_cases(tmp_path, built.live, cases, lambda p: probe(p, built.states))
        assert counts == {"recovered": len(cases)}

    def test_shm(self, built: Built, tmp_path: Path) -> None:
        """The -shm deleted, emptied, cut or with bytes flipped: rebuilt from the WAL."""
        shm = built.live["-shm"]
        cases = {"no -shm": removed("-shm"), "-shm emptied": truncated("-shm", 0)}
        cases["-shm zeroed"] = zeroed("-shm", 0, len(shm))
        cases |= {f"-shm cut to {n}": truncated("-shm", n) for n in (1, 100, 136, len(shm) // 2)}
        for i in sample(range(len(shm)), 20, 8):
            cases[f"-shm byte {i}"] = flipped("-shm", i)
        counts = run_cases(tmp_path, built.live, cases, lambda p: probe(p, built.states))
        assert counts == {"recovered": len(cases)}


def workspace_probe(built: Built) -> Callable[[Path], Outcome]:
    """Read w1's table and run a turn that writes it: always what the log says."""

    def check(db_path: Path) -> Outcome:
        outcome = Outcome()
        path = Path(workspace_path(str(db_path), "w1"))
        damaged = path.read_bytes() if path.exists() else None
        query = "SELECT * FROM items ORDER BY id"
        try:
            with Store(db_path, readonly=True) as store:
                if store.sql("w1", query).rows != built.rows:
                    outcome.problems.append("a read-only Store read other rows")
            if damaged is not None and path.read_bytes() != damaged:
                outcome.problems.append("a read-only Store changed the workspace file")
            with Store(db_path) as store:
                if store.sql("w1", query).rows != built.rows:
                    outcome.kind = "wrong"
            insert = ToolCall("sql_insert", {"table": "items", "values": {"name": "new"}})
            with persisted(db_path, FakeLLM([insert, "ok"])):
                Worker(agent_id="w1").ask("add new")
            with Store(db_path) as store:
                after = store.sql("w1", query).rows
            if outcome.kind != "wrong" and [row[1] for row in after] != [
                *(row[1] for row in built.rows),
                "new",
            ]:
                outcome.problems.append(f"after a turn the table holds {after}")
        except Exception as e:
            outcome.problems.append(f"raised {type(e).__name__}: {e}")
        for aside in path.parent.glob(f"{path.name}.damaged-*"):
            outcome.kind = "rebuilt" if outcome.kind == "recovered" else outcome.kind
            if damaged is not None and aside.read_bytes() != damaged:
                outcome.problems.append("the damaged file was changed before it was set aside")
        return outcome

    return check


class TestWorkspaceFile:
    """An agent's SQL workspace file damaged: set aside intact and rebuilt from the log."""

    def test_damaged(self, built: Built, tmp_path: Path) -> None:
        """Deleted, cut, header bytes flipped, pages zeroed: reads and turns see the log's rows."""
        name = built.workspace
        size = len(built.flat[name])
        cases: dict[str, Damage] = {"deleted": removed(name)}
        cases |= {f"cut to {n}": truncated(name, n) for n in sorted({1, 100, PAGE, size - 1})}
        for i in sample(range(100), 10, 9):
            cases[f"header byte {i}"] = flipped(name, i)
        for k in range(1, size // PAGE):
            cases[f"page {k + 1} zeroed"] = zeroed(name, k * PAGE, PAGE)
        counts = run_cases(tmp_path, built.flat, cases, workspace_probe(built))
        assert counts["wrong"] == 0


def test_wal_frames_parse(built: Built) -> None:
    """The WAL holds the later commits (the fixture is what the other tests assume)."""
    wal = built.live["-wal"]
    (page_size,) = struct.unpack(">I", wal[8:12])
    assert page_size == PAGE
    assert sum(commit for _, commit in frames(wal)) >= 10
    assert len(built.states) >= 12


class TestAfterDamage:
    """What a Store does once it has found damage, and a turn that meets it."""

    @pytest.fixture
    def damaged(self, built: Built, tmp_path: Path) -> Path:
        """w1's messages table with its root page zeroed (the file opens; reads fail)."""
        db_path = tmp_path / "state.db"
        restore(built.flat, db_path)
        with Store(db_path) as store:
            root = (
                store.engine.connection()
                .execute("SELECT rootpage FROM sqlite_schema WHERE name = 'messages'")
                .get
            )
        restore(zeroed("", (root - 1) * PAGE, PAGE)(built.flat), db_path)
        return db_path

    def test_a_store_that_found_damage_writes_nothing(self, damaged: Path) -> None:
        """After a read met the damage, writes are refused at once and close leaves the WAL."""
        before = damaged.read_bytes()
        with Store(damaged) as store:
            memory = store.memory("w1")  # a table that is whole: reads go on
            with pytest.raises(DatabaseCorruptError, match="found during Store.history"):
                store.history("w1")
            with pytest.raises(DatabaseCorruptError, match="during Store.schedule_alarm"):
                store.schedule_alarm("w1", "later", make_schedule(0, delay=60))
            assert store.memory("w1") == memory
        assert damaged.read_bytes() == before

    def test_a_turn_that_meets_damage(self, damaged: Path) -> None:
        """A turn fails with DatabaseCorruptError; the agent and the file stay as they were."""
        before = damaged.read_bytes()
        agent = Worker(agent_id="w2")
        with pytest.raises(DatabaseCorruptError), persisted(damaged, FakeLLM(["ok"])):
            agent.ask("hello")
        assert damaged.read_bytes() == before
