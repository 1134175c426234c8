"""Damage found in a database file, as one DatabaseCorruptError, and a Store that stops writing.

SQLite reports a malformed file as ``apsw.CorruptError``, or ``apsw.NotADBError``
when a page it needs does not look like SQLite at all; a stored JSON text that
no longer parses, or a text that is no longer UTF-8, is damage too. The store
translates each of them where it is called (every public method of ``Store``,
and the read and write transactions that handlers open through it), so callers
get :class:`~effectful_durable.DatabaseCorruptError` naming the file and what to
do, never a raw driver error.

Once a Store has seen SQLite report damage it writes nothing more to the file:
SQLite may spread the damage when it writes into a malformed b-tree
(sqlite.org/howtocorrupt.html), and a file left as it was is the best start for
a restore or a recovery tool. Its later writes raise at once, and its
connections no longer checkpoint the WAL into the file when they close.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import threading
import types
from collections.abc import Callable, Iterator
from typing import Any

import apsw

from ....errors import DatabaseCorruptError, DurableError
from .migrations import schema_sql

#: What SQLite raises for a file whose pages are malformed.
CORRUPTION: tuple[type[Exception], ...] = (apsw.CorruptError, apsw.NotADBError)
#: What decoding a stored value raises when its bytes were damaged.
DAMAGED_VALUE: tuple[type[Exception], ...] = (json.JSONDecodeError, UnicodeDecodeError)
_DAMAGE: tuple[type[Exception], ...] = CORRUPTION + DAMAGED_VALUE
#: The first 16 bytes of every SQLite database file.
MAGIC = b"SQLite format 3\x00"
# Files made with schema 3 reserve 4 bytes at the end of each page, where their
# page checksums were; SQLite leaves reserved bytes alone.
_SCHEMA3_RESERVE = 4
# What our own queries raise on a file whose schema text was damaged (a column
# renamed by a flipped byte, say): translated only once the schema is seen to differ.
_WATCHED: tuple[type[Exception], ...] = (*_DAMAGE, apsw.SQLError)


def page_size_of(header: bytes) -> int:
    """The page size a database header names (its bytes 16-17), or 0 if it has none."""
    if len(header) < 18:
        return 0
    size = int.from_bytes(header[16:18])
    return 65536 if size == 1 else size


def read_header(path: str) -> tuple[bytes, int]:
    """The first 100 bytes of the file ``path`` (fewer if it is shorter) and its size.

    Read through SQLite's own VFS, never Python's ``open()``: closing any descriptor
    of a file drops every POSIX lock the process holds on it, so the process's
    SQLite connections would lose theirs, and another program could then take the
    file for unused and remove its WAL under them. SQLite keeps such a descriptor
    open until its locks are released.

    Raises:
        OSError: The file cannot be read.
    """
    try:
        file = apsw.VFSFile("", path, [apsw.SQLITE_OPEN_MAIN_DB | apsw.SQLITE_OPEN_READONLY, 0])
        try:
            size = os.path.getsize(path)  # SQLite's xFileSize says 0 for a file of 1 byte
            return (file.xRead(min(100, size), 0) if size else b""), size
        finally:
            file.xClose()
    except apsw.Error as e:
        msg = f"cannot read {path}: {e}"
        raise OSError(msg) from e


def header_problem(path: str, application_id: int) -> str | None:
    """What is wrong with the 100-byte header of our database file ``path``, or None.

    SQLite reads most header fields only when it needs them, so a damaged
    freelist pointer or page count would go unseen until a write trusts it and
    spreads the damage. The header is checked when the WAL is empty: then the
    file's first page is the one SQLite uses (otherwise a newer copy of it may be
    in the WAL, and SQLite is trusted). The fields must hold what SQLite writes
    for a database effectful-durable made (one whose header holds our
    ``application_id``): sqlite.org/fileformat2.html#the_database_header
    """
    wal = path + "-wal"
    try:
        if os.path.exists(wal) and os.path.getsize(wal):
            return None
        header, size = read_header(path)
        if os.path.exists(wal) and os.path.getsize(wal):
            return None  # a writer started meanwhile: its WAL may hold the first page
    except OSError:
        return None
    if size == 0 or header[68:72] != application_id.to_bytes(4):
        return None  # new, or not ours: opening says so
    return _header_problem(header, size)


def _header_problem(header: bytes, size: int) -> str | None:
    def field(start: int, length: int = 4) -> int:
        return int.from_bytes(header[start : start + length])

    if len(header) < 100:
        return None  # SQLite itself refuses a file cut inside its header
    page_size = page_size_of(header)
    if page_size < 512 or page_size & (page_size - 1):
        return None  # SQLite refuses it
    pages = field(28)
    problems = [
        (header[18] not in (1, 2) or header[19] not in (1, 2), "its file format bytes are wrong"),
        (
            header[20] not in (0, _SCHEMA3_RESERVE),
            f"it says each page reserves {header[20]} bytes",
        ),
        (header[21:24] != b"\x40\x20\x20", "its payload fractions are wrong"),
        (
            field(92) == field(24) and pages * page_size > size,
            f"its header counts {pages} pages of {page_size} bytes but the file holds "
            f"{size} bytes: it was cut off",
        ),
        (field(92) == field(24) and pages == 0, "its header counts 0 pages"),
        (field(32) > max(pages, size // page_size), "its freelist starts past its end"),
        (field(36) > max(pages, size // page_size), "its freelist counts more pages than it has"),
        ((field(32) == 0) != (field(36) == 0), "its freelist pointer and count disagree"),
        (field(44) not in (1, 2, 3, 4), "its schema format number is wrong"),
        (field(52) != 0 or field(64) != 0, "it says it uses auto-vacuum, which ours never do"),
        (field(56) != 1, "it says its text is not UTF-8, which ours always is"),
        (any(header[72:92]), "its reserved header bytes are not zero"),
    ]
    return next((f"its header is damaged: {why}" for bad, why in problems if bad), None)


def schema_damage(path: str) -> str | None:
    """How the tables of the database ``path`` differ from those of our schema, or None.

    Compares table and index names and each table's columns with a database made
    from ``schema.sql``; called only after a query of ours failed.
    """
    try:
        conn = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        try:
            found = _shape(conn)
        finally:
            conn.close()
    except apsw.Error as e:
        return f"its schema cannot be read: {e}"
    expected = _expected_shape()
    missing = sorted(set(expected) - set(found))
    if missing:
        return f"its schema is damaged: {missing[0]} is missing"
    changed = sorted(name for name in expected if expected[name] != found[name])
    if changed:
        return f"its schema is damaged: {changed[0]} differs from our schema"
    return None


@functools.cache
def _expected_shape() -> dict[str, tuple[str, ...]]:
    conn = apsw.Connection(":memory:")
    conn.execute(schema_sql())
    shape = _shape(conn)
    conn.close()
    return shape


def _shape(conn: apsw.Connection) -> dict[str, tuple[str, ...]]:
    """Each table and index, by ``type name``: its table's columns (an index: its table)."""
    shape: dict[str, tuple[str, ...]] = {}
    for kind, name, table in conn.execute(
        "SELECT type, name, tbl_name FROM sqlite_schema WHERE type IN ('table', 'index')"
    ).fetchall():
        if kind == "table":
            columns = conn.execute("SELECT name FROM pragma_table_info(?)", (name,)).fetchall()
            shape[f"table {name}"] = tuple(str(column) for (column,) in columns)
        else:
            shape[f"index {name}"] = (str(table),)
    return shape


