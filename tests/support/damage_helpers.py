"""A database to damage, the states it committed, and probes of a damaged copy (explicit import).

``build`` runs turns of three agents (messages, a compaction, memory, a SQL table,
alarms, two conversations, a failed turn) with a checkpoint halfway, so that the
main file holds an early state and the WAL every later commit. ``committed_states``
replays the WAL one commit at a time: the fingerprints of every state the file
ever held as committed. ``probe`` opens a damaged copy every way a user can and
says what happened.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import os
import shutil
import struct
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import apsw
from effectful.handlers.llm import Template
from effectful.ops.types import NotHandled
from helpers import running, writable_connection

from effectful_durable import (
    AlarmTools,
    CompactionHandler,
    DamagedRowError,
    DatabaseCorruptError,
    DurableError,
    NotFoundError,
    NotOurDatabaseError,
    PersistenceHandler,
    PersistentAgent,
    RecallTools,
    SchemaTooNewError,
    SQLTools,
    StateTools,
    Store,
)
from effectful_durable.cli import main
from effectful_durable.store.history import HistoryChange
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

WAL_HEADER = 32
FRAME_HEADER = 24


@dataclasses.dataclass
class Worker(PersistentAgent, StateTools, SQLTools, AlarmTools, RecallTools):
    """You keep track of things."""

    __sql_schema__ = "CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT, qty INTEGER)"

    done: list[str] = dataclasses.field(default_factory=list)

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


def _reply(call: FakeCall) -> Any:
    text = call.last_user_text.removeprefix("Answer: ")
    if "Summarise the conversation" in text:
        return "SUMMARY: items were added and counted"
    if call.messages[-1]["role"] == "tool":
        return f"done with {text}"
    n = len(text)
    if text.startswith("put"):
        return ToolCall("put_state", {"key": f"k{n}", "value": f'"{text}"'})
    if text.startswith("add"):
        name = text.split()[-1]
        return ToolCall("sql_insert", {"table": "items", "values": {"name": name, "qty": n}})
    if text.startswith("remind"):
        return ToolCall("schedule_alarm", {"delay_seconds": 3600.0, "action": text})
    if text.startswith("note"):
        return ToolCall("add_to_context", {"item": text})
    if text.startswith("fail"):
        return RuntimeError("the model is down")
    return f"answer to {text}"


def build(db_path: Path) -> dict[str, Any]:
    """Build the database; return the files' bytes as committed, with the WAL still there.

    The main file is checkpointed after the first half of the turns, so deleting
    or damaging the WAL goes back to that state, never to an empty file.
    """
    persistence = PersistenceHandler(db_path)
    compaction = CompactionHandler(max_messages=10, keep_recent=3)
    persistence.store.engine.connection().pragma("wal_autocheckpoint", 0)  # keep every commit
    try:
        with running(FakeLLM(respond=_reply), compaction, persistence):
            w1, w2 = Worker(agent_id="w1"), Worker(agent_id="w2")
            for question in ["put apples", "add apples", "hello", "note buy milk"]:
                w1.ask(question)
            w2.ask("add pears")
            checkpoint = writable_connection(db_path)
            checkpoint.execute("SELECT count(*) FROM sqlite_schema")  # opens the WAL
            checkpoint.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
            checkpoint.close()
            for question in ["add plums", "remind me", "put figs", "how many?", "add kiwis"]:
                w1.ask(question)
            with w1.conversation("side"):
                w1.ask("add limes")
                w1.ask("put side note")
            w2.ask("remind w2")
            try:
                w2.ask("fail now")
            except RuntimeError:
                pass
            w2.ask("add dates")
        return snapshot(db_path)
    finally:
        persistence.close()


def snapshot(db_path: Path) -> dict[str, bytes]:
    """The bytes of the database, its -wal and -shm, and the workspace files, by name."""
    files = {}
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(f"{db_path}{suffix}"):
            files[suffix] = Path(f"{db_path}{suffix}").read_bytes()
    directory = Path(f"{os.path.realpath(db_path)}-workspaces")
    for path in sorted(directory.glob("*")):
        files[f"-workspaces/{path.name}"] = path.read_bytes()
    return files


def restore(files: dict[str, bytes], db_path: Path) -> None:
    """Write ``files`` (from :func:`snapshot`) as the database at ``db_path``, and nothing else."""
    directory = Path(f"{os.path.realpath(db_path)}-workspaces")
    shutil.rmtree(directory, ignore_errors=True)
    for suffix in ("", "-wal", "-shm", "-lock"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(f"{db_path}{suffix}")
    for path in db_path.parent.glob(f"{db_path.name}.unreadable-*"):
        os.remove(path)
    for name, data in files.items():
        target = Path(f"{os.path.realpath(db_path)}{name}")
        target.parent.mkdir(exist_ok=True)
        target.write_bytes(data)


def checkpointed(files: dict[str, bytes]) -> dict[str, bytes]:
    """The same database with every commit copied into the main file and no WAL."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "c.db"
        restore(files, path)
        conn = writable_connection(path)
        conn.execute("SELECT count(*) FROM sqlite_schema")  # opens the WAL
        conn.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
        conn.close()
        for name in list(Path(tmp).glob("c.db-workspaces/*.sqlite")):
            ws = apsw.Connection(str(name))
            ws.execute("SELECT count(*) FROM sqlite_schema")
            ws.wal_checkpoint(mode=apsw.SQLITE_CHECKPOINT_TRUNCATE)
            ws.close()
        out = snapshot(path)
        out.pop("-wal", None)
        out.pop("-shm", None)
        return {k: v for k, v in out.items() if not k.endswith(("-wal", "-shm"))}


