"""A dry run of a workflow's program: every recorded step is answered from the journal,
and the first step that would go live stops the run. No model, no tool, no write."""

from __future__ import annotations

import contextlib
import io
import threading
from collections.abc import Callable
from typing import Any, NoReturn

from effectful.handlers.llm import Template
from effectful.ops.syntax import ObjectInterpretation, implements

from ..agents.conversations import current_conversation
from ..agents.events import wait_for_event
from ..agents.persistent import PersistentAgent
from ..handlers.effectful_hooks import bound_agent
from ..handlers.journal import Journal, Step, describe_step, step_arguments
from ..store import Store
from .report import WorkflowRun


class _Stopped(BaseException):
    """Unwinds the program at its first live step or divergence (a BaseException, so
    that the program's own ``except Exception`` does not take it for a failure)."""


class DryRunHandler(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Stands where the program installs ``PersistenceHandler(db, workflow=...)``.

    Each outermost template call (and each ``wait_for_event``) is numbered as the
    journal numbers steps; a step the journal holds as done returns its recorded
    result, typed by the new code's return annotation; anything else stops the
    program: the first step that would go live, or a divergence.
    """

    def __init__(self, store: Store, workflow: str | None) -> None:
        super().__init__()
        self.store = store
        self.workflow = workflow or ""
        self.journal = Journal(store, workflow) if workflow else None
        self.replayed: list[int] = []
        self.live: list[dict[str, Any]] = []
        self.diverged: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._next_number: int | None = None

    @implements(Template.__apply__)  # type: ignore[untyped-decorator]
    def _apply(self, template: Template[..., Any], *args: Any, **kwargs: Any) -> Any:
        agent = bound_agent(template, PersistentAgent)
        name = getattr(template, "__name__", type(template).__name__)
        if self.journal is None:
            self._go_live({"number": None, "key": name, "template": name})
        arguments = step_arguments(template, args, kwargs)
        agent_id = agent.agent_id if agent is not None else None
        conversation = current_conversation(agent) if agent is not None else None
        step = self.journal.next_step(template, name, arguments, agent_id, None, conversation)
        return self._replay(step)

    @implements(wait_for_event)  # type: ignore[untyped-decorator]
    def _wait_for_event(self, agent: Any, name: str, *, timeout: float) -> Any:
        if self.journal is None:
            self._go_live({"number": None, "key": name, "template": f"wait_for_event {name}"})
        agent_id = agent.agent_id if isinstance(agent, PersistentAgent) else agent
        conversation = current_conversation(agent) if isinstance(agent, PersistentAgent) else None
        step = self.journal.next_wait(name, timeout, agent_id, None, conversation)
        return self._replay(step)

    def _replay(self, step: Step) -> Any:
        recorded = self.store.step(self.workflow, step.key)
        if recorded is None:
            self._go_live(
                {"number": self._new_number(), "key": step.key, "template": step.template}
            )
        if (recorded.template, recorded.arguments) != (step.template, step.arguments):
            with self._lock:
                self.diverged.append(
                    {
                        "number": recorded.number,
                        "key": step.key,
                        "recorded": describe_step(recorded.template, recorded.arguments),
                        "asked": describe_step(step.template, step.arguments),
                    }
                )
            raise _Stopped
        if recorded.status != "done":
            self._go_live({"number": recorded.number, "key": step.key, "template": step.template})
        try:
            result = step.result_type.validate_python(recorded.result)
        except ValueError as error:  # pydantic's ValidationError among them
            with self._lock:
                self.diverged.append(
                    {
                        "number": recorded.number,
                        "key": step.key,
                        "recorded": f"a result that no longer fits {step.template}'s return "
                        f"type ({' '.join(str(error).split())[:300]})",
                        "asked": describe_step(step.template, step.arguments),
                    }
                )
            raise _Stopped from error
        with self._lock:
            self.replayed.append(recorded.number)
        return result

    def _new_number(self) -> int:
        with self._lock:
            if self._next_number is None:
                steps = self.store.steps(self.workflow) if self._has_journal() else []
                self._next_number = max((s.number for s in steps), default=0) + 1
            return self._next_number

    def _has_journal(self) -> bool:
        return any(info.workflow == self.workflow for info in self.store.workflows())

    def _go_live(self, step: dict[str, Any]) -> NoReturn:
        with self._lock:
            self.live.append(step)
        raise _Stopped


def dry_run(store: Store, program: Callable[[Callable[..., Any]], Any]) -> list[WorkflowRun]:
    """Run ``program`` with a :class:`DryRunHandler` wherever it asks for its handler.

    ``program(persistence)`` calls ``persistence(workflow="name", ...)`` where it
    would build ``PersistenceHandler(db, workflow="name", ...)`` (its other
    keywords are ignored), and installs what it gets in every thread that runs
    agents. What the program prints is swallowed.
    """
    made: list[DryRunHandler] = []

    def persistence(*_: Any, workflow: str | None = None, **__: Any) -> DryRunHandler:
        made.append(DryRunHandler(store, workflow))
        return made[-1]

    error: str | None = None
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            program(persistence)
        except _Stopped:
            pass
        except Exception as failure:  # the program's own error: it is reported
            error = f"{type(failure).__name__}: {failure}"
    runs = [_run_of(handler, error) for handler in made]
    if not runs and error is not None:
        runs.append(WorkflowRun("?", (), error=f"the program failed before it ran: {error}"))
    return runs


def _run_of(handler: DryRunHandler, error: str | None) -> WorkflowRun:
    """What one handler of the dry run saw: the first divergence or live step wins."""
    replayed = tuple(sorted(set(handler.replayed)))
    if handler.diverged:
        first = min(handler.diverged, key=lambda d: d["number"])
        return WorkflowRun(handler.workflow, replayed, diverged=first)
    if handler.live:
        live = min(handler.live, key=lambda s: s["number"] or 0)
        return WorkflowRun(handler.workflow, replayed, live_at=live)
    return WorkflowRun(handler.workflow, replayed, error=error)
