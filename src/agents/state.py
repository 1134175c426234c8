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

from ..errors import StateMigrationError, StateSerializationError
from ..store.rows import StorableJSON
from .migrations import STATE_VERSION_KEY, migrate, state_version

logger = logging.getLogger("effectful_durable.state")

_EPHEMERAL = "effectful_durable.ephemeral"
_PER_CONVERSATION = "effectful_durable.per_conversation"
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


def per_conversation(**field_options: Any) -> Any:
    """A persisted dataclass field with one value per conversation of the agent.

    Takes the options of :func:`dataclasses.field`; the default (or
    ``default_factory``) is the value in a conversation that has none yet. A turn
    commits the value of its own conversation; switching conversation puts that
    conversation's value in the field. Other fields are shared by all the
    agent's conversations::

        @dataclasses.dataclass
        class Support(PersistentAgent):
            known_issues: list[str] = dataclasses.field(default_factory=list)  # shared
            ticket: str | None = per_conversation(default=None)  # one per conversation

    .. versionadded:: 0.2.0
    """
    if "default" not in field_options and "default_factory" not in field_options:
        msg = (
            "per_conversation() needs a default or a default_factory: the value the "
            "field takes in a conversation that has none yet"
        )
        raise TypeError(msg)
    metadata = {**field_options.pop("metadata", {}), _PER_CONVERSATION: True}
    return dataclasses.field(metadata=metadata, **field_options)


type _Fields = tuple[tuple[str, Any], ...]
_FIELD_TYPES: dict[type, tuple[_Fields, _Fields]] = {}


def _field_types(cls: type, *, per_conversation: bool = False) -> _Fields:
    """The persisted fields of ``cls`` and their annotations: shared or per conversation."""
    found = _FIELD_TYPES.get(cls)
    if found is None:
        found = _FIELD_TYPES[cls] = _find_field_types(cls)
    return found[per_conversation]


def _find_field_types(cls: type) -> tuple[_Fields, _Fields]:
    if not dataclasses.is_dataclass(cls):
        return (), ()
    try:
        hints = typing.get_type_hints(cls, include_extras=True)
    except (NameError, TypeError):  # unresolvable forward reference: use the raw annotation
        hints = {}
    persisted = [
        field
        for field in dataclasses.fields(cls)
        if field.name not in _IDENTITY_FIELDS and not field.metadata.get(_EPHEMERAL)
    ]
    shared: list[tuple[str, Any]] = []
    own: list[tuple[str, Any]] = []
    for field in persisted:
        kind = own if field.metadata.get(_PER_CONVERSATION) else shared
        kind.append((field.name, hints.get(field.name, field.type)))
    return tuple(shared), tuple(own)


@functools.cache
def _adapter(annotation: Any) -> pydantic.TypeAdapter[Any]:
    return pydantic.TypeAdapter(annotation)


type _Serializers = tuple[tuple[str, Any, pydantic_core.SchemaSerializer | None], ...]
_SERIALIZERS: dict[tuple[type, bool], _Serializers] = {}


def _serializers(cls: type, per_conversation: bool) -> _Serializers:
    """The persisted fields of ``cls``, their annotations and pydantic serializers.

    Looked up once per class. None for an annotation pydantic refuses: dumping
    that field asks pydantic again, to raise its error.
    """
    found = _SERIALIZERS.get((cls, per_conversation))
    if found is None:
        fields = []
        for name, annotation in _field_types(cls, per_conversation=per_conversation):
            try:
                serializer = _adapter(annotation).serializer
            except pydantic.PydanticUserError:
                serializer = None
            fields.append((name, annotation, serializer))
        found = _SERIALIZERS[cls, per_conversation] = tuple(fields)
    return found


_STATE_JSON = StorableJSON(sort_keys=True)


_CONVERSATION_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def conversation_fields(agent: Any) -> tuple[str, ...]:
    """The names of the agent's fields declared :func:`per_conversation`."""
    cls = type(agent)
    names = _CONVERSATION_FIELD_NAMES.get(cls)
    if names is None:
        fields = _field_types(cls, per_conversation=True)
        names = _CONVERSATION_FIELD_NAMES[cls] = tuple(name for name, _ in fields)
    return names


def dump_state(agent: Any, *, per_conversation: bool = False) -> str:
    """Serialise the agent's persisted fields as one JSON object.

    The shared fields, or with ``per_conversation`` the fields declared
    :func:`per_conversation` (their values in the current conversation).

    Raises:
        StateSerializationError: A field's value cannot be stored as JSON of its
            annotated type; it names the agent, the field and the value's type.
    """
    values: dict[str, Any] = {}
    for name, annotation, serializer in _serializers(type(agent), per_conversation):
        value = getattr(agent, name)
        try:
            if serializer is None:
                serializer = _adapter(annotation).serializer  # raises pydantic's error
            values[name] = serializer.to_python(value, mode="json", warnings="error")
        except (
            pydantic.PydanticUserError,
            pydantic_core.PydanticSerializationError,
            ValueError,  # bytes that are not UTF-8, among others
            TypeError,
            RecursionError,
        ) as e:
            raise StateSerializationError(
                _owner(agent), name, type(value).__qualname__, _one_line(e)
            ) from e
    if not per_conversation and (version := state_version(type(agent))) > 1:
        values[STATE_VERSION_KEY] = version
    return _STATE_JSON(values)