def no_checkpoint_on_close(conn: apsw.Connection) -> None:
    """Make closing ``conn`` leave the WAL as it is rather than copy it into the file."""
    with contextlib.suppress(apsw.Error):
        conn.config(apsw.SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE, 1)


class DamageWatch:
    """What one Store found of damage in its file; once it found some, writes are refused.

    Args:
        path: The database file.
        connections: The Store's connections (the list it keeps, read when damage
            is found), which then stop checkpointing on close.
    """

    def __init__(self, path: str, connections: list[apsw.Connection]) -> None:
        self.path = path
        self.found: str | None = None
        self._connections = connections
        self._doing = threading.local()  # the public method running in this thread

    def check_writable(self, during: str) -> None:
        """Refuse a write once damage was found.

        Raises:
            DatabaseCorruptError: This Store found the file damaged earlier.
        """
        if self.found is not None:
            doing = getattr(self._doing, "name", None) or during
            raise DatabaseCorruptError(self.path, self.found, doing)

    def error(self, error: Exception, during: str) -> Exception:
        """The DatabaseCorruptError for ``error``, or ``error`` itself if it is not damage.

        Damage of the file's structure (not of one stored value) stops this Store
        writing to the file.
        """
        if isinstance(error, DAMAGED_VALUE):
            detail = f"a stored value no longer decodes: {error}"
            return DatabaseCorruptError(self.path, detail, during)
        if isinstance(error, apsw.SQLError):
            found = schema_damage(self.path)
            if found is None:
                return error
            self.found = f"{found} ({error})"
        else:
            self.found = f"SQLite reports: {error}"
        for conn in list(self._connections):
            no_checkpoint_on_close(conn)
        return DatabaseCorruptError(self.path, self.found, during)

    def translated(self, error: BaseException, during: str) -> BaseException:
        """What to raise for ``error`` met inside :meth:`watching` (``error`` if not damage)."""
        if not isinstance(error, _WATCHED):
            return error
        return self.error(error, getattr(self._doing, "name", None) or during)

    @contextlib.contextmanager
    def watching(self, during: str) -> Iterator[None]:
        """Translate damage reported inside the block (named after the method running)."""
        try:
            yield
        except _WATCHED as e:
            translated = self.translated(e, during)
            if translated is e:
                raise
            raise translated from e


