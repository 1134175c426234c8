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
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
