"""The workflow journal's values: a step's arguments and result, sealed for their row.

A step's row is named by its workflow and step key, and belongs to its agent and
conversation (none for a free template: then the database's own data key seals it).
"""

from __future__ import annotations

import json

from ..sealing import JOURNAL, Sealer


def sealed_step(
    sealer: Sealer,
    agent_id: str | None,
    conversation: str | None,
    workflow: str,
    step_key: str,
    column: str,
    text: str,
) -> str:
    """A step's ``column`` value (``arguments`` or ``result``), sealed for its row."""
    return sealer.seal(text, *_place(agent_id, conversation, workflow, step_key, column))


def opened_step(
    sealer: Sealer,
    agent_id: str | None,
    conversation: str | None,
    workflow: str,
    step_key: str,
    column: str,
    value: str,
) -> str:
    """A step's ``column`` value as stored, opened."""
    where = _place(agent_id, conversation, workflow, step_key, column)
    return sealer.open(value, *where, table="workflow_steps")


def _place(
    agent_id: str | None, conversation: str | None, workflow: str, step_key: str, column: str
) -> tuple[str, str, str, str]:
    return JOURNAL, agent_id or "", conversation or "", json.dumps([workflow, step_key, column])
