"""How commands print: aligned tables of one-line cells, or JSON."""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

# Tables fit a 100-column terminal: a cell is cut at 40 characters, and the last
# column at what is left of the line (at least 40); --json prints everything.
LINE_WIDTH = 100
CELL_WIDTH = 40


def show(args: argparse.Namespace, records: Sequence[Any], columns: list[str]) -> None:
    """Print dataclass records as JSON, or as a table of ``columns``."""
    if args.json:
        print_json([dataclasses.asdict(record) for record in records])
        return
    rows = [columns]
    rows += [[cell(getattr(record, column)) for column in columns] for record in records]
    print_rows(rows)


def print_rows(rows: Sequence[Sequence[str]]) -> None:
    """Print rows of one-line cells, each column padded to its widest cell.

    Empty columns are left out; long cells are cut to keep lines within LINE_WIDTH.
    """
    if not rows:
        return
    cut = [[shorten(text, CELL_WIDTH) for text in row[:-1]] for row in rows]
    widths = [max(len(row[i]) for row in cut) for i in range(len(cut[0]))]
    last = max(CELL_WIDTH, LINE_WIDTH - sum(width + 2 for width in widths if width))
    for row, full in zip(cut, rows, strict=True):
        cells = [text.ljust(width) for text, width in zip(row, widths, strict=True) if width]
        print("  ".join([*cells, shorten(full[-1], last)]).rstrip())


def cell(value: Any) -> str:
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
        text = dumps(value)
    else:
        text = str(value)
    return " ".join(text.split())


def shorten(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, ending in ``…`` when cut."""
    return text if len(text) <= width else text[: width - 1] + "…"


def dumps(value: Any) -> str:
    """``value`` as JSON on one line."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=_jsonable)


def print_json(value: Any) -> None:
    """Print ``value`` as indented JSON, times as ISO 8601 strings."""
    print(json.dumps(value, indent=2, ensure_ascii=False, default=_jsonable))


def _scalar(value: Any) -> str:
    return value if isinstance(value, str) else dumps(value)


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC) if moment.tzinfo else moment.replace(tzinfo=UTC)


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return _utc(value).isoformat()
    return repr(value)
