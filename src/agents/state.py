"""Which fields of an agent are persisted, and their JSON form (through pydantic)."""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import typing
from typing import Any

import pydantic
import pydantic_core

from ..errors import StateSerializationError

logger = logging.getLogger("effectful_durable.state")

_EPHEMERAL = "effectful_durable.ephemeral"
_IDENTITY_FIELDS = frozenset({"agent_id"})


def ephemeral(**field_options: Any) -> Any:
    """A dataclass field that lives in memory only and is never persisted.

    Takes the options of :func:`dataclasses.field` (``default``, ``default_factory``, …)::

        @dataclasses.dataclass
        class Bot(PersistentAgent):
            notes: list[str] = dataclasses.field(default_factory=list)  # persisted
            client: Any = ephemeral(default=None)                       # not persisted

    .. versionadded:: 0.1.0
    """
    metadata = {**field_options.pop("metadata", {}), _EPHEMERAL: True}
    return dataclasses.field(metadata=metadata, **field_options)


_FIELD_TYPES: dict[type, tuple[tuple[str, Any], ...]] = {}


def _field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    found = _FIELD_TYPES.get(cls)
    if found is None:
        found = _FIELD_TYPES[cls] = _find_field_types(cls)
    return found


def _find_field_types(cls: type) -> tuple[tuple[str, Any], ...]:
    if not dataclasses.is_dataclass(cls):
        return ()
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except (NameError, TypeError):  # unresolvable forward reference: use the raw annotation
        hints = {}
    return tuple(
        (field.name, hints.get(field.name, field.type))
        for field in dataclasses.fields(cls)
        if field.name not in _IDENTITY_FIELDS and not field.metadata.get(_EPHEMERAL)
    )


@functools.cache
def _adapter(annotation: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(annotation)


def dump_state(agent: Any) -> str:
    """Serialise the agent's persisted fields as one JSON object.

    Raises:
        StateSerializationError: A field's value cannot be stored as JSON of its
            annotated type; it names the agent, the field and the value's type.
    """
    values: dict[str, Any] = {}
    for name, annotation in _field_types(type(agent)):
        value = getattr(agent, name)
        try:
            values[name] = _adapter(annotation).dump_python(value, mode="json", warnings="error")
        except (pydantic.PydanticUserError, pydantic_core.PydanticSerializationError) as e:
            raise StateSerializationError(
                _owner(agent), name, type(value).__qualname__, _one_line(e)
            ) from e
    return json.dumps(values, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def restore_state(agent: Any, state: str, *, on_invalid: str = "raise") -> None:
    """Set the agent's persisted fields from JSON written by :func:`dump_state`.

    Fields missing from ``state`` keep their current value; stored fields the class
    no longer has are ignored. A stored value that no longer fits its field raises,
    or with ``on_invalid="default"`` is replaced by the field's default (its
    current value if it has none) and a warning is logged.

    Raises:
        StateSerializationError: A stored value no longer fits its field's type.
    """
    stored = json.loads(state)
    for name, annotation in _field_types(type(agent)):
        if name not in stored:
            continue
        try:
            value = _adapter(annotation).validate_python(stored[name])
        except pydantic.ValidationError as e:
            reason = f"the stored value no longer fits the field: {_one_line(e)}"
            error = StateSerializationError(
                _owner(agent), name, type(stored[name]).__name__, reason
            )
            if on_invalid != "default":
                raise error from e
            value = _default(agent, name)
            logger.warning(
                "%s.%s: %s; it takes its default %r instead. The stored value stays "
                "readable in the version history (Store.state(agent_id, version)).",
                _owner(agent),
                name,
                reason,
                value,
            )
        object.__setattr__(agent, name, value)


def _default(agent: Any, name: str) -> Any:
    """The field's declared default, else the value the agent holds now."""
    field = next(f for f in dataclasses.fields(agent) if f.name == name)
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    if field.default is not dataclasses.MISSING:
        return field.default
    return getattr(agent, name)


def _owner(agent: Any) -> str:
    return f"{type(agent).__qualname__}(agent_id={getattr(agent, 'agent_id', None)!r})"


def _one_line(error: Exception) -> str:
    """The error's text on one line, short enough for a message."""
    text = " ".join(line.strip() for line in str(error).splitlines() if line.strip())
    return text if len(text) <= 300 else text[:297] + "..."
