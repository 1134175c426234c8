"""Whether one agent's new code carries its in-flight work: approvals, alarms, events,
fields, memory and the histories its model will see. Reads nothing, writes nothing:
the caller hands over what the store holds."""

from __future__ import annotations

import dataclasses
import inspect
import json
import shlex
import sys
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import pydantic
from effectful.handlers.llm import Agent, Template, Tool

from ..agents.memory import MemoryLimits, StateTools
from ..agents.persistent import PersistentAgent
from ..agents.state import FieldProblem, state_problems
from ..handlers.effectful_hooks import decode_tool_call
from ..store.inflight import AgentInFlight, ConversationInFlight
from ..store.parts.alarms import AlarmInfo
from ..store.parts.events import EventInfo
from ..store.records import ApprovalInfo
from .report import Break

# effectful offers a method tool to the model as ``self__<name>`` (collect_tools).
_METHOD = "self__"


@dataclasses.dataclass(frozen=True)
class StoredAgent:
    """An agent's in-flight work, as the store holds it."""

    held: AgentInFlight
    approvals: Sequence[ApprovalInfo]
    alarms: Sequence[AlarmInfo]
    events: Sequence[EventInfo]

    @property
    def agent_id(self) -> str:
        return self.held.agent_id


@dataclasses.dataclass(frozen=True)
class Shape:
    """What the new code offers an agent class: its templates and the tools they see."""

    templates: dict[str, Template[..., Any]]
    tools: dict[str, Tool[..., Any]]

    @classmethod
    def of(cls, agent: PersistentAgent) -> Shape:
        """The shape of ``agent``'s class, read off ``agent`` (its bound templates).

        Only the class's tools and templates are read off the agent: no other
        attribute, so that no property runs (``__memory__`` needs a turn's store).
        """
        from effectful.handlers.llm.completions import collect_tools
        from effectful.ops.semantics import handler

        templates: dict[str, Template[..., Any]] = {}
        for klass in type(agent).__mro__:
            for name, value in vars(klass).items():
                if isinstance(value, Template) and name not in templates:
                    templates[name] = getattr(agent, name)
        tools: dict[str, Tool[..., Any]] = {}
        with handler({collect_tools: _class_tools}):
            for template in templates.values():
                tools.update(template.tools)
        return cls(templates, tools)

    def tool(self, name: str) -> tuple[str, Tool[..., Any]] | None:
        """The tool the model calls ``name`` (or, for an approval, ``self__name``)."""
        for key in (name, _METHOD + name):
            found = self.tools.get(key)
            if found is not None:
                return key, found
        return None

    def tool_names(self) -> str:
        names = sorted(name.removeprefix(_METHOD) for name in self.tools)
        return ", ".join(names) or "none"


def _class_tools(env: Mapping[str, Any]) -> dict[str, Tool[..., Any]]:
    """effectful's ``collect_tools`` (0.4), reading an agent's class attributes without
    running them: an attribute is a tool when the class holds a Tool under its name
    (effectful reads every attribute off the instance, properties included)."""
    found: dict[str, Tool[..., Any]] = {}
    for name, value in env.items():
        if isinstance(value, Tool):  # a Template is a Tool too
            found[name] = value
        elif isinstance(value, Agent):
            for klass in type(value).__mro__:
                for attribute in vars(klass):
                    if isinstance(inspect.getattr_static(value, attribute), Tool):
                        found[f"{name}__{attribute}"] = getattr(value, attribute)
    # One name per tool, the last in order, as effectful keeps it.
    names = {tool: name for name, tool in sorted(found.items())}
    return {name: tool for name, tool in found.items() if names[tool] == name}


def check_agent(
    agent: PersistentAgent, shape: Shape, stored: StoredAgent, run: Commands
) -> list[Break]:
    """Every piece of ``stored`` that ``agent``'s new code cannot carry; ``run`` spells
    the commands of the ways forward."""
    return [
        *_approvals(agent, shape, stored, run),
        *_deliveries(agent, shape, stored),
        *_fields(agent, stored, run),
        *_memory(agent, stored, run),
        *_histories(agent, shape, stored),
    ]


# -- the commands a way forward names ------------------------------------------------

PROG = "effectful-durable"


