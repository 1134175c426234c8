"""The step journals of workflows: reads, reset, and what the turns' steps share.

The turn protocol (``turns.py``) writes the steps: a step's row as its turn
starts, marked done in its commit, and the steps of free templates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..errors import NotFoundError
from .checked import checked_version
from .engine.seam import Conn, Database
from .maintenance import delete, rollback
from .parts.steps import opened_step
from .parts.versioned import VersionedPart
from .records import StepInfo, WorkflowInfo, WorkflowReset
from .rows import current_version, utc
from .sealing import PLAIN, Sealer


def workflows(conn: Conn) -> list[WorkflowInfo]:
    """Store.workflows: every workflow with a journal, by name."""
    rows: list[tuple[Any, ...]] = conn.execute(
        """
        SELECT workflow, count(*), count(*) FILTER (WHERE status = 'done'),
               count(*) FILTER (WHERE status = 'running'),
               count(*) FILTER (WHERE status = 'failed'), min(started_at),
               max(coalesce(finished_at, started_at))
          FROM workflow_steps GROUP BY workflow ORDER BY workflow
        """
    ).fetchall()
    return [
        WorkflowInfo(name, steps, done, running, failed, utc(first), utc(last))
        for name, steps, done, running, failed, first, last in rows
    ]


def steps(db: Database, workflow: str, sealer: Sealer = PLAIN) -> list[StepInfo]:
    """Store.steps: the workflow's journal, in step order.

    Raises:
        NotFoundError: No journal for ``workflow``.
    """
    with db.reading() as conn:
        rows = conn.execute(
            f"{STEP_SELECT} WHERE workflow = ? ORDER BY number", (workflow,)
        ).fetchall()
    if not rows:
        raise NotFoundError(no_workflow(workflow, db.location))
    return sealer.listed(rows, lambda row: step_info(row, sealer))


def reset_workflow(
    db: Database,
    parts: Sequence[VersionedPart],
    workflow: str,
    from_step: int,
    *,
    dry_run: bool,
    sealer: Sealer = PLAIN,
) -> WorkflowReset:
    """Store.reset_workflow: forget steps ``from_step`` and later, rolling back (or
    deleting) the agents they ran on."""
    forgotten = [s for s in steps(db, workflow, sealer) if s.number >= from_step]
    first_base: dict[str, int] = {}
    for step in forgotten:
        if step.agent_id is not None and step.base_version is not None:
            first_base.setdefault(step.agent_id, step.base_version)
    rolled_back: list[tuple[str, int]] = []
    deleted: list[str] = []
    with db.reading() as conn:
        for agent_id, base in first_base.items():
            current = current_version(conn, agent_id)
            if current is None or current <= base:
                continue
            if base == 0:
                deleted.append(agent_id)
            else:
                checked_version(db, conn, agent_id, base)  # refuse a pruned one now
                rolled_back.append((agent_id, base))
    reset = WorkflowReset(
        workflow,
        from_step,
        len(forgotten),
        tuple(agent_id for agent_id, _ in rolled_back),
        tuple(deleted),
    )
    if dry_run:
        return reset
    for agent_id, base in rolled_back:
        rollback(db, parts, agent_id, base)
    for agent_id in deleted:
        delete(db, parts, agent_id)
    with db.writing() as conn:
        conn.execute(
            "DELETE FROM workflow_steps WHERE workflow = ? AND number >= ?", (workflow, from_step)
        )
    return reset


# INSERT OR REPLACE, spelled so PostgreSQL reads it too: every column not
# inserted goes back to NULL (a step run again starts afresh).
STEP_UPSERT = """
    ON CONFLICT (workflow, step_key) DO UPDATE SET
        number = excluded.number, agent_id = excluded.agent_id,
        conversation = excluded.conversation, template = excluded.template,
        arguments = excluded.arguments, status = excluded.status,
        result = excluded.result, base_version = excluded.base_version,
        version = excluded.version, started_at = excluded.started_at,
        finished_at = excluded.finished_at
"""

STEP_SELECT = """
    SELECT workflow, number, step_key, agent_id, template, arguments, status, result,
           base_version, version, started_at, finished_at, conversation
      FROM checked_workflow_steps
"""


def step_info(row: tuple[Any, ...], sealer: Sealer = PLAIN) -> StepInfo:
    """The StepInfo of a row of :data:`STEP_SELECT`, its values opened by ``sealer``."""
    workflow, number, key, agent_id, template, arguments, status, result, *rest = row
    base, version, started, finished, conversation = rest

    def opened(column: str, value: str) -> str:
        return opened_step(sealer, agent_id, conversation, workflow, key, column, value)

    arguments = opened("arguments", arguments)
    result = opened("result", result) if result is not None else None
    return StepInfo(
        workflow,
        number,
        key,
        agent_id,
        template,
        json.loads(arguments),
        status,
        json.loads(result) if result is not None else None,
        base,
        version,
        utc(started),
        utc(finished) if finished is not None else None,
        conversation,
    )


def step_number(conn: Conn, workflow: str, key: str) -> int:
    """The step's number: kept if the key was started before, else the next one."""
    number = conn.execute(
        """
        SELECT coalesce(
            (SELECT number FROM workflow_steps WHERE workflow = ?1 AND step_key = ?2),
            (SELECT coalesce(max(number), 0) + 1 FROM workflow_steps WHERE workflow = ?1))
        """,
        (workflow, key),
    ).get
    return int(number)


def no_workflow(workflow: str, path: str) -> str:
    return f"no workflow {workflow!r} in {path}; Store.workflows() lists the journals it holds"
