"""The ``effectful-durable`` command: inspect and repair a database from the shell.

It imports only the store and the errors, never effectful's LLM layer or litellm, so
it starts in a fraction of a second. DB is an SQLite file or a ``postgresql://`` URL.
Reads open it read-only; only ``copy`` creates a database, its target.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from .errors import DurableError, InvalidDecisionError
from .store import Store
from .store.copy import copy_store
from .store.engine.seam import is_postgres_url, redacted
from .store.history import message_text
from .store.records import ApprovalInfo
from .store.rows import typed_json
from .store.workspace.workspace import jsonable

PROG = "effectful-durable"
_DESCRIPTION = "Inspect and repair an effectful-durable database without loading an LLM."

# Tables fit a 100-column terminal: a cell is cut at 40 characters, and the last
# column at what is left of the line (at least 40); --json prints everything.
_LINE_WIDTH = 100
_CELL_WIDTH = 40

type _Run = Callable[[Store, argparse.Namespace], int]


def main(argv: list[str] | None = None) -> int:
    """Run the ``effectful-durable`` command line.

    Every :class:`~effectful_durable.DurableError` (a file that is not ours, an
    unknown agent, an agent in use, ...) becomes one line on stderr,
    ``effectful-durable: error: <message>``, and exit code 1; no traceback.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code: 0 on success, 1 on an error or a failed ``check``, 2 on a
        usage error (including ``delete`` and ``prune`` without ``--yes``, and
        ``reset-workflow`` without it when agents would be deleted, and JSON
        arguments that do not parse), 130 on Ctrl-C.

    Example::

        $ effectful-durable history state.db support-bot --version 3

    .. versionadded:: 0.1.0
    """
    try:
        args = _parser().parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error argparse already printed
        return stop.code if isinstance(stop.code, int) else 2
    if args.command == "run":
        return _run(args)  # a long-running process: it logs, library loggers included
    if args.command == "ui":
        return _ui(args)
    if args.command in _NEW_CODE:
        return _new_code(args)
    with _library_logs_quiet():
        return _command(args)


def _command(args: argparse.Namespace) -> int:
    """Run every command but ``run``; its errors as one line on stderr."""
    if args.command == "delete" and not args.yes:
        return _fail(
            f"delete removes agent {args.agent!r} with all its versions and messages "
            "for good; pass --yes to confirm",
            code=2,
        )
    if args.command == "copy":
        return _copy(args)
    if args.command == "prune" and args.keep is None and args.older_than is None:
        return _fail("prune needs a rule: pass --keep N, --older-than AGE or both", code=2)
    problem = _json_arguments(args)
    if problem:
        return _fail(problem, code=2)
    if args.command == "prune" and not args.yes:
        whose = f"agent {args.agent!r}" if args.agent else "every agent"
        return _fail(
            f"prune deletes the older versions of {whose} for good (they can no longer "
            "be read or rolled back to); pass --yes to confirm",
            code=2,
        )
    problem = _unusable(args.db)
    if problem:
        return _fail(problem)
    run: _Run = args.run
    try:
        if is_postgres_url(args.db) and args.command not in _READ_ONLY:
            Store(args.db, readonly=True).close()  # refuses an empty database: none is made
        with Store(args.db, readonly=args.command in _READ_ONLY) as store:
            return run(store, args)
    except DurableError as error:
        return _fail(_cli_words(str(error), redacted(args.db)))
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (`| head`) left: stop quietly, like other Unix tools, and keep
        # Python from failing again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


# The libraries whose loggers a command keeps off the terminal: psycopg_pool logs
# each failed connection attempt as a WARNING, which Python's last-resort handler
# prints above the command's one line (docs.python.org/3/howto/logging.html, "What
# happens if no configuration is provided"). A program that calls main() with
# logging configured still gets them: the records propagate as before.
_LIBRARY_LOGGERS = ("psycopg",)


@contextmanager
def _library_logs_quiet() -> Iterator[None]:
    """Keep the libraries' log records off stderr while a command runs."""
    quiet = logging.NullHandler()
    loggers = [logging.getLogger(name) for name in _LIBRARY_LOGGERS]
    for logger in loggers:
        logger.addHandler(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(quiet)


def _unusable(path: str) -> str | None:
    """Why ``path`` cannot be opened without creating or changing it, or None."""
    if is_postgres_url(path):
        return None  # the Store says what is wrong with a server or its database
    if not os.path.exists(path):
        return f"no database at {path}: the file does not exist (nothing was created)"
    if os.path.isdir(path):
        return f"{path} is a directory; pass the path of a database file"
    if os.path.getsize(path) == 0:
        return f"{path} is an empty file, not an effectful-durable database yet"
    return None


def _fail(message: str, *, code: int = 1) -> int:
    line = " ".join(message.splitlines())  # one line, whatever an error quotes
    print(f"{PROG}: error: {line}", file=sys.stderr)
    return code


def _cli_words(message: str, db: str) -> str:
    """An error message in the command line's words rather than the Python API's."""
    for python, shell in (
        ("Store.agents() lists the agents it holds", f"`{PROG} agents {db}` lists them"),
        (
            "Store.workflows() lists the journals it holds",
            f"`{PROG} workflows {db}` lists them",
        ),
        (
            "wait for that turn to finish, pass wait=<seconds> to PersistenceHandler to "
            "wait for it, or fork the agent to run a copy.",
            "run the command again once that turn has finished.",
        ),
        (
            "Retry, or raise busy_timeout if writers hold it this long on purpose.",
            "Run the command again once that writer has finished.",
        ),
        (
            "open it read-write once (Store(path)) to roll that write back, then read it",
            f"run `{PROG} vacuum {db}` once to roll that write back, then read it",
        ),
        (
            "open it once read-write to migrate it",
            f"run `{PROG} vacuum {db}` once to migrate it",
        ),
        (
            "`effectful-durable approvals` (Store.approvals()) lists them",
            f"`{PROG} approvals {db}` lists them",
        ),
        ("(Store.agents() lists them)", f"(`{PROG} agents {db}` lists them)"),
        ("Store.alarms() lists them", f"`{PROG} alarms {db}` lists them"),
        ("Store.events() lists them", f"`{PROG} events {db}` lists them"),
        ("pass create=True (--create)", "pass --create"),
        ("invalid agent_id", "invalid agent id"),
        ("made with Store.backup", f"made with `{PROG} backup`"),
        (
            "pass on_unreadable='quarantine' to move it aside and start a new database",
            "move it aside with its -wal and -shm files to start a new database",
        ),
        (f"`{PROG} check`", f"`{PROG} check {db}`"),
    ):
        message = message.replace(python, shell)
    return re.sub(r", found during [\w.]+\(\)", "", message)


# -- reads ----------------------------------------------------------------------


def _agents(store: Store, args: argparse.Namespace) -> int:
    columns = ["agent_id", "version", "messages", "created_at", "updated_at"]
    _show(args, store.agents(), columns)
    return 0


def _history(store: Store, args: argparse.Namespace) -> int:
    messages = store.history(
        args.agent,
        args.version,
        conversation=args.conversation,
        include_compacted=args.all,
        code_versions=args.json,
    )
    if args.json:
        _print_json(messages)
        return 0
    rows = []
    for message in messages:
        mark = message.get("durable") or {}
        if "compacted_in" in mark:
            note = f"[compacted in v{mark['compacted_in']}]"
        elif "summary_of" in mark:
            note = f"[summary of {mark['summary_of']}]"
        else:
            note = ""
        rows.append([str(message.get("role", "?")), note, _cell(message_text(message))])
    _print_rows(rows)
    return 0


def _conversations(store: Store, args: argparse.Namespace) -> int:
    columns = ["conversation", "messages", "created_in", "last_version", "created_at"]
    _show(args, store.conversations(args.agent, args.version), columns)
    return 0


def _state(store: Store, args: argparse.Namespace) -> int:
    state = store.state(args.agent, args.version, conversation=args.conversation)
    if args.json:
        _print_json(state)
        return 0
    rows = [["field", "value"]]
    rows += [[name, _dumps(value)] for name, value in state.items()]
    _print_rows(rows)
    return 0


def _memory(store: Store, args: argparse.Namespace) -> int:
    memory = store.memory(args.agent, args.version)
    notes = store.memory_notes(args.agent, args.version)
    if args.json:
        _print_json(
            {"keys": memory, "notes": [{"at": note.at, "text": note.text} for note in notes]}
        )
        return 0
    rows = [["key", "bytes", "value"]]
    for key, value in memory.items():
        text = _dumps(value)
        rows.append(
            [
                _cell(key),
                str(len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())),
                text,
            ]
        )
    _print_rows(rows)
    if notes:
        print()
        _print_rows([["note added", "text"]] + [[_cell(n.at), _cell(n.text)] for n in notes])
    return 0