def command(verb: str, *words: str) -> str:
    """An ``effectful-durable`` command line, each word quoted for a POSIX shell."""
    return shlex.join([PROG, verb, *words])


@dataclasses.dataclass(frozen=True)
class Commands:
    """How a report spells the commands of its ways forward, runnable as printed.

    ``db`` is the database as the check was given it (a URL without its
    password); ``agents`` the new code's factory as ``MODULE:FUNC``, which the
    commands that need the new code (``approve``, ``retarget``, ``migrate-state``)
    take as ``--agents``.
    """

    db: str
    factory: str | None

    @property
    def agents(self) -> str:
        """The ``--agents`` of the new code (``MODULE:FUNC`` when it has no such name)."""
        return self.factory or UNNAMED_FACTORY

    def __call__(self, verb: str, *words: str) -> str:
        return command(verb, self.db, *words)

    def runnable(self, line: str) -> bool:
        """Whether ``line`` runs as printed (it names the factory, if it needs one)."""
        return self.factory is not None or UNNAMED_FACTORY not in shlex.split(line)


#: What the commands say for a factory that has no ``MODULE:FUNC`` (a lambda).
UNNAMED_FACTORY = "MODULE:FUNC"


def factory_name(factory: Any) -> str | None:
    """``factory`` as ``MODULE:NAME``, the name the CLI's ``--agents`` loads it by, if
    its module holds it under a name (a lambda, or a function of ``__main__``, has none)."""
    module_name = getattr(factory, "__module__", None)
    module = sys.modules.get(module_name) if isinstance(module_name, str) else None
    if module is None or module_name == "__main__":
        return None
    name = getattr(factory, "__name__", None)
    if isinstance(name, str) and getattr(module, name, None) is factory:
        return f"{module_name}:{name}"
    for name, value in vars(module).items():
        if value is factory and not name.startswith("_"):
            return f"{module_name}:{name}"
    return None


@dataclasses.dataclass
class _Way:
    """A way forward being written: its words, and the commands they name."""

    run: Commands
    parts: list[str] = dataclasses.field(default_factory=list)
    commands: list[str] = dataclasses.field(default_factory=list)

    def say(self, text: str, *commands: str, unrunnable: Collection[str] = ()) -> None:
        """Add ``text``, in which ``{}`` stands for each command in turn: in backticks
        if it runs as printed, else as it is (it holds a ``<...>`` to fill in, or the
        factory has no name), so that every command in backticks runs as printed."""
        shown = []
        for line in commands:
            if line in unrunnable or not self.run.runnable(line):
                shown.append(line)
            else:
                shown.append(f"`{line}`")
                self.commands.append(line)
        self.parts.append(text.format(*shown))

    def __str__(self) -> str:
        if len(self.parts) <= 1:
            return "".join(self.parts)
        return "; or ".join(self.parts)


def _break(kind: Any, agent_id: str, subject: str, problem: str, way: _Way | str) -> Break:
    if isinstance(way, str):
        return Break(kind, agent_id, subject, problem, way)
    return Break(kind, agent_id, subject, problem, str(way), tuple(way.commands))


# -- approvals ------------------------------------------------------------------------


def _approvals(
    agent: PersistentAgent, shape: Shape, stored: StoredAgent, run: Commands
) -> list[Break]:
    found: list[Break] = []
    suspended: set[tuple[str, int]] = set()
    name = type(agent).__name__
    for approval in stored.approvals:
        # A denied call never runs: the resumed turn tells the model, whatever its tool
        # is now. An approved one runs with its decided arguments, a pending one (once
        # approved) with its own, which a retarget may have changed with its tool.
        if approval.status != "denied":
            problem, way = _approval_problem(agent, shape, approval, run)
            if problem is not None:
                found.append(
                    _break("approval", stored.agent_id, approval.approval_id, problem, way)
                )
        turn = (approval.conversation, approval.suspended_in)
        if turn not in suspended and approval.template not in shape.templates:
            suspended.add(turn)
            way = _Way(run)
            before = approval.suspended_in - 1
            if before >= 1:
                way.say(
                    "roll the agent back to before the suspended turn ({})",
                    run("rollback", stored.agent_id, str(before)),
                )
            way.say(f"keep the template {approval.template} in {name} until the turn resumed")
            found.append(
                _break(
                    "approval",
                    stored.agent_id,
                    approval.approval_id,
                    f"the suspended turn is a call of {approval.template!r}, which {name} no "
                    "longer has: it cannot resume",
                    way,
                )
            )
    return found


