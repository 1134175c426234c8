"""Opening a database: identify the file, apply our pragmas, create or migrate the schema.

Every pragma effectful-durable sets lives in this module.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Literal

import apsw
import apsw.bestpractice

from ....errors import DatabaseCorruptError, DurableError, NotOurDatabaseError, SchemaTooNewError
from ..seam import APPLICATION_ID
from . import row_checks
from .damage import (
    CORRUPTION,
    DAMAGED_VALUE,
    MAGIC,
    header_problem,
    no_checkpoint_on_close,
    page_size_of,
    read_header,
)
from .migrations import MIGRATIONS, SCHEMA_VERSION, schema_sql
from .translate import translate, translated

type Durability = Literal["normal", "full"]

# WAL + NORMAL survives process crashes but may lose the last commits on power
# loss; FULL syncs the WAL on every commit: sqlite.org/pragma.html#pragma_synchronous
_SYNCHRONOUS: dict[str, str] = {"normal": "NORMAL", "full": "FULL"}

# SQLite checkpoints the WAL back into the file at 1000 pages (~4 MiB) and then
# reuses it from the start, but never shrinks it: one large transaction (a
# VACUUM, a big prune) would leave a WAL that large for good. Truncate it back
# to this size after each checkpoint: sqlite.org/pragma.html#pragma_journal_size_limit
WAL_SIZE_LIMIT = 8 * 1024 * 1024

logger = logging.getLogger("effectful_durable.store")


def connect(
    path: str,
    *,
    durability: Durability = "normal",
    busy_timeout: float = 5.0,
    readonly: bool = False,
) -> apsw.Connection:
    """Open ``path`` as an effectful-durable database.

    A missing or empty file becomes a new database. An older schema is migrated
    forward (never when ``readonly``). A file that is not ours is left untouched.

    Args:
        path: Database file.
        durability: ``"normal"`` survives process crashes; ``"full"`` also power loss.
        busy_timeout: Seconds to wait for another writer's lock before failing.
        readonly: Open without write access, for inspection.

    Returns:
        A connection for the calling thread; write through :func:`write_transaction`.

    Raises:
        NotOurDatabaseError: The file is not SQLite, or is another program's database.
        DatabaseCorruptError: SQLite found the file damaged.
        SchemaTooNewError: A newer effectful-durable wrote the file.
        ValueError: ``durability`` or ``busy_timeout`` is not valid.
    """
    if durability not in _SYNCHRONOUS:
        msg = f"durability must be 'normal' or 'full', not {durability!r}"
        raise ValueError(msg)
    if busy_timeout < 0:
        msg = f"busy_timeout must be >= 0 seconds, not {busy_timeout!r}"
        raise ValueError(msg)
    conn = _open(path, readonly)
    try:
        apsw.bestpractice.connection_busy_timeout(conn, int(busy_timeout * 1000))
        apsw.bestpractice.connection_dqs(conn)
        problem = header_problem(path, APPLICATION_ID)
        if problem is not None:
            raise DatabaseCorruptError(path, problem)
        try:
            version = _identify(conn, path)
        except apsw.ReadOnlyError as e:
            # A process died mid-write and left a hot journal that only a writer
            # may roll back: sqlite.org/atomiccommit.html#hot_rollback_journals
            msg = (
                f"{path} holds an unfinished write from a process that died; open it "
                "read-write once (Store(path)) to roll that write back, then read it"
            )
            raise DurableError(msg) from e
        if not readonly and conn.readonly("main"):
            msg = (
                f"cannot write {path}: SQLite opened it read-only. Make the file and its "
                "directory writable, or open it with Store(path, readonly=True)."
            )
            raise DurableError(msg)
        if readonly:
            if version == 0:
                msg = f"{path} is empty: it holds no effectful-durable database yet"
                raise DurableError(msg)
            if version < SCHEMA_VERSION:
                msg = (
                    f"{path} uses schema {version}; open it once read-write to "
                    f"migrate it to schema {SCHEMA_VERSION}"
                )
                raise DurableError(msg)
            row_checks.install(conn, path)
            return conn
        conn.pragma("journal_mode", "wal")
        conn.pragma("journal_size_limit", WAL_SIZE_LIMIT)
        conn.pragma("synchronous", _SYNCHRONOUS[durability])
        # What a write deletes or moves is overwritten, not left in free space, so that
        # an erasure leaves none of it in the file: sqlite.org/pragma.html#pragma_secure_delete
        conn.pragma("secure_delete", True)
        apsw.bestpractice.connection_enable_foreign_keys(conn)
        if version < SCHEMA_VERSION:
            _migrate(conn, path)
        row_checks.install(conn, path)
    except (*CORRUPTION, *DAMAGED_VALUE) as e:
        no_checkpoint_on_close(conn)  # a refused file is left exactly as it was
        conn.close()
        if isinstance(e, DAMAGED_VALUE):  # its schema's text, say
            raise DatabaseCorruptError(path, f"a stored text no longer decodes: {e}") from e
        raise DatabaseCorruptError(path, f"SQLite reports: {e}") from e
    except BaseException as error:
        ours = translate(error, path, conn) if isinstance(error, apsw.Error) else None
        no_checkpoint_on_close(conn)
        conn.close()
        if ours is not None:
            raise ours from error
        raise
    return conn


@contextmanager
def write_transaction(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``, or ``ROLLBACK`` on any exception, Ctrl-C included.

    Not ``with conn:``: apsw (3.54) holds the GIL while the BEGIN of its context
    manager waits out the busy timeout, which freezes every other thread of the
    process, including the one holding the lock. A cursor's BEGIN releases it.
    """
    with translated(conn.filename, conn):
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise


@contextmanager
def read_transaction(conn: apsw.Connection) -> Iterator[apsw.Connection]:
    """``BEGIN DEFERRED`` ... ``COMMIT``: several SELECTs on one snapshot (or the open write's).

    An I/O error in the block rolls the transaction back in SQLite: then there is
    nothing to commit, and that error is what the caller sees. Errors of the block
    are the caller's to translate (it may use other files meanwhile).
    """
    if conn.in_transaction:  # inside a write: read what it sees
        yield conn
        return
    with translated(conn.filename, conn):
        conn.execute("BEGIN DEFERRED")
    try:
        yield conn
    finally:
        if conn.in_transaction:
            with translated(conn.filename, conn):
                conn.execute("COMMIT")


def _open(path: str, readonly: bool) -> apsw.Connection:
    if os.path.isdir(path):
        msg = f"cannot open database {path}: it is a directory. Pass the path of a file."
        raise DurableError(msg)
    flags = (
        apsw.SQLITE_OPEN_READONLY
        if readonly
        else apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    )
    try:
        with translated(path):  # opening reads the header
            conn = apsw.Connection(path, flags=flags)
    except apsw.CantOpenError as e:
        msg = f"cannot open database {path}: {e}. Pass the path of a file you may read."
        raise DurableError(msg) from e
    row_checks.register(conn)
    return conn


def _identify(conn: apsw.Connection, path: str) -> int:
    """Return the file's schema version (0 for a new file), or refuse a foreign file."""
    try:
        application_id = conn.pragma("application_id")
        user_version = conn.pragma("user_version")
        objects = conn.execute("SELECT count(*) FROM sqlite_schema").get
    except apsw.NotADBError as e:
        reason = "it is not an SQLite database, or its header is damaged"
        raise NotOurDatabaseError(path, reason) from e
    except apsw.SQLError as e:  # "unsupported file format": a header SQLite cannot read
        raise DatabaseCorruptError(path, f"SQLite cannot read it: {e}") from e
    if application_id != APPLICATION_ID:
        if application_id == 0 and user_version == 0 and objects == 0:
            _check_new(path)
            return 0
        reason = (
            f"application_id is {application_id:#x}"
            if application_id
            else "it is another program's SQLite database"
        )
        raise NotOurDatabaseError(path, reason)
    if user_version < 0:
        raise DatabaseCorruptError(path, f"its header is damaged: user_version is {user_version}")
    if user_version > SCHEMA_VERSION:
        raise SchemaTooNewError(path, found=user_version, supported=SCHEMA_VERSION)
    return int(user_version)


def _check_new(path: str) -> None:
    """Refuse to take a file that SQLite reads as empty unless it is new or a whole empty database.

    SQLite reads a file shorter than its first page as holding no pages at all, so
    a database cut off inside its first page would otherwise be taken for a new
    one and written over.
    """
    try:
        header, size = read_header(path)
    except OSError:
        return  # nothing there yet
    if size == 0:
        return
    if not header.startswith(MAGIC):
        raise NotOurDatabaseError(path, "it is not an SQLite database")
    if size < max(page_size_of(header), 512):
        detail = f"it ends after {size} bytes, inside its first page: the file was cut off"
        raise DatabaseCorruptError(path, detail)


def _migrate(conn: apsw.Connection, path: str) -> None:
    # Foreign keys off while migrating: a step that rebuilds a table others refer
    # to drops the old one, which would delete their rows with it; the step copies
    # every row first. The pragma takes effect outside transactions only:
    # sqlite.org/lang_altertable.html#otheralter
    conn.pragma("foreign_keys", False)
    try:
        _migrate_steps(conn, path)
    finally:
        conn.pragma("foreign_keys", True)


def _migrate_steps(conn: apsw.Connection, path: str) -> None:
    # Re-read inside each write transaction: another process may be migrating too.
    while True:
        with write_transaction(conn):
            version = _identify(conn, path)
            if version >= SCHEMA_VERSION:
                return
            try:
                if version == 0:
                    conn.execute(schema_sql())
                    version = SCHEMA_VERSION
                else:
                    conn.execute(MIGRATIONS[version])
                    version += 1
            except apsw.SQLError as e:  # the tables are not those of the schema it names
                detail = (
                    f"its tables do not fit schema {version}, which its header names "
                    f"(migrating them failed: {e})"
                )
                raise DatabaseCorruptError(path, detail) from e
            conn.pragma("application_id", APPLICATION_ID)
            conn.pragma("user_version", version)


def quarantine(path: str) -> str:
    """Rename the unreadable database ``path`` aside, with its -wal and -shm files.

    Nothing is deleted: the file becomes ``<path>.unreadable-<UTC time>`` (its
    ``-wal`` and ``-shm`` follow under that name), and a warning names it.

    Returns:
        The new name of the file.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    aside = f"{path}.unreadable-{stamp}"
    for suffix in ("", "-wal", "-shm"):
        if os.path.exists(path + suffix):
            if os.path.exists(aside + suffix):
                msg = f"cannot move {path}{suffix} aside: {aside}{suffix} exists"
                raise DurableError(msg)
            os.rename(path + suffix, aside + suffix)
    logger.warning(
        "%s is not a readable effectful-durable database; moved it to %s "
        "(nothing was deleted) and started a new database at %s",
        path,
        aside,
        path,
    )
    return aside
