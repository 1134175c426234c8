"""Turning a new message history into the rows a commit adds and removes.

Pure logic, no SQL: the store applies the resulting :class:`HistoryChange`.
Messages are treated as immutable values (effectful replaces a message rather
than mutating it). :func:`plan_logged` plans from a log of the keys a turn
appended and replaced, at a cost that does not depend on the history's length;
:func:`plan_change` compares whole histories, always correct, with the unchanged
prefix found by C-speed list comparisons.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import StateSerializationError
from .rows import StorableJSON

type Message = Mapping[str, Any]


@dataclass
class ActiveHistory:
    """The committed active history of one agent: messages and their positions."""

    messages: list[Any] = field(default_factory=list)
    positions: list[float] = field(default_factory=list)

    def extend(self, change: HistoryChange) -> None:
        """Apply, in place, a committed change planned by :func:`plan_logged`."""
        self.positions.extend(position for position, _ in change.added)
        self.messages.extend(message for _, message in change.added)
        for index, message in change.swapped:
            self.messages[index] = message


@dataclass(frozen=True)
class HistoryChange:
    """What a commit writes: new rows and the position ranges of rows it removes."""

    added: list[tuple[float, Message]]
    removed: list[tuple[float, float]]
    removed_count: int
    # Messages replaced by an equivalent copy (cache hints): no row changes,
    # but the committed history holds the new copy at that index.
    swapped: list[tuple[int, Message]] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not self.added and not self.removed


def plan_change(old: ActiveHistory, new: Sequence[Message]) -> tuple[HistoryChange, ActiveHistory]:
    """Diff ``new`` against the committed ``old`` history.

    Messages kept from ``old`` keep their rows; the rest of ``old`` is removed and
    the rest of ``new`` added, at positions that keep ``new``'s order.

    Returns:
        The change to commit and the active history after it.
    """
    new = new if isinstance(new, list) else list(new)
    start = _common_prefix(old.messages, new)
    if start == len(old.messages):
        # The common case: the turn only appended.
        base = old.positions[-1] if old.positions else -1.0
        appended = [(base + 1 + i, m) for i, m in enumerate(new[start:])]
        after = ActiveHistory(new, old.positions + [p for p, _ in appended])
        return HistoryChange(appended, [], 0), after

    kept = _kept_pairs(old, new, start)
    added: list[tuple[float, Message]] = []
    removed: list[tuple[float, float]] = []
    removed_count = 0
    positions = old.positions[:start]
    prev_old = start - 1
    prev_new = start - 1
    for new_index, old_index in [*kept, (len(new), len(old.messages))]:
        gone = range(prev_old + 1, old_index)
        if gone:
            removed.append((old.positions[gone[0]], old.positions[gone[-1]]))
            removed_count += len(gone)
        fresh = new[prev_new + 1 : new_index]
        if fresh:
            low = old.positions[prev_old] if prev_old >= 0 else -math.inf
            high = old.positions[old_index] if old_index < len(old.messages) else math.inf
            freed = [old.positions[i] for i in gone]
            slots = _slots(low, high, freed, len(fresh))
            if slots is None:
                # No room left between two kept rows: move the rest to the end.
                return _rewrite_from(old, new, start)
            added.extend(zip(slots, fresh, strict=True))
            positions.extend(slots)
        if old_index < len(old.messages):
            positions.append(old.positions[old_index])
        prev_old, prev_new = old_index, new_index
    return HistoryChange(added, removed, removed_count), ActiveHistory(new, positions)


def plan_logged(
    old: ActiveHistory,
    current: OrderedDict[str, Message],
    appended: Sequence[str],
    replaced: Sequence[str],
) -> HistoryChange | None:
    """Plan from the keys a turn appended and replaced, or None if a full diff is needed.

    ``current`` is the history now, an OrderedDict keyed by message id. Cheap
    checks confirm the log fits (its length, its last key); a replaced message
    that is more than an equivalent copy, or one far back, asks for the full diff.
    """
    if len(current) != len(old.messages) + len(appended):
        return None
    if appended and next(reversed(current)) != appended[-1]:
        return None
    swapped = []
    for key in replaced:
        index = _index_from_end(old.messages, key)
        if index is None or not _equivalent(old.messages[index], current[key]):
            return None
        swapped.append((index, current[key]))
    base = old.positions[-1] if old.positions else -1.0
    added = [(base + 1 + i, current[key]) for i, key in enumerate(appended)]
    return HistoryChange(added, [], 0, swapped)


def _index_from_end(messages: list[Message], key: str, limit: int = 64) -> int | None:
    """Index of the message with id ``key`` among the last ``limit``, searching back."""
    for index in range(len(messages) - 1, max(len(messages) - limit, 0) - 1, -1):
        if messages[index].get("id") == key:
            return index
    return None


def _common_prefix(old: list[Message], new: list[Message]) -> int:
    """Length of the longest common prefix, probing from the end."""
    n = min(len(old), len(new))
    if (old if n == len(old) else old[:n]) == new[:n]:
        return n
    # Prefix equality is monotone: search back from n in growing steps, then bisect.
    equal, unequal, step = 0, n, 1
    while unequal - step > 0:
        probe = unequal - step
        if old[:probe] == new[:probe]:
            equal = probe
            break
        unequal, step = probe, step * 2
    while unequal - equal > 1:
        mid = (equal + unequal) // 2
        if old[:mid] == new[:mid]:
            equal = mid
        else:
            unequal = mid
    return equal


def _kept_pairs(old: ActiveHistory, new: list[Message], start: int) -> list[tuple[int, int]]:
    """Pairs (new index, old index) of unchanged messages after the prefix, in order."""
    by_id: dict[Any, int] = {old.messages[i].get("id"): i for i in range(start, len(old.messages))}
    kept: list[tuple[int, int]] = []
    last = start - 1
    for new_index in range(start, len(new)):
        message = new[new_index]
        old_index = by_id.get(message.get("id"))
        if (
            old_index is not None
            and old_index > last
            and _equivalent(old.messages[old_index], message)
        ):
            kept.append((new_index, old_index))
            last = old_index
    return kept


def _equivalent(old: Message, new: Message) -> bool:
    """Equal, ignoring the ``cache_control`` hints effectful adds to earlier messages.

    effectful marks the last block of earlier messages for prompt caching on every
    call; storing each marked copy again would double what a turn writes. The
    stored row keeps the unmarked copy, which effectful marks again when it sends it.
    """
    return old == new or _without_cache_hints(old) == _without_cache_hints(new)


def _without_cache_hints(message: Message) -> Message:
    content = message.get("content")
    if not isinstance(content, list):
        return message
    blocks = [
        {k: v for k, v in block.items() if k != "cache_control"}
        if isinstance(block, dict)
        else block
        for block in content
    ]
    return {**message, "content": blocks}


def _slots(low: float, high: float, freed: list[float], count: int) -> list[float] | None:
    """``count`` increasing positions in (low, high), or None if floats run out.

    The positions of removed rows are reused for the last new messages, so a
    rewritten message keeps its place and a summary sorts after the rows it replaces.
    """
    reuse = freed[-count:] if freed else []
    extra = count - len(reuse)
    if extra == 0:
        return reuse
    high = reuse[0] if reuse else high
    if high == math.inf:
        base = -1.0 if low == -math.inf else low
        return [base + 1 + i for i in range(extra)]
    if low == -math.inf:
        return [high - extra + i for i in range(extra)] + reuse
    step = (high - low) / (extra + 1)
    slots = [low + step * (i + 1) for i in range(extra)]
    if not all(a < b for a, b in zip([low, *slots], [*slots, high], strict=True)):
        return None
    return slots + reuse


def _rewrite_from(
    old: ActiveHistory, new: list[Message], start: int
) -> tuple[HistoryChange, ActiveHistory]:
    """Remove every old row after the common prefix and append the rest of ``new``."""
    tail = range(start, len(old.messages))
    removed = [(old.positions[tail[0]], old.positions[tail[-1]])]
    base = old.positions[-1]
    added = [(base + 1 + i, m) for i, m in enumerate(new[start:])]
    after = ActiveHistory(new, old.positions[:start] + [p for p, _ in added])
    return HistoryChange(added, removed, len(tail)), after


_MESSAGE_ADVICE = (
    "Each message of an agent's __history__ must be a dict of JSON values whose "
    "string 'id' is its key there, as effectful makes them."
)


def check_messages(
    agent_id: str, messages: Iterable[Any], history: Mapping[str, Any] | None
) -> None:
    """Refuse messages that could not be stored and loaded back as they are.

    Each must be a mapping with a string ``"id"``; with ``history`` (the agent's
    ``__history__``), the one kept there under that id. Costs what it checks:
    a commit checks the messages it adds.

    Raises:
        StateSerializationError: A message that is not such a mapping.
    """
    for message in messages:
        if not isinstance(message, Mapping):
            reason = "a message must be a dict"
        elif not isinstance(key := message.get("id"), str):
            reason = "it has no string 'id'"
        elif history is not None and history.get(key) is not message:
            reason = f"it is not kept under its id {key!r} in __history__"
        else:
            continue
        owner = f"agent {agent_id!r} message"
        raise StateSerializationError(
            owner, "__history__", type(message).__name__, reason, _MESSAGE_ADVICE
        )


_MESSAGE_JSON = StorableJSON()


def message_json(agent_id: str, message: Message) -> str:
    """The JSON text a message is stored as.

    Raises:
        StateSerializationError: It holds a value JSON cannot hold, or nests too deep.
    """
    try:
        text: str = _MESSAGE_JSON(message)
    except (TypeError, ValueError, RecursionError) as e:
        owner = f"agent {agent_id!r} message {message.get('id')!r}"
        raise StateSerializationError(
            owner, "body", type(message).__name__, str(e), _MESSAGE_ADVICE
        ) from e
    return text


def message_text(message: Message) -> str:
    """A message as plain text: its text blocks, then one line per tool call it makes.

    Parts of other shapes than effectful makes are shown as JSON, or left out.
    """
    content = message.get("content")
    if isinstance(content, list):
        content = "".join(
            _shown(block.get("text", "") if isinstance(block, dict) else block)
            for block in content
        )
    lines = [_shown(content)]
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else []:
        function = call.get("function") if isinstance(call, dict) else None
        if isinstance(function, dict):
            lines.append(f"-> calls {function.get('name')}({function.get('arguments')})")
    return "\n".join(line for line in lines if line)


def _shown(value: Any) -> str:
    if value is None or isinstance(value, str):
        return value or ""
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, RecursionError):
        return f"<{type(value).__name__}>"
