"""An idle runner looks at the database once per ``poll_interval`` and claims only what it
can take: ``next_due`` and ``claim`` agree on what is claimable.

A resumption goes before its agent's alarms and events (it ends a turn already
begun), whenever it is due. While one waits to be retried, the agent's event due
now is not claimable: a runner that took it for due would try a claim, a write (on
SQLite the file's write lock), again and again.
"""

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from approvals_app import TOOL_LOG_ENV, Shop, answer, suspend
from effectful.handlers.llm.completions import LiteLLMProvider
from helpers import statements_run

from effectful_durable import AgentRunner, RunnerConfig, Store
from effectful_durable.testing import FakeLLM

#: Seconds the idle runner runs.
IDLE = 3.0
#: The claim statement (``store/alarm_queue.py``'s ``claim``), as it begins.
CLAIM = "SELECT alarm_id, agent_id, action, fire_at"


@pytest.fixture(autouse=True)
def _tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TOOL_LOG_ENV, str(tmp_path / "tool-runs.jsonl"))


def waiting_resumption(store_url: str, retry_in: float) -> None:
    """Leave shop-0 with a resumption due in ``retry_in`` seconds and an event due now."""
    approval_id = suspend(store_url)
    with Store(store_url) as store:
        store.approve(approval_id, by="alice")
        queue = store.alarm_queue
        claim = queue.claim("earlier-runner", time.time(), 30)
        assert claim is not None and claim.kind == "resume"
        assert queue.fail(claim, "the model was down", time.time() + retry_in) == "pending"
        store.send_event("shop-0", "restock", {"n": 1})


@contextlib.contextmanager
def shop_runner(store_url: str) -> Iterator[AgentRunner]:
    """A runner of approvals_app's shops, polling every 0.5 s."""
    with AgentRunner(
        store_url,
        agents=lambda agent_id: Shop(agent_id=agent_id),
        handlers=lambda config: [LiteLLMProvider(model="fake"), FakeLLM(respond=answer)],
        config=RunnerConfig(poll_interval=0.5),
    ) as runner:
        yield runner


def claims_in(runner: AgentRunner, seconds: float) -> int:
    """How many claims ``runner`` tries in ``seconds`` of the real clock (in this thread)."""
    with statements_run(runner.store) as statements:
        runner.run(until=time.time() + seconds)
    return sum(sql.lstrip().startswith(CLAIM) for sql, _ in statements)


FULL = os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full"
#: Seconds until the resumption is due: a retry's backoff; a clock 5 s ahead of the
#: runner's (sampled in the default run: the same query either way).
RETRIES = [40.0, 5.0] if FULL else [40.0]


class TestIdleRunner:
    @pytest.mark.parametrize("retry_in", RETRIES, ids=lambda s: f"due-in-{s:g}s")
    def test_a_waiting_resumption_holds_its_agents_event_without_a_claim(
        self, store_url: str, retry_in: float
    ) -> None:
        """With a resumption due later (a retry, or a clock ahead of the runner's) and
        its agent's event due now, an idle runner tries no claim in 3 s, where it tried
        one every 0.05 s; given another agent's event, the same count sees its claim."""
        waiting_resumption(store_url, retry_in)
        with shop_runner(store_url) as runner:
            claims = claims_in(runner, IDLE)
            assert (claims, runner.turns) == (0, 0)
            with Store(store_url) as store:
                queue = store.alarm_queue
                assert queue.next_due() == pytest.approx(time.time() + retry_in, abs=IDLE + 2)
                assert queue.counts(time.time())["events_pending"] == 1
                store.send_event("shop-1", "restock", {"n": 2}, create=True)
            claimed = claims_in(runner, IDLE)  # the same count sees a claim of what is due
        print(f"claims tried in {IDLE:g} s: {claims} idle, {claimed} with an event due")
        assert claimed >= 1 and runner.turns >= 1, (claimed, runner.turns)
