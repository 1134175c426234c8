"""Reading: the commands that print what DB holds. They open it read-only, change nothing,
and take ``--json`` to print the records whole instead of a table."""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from collections.abc import Sequence
from typing import Any

from ..store import Store
from ..store.engine.seam import redacted
from ..store.history import message_text
from ..store.records import ApprovalInfo
from ..store.workspace.workspace import jsonable
from .command import AGENT, CONVERSATION, PROG, Family, at_version, fail, flag
from .output import cell, dumps, print_json, print_rows, show

COMMANDS = Family("Reading")


@COMMANDS.reads(
    "agents",
    "list the agents: version, active messages, last commit, subject",
    flag("--subject", metavar="SUBJECT", help="only what holds this subject's content"),
)
def agents(store: Store, args: argparse.Namespace) -> int:
    if args.subject is None:
        records = store.agents()
        columns = ["agent_id", "version", "messages", "created_at", "updated_at"]
        if any(record.subject is not None for record in records):
            columns.append("subject")
        show(args, records, columns)
        return 0
    holders = store.holders(args.subject)
    if args.json:
        print_json([{"agent_id": a, "conversation": c} for a, c in holders])
        return 0
    rows = [[agent, conversation or "(the whole agent)"] for agent, conversation in holders]
    print_rows([["agent_id", "conversation"], *rows])
    return 0


@COMMANDS.reads(
    "history",
    "print an agent's messages, one line each",
    AGENT,
    at_version("as of this version"),
    flag("--all", action="store_true", help="include the originals compaction replaced"),
    CONVERSATION,
)
def history(store: Store, args: argparse.Namespace) -> int:
    messages = store.history(
        args.agent,
        args.version,
        conversation=args.conversation,
        include_compacted=args.all,
        code_versions=args.json,
    )
    if args.json:
        print_json(messages)
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
        rows.append([str(message.get("role", "?")), note, cell(message_text(message))])
    print_rows(rows)
    return 0


@COMMANDS.reads(
    "conversations", "list an agent's conversations", AGENT, at_version("as of this version")
)
def conversations(store: Store, args: argparse.Namespace) -> int:
    columns = ["conversation", "messages", "created_in", "last_version", "created_at"]
    show(args, store.conversations(args.agent, args.version), columns)
    return 0


@COMMANDS.reads(
    "state",
    "print an agent's persisted fields",
    AGENT,
    at_version("as of this version"),
    CONVERSATION,  # for the fields declared per conversation
)
def state(store: Store, args: argparse.Namespace) -> int:
    fields = store.state(args.agent, args.version, conversation=args.conversation)
    if args.json:
        print_json(fields)
        return 0
    rows = [["field", "value"]]
    rows += [[name, dumps(value)] for name, value in fields.items()]
    print_rows(rows)
    return 0


@COMMANDS.reads(
    "memory",
    "print the keys and context notes an agent kept",
    AGENT,
    at_version("as of this version"),
)
def memory(store: Store, args: argparse.Namespace) -> int:
    keys = store.memory(args.agent, args.version)
    notes = store.memory_notes(args.agent, args.version)
    if args.json:
        print_json({"keys": keys, "notes": [{"at": note.at, "text": note.text} for note in notes]})
        return 0
    rows = [["key", "bytes", "value"]]
    for key, value in keys.items():
        size = len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())
        rows.append([cell(key), str(size), dumps(value)])
    print_rows(rows)
    if notes:
        print()
        print_rows([["note added", "text"]] + [[cell(n.at), cell(n.text)] for n in notes])
    return 0


@COMMANDS.reads("versions", "list an agent's committed versions", AGENT)
def versions(store: Store, args: argparse.Namespace) -> int:
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
    found = store.versions(args.agent)
    if not args.json and any(version.code_version for version in found):
        columns[-1:-1] = ["code_version"]
    show(args, found, columns)
    return 0


