"""Fail-safe loading: unreadable files are moved aside, never deleted; invalid fields default.

Quarantine is for SQLite files (a PostgreSQL database is refused, never moved) and
its tests stay on SQLite; the invalid fields' run on both backends.
"""

import dataclasses
import datetime
import logging
from pathlib import Path

import apsw
import pytest
from effectful.handlers.llm import Template
from effectful.ops.types import NotHandled
from helpers import OUR_POSTGRES_TABLES, begin_turn, persisted, persisted_rows

from effectful_durable import (
    DatabaseCorruptError,
    NotOurDatabaseError,
    PersistenceHandler,
    PersistentAgent,
    SchemaTooNewError,
    StateSerializationError,
    Store,
)
from effectful_durable.store.engine.seam import APPLICATION_ID
from effectful_durable.testing import FakeCall, FakeLLM


def echo(call: FakeCall) -> str:
    return f"re: {call.last_user_text}"


def quarantined(db_path: Path) -> list[Path]:
    return sorted(db_path.parent.glob(f"{db_path.name}.unreadable-*"))


class TestQuarantine:
    """on_unreadable="quarantine" moves a bad file aside and starts afresh."""

    def test_garbage_file_is_moved_aside_with_a_warning(
        self, db_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The file keeps its bytes under a new name, a warning names it, a new database starts."""
        db_path.write_bytes(b"not a database at all" * 100)
        with Store(db_path, on_unreadable="quarantine") as store:
            assert store.agents() == []
        [aside] = quarantined(db_path)
        assert aside.read_bytes() == b"not a database at all" * 100
        assert str(aside) in caplog.text and "nothing was deleted" in caplog.text
        assert Store(db_path).check()["integrity"] == "ok"

    def test_foreign_sqlite_database_moves_with_its_wal(self, db_path: Path) -> None:
        """Another program's database moves with its -wal, and still opens under the new name."""
        other = apsw.Connection(str(db_path))
        other.pragma("journal_mode", "wal")
        other.pragma("wal_autocheckpoint", 0)  # keep its rows in the -wal file
        other.execute("CREATE TABLE theirs (x); INSERT INTO theirs VALUES (42)")
        assert Path(f"{db_path}-wal").exists()
        with pytest.raises(NotOurDatabaseError):
            Store(db_path)
        Store(db_path, on_unreadable="quarantine").close()
        other.close()
        [aside, aside_wal] = [p for p in quarantined(db_path) if not p.name.endswith("-shm")]
        assert aside_wal.name == aside.name + "-wal"
        copy = apsw.Connection(str(aside))
        assert copy.execute("SELECT x FROM theirs").get == 42

    def test_damaged_database_is_moved_aside(self, db_path: Path) -> None:
        """One of our files whose schema page is overwritten is quarantined whole, not repaired."""
        with Store(db_path) as store:
            begin_turn(store, "bot", template="t", arguments={})
            store.vacuum()  # everything in the main file, nothing in the WAL
        damaged = bytearray(db_path.read_bytes())
        damaged[100:4096] = b"\xff" * (4096 - 100)  # page 1 past the header: sqlite_schema
        db_path.write_bytes(bytes(damaged))
        with pytest.raises(DatabaseCorruptError, match="is damaged"):
            Store(db_path)
        with Store(db_path, on_unreadable="quarantine") as store:
            assert store.agents() == []
        [aside] = [p for p in quarantined(db_path) if p.name[-4:] not in ("-wal", "-shm")]
        assert aside.read_bytes() == bytes(damaged)

    def test_refuse_stays_the_default(self, db_path: Path) -> None:
        """Without the option a foreign file is refused and nothing is renamed."""
        db_path.write_bytes(b"garbage")
        with pytest.raises(NotOurDatabaseError):
            Store(db_path)
        with pytest.raises(NotOurDatabaseError):
            PersistenceHandler(db_path)
        assert quarantined(db_path) == [] and db_path.read_bytes() == b"garbage"

    def test_newer_schema_is_never_quarantined(self, db_path: Path) -> None:
        """A file written by a newer version is readable by it: refused, not moved."""
        conn = apsw.Connection(str(db_path))
        conn.execute("CREATE TABLE agents (x)")
        conn.pragma("application_id", APPLICATION_ID)
        conn.pragma("user_version", 99)
        conn.close()
        with pytest.raises(SchemaTooNewError):
            Store(db_path, on_unreadable="quarantine")
        assert quarantined(db_path) == []

    def test_handler_quarantines_and_runs(self, db_path: Path) -> None:
        """PersistenceHandler(on_unreadable="quarantine") runs turns on the fresh database."""
        db_path.write_bytes(b"garbage" * 1000)
        with persisted(db_path, FakeLLM(respond=echo), on_unreadable="quarantine"):
            Bot(agent_id="bot").ask("hi")
        assert len(quarantined(db_path)) == 1
        assert Store(db_path).versions("bot")[-1].version == 1

    def test_bad_option_values_are_refused(self, db_path: Path) -> None:
        """An unknown policy, or quarantine on a read-only store, is a ValueError."""
        with pytest.raises(ValueError, match="on_unreadable"):
            Store(db_path, on_unreadable="delete")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="on_unreadable"):
            Store(db_path, readonly=True, on_unreadable="quarantine")
        with pytest.raises(ValueError, match="on_invalid_state"):
            PersistenceHandler(db_path, on_invalid_state="ignore")  # type: ignore[arg-type]

    def test_postgres_database_is_never_quarantined(self, postgres_url: str) -> None:
        """Quarantine on a PostgreSQL URL is a ValueError, and the database stays empty."""
        with pytest.raises(ValueError, match="for SQLite files"):
            Store(postgres_url, on_unreadable="quarantine")
        with pytest.raises(ValueError, match="for SQLite files"):
            PersistenceHandler(postgres_url, on_unreadable="quarantine")
        assert persisted_rows(postgres_url, OUR_POSTGRES_TABLES) == []


