"""Conversations: several histories per agent, shared fields, versions across them."""

import dataclasses
import json
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import Assistant, persisted, persisted_rows, running, texts
from paths import FIXTURES

from effectful_durable import (
    DurableError,
    InvalidConversationIdError,
    NotFoundError,
    PersistenceHandler,
    Store,
)
from effectful_durable.store.engine.sqlite.migrations import SCHEMA_VERSION
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall

FIXTURE = FIXTURES / "schema1.db"


def echo(call: FakeCall) -> str:
    return f"answer to {call.last_user_text}"


def questions(messages: list[dict[str, Any]]) -> list[str]:
    return [t.removeprefix("user:Answer the question: ") for t in texts(messages) if "user:" in t]


@dataclasses.dataclass
class HookedAssistant(Assistant):
    events: list[tuple[str, ...]] = dataclasses.field(default_factory=list)

    def on_new_conversation(self, conversation_id: str) -> None:
        self.events.append(("new", conversation_id))

    def on_conversation_switched(self, previous: str, current: str) -> None:
        self.events.append(("switched", previous, current))

    def on_conversation_deleted(self, conversation_id: str) -> None:
        self.events.append(("deleted", conversation_id))


class TestDefaultConversation:
    """An agent that never names a conversation uses the default one."""

    def test_unnamed_turns_land_in_default(self, store_url: str) -> None:
        """Turns of an agent that never switches are versions of the 'default' conversation."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            assert bot.current_conversation == "default"
            bot.ask("one")
        store = Store(store_url)
        assert [c.conversation for c in store.conversations("bot")] == ["default"]
        assert [v.conversation for v in store.versions("bot")] == ["default"]
        rows = persisted_rows(store_url, "SELECT DISTINCT conversation FROM messages")
        assert rows == [("default",)]


class TestSwitching:
    """Each conversation keeps its own history; fields are shared."""

    def test_block_switches_and_switches_back(self, store_url: str) -> None:
        """A with-block runs its turns in the named conversation, then returns."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            bot.ask("d1")
            with bot.conversation("c-42") as name:
                assert name == bot.current_conversation == "c-42"
                assert list(bot.__history__) == []
                bot.ask("c1")
                bot.ask("c2")
            assert bot.current_conversation == "default"
            assert questions(list(bot.__history__.values())) == ["d1"]
            bot.ask("d2")
        store = Store(store_url)
        assert questions(store.history("bot")) == ["d1", "d2"]
        assert questions(store.history("bot", conversation="c-42")) == ["c1", "c2"]
        assert [v.conversation for v in store.versions("bot")] == [
            "default",
            "c-42",
            "c-42",
            "default",
        ]
        infos = {c.conversation: c for c in store.conversations("bot")}
        assert (infos["c-42"].messages, infos["c-42"].created_in) == (5, 2)
        assert (infos["default"].messages, infos["default"].last_version) == (5, 4)

    def test_fields_are_shared_by_conversations(self, store_url: str) -> None:
        """A field changed in one conversation is what the others see and store."""
        llm = FakeLLM([ToolCall("remember", {"note": "from c-1"}), "ok", "fine"])
        with persisted(store_url, llm):
            bot = Assistant(agent_id="bot")
            with bot.conversation("c-1"):
                bot.ask("remember something")
            assert bot.notes == ["from c-1"]
            bot.ask("what do you know?")
        assert Store(store_url).state("bot")["notes"] == ["from c-1"]
        with persisted(store_url, FakeLLM(respond=echo)) as persistence:
            again = Assistant(agent_id="bot")
            persistence.load(again)
            assert again.notes == ["from c-1"]

    def test_new_process_resumes_a_named_conversation(self, store_url: str) -> None:
        """A fresh agent object switched to a stored conversation continues its history."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            with bot.conversation("alice"):
                bot.ask("a1")
            bot.ask("d1")
        llm = FakeLLM(respond=echo)
        with persisted(store_url, llm):
            bot = Assistant(agent_id="bot")
            bot.new_conversation("alice")
            bot.ask("a2")
        assert questions(llm.calls[0].messages) == ["a1", "a2"]
        assert questions(Store(store_url).history("bot", conversation="alice")) == ["a1", "a2"]

    def test_switch_of_a_loaded_agent_reads_the_history_at_once(self, store_url: str) -> None:
        """Under the handler, switching back shows the conversation's stored history."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            bot.ask("d1")
            with bot.conversation("c"):
                bot.ask("c1")
            assert questions(list(bot.__history__.values())) == ["d1"]
            bot.new_conversation("c")
            assert questions(list(bot.__history__.values())) == ["c1"]

    def test_without_persistence_histories_stay_in_memory(self) -> None:
        """With no database, the agent keeps the histories it switches away from."""
        llm = FakeLLM(respond=echo)
        with running(llm):
            bot = Assistant(agent_id="bot")
            bot.ask("d1")
            with bot.conversation("c"):
                bot.ask("c1")
            bot.ask("d2")
            with bot.conversation("c"):
                assert questions(list(bot.__history__.values())) == ["c1"]
        assert questions(list(bot.__history__.values())) == ["d1", "d2"]

    def test_new_conversation_makes_an_id_and_stays(self, store_url: str) -> None:
        """new_conversation() makes a fresh id and keeps it current until the next switch."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            first = bot.new_conversation()
            second = bot.new_conversation()
            assert first != second and bot.current_conversation == second
            bot.ask("q")
        assert [c.conversation for c in Store(store_url).conversations("bot")] == [second]

    def test_clear_starts_over_and_rollback_brings_it_back(self, store_url: str) -> None:
        """clear=True empties the conversation; its next turn removes the stored rows
        as one version, which a rollback undoes."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            bot.new_conversation("c")
            bot.ask("c1")
            bot.ask("c2")
            bot.new_conversation("c", clear=True)
            assert list(bot.__history__) == []
            bot.ask("c3")
        store = Store(store_url)
        assert questions(store.history("bot", conversation="c")) == ["c3"]
        assert store.versions("bot")[-1].removed == 5
        store.rollback("bot", 2)
        assert questions(store.history("bot", conversation="c")) == ["c1", "c2"]

    def test_hooks_run_after_each_event(self, store_url: str) -> None:
        """on_new_conversation, on_conversation_switched and on_conversation_deleted
        are called with the conversation ids."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = HookedAssistant(agent_id="bot")
            bot.ask("d")
            with bot.conversation("a"):
                bot.ask("a")
            bot.new_conversation("b")
            bot.delete_conversation("a")
        assert bot.events == [
            ("switched", "default", "a"),
            ("switched", "a", "default"),
            ("switched", "default", "b"),
            ("new", "b"),
            ("deleted", "a"),
        ]

    @pytest.mark.parametrize("bad", ["", " c", "x" * 201, "a\nb", 7], ids=repr)
    def test_invalid_ids_are_refused(self, bad: Any) -> None:
        """A conversation id follows the agent id rules; a bad one changes nothing."""
        bot = Assistant(agent_id="bot")
        with pytest.raises(InvalidConversationIdError), bot.conversation(bad):
            pass
        assert bot.current_conversation == "default"

    def test_switching_during_a_turn_is_refused(self, store_url: str) -> None:
        """A switch from inside one of the agent's turns fails that turn, not the history."""
        bot = Assistant(agent_id="bot")

        def switch(call: FakeCall) -> str:
            bot.new_conversation("elsewhere")
            return "unreachable"

        with persisted(store_url, FakeLLM(["ok"], respond=switch)):
            bot.ask("one")
            with pytest.raises(DurableError, match="during one of its turns"):
                bot.ask("two")
        assert bot.current_conversation == "default"
        assert questions(Store(store_url).history("bot")) == ["one"]


