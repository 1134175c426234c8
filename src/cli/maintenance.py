"""Maintenance: ``prune`` (after ``--yes``), ``vacuum``, ``backup`` and ``copy``, the one
command that creates a database (its target)."""

from __future__ import annotations

import argparse
import os
import re
from datetime import timedelta

from ..errors import DurableError
from ..store import Store
from ..store.copy import copy_store
from ..store.engine.seam import is_postgres_url, redacted
from .command import (
    PROG,
    YES,
    Family,
    cli_words,
    fail,
    flag,
    keys_from_environment,
    positive,
    unusable,
)
from .output import print_rows

COMMANDS = Family("Maintenance")

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def age(text: str) -> timedelta:
    """A flag's age: a number and s, m, h, d or w (``7d``)."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)([smhdw])", text.strip())
    if match is None:
        msg = f"expected an age such as 90s, 30m, 12h, 7d or 2w, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return timedelta(seconds=float(match[1]) * _UNITS[match[2]])


def _rule_and_yes(args: argparse.Namespace) -> str | None:
    if args.keep is None and args.older_than is None:
        return "prune needs a rule: pass --keep N, --older-than AGE or both"
    if args.yes:
        return None
    whose = f"agent {args.agent!r}" if args.agent else "every agent"
    return (
        f"prune deletes the older versions of {whose} for good (they can no longer "
        "be read or rolled back to); pass --yes to confirm"
    )


@COMMANDS.writes(
    "prune",
    "delete old versions of an agent, or of all agents, for good",
    flag("agent", nargs="?", metavar="AGENT", help="the agent (default: all)"),
    flag("--keep", type=positive, metavar="N", help="keep the latest N versions"),
    flag(
        "--older-than",
        type=age,
        metavar="AGE",
        help="prune only versions older than AGE: a number and s, m, h, d or w (7d)",
    ),
    flag(
        "--drop-compacted",
        action="store_true",
        help="also delete the compacted originals of pruned versions",
    ),
    YES,
    prepare=_rule_and_yes,
)
def prune(store: Store, args: argparse.Namespace) -> int:
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


@COMMANDS.writes("vacuum", "give the space of deleted rows back to the file system")
def vacuum(store: Store, args: argparse.Namespace) -> int:
    freed = store.vacuum()
    print(f"{args.db}: {max(freed, 0):,} bytes given back")
    return 0


@COMMANDS.reads(
    "backup",
    "copy the live database, consistently, to a new file",
    flag("target", metavar="TARGET", help="the new file (never overwritten)"),
    json=False,
)
def backup(store: Store, args: argparse.Namespace) -> int:
    store.backup(args.target)
    print(f"{args.db}: copied to {args.target} ({os.path.getsize(args.target):,} bytes)")
    return 0


@COMMANDS.command(
    "copy",
    "copy every agent, version, journal, memory and alarm to a new database",
    flag("source", metavar="SRC", help="the database to copy"),
    flag("target", metavar="DST", help="a new file, or an empty PostgreSQL database"),
    description="Copy a whole database (SQLite file or postgresql:// URL) to a new, "
    "empty one, of either kind, in one transaction; the source is only read.",
    db=False,
    words=lambda message, args: cli_words(message, redacted(args.source)),
)
def copy(args: argparse.Namespace) -> int:
    source, target = args.source, args.target
    problem = unusable(source)
    if problem:
        return fail(problem)
    if not is_postgres_url(source) and not is_postgres_url(target):
        if os.path.exists(target) and os.path.samefile(source, target):
            return fail(f"{source} and {target} are the same file; copy to a new database")
    made = not is_postgres_url(target) and not os.path.exists(target)
    try:
        # The copy is sealed as the source is, with its keys: the target opens with them.
        with (
            Store(source, readonly=True, keys=keys_from_environment()) as src,
            Store(target) as dst,
        ):
            result = copy_store(src, dst)
    except (DurableError, KeyboardInterrupt):
        if made:
            _remove_database_file(target)
        raise
    rows = sum(result.rows.values())
    print(f"{redacted(source)}: copied to {redacted(target)}: {rows:,} rows")
    print_rows([[table, f"{count:,}"] for table, count in result.rows.items()])
    return 0


def _remove_database_file(path: str) -> None:
    """Remove the database file a failed copy created (it holds only our empty schema)."""
    for name in (path, f"{path}-wal", f"{path}-shm", f"{path}-lock"):
        if os.path.exists(name):
            os.remove(name)