@COMMANDS.reads(
    "diff",
    "show what changed in an agent between two versions",
    AGENT,
    flag("v1", type=int, metavar="V1", help="one version (usually the older)"),
    flag("v2", type=int, metavar="V2", help="the other version"),
)
def diff(store: Store, args: argparse.Namespace) -> int:
    found = store.diff(args.agent, args.v1, args.v2, limit=None)
    if args.json:
        print_json(dataclasses.asdict(found))
        return 0
    print(
        f"{args.agent}: v{found.before.version} ({found.before.kind}) -> "
        f"v{found.after.version} ({found.after.kind})"
    )
    if found.empty:
        print("the two versions hold the same record")
    for change in found.conversations:
        print(
            f"\nconversation {change.conversation}: {change.added_count} messages added, "
            f"{change.removed_count} removed"
        )
        rows = [["+", str(m.get("role", "?")), cell(message_text(m))] for m in change.added]
        rows += [["-", str(m.get("role", "?")), cell(message_text(m))] for m in change.removed]
        print_rows(rows)
        _print_values("its own fields", change.fields)
    _print_values("fields", found.fields)
    _print_values("memory", found.memory)
    _print_values("context notes", found.notes)
    for table in found.tables:
        schema = f" (table {table.schema})" if table.schema else ""
        print(
            f"\ntable {table.table}{schema}: {table.added} rows added, {table.removed} removed, "
            f"{table.changed} changed"
        )
        print_rows([[_SIGNS[row.op], cell(row.before), cell(row.after)] for row in table.rows])
    if found.alarms:
        print("\nalarms")
        print_rows(
            [[_SIGNS[a.op], a.alarm_id, cell(a.fire_at), cell(a.action)] for a in found.alarms]
        )
    if found.approvals:
        print("\napprovals asked or used in between")
        print_rows(
            [
                [a.approval_id, a.tool, a.status, cell(a.decided_by), cell(a.arguments)]
                for a in found.approvals
            ]
        )
    return 0


_SIGNS = {"added": "+", "removed": "-", "changed": "~"}


def _print_values(title: str, changes: Sequence[Any]) -> None:
    """Print the fields, keys or notes that changed, one line each."""
    if not changes:
        return
    print(f"\n{title}")
    print_rows([[_SIGNS[c.op], cell(c.name), cell(c.before), cell(c.after)] for c in changes])


@COMMANDS.reads("handoffs", "list turns that started and did not commit")
def handoffs(store: Store, args: argparse.Namespace) -> int:
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
    show(args, store.handoffs(), columns)
    return 0


@COMMANDS.reads("workflows", "list the workflow journals and their step counts")
def workflows(store: Store, args: argparse.Namespace) -> int:
    columns = ["workflow", "steps", "done", "running", "failed", "started_at", "updated_at"]
    show(args, store.workflows(), columns)
    return 0


@COMMANDS.reads(
    "steps",
    "list a workflow's journal, step by step",
    flag("workflow", metavar="WORKFLOW", help="the workflow name"),
)
def steps(store: Store, args: argparse.Namespace) -> int:
    columns = ["number", "key", "template", "status", "version", "finished_at", "result"]
    show(args, store.steps(args.workflow), columns)
    return 0


@COMMANDS.reads("check", "check the file and every row's checksum")
def check(store: Store, args: argparse.Namespace) -> int:
    facts = store.check()
    if args.json:
        print_json(facts)
    else:
        print_rows([[name, cell(value)] for name, value in facts.items()])
    if facts["integrity"] != "ok":
        problems = [
            line.strip()
            for line in str(facts["integrity"]).replace("; ", "\n").splitlines()
            if line.strip() and not line.startswith("***")
        ] or [str(facts["integrity"])]
        more = f" (and {len(problems) - 1} more; --json lists them)" if len(problems) > 1 else ""
        return fail(
            f"{store.path} failed PRAGMA integrity_check: {problems[0]}{more}. It is "
            f"damaged: put back a copy made with `{PROG} backup`"
        )
    damaged = facts.get("damaged_rows") or []
    if damaged:
        named = sorted({str(row["agent_id"]) for row in damaged if row["agent_id"] is not None})
        first = damaged[0]
        where = f"agent {first['agent_id']!r}, version {first['version']}"
        return fail(
            f"{store.path}: {len(damaged)} row(s) fail their checksums, of agents "
            f"{', '.join(map(repr, named)) or '(none named)'}; the first: {first['table']} "
            f"({where}). They were damaged, or changed by another program. Roll each agent "
            f"back to a version before its first damaged one (`{PROG} rollback`), or put "
            f"back a copy made with `{PROG} backup`. A row that only older versions hold "
            f"stays listed, and reading those versions refused, until `{PROG} prune` "
            "removes them"
        )
    return 0


