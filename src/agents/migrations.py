"""State migrations: user functions that bring an agent's stored fields up to its class's version.

A class declares the version of its fields with ``__state_version__`` (1 when it
does not), and registers one function per step with :func:`migrates_state`. The
fields are stored with the version they were written at; loading fields of an
older version runs the steps in order, in memory, and the next commit stores the
result (or ``effectful-durable migrate-state`` commits it at once, as a version of
its own that a rollback undoes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import StateMigrationError

#: The key of the stored fields' JSON object that holds their state version (> 1 only).
STATE_VERSION_KEY = "__state_version__"

type Migration = Callable[[dict[str, Any]], dict[str, Any]]

_MIGRATIONS: dict[tuple[type, int], Migration] = {}


def migrates_state(
    agent_class: type, *, from_version: int
) -> Callable[
    [Callable[[dict[str, Any]], dict[str, Any]]], Callable[[dict[str, Any]], dict[str, Any]]
]:
    """Register a function that turns ``agent_class``'s stored fields of ``from_version``
    into those of ``from_version + 1``.

    The function takes the stored fields as a dict of JSON values (the field
    names as keys) and returns the new dict; it must not depend on anything but
    its argument, since ``effectful-durable check`` runs it too, to see that the
    result loads. Migrations see the agent's shared fields; those declared
    :func:`~effectful_durable.per_conversation` are stored apart, and not
    migrated. A subclass inherits its bases' migrations::

        @dataclasses.dataclass
        class Coder(PersistentAgent):
            __state_version__ = 2
            files: list[str] = dataclasses.field(default_factory=list)  # was "written"

        @migrates_state(Coder, from_version=1)
        def rename_written(fields: dict[str, Any]) -> dict[str, Any]:
            fields["files"] = fields.pop("written", [])
            return fields

    Raises:
        ValueError: ``from_version`` is not an int >= 1, or is taken already.

    .. versionadded:: 0.2.0
    """
    if isinstance(from_version, bool) or not isinstance(from_version, int) or from_version < 1:
        msg = f"from_version must be an int >= 1, not {from_version!r}"
        raise ValueError(msg)

    def register(migration: Migration) -> Migration:
        taken = _MIGRATIONS.get((agent_class, from_version))
        if taken is not None and taken is not migration:
            msg = (
                f"{agent_class.__qualname__} already has a migration from state version "
                f"{from_version}: {taken.__qualname__}"
            )
            raise ValueError(msg)
        _MIGRATIONS[agent_class, from_version] = migration
        return migration

    return register


def state_version(agent_class: type) -> int:
    """The version of ``agent_class``'s fields: its ``__state_version__``, else 1."""
    version = getattr(agent_class, STATE_VERSION_KEY, 1)
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        msg = f"{agent_class.__qualname__}.__state_version__ must be an int >= 1, not {version!r}"
        raise TypeError(msg)
    return version


def stored_version(stored: dict[str, Any]) -> int:
    """The state version the stored fields were written at (1 if they do not say)."""
    found = stored.get(STATE_VERSION_KEY, 1)
    return found if isinstance(found, int) and not isinstance(found, bool) else 1


def migrate(agent_class: type, stored: dict[str, Any]) -> dict[str, Any]:
    """The stored fields brought up to ``agent_class``'s state version, without the version key.

    Raises:
        StateMigrationError: They were written by a newer version of the class,
            a step has no migration, or a migration failed or returned no dict.
    """
    target = state_version(agent_class)
    found = stored_version(stored)
    fields = {name: value for name, value in stored.items() if name != STATE_VERSION_KEY}
    name = agent_class.__qualname__
    if found > target:
        reason = (
            f"they were written by newer code ({name}.__state_version__ = {found}); run "
            "that code, or roll the agent back to a version the old code wrote"
        )
        raise StateMigrationError(name, found, target, reason)
    for version in range(found, target):
        migration = _migration(agent_class, version)
        if migration is None:
            reason = (
                f"no migration is registered from version {version}; register one with "
                f"@migrates_state({name}, from_version={version})"
            )
            raise StateMigrationError(name, found, target, reason)
        try:
            fields = migration(dict(fields))
        except Exception as error:
            reason = (
                f"the migration {migration.__qualname__} raised {type(error).__name__}: {error}"
            )
            raise StateMigrationError(name, found, target, reason) from error
        if not isinstance(fields, dict):
            what = type(fields).__name__
            reason = f"the migration {migration.__qualname__} returned {what}, not a dict"
            raise StateMigrationError(name, found, target, reason)
    return fields


def _migration(agent_class: type, from_version: int) -> Migration | None:
    for klass in agent_class.__mro__:
        found = _MIGRATIONS.get((klass, from_version))
        if found is not None:
            return found
    return None
