"""StateTools: memory the agent decides to keep, through primitive tools for its model.

The model stores JSON values under keys (``put_state``), reads, lists and deletes
them, and keeps timestamped context notes. Every write of a turn is staged and
commits with the turn, in its one transaction; the store versions memory like
messages. :class:`AgentMemory` is the developer's view of the same memory.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from typing import Any, ClassVar, Literal

from effectful.handlers.llm import Tool
from effectful.ops.types import Operation

from ..errors import DurableError, MemoryWriteError
from ..store.parts.memory import KEY, NOTE, Kind, MemoryChanges, MemoryNote, MemoryRows, note_of


@dataclasses.dataclass(frozen=True)
class MemoryLimits:
    """How much an agent may keep in its memory; set ``__memory_limits__`` to change them.

    A write over a limit is refused: the model's tool call gets an error text and
    the turn goes on; a developer's :meth:`AgentMemory.put` raises
    :class:`~effectful_durable.MemoryWriteError`. Nothing is written either way.

    Args:
        key_chars: Longest key, in characters.
        value_bytes: Largest value, in bytes of its compact UTF-8 JSON text.
        keys: Most keys the memory holds.
        note_chars: Longest context note, in characters.
        notes: Most context notes the memory holds.
        listed_keys: Most keys one ``list_state_keys`` call returns.

    Example::

        @dataclasses.dataclass
        class Assistant(PersistentAgent, StateTools):
            __memory_limits__ = MemoryLimits(keys=100, value_bytes=4096)

    .. versionadded:: 0.2.0
    """

    key_chars: int = 200
    value_bytes: int = 64 * 1024
    keys: int = 1000
    note_chars: int = 2000
    notes: int = 100
    listed_keys: int = 200

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                msg = f"MemoryLimits.{field.name} must be a positive int, not {value!r}"
                raise ValueError(msg)


@dataclasses.dataclass(frozen=True)
class MemoryDigest:
    """What the system message of each model request says about the memory.

    The digest lists the keys in order, with the values whose JSON text is
    short and the size and type of the others, then the context notes, newest
    kept when they do not all fit. It is rebuilt for every request, so it shows
    the turn's own writes, and it never enters the history. Set
    ``__memory_digest__ = None`` to leave it out (the context notes then reach
    the model only through this digest, so they are not shown either).

    Args:
        keys: Most keys listed.
        value_chars: Longest JSON text of a value shown in full.
        chars: Longest text of the keys part, in characters.
        note_chars: Longest text of the notes part, in characters.

    .. versionadded:: 0.2.0
    """

    keys: int = 30
    value_chars: int = 120
    chars: int = 2000
    note_chars: int = 4000

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                msg = f"MemoryDigest.{field.name} must be an int >= 0, not {value!r}"
                raise ValueError(msg)


@Operation.define
def agent_memory(agent: Any) -> AgentMemory:
    """The memory of ``agent`` as the current turn sees it; PersistenceHandler answers it."""
    msg = (
        f"cannot use the memory of {getattr(agent, 'agent_id', agent)!r}: agent memory "
        "lives in the database, so install PersistenceHandler (it answers StateTools "
        "and __memory__)"
    )
    raise DurableError(msg)


class TurnMemory(MemoryChanges):
    """A turn's staged memory writes, and what the turn read of the committed memory."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[Kind, int] = {}  # committed counts, read once per turn
        self.delta: dict[Kind, int] = {}  # what the staged changes add to those counts
        self.revision = 0  # bumped by every staged write
        self.digest: tuple[int, str | None] | None = None  # (revision, text) last rendered


