"""Picking a Store's engine for a path or a URL, with what the engines leave to the Store.

A ``postgresql://`` URL opens ``engine/postgres/`` (psycopg is imported only
then), anything else an SQLite file through ``engine/sqlite/``. Besides the
engine the Store gets its damage watch (SQLite's reports of damage become
DatabaseCorruptError) and this machine's cache of the agents' SQL workspace
files: beside the SQLite file, or a directory per PostgreSQL database, stamped
with the commit each file holds, as many machines share the log.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from ..errors import DurableError, KeyUnavailableError
from .engine.seam import Database, is_postgres_url
from .engine.sqlite.connection import Durability
from .engine.sqlite.damage import DamageWatch
from .engine.sqlite.database import SQLiteDatabase
from .keys import Keys, KeyStore
from .sealing import PLAIN, Sealer
from .workspace.cache import WorkspaceCache


@dataclass(frozen=True)
class Opened:
    """An open engine, its damage watch and its workspace cache."""

    engine: Database
    damage: DamageWatch
    workspaces: WorkspaceCache


def open_engine(
    path: str,
    *,
    durability: Durability,
    busy_timeout: float,
    readonly: bool,
    on_unreadable: Literal["refuse", "quarantine"],
    pool_size: int,
    workspace_dir: str | None,
    statement_timeout: float | None,
    wait_for_database: float | None,
    renewal_url: str | None,
) -> Opened:
    """Open the database at ``path`` (see :class:`~effectful_durable.Store` for the options).

    Raises:
        ValueError: An option is not for this kind of database.
    """
    if on_unreadable not in ("refuse", "quarantine") or (
        readonly and on_unreadable == "quarantine"
    ):
        msg = (
            "on_unreadable must be 'refuse' or, for a read-write Store, "
            f"'quarantine'; not {on_unreadable!r}"
        )
        raise ValueError(msg)
    if is_postgres_url(path):
        from .engine.postgres.database import PostgresDatabase  # psycopg only when asked for

        if on_unreadable != "refuse":
            msg = "on_unreadable='quarantine' is for SQLite files, not PostgreSQL databases"
            raise ValueError(msg)
        db = PostgresDatabase(
            path,
            busy_timeout=busy_timeout,
            readonly=readonly,
            pool_size=pool_size,
            workspace_dir=workspace_dir,
            statement_timeout=statement_timeout,
            wait_for_database=wait_for_database,
            renewal_url=renewal_url,
        )
        workspaces = WorkspaceCache(db.workspace_directory, stamped=True)
        return Opened(db, DamageWatch(db.location, []), workspaces)
    if renewal_url is not None:
        msg = "renewal_url is for PostgreSQL; an SQLite file's holds need no renewals"
        raise ValueError(msg)
    if workspace_dir is not None:
        msg = (
            "workspace_dir is for PostgreSQL; an SQLite database keeps its agents' "
            f"SQL tables beside it, in {path}-workspaces"
        )
        raise ValueError(msg)
    sqlite = SQLiteDatabase(
        path,
        durability=durability,
        busy_timeout=busy_timeout,
        readonly=readonly,
        on_unreadable=on_unreadable,
    )
    return Opened(sqlite, sqlite.damage, WorkspaceCache.beside(path))


def sealer_for(db: Database, keys: Keys | None, *, readonly: bool) -> Sealer:
    """The sealer of ``db`` opened with ``keys``: plain, or sealing with proven keys.

    A database without encryption opened with keys starts it: its check value is
    written, and new rows are sealed from then on (the rows already there stay
    plain until ``effectful-durable encrypt``). A database with encryption is
    refused without keys, or with keys that do not open its check value, before
    anything is written.

    Raises:
        KeyUnavailableError: As said; the message names the database and the key store.
    """
    found = _encryption_row(db, required=keys is not None and not readonly)
    if found is None and keys is None:
        return PLAIN
    if keys is None:
        Sealer(None, db.location).verify("")  # raises: encrypted, and no keys
        raise AssertionError
    store = keys.key_store(db.location, is_file=db.kind == "sqlite", create=found is None)
    try:
        return _proven(db, store, found, readonly=readonly)
    except BaseException:
        store.close()
        raise


def _proven(
    db: Database, store: KeyStore, found: tuple[Any, ...] | None, *, readonly: bool
) -> Sealer:
    """The sealer of ``db`` with the data keys of ``store``, once they open its check
    value (written first, if encryption starts now)."""
    if found is not None:
        sealer = Sealer(store, db.location, complete=bool(found[1]))
        sealer.verify(str(found[0]))
        return sealer
    sealer = Sealer(store, db.location)
    if readonly:
        return sealer
    check = sealer.check_value()
    with db.writing() as conn:
        empty = conn.execute("SELECT 1 FROM agents LIMIT 1").fetchone() is None
        conn.execute(
            "INSERT INTO encryption (id, check_value, complete, since) VALUES (1, ?, ?, ?)"
            " ON CONFLICT (id) DO NOTHING",
            (check, int(empty), time.time()),
        )
    found = _encryption_row(db, required=True)
    if found is None:
        msg = f"{db.location}: encryption did not start"
        raise KeyUnavailableError(msg)
    sealer.complete = bool(found[1])
    sealer.verify(str(found[0]))  # another process may have started it first
    return sealer


def _encryption_row(db: Database, *, required: bool) -> tuple[Any, ...] | None:
    try:
        with db.reading() as conn:
            row = conn.execute("SELECT check_value, complete FROM encryption").fetchone()
    except DurableError:
        raise
    except Exception:  # a read-only Store on a schema older than encryption's
        if required:
            raise
        return None
    return None if row is None else tuple(row)
