"""Fields declared per conversation: one value per conversation, versioned with the agent."""

import dataclasses
import shutil
from pathlib import Path

import pytest
from effectful.handlers.llm import Tool
from helpers import Assistant, persisted, persisted_rows, running
from paths import FIXTURES

from effectful_durable import Store, per_conversation
from effectful_durable.store.engine.sqlite.migrations import SCHEMA_VERSION
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

SCHEMA2 = FIXTURES / "schema2.db"


@dataclasses.dataclass
class Support(Assistant):
    ticket: str | None = per_conversation(default=None)
    seen: list[str] = per_conversation(default_factory=list)

    @Tool.define
    def open_ticket(self, ticket: str) -> str:
        """Open a ticket for this conversation."""
        self.ticket = ticket
        self.seen.append(ticket)
        return f"opened {ticket}"


def opens(ticket: str) -> list[ToolCall | str]:
    """The model's replies for a turn that opens ``ticket``."""
    return [ToolCall("open_ticket", {"ticket": ticket}), "done"]


def echo(call: FakeCall) -> str:
    return f"answer to {call.last_user_text}"


def rows(store_url: str) -> list[tuple[str, int, int | None, str]]:
    return persisted_rows(
        store_url,
        "SELECT conversation, added_in, removed_in, state FROM conversation_fields "
        "WHERE agent_id = 'bot' ORDER BY added_in, conversation",
    )


