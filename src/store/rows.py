"""Small helpers shared by the store's modules for reading and writing rows."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import apsw


def current_version(conn: apsw.Connection, agent_id: str) -> int | None:
    row = conn.execute("SELECT version FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
    return None if row is None else int(row[0])


def utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


def dumps(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
    if storable(text):
        return text
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), default=repr)


def storable(text: str) -> bool:
    """Whether SQLite can store ``text``: it must have a UTF-8 form, so no lone surrogate.

    JSON text that fails this is written with ``ensure_ascii=True`` instead, which
    spells such characters as ``\\udxxx`` escapes and reads back the same.
    """
    if text.isascii():  # O(1) in CPython
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True
