"""AlarmTools and agent.schedule under PersistenceHandler: staged in the turn, checked."""

import re

import pytest
from alarms_app import Keeper
from helpers import persisted, persisted_rows

from effectful_durable import DurableError, InvalidAlarmError, Store
from effectful_durable.testing import FakeLLM, ToolCall


def tool_texts(llm: FakeLLM) -> list[str]:
    """The text of every tool result the model was shown, in order."""
    seen: dict[str, str] = {}
    for call in llm.calls:
        for message in call.messages:
            if message["role"] == "tool":
                content = message["content"]
                text = content if isinstance(content, str) else content[0]["text"]
                seen[message["tool_call_id"]] = text
    return list(seen.values())


def alarm_rows(store_url: str) -> list[tuple]:
    return persisted_rows(
        store_url, "SELECT agent_id, action, status FROM alarms ORDER BY created_at"
    )


class TestModelTools:
    """The model schedules, lists and cancels its alarms with tools."""

    def test_scheduled_alarm_commits_with_the_turn(self, store_url: str) -> None:
        """schedule_alarm returns an id, and the alarm is on disk once the turn commits."""
        llm = FakeLLM(
            [ToolCall("schedule_alarm", {"delay_seconds": 600, "action": "check"}), "ok"]
        )
        with persisted(store_url, llm):
            Keeper(agent_id="k").ask("remind me")
        (text,) = tool_texts(llm)
        assert re.fullmatch(r"scheduled alm_[0-9a-f]{12}, due .* UTC", text)
        assert alarm_rows(store_url) == [("k", "check", "pending")]

    def test_failed_turn_schedules_nothing(self, store_url: str) -> None:
        """A turn that raises after scheduling leaves no alarm on disk."""
        llm = FakeLLM(
            [
                ToolCall("schedule_alarm", {"delay_seconds": 60, "action": "x"}),
                RuntimeError("model down"),
            ]
        )
        with persisted(store_url, llm), pytest.raises(RuntimeError):
            Keeper(agent_id="k").ask("go")
        assert alarm_rows(store_url) == []

    @pytest.mark.parametrize(
        ("arguments", "reason"),
        [
            ({"delay_seconds": -5, "action": "x"}, "delay must be"),
            ({"delay_seconds": 5, "action": ""}, "action must be a non-empty text"),
            ({"delay_seconds": 5, "action": "x" * 4001}, "at most 4000 characters"),
            ({"delay_seconds": 5, "action": "x", "every_seconds": 5}, "at least 60"),
            ({"delay_seconds": 1e12, "action": "x"}, "at most"),
            ({"delay_seconds": 5, "action": "x\x00y"}, "NUL character"),
        ],
        ids=["negative", "empty", "too-long", "too-often", "too-far", "nul"],
    )
    def test_bad_input_is_an_error_the_model_reads(
        self, store_url: str, arguments: dict, reason: str
    ) -> None:
        """Bad tool input is answered with an error text, and nothing is written."""
        llm = FakeLLM([ToolCall("schedule_alarm", arguments), "ok"])
        with persisted(store_url, llm):
            Keeper(agent_id="k").ask("go")
        (text,) = tool_texts(llm)
        assert text.startswith("error: ") and reason in text
        assert text.endswith("Nothing was scheduled.")
        assert alarm_rows(store_url) == []

    def test_list_and_cancel_in_one_turn(self, store_url: str) -> None:
        """list_alarms shows staged alarms; a cancel in the same turn leaves none."""
        with Store(store_url) as store:
            earlier = store.schedule_alarm("k", "earlier", _schedule(3600))
        llm = FakeLLM(
            [
                ToolCall("schedule_alarm", {"delay_seconds": 60, "action": "new"}),
                ToolCall("list_alarms", {}),
                ToolCall("cancel_alarm", {"alarm_id": earlier}),
                ToolCall("list_alarms", {}),
                "ok",
            ]
        )
        with persisted(store_url, llm):
            Keeper(agent_id="k").ask("go")
        _, first, cancelled, second = tool_texts(llm)
        assert "earlier" in first and "new" in first
        assert cancelled == f"cancelled {earlier}"
        assert "earlier" not in second and "new" in second
        assert sorted(alarm_rows(store_url)[i][1:] for i in range(2)) == [
            ("earlier", "cancelled"),
            ("new", "pending"),
        ]

    def test_cannot_cancel_another_agents_alarm(self, store_url: str) -> None:
        """An id of another agent's alarm is an error, and that alarm stays pending."""
        with Store(store_url) as store:
            theirs = store.schedule_alarm("other", "theirs", _schedule(60))
        llm = FakeLLM([ToolCall("cancel_alarm", {"alarm_id": theirs}), "ok"])
        with persisted(store_url, llm):
            Keeper(agent_id="k").ask("go")
        (text,) = tool_texts(llm)
        assert text.startswith("error: you have no pending alarm")
        assert alarm_rows(store_url) == [("other", "theirs", "pending")]

    def test_model_may_hold_at_most_100_alarms(self, store_url: str) -> None:
        """The 101st pending alarm of the model is refused."""
        with Store(store_url) as store:
            for n in range(100):
                store.schedule_alarm("k", f"a{n}", _schedule(60))
        llm = FakeLLM([ToolCall("schedule_alarm", {"delay_seconds": 9, "action": "x"}), "ok"])
        with persisted(store_url, llm):
            Keeper(agent_id="k").ask("go")
        (text,) = tool_texts(llm)
        assert "100 pending alarms" in text


class TestPythonSchedule:
    """agent.schedule works inside and outside a turn; bad input raises."""

    def test_outside_a_turn_writes_at_once(self, store_url: str) -> None:
        """Outside a turn the alarm is written immediately, at the agent's version."""
        with persisted(store_url, FakeLLM()):
            alarm_id = Keeper(agent_id="k").schedule("tidy", cron="0 3 * * *")
        (created_in, cron) = persisted_rows(
            store_url, "SELECT created_in, cron FROM alarms WHERE alarm_id = ?", alarm_id
        )[0]
        assert (created_in, cron) == (0, "0 3 * * *")

    def test_bad_input_raises_and_writes_nothing(self, store_url: str) -> None:
        """A bad cron string raises InvalidAlarmError for the developer."""
        with persisted(store_url, FakeLLM()), pytest.raises(InvalidAlarmError, match="cron"):
            Keeper(agent_id="k").schedule("x", cron="every day")
        assert alarm_rows(store_url) == []

    def test_without_persistence_handler_is_a_clear_error(self) -> None:
        """Scheduling with no PersistenceHandler installed says what to install."""
        with pytest.raises(DurableError, match="install PersistenceHandler"):
            Keeper(agent_id="k").schedule("x", delay=5)


def _schedule(delay: float):
    import time

    from effectful_durable.store.alarms import make_schedule

    return make_schedule(time.time(), delay=delay)
