"""The ``effectful-durable`` command: inspect and repair a database from the shell.

It imports only the store, never effectful's LLM layer or litellm, so it starts fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from .errors import DurableError
from .store import Store
from .store.history import message_text

PROG = "effectful-durable"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code (0 ok, 1 error, 2 usage).

    .. versionadded:: 0.1.0
    """
    args = _parser().parse_args(argv)
    if args.command == "delete" and not args.yes:
        print(
            f"{PROG}: error: delete removes every version of {args.agent!r}; "
            "pass --yes to confirm",
            file=sys.stderr,
        )
        return 2
    if not os.path.exists(args.db):
        print(f"{PROG}: error: no database at {args.db}", file=sys.stderr)
        return 1
    try:
        with Store(args.db, readonly=args.command in _READS) as store:
            return int(args.run(store, args) or 0)
    except DurableError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        # The reader (`| head`) left: stop quietly, like other Unix tools.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# -- reads ----------------------------------------------------------------------


def _agents(store: Store, args: argparse.Namespace) -> None:
    records = store.agents()
    _show(args, records, ["agent_id", "version", "messages", "updated_at"])


def _history(store: Store, args: argparse.Namespace) -> None:
    messages = store.history(args.agent, args.version, include_compacted=args.all)
    if args.json:
        _print_json(messages)
        return
    for message in messages:
        mark = message.get("durable", {})
        tag = (
            f" [compacted in v{mark['compacted_in']}]"
            if "compacted_in" in mark
            else f" [summary of {mark['summary_of']}]"
            if "summary_of" in mark
            else ""
        )
        print(f"{message.get('role', '?'):>9}{tag}  {_one_line(message)}")


def _state(store: Store, args: argparse.Namespace) -> None:
    _print_json(store.state(args.agent, args.version))


def _versions(store: Store, args: argparse.Namespace) -> None:
    columns = ["version", "kind", "template", "added", "removed", "state_changed", "committed_at"]
    _show(args, store.versions(args.agent), columns)


def _handoffs(store: Store, args: argparse.Namespace) -> None:
    columns = ["agent_id", "status", "template", "base_version", "pid", "started_at", "error"]
    _show(args, store.handoffs(), columns)


def _workflows(store: Store, args: argparse.Namespace) -> None:
    columns = ["workflow", "steps", "done", "running", "failed", "updated_at"]
    _show(args, store.workflows(), columns)


def _steps(store: Store, args: argparse.Namespace) -> None:
    columns = ["number", "key", "template", "status", "version", "started_at", "finished_at"]
    _show(args, store.steps(args.workflow), columns)


def _check(store: Store, args: argparse.Namespace) -> int:
    facts = store.check()
    if args.json:
        _print_json(facts)
    else:
        for name, value in facts.items():
            print(f"{name:>15}  {value}")
    return 0 if facts["integrity"] == "ok" else 1


_READS = {"agents", "history", "state", "versions", "handoffs", "workflows", "steps", "check"}

# -- maintenance ------------------------------------------------------------------


def _rollback(store: Store, args: argparse.Namespace) -> None:
    version = store.rollback(args.agent, args.version)
    print(f"{args.agent}: version {version} now equals version {args.version}")


def _fork(store: Store, args: argparse.Namespace) -> None:
    record = store.fork(args.agent, args.version, args.new_id)
    print(f"{record.agent_id}: version 1, {record.messages} messages, forked from {args.agent}")


def _delete(store: Store, args: argparse.Namespace) -> None:
    store.delete(args.agent)
    print(f"{args.agent}: deleted")


def _reset_workflow(store: Store, args: argparse.Namespace) -> None:
    rolled_back = store.reset_workflow(args.workflow, args.from_step)
    agents = ", ".join(rolled_back) or "none"
    print(f"{args.workflow}: steps {args.from_step} and later forgotten; rolled back: {agents}")


# -- output -----------------------------------------------------------------------


def _show(args: argparse.Namespace, records: Sequence[Any], columns: list[str]) -> None:
    """Print records as JSON, or as a table of ``columns``."""
    if args.json:
        _print_json([dataclasses.asdict(r) for r in records])
        return
    rows = [[_cell(getattr(r, c)) for c in columns] for r in records]
    widths = [max(len(c), *(len(row[i]) for row in rows)) for i, c in enumerate(columns)]
    for row in [columns, *rows]:
        print(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        )


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.replace(microsecond=0).isoformat().replace("+00:00", "Z")
    return _shorten(str(value), 60)


def _one_line(message: dict[str, Any]) -> str:
    return _shorten(" ".join(message_text(message).split()), 100)


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str, ensure_ascii=False))


# -- arguments --------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: Callable[..., Any], help: str, *, json: bool = True) -> Any:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("db", help="the database file")
        if json:
            sub.add_argument("--json", action="store_true", help="print JSON")
        sub.set_defaults(run=run)
        return sub

    command("agents", _agents, "list the agents: version, active messages, last commit")
    sub = command("history", _history, "print an agent's messages, one per line")
    sub.add_argument("agent")
    sub.add_argument("--version", type=int, help="at this version (default: latest)")
    sub.add_argument("--all", action="store_true", help="include compacted originals")
    sub = command("state", _state, "print an agent's persisted fields as JSON", json=False)
    sub.add_argument("agent")
    sub.add_argument("--version", type=int, help="at this version (default: latest)")
    command("versions", _versions, "list an agent's versions").add_argument("agent")
    command("handoffs", _handoffs, "list turns that started and did not commit")
    command("workflows", _workflows, "list workflow journals and their step counts")
    command("steps", _steps, "list a workflow's steps").add_argument("workflow")
    command("check", _check, "run PRAGMA integrity_check and print quick facts")

    sub = command("rollback", _rollback, "commit a version equal to an older one", json=False)
    sub.add_argument("agent")
    sub.add_argument("version", type=int)
    sub = command("fork", _fork, "copy an agent (at a version) into a new agent", json=False)
    sub.add_argument("agent")
    sub.add_argument("new_id")
    sub.add_argument("--version", type=int, help="the version to copy (default: latest)")
    sub = command("delete", _delete, "delete an agent and all its versions", json=False)
    sub.add_argument("agent")
    sub.add_argument("--yes", action="store_true", help="confirm the deletion")
    sub = command(
        "reset-workflow",
        _reset_workflow,
        "make a workflow redo its steps from one on",
        json=False,
    )
    sub.add_argument("workflow")
    sub.add_argument("--from-step", type=int, default=1, help="first step to redo (default 1)")
    return parser
