"""PersistenceHandler: restore, commit per turn, failed turns, nesting, stacking."""

import dataclasses
import datetime
from pathlib import Path

import pytest
from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import RetryLLMHandler
from effectful.ops.types import NotHandled

from effectful_durable import (
    InvalidAgentIdError,
    PersistenceHandler,
    StateSerializationError,
    Store,
)
from effectful_durable.testing import FakeLLM, Raw, ToolCall
from tests.helpers import (
    Address,
    Assistant,
    Manager,
    Mood,
    PlainBot,
    Preferences,
    in_new_process,
    persisted,
    persisted_rows,
    running,
    texts,
)


class TestRestore:
    def test_history_and_state_survive_a_new_handler(self, db_path: Path) -> None:
        """A new agent object under a new handler continues the committed conversation."""
        with persisted(db_path, FakeLLM(["first answer"])):
            bot = Assistant(agent_id="bot")
            bot.turns = 7
            bot.ask("first question")
        llm = FakeLLM(["second answer"])
        with persisted(db_path, llm):
            again = Assistant(agent_id="bot")
            assert again.ask("second question") == "second answer"
        assert again.turns == 7
        assert texts(llm.calls[0].messages)[1:] == [
            "user:Answer the question: first question",
            "assistant:first answer",
            "user:Answer the question: second question",
        ]

    def test_history_and_state_survive_a_new_process(self, db_path: Path) -> None:
        """A fresh interpreter restores the history and fields committed by this one."""
        with persisted(db_path, FakeLLM(["remembered"])):
            bot = Assistant(agent_id="bot", notes=["keep me"])
            bot.ask("hello")
        script = f"""
            from effectful_durable.testing import FakeLLM
            from tests.helpers import Assistant, persisted, texts
            with persisted({str(db_path)!r}, FakeLLM(["again"])) as p:
                bot = Assistant(agent_id="bot")
                print(p.load(bot), bot.notes, texts(list(bot.__history__.values()))[-1])
            """
        out = in_new_process(script)
        assert out.strip() == "1 ['keep me'] assistant:remembered"

    def test_typed_fields_round_trip(self, db_path: Path) -> None:
        """Enums, dataclasses, pydantic models and datetimes come back with their types."""
        seen = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
        with persisted(db_path, FakeLLM(["ok"])):
            bot = Assistant(agent_id="bot", mood=Mood.BUSY, last_seen=seen)
            bot.address = Address("Lyon", datetime.date(2020, 5, 1))
            bot.preferences = Preferences(tone="warm", tags=["a"])
            bot.ask("q")
        restored = Assistant(agent_id="bot")
        PersistenceHandler(db_path).load(restored)
        assert restored.mood is Mood.BUSY
        assert restored.address == Address("Lyon", datetime.date(2020, 5, 1))
        assert restored.preferences == Preferences(tone="warm", tags=["a"])
        assert restored.last_seen == seen

    def test_ephemeral_fields_are_not_persisted(self, db_path: Path) -> None:
        """A field marked ephemeral() never reaches the database."""
        with persisted(db_path, FakeLLM(["ok"])):
            bot = Assistant(agent_id="bot", scratch=object())
            bot.ask("q")
        assert "scratch" not in Store(db_path).state("bot")
        restored = Assistant(agent_id="bot")
        PersistenceHandler(db_path).load(restored)
        assert restored.scratch is None

    def test_database_values_win_over_constructor_values(self, db_path: Path) -> None:
        """Constructor arguments only seed a new agent; stored values win afterwards."""
        with persisted(db_path, FakeLLM(["ok"])):
            Assistant(agent_id="bot", turns=1).ask("q")
        bot = Assistant(agent_id="bot", turns=99)
        assert PersistenceHandler(db_path).load(bot) == 1
        assert bot.turns == 1

    def test_later_turns_do_not_reread_the_history(self, db_path: Path) -> None:
        """After the first turn the agent's history is not loaded again."""
        with persisted(db_path, FakeLLM(["a", "b"])) as persistence:
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            loads = []
            original = persistence.store.load_agent
            persistence.store.load_agent = lambda agent_id: (
                loads.append(agent_id) or original(agent_id)
            )  # type: ignore[method-assign]
            bot.ask("two")
        assert loads == []

    def test_other_writer_is_picked_up(self, db_path: Path) -> None:
        """An agent object sees turns committed meanwhile through another object."""
        with persisted(db_path, FakeLLM(["a", "b", "c"])):
            first, second = Assistant(agent_id="bot"), Assistant(agent_id="bot")
            first.ask("one")
            second.ask("two")
            first.ask("three")
        history = texts(Store(db_path).history("bot"))
        assert [t for t in history if t.startswith("user")] == [
            "user:Answer the question: one",
            "user:Answer the question: two",
            "user:Answer the question: three",
        ]


