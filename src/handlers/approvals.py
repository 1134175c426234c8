"""PersistenceHandler's approvals: suspend a turn at a tool call that needs one, resume it after.

A turn that may ask for approval (its agent has a tool marked with
``requires_approval``, or the handler has a policy) or that resumes a suspended
turn intercepts three of effectful's operations in its own model loop:

- ``call_tool``: a call that needs approval, and has no decision, is not run; it
  is staged (``Turn.asked``). A call the suspended turn made replays its recorded
  result; an approved call runs, once, with the decided arguments; a denied one
  returns the denial as the tool's result;
- ``call_assistant``: with calls staged, the turn suspends before the model is
  asked again (:class:`Suspend`, which PersistenceHandler commits). While
  resuming, the recorded assistant messages are replayed, not requested;
- ``call_user``: while resuming, the recorded user message stands for the new one.

Operations of other templates (an agent called from a tool) pass through: their
history does not hold the turn's own user message.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import pydantic
from effectful.handlers.llm import Template
from effectful.ops.semantics import fwd
from effectful.ops.syntax import ObjectInterpretation

from ..agents.approvals import ApprovalPolicy, approval_rule, running_approved
from ..agents.persistent import PersistentAgent
from ..errors import DurableError, NotFoundError, TurnSuspended
from ..store.parts.approvals import DENIAL, Asked, new_approval_id
from ..store.records import ApprovalInfo, Suspension
from .effectful_hooks import (
    active_history,
    append_to_history,
    decode_tool_call,
    env_tools,
    stand_in_call,
    stand_in_reason,
    tool_arguments,
    tool_message,
    tool_name,
    tool_parameters,
    with_arguments,
)
from .turn import Replay, Turn

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger("effectful_durable.approvals")


class Suspend(BaseException):
    """Raised inside a turn's model loop to suspend it: carries the loop's history.

    A BaseException, so that no tool-error handler (RetryLLMHandler's) takes it
    for a tool's failure.
    """

    def __init__(self, messages: list[Any]) -> None:
        super().__init__("suspended for approval")
        self.messages = messages


class NothingToResume(Exception):
    """A resume-only turn found no decided suspension to resume (someone resumed it)."""


class ResumeFirst(Exception):
    """A decided suspension of another call waits: resume it, then start this call."""

    def __init__(self, suspension: Suspension) -> None:
        super().__init__(suspension.template)
        self.suspension = suspension


class ApprovalHandling(ObjectInterpretation[Any, Any]):  # type: ignore[no-untyped-call]
    """Answer the approval operations for PersistenceHandler (a base class of it)."""

    store: Store
    needs_approval: ApprovalPolicy | None = None

    def _turns(self) -> list[Turn]:
        raise NotImplementedError

    # -- what a turn intercepts ------------------------------------------------------

    def _approval_interpretation(self, turn: Turn) -> dict[Any, Any]:
        """The operations ``turn`` intercepts: none unless it may ask or resumes."""
        if turn.resuming is None and not self._may_ask(turn.agent):
            return {}
        from effectful.handlers.llm.completions import call_assistant, call_tool, call_user

        def on_user(*args: Any, **kwargs: Any) -> Any:
            if self._turns()[-1] is not turn or turn.own_message is not None:
                return fwd()
            if turn.resuming is not None:
                turn.own_message = turn.resuming.user["id"]
                return turn.resuming.user  # in the history already
            message = fwd()
            turn.own_message = message["id"]
            return message

        def on_assistant(env: Mapping[str, Any], *args: Any, **kwargs: Any) -> Any:
            if not self._own_loop(turn):
                return fwd()
            replay = turn.resuming
            if replay is not None and replay.assistants:
                recorded = replay.assistants.pop(0)
                message = _retargeted(recorded, replay.decisions)
                history = active_history()
                if message is not recorded and history is not None and message["id"] in history:
                    history[message["id"]] = message  # committed so, by the resumed turn
                return message, _replayed_calls(turn.agent, env, message, replay), None
            if turn.asked:
                history = active_history()
                raise Suspend(list(history.values()) if history is not None else [])
            return fwd()

        def on_tool(tool_call: Any) -> Any:
            if not self._own_loop(turn):
                return fwd()
            replay = turn.resuming
            if replay is not None:
                recorded = replay.tool_results.pop(tool_call.id, None)
                if recorded is not None:
                    return recorded  # in the history already
                decided = replay.decisions.pop(tool_call.id, None)  # used once
                if decided is not None:
                    return _decided(tool_call, decided)
            reason = self._reason(tool_call)
            if reason is None:
                return fwd()
            turn.asked.append(
                Asked(
                    new_approval_id(),
                    tool_name(tool_call),
                    tool_call.id,
                    tool_arguments(tool_call),
                    tool_parameters(tool_call),
                    reason,
                )
            )
            # Not run, not in the history: the loop goes on to the model, which suspends.
            return {"role": "tool", "tool_call_id": tool_call.id, "content": ""}

        return {call_user: on_user, call_assistant: on_assistant, call_tool: on_tool}

    def _own_loop(self, turn: Turn) -> bool:
        if self._turns()[-1] is not turn or turn.own_message is None:
            return False
        history = active_history()
        return history is not None and turn.own_message in history

    def _may_ask(self, agent: PersistentAgent) -> bool:
        return self.needs_approval is not None or _has_marked_tools(type(agent))

    def _reason(self, tool_call: Any) -> str | None:
        """Why ``tool_call`` needs approval, or None: the tool's mark, then the policy."""
        arguments = dict(tool_call.bound_args.arguments)
        rule = approval_rule(tool_call.tool)
        if rule is not None:
            reason = rule.applies(arguments)
            if reason is not None:
                return reason
        if self.needs_approval is None:
            return None
        try:
            verdict = self.needs_approval(tool_name(tool_call), arguments)
        except Exception as error:
            return f"the approval policy failed ({type(error).__name__}: {error})"
        if not verdict:
            return None
        return verdict if isinstance(verdict, str) else "the approval policy asks for it"

    # -- resuming ----------------------------------------------------------------------

    def _replay(self, suspension: Suspension, history: list[Any]) -> Replay:
        """What resuming ``suspension`` replays, from the committed ``history`` ending with it."""
        call_ids = {a.tool_call_id for a in suspension.approvals}
        last = max(
            (
                i
                for i, m in enumerate(history)
                if m.get("role") == "assistant"
                and call_ids & {c.get("id") for c in m.get("tool_calls") or []}
            ),
            default=None,
        )
        first = None
        if last is not None:
            first = max((i for i in range(last) if history[i].get("role") == "user"), default=None)
        if first is None or last is None:
            msg = (
                f"the suspended turn of {suspension.agent_id!r} (version "
                f"{suspension.suspended_in}) is not at the end of its history; roll back to "
                f"version {suspension.suspended_in - 1} to drop it"
            )
            raise DurableError(msg)
        recorded = history[first:]
        return Replay(
            suspension,
            recorded[0],
            [m for m in recorded if m.get("role") == "assistant"],
            {m["tool_call_id"]: m for m in recorded if m.get("role") == "tool"},
            {a.tool_call_id: a for a in suspension.approvals},
        )

    def _resume_call(self, agent: PersistentAgent, suspension: Suspension) -> Any:
        """Call the suspended turn's template again, with its arguments, to resume it.

        Raises:
            NothingToResume: Someone else resumed it meanwhile.
        """
        template = getattr(agent, suspension.template, None)
        if not isinstance(template, Template):
            msg = (
                f"cannot resume the suspended turn of {agent.agent_id!r}: "
                f"{type(agent).__name__} has no template {suspension.template!r}"
            )
            raise DurableError(msg)
        arguments = _decoded_arguments(template, suspension.arguments)
        local = self._resume_local()
        local.append(agent)
        try:
            with agent.conversation(suspension.conversation):
                return template(**arguments)
        finally:
            local.remove(agent)

    def _resume_local(self) -> list[PersistentAgent]:
        raise NotImplementedError

    def resuming(self, agent: PersistentAgent) -> bool:
        """Whether this thread is calling ``agent``'s suspended turn again, to resume it."""
        return any(a is agent for a in self._resume_local())

    def _suspended(self, agent: PersistentAgent, conversation: str) -> TurnSuspended:
        """The error that tells the caller what the conversation's suspended turn waits for."""
        found = self.store.suspension(agent.agent_id, conversation)
        approvals: list[ApprovalInfo] = list(found.approvals) if found is not None else []
        log.info(
            "turn of %s suspended: waiting for %s",
            agent.agent_id,
            ", ".join(a.approval_id for a in approvals if a.status == "pending"),
            extra={"agent": agent.agent_id, "conversation": conversation},
        )
        return TurnSuspended(agent.agent_id, approvals)

    def resume_queued(self, agent: PersistentAgent, conversation: str) -> bool:
        """Resume the conversation's suspended turn if it is decided (the runner's).

        Returns:
            False, with nothing done, when there is no such turn to resume (another
            process resumed it, a rollback dropped it, or it is a workflow step).
        """
        found = self.store.suspension(agent.agent_id, conversation)
        if found is None or found.pending or found.workflow is not None:
            return False
        try:
            self._resume_call(agent, found)
        except NothingToResume:
            return False
        return True

    def resume(self, agent: PersistentAgent) -> Any:
        """Resume ``agent``'s suspended turn (in its current conversation) now.

        The approvals it waits for must all be decided. The turn goes on where it
        stopped: what the model answered is not asked again, an approved tool runs
        once, a denied one returns its denial, and the model carries on.

        Returns:
            The template's result, as the suspended call would have returned it.

        Raises:
            NotFoundError: No turn of the agent's current conversation is suspended.
            TurnSuspended: Some approval is not decided yet, or the turn asked for
                another one.
            DurableError: The turn is a workflow step: run the workflow again.

        .. versionadded:: 0.2.0
        """
        from ..agents.conversations import current_conversation

        conversation = current_conversation(agent)
        found = self.store.suspension(agent.agent_id, conversation)
        if found is None:
            msg = f"no turn of {agent.agent_id!r} is suspended in conversation {conversation!r}"
            raise NotFoundError(msg)
        if found.pending:
            raise TurnSuspended(agent.agent_id, list(found.approvals))
        if found.workflow is not None:
            raise DurableError(workflow_message(found))
        try:
            return self._resume_call(agent, found)
        except NothingToResume:
            msg = f"the suspended turn of {agent.agent_id!r} was resumed by another process"
            raise NotFoundError(msg) from None


def workflow_message(suspension: Suspension) -> str:
    return (
        f"the suspended turn of {suspension.agent_id!r} is step {suspension.step_key} of "
        f"workflow {suspension.workflow!r}; its approvals are decided: run the workflow "
        "again to resume it"
    )


def _replayed_calls(
    agent: PersistentAgent, env: Mapping[str, Any], message: Any, replay: Replay
) -> list[Any]:
    """The tool calls of a recorded assistant ``message``, decoded for the resumed loop.

    A call that does not run again (its result is recorded, or a person denied it)
    is decoded against the new code if it can be, else stood in for: its tool is
    never looked up, so a tool renamed or changed since does not stop the turn. An
    approved call is decoded with the arguments it runs with; its tool must exist.

    Raises:
        DurableError: An approved call's tool is gone (nothing was run or committed).
    """
    tools = env_tools(env)
    calls = []
    for raw in message.get("tool_calls") or []:
        decided = replay.decisions.get(raw.get("id"))
        if decided is not None and decided.status == "approved":
            calls.append(_approved_call(agent, raw, decided, tools))
            continue
        try:
            calls.append(decode_tool_call(raw, tools))
        except (LookupError, TypeError, ValueError) as error:
            if decided is None and raw.get("id") not in replay.tool_results:
                msg = (
                    f"cannot resume the suspended turn of {agent.agent_id!r}: its recorded "
                    f"call {_call_text(raw)} no longer decodes ({_one_line(error)})"
                )
                raise DurableError(msg) from error
            calls.append(stand_in_call(raw, f"{_call_text(raw)} does not run again"))
    return calls


def _approved_call(
    agent: PersistentAgent, raw: Any, decided: ApprovalInfo, tools: Mapping[str, Any]
) -> Any:
    """The approved call ``raw``, decoded with the arguments it runs with; a stand-in
    that says why when they no longer fit the tool (the model is told, nothing runs)."""
    name = str((raw.get("function") or {}).get("name"))
    if name not in tools:
        offered = ", ".join(sorted(k.removeprefix("self__") for k in tools)) or "none"
        before = decided.suspended_in - 1
        rollback = (
            f", or roll the agent back to version {before} to drop the suspended turn"
            if before >= 1
            else ""
        )
        msg = (
            f"cannot resume the suspended turn of {agent.agent_id!r}: approval "
            f"{decided.approval_id} lets {decided.tool}({json.dumps(decided.arguments)}) run, "
            f"but {type(agent).__name__} has no tool {decided.tool!r} any more (it has: "
            f"{offered}). Nothing was run or committed. Re-target the approval to the "
            f"tool's new name (`effectful-durable retarget DB {decided.approval_id} TOOL "
            f"--agents MODULE:FUNC`, then approve it again){rollback}, or keep the tool"
        )
        raise DurableError(msg)
    arguments = decided.decided_arguments or decided.arguments
    try:
        return decode_tool_call(with_arguments(raw, name, arguments), tools)
    except (LookupError, TypeError, ValueError) as error:
        return stand_in_call(
            raw,
            f"Not run: the arguments {decided.decided_by} approved no longer fit the tool "
            f"({_one_line(error)}).",
        )


def _decided(tool_call: Any, decided: ApprovalInfo) -> Any:
    """Run an approved call with its decided arguments, or answer a denied one."""
    who = f"{decided.decided_by}" + (f" ({decided.note})" if decided.note else "")
    if decided.status == "denied":
        text = DENIAL.format(by=decided.decided_by, reason=decided.note)
        message = tool_message(tool_call.id, text)
        append_to_history(message)
        return message
    unfit = stand_in_reason(tool_call)
    if unfit is not None:  # the approved arguments no longer fit the tool
        message = tool_message(tool_call.id, unfit)
        append_to_history(message)
        return message
    with running_approved(decided.approval_id):
        message = fwd(tool_call)
    note = f"Approved by {who}"
    changed = decided.decided_arguments
    if changed is not None and changed != decided.arguments:
        note += f", with the arguments changed to {json.dumps(changed)}"
    content = message.get("content")
    if isinstance(content, list):
        content.append({"type": "text", "text": f"\n({note}.)"})
    log.info(
        "approved %s ran: %s of %s",
        decided.approval_id,
        decided.tool,
        decided.agent_id,
        extra={"approval": decided.approval_id, "agent": decided.agent_id},
    )
    return message


def _retargeted(message: Any, approvals: Mapping[str, ApprovalInfo]) -> Any:
    """The recorded assistant ``message`` with each call an approval names otherwise
    (re-targeted to a tool renamed in new code, or to other arguments) naming the
    approval's tool and arguments: the call is replayed, and committed, as it runs."""
    calls = message.get("tool_calls") or []
    if not any(_moved(call, approvals) for call in calls):
        return message
    renamed = []
    for call in calls:
        approval = _moved(call, approvals)
        if approval is not None:
            # The model named a method tool ``self__name`` (effectful's collect_tools).
            prefix = "self__" if call["function"]["name"].startswith("self__") else ""
            call = with_arguments(call, prefix + approval.tool, approval.arguments)
        renamed.append(call)
    return {**message, "tool_calls": renamed}


def _moved(call: Any, approvals: Mapping[str, ApprovalInfo]) -> ApprovalInfo | None:
    approval = approvals.get(call.get("id"))
    if approval is None:
        return None
    function = call.get("function") or {}
    if approval.tool != str(function.get("name")).removeprefix("self__"):
        return approval
    try:
        arguments = json.loads(function.get("arguments") or "{}")
    except ValueError:
        return approval
    return approval if arguments != approval.arguments else None


def _call_text(raw: Any) -> str:
    function = raw.get("function") or {}
    name = str(function.get("name")).removeprefix("self__")
    return f"{name}({function.get('arguments') or ''})"


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


@functools.cache
def _has_marked_tools(cls: type) -> bool:
    """Whether any tool of the agent class is marked with ``requires_approval``."""
    return any(
        approval_rule(value) is not None for klass in cls.__mro__ for value in vars(klass).values()
    )


def _decoded_arguments(template: Template[..., Any], recorded: Any) -> dict[str, Any]:
    """The template's recorded arguments (JSON values) as its parameters' types."""
    signature = template.__signature__
    if not isinstance(recorded, dict):
        msg = f"the suspended turn's arguments cannot be read back: {recorded!r}"
        raise DurableError(msg)
    arguments: dict[str, Any] = {}
    for name, value in recorded.items():
        parameter = signature.parameters.get(name)
        if parameter is None or parameter.annotation is parameter.empty:
            arguments[name] = value
            continue
        arguments[name] = pydantic.TypeAdapter(parameter.annotation).validate_python(value)
    return arguments
