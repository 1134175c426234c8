"""PersistenceHandler: restore, commit per turn, failed turns, nesting, stacking."""

import dataclasses
import datetime

import pytest
from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import RetryLLMHandler
from effectful.ops.types import NotHandled
from helpers import (
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

from effectful_durable import (
    InvalidAgentIdError,
    PersistenceHandler,
    StateSerializationError,
    Store,
)
from effectful_durable.testing import FakeLLM, Raw, ToolCall


class TestRestore:
    def test_history_and_state_survive_a_new_handler(self, store_url: str) -> None:
        """A new agent object under a new handler continues the committed conversation."""
        with persisted(store_url, FakeLLM(["first answer"])):
            bot = Assistant(agent_id="bot")
            bot.turns = 7
            bot.ask("first question")
        llm = FakeLLM(["second answer"])
        with persisted(store_url, llm):
            again = Assistant(agent_id="bot")
            assert again.ask("second question") == "second answer"
        assert again.turns == 7
        assert texts(llm.calls[0].messages)[1:] == [
            "user:Answer the question: first question",
            "assistant:first answer",
            "user:Answer the question: second question",
        ]

    @pytest.mark.processes
    def test_history_and_state_survive_a_new_process(self, store_url: str) -> None:
        """A fresh interpreter restores the history and fields committed by this one."""
        with persisted(store_url, FakeLLM(["remembered"])):
            bot = Assistant(agent_id="bot", notes=["keep me"])
            bot.ask("hello")
        script = f"""
            from effectful_durable.testing import FakeLLM
            from helpers import Assistant, persisted, texts
            with persisted({str(store_url)!r}, FakeLLM(["again"])) as p:
                bot = Assistant(agent_id="bot")
                print(p.load(bot), bot.notes, texts(list(bot.__history__.values()))[-1])
            """
        out = in_new_process(script)
        assert out.strip() == "1 ['keep me'] assistant:remembered"

    def test_typed_fields_round_trip(self, store_url: str) -> None:
        """Enums, dataclasses, pydantic models and datetimes come back with their types."""
        seen = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
        with persisted(store_url, FakeLLM(["ok"])):
            bot = Assistant(agent_id="bot", mood=Mood.BUSY, last_seen=seen)
            bot.address = Address("Lyon", datetime.date(2020, 5, 1))
            bot.preferences = Preferences(tone="warm", tags=["a"])
            bot.ask("q")
        restored = Assistant(agent_id="bot")
        PersistenceHandler(store_url).load(restored)
        assert restored.mood is Mood.BUSY
        assert restored.address == Address("Lyon", datetime.date(2020, 5, 1))
        assert restored.preferences == Preferences(tone="warm", tags=["a"])
        assert restored.last_seen == seen

    def test_ephemeral_fields_are_not_persisted(self, store_url: str) -> None:
        """A field marked ephemeral() never reaches the database."""
        with persisted(store_url, FakeLLM(["ok"])):
            bot = Assistant(agent_id="bot", scratch=object())
            bot.ask("q")
        assert "scratch" not in Store(store_url).state("bot")
        restored = Assistant(agent_id="bot")
        PersistenceHandler(store_url).load(restored)
        assert restored.scratch is None

    def test_database_values_win_over_constructor_values(self, store_url: str) -> None:
        """Constructor arguments only seed a new agent; stored values win afterwards."""
        with persisted(store_url, FakeLLM(["ok"])):
            Assistant(agent_id="bot", turns=1).ask("q")
        bot = Assistant(agent_id="bot", turns=99)
        assert PersistenceHandler(store_url).load(bot) == 1
        assert bot.turns == 1

    def test_later_turns_do_not_reread_the_history(self, store_url: str) -> None:
        """After the first turn the agent's history is not loaded again."""
        with persisted(store_url, FakeLLM(["a", "b"])) as persistence:
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            loads = []
            original = persistence.store.turns.load
            persistence.store.turns.load = lambda agent_id, *conversation: (
                loads.append(agent_id) or original(agent_id, *conversation)
            )  # type: ignore[method-assign]
            bot.ask("two")
        assert loads == []

    def test_other_writer_is_picked_up(self, store_url: str) -> None:
        """An agent object sees turns committed meanwhile through another object."""
        with persisted(store_url, FakeLLM(["a", "b", "c"])):
            first, second = Assistant(agent_id="bot"), Assistant(agent_id="bot")
            first.ask("one")
            second.ask("two")
            first.ask("three")
        history = texts(Store(store_url).history("bot"))
        assert [t for t in history if t.startswith("user")] == [
            "user:Answer the question: one",
            "user:Answer the question: two",
            "user:Answer the question: three",
        ]


class TestCommit:
    def test_each_turn_is_one_version(self, store_url: str) -> None:
        """Every turn commits one version that records what it added."""
        with persisted(store_url, FakeLLM(["a", ToolCall("remember", {"note": "x"}), "b"])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            bot.ask("two")
        versions = Store(store_url).versions("bot")
        assert [(v.version, v.kind, v.template) for v in versions] == [
            (1, "turn", "ask"),
            (2, "turn", "ask"),
        ]
        assert versions[0].added == 3  # system, user, assistant
        assert versions[1].added == 4  # user, tool request, tool result, answer
        assert Store(store_url).state("bot")["notes"] == ["x"]

    def test_unchanged_state_is_not_stored_again(self, store_url: str) -> None:
        """A turn that leaves the fields as they were stores no new state."""
        with persisted(store_url, FakeLLM(["a", "b"])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            bot.ask("two")
        assert [v.state_changed for v in Store(store_url).versions("bot")] == [True, False]

    def test_earlier_versions_stay_readable(self, store_url: str) -> None:
        """history() and state() read back any committed version."""
        with persisted(store_url, FakeLLM(["a", "b"])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            bot.turns = 5
            bot.ask("two")
        store = Store(store_url)
        assert len(store.history("bot", 1)) == 3 and len(store.history("bot", 2)) == 5
        assert store.state("bot", 1)["turns"] == 0 and store.state("bot", 2)["turns"] == 5


class TestFailedTurn:
    @pytest.mark.parametrize(
        "error", [RuntimeError("boom"), KeyboardInterrupt()], ids=["exception", "ctrl-c"]
    )
    def test_memory_returns_to_last_commit(self, store_url: str, error: BaseException) -> None:
        """A turn that raises leaves history and fields exactly as last committed."""
        llm = FakeLLM(["a", ToolCall("remember", {"note": "lost"}), error])
        with persisted(store_url, llm):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            before = list(bot.__history__.items())
            bot.turns = 42
            with pytest.raises(type(error)):
                bot.ask("two")
        assert list(bot.__history__.items()) == before
        assert bot.notes == [] and bot.turns == 0

    def test_failure_writes_no_version_and_records_the_handoff(self, store_url: str) -> None:
        """A failed turn leaves no version on disk and a 'failed' handoff naming the error."""
        with persisted(store_url, FakeLLM(["a", RuntimeError("provider down")])):
            bot = Assistant(agent_id="bot")
            bot.ask("one")
            with pytest.raises(RuntimeError):
                bot.ask("two")
        store = Store(store_url)
        assert [v.version for v in store.versions("bot")] == [1]
        [handoff] = store.handoffs()
        assert (handoff.status, handoff.template, handoff.base_version) == ("failed", "ask", 1)
        assert handoff.arguments == {"question": "two"}
        assert handoff.error == "RuntimeError: provider down"

    def test_failure_whose_message_is_not_plain_text_is_recorded(self, store_url: str) -> None:
        """An error message holding a NUL or a lone surrogate is recorded, legibly."""
        with persisted(store_url, FakeLLM([RuntimeError("bad\x00byte \ud800")])):
            with pytest.raises(RuntimeError):
                Assistant(agent_id="bot").ask("one")
        [handoff] = Store(store_url).handoffs()
        assert (handoff.status, handoff.error) == ("failed", "RuntimeError: bad\\x00byte \\ud800")

    def test_next_turn_is_told_once_and_clears_it(self, store_url: str) -> None:
        """The turn after a failure sees a note in its system prompt; the one after, not."""
        llm = FakeLLM([RuntimeError("provider down"), "recovered", "normal"])
        with persisted(store_url, llm):
            bot = Assistant(agent_id="bot")
            with pytest.raises(RuntimeError):
                bot.ask("one")
            bot.ask("two")
            bot.ask("three")
        notes = ["did not complete" in str(call.messages[0]["content"]) for call in llm.calls]
        assert notes == [False, True, False]
        assert '`ask` called with {"question":"one"}' in str(llm.calls[1].messages[0])
        store = Store(store_url)
        assert store.handoffs() == []
        assert (
            store.versions("bot")[0].detail["recovered"]["error"] == "RuntimeError: provider down"
        )
        assert all("did not complete" not in str(m) for m in store.history("bot"))

    def test_unserialisable_state_fails_the_turn_and_writes_nothing(self, store_url: str) -> None:
        """A field that cannot be stored raises StateSerializationError naming it."""

        @dataclasses.dataclass
        class Holder(Assistant):
            handle: object = None

        with persisted(store_url, FakeLLM(["a"])):
            bot = Holder(agent_id="holder", handle=object())
            with pytest.raises(StateSerializationError) as info:
                bot.ask("q")
        assert info.value.field == "handle" and "holder" in str(info.value)
        assert persisted_rows(store_url, "SELECT count(*) FROM versions") == [(0,)]
        assert list(bot.__history__) == []

    def test_next_turn_is_told_what_failed_without_the_developers_advice(
        self, store_url: str
    ) -> None:
        """A library error is told to the model as its first sentence; a turn refused
        before the model ran notes that it wrote its handoff, despite "Nothing was written"."""

        @dataclasses.dataclass
        class Holder(Assistant):
            handle: object = None

        llm = FakeLLM(["a"])
        with persisted(store_url, llm):
            bot = Holder(agent_id="holder", handle=object())
            with pytest.raises(StateSerializationError) as info:
                bot.ask("q")
            bot.handle = None
            bot.ask("again")
        assert "Annotate the field" in str(info.value)  # the developer gets the advice
        assert any("handoff row was written" in note for note in info.value.__notes__)
        system = " ".join(block["text"] for block in llm.calls[0].messages[0]["content"])
        assert "it failed with StateSerializationError: cannot persist " in system
        assert (
            "Holder(agent_id='holder').handle: a value of type object cannot be stored "
            "as JSON. Nothing from that turn was kept"
        ) in system
        assert "Annotate the field" not in system and "Nothing was written" not in system

    def test_invalid_agent_id_is_refused(self) -> None:
        """An empty, overlong or non-printable agent id raises InvalidAgentIdError."""
        for bad in ["", " padded ", "x" * 201, "tab\there"]:
            with pytest.raises(InvalidAgentIdError):
                Assistant(agent_id=bad)
        with pytest.raises(ValueError, match="agent_id"):
            Assistant(agent_id="")


class TestNesting:
    def test_agent_called_from_a_tool_keeps_its_history(self, store_url: str) -> None:
        """Agent B called from agent A's tool keeps its messages, as its own turn."""
        llm = FakeLLM([ToolCall("delegate", {"question": "facts?"}), "the facts", "the plan"])
        with persisted(store_url, llm):
            researcher = Assistant(agent_id="researcher")
            manager = Manager(agent_id="manager", researcher=researcher)
            assert manager.plan("launch") == "the plan"
        assert texts(list(researcher.__history__.values()))[1:] == [
            "user:Answer the question: facts?",
            "assistant:the facts",
        ]
        store = Store(store_url)
        assert texts(store.history("researcher")) == texts(list(researcher.__history__.values()))
        assert texts(store.history("manager"))[-2:] == ["tool:the facts", "assistant:the plan"]
        assert [v.version for v in store.versions("researcher")] == [1]

    def test_plain_agents_and_free_templates_pass_through(self, store_url: str) -> None:
        """Non-persistent agents and free templates run normally and write nothing."""

        @Template.define
        def shout(text: str) -> str:
            """Shout {text}"""
            raise NotHandled

        with persisted(store_url, FakeLLM(["plain", "LOUD"])):
            plain = PlainBot()
            assert plain.ask("hi") == "plain"
            assert shout("hi") == "LOUD"
        assert len(plain.__history__) == 3
        assert persisted_rows(store_url, "SELECT count(*) FROM messages") == [(0,)]


class TestStacking:
    @pytest.mark.parametrize("order", ["retry-outside", "retry-inside"])
    def test_malformed_replies_pruned_by_retry_are_not_persisted(
        self, store_url: str, order: str
    ) -> None:
        """With RetryLLMHandler in either order, only the good reply is committed."""

        @dataclasses.dataclass
        class Counter(Assistant):
            @Template.define
            def count(self, thing: str) -> int:
                """How many {thing}?"""
                raise NotHandled

        llm = FakeLLM([Raw("{not json"), 3])
        persistence = PersistenceHandler(store_url)
        handlers = (
            [RetryLLMHandler(), persistence]
            if order == "retry-outside"
            else [persistence, RetryLLMHandler()]
        )
        with running(llm, *handlers):
            counter = Counter(agent_id="counter")
            assert counter.count("apples") == 3
        assert llm.call_count == 2
        stored = Store(store_url).history("counter")
        assert [m["role"] for m in stored] == ["system", "user", "assistant"]
        assert "not json" not in str(stored)
        assert stored == list(counter.__history__.values())