def watched[T](
    watch_of: Callable[[Any], DamageWatch], *, name: str | None = None
) -> Callable[[type[T]], type[T]]:
    """A class decorator: every public method translates the damage it meets.

    ``watch_of(self)`` is the instance's :class:`DamageWatch`; ``name`` names the
    instance in the error (``Store.turns``: "found during Store.turns.commit()"),
    the class's name by default. Methods inherited from base classes are wrapped
    on the class itself; the bases stay as they are.
    """

    def decorate(cls: type[T]) -> type[T]:
        owner = name or cls.__name__
        for base in reversed(cls.__mro__[:-1]):
            for method, function in vars(base).items():
                if not method.startswith("_") and isinstance(function, types.FunctionType):
                    during = f"{owner}.{method}()"
                    setattr(cls, method, _translating(function, during, watch_of))
        return cls

    return decorate


def _translating(
    function: Callable[..., Any], during: str, watch_of: Callable[[Any], DamageWatch]
) -> Callable[..., Any]:
    @functools.wraps(function)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        doing = watch_of(self)._doing
        outer = getattr(doing, "name", None)
        doing.name = outer or during
        try:
            return function(self, *args, **kwargs)
        except _WATCHED as e:
            translated = watch_of(self).error(e, outer or during)
            if translated is e:
                raise
            raise translated from e
        except UnicodeEncodeError as e:  # SQLite stores text as UTF-8
            msg = (
                f"{during} was given text holding a lone surrogate "
                f"({e.object[e.start : e.end]!r}), which SQLite cannot store or look up; "
                "nothing was read or written"
            )
            raise DurableError(msg) from e
        except OverflowError as e:  # SQLite integers are 64-bit
            msg = f"{during} was given a number that does not fit in 64 bits ({e})"
            raise DurableError(msg) from e
        finally:
            doing.name = outer

    return method