def _versions(store: Store, args: argparse.Namespace) -> int:
    columns = [
        "version",
        "kind",
        "conversation",
        "template",
        "added",
        "removed",
        "state_changed",
        "committed_at",
        "detail",
    ]
    versions = store.versions(args.agent)
    if not args.json and any(version.code_version for version in versions):
        columns[-1:-1] = ["code_version"]
    _show(args, versions, columns)
    return 0


def _handoffs(store: Store, args: argparse.Namespace) -> int:
    columns = [
        "agent_id",
        "conversation",
        "status",
        "template",
        "base_version",
        "host",
        "pid",
        "started_at",
        "error",
    ]
    _show(args, store.handoffs(), columns)
    return 0


def _workflows(store: Store, args: argparse.Namespace) -> int:
    columns = ["workflow", "steps", "done", "running", "failed", "started_at", "updated_at"]
    _show(args, store.workflows(), columns)
    return 0


def _steps(store: Store, args: argparse.Namespace) -> int:
    columns = ["number", "key", "template", "status", "version", "finished_at", "result"]
    _show(args, store.steps(args.workflow), columns)
    return 0


def _check(store: Store, args: argparse.Namespace) -> int:
    facts = store.check()
    if args.json:
        _print_json(facts)
    else:
        _print_rows([[name, _cell(value)] for name, value in facts.items()])
    if facts["integrity"] != "ok":
        problems = [
            line.strip()
            for line in str(facts["integrity"]).replace("; ", "\n").splitlines()
            if line.strip() and not line.startswith("***")
        ] or [str(facts["integrity"])]
        more = f" (and {len(problems) - 1} more; --json lists them)" if len(problems) > 1 else ""
        return _fail(
            f"{store.path} failed PRAGMA integrity_check: {problems[0]}{more}. It is "
            f"damaged: put back a copy made with `{PROG} backup`"
        )
    damaged = facts.get("damaged_rows") or []
    if damaged:
        agents = sorted({str(row["agent_id"]) for row in damaged if row["agent_id"] is not None})
        first = damaged[0]
        where = f"agent {first['agent_id']!r}, version {first['version']}"
        return _fail(
            f"{store.path}: {len(damaged)} row(s) fail their checksums, of agents "
            f"{', '.join(map(repr, agents)) or '(none named)'}; the first: {first['table']} "
            f"({where}). They were damaged, or changed by another program. Roll each agent "
            f"back to a version before its first damaged one (`{PROG} rollback`), or put "
            f"back a copy made with `{PROG} backup`. A row that only older versions hold "
            f"stays listed, and reading those versions refused, until `{PROG} prune` "
            "removes them"
        )
    return 0