class AgentMemory(Mapping[str, Any]):
    """An agent's memory as a read-only mapping of keys to JSON values.

    Get it from ``agent.__memory__`` under :class:`~effectful_durable.PersistenceHandler`.
    Inside a turn of the agent (its template call, its tools) it shows the
    committed memory plus the turn's staged writes, and :meth:`put`,
    :meth:`delete`, :meth:`add_note` and :meth:`clear_notes` stage writes that
    commit with the turn, exactly as the model's tools do. Outside a turn it
    shows the last committed memory, and writing raises
    :class:`~effectful_durable.DurableError`. Reads go to the database each
    time; a view taken inside a turn refuses to be used after the turn ended.

    .. versionadded:: 0.2.0
    """

    def __init__(
        self,
        agent_id: str,
        rows: MemoryRows,
        limits: MemoryLimits,
        turn: TurnMemory | None = None,
        live: Callable[[], bool] = lambda: True,
    ) -> None:
        self.agent_id = agent_id
        self.limits = limits
        self._rows = rows
        self._turn = turn
        self._live = live

    def __repr__(self) -> str:
        where = "in a turn" if self._turn is not None else "committed"
        return f"<AgentMemory of {self.agent_id!r}, {where}>"

    # -- reads -------------------------------------------------------------------

    def __getitem__(self, key: str) -> Any:
        text = self.json(key) if isinstance(key, str) else None
        if text is None:
            raise KeyError(key)
        return json.loads(text)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.json(key) is not None

    def __iter__(self) -> Iterator[str]:
        return iter([key for key, _, _ in self.entries()])

    def __len__(self) -> int:
        return self.count(KEY)

    def json(self, key: str) -> str | None:
        """The JSON text stored under ``key``, or None."""
        return self._json(KEY, key)

    def entries(
        self, prefix: str = "", *, limit: int = -1, small: int = -1
    ) -> list[tuple[str, int, str | None]]:
        """``(key, bytes, JSON text)`` of the keys starting with ``prefix``, in key order.

        The text is None for values over ``small`` bytes (negative: all values
        are given); at most ``limit`` entries (negative: all).
        """
        self._check_live()
        staged = self._staged(KEY, prefix)
        deleted = sum(1 for value in staged.values() if value is None)
        fetch = -1 if limit < 0 else limit + deleted
        merged = {
            key: (size, text)
            for key, size, text in self._rows.entries(
                self.agent_id, KEY, prefix=prefix, limit=fetch, small=small
            )
        }
        for key, value in staged.items():
            if value is None:
                merged.pop(key, None)
            else:
                size = len(value.encode())
                merged[key] = (size, value if small < 0 or size <= small else None)
        keys = sorted(merged)
        if limit >= 0:
            keys = keys[:limit]
        return [(key, *merged[key]) for key in keys]

    def count(self, kind: Literal["key", "note"] = "key") -> int:
        """How many keys (or, with ``"note"``, notes) the memory holds."""
        self._check_live()
        if self._turn is None:
            return self._rows.count(self.agent_id, kind)
        committed = self._turn.counts.get(kind)
        if committed is None:
            committed = self._turn.counts[kind] = self._rows.count(self.agent_id, kind)
        return committed + self._turn.delta.get(kind, 0)

    @property
    def notes(self) -> list[MemoryNote]:
        """The context notes, oldest first."""
        return [note_of(value) for _, value in self._notes()]

    # -- writes ------------------------------------------------------------------

    def put(self, key: str, value: Any) -> None:
        """Stage ``value`` (any JSON-serialisable value) under ``key``, to commit with the turn.

        Raises:
            MemoryWriteError: A bad key, a value that is not JSON, or over a limit.
            DurableError: No turn of the agent is running in this thread.
        """
        self._writable()
        try:
            text = _encode(value)
        except (TypeError, ValueError, RecursionError) as e:
            raise MemoryWriteError(self.agent_id, f"the value is not JSON ({e})") from e
        error = self.stage_put(key, text)
        if error is not None:
            raise MemoryWriteError(self.agent_id, error)

    def delete(self, key: str) -> None:
        """Stage the deletion of ``key``, to commit with the turn.

        Raises:
            KeyError: The memory holds no ``key``.
            DurableError: No turn of the agent is running in this thread.
        """
        self._writable()
        if key not in self:
            raise KeyError(key)
        self._stage(KEY, key, None)

    def add_note(self, text: str) -> MemoryNote:
        """Stage a context note stamped with the current time; return it.

        Raises:
            MemoryWriteError: Empty or too long text, or too many notes.
            DurableError: No turn of the agent is running in this thread.
        """
        self._writable()
        note, error = self.stage_note(text)
        if note is None:
            raise MemoryWriteError(self.agent_id, error)
        return note

    def clear_notes(self, older_than: float) -> int:
        """Stage the deletion of the notes older than ``older_than`` seconds; count them.

        Raises:
            ValueError: ``older_than`` is negative or not finite.
            DurableError: No turn of the agent is running in this thread.
        """
        self._writable()
        if not math.isfinite(older_than) or older_than < 0:
            msg = f"older_than must be a finite number of seconds >= 0, not {older_than!r}"
            raise ValueError(msg)
        return self.stage_clear(older_than)

    # -- staging, shared by the tools and the methods above ----------------------

    def stage_put(self, key: str, text: str) -> str | None:
        """Stage compact JSON ``text`` under ``key``; return why not, or None."""
        self._writable()
        error = key_error(key, self.limits)
        if error is not None:
            return error
        try:
            size = len(text.encode())
        except UnicodeEncodeError:
            return "the value holds a lone surrogate (\\ud800-\\udfff), which is not valid text"
        if size > self.limits.value_bytes:
            return (
                f"the value is {size:,} bytes as JSON; the limit is "
                f"{self.limits.value_bytes:,} bytes. Store less, or split it over several keys"
            )
        if self.json(key) is None and self.count(KEY) >= self.limits.keys:
            return (
                f"the memory holds {self.limits.keys:,} keys, the limit; delete a key you "
                "no longer need, or overwrite one"
            )
        self._stage(KEY, key, text)
        return None

    def stage_note(self, text: str) -> tuple[MemoryNote | None, str]:
        """Stage a context note; return it, or None and why not."""
        self._writable()
        if not text.strip():
            return None, "the note is empty"
        if len(text) > self.limits.note_chars:
            return None, (
                f"the note is {len(text):,} characters; the limit is "
                f"{self.limits.note_chars:,}. Write a shorter note"
            )
        try:
            text.encode()
        except UnicodeEncodeError:
            return None, "the note holds a lone surrogate (\\ud800-\\udfff), which is not text"
        if self.count(NOTE) >= self.limits.notes:
            return None, (
                f"the context holds {self.limits.notes} notes, the limit; remove old ones "
                "with clear_old_context first"
            )
        notes = self._notes()
        last = int(notes[-1][0]) if notes else 0
        stamp = max(time.time_ns(), last + 1)  # keys keep notes in the order they came
        note = MemoryNote(datetime.fromtimestamp(stamp / 1e9, UTC), text)
        self._stage(NOTE, f"{stamp:020d}", _encode({"at": stamp / 1e9, "text": text}))
        return note, ""

    def stage_clear(self, older_than: float) -> int:
        """Stage the deletion of notes older than ``older_than`` seconds; count them."""
        self._writable()
        cutoff = time.time() - older_than
        old = [key for key, value in self._notes() if json.loads(value)["at"] < cutoff]
        for key in old:
            self._stage(NOTE, key, None)
        return len(old)

    # -- internals ---------------------------------------------------------------

    def _json(self, kind: Kind, key: str) -> str | None:
        self._check_live()
        if self._turn is not None and (kind, key) in self._turn.changes:
            return self._turn.changes[kind, key]
        return self._rows.value(self.agent_id, kind, key)

    def _staged(self, kind: Kind, prefix: str = "") -> dict[str, str | None]:
        if self._turn is None:
            return {}
        return {
            key: value
            for (k, key), value in self._turn.changes.items()
            if k == kind and key.startswith(prefix)
        }

    def _notes(self) -> list[tuple[str, str]]:
        """``(key, JSON text)`` of the current notes, oldest first."""
        self._check_live()
        notes = {key: text for key, _, text in self._rows.entries(self.agent_id, NOTE)}
        for key, value in self._staged(NOTE).items():
            if value is None:
                notes.pop(key, None)
            else:
                notes[key] = value
        return [(key, str(notes[key])) for key in sorted(notes)]

    def _stage(self, kind: Kind, key: str, text: str | None) -> None:
        assert self._turn is not None
        turn, change = self._turn, (kind, key)
        if change in turn.changes:
            before = turn.changes[change] is not None
        else:
            before = self._rows.value(self.agent_id, kind, key) is not None
        turn.delta[kind] = turn.delta.get(kind, 0) + (text is not None) - before
        turn.changes[change] = text
        turn.revision += 1

    def _check_live(self) -> None:
        if not self._live():
            msg = (
                f"this memory view of agent {self.agent_id!r} belongs to a turn that has "
                "ended; read agent.__memory__ again"
            )
            raise DurableError(msg)

    def _writable(self) -> None:
        self._check_live()
        if self._turn is None:
            msg = (
                f"cannot write the memory of agent {self.agent_id!r} here: no turn of it "
                "runs in this thread. Memory is written inside a turn (its template call "
                "or a tool it calls) and commits with that turn; outside one it is read-only"
            )
            raise DurableError(msg)