@COMMANDS.reads(
    "sql",
    "run a read-only query on an agent's own SQL tables",
    AGENT,
    flag("query", metavar="QUERY", help="one SELECT statement"),
    flag("params", nargs="*", metavar="PARAM", help="values for the ? placeholders (as text)"),
    at_version("as of this version"),
)
def sql(store: Store, args: argparse.Namespace) -> int:
    result = store.sql(args.agent, args.query, args.params, version=args.version)
    if args.json:
        rows = [[jsonable(value) for value in row] for row in result.rows]
        print_json({"columns": list(result.columns), "rows": rows})
        return 0
    table = [list(result.columns)] if result.columns else []
    table += [[cell(jsonable(value)) for value in row] for row in result.rows]
    print_rows(table)
    return 0


@COMMANDS.reads(
    "alarms",
    "list the pending and dead alarms",
    flag("--agent", metavar="AGENT", help="only this agent's alarms"),
    flag("--all", action="store_true", help="include delivered and cancelled ones"),
)
def alarms(store: Store, args: argparse.Namespace) -> int:
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
    show(args, store.alarms(args.agent, include_ended=args.all), columns)
    return 0


@COMMANDS.reads(
    "approvals",
    "list the tool calls that wait for a decision",
    flag("--agent", metavar="AGENT", help="only this agent's approvals"),
    flag("--all", action="store_true", help="include decided and cancelled ones"),
)
def approvals(store: Store, args: argparse.Namespace) -> int:
    found = store.approvals(args.agent, status=None if args.all else "pending")
    if args.json:
        print_json([dataclasses.asdict(approval) for approval in found])
        return 0
    columns = ["approval_id", "agent_id", "conversation", "tool", "asked_at", "reason"]
    if args.all:
        columns[3:3] = ["status"]
        columns += ["decided_by", "decided_at", "note"]
    rows = [[*columns, "arguments"]]
    for approval in found:
        cells = [cell(getattr(approval, column)) for column in columns]
        rows.append([*cells, _arguments_cell(approval)])
    print_rows(rows)
    return 0


def _arguments_cell(approval: ApprovalInfo) -> str:
    """The arguments the tool runs with, and what the model asked where they differ."""
    asked, decided = approval.arguments, approval.decided_arguments
    if decided is None or decided == asked:
        return cell(asked)
    changed = {
        key: asked.get(key) for key in {**asked, **decided} if asked.get(key) != decided.get(key)
    }
    return f"{cell(decided)} (asked {cell(changed)})"


@COMMANDS.reads(
    "events",
    "list the events that wait in agents' inboxes",
    flag("--agent", metavar="AGENT", help="only this agent's events"),
    flag("--all", action="store_true", help="include delivered ones"),
)
def events(store: Store, args: argparse.Namespace) -> int:
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
    show(args, store.events(args.agent, include_delivered=args.all), columns)
    return 0


@COMMANDS.reads("status", "print what waits (approvals, events, alarms) and runner reports")
def status(store: Store, args: argparse.Namespace) -> int:
    reports = store.runner_statuses()
    counts = store.alarm_queue.counts(time.time())
    waiting = {ours: counts[theirs] for ours, theirs in _WAITING.items()}
    if args.json:
        print_json({"waiting": waiting, "runners": reports})
        return 0
    if not reports:
        print(f"no runner has reported on {redacted(args.db)} yet")
    for report in reports:
        print(f"runner {report['runner']} (pid {report['pid']} on {report['host']})")
        for key, value in report.items():
            if key not in ("runner", "pid", "host"):
                print(f"  {key}: {cell(value)}")
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