def _sql(store: Store, args: argparse.Namespace) -> int:
    result = store.sql(args.agent, args.query, args.params, version=args.version)
    if args.json:
        rows = [[jsonable(value) for value in row] for row in result.rows]
        _print_json({"columns": list(result.columns), "rows": rows})
        return 0
    table = [list(result.columns)] if result.columns else []
    table += [[_cell(jsonable(value)) for value in row] for row in result.rows]
    _print_rows(table)
    return 0


def _alarms(store: Store, args: argparse.Namespace) -> int:
    columns = [
        "alarm_id",
        "agent_id",
        "status",
        "due_at",
        "every",
        "cron",
        "attempts",
        "deliveries",
        "leased_by",
        "last_error",
        "action",
    ]
    _show(args, store.alarms(args.agent, include_ended=args.all), columns)
    return 0


def _status(store: Store, args: argparse.Namespace) -> int:
    reports = store.runner_statuses()
    counts = store.alarm_queue.counts(time.time())
    waiting = {ours: counts[theirs] for ours, theirs in _WAITING.items()}
    if args.json:
        _print_json({"waiting": waiting, "runners": reports})
        return 0
    if not reports:
        print(f"no runner has reported on {redacted(args.db)} yet")
    for report in reports:
        print(f"runner {report['runner']} (pid {report['pid']} on {report['host']})")
        for key, value in report.items():
            if key not in ("runner", "pid", "host"):
                print(f"  {key}: {_cell(value)}")
    print(f"waiting in {redacted(args.db)} now")
    for key, value in waiting.items():
        print(f"  {key}: {value}")
    return 0


# What status counts, in the runner report's words (the queue's own names on the right).
_WAITING = {
    "approvals_pending": "approvals_pending",
    "resumptions_pending": "resumes_pending",
    "resumptions_dead": "resumes_dead",
    "events_pending": "events_pending",
    "events_dead": "events_dead",
    "alarms_pending": "pending",
    "alarms_due": "due",
    "alarms_dead": "dead",
}


def _approvals(store: Store, args: argparse.Namespace) -> int:
    approvals = store.approvals(args.agent, status=None if args.all else "pending")
    if args.json:
        _print_json([dataclasses.asdict(approval) for approval in approvals])
        return 0
    columns = ["approval_id", "agent_id", "conversation", "tool", "asked_at", "reason"]
    if args.all:
        columns[3:3] = ["status"]
        columns += ["decided_by", "decided_at", "note"]
    rows = [[*columns, "arguments"]]
    for approval in approvals:
        cells = [_cell(getattr(approval, column)) for column in columns]
        rows.append([*cells, _arguments_cell(approval)])
    _print_rows(rows)
    return 0


def _arguments_cell(approval: ApprovalInfo) -> str:
    """The arguments the tool runs with, and what the model asked where they differ."""
    asked, decided = approval.arguments, approval.decided_arguments
    if decided is None or decided == asked:
        return _cell(asked)
    changed = {
        key: asked.get(key) for key in {**asked, **decided} if asked.get(key) != decided.get(key)
    }
    return f"{_cell(decided)} (asked {_cell(changed)})"


def _events(store: Store, args: argparse.Namespace) -> int:
    columns = [
        "event_id",
        "agent_id",
        "name",
        "status",
        "sent_at",
        "attempts",
        "delivered_in",
        "last_error",
        "payload",
    ]
    if args.all:
        columns[-1:-1] = ["taken_by"]
    _show(args, store.events(args.agent, include_delivered=args.all), columns)
    return 0


def _diff(store: Store, args: argparse.Namespace) -> int:
    diff = store.diff(args.agent, args.v1, args.v2, limit=None)
    if args.json:
        _print_json(dataclasses.asdict(diff))
        return 0
    print(
        f"{args.agent}: v{diff.before.version} ({diff.before.kind}) -> "
        f"v{diff.after.version} ({diff.after.kind})"
    )
    if diff.empty:
        print("the two versions hold the same record")
    for change in diff.conversations:
        print(
            f"\nconversation {change.conversation}: {change.added_count} messages added, "
            f"{change.removed_count} removed"
        )
        rows = [["+", str(m.get("role", "?")), _cell(message_text(m))] for m in change.added]
        rows += [["-", str(m.get("role", "?")), _cell(message_text(m))] for m in change.removed]
        _print_rows(rows)
        _print_values("its own fields", change.fields)
    _print_values("fields", diff.fields)
    _print_values("memory", diff.memory)
    _print_values("context notes", diff.notes)
    for table in diff.tables:
        schema = f" (table {table.schema})" if table.schema else ""
        print(
            f"\ntable {table.table}{schema}: {table.added} rows added, {table.removed} removed, "
            f"{table.changed} changed"
        )
        _print_rows(
            [[_DIFF_SIGNS[row.op], _cell(row.before), _cell(row.after)] for row in table.rows]
        )
    if diff.alarms:
        print("\nalarms")
        _print_rows(
            [
                [_DIFF_SIGNS[a.op], a.alarm_id, _cell(a.fire_at), _cell(a.action)]
                for a in diff.alarms
            ]
        )
    if diff.approvals:
        print("\napprovals asked or used in between")
        _print_rows(
            [
                [a.approval_id, a.tool, a.status, _cell(a.decided_by), _cell(a.arguments)]
                for a in diff.approvals
            ]
        )
    return 0