def _approval_problem(
    agent: PersistentAgent, shape: Shape, approval: ApprovalInfo, run: Commands
) -> tuple[str | None, _Way]:
    """What is wrong with a pending or approved call under the new code, and what to do."""
    name = type(agent).__name__
    call = f"{approval.tool}({_json(approval.arguments)})"
    pending = approval.status == "pending"
    waiting = "waits for a decision" if pending else f"was approved by {approval.decided_by}"
    ident = approval.approval_id
    way = _Way(run)
    again = () if pending else (run("approve", ident, "--agents", run.agents),)
    then = "" if pending else ", then approve it again ({})"
    # What runs: the approved arguments (a person's edit kept through a retarget).
    arguments = approval.decided_arguments or approval.arguments
    edited = () if arguments == approval.arguments else ("--arguments", json.dumps(arguments))
    tool = shape.tool(approval.tool)
    if tool is None:
        problem = (
            f"the call {call} {waiting}, but {name} has no tool {approval.tool!r} any more "
            f"(it has: {shape.tool_names()}); resuming the turn would fail"
        )
        if pending:
            way.say(
                "deny it ({}): the model reads the reason",
                run("deny", ident, "--reason", f"{approval.tool} is no longer available"),
            )
        fits = [
            key
            for key, new in sorted(shape.tools.items())
            if not tool_call_problem(key, new, arguments)
        ]
        for key in fits[:3]:
            new_name = key.removeprefix(_METHOD)
            way.say(
                f"point it at {new_name}, if that is the tool's new name ({{}}){then}",
                run("retarget", ident, new_name, "--agents", run.agents, *edited),
                *again,
            )
        if not fits:
            way.say(
                "re-target it to the tool's new name, with --arguments that fit it "
                f"({PROG} retarget with --agents {run.agents})"
            )
    else:
        unfit = tool_call_problem(*tool, arguments)
        if unfit is None:
            return None, way
        problem = (
            f"the call {call} {waiting}, but its arguments no longer fit the tool "
            f"{approval.tool}: {unfit}"
            + ("" if pending else "; the resumed turn would not run it")
        )
        text, holes = _fitting(tool[1], arguments)
        complete = not holes and tool_call_problem(*tool, json.loads(text)) is None
        fill = (
            "with each <...> filled in: "
            if holes
            else ""
            if complete
            else "with the values that do not fit corrected: "
        )
        if pending:
            approve = run("approve", ident, "--agents", run.agents, "--arguments", text)
            way.say(
                f"approve it with arguments that fit the new code ({fill}{{}})",
                approve,
                unrunnable=() if complete else (approve,),
            )
            way.say(
                "deny it ({}): the model reads the reason",
                run("deny", ident, "--reason", f"{approval.tool} takes other arguments now"),
            )
        else:
            retarget = run(
                "retarget", ident, approval.tool, "--agents", run.agents, "--arguments", text
            )
            way.say(
                f"re-target it to arguments that fit ({fill}{{}}){then}",
                retarget,
                *again,
                unrunnable=() if complete else (retarget,),
            )
    before = approval.suspended_in - 1
    if before >= 1:
        way.say(
            "roll the agent back to before the suspended turn ({})",
            run("rollback", approval.agent_id, str(before)),
        )
    return problem, way


def _fitting(tool: Tool[..., Any], arguments: Mapping[str, Any]) -> tuple[str, list[str]]:
    """``arguments`` cut to what ``tool`` takes, as JSON text, with a hole ``<name:
    type>`` for each required parameter they miss (what a person completes), and
    the holes."""
    parameters = inspect.signature(tool).parameters
    parts = [
        f"{json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}"
        for key, value in arguments.items()
        if key in parameters
    ]
    holes = []
    for key, parameter in parameters.items():
        if key in arguments or parameter.default is not inspect.Parameter.empty:
            continue
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            continue
        annotation = parameter.annotation
        kind = "value" if annotation is inspect.Parameter.empty else _type_name(annotation)
        holes.append(f"<{key}: {kind}>")
        parts.append(f"{json.dumps(key)}: {holes[-1]}")
    return "{" + ", ".join(parts) + "}", holes


