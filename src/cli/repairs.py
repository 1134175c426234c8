"""Repairs: ``rollback``, ``fork``, ``delete-conversation``, ``delete``, ``reset-workflow``
and ``rearm``. Each takes the agent's lock as a turn does, so it refuses to race a
running turn; only ``delete`` and ``reset-workflow`` remove history, after ``--yes``."""

from __future__ import annotations

import argparse

from ..store import Store
from .command import AGENT, YES, Family, at_version, fail, flag
from .output import cell

COMMANDS = Family("Repairing")


@COMMANDS.writes(
    "rollback",
    "commit a new version equal to an older one",
    AGENT,
    flag("version", type=int, metavar="VERSION", help="the version to return to"),
)
def rollback(store: Store, args: argparse.Namespace) -> int:
    version = store.rollback(args.agent, args.version)
    print(f"{args.agent}: version {version} committed, equal to version {args.version}")
    return 0


@COMMANDS.writes(
    "fork",
    "copy an agent, at a version, into a new agent",
    AGENT,
    flag("new_id", metavar="NEW_ID", help="the id of the copy"),
    at_version("the version to copy"),
)
def fork(store: Store, args: argparse.Namespace) -> int:
    record = store.fork(args.agent, args.version, args.new_id)
    print(
        f"{record.agent_id}: version 1 committed, a copy of {record.source_id} version "
        f"{record.source_version} ({record.messages} messages)"
    )
    return 0


@COMMANDS.writes(
    "delete-conversation",
    "commit a version without one of an agent's conversations",
    AGENT,
    flag("conversation", metavar="CONVERSATION", help="the conversation id"),
)
def delete_conversation(store: Store, args: argparse.Namespace) -> int:
    version = store.delete_conversation(args.agent, args.conversation)
    print(
        f"{args.agent}: version {version} committed without conversation "
        f"{args.conversation!r} (roll back to version {version - 1} to bring it back)"
    )
    return 0


def _confirmed(args: argparse.Namespace) -> str | None:
    if args.yes:
        return None
    return (
        f"delete removes agent {args.agent!r} with all its versions and messages "
        "for good; pass --yes to confirm"
    )


@COMMANDS.writes(
    "delete",
    "delete an agent with all its versions, for good",
    AGENT,
    YES,
    prepare=_confirmed,
)
def delete(store: Store, args: argparse.Namespace) -> int:
    store.delete(args.agent)
    print(f"{args.agent}: deleted")
    return 0


@COMMANDS.writes(
    "reset-workflow",
    "make a workflow redo its steps from N on",
    flag("workflow", metavar="WORKFLOW", help="the workflow name"),
    flag("--from-step", type=int, default=1, metavar="N", help="first step to redo (default: 1)"),
    flag("--yes", action="store_true", help="confirm deleting agents the forgotten steps created"),
)
def reset_workflow(store: Store, args: argparse.Namespace) -> int:
    plan = store.reset_workflow(args.workflow, args.from_step, dry_run=True)
    if plan.deleted and not args.yes:
        names = ", ".join(repr(agent_id) for agent_id in plan.deleted)
        return fail(
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


@COMMANDS.writes(
    "rearm",
    "make a dead alarm (or event) pending again, due now",
    flag("alarm", metavar="ALARM", help="the alarm id"),
)
def rearm(store: Store, args: argparse.Namespace) -> int:
    alarm = store.rearm_alarm(args.alarm)
    print(f"{alarm.alarm_id} of {alarm.agent_id}: pending again, due {cell(alarm.due_at)}")
    return 0