_DIFF_SIGNS = {"added": "+", "removed": "-", "changed": "~"}


def _print_values(title: str, changes: Sequence[Any]) -> None:
    """Print the fields, keys or notes that changed, one line each."""
    if not changes:
        return
    print(f"\n{title}")
    _print_rows(
        [[_DIFF_SIGNS[c.op], _cell(c.name), _cell(c.before), _cell(c.after)] for c in changes]
    )


_READS = frozenset(
    {
        "diff",
        "agents",
        "history",
        "conversations",
        "state",
        "memory",
        "versions",
        "handoffs",
        "workflows",
        "steps",
        "check",
        "sql",
        "alarms",
        "status",
        "approvals",
        "events",
    }
)
_READ_ONLY = _READS | {"backup"}
# Writes that print what they wrote as JSON when asked, and the upgrade check.
_JSON_WRITES = frozenset({"approve", "deny", "send-event", "check-upgrade"})

# -- maintenance ------------------------------------------------------------------


def _rollback(store: Store, args: argparse.Namespace) -> int:
    version = store.rollback(args.agent, args.version)
    print(f"{args.agent}: version {version} committed, equal to version {args.version}")
    return 0


def _fork(store: Store, args: argparse.Namespace) -> int:
    record = store.fork(args.agent, args.version, args.new_id)
    print(
        f"{record.agent_id}: version 1 committed, a copy of {record.source_id} version "
        f"{record.source_version} ({record.messages} messages)"
    )
    return 0


def _delete_conversation(store: Store, args: argparse.Namespace) -> int:
    version = store.delete_conversation(args.agent, args.conversation)
    print(
        f"{args.agent}: version {version} committed without conversation "
        f"{args.conversation!r} (roll back to version {version - 1} to bring it back)"
    )
    return 0


def _delete(store: Store, args: argparse.Namespace) -> int:
    store.delete(args.agent)
    print(f"{args.agent}: deleted")
    return 0


def _rearm(store: Store, args: argparse.Namespace) -> int:
    alarm = store.rearm_alarm(args.alarm)
    print(f"{alarm.alarm_id} of {alarm.agent_id}: pending again, due {_cell(alarm.due_at)}")
    return 0


# -- decisions and events -----------------------------------------------------------


def _approve(store: Store, args: argparse.Namespace) -> int:
    parameters: dict[str, Any] | None = None
    checked: str | None = None
    if args.agents is not None:
        # The new code's signature of the tool that will run: it imports the user's
        # code, and with it effectful's LLM layer (litellm), only when asked to.
        from .upgrades.cli import approve_parameters

        parameters, checked = approve_parameters(
            store, args.approval, args.agents, args.arguments_value
        )
    try:
        decided = store.approve(
            args.approval,
            by=args.by,
            arguments=args.arguments_value,
            note=args.note,
            parameters=parameters,
        )
    except InvalidDecisionError as error:
        if parameters is not None or "do not fit its parameters" not in str(error):
            raise
        msg = (
            f"{error} (checked against the schema stored with the approval when the turn "
            "suspended; pass --agents MODULE:FUNC to check them against the code that will "
            "run it)"
        )
        raise InvalidDecisionError(msg) from error
    changed = ""
    if decided.decided_arguments not in (None, decided.arguments):
        changed = f", with arguments {_cell(decided.decided_arguments)}"
    status = _decided(store, args, decided, f"approved by {decided.decided_by}{changed}")
    if checked is not None:
        print(checked, file=sys.stderr if args.json else sys.stdout)
    return status


def _deny(store: Store, args: argparse.Namespace) -> int:
    decided = store.deny(args.approval, reason=args.reason, by=args.by)
    return _decided(store, args, decided, f"denied by {decided.decided_by}")


def _decided(store: Store, args: argparse.Namespace, decided: ApprovalInfo, what: str) -> int:
    """Print a decision, and what its suspended turn waits for now."""
    if args.json:
        _print_json(dataclasses.asdict(decided))
        return 0
    where = f"{decided.tool} of agent {decided.agent_id!r}"
    if decided.conversation != "default":
        where += f" (conversation {decided.conversation!r})"
    print(f"{decided.approval_id}: {where} {what}")
    suspension = store.suspension(decided.agent_id, decided.conversation)
    if suspension is None or suspension.suspended_in != decided.suspended_in:
        return 0  # resumed already, by a runner quicker than this line
    if suspension.pending:
        ids = ", ".join(approval.approval_id for approval in suspension.pending)
        print(f"the turn still waits for {ids}")
    elif suspension.workflow is not None:
        print(f"the turn resumes when workflow {suspension.workflow!r} runs again")
    else:
        print(
            "the turn resumes when a runner delivers it "
            f"(`{PROG} run`), or when the agent is called again"
        )
    return 0


