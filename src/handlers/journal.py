"""The step journal of a workflow run: step keys, replay, divergence, progress log."""

from __future__ import annotations

import inspect
import logging
import threading
from dataclasses import dataclass
from typing import Any

import pydantic
import pydantic_core
from effectful.handlers.llm import Template

from ..errors import StateSerializationError, WorkflowDivergedError
from ..store import Store
from ..store.ids import DEFAULT_CONVERSATION
from ..store.parts.events import WAIT_PREFIX

logger = logging.getLogger("effectful_durable.journal")


@dataclass(frozen=True)
class Step:
    """One step of the running workflow, before it is replayed or run."""

    key: str
    template: str
    arguments: Any
    agent_id: str | None
    result_type: pydantic.TypeAdapter[Any]


class Journal:
    """Numbers the steps of one workflow run and replays those already done.

    A step's key is its agent's id (or, for a template with no persistent agent,
    the template's name), with its conversation unless the default one, and how
    many steps of that agent in that conversation came before it in this run:
    ``coder-1#0``, ``coder-1#1``, ``coder-1@c-42#0``. A step started inside another step's turn
    (an agent called from a tool) extends that step's key: ``architect#0/coder-1#0``.
    Keys therefore depend only on the order of calls on each agent, not on how
    threads interleave calls on different agents.
    """

    def __init__(self, store: Store, workflow: str) -> None:
        if not isinstance(workflow, str) or not workflow.strip():
            msg = f"workflow must be a non-empty name such as 'nightly-report', not {workflow!r}"
            raise ValueError(msg)
        self.store = store
        self.workflow = workflow
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def next_step(
        self,
        template: Template[..., Any],
        name: str,
        arguments: Any,
        agent_id: str | None,
        parent: Step | None,
        conversation: str | None = None,
    ) -> Step:
        """Number the next call on ``agent_id`` (or ``name``) in ``conversation`` under ``parent``.

        Each conversation of an agent but the default one counts its own steps,
        under the key ``agent@conversation``.

        Raises:
            StateSerializationError: The template's return type cannot be stored as
                JSON, so the step could never be replayed.
        """
        key = self._next_key(name, agent_id, parent, conversation)
        return Step(key, name, arguments, agent_id, _result_type(template, name))

    def next_wait(
        self,
        name: str,
        timeout: float,
        agent_id: str,
        parent: Step | None,
        conversation: str | None = None,
    ) -> Step:
        """Number a wait for the agent's event ``name``: a step of the agent, as its calls are."""
        key = self._next_key(name, agent_id, parent, conversation)
        arguments = {"timeout": timeout}
        return Step(key, WAIT_PREFIX + name, arguments, agent_id, _EVENT_RESULT)

    def _next_key(
        self, name: str, agent_id: str | None, parent: Step | None, conversation: str | None
    ) -> str:
        owner = agent_id if agent_id is not None else name
        if agent_id is not None and conversation not in (None, DEFAULT_CONVERSATION):
            owner = f"{agent_id}@{conversation}"
        scope = f"{parent.key}/{owner}" if parent is not None else owner
        with self._lock:
            count = self._counts.get(scope, 0)
            self._counts[scope] = count + 1
        return f"{scope}#{count}"

    def replay(self, step: Step, *, nested: bool) -> tuple[bool, Any]:
        """Look the step up: ``(True, result)`` if it is done, else ``(False, None)``.

        A step found with another template or other arguments raises
        WorkflowDivergedError. Inside a step that is being run again, that is
        instead the model choosing differently this time: the old attempt's steps
        from there on are forgotten and the step runs.
        """
        recorded = self.store.step(self.workflow, step.key)
        if recorded is None:
            return False, None
        if (recorded.template, recorded.arguments) != (step.template, step.arguments):
            if not nested:
                raise WorkflowDivergedError(
                    self.workflow,
                    f"{recorded.number} ({step.key})",
                    describe_step(recorded.template, recorded.arguments),
                    describe_step(step.template, step.arguments),
                )
            parent_prefix = step.key.rsplit("/", 1)[0] + "/"
            self.store.turns.discard_steps(self.workflow, parent_prefix, recorded.number)
            return False, None
        if recorded.status != "done":
            return False, None
        self.log(recorded.number, step, "replayed")
        return True, step.result_type.validate_python(recorded.result)

    def encode(self, step: Step, result: Any) -> str:
        """The step's result as JSON, typed by the template's return annotation.

        Raises:
            StateSerializationError: The value cannot be stored as JSON.
        """
        try:
            return step.result_type.dump_json(result, warnings="error").decode()
        except pydantic_core.PydanticSerializationError as e:
            owner = f"workflow {self.workflow!r} step {step.key}"
            raise StateSerializationError(
                owner, "result", type(result).__qualname__, str(e)
            ) from e

    def record(self, step: Step, result: Any) -> None:
        """Record a finished step that has no agent turn to commit it with."""
        number = self.store.turns.record_step(
            self.workflow,
            step.key,
            template=step.template,
            arguments=step.arguments,
            result=self.encode(step, result),
        )
        self.log(number, step, "done")

    def log(self, number: int | None, step: Step, outcome: str) -> None:
        """Log the step's progress to ``effectful_durable.journal`` at INFO."""
        logger.info(
            "%s step %s %s %s: %s",
            self.workflow,
            number,
            step.key,
            step.template,
            outcome,
            extra={
                "workflow": self.workflow,
                "step": number,
                "step_key": step.key,
                "agent_id": step.agent_id,
                "template": step.template,
                "outcome": outcome,
            },
        )


_EVENT_RESULT: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(dict[str, Any] | None)


def _result_type(template: Template[..., Any], name: str) -> pydantic.TypeAdapter[Any]:
    annotation = template.__signature__.return_annotation
    try:
        adapter: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(annotation)
        adapter.json_schema()
    except (pydantic.PydanticUserError, TypeError) as e:
        reason = "a workflow step's result must be storable as JSON to be replayed"
        raise StateSerializationError(name, "return", str(annotation), reason) from e
    return adapter


def describe_step(template: str, arguments: Any) -> str:
    return f"{template}({pydantic_core.to_json(arguments).decode()})"


def step_arguments(
    template: Template[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> Any:
    """The call's arguments by parameter name, as JSON values: what a step records."""
    try:
        # A template keeps its signature (without self, once bound) as effectful
        # resolved it; inspect.signature() would find the same one, more slowly.
        signature = getattr(template, "__signature__", None)
        if not isinstance(signature, inspect.Signature):
            signature = inspect.signature(template)
        bound: Any = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        bound = {"args": args, "kwargs": kwargs}
    return pydantic_core.to_jsonable_python(bound, fallback=repr)
