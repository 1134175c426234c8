"""Small helpers shared by the store's modules for reading and writing rows."""

from __future__ import annotations

import gc
import json
import json.encoder
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import pydantic_core

from .engine.seam import Conn


def current_version(conn: Conn, agent_id: str) -> int | None:
    row = conn.execute(
        "SELECT version FROM checked_agents WHERE agent_id = ?", (agent_id,)
    ).fetchone()
    return None if row is None else int(row[0])


def kept_from(conn: Conn, agent_id: str) -> int:
    """The agent's oldest version that was not pruned (1 if nothing was)."""
    row = conn.execute(
        "SELECT kept_from FROM retention WHERE agent_id = ?", (agent_id,)
    ).fetchone()
    return 1 if row is None else int(row[0])


def typed_json(text: str) -> Any:
    """The value of JSON ``text`` a person typed; NaN and Infinity, which JSON lacks, are refused.

    Raises:
        ValueError: It is not JSON, saying where.
    """
    try:
        return json.loads(text, parse_constant=_not_json)
    except json.JSONDecodeError as error:
        msg = f"{error.msg} at line {error.lineno} column {error.colno}"
        raise ValueError(msg) from None


def _not_json(name: str) -> Any:
    msg = f"{name} is not a JSON value"
    raise ValueError(msg)


def utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, UTC)


class StorableJSON:
    """Compact JSON text of a value, in a form both databases store.

    Non-ASCII characters stay as they are, unless the text holds a lone surrogate
    (no UTF-8 form): then it is written with ``\\uXXXX`` escapes, which read back
    the same. ``json.JSONEncoder.encode`` builds its C encoder anew on every call,
    a few microseconds a message; this builds the two once.

    Args:
        sort_keys: Write object keys in sorted order.
        default: Called for values JSON has no form for; by default they raise TypeError.
    """

    def __init__(self, *, sort_keys: bool = False, default: Any = None) -> None:
        self._utf8 = _encoder(ensure_ascii=False, sort_keys=sort_keys, default=default)
        self._ascii = _encoder(ensure_ascii=True, sort_keys=sort_keys, default=default)

    def __call__(self, value: Any) -> str:
        """The JSON text of ``value``.

        Raises:
            TypeError, ValueError, RecursionError: As :func:`json.dumps` does
                (a cycle shows as RecursionError).
        """
        text = self._utf8(value)
        return text if storable(text) else self._ascii(value)


def _encoder(*, ensure_ascii: bool, sort_keys: bool, default: Any) -> Callable[[Any], str]:
    """``json.JSONEncoder(...).encode``, with its C encoder made once where Python has one."""
    encoder = json.JSONEncoder(
        ensure_ascii=ensure_ascii, sort_keys=sort_keys, separators=(",", ":"), default=default
    )
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:  # no C accelerator: the pure-Python encoder, as json.dumps uses
        return encoder.encode
    encode_string = (
        json.encoder.encode_basestring_ascii if ensure_ascii else json.encoder.encode_basestring
    )
    # As JSONEncoder.iterencode builds it, without the cycle check's markers dict.
    iterencode = make(None, encoder.default, encode_string, None, ":", ",", sort_keys, False, True)

    def encode(value: Any) -> str:
        return "".join(iterencode(value, 0))

    return encode


dumps = StorableJSON(default=repr)


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


def like_pattern(text: str) -> str:
    """``text`` as a LIKE pattern matching itself (``\\`` escapes: ``ESCAPE '\\'``)."""
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


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
            (SELECT state FROM checked_versions
              WHERE agent_id = ?1 AND version <= ?2 AND state IS NOT NULL
              ORDER BY version DESC LIMIT 1),
            (SELECT state FROM checked_retention WHERE agent_id = ?1))
        """,
        (agent_id, version),
    ).get
    return None if state is None else str(state)


def code_version_in(detail: str | None) -> str | None:
    """The ``code_version`` a version's ``detail`` JSON names, if any."""
    found = json.loads(detail) if detail else None
    code = found.get("code_version") if isinstance(found, dict) else None
    return code if isinstance(code, str) else None


def trace_in(detail: str | None) -> str | None:
    """The W3C ``traceparent`` a traced turn keeps in its version's ``detail`` JSON."""
    found = json.loads(detail) if detail else None
    trace = found.get("trace") if isinstance(found, dict) else None
    return trace if isinstance(trace, str) else None


def decode_messages(bodies: Iterable[Any]) -> list[dict[str, Any]]:
    # pydantic-core's parser, about twice as fast as json's. One call per row: one
    # call on the rows joined was slower, as joining copies all of them twice into
    # fresh memory (a 10,000-turn history is ~13 MB of JSON). It refuses what only
    # json accepts (an escaped lone surrogate): then json decides, for that row.
    decode = pydantic_core.from_json
    decoded: list[dict[str, Any]] = []
    append = decoded.append
    with collector_paused():
        for body in bodies:
            try:
                append(decode(body))
            except ValueError:
                append(json.loads(body))
    return decoded


@contextmanager
def collector_paused() -> Iterator[None]:
    """Hold off the cyclic garbage collector while a long history is decoded.

    Decoding makes a few containers per message and no cycles; with the collector
    on, the new containers counted as pending make it walk the whole heap, once or
    more during a 10,000-turn load (about a third of the load's time).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def decode_positioned(
    rows: Iterable[tuple[float, str | bytes]],
) -> tuple[list[float], list[dict[str, Any]]]:
    """The positions and decoded messages of ``(position, body)`` rows, as they come.

    Iterate a cursor rather than a fetched list: each body is freed once decoded,
    so a long history is not held twice (text and messages) in fresh memory.
    """
    positions: list[float] = []

    def bodies() -> Iterator[str | bytes]:
        for position, body in rows:
            positions.append(position)
            yield body

    return positions, decode_messages(bodies())


def searchable_text(message: Any) -> str:
    """The words of a message a search finds: its text, and its tool calls' arguments."""
    if not isinstance(message, dict):
        return ""
    parts: list[str] = []
    content = message.get("content")
    if isinstance(content, str):
        parts.append(content)
    elif isinstance(content, list):
        parts += [str(block.get("text", "")) for block in content if isinstance(block, dict)]
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            parts.append(str(function.get("arguments", "")))
    return "\n".join(parts)