class TestCommit:
    def test_each_turn_is_one_version(self, db_path: Path) -> None:
        """Every turn commits one version that records what it added."""
        with persisted(db_path, FakeLLM(["a", ToolCall("remember", {"note": "x"}), "b"])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            bot.ask("two")
        versions = Store(db_path).versions("bot")
        assert [(v.version, v.kind, v.template) for v in versions] == [
            (1, "turn", "ask"),
            (2, "turn", "ask"),
        ]
        assert versions[0].added == 3  # system, user, assistant
        assert versions[1].added == 4  # user, tool request, tool result, answer
        assert Store(db_path).state("bot")["notes"] == ["x"]

    def test_unchanged_state_is_not_stored_again(self, db_path: Path) -> None:
        """A turn that leaves the fields as they were stores no new state."""
        with persisted(db_path, FakeLLM(["a", "b"])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            bot.ask("two")
        assert [v.state_changed for v in Store(db_path).versions("bot")] == [True, False]

    def test_earlier_versions_stay_readable(self, db_path: Path) -> None:
        """history() and state() read back any committed version."""
        with persisted(db_path, FakeLLM(["a", "b"])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            bot.turns = 5
            bot.ask("two")
        store = Store(db_path)
        assert len(store.history("bot", 1)) == 3 and len(store.history("bot", 2)) == 5
        assert store.state("bot", 1)["turns"] == 0 and store.state("bot", 2)["turns"] == 5


class TestFailedTurn:
    @pytest.mark.parametrize(
        "error", [RuntimeError("boom"), KeyboardInterrupt()], ids=["exception", "ctrl-c"]
    )
    def test_memory_returns_to_last_commit(self, db_path: Path, error: BaseException) -> None:
        """A turn that raises leaves history and fields exactly as last committed."""
        llm = FakeLLM(["a", ToolCall("remember", {"note": "lost"}), error])
        with persisted(db_path, llm):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            before = list(bot.__history__.items())
            bot.turns = 42
            with pytest.raises(type(error)):
                bot.ask("two")
        assert list(bot.__history__.items()) == before
        assert bot.notes == [] and bot.turns == 0

    def test_failure_writes_no_version_and_records_the_handoff(self, db_path: Path) -> None:
        """A failed turn leaves no version on disk and a 'failed' handoff naming the error."""
        with persisted(db_path, FakeLLM(["a", RuntimeError("provider down")])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            with pytest.raises(RuntimeError):
                bot.ask("two")
        store = Store(db_path)
        assert [v.version for v in store.versions("bot")] == [1]
        [handoff] = store.handoffs()
        assert (handoff.status, handoff.template, handoff.base_version) == ("failed", "ask", 1)
        assert handoff.arguments == {"question": "two"}
        assert handoff.error == "RuntimeError: provider down"

    def test_next_turn_is_told_once_and_clears_it(self, db_path: Path) -> None:
        """The turn after a failure sees a note in its system prompt; the one after, not."""
        llm = FakeLLM([RuntimeError("provider down"), "recovered", "normal"])
        with persisted(db_path, llm):
            bot = Assistant(agent_id="bot")
            with pytest.raises(RuntimeError):
                bot.ask("one")
            bot.ask("two")
            bot.ask("three")
        notes = ["did not complete" in str(call.messages[0]["content"]) for call in llm.calls]
        assert notes == [False, True, False]
        assert '`ask` called with {"question":"one"}' in str(llm.calls[1].messages[0])
        store = Store(db_path)
        assert store.handoffs() == []
        assert (
            store.versions("bot")[0].detail["recovered"]["error"] == "RuntimeError: provider down"
        )
        assert all("did not complete" not in str(m) for m in store.history("bot"))

    def test_unserialisable_state_fails_the_turn_and_writes_nothing(self, db_path: Path) -> None:
        """A field that cannot be stored raises StateSerializationError naming it."""

        @dataclasses.dataclass
        class Holder(Assistant):
            handle: object = None

        with persisted(db_path, FakeLLM(["a"])):
            bot = Holder(agent_id="holder", handle=object())
            with pytest.raises(StateSerializationError) as info:
                bot.ask("q")
        assert info.value.field == "handle" and "holder" in str(info.value)
        assert persisted_rows(db_path, "SELECT count(*) FROM versions") == [(0,)]
        assert list(bot.__history__) == []

    def test_invalid_agent_id_is_refused(self) -> None:
        """An empty, overlong or non-printable agent id raises InvalidAgentIdError."""
        for bad in ["", " padded ", "x" * 201, "tab\there"]:
            with pytest.raises(InvalidAgentIdError):
                Assistant(agent_id=bad)
        with pytest.raises(ValueError, match="agent_id"):
            Assistant(agent_id="")


class TestNesting:
    def test_agent_called_from_a_tool_keeps_its_history(self, db_path: Path) -> None:
        """Agent B called from agent A's tool keeps its messages, as its own turn."""
        llm = FakeLLM([ToolCall("delegate", {"question": "facts?"}), "the facts", "the plan"])
        with persisted(db_path, llm):
            researcher = Assistant(agent_id="researcher")
            manager = Manager(agent_id="manager", researcher=researcher)
            assert manager.plan("launch") == "the plan"
        assert texts(list(researcher.__history__.values()))[1:] == [
            "user:Answer the question: facts?",
            "assistant:the facts",
        ]
        store = Store(db_path)
        assert texts(store.history("researcher")) == texts(list(researcher.__history__.values()))
        assert texts(store.history("manager"))[-2:] == ["tool:the facts", "assistant:the plan"]
        assert [v.version for v in store.versions("researcher")] == [1]

    def test_plain_agents_and_free_templates_pass_through(self, db_path: Path) -> None:
        """Non-persistent agents and free templates run normally and write nothing."""

        @Template.define
        def shout(text: str) -> str:
            """Shout {text}"""
            raise NotHandled

        with persisted(db_path, FakeLLM(["plain", "LOUD"])):
            plain = PlainBot()
            assert plain.ask("hi") == "plain"
            assert shout("hi") == "LOUD"
        assert len(plain.__history__) == 3
        assert persisted_rows(db_path, "SELECT count(*) FROM messages") == [(0,)]


class TestStacking:
    @pytest.mark.parametrize("order", ["retry-outside", "retry-inside"])
    def test_malformed_replies_pruned_by_retry_are_not_persisted(
        self, db_path: Path, order: str
    ) -> None:
        """With RetryLLMHandler in either order, only the good reply is committed."""

        @dataclasses.dataclass
        class Counter(Assistant):
            @Template.define
            def count(self, thing: str) -> int:
                """How many {thing}?"""
                raise NotHandled

        llm = FakeLLM([Raw("{not json"), 3])
        persistence = PersistenceHandler(db_path)
        handlers = (
            [RetryLLMHandler(), persistence]
            if order == "retry-outside"
            else [persistence, RetryLLMHandler()]
        )
        with running(llm, *handlers):
            counter = Counter(agent_id="counter")
            assert counter.count("apples") == 3
        assert llm.call_count == 2
        stored = Store(db_path).history("counter")
        assert [m["role"] for m in stored] == ["system", "user", "assistant"]
        assert "not json" not in str(stored)
        assert stored == list(counter.__history__.values())
