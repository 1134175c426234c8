"""Before new code runs: ``check-upgrade``, and the repairs its report names that need the
new code, ``migrate-state`` and ``retarget`` (and ``approve --agents``'s check).

They load the user's new agent code (``--agents MODULE:FUNC``), and with it effectful's
LLM layer: what they import of ``upgrades/``, ``handlers/`` and ``agents/`` they import
when they run. Their errors read as the library words them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from ..errors import DurableError
from ..store import Store
from ..store.engine.seam import redacted
from ..store.rows import typed_json
from ..upgrades.report import UpgradeReport
from .command import (
    FACTORY,
    PROG,
    Family,
    Flag,
    Run,
    as_said,
    fail,
    flag,
    keys_from_environment,
    report_path,
    unusable,
)
from .loader import build, load

COMMANDS = Family("Before new code runs")


def _new_code(name: str, help: str, *flags: Flag, json: bool = False) -> Callable[[Run], Run]:
    """Declare a command that loads the new code and runs it on DB, which must exist."""

    def declare(run: Run) -> Run:
        def on_file(args: argparse.Namespace) -> int:
            problem = unusable(args.db)
            return fail(problem) if problem else run(args)

        COMMANDS.command(name, help, *flags, json=json, words=as_said)(on_file)
        return run

    return declare


@_new_code(
    "check-upgrade",
    "check what new agent code does to every agent in flight; exit 3 if anything breaks",
    flag(
        "--agents",
        required=True,
        metavar="MODULE:FUNC",
        help="the new code's factory of an agent from its id: check what it cannot carry "
        "(approvals, alarms, events, fields, memory, histories)",
    ),
    flag(
        "--handlers",
        metavar="MODULE:FUNC",
        help="the new code's handler stack, as for run (its PersistenceHandler's code_version)",
    ),
    flag(
        "--workflow",
        metavar="MODULE:FUNC",
        help="runs the workflow's program, given a handler factory; replayed in a dry run",
    ),
    flag("--code-version", metavar="TEXT", help="the new code's version, for the report"),
    flag(
        "--report",
        metavar="FILE",
        help="keep the report here for the page (default: DB.check.json beside an SQLite file)",
    ),
    json=True,
)
def upgrade_check(args: argparse.Namespace) -> int:
    """Print what the new code cannot carry; exit 0, 3 (something breaks) or 1."""
    from ..upgrades import check_upgrade

    agents = load(args.agents, "--agents")
    workflow = load(args.workflow, "--workflow") if args.workflow else None
    code_version = args.code_version or _handlers_code_version(args.handlers)
    bar = _Bar() if sys.stderr.isatty() and not args.json else None
    with Store(args.db, readonly=True, keys=keys_from_environment()) as store:
        report = check_upgrade(
            store, agents=agents, workflow=workflow, code_version=code_version, progress=bar
        )
    if bar is not None:
        bar.done()
    unbuilt = [b for b in report.breaks if b.kind == "agent"]
    if unbuilt and len(unbuilt) == report.in_flight["agents"]:
        # The factory builds no agent at all: the new code is broken, not the agents.
        return fail(
            f"the --agents factory {args.agents!r} cannot build any agent the database "
            f"holds ({len(unbuilt):,}); {unbuilt[0].agent_id!r}: "
            f"{unbuilt[0].problem.removeprefix('the new code cannot build it: ')}"
        )
    saved = report_path(args.db, args.report)
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
    from ..runner.config import RunnerConfig

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


@_new_code(
    "migrate-state",
    "commit agents' fields migrated to their class's __state_version__",
    FACTORY,
    flag("--agent", metavar="AGENT", help="only this agent (default: all)"),
    flag("--dry-run", action="store_true", help="say what would be migrated"),
    flag("--code-version", metavar="TEXT", help="recorded with each migration"),
)
def migrate_state(args: argparse.Namespace) -> int:
    """Commit migrated fields, one version an agent."""
    from ..upgrades import migrate_states

    factory = load(args.agents, "--agents")
    with Store(args.db, keys=keys_from_environment()) as store:
        migrated = migrate_states(
            store,
            agents=lambda agent_id: build(factory, args.agents, agent_id),
            agent_id=args.agent,
            dry_run=args.dry_run,
            code_version=args.code_version,
        )
    for one in migrated:
        done = "would be migrated" if one.version is None else f"version {one.version} committed"
        print(
            f"{one.agent_id}: fields from state version {one.from_version} to "
            f"{one.to_version}: {done}"
        )
    if not migrated:
        print(f"{redacted(args.db)}: every agent's fields are at its class's state version")
    return 0


@_new_code(
    "retarget",
    "make a waiting approval name a renamed tool",
    flag("approval", metavar="APPROVAL_ID", help="the approval id (apr_...)"),
    flag("tool", metavar="TOOL", help="the tool's name in the new code"),
    FACTORY,
    flag(
        "--arguments",
        metavar="JSON",
        help="the call's arguments for the new tool (default: the model's, if they fit)",
    ),
    flag("--by", metavar="NAME", help="who re-targets it (default: your user name)"),
)
def retarget(args: argparse.Namespace) -> int:
    """Point an approval at a renamed tool of the new code."""
    from ..handlers.effectful_hooks import tool_parameters
    from ..upgrades.agent_checks import Shape, command, tool_call_problem

    agents = load(args.agents, "--agents")
    with Store(args.db, keys=keys_from_environment()) as store:
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


def approve_parameters(
    store: Store, approval_id: str, spec: str, arguments: Any
) -> tuple[dict[str, Any], str]:
    """``approve --agents``: the JSON schema of the approval's tool in the new code, which
    its arguments (``arguments``, or the model's if None) fit, and a line saying so.

    Raises:
        DurableError: The new code cannot be loaded or build the agent, has no such
            tool, or the arguments do not fit it. Nothing was changed.
    """
    from ..handlers.effectful_hooks import tool_parameters
    from ..upgrades.agent_checks import Shape, command, tool_call_problem

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
