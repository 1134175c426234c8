"""The dry run of a workflow's program: steps answered from the journal, a wait for an
event among them, the first live step, a divergence, and the program's own error."""

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
from effectful.handlers.llm import Template
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled
from helpers import persisted

from effectful_durable import (
    PersistentAgent,
    Store,
    TurnSuspended,
    check_upgrade,
    wait_for_event,
)
from effectful_durable.store.parts.events import WAIT_PREFIX
from effectful_durable.testing import FakeLLM


@dataclasses.dataclass
class Planner(PersistentAgent):
    """You plan."""

    @Template.define
    def plan(self, goal: str) -> str:
        """Plan: {goal}"""
        raise NotHandled


def program(goals: list[str], *, then: Callable[[], None] = lambda: None) -> Any:
    """A workflow that plans each goal, waits for the event "go", then does ``then``."""

    def run(persistence: Callable[..., Any]) -> None:
        with handler(persistence(workflow="wf")):
            planner = Planner(agent_id="planner")
            for goal in goals:
                planner.plan(goal)
            wait_for_event(planner, "go", timeout=3600)
            then()

    return run


@pytest.fixture
def waiting(store_url: str) -> str:
    """Two steps done, the third waits for the event "go"."""
    with persisted(store_url, FakeLLM(["a", "b"]), workflow="wf"):
        planner = Planner(agent_id="planner")
        planner.plan("x")
        planner.plan("y")
        with pytest.raises(TurnSuspended):
            wait_for_event(planner, "go", timeout=3600)
    return store_url


def dry(db: str, run: Any) -> Any:
    model = FakeLLM()
    with handler(model):
        report = check_upgrade(db, agents=lambda i: Planner(agent_id=i), workflow=run)
    assert model.calls == []
    [found] = report.workflows
    return found


class TestDryRun:
    def test_goes_live_at_the_wait(self, waiting: str) -> None:
        """Steps 1-2 replay; the wait, not yet answered, is where the program goes live."""
        run = dry(waiting, program(["x", "y"]))
        assert run.replayed == (1, 2) and run.carries_over
        assert run.live_at == {"number": 3, "key": "planner#2", "template": WAIT_PREFIX + "go"}
        assert run.summary == f"replays steps 1–2, goes live at 3 (planner#2 {WAIT_PREFIX}go)"

    def test_the_answered_wait_replays_then_the_program_fails(self, waiting: str) -> None:
        """With the event taken, the wait replays too; an error of the program's own after
        it is reported, and does not carry over."""
        with Store(waiting) as store:
            store.send_event("planner", "go", {"ok": True})

        def boom() -> None:
            raise RuntimeError("the new code broke here")

        run = dry(waiting, program(["x", "y"], then=boom))
        assert run.replayed == (1, 2, 3) and not run.carries_over
        assert run.error == "RuntimeError: the new code broke here"
        assert "then stops: RuntimeError" in run.summary

    def test_divergence(self, waiting: str) -> None:
        """A step asked with other arguments: the divergence, recorded against asked."""
        run = dry(waiting, program(["x", "z"]))
        assert run.replayed == (1,)
        assert run.diverged == {
            "number": 2,
            "key": "planner#1",
            "recorded": 'plan({"goal":"y"})',
            "asked": 'plan({"goal":"z"})',
        }

    def test_a_program_without_a_workflow(self, waiting: str) -> None:
        """A program that installs no workflow goes live at its first call."""

        def run(persistence: Callable[..., Any]) -> None:
            with handler(persistence()):
                Planner(agent_id="planner").plan("x")

        found = dry(waiting, run)
        assert found.live_at is not None and found.live_at["key"] == "plan"
        assert found.summary == "replays no step, goes live at once (plan): no workflow named"
