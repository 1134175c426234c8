"""Driver errors become our errors at the store's boundary: one table, one context manager.

``with translated(path, conn):`` around the store's reads and writes turns the
apsw exceptions listed in :data:`TRANSLATIONS` into
:class:`~effectful_durable.DurableError` subclasses, chained to the original.
Everything else passes through unchanged (busy, constraint and SQL errors are
handled where they happen). To translate one more driver error, add a row.
"""

from __future__ import annotations

import errno as errnos
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import apsw

from ....errors import DiskFullError, DurableError, StorageError

type Translation = Callable[[apsw.Error, str, apsw.Connection | None], DurableError]

# What failed, by SQLite's extended result code (sqlite.org/rescode.html#ioerr_read ...).
_OPERATIONS: dict[str, str] = {
    "SQLITE_IOERR_READ": "read",
    "SQLITE_IOERR_SHORT_READ": "read",
    "SQLITE_IOERR_WRITE": "write",
    "SQLITE_IOERR_FSYNC": "sync",
    "SQLITE_IOERR_DIR_FSYNC": "sync the directory of",
    "SQLITE_IOERR_TRUNCATE": "truncate",
    "SQLITE_IOERR_FSTAT": "stat",
    "SQLITE_IOERR_DELETE": "delete a journal of",
    "SQLITE_IOERR_SHMOPEN": "open the shared-memory file of",
    "SQLITE_IOERR_SHMSIZE": "grow the shared-memory file of",
    "SQLITE_IOERR_SHMMAP": "map the shared-memory file of",
    "SQLITE_IOERR_MMAP": "memory-map",
    "SQLITE_IOERR_SEEK": "seek in",
    "SQLITE_IOERR_ACCESS": "check access to",
}


def _code(error: apsw.Error) -> str:
    """SQLite's name for the error's extended result code: ``"SQLITE_IOERR_FSYNC"``."""
    for table, attribute in (
        (apsw.mapping_extended_result_codes, "extendedresult"),
        (apsw.mapping_result_codes, "result"),
    ):
        code = getattr(error, attribute, None)
        if isinstance(code, int) and code in table:
            return str(table[code])
    return "SQLITE_IOERR" if isinstance(error, apsw.IOError) else "SQLITE_ERROR"


def _system_errno(conn: apsw.Connection | None) -> int | None:
    """The errno SQLite recorded for the connection's last I/O error, if any."""
    if conn is None:
        return None
    try:
        return int(conn.system_errno) or None
    except apsw.Error:  # closed
        return None


def _disk_full(error: apsw.Error, path: str, conn: apsw.Connection | None) -> DurableError:
    # SQLite records no errno for SQLITE_FULL: unixWrite reports ENOSPC as FULL.
    return DiskFullError(path, operation="write", errno=errnos.ENOSPC, code=_code(error))


def _io_error(error: apsw.Error, path: str, conn: apsw.Connection | None) -> DurableError:
    code = _code(error)
    operation = _OPERATIONS.get(code, "read or write")
    number = _system_errno(conn)
    if number == errnos.ENOSPC:  # an fsync or a file extension that found no space
        return DiskFullError(path, operation=operation, errno=number, code=code)
    return StorageError(path, operation=operation, errno=number, code=code)


# Checked in order; the first row whose class matches builds the error.
TRANSLATIONS: tuple[tuple[type[apsw.Error], Translation], ...] = (
    (apsw.FullError, _disk_full),
    (apsw.IOError, _io_error),
)


def translate(error: apsw.Error, path: str, conn: apsw.Connection | None) -> DurableError | None:
    """Our error for ``error`` met on ``path`` (through ``conn``), or None to let it pass."""
    for kind, build in TRANSLATIONS:
        if isinstance(error, kind):
            return build(error, path, conn)
    return None


@contextmanager
def translated(path: str, conn: apsw.Connection | None = None) -> Iterator[None]:
    """Raise our error, chained, for a driver error of :data:`TRANSLATIONS` in the block.

    Args:
        path: The database file, named in the message.
        conn: The connection the block uses, for the operating system's errno.
    """
    try:
        yield
    except apsw.Error as error:
        ours = translate(error, path, conn)
        if ours is None:
            raise
        raise ours from error