def _type_name(annotation: Any) -> str:
    return annotation.__name__ if isinstance(annotation, type) else str(annotation)


def tool_call_problem(key: str, tool: Tool[..., Any], arguments: Any) -> str | None:
    """Why the model's call of ``tool`` with ``arguments`` would not decode now, or None.

    The call is decoded exactly as a resumed turn decodes it, which is as effectful
    decodes the model's (an unknown or a missing argument, a value of the wrong type).
    """
    raw = {
        "id": "check",
        "type": "function",
        "function": {"name": key, "arguments": json.dumps(arguments)},
    }
    try:
        decode_tool_call(raw, {key: tool})
    except (LookupError, TypeError, ValueError) as error:
        return _one_line(error)
    return None


# -- alarms and events ------------------------------------------------------------------


def _deliveries(agent: PersistentAgent, shape: Shape, stored: StoredAgent) -> list[Break]:
    found: list[Break] = []
    name = type(agent).__name__
    for alarm in stored.alarms:
        what = f"alarm {alarm.alarm_id} ({alarm.action!r}, {alarm.status})"
        problem = _callback_problem(shape, "on_alarm", (alarm.action,))
        if problem is not None:
            found.append(
                Break(
                    "alarm",
                    stored.agent_id,
                    alarm.alarm_id,
                    f"{what} is delivered by calling on_alarm, but {problem}",
                    f"mix AlarmTools back into {name} or define on_alarm, or cancel the alarm "
                    "(Store.cancel_alarm)",
                )
            )
    for event in stored.events:
        what = f"event {event.event_id} ({event.name!r}, {event.status})"
        payload = json.dumps(event.payload, ensure_ascii=False)
        problem = _callback_problem(shape, "on_event", (event.name, payload))
        if problem is not None:
            found.append(
                Break(
                    "event",
                    stored.agent_id,
                    event.event_id,
                    f"{what} is delivered by calling on_event, but {problem}",
                    f"mix OnEvent back into {name} or define on_event, or let a workflow "
                    "step take it (wait_for_event)",
                )
            )
    return found


def _callback_problem(shape: Shape, name: str, arguments: tuple[Any, ...]) -> str | None:
    template = shape.templates.get(name)
    if template is None:
        return f"the agent has no template {name} any more"
    try:
        bound = template.__signature__.bind(*arguments)
    except TypeError as error:
        return f"{name}{template.__signature__} no longer takes these arguments ({error})"
    for parameter, value in bound.arguments.items():
        annotation = template.__signature__.parameters[parameter].annotation
        if annotation is inspect.Parameter.empty:
            continue
        try:
            pydantic.TypeAdapter(annotation).validate_python(value)
        except pydantic.ValidationError as error:
            return f"its {parameter} no longer fits {name}'s parameter: {_one_line(error)}"
    return None


# -- fields and memory ------------------------------------------------------------------


def _fields(agent: PersistentAgent, stored: StoredAgent, run: Commands) -> list[Break]:
    cls = type(agent)
    found: list[Break] = []
    problems: list[tuple[str | None, FieldProblem]] = []
    if stored.held.state:
        problems += [(None, problem) for problem in state_problems(cls, stored.held.state)]
    for held in stored.held.conversations:
        if held.fields:
            problems += [
                (held.conversation, problem)
                for problem in state_problems(cls, held.fields, per_conversation=True)
            ]
    for conversation, problem in problems:
        where = f" (conversation {conversation!r})" if conversation is not None else ""
        if problem.kind == "migration":
            way = "register the missing migration with @migrates_state, or fix the one that fails"
        elif problem.kind == "dropped":
            way = (
                "keep the field, or declare __state_version__ and register a migration "
                "(@migrates_state) that moves or drops the value on purpose"
            )
        else:
            way = (
                "change the field's type back, or register a migration (@migrates_state) that "
                f"converts the value; `{run('migrate-state', '--agents', run.agents)}` commits "
                "it"
            )
        found.append(Break("state", stored.agent_id, problem.field, problem.detail + where, way))
    return found