def _send_event(store: Store, args: argparse.Namespace) -> int:
    started = time.time()
    event = store.send_event(
        args.agent, args.name, args.payload_value, key=args.key, create=args.create
    )
    if args.json:
        _print_json(dataclasses.asdict(event))
        return 0
    if event.sent_at.timestamp() < started:  # the key's earlier event came back
        print(
            f"{event.event_id}: sent before with key {args.key!r}, at {_cell(event.sent_at)} "
            f"({event.status}); nothing was sent again"
        )
    elif event.taken_by is not None:
        print(
            f"{event.event_id}: {event.name!r} to agent {event.agent_id!r} taken by "
            f"{event.taken_by}, which goes on when the workflow runs again"
        )
    else:
        print(
            f"{event.event_id}: {event.name!r} to agent {event.agent_id!r} pending; "
            f"a runner delivers it (`{PROG} run`)"
        )
    return 0


def _reset_workflow(store: Store, args: argparse.Namespace) -> int:
    plan = store.reset_workflow(args.workflow, args.from_step, dry_run=True)
    if plan.deleted and not args.yes:
        names = ", ".join(repr(agent_id) for agent_id in plan.deleted)
        return _fail(
            f"reset-workflow would delete {names} (created by the steps it forgets) with "
            "all their versions, for good; pass --yes to confirm",
            code=2,
        )
    reset = store.reset_workflow(args.workflow, args.from_step)
    print(f"{args.workflow}: steps {args.from_step} and later forgotten")
    for agent_id in reset.rolled_back:
        print(f"{agent_id}: rolled back")
    for agent_id in reset.deleted:
        print(f"{agent_id}: deleted (the workflow created it)")
    return 0


def _prune(store: Store, args: argparse.Namespace) -> int:
    result = store.prune(
        args.agent,
        keep_versions=args.keep,
        older_than=args.older_than,
        drop_compacted=args.drop_compacted,
    )
    print(
        f"pruned {len(result.agents)} agents: {result.versions} versions, "
        f"{result.messages} messages and {result.handoffs} handoffs deleted"
    )
    for workflow in result.workflows:
        print(f"{workflow}: journal deleted (the workflow finished and its versions are gone)")
    for agent_id in result.skipped:
        print(f"{agent_id}: skipped, a turn of it is running")
    if not is_postgres_url(args.db):
        print(f"run `{PROG} vacuum {args.db}` to give the space back to the file system")
    return 0


def _vacuum(store: Store, args: argparse.Namespace) -> int:
    freed = store.vacuum()
    print(f"{args.db}: {max(freed, 0):,} bytes given back")
    return 0


def _backup(store: Store, args: argparse.Namespace) -> int:
    store.backup(args.target)
    print(f"{args.db}: copied to {args.target} ({os.path.getsize(args.target):,} bytes)")
    return 0


def _ui_placeholder(store: Store, args: argparse.Namespace) -> int:
    msg = "ui is dispatched before a Store is opened"
    raise AssertionError(msg)  # pragma: no cover


def _new_code_placeholder(store: Store, args: argparse.Namespace) -> int:
    msg = "the commands that import new code are dispatched before a Store is opened"
    raise AssertionError(msg)  # pragma: no cover


def _run_placeholder(store: Store, args: argparse.Namespace) -> int:
    msg = "run is dispatched before a Store is opened"
    raise AssertionError(msg)  # pragma: no cover


def _ui(args: argparse.Namespace) -> int:
    """``ui``: the page, from the ``ui`` extra (Starlette, uvicorn, Jinja2), imported only here."""
    try:
        from .ui import serve
    except ModuleNotFoundError as missing:
        if (missing.name or "").split(".")[0] not in _UI_LIBRARIES:
            raise
        return _fail(
            f"the page needs the ui extra ({missing.name} is not installed): "
            "pip install 'effectful-durable[ui]'"
        )
    problem = _unusable(args.db)
    if problem:
        return _fail(problem)
    args.check_report = check_report_path(args.db, args.check_report)
    with _library_logs_quiet():
        try:
            return serve(args)
        except DurableError as error:
            return _fail(_cli_words(str(error), redacted(args.db)))
        except OSError as error:  # the address cannot be listened on
            return _fail(str(error))
        except KeyboardInterrupt:
            return 130


# The libraries of the ui extra: without one of them, `ui` says which extra to install.
_UI_LIBRARIES = frozenset({"starlette", "uvicorn", "jinja2", "markupsafe", "anyio", "h11"})


def _run(args: argparse.Namespace) -> int:
    """``run``: the only command that imports effectful's LLM layer (and litellm)."""
    from .runner.cli import run_command

    return run_command(args)


# Commands that import the user's new agent code: check-upgrade, and the repairs it names.
_NEW_CODE = frozenset({"check-upgrade", "migrate-state", "retarget"})


def _new_code(args: argparse.Namespace) -> int:
    """``check-upgrade``, ``migrate-state``, ``retarget``: they import effectful's LLM layer."""
    problem = _unusable(args.db)
    if problem:
        return _fail(problem)
    if args.command == "check-upgrade":
        args.report = check_report_path(args.db, args.report)
    from .upgrades import cli

    commands = {
        "check-upgrade": cli.check_command,
        "migrate-state": cli.migrate_command,
        "retarget": cli.retarget_command,
    }
    with _library_logs_quiet():
        return commands[args.command](args)


