"""Privacy: ``erase`` what a person's (or an agent's) content is, everywhere the database
holds it, and list the ``erasures`` made, with their receipts. ``agents --subject``
lists what holds a subject's content. ``encrypt`` seals a database's plain rows in
place, and ``rotate-key`` seals every row again with new data keys."""

from __future__ import annotations

import argparse
import dataclasses

from ..store import Keys, Store
from ..store.records import ErasureReceipt
from ..store.resealing import ResealReport
from .command import Family, flag, positive
from .output import cell, print_json, print_rows

COMMANDS = Family("Privacy")


def _confirmed(args: argparse.Namespace) -> str | None:
    if (args.subject is None) == (args.agent is None):
        return "erase takes --subject or --agent (with --conversation to erase one of its own)"
    if args.subject is not None and args.conversation is not None:
        return "erase --subject takes no --conversation: it erases all the subject holds"
    if args.yes:
        return None
    what = f"subject {args.subject!r}" if args.subject is not None else f"agent {args.agent!r}"
    if args.conversation is not None:
        what = f"conversation {args.conversation!r} of {what}"
    return f"erase removes everything of {what} for good, every version too; pass --yes to confirm"


@COMMANDS.writes(
    "erase",
    "erase a subject's (or an agent's) content from every copy in DB, with a receipt",
    flag("--subject", metavar="SUBJECT", help="the person or tenant whose content goes"),
    flag("--agent", metavar="AGENT", help="the agent whose content goes"),
    flag("--conversation", metavar="ID", help="with --agent: that conversation alone"),
    flag("--yes", action="store_true", help="confirm the erasure"),
    json=True,
    prepare=_confirmed,
)
def erase(store: Store, args: argparse.Namespace) -> int:
    receipt = store.erase(subject=args.subject, agent=args.agent, conversation=args.conversation)
    if args.json:
        print_json(dataclasses.asdict(receipt))
        return 0
    counts = ", ".join(f"{n} {kind}" for kind, n in receipt.counts.items()) or "no rows"
    print(
        f"erased {len(receipt.agents)} agent(s) and {len(receipt.conversations)} "
        f"conversation(s): {counts}; receipt {receipt.erasure_id}, digest {receipt.digest}"
    )
    if receipt.scrubbed_at is None:
        print(
            "the files are not scrubbed yet (a reader held an older snapshot): the next "
            "erasure scrubs them first"
        )
    return 0


@COMMANDS.reads("erasures", "list the erasures made, with their receipts' digests")
def erasures(store: Store, args: argparse.Namespace) -> int:
    receipts: list[ErasureReceipt] = store.erasures()
    if args.json:
        print_json([dataclasses.asdict(receipt) for receipt in receipts])
        return 0
    header = ["erasure_id", "erased_at", "agents", "conversations", "rows", "scrubbed", "ok"]
    print_rows(
        [
            header,
            *(
                [
                    receipt.erasure_id,
                    cell(receipt.erased_at),
                    str(len(receipt.agents)),
                    str(len(receipt.conversations)),
                    str(sum(receipt.counts.values())),
                    "yes" if receipt.scrubbed_at is not None else "pending",
                    "yes" if receipt.verified else "DIGEST MISMATCH",
                ]
                for receipt in receipts
            ),
        ]
    )
    return 0


def _report(report: ResealReport, args: argparse.Namespace, done: str) -> int:
    if args.json:
        print_json(dataclasses.asdict(report))
        return 0 if not report.busy else 1
    sealed = ", ".join(f"{n} {table}" for table, n in report.sealed.items()) or "nothing"
    print(f"{done} {report.agents} agent(s): sealed {sealed}; {report.keys} new data key(s)")
    if report.busy:
        print(f"busy (a turn held them; run again): {' '.join(report.busy)}")
        return 1
    print("every row is sealed" if report.complete else "some rows are still plain")
    return 0


@COMMANDS.writes(
    "encrypt",
    "seal DB's plain rows in place, online, with the key the environment names",
    flag("--batch", type=positive, default=500, metavar="N", help="rows per transaction"),
    json=True,
)
def encrypt(store: Store, args: argparse.Namespace) -> int:
    return _report(store.reseal(batch=args.batch), args, "encrypted")


@COMMANDS.writes(
    "rotate-key",
    "give DB's agents new data keys and seal every row again, online",
    flag("--batch", type=positive, default=500, metavar="N", help="rows per transaction"),
    flag(
        "--new-key-file",
        metavar="PATH",
        help="also wrap every data key with the master key in PATH (then use that one)",
    ),
    json=True,
)
def rotate_key(store: Store, args: argparse.Namespace) -> int:
    report = store.reseal(rotate=True, batch=args.batch)
    if args.new_key_file is not None:
        wrapped = store.rewrap_keys(Keys.from_file(args.new_key_file).master)
        if not args.json:
            print(f"wrapped {wrapped} data key(s) with the master key in {args.new_key_file}")
    return _report(report, args, "rotated")