def key_error(key: str, limits: MemoryLimits) -> str | None:
    """Why ``key`` is not a valid memory key, or None."""
    if not isinstance(key, str):
        return f"the key must be text, not {type(key).__name__}"
    if not 1 <= len(key) <= limits.key_chars:
        return f"the key must be 1-{limits.key_chars} characters; got {len(key)}"
    if not key.isprintable():
        return f"the key {key!r} holds a newline, tab or other non-printable character"
    if key != key.strip():
        return f"the key {key!r} begins or ends with whitespace"
    return None


def _encode(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _reject_constant(name: str) -> Any:
    msg = f"{name} is not a JSON number"
    raise ValueError(msg)


def _decode(text: str) -> Any:
    return json.loads(text, parse_constant=_reject_constant)


class StateTools:
    """Give the model primitive tools to keep its own memory across turns.

    Mix it into a :class:`~effectful_durable.PersistentAgent`; under
    :class:`~effectful_durable.PersistenceHandler` the model gets the tools
    ``get_state``, ``put_state``, ``list_state_keys``, ``delete_state_key``,
    ``add_to_context`` and ``clear_old_context``. It decides what to store; each
    write is staged and commits with the turn, in its one transaction, and every
    version of the agent keeps its memory (rollback and fork carry it). Each
    model request's system message carries a short digest of the memory
    (:class:`MemoryDigest`). Bad input from the model (a value that is not JSON,
    an empty or long key, a value or memory over a :class:`MemoryLimits` limit, a
    missing key) is an error text the model reads; nothing is written for it.

    The developer reads the memory from ``agent.__memory__``
    (:class:`AgentMemory`) and writes it, inside a turn, with its ``put`` and
    ``delete``::

        @dataclasses.dataclass
        class Assistant(PersistentAgent, StateTools):
            \"""You remember what the user tells you about themselves.\"""

            __memory_limits__ = MemoryLimits(keys=200)
            __memory_digest__ = MemoryDigest(keys=10)

            @Template.define
            def ask(self, question: str) -> str:
                \"""Answer: {question}\"""
                raise NotHandled

    .. versionadded:: 0.2.0
    """

    #: Limits of this class's memory.
    __memory_limits__: ClassVar[MemoryLimits] = MemoryLimits()
    #: The digest in each request's system message; None leaves it out.
    __memory_digest__: ClassVar[MemoryDigest | None] = MemoryDigest()

    @property
    def __memory__(self) -> AgentMemory:
        """The agent's memory: committed values plus the running turn's staged writes."""
        memory: AgentMemory = agent_memory(self)
        return memory

    @Tool.define
    def get_state(self, key: str) -> str:
        """Read the value stored under `key` in your memory, as JSON text.

        Your memory keeps values across turns and conversations; the system
        message lists its keys.
        """
        memory: AgentMemory = agent_memory(self)
        error = key_error(key, memory.limits)
        if error is not None:
            return f"error: {error}."
        text = memory.json(key)
        if text is None:
            return f"error: your memory holds no key {key!r}; list_state_keys() lists the keys."
        return text

    @Tool.define
    def put_state(self, key: str, value: str) -> str:
        """Store `value` under `key` in your memory, replacing what the key held.

        `value` is JSON text: "\\"Alice\\"" for a string, 42, true, null, a list
        or an object. Keys are short names such as "user.name"; use prefixes to
        group them. The value is kept across turns once your turn completes.
        """
        memory: AgentMemory = agent_memory(self)
        limits = memory.limits
        error = key_error(key, limits)
        if error is not None:
            return f"error: {error}. Nothing was stored."
        if len(value) > 4 * limits.value_bytes + 64:  # surely too big: do not parse it
            return (
                f"error: the value is {len(value):,} characters; the limit is "
                f"{limits.value_bytes:,} bytes as JSON. Nothing was stored."
            )
        try:
            text = _encode(_decode(value))
        except (ValueError, RecursionError) as e:
            return (
                f"error: the value is not JSON text ({e}). Quote a string as JSON "
                '(for Alice, pass "\\"Alice\\""). Nothing was stored.'
            )
        existed = memory.json(key) is not None
        error = memory.stage_put(key, text)
        if error is not None:
            return f"error: {error}. Nothing was stored."
        verb = "replaced" if existed else "stored"
        size = len(text.encode())
        return f"{verb} {key!r} ({size:,} bytes); your memory holds {_many(len(memory), 'key')}."

    @Tool.define
    def list_state_keys(self, prefix: str = "") -> str:
        """List the keys in your memory that start with `prefix` (all keys for ""), with sizes."""
        memory: AgentMemory = agent_memory(self)
        if len(prefix) > memory.limits.key_chars:
            return f"error: the prefix must be at most {memory.limits.key_chars} characters."
        if not prefix.isprintable():  # no key holds one (nor can SQLite a lone surrogate)
            return f"error: the prefix {prefix!r} holds a non-printable character."
        shown = memory.limits.listed_keys
        entries = memory.entries(prefix, limit=shown + 1)
        where = f" starting with {prefix!r}" if prefix else ""
        if not entries:
            return f"your memory holds no keys{where}."
        lines = [f"{key} ({size:,} bytes)" for key, size, _ in entries[:shown]]
        if len(entries) > shown:
            lines.append("... and more: give a longer prefix to see the rest.")
        return f"keys{where}:\n" + "\n".join(lines)

    @Tool.define
    def delete_state_key(self, key: str) -> str:
        """Delete `key` and its value from your memory."""
        memory: AgentMemory = agent_memory(self)
        error = key_error(key, memory.limits)
        if error is not None:
            return f"error: {error}. Nothing was deleted."
        if key not in memory:
            return (
                f"error: your memory holds no key {key!r}; nothing was deleted. "
                "list_state_keys() lists the keys."
            )
        memory.delete(key)
        return f"deleted {key!r}; your memory holds {_many(len(memory), 'key')}."

    @Tool.define
    def add_to_context(self, item: str) -> str:
        """Add a note to your context, shown to you with its time on every later request.

        Notes stay until clear_old_context removes them.
        """
        memory: AgentMemory = agent_memory(self)
        note, error = memory.stage_note(item)
        if note is None:
            return f"error: {error}. Nothing was added."
        return (
            f"added a note at {note.at:%Y-%m-%d %H:%M:%S} UTC; your context holds "
            f"{_many(memory.count(NOTE), 'note')}."
        )

    @Tool.define
    def clear_old_context(self, older_than_seconds: float) -> str:
        """Remove the context notes added more than `older_than_seconds` seconds ago.

        0 removes them all.
        """
        memory: AgentMemory = agent_memory(self)
        if not math.isfinite(older_than_seconds) or older_than_seconds < 0:
            return (
                f"error: older_than_seconds must be a number >= 0, not {older_than_seconds!r}. "
                "Nothing was removed."
            )
        removed = memory.stage_clear(older_than_seconds)
        left = _many(memory.count(NOTE), "note")
        return f"removed {_many(removed, 'note')}; your context holds {left}."


def memory_digest(memory: AgentMemory, digest: MemoryDigest) -> str | None:
    """The digest of ``memory`` for the system message, or None when it is empty."""
    parts = []
    count = memory.count(KEY)
    if count:
        header = (
            f"Your memory (state tools) holds {_many(count, 'key')}; get_state(key) reads a "
            "value in full:"
        )
        lines = [header]
        used = len(header)
        shown = 0
        for key, size, text in memory.entries(limit=digest.keys, small=digest.value_chars):
            line = (
                f"- {key} = {text}"
                if text is not None
                else f"- {key}: {_kind(memory, key)}, {size:,} bytes"
            )
            if used + 1 + len(line) > digest.chars:
                break
            lines.append(line)
            used += 1 + len(line)
            shown += 1
        if shown < count:
            lines.append(
                f"- ... {_many(count - shown, 'more key')}; list_state_keys(prefix) lists them."
            )
        parts.append("\n".join(lines))
    notes = memory.notes
    if notes:
        header = "Your context notes (add_to_context), oldest first:"
        kept: list[str] = []  # newest first
        used = len(header)
        for note in reversed(notes):
            line = f"- [{note.at:%Y-%m-%d %H:%M} UTC] {' '.join(note.text.split())}"
            room = digest.note_chars - used - 1
            if len(line) > room:
                if not kept and room > 40:  # the newest note alone is too long: cut it
                    kept.append(line[: room - 1] + "…")
                break
            kept.append(line)
            used += 1 + len(line)
        lines = [header]
        if len(kept) < len(notes):
            hidden = len(notes) - len(kept)
            lines.append(
                f"- ({_many(hidden, 'older note')} not shown; clear_old_context removes them)"
            )
        parts.append("\n".join([*lines, *reversed(kept)]))
    return "\n\n".join(parts) if parts else None


def _kind(memory: AgentMemory, key: str) -> str:
    text = memory.json(key) or ""
    return {"{": "object", "[": "list", '"': "text"}.get(text[:1], "value")


def _many(number: int, noun: str) -> str:
    return f"{number:,} {noun}" + ("" if number == 1 else "s")
