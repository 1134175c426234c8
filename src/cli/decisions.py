"""Deciding and sending events: ``approve``, ``deny``, ``send-event``. Each commits in one
transaction or writes nothing, and takes ``--json`` to print the record it wrote."""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

from ..errors import InvalidDecisionError
from ..store import Store
from ..store.records import ApprovalInfo
from ..store.rows import typed_json
from .command import AGENT, PROG, Family, flag
from .output import cell, print_json, shorten
from .upgrades import approve_parameters

COMMANDS = Family("Deciding and sending events")

APPROVAL = flag("approval", metavar="APPROVAL_ID", help="the approval id (apr_...)")
BY = flag("--by", metavar="NAME", help="who decides (default: your user name)")


def _parse_arguments(args: argparse.Namespace) -> str | None:
    """``--arguments`` parsed onto ``args.arguments_value``; why it is not JSON, or None."""
    args.arguments_value = None
    if args.arguments is not None:
        try:
            args.arguments_value = typed_json(args.arguments)
        except ValueError as error:
            return (
                f"--arguments is not valid JSON ({error}): {_quoted(args.arguments)}; "
                "nothing was changed"
            )
    return None


@COMMANDS.writes(
    "approve",
    "let a tool call that waits run, once",
    APPROVAL,
    BY,
    flag(
        "--arguments",
        metavar="JSON",
        help="run the tool with this JSON object instead of the model's arguments",
    ),
    flag(
        "--agents",
        metavar="MODULE:FUNC",
        help="the code that will resume the turn (its factory of an agent from its id): "
        "check the arguments against its signature of the tool, not the schema stored "
        "when the turn suspended",
    ),
    flag("--note", metavar="TEXT", help="a note kept with the decision"),
    json=True,
    prepare=_parse_arguments,
)
def approve(store: Store, args: argparse.Namespace) -> int:
    parameters: dict[str, Any] | None = None
    checked: str | None = None
    if args.agents is not None:
        # The new code's signature of the tool that will run: it imports the user's
        # code, and with it effectful's LLM layer (litellm), only when asked to.
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
        changed = f", with arguments {cell(decided.decided_arguments)}"
    status = _decided(store, args, decided, f"approved by {decided.decided_by}{changed}")
    if checked is not None:
        print(checked, file=sys.stderr if args.json else sys.stdout)
    return status


@COMMANDS.writes(
    "deny",
    "refuse a tool call that waits; the model reads the reason",
    APPROVAL,
    flag("--reason", required=True, metavar="TEXT", help="why; the model reads it, kept as is"),
    BY,
    json=True,
)
def deny(store: Store, args: argparse.Namespace) -> int:
    decided = store.deny(args.approval, reason=args.reason, by=args.by)
    return _decided(store, args, decided, f"denied by {decided.decided_by}")


def _decided(store: Store, args: argparse.Namespace, decided: ApprovalInfo, what: str) -> int:
    """Print a decision, and what its suspended turn waits for now."""
    if args.json:
        print_json(dataclasses.asdict(decided))
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


def _parse_payload(args: argparse.Namespace) -> str | None:
    """``PAYLOAD_JSON`` parsed onto ``args.payload_value``; why it is not JSON, or None."""
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


@COMMANDS.writes(
    "send-event",
    "send an event to an agent's inbox",
    AGENT,
    flag("name", metavar="NAME", help="what happened (payment_received)"),
    flag(
        "payload",
        nargs="?",
        metavar="PAYLOAD_JSON",
        help="any JSON value, at most 64 KiB (default: null)",
    ),
    flag("--key", metavar="KEY", help="idempotency key: sending again with it sends nothing"),
    flag("--create", action="store_true", help="accept an agent the database does not hold yet"),
    json=True,
    prepare=_parse_payload,
)
def send_event(store: Store, args: argparse.Namespace) -> int:
    started = time.time()
    event = store.send_event(
        args.agent, args.name, args.payload_value, key=args.key, create=args.create
    )
    if args.json:
        print_json(dataclasses.asdict(event))
        return 0
    if event.sent_at.timestamp() < started:  # the key's earlier event came back
        print(
            f"{event.event_id}: sent before with key {args.key!r}, at {cell(event.sent_at)} "
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


def _quoted(text: str) -> str:
    return repr(shorten(text, 60))