class TestVersions:
    """Versions are one sequence per agent; rollback and fork take every conversation."""

    def test_rollback_restores_every_conversation(self, store_url: str) -> None:
        """Rolling back to v restores each conversation's history and removes later ones."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            bot.ask("d1")  # v1
            with bot.conversation("a"):
                bot.ask("a1")  # v2
            bot.ask("d2")  # v3
            with bot.conversation("b"):
                bot.ask("b1")  # v4
        store = Store(store_url)
        assert store.rollback("bot", 2) == 5
        assert questions(store.history("bot")) == ["d1"]
        assert questions(store.history("bot", conversation="a")) == ["a1"]
        assert [c.conversation for c in store.conversations("bot")] == ["a", "default"]
        with pytest.raises(NotFoundError, match="no conversation 'b'"):
            store.history("bot", conversation="b")
        assert questions(store.history("bot", 4, conversation="b")) == ["b1"]
        # The agent in a new process continues from the rolled-back state.
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            with bot.conversation("a"):
                bot.ask("a2")
        assert questions(store.history("bot", conversation="a")) == ["a1", "a2"]

    def test_fork_copies_every_conversation(self, store_url: str) -> None:
        """A fork at v holds each conversation as it was at v."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            bot.ask("d1")
            with bot.conversation("a"):
                bot.ask("a1")
                bot.ask("a2")
        store = Store(store_url)
        store.fork("bot", 2, "copy")
        assert [c.conversation for c in store.conversations("copy")] == ["a", "default"]
        assert questions(store.history("copy", conversation="a")) == ["a1"]
        assert questions(store.history("copy")) == ["d1"]

    def test_delete_conversation_is_a_version(self, store_url: str) -> None:
        """Deleting a conversation commits a version; earlier versions still read it."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            bot.ask("d1")
            with bot.conversation("a"):
                bot.ask("a1")
            bot.delete_conversation("a")
            bot.ask("d2")  # the agent in memory follows its own deletion
        store = Store(store_url)
        kinds = [(v.kind, v.conversation, v.removed) for v in store.versions("bot")]
        assert kinds[2] == ("delete", "a", 3)
        assert [c.conversation for c in store.conversations("bot")] == ["default"]
        assert questions(store.history("bot", 2, conversation="a")) == ["a1"]
        store.rollback("bot", 2)
        assert questions(store.history("bot", conversation="a")) == ["a1"]
        with pytest.raises(NotFoundError, match="no conversation 'zzz'"):
            store.delete_conversation("bot", "zzz")

    def test_current_conversation_cannot_be_deleted(self, store_url: str) -> None:
        """Deleting the conversation in use is refused; switch away first."""
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            bot.ask("d1")
            with pytest.raises(DurableError, match="it is the current one"):
                bot.delete_conversation("default")
        assert questions(Store(store_url).history("bot")) == ["d1"]

    def test_prune_keeps_later_versions_exact(self, store_url: str) -> None:
        """The conversations part prunes only rows no version from keep_from on needs."""
        from effectful_durable.store.parts.conversations import Conversations

        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            for name in ("a", "b"):
                with bot.conversation(name):
                    bot.ask(name)  # v1, v2
            bot.delete_conversation("a")  # v3
            bot.ask("d")  # v4
        store = Store(store_url)
        before = {v: store.conversations("bot", v) for v in (3, 4)}
        with store.engine.writing() as conn:
            Conversations().prune(conn, "bot", 3)
        assert persisted_rows(store_url, "SELECT count(*) FROM conversations") == [(2,)]
        assert {v: store.conversations("bot", v) for v in (3, 4)} == before
        store.rollback("bot", 3)
        assert [c.conversation for c in store.conversations("bot")] == ["b"]


class TestHandoffsAndJournal:
    """The crash handoff and the workflow journal are per conversation."""

    def test_failed_turn_is_told_in_its_own_conversation(self, store_url: str) -> None:
        """A failure in one conversation is noted to that conversation's next turn only."""
        llm = FakeLLM(["a1", RuntimeError("model down"), "d1", "a2"])
        with persisted(store_url, llm):
            bot = Assistant(agent_id="bot")
            with bot.conversation("a"):
                bot.ask("a1")
                with pytest.raises(RuntimeError):
                    bot.ask("lost")
            [handoff] = Store(store_url).handoffs()
            assert (handoff.conversation, handoff.status) == ("a", "failed")
            bot.ask("d1")
            with bot.conversation("a"):
                bot.ask("a2")
        assert "did not complete" not in str(llm.calls[2].messages[0])
        assert "`ask` called with" in str(llm.calls[3].messages[0])
        assert Store(store_url).handoffs() == []

    def test_journal_counts_steps_per_conversation(self, store_url: str) -> None:
        """Steps are keyed per conversation, and a re-run replays each without the model."""

        def run(llm: FakeLLM) -> list[str]:
            with persisted(store_url, llm, workflow="w"):
                bot = Assistant(agent_id="bot")
                out = [bot.ask("d")]
                with bot.conversation("c-1"):
                    out.append(bot.ask("c"))
                out.append(bot.ask("d again"))
            return out

        first = run(FakeLLM(respond=echo))
        replayed = FakeLLM([])
        assert run(replayed) == first and replayed.calls == []
        steps = Store(store_url).steps("w")
        assert [(s.key, s.conversation) for s in steps] == [
            ("bot#0", "default"),
            ("bot@c-1#0", "c-1"),
            ("bot#1", "default"),
        ]