def restore_state(
    agent: Any, state: str, *, on_invalid: str = "raise", per_conversation: bool = False
) -> None:
    """Set the agent's persisted fields from JSON written by :func:`dump_state`.

    Fields missing from ``state`` keep their current value (with
    ``per_conversation``: take their default); stored fields the class no
    longer has are ignored. Fields stored at an older state version are first
    migrated (:func:`~effectful_durable.migrates_state`). A stored value that
    no longer fits its field raises, or with ``on_invalid="default"`` is
    replaced by the field's default (its current value if it has none) and a
    warning is logged.

    Raises:
        StateSerializationError: A stored value no longer fits its field's type.
        StateMigrationError: The stored fields cannot be migrated.
    """
    stored = json.loads(state)
    if not per_conversation:
        stored = _migrated(type(agent), stored)
    for name, annotation in _field_types(type(agent), per_conversation=per_conversation):
        if name not in stored:
            if per_conversation:
                object.__setattr__(agent, name, _default(agent, name))
            continue
        try:
            value = _adapter(annotation).validate_python(stored[name])
        except pydantic.ValidationError as e:
            reason = f"the stored value no longer fits the field: {_one_line(e)}"
            if on_invalid != "default":
                raise _unloadable(agent, name, stored[name], e) from e
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


def _migrated(cls: type, stored: dict[str, Any]) -> dict[str, Any]:
    if STATE_VERSION_KEY not in stored and state_version(cls) == 1:
        return stored  # nothing to migrate: the common case costs one lookup
    return migrate(cls, stored)


@dataclasses.dataclass(frozen=True)
class FieldProblem:
    """A stored field that the class cannot take as it is: why, in words."""

    field: str
    kind: typing.Literal["no_longer_fits", "dropped", "migration"]
    detail: str


def state_problems(cls: type, state: str, *, per_conversation: bool = False) -> list[FieldProblem]:
    """What keeps the stored fields ``state`` (JSON) from loading into ``cls``, unchanged.

    A stored value that no longer fits its field's type; a stored field the class
    no longer has (the next commit drops its value); fields that cannot be
    migrated to the class's state version. Nothing is set on any agent.
    """
    stored = json.loads(state)
    if not per_conversation:
        try:
            stored = _migrated(cls, stored)
        except StateMigrationError as error:
            return [FieldProblem(STATE_VERSION_KEY, "migration", str(error))]
    fields = dict(_field_types(cls, per_conversation=per_conversation))
    problems = []
    for name, value in stored.items():
        if name not in fields:
            shown = _one_line_value(value)
            problems.append(
                FieldProblem(
                    name,
                    "dropped",
                    f"{cls.__qualname__} has no field {name!r} any more: its stored value "
                    f"{shown} is dropped by the next commit",
                )
            )
            continue
        try:
            _adapter(fields[name]).validate_python(value)
        except pydantic.ValidationError as error:
            problems.append(
                FieldProblem(
                    name,
                    "no_longer_fits",
                    f"the stored value {_one_line_value(value)} no longer fits "
                    f"{cls.__qualname__}.{name} ({_first_error(error)})",
                )
            )
    return problems


def _first_error(error: pydantic.ValidationError) -> str:
    """The first of pydantic's errors, short: where, and what it says."""
    first = error.errors(include_url=False)[0]
    where = "".join(f"[{part!r}]" for part in first["loc"])
    more = f"; {error.error_count() - 1} more" if error.error_count() > 1 else ""
    return f"{where or 'the value'}: {first['msg']}{more}"


def _one_line_value(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _unloadable(
    agent: Any, name: str, value: Any, error: pydantic.ValidationError
) -> StateSerializationError:
    """The error for a stored value that no longer fits its field.

    Its message is a load's, not the write path's ("cannot be stored as JSON",
    "Annotate the field"): the first sentence says what failed, the rest what the
    developer can do. It says nothing of writes: loading writes nothing, and the
    turn that loads (PersistenceHandler) adds a note on what it wrote.
    """
    owner = _owner(agent)
    loaded = StateSerializationError(owner, name, type(value).__name__, "")
    loaded.args = (
        f"cannot load {owner}.{name}: its stored value, of type {type(value).__name__}, "
        f"no longer fits the field's type ({_one_line(error)}). Change the field's "
        'type back, or pass on_invalid_state="default" to PersistenceHandler to give '
        "the field its default (the stored value stays in the version history).",
    )
    return loaded


def reset_conversation_state(agent: Any) -> None:
    """Give the agent's :func:`per_conversation` fields their defaults."""
    restore_state(agent, "{}", per_conversation=True)


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