class TestValues:
    """Each conversation holds its own values; other fields stay shared."""

    def test_each_conversation_keeps_its_own_values(self, store_url: str) -> None:
        """Switching shows the conversation's values; the store reads them per conversation."""
        llm = FakeLLM([*opens("T-1"), *opens("T-2"), "ok"])
        with persisted(store_url, llm):
            bot = Support(agent_id="bot")
            bot.ask("open one")  # v1, default
            bot.notes.append("shared")
            with bot.conversation("alice"):
                assert (bot.ticket, bot.seen) == (None, [])
                bot.ask("open another")  # v2, alice
                assert (bot.ticket, bot.notes) == ("T-2", ["shared"])
            assert (bot.ticket, bot.seen) == ("T-1", ["T-1"])
            bot.ask("anything else?")  # v3, default: nothing of its own changed
        store = Store(store_url)
        assert store.state("bot")["ticket"] == "T-1"
        alice = store.state("bot", conversation="alice")
        assert (alice["ticket"], alice["seen"], alice["notes"]) == ("T-2", ["T-2"], ["shared"])
        assert "ticket" not in store.state("bot", conversation="nobody")
        assert store.state("bot", 1, conversation="alice").get("ticket") is None

    def test_a_new_process_resumes_each_conversations_values(self, store_url: str) -> None:
        """Loading and switching in a fresh process read the stored values."""
        with persisted(store_url, FakeLLM([*opens("T-1"), *opens("T-2")])):
            bot = Support(agent_id="bot")
            bot.ask("open one")
            with bot.conversation("alice"):
                bot.ask("open another")
        with persisted(store_url, FakeLLM(respond=echo)) as persistence:
            again = Support(agent_id="bot", ticket="seeded")
            persistence.load(again)
            assert again.ticket == "T-1"
            with again.conversation("alice"):
                assert (again.ticket, again.seen) == ("T-2", ["T-2"])
            with again.conversation("bob"):
                assert again.ticket is None
        with persisted(store_url, FakeLLM(respond=echo)):
            fresh = Support(agent_id="bot")
            fresh.new_conversation("alice")
            fresh.ask("where were we?")  # the first turn loads alice's values
            assert fresh.ticket == "T-2"

    def test_a_turn_writes_only_what_changed(self, store_url: str) -> None:
        """A row is added when the conversation's values change, never for other turns."""
        llm = FakeLLM([*opens("T-1"), "a", "b", *opens("T-3")])
        with persisted(store_url, llm):
            bot = Support(agent_id="bot")
            bot.ask("open one")  # v1
            bot.ask("q")  # v2
            bot.ask("q")  # v3
            bot.ask("open another")  # v4
        assert [(c, added, removed) for c, added, removed, _ in rows(store_url)] == [
            ("default", 1, 4),
            ("default", 4, None),
        ]

    def test_edits_between_turns_follow_the_switch(self, store_url: str) -> None:
        """A value set outside a turn is kept in memory across switches and committed
        by the conversation's next turn."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Support(agent_id="bot")
            bot.ask("hello")
            with bot.conversation("alice"):
                bot.ticket = "set by hand"
            assert bot.ticket is None
            with bot.conversation("alice"):
                assert bot.ticket == "set by hand"
                bot.ask("hello")
        assert Store(store_url).state("bot", conversation="alice")["ticket"] == "set by hand"

    def test_without_persistence_values_stay_in_memory(self) -> None:
        """With no database, the agent keeps each conversation's values as it switches."""
        with running(FakeLLM([*opens("T-1"), *opens("T-2")])):
            bot = Support(agent_id="bot")
            bot.ask("open one")
            with bot.conversation("alice"):
                assert bot.ticket is None
                bot.ask("open another")
            assert bot.ticket == "T-1"
            bot.new_conversation("alice")
            assert bot.ticket == "T-2"

    def test_clear_gives_the_defaults(self, store_url: str) -> None:
        """new_conversation(clear=True) starts the conversation's values over too."""
        with persisted(store_url, FakeLLM([*opens("T-1"), "ok"])):
            bot = Support(agent_id="bot")
            bot.ask("open one")
            bot.new_conversation("default", clear=True)
            assert (bot.ticket, bot.seen) == (None, [])
            bot.ask("again")
        store = Store(store_url)
        assert store.state("bot")["ticket"] is None
        assert store.state("bot", 1)["ticket"] == "T-1"

    def test_a_failed_turn_puts_the_values_back(self, store_url: str) -> None:
        """What a failed turn set is undone in memory and never stored."""
        fails = [ToolCall("open_ticket", {"ticket": "T-9"}), OSError("down")]
        llm = FakeLLM([*opens("T-1"), *fails, *fails])
        with persisted(store_url, llm):
            bot = Support(agent_id="bot")
            bot.ask("open one")
            with bot.conversation("alice"), pytest.raises(OSError):
                bot.ask("open another")
            with bot.conversation("alice"):
                assert (bot.ticket, bot.seen) == (None, [])
            with pytest.raises(OSError):
                bot.ask("will fail")
            assert (bot.ticket, bot.seen) == ("T-1", ["T-1"])
        assert [c for c, *_ in rows(store_url)] == ["default"]

    def test_a_value_must_have_a_default(self) -> None:
        """A conversation that has no value yet needs a default to show."""
        with pytest.raises(TypeError, match="needs a default"):
            per_conversation()


