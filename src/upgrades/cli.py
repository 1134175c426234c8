"""``effectful-durable check-upgrade``, ``migrate-state``, ``retarget`` and ``approve
--agents``: the commands that import the user's new agent code (and so effectful's LLM
layer)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace
from typing import Any

from ..agents.persistent import PersistentAgent
from ..errors import DurableError
from ..handlers.effectful_hooks import tool_parameters
from ..runner.cli import failure, load
from ..runner.config import RunnerConfig
from ..store import Store
from ..store.engine.seam import redacted
from ..store.rows import typed_json
from .agent_checks import Shape, command, tool_call_problem
from .check import check_upgrade
from .migrate import migrate_states
from .report import UpgradeReport

PROG = "effectful-durable"


def check_command(args: argparse.Namespace) -> int:
    """``check-upgrade DB --agents MOD:FUNC``: print what the new code cannot carry; 0, 3 or 1."""
    try:
        agents = load(args.agents, "--agents")
        workflow = load(args.workflow, "--workflow") if args.workflow else None
        code_version = args.code_version or _handlers_code_version(args.handlers)
        bar = _Bar() if sys.stderr.isatty() and not args.json else None
        report = check_upgrade(
            args.db, agents=agents, workflow=workflow, code_version=code_version, progress=bar
        )
        if bar is not None:
            bar.done()
    except DurableError as error:
        return _fail(str(error))
    except KeyboardInterrupt:
        return 130
    unbuilt = [b for b in report.breaks if b.kind == "agent"]
    if unbuilt and len(unbuilt) == report.in_flight["agents"]:
        # The factory builds no agent at all: the new code is broken, not the agents.
        return _fail(
            f"the --agents factory {args.agents!r} cannot build any agent the database "
            f"holds ({len(unbuilt):,}); {unbuilt[0].agent_id!r}: "
            f"{unbuilt[0].problem.removeprefix('the new code cannot build it: ')}"
        )
    saved = args.report
    if saved is not None:
        try:
            _save(saved, report)
        except OSError as error:  # the report still prints; the page shows an older one
            print(f"{PROG}: warning: cannot keep the report in {saved}: {error}", file=sys.stderr)
            saved = None
    if args.json:
        print(json.dumps(report.to_json(), indent=2, ensure_ascii=False))
    else:
        _print_report(report, saved)
    return report.exit_status


def _handlers_code_version(spec: str | None) -> str | None:
    """The ``code_version`` of the PersistenceHandler the ``--handlers`` stack holds, if any."""
    if spec is None:
        return None
    from ..handlers.persistence import PersistenceHandler

    try:
        stack = list(load(spec, "--handlers")(RunnerConfig()))
    except DurableError:
        raise
    except Exception as error:  # the user's factory: say so, with what it raised
        msg = f"the --handlers factory {spec!r} failed: {type(error).__name__}: {error}"
        raise DurableError(msg) from error
    found = None
    for part in stack:
        if isinstance(part, PersistenceHandler):
            found = found or part.code_version
            part.close()
    return found


class _Bar:
    """A progress line on the terminal: agents checked of all, redrawn in place."""

    def __call__(self, done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        bar = "#" * filled + "-" * (width - filled)
        print(f"\rchecking [{bar}] {done:,}/{total:,} agents", end="", file=sys.stderr, flush=True)

    def done(self) -> None:
        print(file=sys.stderr)


def _save(path: str, report: UpgradeReport) -> None:
    temporary = f"{path}.tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(report.to_json(), out, indent=2, ensure_ascii=False)
    os.replace(temporary, path)  # the page never reads half a report


def _print_report(report: UpgradeReport, saved: str | None) -> None:
    counts = report.in_flight
    looked = ", ".join(_counted(number, key) for key, number in counts.items())
    print(f"{report.database}: checked {looked} in {report.seconds:.1f} s")
    versions = ", ".join(f"{code} ({n:,})" for code, n in report.code_versions.items())
    print(f"code versions in flight: {versions or 'none'}")
    if report.code_version is not None:
        print(f"new code: {report.code_version}")
    for run in report.workflows:
        print(f"workflow {run.workflow or '(none named)'}: {run.summary}")
    if report.breaks:
        print(f"\n{len(report.breaks)} piece(s) of in-flight work the new code cannot carry:")
        for problem in report.breaks:
            print(f"  {problem.kind:<8} {problem.agent_id or '-'}  {problem.subject}")
            print(f"           {problem.problem}")
            print(f"           -> {problem.way_forward}")
    print()
    if report.ok:
        print("everything in flight carries over to the new code")
    else:
        broken = len(report.breaks) + sum(not run.carries_over for run in report.workflows)
        print(f"{broken} problem(s): nothing was written; fix them before the new code runs")
    if saved is not None:
        print(f"report saved to {saved} (the page shows it)")


def _counted(number: int, plural: str) -> str:
    return f"{number:,} {plural if number != 1 else plural.removesuffix('s')}"


def migrate_command(args: argparse.Namespace) -> int:
    """``migrate-state DB --agents MOD:FUNC``: commit migrated fields, one version an agent."""
    try:
        factory = load(args.agents, "--agents")
        migrated = migrate_states(
            args.db,
            agents=lambda agent_id: build(factory, args.agents, agent_id),
            agent_id=args.agent,
            dry_run=args.dry_run,
            code_version=args.code_version,
        )
    except DurableError as error:
        return _fail(str(error))
    for one in migrated:
        done = "would be migrated" if one.version is None else f"version {one.version} committed"
        print(
            f"{one.agent_id}: fields from state version {one.from_version} to "
            f"{one.to_version}: {done}"
        )
    if not migrated:
        print(f"{redacted(args.db)}: every agent's fields are at its class's state version")
    return 0


def retarget_command(args: argparse.Namespace) -> int:
    """``retarget DB APPROVAL TOOL --agents MOD:FUNC``: point an approval at a renamed tool."""
    try:
        agents = load(args.agents, "--agents")
        with Store(args.db) as store:
            approval = store.approval(args.approval)
            agent = build(agents, args.agents, approval.agent_id)
            shape = Shape.of(agent)
            found = shape.tool(args.tool)
            if found is None:
                msg = (
                    f"{type(agent).__name__} has no tool {args.tool!r} (it has: "
                    f"{shape.tool_names()}); nothing was changed"
                )
                raise DurableError(msg)
            arguments = approval.arguments if args.arguments is None else _object(args.arguments)
            problem = tool_call_problem(*found, arguments)
            if problem is not None:
                msg = (
                    f"the arguments {json.dumps(arguments)} do not fit {args.tool} in the new "
                    f"code ({args.agents}): {problem}; pass --arguments JSON that fit; nothing "
                    "was changed"
                )
                raise DurableError(msg)
            changed = store.retarget_approval(
                args.approval,
                tool=args.tool,
                arguments=arguments,
                parameters=tool_parameters(SimpleNamespace(name=found[0], tool=found[1])),
                by=args.by,
            )
    except DurableError as error:
        return _fail(str(error))
    print(
        f"{changed.approval_id}: agent {changed.agent_id!r} now asks to run "
        f"{changed.tool}({json.dumps(changed.arguments)}), checked against the new code's "
        f"signature of {changed.tool} ({args.agents})"
    )
    if approval.status == "approved":
        print(f"it waits for a decision again: {approval.decided_by} approved the call before")
    approve = command("approve", redacted(args.db), changed.approval_id, "--agents", args.agents)
    print(f"approve it (`{approve}`) or deny it as before")
    return 0


def approve_parameters(
    store: Store, approval_id: str, spec: str, arguments: Any
) -> tuple[dict[str, Any], str]:
    """``approve --agents``: the JSON schema of the approval's tool in the new code, which
    its arguments (``arguments``, or the model's if None) fit, and a line saying so.

    Raises:
        DurableError: The new code cannot be loaded or build the agent, has no such
            tool, or the arguments do not fit it. Nothing was changed.
    """
    agents = load(spec, "--agents")
    approval = store.approval(approval_id)
    agent = build(agents, spec, approval.agent_id)
    shape = Shape.of(agent)
    found = shape.tool(approval.tool)
    if found is None:
        retarget = command("retarget", redacted(store.path), approval_id, "TOOL", "--agents", spec)
        msg = (
            f"{type(agent).__name__} has no tool {approval.tool!r} in the new code ({spec}; it "
            f"has: {shape.tool_names()}): re-target the approval to the tool's new name "
            f"first (`{retarget}`); nothing was changed"
        )
        raise DurableError(msg)
    chosen = approval.arguments if arguments is None else arguments
    problem = tool_call_problem(*found, chosen) if isinstance(chosen, dict) else None
    if problem is not None:
        msg = (
            f"the arguments {json.dumps(chosen)} do not fit {approval.tool} in the new code "
            f"({spec}): {problem}; pass --arguments JSON that fit; nothing was changed"
        )
        raise DurableError(msg)
    parameters = tool_parameters(SimpleNamespace(name=found[0], tool=found[1]))
    if parameters == store.approval_parameters(approval_id):
        said = (
            f"arguments checked against the new code's signature of {approval.tool} "
            f"({spec}), the same as the schema stored with the approval"
        )
    else:
        said = (
            f"arguments checked against the new code's signature of {approval.tool} "
            f"({spec}), not the schema stored with the approval (when the turn suspended), "
            "which differs; the new one is stored in its place"
        )
    return parameters, said


def build(agents: Any, spec: str, agent_id: str) -> PersistentAgent:
    """The agent ``agent_id`` as the ``--agents`` factory builds it.

    Raises:
        DurableError: In one line: the factory raised (where, in the user's code),
            or returned no PersistentAgent.
    """
    try:
        agent = agents(agent_id)
    except Exception as error:
        msg = f"the --agents factory {spec!r} cannot build agent {agent_id!r}: {failure(error)}"
        raise DurableError(msg) from error
    if not isinstance(agent, PersistentAgent):
        msg = (
            f"the --agents factory {spec!r} returned a {type(agent).__name__} for agent "
            f"{agent_id!r}, not a PersistentAgent"
        )
        raise DurableError(msg)
    return agent


def _object(text: str) -> dict[str, Any]:
    try:
        value = typed_json(text)
    except ValueError as error:
        msg = f"--arguments is not valid JSON ({error}); nothing was changed"
        raise DurableError(msg) from error
    if not isinstance(value, dict):
        msg = f"--arguments must be a JSON object, not {text!r}; nothing was changed"
        raise DurableError(msg)
    return value


def _fail(message: str) -> int:
    print(f"{PROG}: error: {' '.join(message.splitlines())}", file=sys.stderr)
    return 1