def _memory(agent: PersistentAgent, stored: StoredAgent, run: Commands) -> list[Break]:
    memory = stored.held.memory
    if not memory:
        return []
    name = type(agent).__name__
    if not isinstance(agent, StateTools):
        return [
            Break(
                "memory",
                stored.agent_id,
                "StateTools",
                f"the agent's memory holds {len(memory)} keys, but {name} no longer "
                "mixes in StateTools: its model can no longer read or change them",
                "mix StateTools back in; the keys stay in the database either way "
                f"(`{run('memory', stored.agent_id)}`)",
            )
        ]
    limits = getattr(agent, "__memory_limits__", None) or MemoryLimits()
    found: list[Break] = []
    if len(memory) > limits.keys:
        found.append(
            Break(
                "memory",
                stored.agent_id,
                "keys",
                f"the memory holds {len(memory)} keys, more than {name}'s new limit of "
                f"{limits.keys}: every new key will be refused",
                "raise __memory_limits__ keys, or delete keys first",
            )
        )
    for key, value in memory.items():
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        if len(key) > limits.key_chars or size > limits.value_bytes:
            found.append(
                Break(
                    "memory",
                    stored.agent_id,
                    key,
                    f"the key {key[:60]!r} ({len(key)} characters, {size} bytes of value) is "
                    f"over {name}'s new limits ({limits.key_chars} characters, "
                    f"{limits.value_bytes} bytes): the model cannot write it back",
                    "raise __memory_limits__, or shorten the value",
                )
            )
    return found


# -- histories ---------------------------------------------------------------------------


def _histories(agent: PersistentAgent, shape: Shape, stored: StoredAgent) -> list[Break]:
    found: list[Break] = []
    waiting = {(a.conversation, a.tool_call_id): a for a in stored.approvals}
    for conversation in stored.held.conversations:
        calls = dict(conversation.calls)
        resumed = _calls_as_resumed(conversation, waiting)
        gone = Counter(
            name.removeprefix(_METHOD) for _, name, _ in resumed if name not in shape.tools
        )
        asked = sum(1 for _, name, waits in resumed if waits and name not in shape.tools)
        where = f"conversation {conversation.conversation!r}"
        if gone:
            listed = ", ".join(f"{name} ({count}x)" for name, count in sorted(gone.items()))
            way = (
                "keep the old tools (a stub that says the tool is gone will do), or compact "
                "the conversation, or start a new one"
            )
            if asked == gone.total():  # only calls that wait: their approvals settle them
                way = (
                    "re-target or deny the approval the call waits on (see the approval): "
                    "that settles the call here too"
                )
            elif asked:
                way = (
                    "for the call that waits, re-target or deny its approval; for the others, "
                    + way
                )
            found.append(
                Break(
                    "history",
                    stored.agent_id,
                    conversation.conversation,
                    f"the {where}'s context calls tools {type(agent).__name__} no longer has: "
                    f"{listed}; some providers refuse such a history",
                    way,
                )
            )
        unanswered = [
            call_id
            for call_id in calls
            if call_id not in conversation.answered
            and (conversation.conversation, call_id) not in waiting
        ]
        if unanswered:
            found.append(
                Break(
                    "history",
                    stored.agent_id,
                    conversation.conversation,
                    f"the {where}'s context has {len(unanswered)} tool call(s) without a "
                    f"result ({', '.join(calls[c] for c in unanswered[:5])}): providers refuse "
                    "every later request",
                    "roll the agent back to a version before the call, or start a new "
                    "conversation",
                )
            )
    return found


def _calls_as_resumed(
    conversation: ConversationInFlight, waiting: Mapping[tuple[str, str], ApprovalInfo]
) -> list[tuple[str, str, bool]]:
    """The tool calls of the conversation's context as the resumed turns leave it:
    ``(call id, tool name, whether it waits on an approval)``. A call under an
    approval names the approval's tool (a retarget's: the resumed turn rewrites the
    call so); a call a person denied is left out (it never ran, and its result says
    so to the model, whatever the tool became)."""
    found = []
    for call_id, name in conversation.calls:
        approval = waiting.get((conversation.conversation, call_id))
        if approval is None:
            if call_id not in conversation.denied:
                found.append((call_id, name, False))
        elif approval.status != "denied":
            prefix = _METHOD if name.startswith(_METHOD) else ""
            found.append((call_id, prefix + approval.tool, True))
    return found


def _json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _one_line(error: Exception) -> str:
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text if len(text) <= 300 else text[:297] + "..."