class TestVersions:
    """Rollback, fork, deletion and pruning carry every conversation's values exactly."""

    @pytest.fixture
    def db(self, store_url: str) -> Path:
        llm = FakeLLM([*opens("T-1"), *opens("T-2"), *opens("T-3")])
        with persisted(store_url, llm):
            bot = Support(agent_id="bot")
            bot.ask("open one")  # v1 default T-1
            with bot.conversation("alice"):
                bot.ask("open another")  # v2 alice T-2
                bot.ask("open a third")  # v3 alice T-3
        return store_url

    def test_rollback_brings_back_the_values_of_that_version(self, db: Path) -> None:
        with Store(db) as store:
            store.rollback("bot", 2)
            assert store.state("bot", conversation="alice")["seen"] == ["T-2"]
            store.rollback("bot", 1)
            assert "ticket" not in store.state("bot", conversation="alice")
            assert store.state("bot")["ticket"] == "T-1"
        with persisted(db, FakeLLM(respond=echo)):
            bot = Support(agent_id="bot")
            with bot.conversation("alice"):
                bot.ask("hello")
                assert (bot.ticket, bot.seen) == (None, [])

    def test_a_loaded_agent_follows_a_rollback_by_another_store(self, db: Path) -> None:
        with persisted(db, FakeLLM(respond=echo)) as persistence:
            bot = Support(agent_id="bot")
            persistence.load(bot)
            with bot.conversation("alice"):
                assert bot.ticket == "T-3"
            with Store(db) as other:
                other.rollback("bot", 2)
            with bot.conversation("alice"):
                bot.ask("hello")  # the turn sees the version moved and reloads
                assert bot.seen == ["T-2"]

    def test_fork_copies_every_conversations_values(self, db: Path) -> None:
        with Store(db) as store:
            store.fork("bot", 2, "copy")
            assert store.state("copy", conversation="alice")["ticket"] == "T-2"
            assert store.state("copy")["ticket"] == "T-1"

    def test_deleted_conversation_starts_over_and_rollback_restores(self, db: Path) -> None:
        with persisted(db, FakeLLM(respond=echo)):
            bot = Support(agent_id="bot")
            bot.delete_conversation("alice")  # v4
            with bot.conversation("alice"):
                assert bot.ticket is None
        with Store(db) as store:
            assert "ticket" not in store.state("bot", conversation="alice")
            store.rollback("bot", 3)
            assert store.state("bot", conversation="alice")["ticket"] == "T-3"

    def test_prune_keeps_every_retained_version_exact(self, db: Path) -> None:
        with Store(db) as store:
            before = {v: store.state("bot", v, conversation="alice") for v in (2, 3)}
            store.prune("bot", keep_versions=2)
            assert {v: store.state("bot", v, conversation="alice") for v in (2, 3)} == before
            assert store.state("bot", 2)["ticket"] == "T-1"
        assert [(c, added) for c, added, *_ in rows(db)] == [
            ("default", 1),
            ("alice", 2),
            ("alice", 3),
        ]


class TestSchema2Migration:
    """A database written by the second release (schema 2) opens unchanged."""

    @pytest.fixture
    def old_db(self, tmp_path: Path) -> Path:
        path = tmp_path / "old.db"
        shutil.copy(SCHEMA2, path)
        return path

    def test_everything_reads_back(self, old_db: Path) -> None:
        """Versions, conversations, histories, memory and forks read as the release wrote them."""
        assert persisted_rows(old_db, "PRAGMA user_version") == [(2,)]
        with Store(old_db) as store:
            assert [(v.kind, v.conversation) for v in store.versions("bot")] == [
                *[("turn", "default")] * 4,
                ("compaction", "default"),
                ("turn", "default"),
                ("turn", "alice"),
                ("turn", "bob"),
                ("delete", "bob"),
            ]
            assert [c.conversation for c in store.conversations("bot")] == ["alice", "default"]
            assert len(store.history("bot")) == 8  # the last turn called a tool
            assert len(store.history("bot", conversation="alice")) == 3
            assert len(store.history("bot", 8, conversation="bob")) == 3
            assert store.memory("bot") == store.memory("bot-copy") == {"fruit": "kiwi"}
            assert store.state("bot")["notes"] == ["apples", "pears", "plums", "figs", "remember"]
            assert store.check()["integrity"] == "ok"
        assert persisted_rows(old_db, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
        assert persisted_rows(old_db, "PRAGMA foreign_key_check") == []

    def test_a_class_with_conversation_fields_continues(self, old_db: Path) -> None:
        """Conversations stored before per-conversation fields existed show the defaults."""
        with persisted(old_db, FakeLLM([*opens("T-1")])):
            bot = Support(agent_id="bot")
            with bot.conversation("alice"):
                assert bot.ticket is None
                bot.ask("open one")
        with Store(old_db) as store:
            assert store.state("bot", conversation="alice")["ticket"] == "T-1"
            assert "ticket" not in store.state("bot")
            store.rollback("bot", 8)
            assert store.conversations("bot")[0].conversation == "alice"
