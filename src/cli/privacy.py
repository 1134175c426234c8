"""Privacy: ``erase`` what a person's (or an agent's) content is, everywhere the database
holds it, and list the ``erasures`` made, with their receipts. ``agents --subject``
lists what holds a subject's content."""

from __future__ import annotations

import argparse
import dataclasses

from ..store import Store
from ..store.records import ErasureReceipt
from .command import Family, flag
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