@dataclasses.dataclass
class Bot(PersistentAgent):
    """You answer."""

    due: str = "tomorrow"
    count: int = 0

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


@dataclasses.dataclass
class BotV2(PersistentAgent):
    """You answer."""

    due: datetime.date = dataclasses.field(default_factory=lambda: datetime.date(2030, 1, 1))
    count: int = 0

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


class TestInvalidState:
    """A stored field that no longer validates raises, or takes its default if asked."""

    def written_by_v1(self, store_url: str) -> None:
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Bot(agent_id="bot")
            bot.count = 7
            bot.ask("hi")

    def test_default_is_a_clear_error(self, store_url: str) -> None:
        """By default, loading the changed class raises StateSerializationError for the field."""
        self.written_by_v1(store_url)
        with persisted(store_url, FakeLLM(respond=echo)) as persistence:
            with pytest.raises(StateSerializationError, match=r"due"):
                persistence.load(BotV2(agent_id="bot"))

    def test_failed_load_in_a_turn_says_what_it_wrote_and_tells_the_model_briefly(
        self, store_url: str
    ) -> None:
        """A turn refused at load says what it wrote (its handoff), not "Nothing was
        written"; the next turn tells the model what failed, not the developer's advice."""
        self.written_by_v1(store_url)
        with persisted(store_url, FakeLLM(respond=echo)):
            with pytest.raises(StateSerializationError) as raised:
                BotV2(agent_id="bot").ask("again")
        error = raised.value
        assert error.field == "due"
        assert str(error).startswith("cannot load BotV2(agent_id='bot').due: ")
        assert "Nothing was written" not in str(error)
        assert "cannot be stored as JSON" not in str(error)  # the write path's words
        assert "on_invalid_state" in str(error)  # the developer's way out
        [note] = error.__notes__
        assert "handoff row was written, marked failed" in note
        with Store(store_url) as store:
            [handoff] = store.handoffs()
            assert (handoff.status, handoff.base_version) == ("failed", 1)
            assert handoff.error == f"StateSerializationError: {error}"  # kept whole
            assert store.versions("bot")[-1].version == 1

        llm = FakeLLM(respond=echo)
        with persisted(store_url, llm):
            Bot(agent_id="bot").ask("once more")  # the class that fits the stored state
        content = llm.calls[0].messages[0]["content"]
        system = content if isinstance(content, str) else " ".join(b["text"] for b in content)
        assert (
            "failed with StateSerializationError: cannot load BotV2(agent_id='bot').due: "
            "its stored value, of type str, no longer fits the field's type. Nothing from "
            "that turn was kept"
        ) in system
        for advice in ("on_invalid_state", "Annotate the field", "Nothing was written"):
            assert advice not in system

    def test_invalid_field_takes_its_default_and_the_old_value_stays(
        self, store_url: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """With on_invalid_state="default" the field defaults; history keeps the old value."""
        caplog.set_level(logging.WARNING, logger="effectful_durable.state")
        self.written_by_v1(store_url)
        with persisted(store_url, FakeLLM(respond=echo), on_invalid_state="default"):
            bot = BotV2(agent_id="bot")
            bot.ask("again")
            assert (bot.due, bot.count) == (datetime.date(2030, 1, 1), 7)
        assert "BotV2(agent_id='bot').due" in caplog.text and "default" in caplog.text
        with Store(store_url) as store:
            assert store.state("bot", 1)["due"] == "tomorrow"
            assert store.state("bot")["due"] == "2030-01-01"
