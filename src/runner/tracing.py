"""The spans of a runner's deliveries, when its PersistenceHandler traces (issue 25).

Imported only when the runner's PersistenceHandler was made with ``tracing``,
so a runner without traces never loads OpenTelemetry. A delivery's span is the
parent of the turn it causes; an alarm's delivery and that turn link to the
turn that scheduled the alarm (its ``traceparent``, kept in that turn's
version detail).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.trace import SpanKind

from ..handlers.tracing import (
    AGENT_ID,
    ATTEMPT,
    OUTCOME,
    PREFIX,
    Tracing,
    link_to,
    next_turn_links,
)
from ..store.alarm_queue import AlarmQueue
from ..store.parts.alarms import Claim

ALARM_ID = PREFIX + "alarm.id"
KIND = PREFIX + "delivery.kind"
TOPIC = PREFIX + "event.topic"
RUNNER = PREFIX + "runner.id"


@contextmanager
def delivery(
    tracing: Tracing, queue: AlarmQueue, claim: Claim, runner: str
) -> Iterator[Callable[[str], None]]:
    """The span of delivering ``claim``; call the yielded function with the outcome."""
    links = []
    if claim.kind == "alarm":
        scheduled_by = queue.scheduled_by(claim)
        link = link_to(scheduled_by, "scheduled_by") if scheduled_by is not None else None
        if link is not None:
            links.append(link)
    attributes: dict[str, Any] = {
        AGENT_ID: claim.agent_id,
        ALARM_ID: claim.alarm_id,
        KIND: claim.kind,
        ATTEMPT: claim.attempts + 1,
        RUNNER: runner,
    }
    if claim.topic is not None and claim.kind == "event":
        attributes[TOPIC] = claim.topic
    name = f"effectful_durable.deliver {claim.kind}"
    with tracing.span(name, attributes, kind=SpanKind.CONSUMER, links=links) as span:
        try:
            with next_turn_links(links):
                yield lambda outcome: span.set_attribute(OUTCOME, outcome)
        except BaseException as error:
            tracing.failed(span, error)
            raise