def check_report_path(db: str, chosen: str | None) -> str | None:
    """Where the report of ``check-upgrade`` is kept for the page: the path chosen, else
    ``DB.check.json`` beside an SQLite file (a PostgreSQL database has no beside)."""
    if chosen is not None:
        return chosen
    return None if is_postgres_url(db) else f"{db}.check.json"


def _json_arguments(args: argparse.Namespace) -> str | None:
    """Parse the JSON a command takes (``--arguments``, ``PAYLOAD_JSON``) onto ``args``.

    Returns:
        Why a text is not JSON, or None. Nothing is opened before it parses.
    """
    if args.command == "approve":
        args.arguments_value = None
        if args.arguments is not None:
            try:
                args.arguments_value = typed_json(args.arguments)
            except ValueError as error:
                return (
                    f"--arguments is not valid JSON ({error}): {_quoted(args.arguments)}; "
                    "nothing was changed"
                )
    if args.command == "send-event":
        args.payload_value = None
        if args.payload is not None:
            try:
                args.payload_value = typed_json(args.payload)
            except ValueError as error:
                return (
                    f"PAYLOAD_JSON is not valid JSON ({error}): {_quoted(args.payload)}; "
                    "nothing was sent"
                )
    return None


def _quoted(text: str) -> str:
    return repr(_shorten(text, 60))


# -- output -----------------------------------------------------------------------


def _show(args: argparse.Namespace, records: Sequence[Any], columns: list[str]) -> None:
    """Print dataclass records as JSON, or as a table of ``columns``."""
    if args.json:
        _print_json([dataclasses.asdict(record) for record in records])
        return
    rows = [columns]
    rows += [[_cell(getattr(record, column)) for column in columns] for record in records]
    _print_rows(rows)


def _print_rows(rows: Sequence[Sequence[str]]) -> None:
    """Print rows of one-line cells, each column padded to its widest cell.

    Empty columns are left out; long cells are cut to keep lines within _LINE_WIDTH.
    """
    if not rows:
        return
    cut = [[_shorten(cell, _CELL_WIDTH) for cell in row[:-1]] for row in rows]
    widths = [max(len(row[i]) for row in cut) for i in range(len(cut[0]))]
    last = max(_CELL_WIDTH, _LINE_WIDTH - sum(width + 2 for width in widths if width))
    for row, full in zip(cut, rows, strict=True):
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=True) if width]
        print("  ".join([*cells, _shorten(full[-1], last)]).rstrip())