class TestTwoThreads:
    """Two conversations of one agent driven at once: the agent's lock serialises them."""

    def test_no_update_is_lost(self, store_url: str) -> None:
        """Two threads, two objects of one agent in two conversations, waiting for the
        lock: every turn commits, each history holds its own turns, no field update
        is lost."""
        turns = 6
        errors: list[BaseException] = []
        start = threading.Barrier(2)

        def drive(conversation: str) -> None:
            def respond(call: FakeCall) -> Any:
                if call.messages[-1]["role"] == "tool":
                    return "done"
                return ToolCall("remember", {"note": f"{conversation}:{call.last_user_text}"})

            try:
                persistence = PersistenceHandler(store_url, wait=30)
                with running(FakeLLM(respond=respond), persistence):
                    bot = Assistant(agent_id="bot")
                    bot.new_conversation(conversation)
                    start.wait()
                    for turn in range(turns):
                        bot.ask(f"{conversation}-{turn}")
                persistence.close()
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=drive, args=(c,)) for c in ("a", "b")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        store = Store(store_url)
        assert len(store.versions("bot")) == 2 * turns
        assert len(store.state("bot")["notes"]) == 2 * turns
        for conversation in ("a", "b"):
            asked = questions(store.history("bot", conversation=conversation))
            assert asked == [f"{conversation}-{turn}" for turn in range(turns)]

    def test_same_object_cannot_switch_under_a_running_turn(self, store_url: str) -> None:
        """Another thread switching an agent object mid-turn gets a clear error."""
        inside, release = threading.Event(), threading.Event()

        def slow(call: FakeCall) -> str:
            inside.set()
            release.wait(10)
            return "ok"

        bot = Assistant(agent_id="bot")
        outcome: list[BaseException] = []

        def other() -> None:
            inside.wait(10)
            try:
                bot.new_conversation("x")
            except DurableError as error:
                outcome.append(error)
            release.set()

        thread = threading.Thread(target=other)
        thread.start()
        with persisted(store_url, FakeLLM(respond=slow)):
            bot.ask("q")
        thread.join()
        assert len(outcome) == 1 and "during one of its turns" in str(outcome[0])
        assert bot.current_conversation == "default"


