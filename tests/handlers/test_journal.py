"""The workflow journal: replay without model calls, divergence, threads, nesting, reset."""

import dataclasses
import logging
import threading
from typing import TypedDict

import pydantic
import pytest
from effectful.handlers.llm import Template
from effectful.ops.types import NotHandled
from helpers import Assistant, Manager, persisted, persisted_rows, running

from effectful_durable import (
    PersistenceHandler,
    StateSerializationError,
    Store,
    WorkflowDivergedError,
)
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall


def echo(call: FakeCall) -> str:
    return f"re: {call.last_user_text}"


def program(store_url: str, llm: FakeLLM, workflow: str = "wf", question: str = "b?") -> list[str]:
    """A three-step workflow over two agents."""
    with persisted(store_url, llm, workflow=workflow):
        alice, bob = Assistant(agent_id="alice"), Assistant(agent_id="bob")
        return [alice.ask("a1?"), bob.ask(question), alice.ask("a2?")]


class Estimate(TypedDict):
    low: int
    high: int


@dataclasses.dataclass
class Verdict:
    ok: bool
    reasons: list[str]


class Report(pydantic.BaseModel):
    title: str
    score: float


@dataclasses.dataclass
class Analyst(Assistant):
    @Template.define
    def count(self, thing: str) -> int:
        """How many {thing}?"""
        raise NotHandled

    @Template.define
    def names(self, thing: str) -> list[str]:
        """Name some {thing}."""
        raise NotHandled

    @Template.define
    def estimate(self, thing: str) -> Estimate:
        """Estimate {thing}."""
        raise NotHandled

    @Template.define
    def verdict(self, thing: str) -> Verdict:
        """Judge {thing}."""
        raise NotHandled

    @Template.define
    def report(self, thing: str) -> Report:
        """Report on {thing}."""
        raise NotHandled

    @Template.define
    def handle(self, thing: str) -> threading.Lock:
        """Impossible: {thing}."""
        raise NotHandled


class TestReplay:
    def test_second_run_makes_no_model_call(self, store_url: str) -> None:
        """Re-running a finished workflow replays every step from the journal."""
        first = program(store_url, FakeLLM(respond=echo))
        versions = {a: len(Store(store_url).versions(a)) for a in ("alice", "bob")}
        llm = FakeLLM()
        assert program(store_url, llm) == first
        assert llm.call_count == 0
        assert {a: len(Store(store_url).versions(a)) for a in ("alice", "bob")} == versions

    def test_structured_results_come_back_typed(self, store_url: str) -> None:
        """int, list, TypedDict, dataclass and pydantic results replay with their types."""
        answers = [
            3,
            ["x", "y"],
            {"low": 1, "high": 2},
            Verdict(True, ["fine"]),
            Report(title="t", score=0.5),
        ]

        def run(llm: FakeLLM) -> list[object]:
            with persisted(store_url, llm, workflow="typed"):
                a = Analyst(agent_id="analyst")
                return [a.count("x"), a.names("x"), a.estimate("x"), a.verdict("x"), a.report("x")]

        assert run(FakeLLM(answers)) == answers
        replayed = run(FakeLLM())
        assert replayed == answers
        assert isinstance(replayed[3], Verdict) and isinstance(replayed[4], Report)

    def test_unstorable_result_type_fails_before_the_model_is_called(self, store_url: str) -> None:
        """A step whose return type cannot be JSON is refused before it costs a call."""
        llm = FakeLLM(["never"])
        with (
            persisted(store_url, llm, workflow="bad"),
            pytest.raises(StateSerializationError, match="return"),
        ):
            Analyst(agent_id="analyst").handle("x")
        assert llm.call_count == 0

    def test_free_templates_are_steps_too(self, store_url: str) -> None:
        """A template outside any agent is journaled and replayed."""

        @Template.define
        def headline(topic: str) -> str:
            """Write a headline about {topic}."""
            raise NotHandled

        def run(llm: FakeLLM) -> str:
            with persisted(store_url, llm, workflow="free"):
                return headline("rain")

        assert run(FakeLLM(["Rain!"])) == "Rain!"
        llm = FakeLLM()
        assert run(llm) == "Rain!" and llm.call_count == 0
        assert [s.key for s in Store(store_url).steps("free")] == ["headline#0"]

    def test_progress_is_logged(self, store_url: str, caplog: pytest.LogCaptureFixture) -> None:
        """Each step logs live and done, and replayed on the next run."""
        caplog.set_level(logging.INFO, logger="effectful_durable.journal")
        program(store_url, FakeLLM(respond=echo))
        program(store_url, FakeLLM())
        outcomes = [(r.step_key, r.outcome) for r in caplog.records]  # type: ignore[attr-defined]
        assert outcomes == [
            ("alice#0", "live"),
            ("alice#0", "done"),
            ("bob#0", "live"),
            ("bob#0", "done"),
            ("alice#1", "live"),
            ("alice#1", "done"),
            ("alice#0", "replayed"),
            ("bob#0", "replayed"),
            ("alice#1", "replayed"),
        ]