def _cell(value: Any) -> str:
    """``value`` as text on one line: JSON for lists, ``key=value`` pairs for mappings."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, datetime):
        return _utc(value).replace(microsecond=0).isoformat().replace("+00:00", "Z")
    if isinstance(value, Mapping):
        text = " ".join(f"{key}={_scalar(item)}" for key, item in value.items())
    elif isinstance(value, list):
        text = _dumps(value)
    else:
        text = str(value)
    return " ".join(text.split())


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else _dumps(value)


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=_jsonable)


def _print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, ensure_ascii=False, default=_jsonable))


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return _utc(value).isoformat()
    return repr(value)


def _copy(args: argparse.Namespace) -> int:
    source, target = args.source, args.target
    shown = redacted(target)
    problem = _unusable(source)
    if problem:
        return _fail(problem)
    if not is_postgres_url(source) and not is_postgres_url(target):
        if os.path.exists(target) and os.path.samefile(source, target):
            return _fail(f"{source} and {target} are the same file; copy to a new database")
    made = not is_postgres_url(target) and not os.path.exists(target)
    try:
        with Store(source, readonly=True) as src, Store(target) as dst:
            result = copy_store(src, dst)
    except DurableError as error:
        if made:
            _remove_database_file(target)
        return _fail(_cli_words(str(error), redacted(source)))
    except KeyboardInterrupt:
        if made:
            _remove_database_file(target)
        return 130
    rows = sum(result.rows.values())
    print(f"{redacted(source)}: copied to {shown}: {rows:,} rows")
    _print_rows([[table, f"{count:,}"] for table, count in result.rows.items()])
    return 0


def _remove_database_file(path: str) -> None:
    """Remove the database file a failed copy created (it holds only our empty schema)."""
    for name in (path, f"{path}-wal", f"{path}-shm", f"{path}-lock"):
        if os.path.exists(name):
            os.remove(name)


# -- arguments --------------------------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=_DESCRIPTION,
        epilog="Reads open DB read-only and take --json; no command creates DB.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, run: _Run, help: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help, description=help)
        sub.add_argument("db", metavar="DB", help="the database file, or a postgresql:// URL")
        if name in _READS or name in _JSON_WRITES:
            sub.add_argument("--json", action="store_true", help="print JSON")
        sub.set_defaults(run=run)
        return sub

    def agent(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("agent", metavar="AGENT", help="the agent id")

    def agents_factory(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--agents", required=True, metavar="MODULE:FUNC", help="builds an agent from its id"
        )

    def at_version(sub: argparse.ArgumentParser, what: str) -> None:
        sub.add_argument("--version", type=int, metavar="N", help=f"{what} (default: latest)")

    def in_conversation(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--conversation",
            default="default",
            metavar="ID",
            help="the conversation (default: the agent's default one)",
        )

    command("agents", _agents, "list the agents: version, active messages, last commit")
    sub = command("history", _history, "print an agent's messages, one line each")
    agent(sub)
    at_version(sub, "as of this version")
    sub.add_argument(
        "--all", action="store_true", help="include the originals compaction replaced"
    )
    in_conversation(sub)
    sub = command("conversations", _conversations, "list an agent's conversations")
    agent(sub)
    at_version(sub, "as of this version")
    sub = command("state", _state, "print an agent's persisted fields")
    agent(sub)
    at_version(sub, "as of this version")
    in_conversation(sub)  # for the fields declared per conversation
    sub = command("memory", _memory, "print the keys and context notes an agent kept")
    agent(sub)
    at_version(sub, "as of this version")
    agent(command("versions", _versions, "list an agent's committed versions"))
    command("handoffs", _handoffs, "list turns that started and did not commit")
    command("workflows", _workflows, "list the workflow journals and their step counts")
    sub = command("steps", _steps, "list a workflow's journal, step by step")
    sub.add_argument("workflow", metavar="WORKFLOW", help="the workflow name")
    command("check", _check, "check the file and every row's checksum")
    sub = command(
        "check-upgrade",
        _new_code_placeholder,
        "check what new agent code does to every agent in flight; exit 3 if anything breaks",
    )
    sub.add_argument(
        "--agents",
        required=True,
        metavar="MODULE:FUNC",
        help="the new code's factory of an agent from its id: check what it cannot carry "
        "(approvals, alarms, events, fields, memory, histories)",
    )
    sub.add_argument(
        "--handlers",
        metavar="MODULE:FUNC",
        help="the new code's handler stack, as for run (its PersistenceHandler's code_version)",
    )
    sub.add_argument(
        "--workflow",
        metavar="MODULE:FUNC",
        help="runs the workflow's program, given a handler factory; replayed in a dry run",
    )
    sub.add_argument(
        "--code-version", metavar="TEXT", help="the new code's version, for the report"
    )
    sub.add_argument(
        "--report",
        metavar="FILE",
        help="keep the report here for the page (default: DB.check.json beside an SQLite file)",
    )
    sub = command(
        "migrate-state",
        _new_code_placeholder,
        "commit agents' fields migrated to their class's __state_version__",
    )
    agents_factory(sub)
    sub.add_argument("--agent", metavar="AGENT", help="only this agent (default: all)")
    sub.add_argument("--dry-run", action="store_true", help="say what would be migrated")
    sub.add_argument("--code-version", metavar="TEXT", help="recorded with each migration")
    sub = command("retarget", _new_code_placeholder, "make a waiting approval name a renamed tool")
    sub.add_argument("approval", metavar="APPROVAL_ID", help="the approval id (apr_...)")
    sub.add_argument("tool", metavar="TOOL", help="the tool's name in the new code")
    agents_factory(sub)
    sub.add_argument(
        "--arguments",
        metavar="JSON",
        help="the call's arguments for the new tool (default: the model's, if they fit)",
    )
    sub.add_argument("--by", metavar="NAME", help="who re-targets it (default: your user name)")
    sub = command("sql", _sql, "run a read-only query on an agent's own SQL tables")
    agent(sub)
    sub.add_argument("query", metavar="QUERY", help="one SELECT statement")
    sub.add_argument(
        "params", nargs="*", metavar="PARAM", help="values for the ? placeholders (as text)"
    )
    at_version(sub, "as of this version")

    sub = command("rollback", _rollback, "commit a new version equal to an older one")
    agent(sub)
    sub.add_argument("version", type=int, metavar="VERSION", help="the version to return to")
    sub = command("fork", _fork, "copy an agent, at a version, into a new agent")
    agent(sub)
    sub.add_argument("new_id", metavar="NEW_ID", help="the id of the copy")
    at_version(sub, "the version to copy")
    sub = command(
        "delete-conversation",
        _delete_conversation,
        "commit a version without one of an agent's conversations",
    )
    agent(sub)
    sub.add_argument("conversation", metavar="CONVERSATION", help="the conversation id")
    sub = command("delete", _delete, "delete an agent with all its versions, for good")
    agent(sub)
    sub.add_argument("--yes", action="store_true", help="confirm the deletion")
    sub = command("alarms", _alarms, "list the pending and dead alarms")
    sub.add_argument("--agent", metavar="AGENT", help="only this agent's alarms")
    sub.add_argument("--all", action="store_true", help="include delivered and cancelled ones")
    command("status", _status, "print what waits (approvals, events, alarms) and runner reports")
    sub = command("rearm", _rearm, "make a dead alarm (or event) pending again, due now")
    sub.add_argument("alarm", metavar="ALARM", help="the alarm id")
    sub = command("approvals", _approvals, "list the tool calls that wait for a decision")
    sub.add_argument("--agent", metavar="AGENT", help="only this agent's approvals")
    sub.add_argument("--all", action="store_true", help="include decided and cancelled ones")
    sub = command("approve", _approve, "let a tool call that waits run, once")
    sub.add_argument("approval", metavar="APPROVAL_ID", help="the approval id (apr_...)")
    sub.add_argument("--by", metavar="NAME", help="who decides (default: your user name)")
    sub.add_argument(
        "--arguments",
        metavar="JSON",
        help="run the tool with this JSON object instead of the model's arguments",
    )
    sub.add_argument(
        "--agents",
        metavar="MODULE:FUNC",
        help="the code that will resume the turn (its factory of an agent from its id): "
        "check the arguments against its signature of the tool, not the schema stored "
        "when the turn suspended",
    )
    sub.add_argument("--note", metavar="TEXT", help="a note kept with the decision")
    sub = command("deny", _deny, "refuse a tool call that waits; the model reads the reason")
    sub.add_argument("approval", metavar="APPROVAL_ID", help="the approval id (apr_...)")
    sub.add_argument(
        "--reason", required=True, metavar="TEXT", help="why; the model reads it, kept as is"
    )
    sub.add_argument("--by", metavar="NAME", help="who decides (default: your user name)")
    sub = command("send-event", _send_event, "send an event to an agent's inbox")
    agent(sub)
    sub.add_argument("name", metavar="NAME", help="what happened (payment_received)")
    sub.add_argument(
        "payload",
        nargs="?",
        metavar="PAYLOAD_JSON",
        help="any JSON value, at most 64 KiB (default: null)",
    )
    sub.add_argument(
        "--key", metavar="KEY", help="idempotency key: sending again with it sends nothing"
    )
    sub.add_argument(
        "--create", action="store_true", help="accept an agent the database does not hold yet"
    )
    sub = command("events", _events, "list the events that wait in agents' inboxes")
    sub.add_argument("--agent", metavar="AGENT", help="only this agent's events")
    sub.add_argument("--all", action="store_true", help="include delivered ones")
    sub = command("run", _run_placeholder, "deliver alarms as agent turns until stopped")
    agents_factory(sub)
    sub.add_argument(
        "--handlers",
        metavar="MODULE:FUNC",
        help="builds the handler stack from the config (default: LiteLLMProvider, retries)",
    )
    sub.add_argument("--config", metavar="FILE", help="TOML config, re-read on SIGHUP")
    sub.add_argument(
        "--concurrency",
        type=_positive,
        metavar="N",
        help="turns of different agents run at once (default: the config's, 1)",
    )
    sub.add_argument(
        "--wait-for-database",
        type=_seconds,
        metavar="SECONDS",
        help="PostgreSQL: how long to wait at start for a server that does not answer yet "
        "(default: the config's wait_for_database, else 5)",
    )
    sub.add_argument(
        "--log-format", choices=["text", "json"], default="text", help="log line format"
    )
    sub.add_argument("--log-level", default="INFO", help="logging level (default: INFO)")
    sub = command("diff", _diff, "show what changed in an agent between two versions")
    agent(sub)
    sub.add_argument("v1", type=int, metavar="V1", help="one version (usually the older)")
    sub.add_argument("v2", type=int, metavar="V2", help="the other version")
    sub = command("ui", _ui_placeholder, "serve a local, live page over the database")
    sub.add_argument(
        "--host", default="127.0.0.1", help="the address to listen on (default: 127.0.0.1)"
    )
    sub.add_argument(
        "--port", type=int, default=0, metavar="N", help="the port (default: a free one)"
    )
    sub.add_argument("--no-browser", action="store_true", help="do not open a browser")
    sub.add_argument("--read-only", action="store_true", help="offer no action, refuse any")
    sub.add_argument(
        "--by", metavar="NAME", help="who decides in the page (default: your user name)"
    )
    sub.add_argument(
        "--check-report",
        metavar="FILE",
        help="the report of `check-upgrade` to show (default: DB.check.json beside an "
        "SQLite file)",
    )
    sub = command("reset-workflow", _reset_workflow, "make a workflow redo its steps from N on")
    sub.add_argument("workflow", metavar="WORKFLOW", help="the workflow name")
    sub.add_argument(
        "--from-step", type=int, default=1, metavar="N", help="first step to redo (default: 1)"
    )
    sub.add_argument(
        "--yes", action="store_true", help="confirm deleting agents the forgotten steps created"
    )
    sub = command("prune", _prune, "delete old versions of an agent, or of all agents, for good")
    sub.add_argument("agent", nargs="?", metavar="AGENT", help="the agent (default: all)")
    sub.add_argument("--keep", type=_positive, metavar="N", help="keep the latest N versions")
    sub.add_argument(
        "--older-than",
        type=_age,
        metavar="AGE",
        help="prune only versions older than AGE: a number and s, m, h, d or w (7d)",
    )
    sub.add_argument(
        "--drop-compacted",
        action="store_true",
        help="also delete the compacted originals of pruned versions",
    )
    sub.add_argument("--yes", action="store_true", help="confirm the deletion")
    command("vacuum", _vacuum, "give the space of deleted rows back to the file system")
    sub = command("backup", _backup, "copy the live database, consistently, to a new file")
    sub.add_argument("target", metavar="TARGET", help="the new file (never overwritten)")
    sub = commands.add_parser(
        "copy",
        help="copy every agent, version, journal, memory and alarm to a new database",
        description="Copy a whole database (SQLite file or postgresql:// URL) to a new, "
        "empty one, of either kind, in one transaction; the source is only read.",
    )
    sub.add_argument("source", metavar="SRC", help="the database to copy")
    sub.add_argument("target", metavar="DST", help="a new file, or an empty PostgreSQL database")
    return parser


def _seconds(text: str) -> float:
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if not 0 <= number < float("inf"):
        msg = f"expected a number of seconds >= 0, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return number


def _positive(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        msg = f"expected a whole number >= 1, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return number


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def _age(text: str) -> timedelta:
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", text.strip())
    if match is None:
        msg = f"expected an age such as 90s, 30m, 12h, 7d or 2w, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return timedelta(seconds=float(match[1]) * _UNITS[match[2]])