class TestSchema1Migration:
    """A database written by the first release (schema 1) opens unchanged."""

    @pytest.fixture
    def old_db(self, tmp_path: Path) -> Path:
        path = tmp_path / "old.db"
        shutil.copy(FIXTURE, path)
        return path

    def test_rows_land_in_the_default_conversation(self, old_db: Path) -> None:
        """History, compactions, versions, state, handoff and journal read back as before."""
        assert persisted_rows(old_db, "PRAGMA user_version") == [(1,)]
        with Store(old_db) as store:
            assert [(v.version, v.kind, v.conversation) for v in store.versions("bot")] == [
                (1, "turn", "default"),
                (2, "turn", "default"),
                (3, "turn", "default"),
                (4, "turn", "default"),
                (5, "compaction", "default"),
                (6, "turn", "default"),
            ]
            assert len(store.history("bot")) == 6
            assert len(store.history("bot", include_compacted=True)) == 12
            assert store.search_compacted("bot", "apples")
            assert store.state("bot")["notes"] == ["apples", "pears", "plums", "figs", "kiwis"]
            [handoff] = store.handoffs()
            assert (handoff.conversation, handoff.status) == ("default", "failed")
            steps = store.steps("nightly")
            assert [s.conversation for s in steps] == ["default"] * 5
            assert [c.conversation for c in store.conversations("bot")] == ["default"]
            assert [v.conversation for v in store.versions("bot-copy")] == [None, None]
            assert questions(store.history("bot-copy")) == questions(store.history("bot", 3))
            assert store.check()["integrity"] == "ok"
        assert persisted_rows(old_db, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
        assert persisted_rows(old_db, "PRAGMA foreign_key_check") == []

    def test_agent_continues_after_migration(self, old_db: Path) -> None:
        """The migrated agent is told of its failed turn and appends to its history."""
        llm = FakeLLM(respond=echo)
        with persisted(old_db, llm):
            bot = Assistant(agent_id="bot")
            bot.ask("dates")
            with bot.conversation("new"):
                bot.ask("fresh")
        assert "model down" in str(llm.calls[0].messages[0])
        store = Store(old_db)
        assert questions(store.history("bot"))[-1] == "dates"
        assert questions(store.history("bot", conversation="new")) == ["fresh"]
        store.rollback("bot", 5)
        assert len(store.history("bot")) == 4


class TestCommandLine:
    """The command line lists, reads and deletes conversations."""

    @pytest.fixture
    def db(self, store_url: str) -> str:
        with persisted(store_url, FakeLLM(respond=echo)):
            bot = Assistant(agent_id="bot")
            bot.ask("d1")  # v1
            with bot.conversation("alice"):
                bot.ask("a1")  # v2
                bot.ask("a2")  # v3
        return str(store_url)

    def test_conversations_lists_them(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """`conversations DB AGENT` prints a table, or JSON with --json, and --version."""
        from effectful_durable.cli import main

        assert main(["conversations", db, "bot"]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[0].split()[:4] == ["conversation", "messages", "created_in", "last_version"]
        assert [line.split()[:4] for line in lines[1:]] == [
            ["alice", "5", "2", "3"],
            ["default", "3", "1", "1"],
        ]
        assert main(["conversations", db, "bot", "--json", "--version", "1"]) == 0
        [only] = json.loads(capsys.readouterr().out)
        assert (only["conversation"], only["messages"]) == ("default", 3)

    def test_history_of_a_conversation(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """`history --conversation` reads that conversation; an unknown one is an error."""
        from effectful_durable.cli import main

        assert main(["history", db, "bot", "--conversation", "alice", "--json"]) == 0
        assert questions(json.loads(capsys.readouterr().out)) == ["a1", "a2"]
        assert main(["history", db, "bot", "--conversation", "bob"]) == 1
        assert "no conversation 'bob'" in capsys.readouterr().err

    def test_versions_and_delete(self, db: str, capsys: pytest.CaptureFixture[str]) -> None:
        """`delete-conversation` commits a version that `versions` shows with its conversation."""
        from effectful_durable.cli import main

        assert main(["delete-conversation", db, "bot", "alice"]) == 0
        assert "version 4 committed without conversation 'alice'" in capsys.readouterr().out
        assert main(["versions", db, "bot", "--json"]) == 0
        last = json.loads(capsys.readouterr().out)[-1]
        assert (last["kind"], last["conversation"], last["removed"]) == ("delete", "alice", 5)
        assert main(["conversations", db, "bot"]) == 0
        assert "alice" not in capsys.readouterr().out
