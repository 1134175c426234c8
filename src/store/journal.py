"""The step journals of workflows: reads, reset, and the steps of free templates."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from ..errors import NotFoundError
from .base import StoreBase
from .engine.seam import Conn
from .records import StepInfo, WorkflowInfo, WorkflowReset
from .rows import current_version, dumps, utc


class WorkflowJournal(StoreBase):
    """The workflow-journal methods of :class:`~effectful_durable.Store` (a base of it)."""

    if TYPE_CHECKING:

        def rollback(self, agent_id: str, version: int) -> int: ...

        def delete(self, agent_id: str) -> None: ...

    def workflows(self) -> list[WorkflowInfo]:
        """Every workflow with a journal, by name."""
        with self._reading() as conn:
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

    def steps(self, workflow: str) -> list[StepInfo]:
        """The workflow's journal, in step order.

        Raises:
            NotFoundError: No journal for ``workflow``.
        """
        with self._reading() as conn:
            rows = conn.execute(
                f"{STEP_SELECT} WHERE workflow = ? ORDER BY number", (workflow,)
            ).fetchall()
        if not rows:
            raise NotFoundError(no_workflow(workflow, self._db.location))
        return [step_info(row) for row in rows]

    def step(self, workflow: str, key: str) -> StepInfo | None:
        """One step of the journal by key, or None: one indexed read."""
        with self._reading() as conn:
            row = conn.execute(
                f"{STEP_SELECT} WHERE workflow = ? AND step_key = ?", (workflow, key)
            ).fetchone()
        return None if row is None else step_info(row)

    def reset_workflow(
        self, workflow: str, from_step: int = 1, *, dry_run: bool = False
    ) -> WorkflowReset:
        """Forget steps ``from_step`` and later, so the next run does them afresh.

        Each agent those steps ran on is rolled back to its version before the
        first of them, so their turns are not in its history twice; an agent the
        forgotten steps created (it had no version before them) is deleted.
        Earlier steps stay in the journal and keep replaying.

        Args:
            workflow: The workflow's name.
            from_step: The first step to forget.
            dry_run: Change nothing; return what a reset would do.

        Returns:
            The agents rolled back and deleted, and the number of steps forgotten.

        Raises:
            NotFoundError: No journal for ``workflow``, or a version to roll back to
                was pruned (then nothing is changed).
            AgentInUseError: One of those agents is running a turn.

        .. versionchanged:: 0.2.0
           Returns a :class:`WorkflowReset` rather than the list of agents, and
           takes ``dry_run``.
        """
        steps = [s for s in self.steps(workflow) if s.number >= from_step]
        first_base: dict[str, int] = {}
        for step in steps:
            if step.agent_id is not None and step.base_version is not None:
                first_base.setdefault(step.agent_id, step.base_version)
        rolled_back: list[tuple[str, int]] = []
        deleted: list[str] = []
        with self._reading() as conn:
            for agent_id, base in first_base.items():
                current = current_version(conn, agent_id)
                if current is None or current <= base:
                    continue
                if base == 0:
                    deleted.append(agent_id)
                else:
                    self._checked_version(conn, agent_id, base)  # refuse a pruned one now
                    rolled_back.append((agent_id, base))
        reset = WorkflowReset(
            workflow,
            from_step,
            len(steps),
            tuple(agent_id for agent_id, _ in rolled_back),
            tuple(deleted),
        )
        if dry_run:
            return reset
        for agent_id, base in rolled_back:
            self.rollback(agent_id, base)
        for agent_id in deleted:
            self.delete(agent_id)
        with self._writing() as conn:
            conn.execute(
                "DELETE FROM workflow_steps WHERE workflow = ? AND number >= ?",
                (workflow, from_step),
            )
        return reset

    def discard_steps(self, workflow: str, key_prefix: str, from_number: int) -> None:
        """Forget steps numbered ``from_number`` or later whose key starts with ``key_prefix``.

        Used when a step that runs again makes other nested calls than last time.
        """
        with self._writing() as conn:
            conn.execute(
                """
                DELETE FROM workflow_steps
                 WHERE workflow = ?1 AND number >= ?3
                   AND substr(step_key, 1, length(?2)) = ?2
                """,
                (workflow, key_prefix, from_number),
            )

    def record_step(
        self, workflow: str, key: str, *, template: str, arguments: Any, result: str
    ) -> int:
        """Record a finished step that has no agent to commit (a free template).

        Returns:
            The step's number.
        """
        now = time.time()
        with self._writing() as conn:
            self._db.serialize(conn, "workflow", workflow)
            number = step_number(conn, workflow, key)
            conn.execute(
                f"""
                INSERT INTO workflow_steps (workflow, step_key, number, template,
                    arguments, status, result, started_at, finished_at)
                VALUES (?, ?, ?, ?, ?, 'done', ?, ?, ?)
                {STEP_UPSERT}
                """,
                (workflow, key, number, template, dumps(arguments), result, now, now),
            )
        return number


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


def step_info(row: tuple[Any, ...]) -> StepInfo:
    (
        workflow,
        number,
        key,
        agent_id,
        template,
        arguments,
        status,
        result,
        base,
        version,
        started,
        finished,
        conversation,
    ) = row
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
