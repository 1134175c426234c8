"""A plant-care assistant that schedules its own check-backs and handles them later.

You ask it to look after a basil plant. It schedules an alarm to check back on the
soil in two hours, and a daily 07:00 tidy-up. An AgentRunner delivers those alarms
as turns of the agent: each one calls the agent's on_alarm template, whose turn may
use tools (here: send the user a note) and schedule the next check-back.
"""

# effectful puts the docstring above at the head of the agent's system prompt.
# Run it offline with `python examples/alarms/checkback.py`: the model is scripted
# (FakeLLM) and the runner's clock is fake, so two days pass in a second.

import os

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # stay offline

import argparse
import dataclasses
import logging
import re
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from effectful.handlers.llm import Template, Tool
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import (
    AgentRunner,
    AlarmTools,
    PersistenceHandler,
    PersistentAgent,
    RunnerConfig,
    Store,
)
from effectful_durable.runner import FakeClock
from effectful_durable.testing import FakeCall, FakeLLM, Reply, ToolCall

START = datetime(2026, 6, 1, 9, 0, tzinfo=UTC).timestamp()


# -- The agent: AlarmTools gives its model schedule_alarm, list_alarms, cancel_alarm --
@dataclasses.dataclass
class PlantCarer(PersistentAgent, AlarmTools):
    """You look after the user's plants and tell them when to act."""

    notes_sent: list[str] = dataclasses.field(default_factory=list)  # persisted

    @Tool.define
    def notify(self, message: str) -> str:
        """Send the user a short note."""
        self.notes_sent.append(message)
        return "sent"

    @Template.define
    def ask(self, request: str) -> str:
        """{request}"""
        raise NotHandled


# -- The scripted model: what a real one would plausibly do with these prompts ------
def model(call: FakeCall) -> Reply:
    """Answer each request of the example from what it asks."""
    last = call.messages[-1]
    text = call.last_user_text
    if last["role"] == "tool":  # a tool answered: finish the turn
        return "Done."
    found = re.search(r"The alarm's action: (.*)", text)
    if found and "basil" in found[1]:  # the check-back: tell the user
        return ToolCall("notify", {"message": "Time to water the basil: the soil is dry."})
    if found:  # the daily alarm
        return ToolCall("notify", {"message": f"Daily tidy-up done ({found[1].strip()})"})
    if "basil" in text:  # the user's request: schedule a check-back in two hours
        return ToolCall(
            "schedule_alarm",
            {"delay_seconds": 7200, "action": "Check whether the basil soil is dry."},
        )
    return "I can only help with plants."


def handlers(config: RunnerConfig) -> list[Any]:
    """The runner's model stack; a real deployment returns LiteLLMProvider and retries."""
    return [LiteLLMProvider(model=config.model or "fake"), FakeLLM(respond=model)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", help="database file (default: a temporary one)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    db = Path(args.db or Path(tempfile.mkdtemp()) / "plants.db")
    clock = FakeClock(START)

    # 1. A normal turn: the user asks, the model schedules the check-back. The alarm
    #    commits in the same transaction as the turn, or not at all.
    carer = PlantCarer(agent_id="basil-carer")
    persistence = PersistenceHandler(db)
    persistence.clock = clock.now  # the example's fake time
    with handler(LiteLLMProvider(model="fake")), handler(FakeLLM(respond=model)):
        with handler(persistence):
            print("user: Please look after my basil.")
            print("carer:", carer.ask("Please look after my basil."))
            # 2. Python code schedules too, inside or outside a turn: a daily cron alarm.
            carer.schedule("tidy your notes", cron="0 7 * * *")
    persistence.close()

    with Store(db) as store:
        for alarm in store.alarms("basil-carer"):
            print(f"alarm {alarm.alarm_id}: {alarm.action!r} due {alarm.due_at:%a %H:%M} UTC")

    # 3. The runner delivers each due alarm as a turn (on_alarm), here over two days
    #    of fake time; `effectful-durable run` does the same from the command line.
    with AgentRunner(
        db,
        agents=lambda agent_id: PlantCarer(agent_id=agent_id),
        handlers=handlers,
        clock=clock,
    ) as runner:
        runner.run(until=START + 2 * 86400)
        print(f"runner: {runner.turns} alarm turns, {runner.errors} errors")

    with Store(db) as store:
        state = store.state("basil-carer")
        for note in state["notes_sent"]:
            print("note to user:", note)
        print("versions:", [v.template for v in store.versions("basil-carer")])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
