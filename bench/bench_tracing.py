"""Benchmark: what OpenTelemetry tracing costs per turn, off and on.

Five arms play the same N-turn conversation (offline FakeLLM under effectful's
``LiteLLMProvider``), turns interleaved so that the machine's noise falls on all
of them alike: ``plain`` (no persistence), ``off`` and ``off again`` (a
PersistenceHandler with tracing off, the default, twice: the spread between them
is the noise floor), ``on, no SDK`` (``tracing=True`` with only the API
installed: the no-op tracer), and ``on, SDK`` (``tracing=`` an SDK
TracerProvider whose span processor hands each span to an exporter that drops
it: the spans are built and ended, nothing is written anywhere).

For each arm it prints the median wall time of a turn, and the median over turns
of the arm's time minus the plain turn of the same number: the handler's cost.
Tracing off must not be measurable: ``off`` and ``off again`` differ by noise
only. Each turn of a tracing arm makes 3 spans (the turn, its model call, its
commit; and a load on the first), so ``on`` minus ``off`` is about 3 spans' cost
and one more effectful handler installed for the turn.

Run: ``.venv/bin/python bench/bench_tracing.py [--turns 500]``. Needs the
``dev`` extra (the OpenTelemetry SDK). No assertions.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"  # before litellm is imported

from effectful.handlers.llm import Template
from effectful.handlers.llm.completions import LiteLLMProvider
from effectful.ops.semantics import handler
from effectful.ops.types import NotHandled
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from effectful_durable import PersistenceHandler, PersistentAgent
from effectful_durable.testing import FakeCall, FakeLLM


@dataclasses.dataclass
class Bot(PersistentAgent):
    """You are a helpful assistant."""

    @Template.define
    def ask(self, question: str) -> str:
        """Answer: {question}"""
        raise NotHandled


class Dropping(SpanExporter):
    """An exporter that drops what it is given: the SDK's cost without any I/O."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def answer(call: FakeCall) -> str:
    return "The answer, at some length. " * 25


@dataclasses.dataclass
class Arm:
    name: str
    make: Callable[[Path], PersistenceHandler | None]
    times: list[float] = dataclasses.field(default_factory=list)


def arms(provider: TracerProvider) -> list[Arm]:
    return [
        Arm("plain", lambda db: None),
        Arm("off", lambda db: PersistenceHandler(db)),
        Arm("off again", lambda db: PersistenceHandler(db)),
        Arm("on, no SDK", lambda db: PersistenceHandler(db, tracing=True)),
        Arm("on, SDK", lambda db: PersistenceHandler(db, tracing=provider)),
    ]


def run(turns: int, directory: Path) -> list[Arm]:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(Dropping()))
    runs = arms(provider)
    llm = FakeLLM(respond=answer)
    state: list[tuple[Arm, Any, Bot]] = []
    for n, arm in enumerate(runs):
        persistence = arm.make(directory / f"arm{n}.db")
        state.append((arm, persistence, Bot(agent_id=f"bot-{n}")))
    question = "Tell me something about the weather today, please. " * 6
    for turn in range(turns):
        for arm, persistence, bot in state:
            with handler(LiteLLMProvider(model="fake")), handler(llm):
                if persistence is None:
                    started = time.perf_counter()
                    bot.ask(f"{turn}: {question}")
                    arm.times.append(time.perf_counter() - started)
                else:
                    with handler(persistence):
                        started = time.perf_counter()
                        bot.ask(f"{turn}: {question}")
                        arm.times.append(time.perf_counter() - started)
        if turn % 100 == 0:
            print(f"turn {turn}", file=sys.stderr)
    for _, persistence, _ in state:
        if persistence is not None:
            persistence.close()
    provider.shutdown()
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--turns", type=int, default=500)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = run(args.turns, Path(tmp))
    plain = runs[0].times
    warm = slice(1, None)  # the first turn builds the bound template: not a turn's cost
    print(f"{args.turns} turns per arm, interleaved, offline model")
    print(f"{'arm':<12} {'turn ms':>9} {'handler ms':>11} {'p90':>7}")
    for arm in runs:
        overhead = [(t - p) * 1000 for t, p in zip(arm.times[warm], plain[warm], strict=True)]
        q = statistics.quantiles(overhead, n=10)
        print(
            f"{arm.name:<12} {statistics.median(arm.times[warm]) * 1000:9.3f} "
            f"{statistics.median(overhead):11.3f} {q[-1]:7.3f}"
        )
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
