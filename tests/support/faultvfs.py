"""A fault-injecting SQLite VFS for the tests: I/O errors, short writes, power loss.

:class:`FaultVFS` is a shim over the default VFS, written with apsw's VFS API
(``apsw.VFS``, ``apsw.VFSFile``). While it is installed it is the process's
default VFS, so every connection opened meanwhile goes through it: the Store's,
the per-agent SQL workspace files' and the tests' own. It counts the I/O calls
(read, write, sync, truncate) and fails a chosen one the way the unix VFS reports
a real failure::

    with FaultVFS() as vfs:
        with vfs.counting() as calls:
            operation()                      # calls["write"]: how many writes it made
        vfs.fail(WRITE_ENOSPC, nth=3)        # the 3rd write from now fails, and every
        operation()                          # later one, until clear(): a full disk
        vfs.clear()

In power-loss mode (``FaultVFS(power_loss=True)``) it also keeps, per file, what
was written since that file's last sync: :meth:`FaultVFS.cut` makes the disk
stop at the Nth write or sync from now (that call and every later I/O call
fail), and :meth:`FaultVFS.power_loss` then drops every unsynced write and the
``-shm`` files, as a reboot would, so the database can be reopened.

The model of power loss: a synced file keeps exactly what it held at its last
sync (``xSync``); writes and truncations since then are lost; files are never
torn below the granularity of a whole ``xWrite`` call, and deletions are durable.
SQLite asks for no more than that (sqlite.org/atomiccommit.html, "Hardware
Assumptions").
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno as errnos
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any, Literal, Self

import apsw

# EFFECTFUL_DURABLE_FAULT_SWEEP=full makes the sweeps try every call (scripts/faults.sh).
FULL = os.environ.get("EFFECTFUL_DURABLE_FAULT_SWEEP") == "full"


def sample(total: int, size: int) -> list[int]:
    """Call numbers 1..total to fail: all in a full sweep, else ``size`` spread evenly, ends in."""
    if FULL or total <= size:
        return list(range(1, total + 1))
    step = (total - 1) / (size - 1)
    return sorted({1 + round(i * step) for i in range(size)})


def report(**facts: Any) -> None:
    """Append one JSON line of facts to $EFFECTFUL_DURABLE_FAULT_REPORT (scripts/faults.sh)."""
    path = os.environ.get("EFFECTFUL_DURABLE_FAULT_REPORT")
    if path:
        with open(path, "a") as out:
            out.write(json.dumps(facts) + "\n")


type Kind = Literal["read", "write", "sync", "truncate"]
KINDS: tuple[Kind, ...] = ("read", "write", "sync", "truncate")


@dataclasses.dataclass(frozen=True)
class Fault:
    """How a failing I/O call fails.

    Args:
        kind: The call that fails.
        errno: The operating system's error (``errno.ENOSPC``, ``errno.EIO``).
        short: For a write: the first half of the bytes land, then it fails.
        sticky: Every later call of the kind fails too, until ``clear()`` (a disk
            that stays full); otherwise only the one call fails (a transient error).
        label: A name for test ids.
    """

    kind: Kind
    errno: int
    short: bool = False
    sticky: bool = False
    label: str = ""

    @property
    def code(self) -> int:
        """The SQLite result code the unix VFS returns for this failure."""
        if self.kind == "write":
            # unixWrite: ENOSPC, or any short write, is SQLITE_FULL (os_unix.c).
            return apsw.SQLITE_FULL if self.short or self.errno == errnos.ENOSPC else _IOERR_WRITE
        return {
            "read": _IOERR_READ,
            "sync": _IOERR_FSYNC,
            "truncate": _IOERR_TRUNCATE,
        }[self.kind]


_IOERR_READ = apsw.SQLITE_IOERR | (1 << 8)
_IOERR_WRITE = apsw.SQLITE_IOERR | (3 << 8)
_IOERR_FSYNC = apsw.SQLITE_IOERR | (4 << 8)
_IOERR_TRUNCATE = apsw.SQLITE_IOERR | (6 << 8)
_IOERR_DELETE = apsw.SQLITE_IOERR | (10 << 8)

WRITE_ENOSPC = Fault("write", errnos.ENOSPC, sticky=True, label="write-ENOSPC")
WRITE_EIO = Fault("write", errnos.EIO, label="write-EIO")
SHORT_WRITE = Fault("write", errnos.ENOSPC, short=True, sticky=True, label="short-write")
SYNC_EIO = Fault("sync", errnos.EIO, label="fsync-EIO")
SYNC_ENOSPC = Fault("sync", errnos.ENOSPC, sticky=True, label="fsync-ENOSPC")
READ_EIO = Fault("read", errnos.EIO, label="read-EIO")

# The faults the sweeps inject: a full disk (sticky) and a failing one (transient),
# on each kind of call.
FAULTS: tuple[Fault, ...] = (WRITE_ENOSPC, WRITE_EIO, SHORT_WRITE, SYNC_EIO, SYNC_ENOSPC, READ_EIO)


@dataclasses.dataclass
class _Armed:
    fault: Fault
    at: int  # fail when the kind's count reaches this
    fired: bool = False


@dataclasses.dataclass
class _Unsynced:
    """What a file held at its last sync, as an undo log of the writes since."""

    synced_size: int
    undo: list[tuple[int, bytes]] = dataclasses.field(default_factory=list)


class FaultVFS(apsw.VFS):
    """The default VFS while installed (``with FaultVFS() as vfs:``), counting and failing I/O.

    Args:
        power_loss: Keep what each file wrote since its last sync, for
            :meth:`power_loss`.
        name: The name to register under.
    """

    def __init__(self, *, power_loss: bool = False, name: str = "faults") -> None:
        self.base = apsw.vfs_names()[0]  # the default before us: "unix"
        self.name = name
        self.tracking = power_loss
        self.counts: Counter[str] = Counter()
        self.errors: list[tuple[Kind, str, Fault]] = []  # each injected failure
        self._armed: _Armed | None = None
        self._off_at: int | None = None  # the write+sync count at which power goes off
        self.off = False
        self._unsynced: dict[str, _Unsynced] = {}
        self._lock = threading.RLock()
        self._last = threading.local()
        super().__init__(name, self.base, makedefault=True)

    # -- use -----------------------------------------------------------------------

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.unregister()

    def xSleep(self, microseconds: int) -> int:
        # The default VFS would sleep holding the GIL (apsw calls it from Python),
        # so a thread waiting out the busy timeout would stall the one holding the lock.
        time.sleep(microseconds / 1_000_000)
        return microseconds

    @contextlib.contextmanager
    def counting(self) -> Iterator[Counter[str]]:
        """Count the I/O calls made inside the block, by kind, into the yielded Counter."""
        calls: Counter[str] = Counter()
        start = Counter(self.counts)
        try:
            yield calls
        finally:
            calls.update({kind: self.counts[kind] - start[kind] for kind in KINDS})

    def fail(self, fault: Fault, nth: int) -> None:
        """Make the ``nth`` call of ``fault.kind`` from now fail (and later ones, if sticky)."""
        if nth < 1:
            msg = f"nth counts from 1, not {nth}"
            raise ValueError(msg)
        with self._lock:
            self._armed = _Armed(fault, self.counts[fault.kind] + nth)

    @property
    def fired(self) -> bool:
        """Whether the armed fault has failed a call."""
        return self._armed is not None and self._armed.fired

    def clear(self) -> None:
        """Disarm the fault: every call succeeds again."""
        with self._lock:
            self._armed = None

    def cut(self, nth: int) -> None:
        """Stop the disk at the ``nth`` write or sync from now (power-loss mode).

        That call and every later read, write, sync, truncate or delete fails
        (EIO) and changes nothing; :meth:`power_loss` then restores the disk as a
        reboot would find it.
        """
        if not self.tracking:
            msg = "cut() needs FaultVFS(power_loss=True)"
            raise ValueError(msg)
        with self._lock:
            self._off_at = self.counts["write"] + self.counts["sync"] + nth

    def power_loss(self) -> None:
        """Drop every write since each file's last sync, and the -shm files; power back on.

        Every connection to a file written here is closed first, as a reboot ends
        the processes too: one left open would keep this process's copy of the
        WAL index alive, which a reboot loses.
        """
        for conn in apsw.connections():
            if conn.filename in self._unsynced:
                with contextlib.suppress(apsw.Error):
                    conn.close()  # SQLite closes it; apsw re-raises the failed checkpoint
        with self._lock:
            for path, unsynced in self._unsynced.items():
                if not os.path.exists(path):
                    continue  # deleted: deletions are durable here
                fd = os.open(path, os.O_RDWR)
                try:
                    for offset, old in reversed(unsynced.undo):
                        os.pwrite(fd, old, offset)
                    os.ftruncate(fd, unsynced.synced_size)
                finally:
                    os.close(fd)
                unsynced.undo.clear()
            for path in list(self._unsynced):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(path + "-shm")  # the wal-index lives in memory
            self._off_at = None
            self.off = False

    def durable(self) -> None:
        """Treat every file as synced as it is now (a baseline for power-loss tests)."""
        with self._lock:
            self._unsynced.clear()

    # -- the VFS -------------------------------------------------------------------

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> apsw.VFSFile:
        return _File(self, name, flags)

    def xDelete(self, filename: str, syncdir: bool) -> None:
        with self._lock:
            if self.off:
                raise apsw.exception_for(_IOERR_DELETE)
            self._unsynced.pop(filename, None)
        super().xDelete(filename, syncdir)

    def xGetLastError(self) -> tuple[int, str | None]:
        injected: int | None = getattr(self._last, "errno", None)
        if injected is not None:
            self._last.errno = None
            return injected, os.strerror(injected)
        return super().xGetLastError()

    # -- the files' hooks ----------------------------------------------------------

    def _call(self, kind: Kind, path: str) -> Fault | None:
        """Count one call; the fault it must fail with, if any."""
        with self._lock:
            self.counts[kind] += 1
            if self._off_at is not None and kind in ("write", "sync"):
                if self.counts["write"] + self.counts["sync"] >= self._off_at:
                    self.off = True
            if self.off:
                fault = Fault(kind, errnos.EIO, label="power off")
                self._last.errno = fault.errno
                return fault
            armed = self._armed
            if armed is None or armed.fault.kind != kind:
                return None
            if self.counts[kind] == armed.at or (armed.fired and armed.fault.sticky):
                armed.fired = True
                self.errors.append((kind, path, armed.fault))
                self._last.errno = armed.fault.errno
                return armed.fault
            return None

    def _unsynced_of(self, path: str) -> _Unsynced | None:
        if not self.tracking or not path:
            return None
        unsynced = self._unsynced.get(path)
        if unsynced is None:
            size = os.path.getsize(path) if os.path.exists(path) else 0
            unsynced = self._unsynced[path] = _Unsynced(size)
        return unsynced

    def _before_change(self, path: str, offset: int, length: int) -> None:
        """Keep what [offset, offset + length) holds now, to undo an unsynced change."""
        with self._lock:
            unsynced = self._unsynced_of(path)
            if unsynced is None or length <= 0:
                return
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                return
            try:
                old = os.pread(fd, length, offset)
            finally:
                os.close(fd)
            if old:
                unsynced.undo.append((offset, old))

    def _synced(self, path: str) -> None:
        with self._lock:
            unsynced = self._unsynced_of(path)
            if unsynced is not None:
                unsynced.undo.clear()
                unsynced.synced_size = os.path.getsize(path) if os.path.exists(path) else 0


class _PythonVFSFile(apsw.VFSFile):
    """A file of a VFS written in Python: a failed lock is "busy", as SQLite treats it."""

    def xLock(self, level: int) -> None:
        # A read-only connection closing a WAL database asks for an exclusive lock,
        # which the default VFS refuses with an I/O error that SQLite ignores; apsw
        # would raise it from close(). A BusyError it clears, as SQLite does.
        try:
            super().xLock(level)
        except apsw.BusyError:
            raise
        except apsw.Error:
            raise apsw.BusyError from None


class _File(_PythonVFSFile):
    def __init__(
        self, vfs: FaultVFS, name: str | apsw.URIFilename | None, flags: list[int]
    ) -> None:
        super().__init__(vfs.base, name, flags)
        self.vfs = vfs
        if isinstance(name, apsw.URIFilename):
            self.path = name.filename()
        else:
            self.path = name or ""
        with vfs._lock:
            vfs._unsynced_of(self.path)  # a file that exists now counts as synced

    def xRead(self, amount: int, offset: int) -> bytes:
        fault = self.vfs._call("read", self.path)
        if fault is not None:
            raise apsw.exception_for(fault.code)
        return super().xRead(amount, offset)

    def xWrite(self, data: Any, offset: int) -> None:
        fault = self.vfs._call("write", self.path)
        if fault is not None and not fault.short:
            raise apsw.exception_for(fault.code)
        if fault is not None:
            data = bytes(data)[: len(data) // 2]  # half of it lands, then the disk is full
        self.vfs._before_change(self.path, offset, len(data))
        super().xWrite(data, offset)
        if fault is not None:
            raise apsw.exception_for(fault.code)

    def xSync(self, flags: int) -> None:
        fault = self.vfs._call("sync", self.path)
        if fault is not None:
            raise apsw.exception_for(fault.code)
        super().xSync(flags)
        self.vfs._synced(self.path)

    def xTruncate(self, newsize: int) -> None:
        fault = self.vfs._call("truncate", self.path)
        if fault is not None:
            raise apsw.exception_for(fault.code)
        size = super().xFileSize()
        if newsize < size:
            self.vfs._before_change(self.path, newsize, size - newsize)
        super().xTruncate(newsize)