def frames(wal: bytes) -> list[tuple[int, bool]]:
    """``(end offset, is a commit)`` of each frame of a WAL file."""
    (page_size,) = struct.unpack(">I", wal[8:12])
    size = FRAME_HEADER + page_size
    out = []
    for start in range(WAL_HEADER, len(wal) - size + 1, size):
        (committed_pages,) = struct.unpack(">I", wal[start + 4 : start + 8])
        out.append((start + size, committed_pages != 0))
    return out


def fingerprint(db_path: Path) -> str:
    """A hash of every row of every table (and the schema) of a database, as committed."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "f.db"
        for suffix in ("", "-wal"):
            if os.path.exists(f"{db_path}{suffix}"):
                shutil.copy(f"{db_path}{suffix}", f"{copy}{suffix}")
        conn = apsw.Connection(str(copy))
        try:
            digest = hashlib.sha256()
            schema = conn.execute(
                "SELECT type, name, sql FROM sqlite_schema ORDER BY type, name"
            ).fetchall()
            digest.update(repr(schema).encode())
            for kind, name, sql in schema:
                if kind != "table" or name.startswith("sqlite_") or "VIRTUAL" in str(sql):
                    continue
                quoted = '"' + name.replace('"', '""') + '"'
                count = conn.execute("SELECT count(*) FROM pragma_table_info(?)", (name,)).get
                order = ", ".join(str(i + 1) for i in range(count))
                for row in conn.execute(f"SELECT * FROM {quoted} ORDER BY {order}"):
                    digest.update(repr((name, row)).encode())
            return digest.hexdigest()
        finally:
            conn.close()


def committed_states(files: dict[str, bytes]) -> set[str]:
    """The fingerprint of every state the database held as committed while it was built."""
    states = set()
    wal = files.get("-wal", b"")
    ends = [0] + [end for end, commit in frames(wal) if commit] if wal else [0]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.db"
        for end in ends:
            restore({"": files[""], "-wal": wal[:end]} if end else {"": files[""]}, path)
            states.add(fingerprint(path))
    return states


def file_hashes(db_path: Path) -> dict[str, str]:
    """sha256 of the database file and its WAL (what a refusal must leave as it was)."""
    out = {}
    for suffix in ("", "-wal"):  # an empty WAL (any reader makes one) is no WAL
        if os.path.exists(f"{db_path}{suffix}") and os.path.getsize(f"{db_path}{suffix}"):
            out[suffix] = hashlib.sha256(Path(f"{db_path}{suffix}").read_bytes()).hexdigest()
    return out


@dataclass
class Outcome:
    """What a damaged file did under every probe.

    ``kind`` is ``"recovered"`` (it opened, read back whole, held a committed
    state and took a turn), ``"refused"`` (a clear error at some point, bytes
    unchanged), ``"checked"`` (a read through a damaged index missed or repeated
    a row, and ``check``'s ``PRAGMA integrity_check`` reports that index) or
    ``"wrong"`` (a read answered differently, and nothing reported the damage).
    ``problems`` lists every broken promise.
    """

    kind: str = "recovered"
    problems: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the refusals' messages


REFUSALS = (DatabaseCorruptError, NotOurDatabaseError, SchemaTooNewError)
CLI_COMMANDS = [
    ["check"],
    ["history", "w1", "--all"],
    ["memory", "w1"],
    ["sql", "w1", "SELECT * FROM items ORDER BY id"],
]


type Transcript = dict[str, object]


def read_everything(store: Store) -> Transcript:
    """Every read of the Store API over every agent (each of its versions); what each returned.

    A read refused with a DurableError shows as ``REFUSED`` and the others go on:
    a refusal must be narrow, and every read that answers must answer right.
    """
    out: Transcript = {}

    def read(label: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            out[label] = call(*args, **kwargs)
        except REFUSALS:
            out[label] = REFUSED
        return out[label]

    facts = store.check()
    out["check"] = (facts["integrity"], facts.get("damaged_rows"))
    read("handoffs", store.handoffs)
    read("workflows", store.workflows)
    read("alarms", store.alarms, include_ended=True)
    agents = read("agents", store.agents)
    for agent in [] if agents is REFUSED else agents:
        agent_id = agent.agent_id
        versions = read(f"versions {agent_id}", store.versions, agent_id)
        for info in [] if versions is REFUSED else versions:
            v = info.version
            read(
                f"history {agent_id} {v}",
                store.history,
                agent_id,
                v,
                include_compacted=True,
            )
            read(f"state {agent_id} {v}", store.state, agent_id, v)
            read(f"memory {agent_id} {v}", store.memory, agent_id, v)
            read(f"notes {agent_id} {v}", store.memory_notes, agent_id, v)
        conversations = read(f"conversations {agent_id}", store.conversations, agent_id)
        for conversation in [] if conversations is REFUSED else conversations:
            c = conversation.conversation
            read(f"history {agent_id} @{c}", store.history, agent_id, conversation=c)
        read(f"search {agent_id}", store.search_compacted, agent_id, "apples")
        read(f"sql {agent_id}", store.sql, agent_id, "SELECT * FROM items ORDER BY id")
    return out


REFUSED = "(refused)"


def found_damage(transcript: Transcript) -> bool:
    """Whether a read was refused, or ``check`` reported damage."""
    integrity, damaged_rows = transcript["check"]  # type: ignore[misc]
    return integrity != "ok" or bool(damaged_rows) or REFUSED in transcript.values()


def wrong_reads(transcript: Transcript, baseline: Transcript) -> list[str]:
    """The reads that answered with something else than they did on the undamaged file."""
    return [
        label
        for label, value in transcript.items()
        if label != "check" and value is not REFUSED and value != baseline.get(label, REFUSED)
    ]


def cli(argv: list[str]) -> tuple[int, str, str]:
    """Run the command line in this process: exit code, stdout, stderr."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return code, out.getvalue(), err.getvalue()


def probe(db_path: Path, states: set[str], baseline: Transcript | None = None) -> Outcome:
    """Open the damaged database every way a user can; report the outcome and any broken promise.

    Read-only commands (the CLI's reads) must never change a byte, and a failed
    one prints one error line. Then the Store reads everything and a turn is
    tried. A refusal of the whole file must be a clear DurableError that leaves
    the file's bytes as they were; a refusal of one row (DamagedRowError) leaves
    every other read answering. With a ``baseline`` (what every read returned
    from the undamaged file), a read that answers differently is a wrong value
    returned; without one, what opens must hold a committed state, unless the
    damage was found (a refused read, ``check``).
    """
    outcome = Outcome()
    before = file_hashes(db_path)
    for command in CLI_COMMANDS:
        argv = [command[0], str(db_path), *command[1:]]
        try:
            code, _, err = cli(argv)
        except Exception as e:  # a traceback
            outcome.problems.append(f"cli {command[0]} raised {type(e).__name__}: {e}")
            continue
        if code != 0:
            lines = err.strip().splitlines()
            if len(lines) != 1 or not lines[0].startswith("effectful-durable: error: "):
                outcome.problems.append(f"cli {command[0]} exit {code} with stderr {err!r}")
            elif "damaged" in lines[0] and "backup" not in lines[0]:
                outcome.problems.append(f"cli {command[0]} does not say what to do: {err!r}")
            outcome.errors.append(lines[-1] if lines else "")
    if file_hashes(db_path) != before:
        outcome.problems.append("a read-only command changed the files")
    wrote = False
    try:
        with Store(db_path) as store:
            transcript = read_everything(store)
            found = found_damage(transcript)
            if found:
                outcome.kind = "refused"
            if baseline is not None:
                wrong = wrong_reads(transcript, baseline)
                if wrong:
                    # The b-trees (an index, say) are PRAGMA integrity_check's to
                    # check: a read through a damaged index can miss a row until then.
                    outcome.kind = "checked" if transcript["check"][0] != "ok" else "wrong"
                    outcome.errors.append(f"{outcome.kind}: {', '.join(wrong[:3])}")
            elif not found:
                try:
                    held = fingerprint(db_path)
                except UnicodeDecodeError:  # a changed value in a column no read returns
                    outcome.kind = "wrong"
                except apsw.Error as e:  # a page no read of ours touched
                    outcome.problems.append(f"damage unseen by reads and check: {e}")
                else:
                    if held not in states:
                        outcome.kind = "wrong"
            with store.turns.start("w1", template="ask", arguments={"question": "probe"}) as start:
                wrote = True
                message = {"id": "probe-message", "role": "user", "content": "probe"}
                change = HistoryChange([(10_000.0, message)], [], 0)
                store.turns.commit(
                    "w1", base_version=start.version, template="ask", change=change, state=None
                )
    except DamagedRowError as e:  # one row: the turn that needs it fails, as a turn does
        outcome.kind = outcome.kind if outcome.kind in ("wrong", "checked") else "refused"
        outcome.errors.append(str(e))
    except REFUSALS as e:
        outcome.kind = outcome.kind if outcome.kind in ("wrong", "checked") else "refused"
        outcome.errors.append(str(e))
        if "backup" not in str(e):
            outcome.problems.append(f"the refusal does not say what to do: {e}")
        after = file_hashes(db_path)
        if after.get("") != before.get("") or (not wrote and after != before):
            outcome.problems.append(f"the refusal changed the file: {e}")
    except NotFoundError:  # a damaged version number: the history of -4 is not found
        outcome.kind = "wrong"
    except DurableError as e:
        outcome.problems.append(f"an unexpected DurableError: {type(e).__name__}: {e}")
    except Exception as e:
        outcome.problems.append(f"Store raised {type(e).__name__}: {e}")
    if outcome.kind == "recovered" and not outcome.problems:
        with Store(db_path) as store:
            integrity = store.check()["integrity"]
        if integrity != "ok":
            outcome.problems.append(f"integrity_check after a turn: {integrity!r}")
    return outcome


@contextlib.contextmanager
def case_path(root: Path) -> Iterator[Path]:
    """A fresh directory for one damaged copy, removed afterwards."""
    directory = Path(tempfile.mkdtemp(dir=root))
    try:
        yield directory / "state.db"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