class TestResume:
    def test_failed_step_runs_again_and_is_told_once(self, store_url: str) -> None:
        """After a failure, the re-run replays done steps and redoes the failed one."""
        with pytest.raises(RuntimeError):
            program(store_url, FakeLLM(["a1", RuntimeError("provider down")]))
        llm = FakeLLM(["b", "a2"])
        assert program(store_url, llm) == ["a1", "b", "a2"]
        assert llm.call_count == 2
        assert "did not complete" in str(llm.calls[0].messages[0])
        assert "did not complete" not in str(llm.calls[1].messages[0])
        statuses = [(s.key, s.status) for s in Store(store_url).steps("wf")]
        assert statuses == [("alice#0", "done"), ("bob#0", "done"), ("alice#1", "done")]

    def test_divergence_is_refused_and_writes_nothing(self, store_url: str) -> None:
        """A step with other arguments than recorded raises WorkflowDivergedError."""
        program(store_url, FakeLLM(respond=echo))
        before = persisted_rows(store_url, "SELECT count(*) FROM messages")
        with pytest.raises(WorkflowDivergedError) as info:
            program(store_url, FakeLLM(respond=echo), question="something else?")
        message = str(info.value)
        assert "bob#0" in message and "b?" in message and "something else?" in message
        assert persisted_rows(store_url, "SELECT count(*) FROM messages") == before
        assert Store(store_url).handoffs() == []

    def test_parallel_agents_resume_in_any_interleaving(self, store_url: str) -> None:
        """Steps on agents driven from threads keep their keys whatever the schedule."""

        def run(llm: FakeLLM) -> dict[str, list[str]]:
            persistence = PersistenceHandler(store_url, workflow="parallel")
            results: dict[str, list[str]] = {}

            def coder(name: str) -> None:
                with running(llm, persistence):
                    agent = Assistant(agent_id=name)
                    results[name] = [agent.ask(f"{name} task {i}") for i in range(3)]

            threads = [threading.Thread(target=coder, args=(f"coder-{i}",)) for i in range(4)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            persistence.close()
            return results

        first = run(FakeLLM(respond=echo))
        llm = FakeLLM()
        assert run(llm) == first and llm.call_count == 0
        assert len(Store(store_url).steps("parallel")) == 12

    def test_nested_step_is_replayed_when_its_parent_runs_again(self, store_url: str) -> None:
        """If the parent failed after the nested agent committed, the nested turn replays."""
        researcher_first = [
            ToolCall("delegate", {"question": "facts?"}),
            "the facts",
            RuntimeError("crash"),
        ]

        def run(llm: FakeLLM) -> str:
            with persisted(store_url, llm, workflow="nested"):
                researcher = Assistant(agent_id="researcher")
                return Manager(agent_id="manager", researcher=researcher).plan("launch")

        with pytest.raises(RuntimeError):
            run(FakeLLM(researcher_first))
        llm = FakeLLM([ToolCall("delegate", {"question": "facts?"}), "the plan"])
        assert run(llm) == "the plan"
        assert llm.call_count == 2  # the manager's two calls; the researcher replayed
        researcher_users = [
            m for m in Store(store_url).history("researcher") if m["role"] == "user"
        ]
        assert len(researcher_users) == 1
        keys = [s.key for s in Store(store_url).steps("nested")]
        assert keys == ["manager#0", "manager#0/researcher#0"]


class TestManagement:
    def test_workflows_and_steps_are_listed(self, store_url: str) -> None:
        """workflows() counts steps by status; steps() lists them in order."""
        program(store_url, FakeLLM(respond=echo))
        [info] = Store(store_url).workflows()
        assert (info.workflow, info.steps, info.done, info.running, info.failed) == (
            "wf",
            3,
            3,
            0,
            0,
        )
        steps = Store(store_url).steps("wf")
        assert [(s.number, s.agent_id, s.template, s.version) for s in steps] == [
            (1, "alice", "ask", 1),
            (2, "bob", "ask", 1),
            (3, "alice", "ask", 2),
        ]
        assert (
            steps[1].arguments == {"question": "b?"}
            and steps[1].result == "re: Answer the question: b?"
        )

    def test_reset_reruns_later_steps_without_duplicates(self, store_url: str) -> None:
        """reset_workflow(k) keeps steps before k and re-runs k and later afresh."""
        program(store_url, FakeLLM(respond=echo))
        reset = Store(store_url).reset_workflow("wf", from_step=2)
        assert (reset.rolled_back, reset.deleted, reset.steps) == (("alice",), ("bob",), 2)
        llm = FakeLLM(respond=echo)
        program(store_url, llm)
        assert llm.call_count == 2
        store = Store(store_url)
        for agent_id in ("alice", "bob"):
            users = [
                m["content"][0]["text"] for m in store.history(agent_id) if m["role"] == "user"
            ]
            assert len(users) == len(set(users))
        assert [s.status for s in store.steps("wf")] == ["done"] * 3

    def test_unknown_workflow_is_a_clear_error(self, store_url: str) -> None:
        """steps() of a workflow with no journal raises NotFoundError."""
        with pytest.raises(LookupError, match="no workflow 'nope'"):
            Store(store_url).steps("nope")

    def test_empty_workflow_name_is_refused(self, store_url: str) -> None:
        """A blank workflow name is a ValueError."""
        with pytest.raises(ValueError, match="workflow must be"):
            PersistenceHandler(store_url, workflow=" ")
