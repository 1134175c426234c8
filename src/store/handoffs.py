"""Handoff rows: a turn that started and has not committed, read back as a Handoff.

A turn writes its conversation's handoff row as it starts (``turns.py``), and
its commit deletes it; a failed turn marks it failed. What is left is a turn that
is running, crashed or failed, and the agent's next turn is told of it.
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from .records import Handoff
from .rows import dumps, utc
from .sealing import HANDOFF, PLAIN, Sealer

HOST = socket.gethostname()

HANDOFF_SELECT = """
    SELECT agent_id, base_version, template, arguments, status, error, interrupted,
           host, pid, started_at, ended_at, conversation
      FROM checked_handoffs
"""


def handoff_of(row: tuple[Any, ...], sealer: Sealer = PLAIN) -> Handoff:
    """The Handoff of a row of :data:`HANDOFF_SELECT`, its content opened by ``sealer``."""
    agent_id, base, template, arguments, status, error, interrupted, *rest = row
    host, pid, started, ended, conversation = rest

    def opened(value: str, column: str) -> str:
        return sealer.open(value, HANDOFF, agent_id, conversation, column, table="handoffs")

    arguments = opened(arguments, "arguments")
    error = opened(error, "error") if error is not None else None
    interrupted = opened(interrupted, "interrupted") if interrupted else None
    told = json.loads(interrupted) if interrupted else None
    trace = told.pop("trace", None) if told is not None else None
    return Handoff(
        agent_id,
        base,
        template,
        json.loads(arguments),
        status,
        error,
        told or None,
        host,
        pid,
        utc(started),
        utc(ended) if ended is not None else None,
        conversation,
        trace,
    )


def new_handoff(
    agent_id: str,
    conversation: str,
    template: str,
    arguments: Any,
    trace: str | None,
    sealer: Sealer = PLAIN,
) -> tuple[Any, ...]:
    """The parameters of ``HANDOFF_INSERT`` (``engine/seam.py``) for a turn that starts now."""
    return (
        agent_id,
        conversation,
        template,
        sealer.seal(dumps(arguments), HANDOFF, agent_id, conversation, "arguments"),
        HOST,
        os.getpid(),
        time.time(),
        interrupted_json(None, trace, sealer, conversation, agent_id),
    )


def interrupted_json(
    handoff: Handoff | None,
    trace: str | None = None,
    sealer: Sealer = PLAIN,
    conversation: str = "",
    agent_id: str | None = None,
) -> str | None:
    """The handoff's ``interrupted`` column: the earlier handoff it replaces, if any.

    With tracing on it also keeps the turn's own ``traceparent`` under ``"trace"``
    (read back as :attr:`Handoff.trace`), so that no schema change was needed.
    """
    told: dict[str, Any] = {}
    if handoff is not None:
        told = {
            "template": handoff.template,
            "arguments": handoff.arguments,
            "status": handoff.status,
            "error": handoff.error,
            "base_version": handoff.base_version,
            "started_at": handoff.started_at.isoformat(),
        }
    if trace is not None:
        told["trace"] = trace
    if not told:
        return None
    owner = agent_id if agent_id is not None else handoff.agent_id if handoff else ""
    return sealer.seal(dumps(told), HANDOFF, owner, conversation, "interrupted")
