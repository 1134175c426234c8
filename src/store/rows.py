"""Small helpers shared by the store's modules for reading and writing rows."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

import pydantic_core

from .backend import Conn


def current_version(conn: Conn, agent_id: str) -> int | None:
    row = conn.execute("SELECT version FROM agents WHERE agent_id = ?", (agent_id,)).fetchone()
    return None if row is None else int(row[0])


def utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


# What json.dumps(value, separators=(",", ":"), ...) builds on every call.
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=repr)
_JSON_ASCII = json.JSONEncoder(separators=(",", ":"), default=repr)


def dumps(value: Any) -> str:
    text = _JSON.encode(value)
    if storable(text):
        return text
    return _JSON_ASCII.encode(value)


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


def legible(text: str) -> str:
    """``text`` as both databases store plain text: a NUL or a lone surrogate as its escape."""
    if text.isascii() and "\0" not in text:
        return text
    return text.replace("\0", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")


def state_at(conn: Conn, agent_id: str, version: int) -> str | None:
    # Kept versions that did not change the state inherit the one carried over
    # from the pruned versions before them (retention.py).
    state = conn.execute(
        """
        SELECT coalesce(
            (SELECT state FROM versions
              WHERE agent_id = ?1 AND version <= ?2 AND state IS NOT NULL
              ORDER BY version DESC LIMIT 1),
            (SELECT state FROM retention WHERE agent_id = ?1))
        """,
        (agent_id, version),
    ).get
    return None if state is None else str(state)


def decode_messages(bodies: Iterable[Any]) -> list[dict[str, Any]]:
    # pydantic-core's parser, about twice as fast as json's. One call per row: one
    # call on the rows joined was slower, as joining copies all of them twice into
    # fresh memory (a 10,000-turn history is ~13 MB of JSON). It refuses what only
    # json accepts (an escaped lone surrogate): then json decides, for that row.
    decode = pydantic_core.from_json
    decoded: list[dict[str, Any]] = []
    append = decoded.append
    for body in bodies:
        try:
            append(decode(body))
        except ValueError:
            append(json.loads(body))
    return decoded


def decode_positioned(
    rows: Iterable[tuple[float, str]],
) -> tuple[list[float], list[dict[str, Any]]]:
    """The positions and decoded messages of ``(position, body)`` rows, as they come.

    Iterate a cursor rather than a fetched list: each body is freed once decoded,
    so a long history is not held twice (text and messages) in fresh memory.
    """
    positions: list[float] = []

    def bodies() -> Iterator[str]:
        for position, body in rows:
            positions.append(position)
            yield body

    return positions, decode_messages(bodies())
