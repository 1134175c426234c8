"""An agent's message history that knows what changed since its last commit.

effectful 0.4 never edits an agent's ``__history__`` in place during a call: the
provider works on ``history.copy()`` (appending messages, re-marking earlier ones
for prompt caching) and at the end of the outermost call writes the result back
with ``history.clear()`` and ``history.update(copy)``. :class:`History` hands out
copies that log those edits, and adopts the log when such a copy is written back,
so a commit can plan its rows from what the turn touched instead of comparing
the whole history. Any other way of changing the history makes the log unknown,
and the commit falls back to the full comparison, which is always correct.

The logging copies must be filled at C speed: a Python ``__setitem__`` would be
called once per message on every copy. So they are built as plain ``History``
objects and then given the logging class (the two share one memory layout).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Changes:
    """Keys a history appended (in order) and replaced since its last commit."""

    appended: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)

    def record(self, key: str, existed: bool) -> None:
        if not existed:
            self.appended.append(key)
        elif key not in self.appended and key not in self.replaced:
            self.replaced.append(key)

    def merge(self, later: Changes) -> None:
        for key in later.replaced:
            self.record(key, existed=True)
        self.appended.extend(later.appended)


class History(OrderedDict[str, Any]):
    """The live history of a PersistentAgent (its ``__history__``).

    Behaves as the OrderedDict effectful expects. :meth:`changes` tells what
    changed since :meth:`mark_committed`, or None when that is not known.
    """

    # While False, the dict beneath lists the messages in order, and
    # ``list(dict.values(history))`` is about ten times faster than ``.values()``.
    reordered = False
    _changes: Changes | None = None  # None: unknown since the last commit
    _generation = 0  # bumped whenever the content changes
    # What clear() emptied (generation, changes), awaiting a copy of it in update().
    _cleared: tuple[int, Changes | None] = (-1, None)

    def __init__(self, other: Any = (), /, **kwargs: Any) -> None:
        super().__init__()
        self._fill(other, kwargs)

    def mark_committed(self) -> None:
        """Start logging changes afresh: the history now equals its last commit."""
        self._changes = Changes()
        self._generation += 1

    def changes(self) -> Changes | None:
        """What changed since :meth:`mark_committed`, or None if unknown."""
        return self._changes

    def copy(self) -> History:
        filled: Any = _Filling(_pairs(self))
        filled.__class__ = _LoggingCopy
        draft: _LoggingCopy = filled
        draft.origin, draft.generation, draft.log = self, self._generation, Changes()
        draft.reordered = self.reordered
        return draft

    def clear(self) -> None:
        self._cleared = (self._generation, self._changes)
        self._touch(None)
        self.reordered = False
        super().clear()

    def update(self, other: Any = (), /, **kwargs: Any) -> None:
        generation, before = self._cleared
        adopt = (
            isinstance(other, _LoggingCopy)
            and other.origin is self
            and other.generation == generation == self._generation - 1
            and other.log is not None
            and before is not None
            and not kwargs
        )
        self._fill(other, kwargs)
        self.reordered = self.reordered or getattr(other, "reordered", False)
        if adopt:
            before.merge(other.log)  # type: ignore[union-attr]  # checked above
            self._touch(before)
        else:
            self._touch(None)

    def __setitem__(self, key: str, value: Any) -> None:
        changes, existed = self._changes, key in self
        super().__setitem__(key, value)
        if changes is not None:
            changes.record(key, existed)
        self._touch(changes)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self._touch(None)

    def pop(self, key: str, *default: Any) -> Any:
        self._touch(None)
        return super().pop(key, *default)

    def popitem(self, last: bool = True) -> tuple[str, Any]:
        self._touch(None)
        return super().popitem(last)

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def move_to_end(self, key: str, last: bool = True) -> None:
        self.reordered = True
        self._touch(None)
        super().move_to_end(key, last)

    def _touch(self, changes: Changes | None) -> None:
        self._changes = changes
        self._generation += 1

    def _fill(self, other: Any, kwargs: dict[str, Any]) -> None:
        """``OrderedDict.update`` at C speed, bypassing our ``__setitem__``."""
        this: Any = self
        cls, this.__class__ = this.__class__, _Filling
        try:
            OrderedDict.update(this, _pairs(other), **kwargs)
        finally:
            this.__class__ = cls


class _Filling(OrderedDict[str, Any]):
    """A plain OrderedDict class that a history wears while it is being filled."""


class _LoggingCopy(History):
    """The copy effectful works on during a call: logs appends and replacements.

    Anything else it undergoes makes its log unknown (None).
    """

    origin: History
    generation: int
    log: Changes | None

    def __setitem__(self, key: str, value: Any) -> None:
        existed = key in self
        OrderedDict.__setitem__(self, key, value)
        if self.log is not None:
            self.log.record(key, existed)

    def _touch(self, changes: Changes | None) -> None:
        self.log = None


def _pairs(mapping: Any) -> Any:
    """What to fill an OrderedDict from: for a history in insertion order, its
    (key, message) pairs read from the dict beneath (faster than its ``items()``)."""
    if isinstance(mapping, History) and not mapping.reordered:
        return zip(dict.keys(mapping), dict.values(mapping), strict=True)
    return mapping


def history_messages(history: Mapping[str, Any]) -> list[Any]:
    """The messages of a history, in order, as a new list."""
    if isinstance(history, History) and not history.reordered:
        return list(dict.values(history))
    return list(history.values())


def replace_history(history: OrderedDict[str, Any], messages: Iterable[Mapping[str, Any]]) -> None:
    """Replace the content of ``history`` in place (templates hold a reference to it)."""
    history.clear()
    history.update((message["id"], message) for message in messages)
