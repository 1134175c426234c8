"""Page checksums: a CRC-32 at the end of every page of the database file, checked on each read.

SQLite keeps no checksum of its pages, so a flipped byte inside a stored value
that still reads as valid text would go unseen. Our databases reserve
:data:`RESERVE` bytes at the end of each page (the header's "reserved space",
which SQLite leaves alone) and open the file through :class:`ChecksumVFS`, a
shim over the default VFS that writes the CRC-32 of the rest of the page into
them whenever a page is written to the database file, and checks it whenever a
page is read from it. A page that fails is SQLite's ``SQLITE_CORRUPT``, which the
Store reports as :class:`~effectful_durable.DatabaseCorruptError`.

Only the database file carries checksums, not the WAL: SQLite's own frame
checksums cover the WAL (a frame that fails them is not replayed), and a page
reaches the database file only through a checkpoint or a direct write, both of
which come through :meth:`_File.xWrite`. The files stay ordinary SQLite files
that any SQLite reads, but a page another program writes into the database file
carries no valid checksum, and effectful-durable then refuses the file as
damaged. Files made before checksums (no reserved bytes) are read unchecked
until :meth:`~effectful_durable.Store.vacuum` rebuilds them with checksums.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import zlib
from collections.abc import Buffer

import apsw

RESERVE = 4
"""Bytes reserved at the end of every page for its checksum (header byte 20)."""

MAGIC = b"SQLite format 3\x00"
"""The first 16 bytes of every SQLite database file."""


def page_size_of(header: bytes) -> int:
    """The page size a database header names (its bytes 16-17), or 0 if it has none."""
    if len(header) < 18:
        return 0
    size = int.from_bytes(header[16:18])
    return 65536 if size == 1 else size


def checksummed_page_size(header: bytes) -> int:
    """The page size of a database whose header reserves room for checksums, else 0."""
    if len(header) < 100 or not header.startswith(MAGIC) or header[20] != RESERVE:
        return 0
    return page_size_of(header)


def checksum(page: bytes | memoryview) -> bytes:
    """The checksum stored in the last :data:`RESERVE` bytes of ``page``."""
    return zlib.crc32(page[:-RESERVE]).to_bytes(RESERVE)


def seal(path: str) -> None:
    """Write the checksum of every page of ``path``, a database file no connection has open.

    For a file SQLite wrote as a whole (``VACUUM INTO``): pages it wrote before the
    first one, which says the file reserves room for checksums, went out without.
    """
    with open(path, "r+b") as file:
        size = checksummed_page_size(file.read(100))
        if not size:
            return
        offset = 0
        while len(page := os.pread(file.fileno(), size, offset)) == size:
            if page[-RESERVE:] != (crc := checksum(page)):
                os.pwrite(file.fileno(), crc, offset + size - RESERVE)
            offset += size


class ChecksumVFS(apsw.VFS):
    """A shim over the VFS named ``base`` that checksums the pages of database files.

    A file is checked only when its header reserves :data:`RESERVE` bytes per
    page (a file of ours made with checksums); any other passes through unchanged.
    """

    def __init__(self, name: str, base: str) -> None:
        self.vfs_name = name
        self.base = base
        super().__init__(name, base)

    def xSleep(self, microseconds: int) -> int:
        # The default VFS would sleep holding the GIL (apsw calls it from Python),
        # so a thread waiting out the busy timeout would stall the one holding the lock.
        time.sleep(microseconds / 1_000_000)
        return microseconds

    def xOpen(self, name: str | apsw.URIFilename | None, flags: list[int]) -> apsw.VFSFile:
        if flags[0] & apsw.SQLITE_OPEN_MAIN_DB:
            return _File(self.base, name, flags)
        return apsw.VFSFile(self.base, name, flags)


class PythonVFSFile(apsw.VFSFile):
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


class _File(PythonVFSFile):
    def __init__(self, base: str, name: str | apsw.URIFilename | None, flags: list[int]) -> None:
        super().__init__(base, name, flags)
        self.page_size = 0  # until a header with our reserve is read or written: no checks

    def _set_format(self, header: bytes) -> None:
        if header.startswith(MAGIC):  # else not yet written: keep what is known
            self.page_size = checksummed_page_size(header)

    def xFileControl(self, op: int, ptr: int) -> bool:
        # A checkpoint writes pages that other connections committed, perhaps after
        # a VACUUM gave the file checksums: read the format as the file has it now.
        # (The header's own page, when in the checkpoint, is written first.)
        if op == apsw.SQLITE_FCNTL_CKPT_START:
            with contextlib.suppress(apsw.Error):  # then the checkpoint's writes fail too
                self._set_format(super().xRead(100, 0))
        return bool(super().xFileControl(op, ptr))

    def xRead(self, amount: int, offset: int) -> bytes:
        data = super().xRead(amount, offset)
        if offset == 0:
            self._set_format(data)
        size = self.page_size
        if size and amount == size and len(data) == size:
            if data[-RESERVE:] != checksum(data):
                _failure.last = (
                    f"page {offset // size + 1} fails its checksum (the file was damaged, "
                    "or another program wrote that page)"
                )
                raise apsw.CorruptError(_failure.last)
        return data

    def xWrite(self, data: Buffer, offset: int) -> None:
        page = memoryview(data)
        if offset == 0:
            self._set_format(bytes(page[:100]))
        if self.page_size and len(page) == self.page_size:
            data = b"".join((page[:-RESERVE], checksum(page)))
        super().xWrite(data, offset)


_failure = threading.local()


def take_failure() -> str | None:
    """What the last checksum failure in this thread found, once; None if there was none."""
    last: str | None = getattr(_failure, "last", None)
    _failure.last = None
    return last


_PREFIX = "effectful-durable/"
_vfs_lock = threading.Lock()
_registered: dict[str, ChecksumVFS] = {}


def checksum_vfs() -> str:
    """The name of the checksum VFS over the process's default VFS, registered once per base.

    A test that installs its own default VFS (tests/faultvfs.py) gets a checksum
    VFS over it, which :func:`forget` removes before that VFS goes.
    """
    base = apsw.vfs_names()[0]
    with _vfs_lock:
        vfs = _registered.get(base)
        if vfs is None:
            vfs = _registered[base] = ChecksumVFS(_PREFIX + base, base)
        return vfs.vfs_name


def forget(base: str) -> None:
    """Unregister the checksum VFS over ``base``, before ``base`` itself is unregistered."""
    with _vfs_lock:
        vfs = _registered.pop(base, None)
    if vfs is not None:
        vfs.unregister()
