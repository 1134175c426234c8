"""The agents' tables on this machine: SQLite files caught up from the log in the main database.

Each agent's tables live in a SQLite file of its own, ``<blake2b(agent id)>.sqlite``
in the directory of a :class:`WorkspaceCache`; the agent's SQL runs on a
connection to that file only (see ``sandbox.py``). The file is a materialised
view of ``workspace_log`` (``log.py``): ``PRAGMA user_version`` in it
records the version it holds, and whoever opens it next (a turn, ``Store.sql``)
catches it up from the log, or rebuilds it when the cache cannot vouch for it:
ahead of the log, damaged, foreign, or one the log does not apply to.

Where the files are depends on the backend (the Store makes its cache):

- SQLite keeps them beside its one database file, in ``<db>-workspaces/``. Only
  processes of that machine use them, an agent's versions only grow, and a fork
  or a delete removes the file of its agent id: the version in the file is
  enough to know where it stands.
- PostgreSQL serves many machines, each with a cache of its own (in the user's
  cache directory, one subdirectory per database:
  ``PostgresDatabase.workspace_directory``). There the log may change
  without this machine seeing it: the agent deleted and made anew, or the
  database restored to an earlier point and committed on from there. So each
  file is *stamped*: ``<file>-stamps`` names, for the versions the file may
  hold, the commit time of that version (``versions.committed_at``), and the
  file is trusted only while the log holds the same commit at that version.
  A stamp is written before the commit of the file it vouches for, and a file
  that is not trusted is first emptied, in a commit of its own, then rebuilt:
  so no stamp ever vouches for content another commit made.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import secrets
import struct
import threading
import zlib
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import apsw

from ...errors import SQLWorkspaceError
from ..engine.sqlite.damage import CORRUPTION, header_problem
from ..sealing import PLAIN, Sealer
from .log import RESET, Step, Truth, apply, log, replayed, truth
from .sandbox import SQLLimits, harden

if TYPE_CHECKING:
    from ..engine.seam import Database

logger = logging.getLogger("effectful_durable.store")

WORKSPACE_APPLICATION_ID = 0x45465753  # "EFWS": PRAGMA application_id of workspace files
# Beside a stamped file: two records (version, commit time, CRC-32 of the two), the
# file's version before its last commit and after it. A record whose CRC fails (torn
# by a power cut, read half-written, or never written) vouches for nothing.
_STAMPS = "-stamps"
_RECORD = struct.Struct("<qdI")
_STAMPS_SIZE = 2 * _RECORD.size
#: The first part of the names of the tables kept in memory (``WorkspaceCache.in_memory``).
_MEMORY = "effectful-durable-workspace-"


class WorkspaceCache:
    """Where one database's SQL workspace files live on this machine, and how they are trusted.

    Args:
        directory: The directory of the files, made at the first write.
        stamped: Whether each file's version is vouched for by the commit time of
            that version (see the module's docstring): needed where machines share
            the log, each with a cache of its own. A stamped cache's directory is
            made private to the user (mode 0700).
    """

    def __init__(self, directory: str, *, stamped: bool, sealer: Sealer = PLAIN) -> None:
        self.directory = directory
        self.stamped = stamped
        self.sealer = sealer
        self._local = threading.local()
        self._kept: list[WorkspaceFiles] = []
        self._lock = threading.Lock()
        self._memory_stamps: dict[str, dict[int, float]] = {}

    @classmethod
    def beside(cls, db_path: str) -> WorkspaceCache:
        """The files of the SQLite database ``db_path``: ``<db>-workspaces/``, unstamped."""
        return cls(os.path.realpath(db_path) + "-workspaces", stamped=False)

    @classmethod
    def in_memory(cls, sealer: Sealer) -> WorkspaceCache:
        """The tables of a database whose content ``sealer`` seals: in this process's
        memory only, stamped (see the module's docstring)."""
        return cls(f"{_MEMORY}{secrets.token_hex(8)}", stamped=True, sealer=sealer)

    @property
    def kept_in_memory(self) -> bool:
        """Whether the tables are kept in memory, not in files."""
        return self.directory.startswith(_MEMORY)

    def path(self, agent_id: str) -> str:
        """The file that holds ``agent_id``'s tables (a ``memdb`` URI, in memory)."""
        digest = hashlib.blake2b(agent_id.encode(), digest_size=16).hexdigest()
        if self.kept_in_memory:
            return f"file:/{self.directory}-{digest}?vfs=memdb"
        return os.path.join(self.directory, f"{digest}.sqlite")

    def files(self) -> WorkspaceFiles:
        """This thread's open workspace files, kept between turns (closed with the cache)."""
        files: WorkspaceFiles | None = getattr(self._local, "files", None)
        if files is None:
            files = self._local.files = WorkspaceFiles(self)
            with self._lock:
                self._kept.append(files)
        return files

    def close(self) -> None:
        """Close the files every thread kept open."""
        with self._lock:
            for files in self._kept:
                files.close()
            self._kept.clear()

    def remove(self, agent_id: str) -> None:
        """Delete ``agent_id``'s file (with its WAL and stamps), if there is one."""
        if self.kept_in_memory:  # unstamped, it is rebuilt when next used
            with self._lock:
                self._memory_stamps.pop(self.path(agent_id), None)
            return
        remove_files(self.path(agent_id))

    def shred(self, agent_id: str) -> bool:
        """Overwrite ``agent_id``'s files with zeros, then delete them (an erasure);
        whether it had any here."""
        if self.kept_in_memory:
            self.remove(agent_id)
            return False
        return _shred(self.path(agent_id))

    def shred_all(self) -> int:
        """Overwrite every workspace file here with zeros, then delete it; how many.

        For a database encrypted in place: its tables are kept in memory from
        then on, and the files held them in plain text.
        """
        if self.kept_in_memory or not os.path.isdir(self.directory):
            return 0
        names = [n for n in os.listdir(self.directory) if n.endswith(".sqlite")]
        return sum(_shred(os.path.join(self.directory, name)) for name in names)

    def make_directory(self) -> None:
        """Make the directory of the files if it is missing.

        Raises:
            SQLWorkspaceError: It cannot be made (the message says what to do).
        """
        if self.kept_in_memory:
            return
        try:
            os.makedirs(self.directory, mode=0o700 if self.stamped else 0o777, exist_ok=True)
        except OSError as e:
            msg = (
                f"cannot make the directory for the SQL workspace files, {self.directory} "
                f"({e.strerror or e}). Pass workspace_dir= to Store (a writable directory on "
                "a local disk), or set XDG_CACHE_HOME."
            )
            raise SQLWorkspaceError(msg) from e

    # -- stamps ------------------------------------------------------------------

    def stamps(self, path: str) -> dict[int, float]:
        """The commit times the stamps of ``path`` name, by version (none when unstamped).

        Read them *before* the file's version they are to vouch for: a writer
        stamps a version before it commits it, so stamps read first never vouch
        for a later commit.
        """
        if not self.stamped:
            return {}
        if self.kept_in_memory:
            with self._lock:
                return dict(self._memory_stamps.get(path, {}))
        try:
            with open(path + _STAMPS, "rb") as file:
                data = file.read(_STAMPS_SIZE)
        except FileNotFoundError:
            return {}
        found: dict[int, float] = {}
        for offset in range(0, len(data) - _RECORD.size + 1, _RECORD.size):
            version, stamp, check = _RECORD.unpack_from(data, offset)
            if zlib.crc32(data[offset : offset + 16]) == check:  # torn or unwritten: not
                found[version] = stamp
        return found

    def trusts(self, stamps: Mapping[int, float], held: int, found: Truth) -> bool:
        """Whether a file at version ``held`` holds what the log says ``held`` holds.

        A file ahead of the log is never trusted; version 0 is empty, whatever the log.
        """
        if held > found.current:
            return False
        if not self.stamped or held == 0:
            return True
        return found.held_stamp is not None and stamps.get(held) == found.held_stamp

    def stamp(self, path: str, stamps: Mapping[int, float | None]) -> None:
        """Replace the stamps of ``path`` (in the file's write transaction, before its commit).

        One write of fixed-size records over the old ones, never a new file:
        replacing a file by a rename costs a flush on ext4 (milliseconds a turn).
        """
        if not self.stamped:
            return
        if self.kept_in_memory:
            with self._lock:
                kept = {v: t for v, t in stamps.items() if t is not None}
                self._memory_stamps[path] = kept
            return
        records = b"".join(
            _record(version, stamp)
            for version, stamp in sorted(stamps.items())
            if stamp is not None
        )
        fd = os.open(path + _STAMPS, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.pwrite(fd, records[-_STAMPS_SIZE:].ljust(_STAMPS_SIZE, b"\0"), 0)
        finally:
            os.close(fd)


def _shred(path: str) -> bool:
    """Overwrite the workspace file ``path`` (with its WAL and stamps) with zeros, then
    delete it; whether there was one."""
    found = False
    for suffix in ("", "-wal", "-shm", "-journal", _STAMPS):
        try:
            size = os.path.getsize(path + suffix)
        except FileNotFoundError:
            continue
        with open(path + suffix, "r+b") as file:
            file.write(b"\0" * size)
            file.flush()
            os.fsync(file.fileno())
        os.remove(path + suffix)
        found = True
    return found


def _in_memory(path: str) -> bool:
    return path.startswith(f"file:/{_MEMORY}")


def _record(version: int, stamp: float) -> bytes:
    body = struct.pack("<qd", version, stamp)
    return body + zlib.crc32(body).to_bytes(4, "little")


def remove_files(path: str) -> None:
    """Delete a workspace file with its WAL, shared memory, journal and stamps."""
    for suffix in ("", "-wal", "-shm", "-journal", _STAMPS):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path + suffix)


# -- opening a file ---------------------------------------------------------------


class _NotWorkspace(Exception):
    """The file is SQLite, but not an effectful-durable workspace file."""


_UNUSABLE: tuple[type[Exception], ...] = (*CORRUPTION, _NotWorkspace)


def open_workspace(
    cache: WorkspaceCache, path: str, limits: SQLLimits, *, busy_timeout: float = 5.0
) -> apsw.Connection:
    """Open (creating if missing) an agent's workspace file, hardened for agent SQL.

    A file SQLite finds damaged, or one in its place that is not a workspace
    file, is set aside (see :func:`set_aside`) and a new one started: whoever
    opened it catches it up from the log.

    Raises:
        SQLWorkspaceError: The cache's directory cannot be made.
    """
    cache.make_directory()
    try:
        return _open_workspace(path, limits, busy_timeout=busy_timeout)
    except _UNUSABLE as e:
        set_aside(path, str(e))
    return _open_workspace(path, limits, busy_timeout=busy_timeout)


def _open_workspace(path: str, limits: SQLLimits, *, busy_timeout: float) -> apsw.Connection:
    flags = apsw.SQLITE_OPEN_READWRITE | apsw.SQLITE_OPEN_CREATE
    if _in_memory(path):
        flags |= apsw.SQLITE_OPEN_URI
    else:
        problem = header_problem(path, WORKSPACE_APPLICATION_ID)
        if problem is not None:
            raise _NotWorkspace(problem)
    conn = apsw.Connection(path, flags=flags)
    try:
        conn.set_busy_timeout(int(busy_timeout * 1000))
        if conn.readonly("main"):
            msg = "SQLite opened it read-only (its header, or its permissions)"
            raise _NotWorkspace(msg)
        application_id = conn.pragma("application_id")
        try:
            empty = conn.execute("SELECT count(*) FROM sqlite_schema").get == 0  # page 1
        except apsw.SQLError as e:  # "unsupported file format": a damaged header
            raise _NotWorkspace(str(e)) from e
        if application_id != WORKSPACE_APPLICATION_ID:
            if application_id != 0 or not empty:
                msg = f"its application_id is {application_id:#x}"
                raise _NotWorkspace(msg)
            conn.pragma("application_id", WORKSPACE_APPLICATION_ID)
        conn.pragma("journal_mode", "wal")
        conn.pragma("synchronous", "NORMAL")  # the log in the main database is the truth
        page_size = int(conn.pragma("page_size"))
        conn.pragma("max_page_count", max(1, limits.max_workspace_bytes // page_size))
        harden(conn, limits)
    except BaseException:
        conn.close()
        raise
    return conn


def set_aside(path: str, reason: str) -> str:
    """Move a damaged workspace file (-wal, -shm, stamps too) to ``<path>.damaged-<UTC time>``.

    Nothing is deleted; a warning names the new name. The file is only a view of
    the log in the main database, so the next use rebuilds it from there.

    Returns:
        The new name.
    """
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    if _in_memory(path):  # nothing to keep: emptied and rebuilt where it is
        logger.warning("the SQL workspace %s in memory is damaged (%s); rebuilt it", path, reason)
        return path
    aside = f"{path}.damaged-{stamp}"
    for suffix in ("", "-wal", "-shm", _STAMPS):
        with contextlib.suppress(FileNotFoundError):
            os.rename(path + suffix, aside + suffix)
    logger.warning(
        "the SQL workspace file %s is damaged (%s); moved it to %s (nothing was deleted) "
        "and rebuilt it from the log in the main database",
        path,
        reason,
        aside,
    )
    return aside


def _sound(conn: apsw.Connection) -> bool:
    """Whether SQLite finds the file of ``conn`` whole (its ``quick_check``)."""
    try:
        return bool(conn.execute("PRAGMA quick_check").get == "ok")
    except apsw.Error:
        return False


class WorkspaceFiles:
    """One thread's open workspace connections, kept between turns (least recently used go).

    Opening a WAL file and closing it (which checkpoints and syncs it) would cost
    milliseconds per turn. A kept connection is used again only while its file is
    the same file (inode) and it holds no transaction.
    """

    def __init__(self, cache: WorkspaceCache, limit: int = 16) -> None:
        self.cache = cache
        self.limit = limit
        self._open: dict[str, tuple[apsw.Connection, tuple[int, int]]] = {}

    def open(self, path: str, limits: SQLLimits, *, busy_timeout: float) -> apsw.Connection:
        """A hardened connection to ``path``, kept or new."""
        kept = self._open.pop(path, None)
        if kept is not None:
            conn, identity = kept
            if _identity(path) == identity and not conn.in_transaction:
                harden(conn, limits)
                page_size = int(conn.pragma("page_size"))
                conn.pragma("max_page_count", max(1, limits.max_workspace_bytes // page_size))
                return conn
            conn.close()
        return open_workspace(self.cache, path, limits, busy_timeout=busy_timeout)

    def release(self, path: str, conn: apsw.Connection) -> None:
        """Keep ``conn`` for the next turn, or close it."""
        identity = _identity(path)
        if self.limit <= 0 or identity is None or conn.in_transaction:
            conn.close()
            return
        self._open[path] = (conn, identity)
        while len(self._open) > self.limit:
            oldest = next(iter(self._open))
            self._open.pop(oldest)[0].close()

    def close(self) -> None:
        """Close every kept connection."""
        while self._open:
            self._open.popitem()[1][0].close()


def _identity(path: str) -> tuple[int, int] | None:
    if _in_memory(path):
        return (0, 0)
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return None
    return (found.st_dev, found.st_ino)


# -- catching up with the log ---------------------------------------------------------


def caught_up(
    files: WorkspaceFiles,
    path: str,
    limits: SQLLimits,
    db: Database,
    agent_id: str,
    busy_timeout: float,
) -> tuple[apsw.Connection, Truth]:
    """The agent's workspace file, open and caught up; a damaged one is set aside and rebuilt.

    Returns:
        The connection, and the version it holds with that version's stamp
        (``Truth.current`` and ``Truth.stamp``).
    """
    conn = files.open(path, limits, busy_timeout=busy_timeout)
    try:
        return conn, catch_up(conn, files.cache, path, db, agent_id)
    except CORRUPTION as e:
        sound = _sound(conn)
        conn.close()
        if sound:
            raise  # the workspace is whole: the damage is elsewhere
        set_aside(path, str(e))
    except BaseException:
        conn.close()
        raise
    conn = files.open(path, limits, busy_timeout=busy_timeout)
    try:
        return conn, catch_up(conn, files.cache, path, db, agent_id)
    except BaseException:
        conn.close()
        raise


def catch_up(
    ws: apsw.Connection, cache: WorkspaceCache, path: str, db: Database, agent_id: str
) -> Truth:
    """Bring the workspace file ``path`` to the agent's committed version.

    A file the cache cannot vouch for (ahead of the log, stamped for another
    commit, or one the log does not apply to) is emptied and rebuilt from the
    whole log.

    Returns:
        What the file now holds: ``current`` is its version, ``stamp`` that
        version's commit time.
    """
    stamps = cache.stamps(path)  # before the version: see WorkspaceCache.stamps
    held = _held(ws)
    with db.reading() as conn:
        found = truth(conn, agent_id, held)
    if held == found.current and not ws.in_transaction and cache.trusts(stamps, held, found):
        return found  # up to date: no write lock needed
    ws.execute("BEGIN IMMEDIATE")
    try:
        found = _catch_up(ws, cache, path, db, agent_id)
        ws.execute("COMMIT")
    except BaseException:
        if ws.in_transaction:
            ws.execute("ROLLBACK")
        raise
    return found


def _catch_up(
    ws: apsw.Connection, cache: WorkspaceCache, path: str, db: Database, agent_id: str
) -> Truth:
    """:func:`catch_up` with the file's write lock held."""
    held, stamps = _held(ws), cache.stamps(path)
    with db.reading() as conn:
        found = truth(conn, agent_id, held)
        trusted = cache.trusts(stamps, held, found)
        steps = log(conn, agent_id, held, found.current, cache.sealer) if trusted else []
    if trusted and steps:
        try:
            ws.execute("SAVEPOINT catch_up")
            apply(ws, steps)
            ws.execute("RELEASE catch_up")
        except (apsw.IOError, apsw.FullError):
            raise  # the disk failed, not the log
        except apsw.Error:
            ws.execute("ROLLBACK TO catch_up")
            ws.execute("RELEASE catch_up")
            trusted = False
    if not trusted:
        _empty(ws, cache, path)
        held, stamps = 0, {}
        with db.reading() as conn:
            found = truth(conn, agent_id, held)
            steps = log(conn, agent_id, held, found.current, cache.sealer)
        apply(ws, steps)
    if held != found.current:
        cache.stamp(path, {held: stamps.get(held), found.current: found.stamp})
        ws.pragma("user_version", found.current)
    return found


def _empty(ws: apsw.Connection, cache: WorkspaceCache, path: str) -> None:
    """Drop every table and commit version 0, unstamped; then begin again.

    The commit of its own keeps a stamp of the rebuilt version from ever
    vouching for the content the file held before.
    """
    apply(ws, [(RESET, None)])
    cache.stamp(path, {})
    ws.pragma("user_version", 0)
    ws.execute("COMMIT")
    ws.execute("BEGIN IMMEDIATE")


def _held(ws: apsw.Connection) -> int:
    return int(ws.pragma("user_version"))


# -- reading another version, without writing --------------------------------------


def materialize(
    db: Database, cache: WorkspaceCache, agent_id: str, version: int, *, from_file: bool = True
) -> apsw.Connection:
    """An in-memory database holding the agent's tables at ``version``; never writes.

    It starts from a copy of the agent's workspace file when that helps (and
    the cache vouches for it), and from the log alone when ``from_file`` is
    False or the copy turns out damaged.
    """
    path = cache.path(agent_id)
    if from_file and header_problem(path, WORKSPACE_APPLICATION_ID) is None:
        try:
            return _materialize(db, cache, path, agent_id, version)
        except apsw.Error:
            pass  # the copy does not take the log: damaged (the log's damage raises below)
    return _materialize(db, cache, None, agent_id, version)


def _materialize(
    db: Database, cache: WorkspaceCache, path: str | None, agent_id: str, version: int
) -> apsw.Connection:
    stamps = cache.stamps(path) if path is not None else {}  # before the copy: see stamps()
    mem, held = _copied(path)
    with db.reading() as conn:
        found = truth(conn, agent_id, held or 0)
        if held is not None and not cache.trusts(stamps, held, found):
            held = None  # ahead of the log, or another commit's: start from nothing
        undo: list[Step] = []
        if held is not None and held > version:
            undo = log(conn, agent_id, version, held, cache.sealer)
            if any(ddl is not None for ddl, _ in undo):
                held, undo = None, []  # a schema change since: replay up to version instead
        steps = [] if undo else log(conn, agent_id, held or 0, version, cache.sealer)
    if held is None:
        mem.close()
        return replayed(steps)
    for _, changeset in reversed(undo):  # only row changes since: undo them, newest first
        if changeset:
            apsw.Changeset.apply(apsw.Changeset.invert(changeset), mem)
    apply(mem, steps)
    return mem


def _copied(path: str | None) -> tuple[apsw.Connection, int | None]:
    """An in-memory copy of the file at ``path`` and its version (None: no usable copy).

    No file is an empty database at version 0.
    """
    mem = apsw.Connection(":memory:")
    if path is None or not os.path.exists(path):
        return mem, 0
    try:
        source = apsw.Connection(path, flags=apsw.SQLITE_OPEN_READONLY)
        try:
            with mem.backup("main", source, "main") as backup:
                backup.step(-1)
        finally:
            source.close()
        mem.execute("SELECT count(*) FROM sqlite_schema")  # a copy SQLite can read
        held = int(mem.pragma("user_version"))
    except apsw.Error:
        return mem, None  # damaged
    if mem.pragma("application_id") != WORKSPACE_APPLICATION_ID or held < 0:
        return mem, None
    return mem, held
