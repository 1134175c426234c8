"""Per-agent exclusion across threads and processes.

A turn holds its agent's lock from start to commit. Within a process a table of
held agent ids decides; across processes a POSIX record lock on one byte of the
sidecar file ``<db>-lock`` (at an offset hashed from the agent id) does. The
kernel drops record locks when a process dies, so a crashed turn never leaves an
agent locked, and a lock that can be taken means nobody else is running that agent.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
import time

try:
    import fcntl
except ImportError:  # Windows: exclusion within this process only
    fcntl = None  # type: ignore[assignment]

_POLL_SECONDS = 0.005
_MAX_POLL_SECONDS = 0.05


class AgentBusy(Exception):
    """The agent is held; ``holder`` says by whom."""

    def __init__(self, holder: str) -> None:
        super().__init__(holder)
        self.holder = holder


class AgentLocks:
    """The agent locks of one database file, shared by every Store on it in this process."""

    _registry: dict[str, AgentLocks] = {}
    _registry_lock = threading.Lock()

    def __init__(self, lock_path: str) -> None:
        self._lock_path = lock_path
        self._fd: int | None = None
        self._held: dict[str, threading.Thread] = {}
        self._mutex = threading.Lock()

    @classmethod
    def for_database(cls, db_path: str) -> AgentLocks:
        """The process-wide lock table for ``db_path``."""
        lock_path = os.path.realpath(db_path) + "-lock"
        with cls._registry_lock:
            locks = cls._registry.get(lock_path)
            if locks is None:
                locks = cls._registry[lock_path] = cls(lock_path)
            return locks

    @classmethod
    def _forget_all(cls) -> None:
        # A forked child inherits neither the parent's record locks nor its turns.
        cls._registry = {}
        cls._registry_lock = threading.Lock()

    def acquire(self, agent_id: str, *, wait: float = 0.0) -> None:
        """Hold ``agent_id`` until :meth:`release`.

        Raises:
            AgentBusy: Another thread or process held it for longer than ``wait`` s.
        """
        deadline = time.monotonic() + wait
        pause = _POLL_SECONDS
        while True:
            with self._mutex:
                holder = self._held.get(agent_id)
                if holder is None and self._lock_os(agent_id):
                    self._held[agent_id] = threading.current_thread()
                    return
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                held_by = "another process" if holder is None else _describe(holder)
                raise AgentBusy(held_by)
            time.sleep(min(pause, remaining))
            pause = min(pause * 2, _MAX_POLL_SECONDS)

    def release(self, agent_id: str) -> None:
        """Let other threads and processes take ``agent_id``."""
        with self._mutex:
            del self._held[agent_id]
            if self._fd is not None and fcntl is not None:
                fcntl.lockf(self._fd, fcntl.LOCK_UN, 1, _offset(agent_id), os.SEEK_SET)

    def _lock_os(self, agent_id: str) -> bool:
        if fcntl is None:
            return True
        if self._fd is None:
            # Kept open for the life of the process: closing any descriptor of the
            # file would drop every record lock this process holds on it.
            self._fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.lockf(
                self._fd,
                fcntl.LOCK_EX | fcntl.LOCK_NB,
                1,
                _offset(agent_id),
                os.SEEK_SET,
            )
        except OSError:
            return False
        return True


@functools.lru_cache(maxsize=4096)
def _offset(agent_id: str) -> int:
    digest = hashlib.blake2b(agent_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest) >> 2  # below 2**62, a valid off_t everywhere


def _describe(thread: threading.Thread) -> str:
    return f"thread {thread.name!r} of this process"


os.register_at_fork(after_in_child=AgentLocks._forget_all)
