"""Promise 4: one agent is never silently forked; different agents run concurrently.

On SQLite and PostgreSQL alike, from threads of one process and from processes.
"""

import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import Assistant, integrity, running, texts
from paths import ROOT

from effectful_durable import AgentInUseError, PersistenceHandler, Store
from effectful_durable.testing import FakeCall, FakeLLM, ToolCall


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
    def test_eight_threads_on_eight_agents_lose_nothing(
        self, store_url: str, handler_for: Any
    ) -> None:
        """64 turns from 8 threads over 8 shared agents all commit, with no lost update."""
        persistence = handler_for(store_url, wait=60)
        llm = FakeLLM(respond=remember_then_answer)

        def work(thread: int) -> None:
            with running(llm, persistence):
                for step in range(8):
                    agent = Assistant(agent_id=f"agent-{(thread + step) % 8}")
                    agent.ask(f"from t{thread} step {step}")

        assert run_threads(8, work) == []
        with Store(store_url) as store:
            for n in range(8):
                versions = store.versions(f"agent-{n}")
                assert [v.version for v in versions] == list(range(1, 9))
                notes = store.state(f"agent-{n}")["notes"]
                assert len(notes) == 8 and len(set(notes)) == 8
                users = [m for m in store.history(f"agent-{n}") if m["role"] == "user"]
                assert len(users) == 8
        assert integrity(store_url) == "ok"

    @pytest.mark.parametrize("handlers", ["one handler", "two handlers"])
    def test_same_agent_from_two_threads_is_refused(
        self, store_url: str, handler_for: Any, handlers: str
    ) -> None:
        """While one thread runs an agent's turn, another thread gets AgentInUseError,
        through the same PersistenceHandler or one of its own on the same database."""
        inside, release = threading.Event(), threading.Event()

        def slow(call: FakeCall) -> str:
            inside.set()
            release.wait(30)
            return "slow answer"

        persistence = handler_for(store_url)
        first = threading.Thread(
            target=lambda: _ask(persistence, FakeLLM(respond=slow), "shared"), name="first"
        )
        first.start()
        assert inside.wait(30)
        if handlers == "two handlers":
            persistence = handler_for(store_url)
        with running(FakeLLM(["never"]), persistence), pytest.raises(AgentInUseError) as info:
            Assistant(agent_id="shared").ask("second")
        release.set()
        first.join(30)
        assert info.value.agent_id == "shared"
        # The holder: the thread, or on PostgreSQL with two handlers, this process.
        assert "'first'" in str(info.value) or f"process {os.getpid()} " in str(info.value)
        with Store(store_url) as store:
            assert [v.template for v in store.versions("shared")] == ["ask"]

    def test_waiting_turn_runs_after_the_holder(self, store_url: str, handler_for: Any) -> None:
        """With wait=, the second turn waits for the first and then commits on top of it."""
        inside, release = threading.Event(), threading.Event()

        def slow(call: FakeCall) -> str:
            inside.set()
            release.wait(30)
            return "first answer"

        persistence = handler_for(store_url, wait=30)
        first = threading.Thread(target=lambda: _ask(persistence, FakeLLM(respond=slow), "shared"))
        first.start()
        assert inside.wait(30)
        threading.Timer(0.2, release.set).start()
        with running(FakeLLM(["second answer"]), persistence):
            Assistant(agent_id="shared").ask("second")
        first.join(30)
        with Store(store_url) as store:
            history = [m.get("content") for m in store.history("shared")]
        assert history[-3] == "first answer" and history[-1] == "second answer"


@pytest.fixture
def handler_for() -> Iterator[Any]:
    """Make PersistenceHandlers that are closed when the test ends."""
    made: list[PersistenceHandler] = []

    def make(db: str, **options: Any) -> PersistenceHandler:
        made.append(PersistenceHandler(db, **options))
        return made[-1]

    yield make
    for persistence in made:
        persistence.close()


def _ask(persistence: PersistenceHandler, llm: FakeLLM, agent_id: str) -> None:
    with running(llm, persistence):
        Assistant(agent_id=agent_id).ask("first")


CHILD = textwrap.dedent(
    """
    import os, sys
    os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
    from effectful_durable.testing import FakeLLM
    from helpers import Assistant, persisted

    db, agent_id, more = sys.argv[1], sys.argv[2], int(sys.argv[3])

    def block(call):
        print("in-turn", flush=True)
        sys.stdin.readline()
        return "child answer"

    with persisted(db, FakeLLM(respond=block)):
        Assistant(agent_id=agent_id).ask("from the child")
    with persisted(db, FakeLLM(respond=lambda call: f"re: {call.last_user_text}")):
        agent = Assistant(agent_id=agent_id)
        for turn in range(more):
            agent.ask(f"turn {turn}")
    print("committed", flush=True)
    """
)


def start_child(db: str, agent_id: str, more_turns: int = 0) -> subprocess.Popen[str]:
    """A process that runs a turn of ``agent_id``, prints "in-turn" inside it and waits for
    a line on stdin, then runs ``more_turns`` turns and prints "committed"."""
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, db, agent_id, str(more_turns)],
        cwd=ROOT,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )


@pytest.mark.slow
class TestProcesses:
    def test_agents_run_at_once_in_processes_and_each_in_one(self, store_url: str) -> None:
        """Three processes are inside turns of three agents at once, while another process
        is refused each of those agents and runs a fourth one."""
        children = [start_child(store_url, agent_id, more_turns=3) for agent_id in WORKERS]
        persistence = PersistenceHandler(store_url)
        try:
            for child in children:  # all three are in a turn before any may finish it
                assert child.stdout is not None
                assert child.stdout.readline().strip() == "in-turn"
            with running(FakeLLM(["parallel"]), persistence):
                for agent_id, child in zip(WORKERS, children, strict=True):
                    with pytest.raises(AgentInUseError) as info:
                        Assistant(agent_id=agent_id).ask("from the parent")
                    assert f"process {child.pid}" in str(info.value)
                Assistant(agent_id="other").ask("meanwhile")
            for child in children:
                assert child.stdin is not None
                child.stdin.write("go\n")
                child.stdin.flush()
            for child in children:
                assert child.stdout is not None
                assert child.stdout.readline().strip() == "committed"
                assert child.wait(30) == 0
        finally:
            for child in children:
                child.kill()
            persistence.close()
        with Store(store_url) as store:
            assert [a.agent_id for a in store.agents()] == ["other", *WORKERS]
            for agent_id in WORKERS:
                assert [v.version for v in store.versions(agent_id)] == [1, 2, 3, 4]
                users = [text for text in texts(store.history(agent_id)) if text[:5] == "user:"]
                assert users[0].endswith("from the child") and len(users) == 4
            assert store.handoffs() == []
        assert integrity(store_url) == "ok"


WORKERS = ["worker-0", "worker-1", "worker-2"]
