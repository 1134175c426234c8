"""Promise 4: one agent is never silently forked; different agents run concurrently."""

import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import pytest

from effectful_durable import AgentInUseError, PersistenceHandler, Store
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall
from tests.helpers import Assistant, integrity, running

ROOT = Path(__file__).parents[1]


def remember_then_answer(call: FakeCall) -> Any:
    """Each turn asks the agent to remember its question, then answers."""
    if call.messages[-1]["role"] == "user":
        return ToolCall("remember", {"note": call.last_user_text})
    return "done"


def run_threads(count: int, target: Any) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            target(index)
        except BaseException as error:  # collected and asserted on by the test
            errors.append(error)

    threads = [threading.Thread(target=guarded, args=(i,), name=f"t{i}") for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return errors


class TestManyThreads:
    def test_eight_threads_on_eight_agents_lose_nothing(self, db_path: Path) -> None:
        """64 turns from 8 threads over 8 shared agents all commit, with no lost update."""
        persistence = PersistenceHandler(db_path, wait=60)
        llm = FakeLLM(respond=remember_then_answer)

        def work(thread: int) -> None:
            with running(llm, persistence):
                for step in range(8):
                    agent = Assistant(agent_id=f"agent-{(thread + step) % 8}")
                    agent.ask(f"from t{thread} step {step}")

        assert run_threads(8, work) == []
        store = Store(db_path)
        for n in range(8):
            versions = store.versions(f"agent-{n}")
            assert [v.version for v in versions] == list(range(1, 9))
            notes = store.state(f"agent-{n}")["notes"]
            assert len(notes) == 8 and len(set(notes)) == 8
            users = [m for m in store.history(f"agent-{n}") if m["role"] == "user"]
            assert len(users) == 8
        assert integrity(db_path) == "ok"

    def test_same_agent_from_two_threads_is_refused(self, db_path: Path) -> None:
        """While one thread runs an agent's turn, another thread gets AgentInUseError."""
        inside, release = threading.Event(), threading.Event()

        def slow(call: FakeCall) -> str:
            inside.set()
            release.wait(30)
            return "slow answer"

        persistence = PersistenceHandler(db_path)
        first = threading.Thread(
            target=lambda: _ask(persistence, FakeLLM(respond=slow), "shared"), name="first"
        )
        first.start()
        assert inside.wait(30)
        with running(FakeLLM(["never"]), persistence), pytest.raises(AgentInUseError) as info:
            Assistant(agent_id="shared").ask("second")
        release.set()
        first.join(30)
        assert info.value.agent_id == "shared" and "'first'" in str(info.value)
        assert [v.template for v in Store(db_path).versions("shared")] == ["ask"]

    def test_waiting_turn_runs_after_the_holder(self, db_path: Path) -> None:
        """With wait=, the second turn waits for the first and then commits on top of it."""
        inside, release = threading.Event(), threading.Event()

        def slow(call: FakeCall) -> str:
            inside.set()
            release.wait(30)
            return "first answer"

        persistence = PersistenceHandler(db_path, wait=30)
        first = threading.Thread(target=lambda: _ask(persistence, FakeLLM(respond=slow), "shared"))
        first.start()
        assert inside.wait(30)
        threading.Timer(0.2, release.set).start()
        with running(FakeLLM(["second answer"]), persistence):
            Assistant(agent_id="shared").ask("second")
        first.join(30)
        history = [m.get("content") for m in Store(db_path).history("shared")]
        assert history[-3] == "first answer" and history[-1] == "second answer"


def _ask(persistence: PersistenceHandler, llm: FakeLLM, agent_id: str) -> None:
    with running(llm, persistence):
        Assistant(agent_id=agent_id).ask("first")


CHILD = textwrap.dedent(
    """
    import os, sys
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from effectful_durable.testing import FakeLLM
    from tests.helpers import Assistant, persisted

    def block(call):
        print("in-turn", flush=True)
        sys.stdin.readline()
        return "child answer"

    with persisted(sys.argv[1], FakeLLM(respond=block)):
        Assistant(agent_id="shared").ask("from the child")
    print("committed", flush=True)
    """
)


@pytest.mark.slow
class TestTwoProcesses:
    def test_second_process_is_refused_and_other_agents_run(self, db_path: Path) -> None:
        """A process running agent X blocks X elsewhere but not agent Y."""
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(db_path)],
            cwd=ROOT,
            text=True,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        try:
            assert child.stdout is not None and child.stdin is not None
            assert child.stdout.readline().strip() == "in-turn"
            with running(FakeLLM(["parallel"]), PersistenceHandler(db_path)):
                with pytest.raises(AgentInUseError) as info:
                    Assistant(agent_id="shared").ask("from the parent")
                Assistant(agent_id="other").ask("meanwhile")
            assert f"process {child.pid}" in str(info.value)
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "committed"
            assert child.wait(30) == 0
        finally:
            child.kill()
        store = Store(db_path)
        assert [a.agent_id for a in store.agents()] == ["other", "shared"]
        assert store.history("shared")[-1]["content"] == "child answer"
        assert store.handoffs() == []
