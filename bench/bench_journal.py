"""Benchmark: replaying a finished workflow from its journal.

Runs a STEPS-step workflow (four agents, one turn each step, offline FakeLLM) once
live into a fresh database, then runs the same program again and times it: every
step is replayed from the journal (one indexed read, no model call). Imports and
interpreter start are excluded; the first run's handler is closed first.

Run: ``.venv/bin/python bench/bench_journal.py [--steps 100]``. No assertions: the
target is a 100-step workflow replayed in under 1 s.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from pathlib import Path

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled

from effectful_durable import PersistenceHandler, PersistentAgent
from effectful_durable.testing import FakeCall, FakeLLM


@dataclasses.dataclass
class Worker(PersistentAgent):
    """You are a worker."""

    @Template.define
    def work(self, task: str) -> str:
        """Do this task: {task}"""
        raise NotHandled


def answer(call: FakeCall) -> str:
    return f"done: {call.last_user_text[:60]}"


def run(db: Path, steps: int, llm: FakeLLM) -> float:
    """Run the workflow; return its wall time in seconds."""
    persistence = PersistenceHandler(db, workflow="bench")
    started = time.perf_counter()
    with handler(LiteLLMProvider(model="fake")), handler(llm), handler(persistence):
        workers = [Worker(agent_id=f"worker-{n}") for n in range(4)]
        for step in range(steps):
            workers[step % 4].work(f"task {step}")
    elapsed = time.perf_counter() - started
    persistence.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "journal.db"
        live = run(db, args.steps, FakeLLM(respond=answer))
        replay_llm = FakeLLM()
        replay = run(db, args.steps, replay_llm)
    print(f"{args.steps}-step workflow, 4 agents, offline model")
    print(f"  live run:    {live * 1000:8.1f} ms  ({live / args.steps * 1000:.2f} ms/step)")
    print(
        f"  replay run:  {replay * 1000:8.1f} ms  ({replay / args.steps * 1000:.3f} ms/step, "
        f"{replay_llm.call_count} model calls)"
    )


if __name__ == "__main__":
    main()
