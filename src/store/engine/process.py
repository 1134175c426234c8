"""Which process this is, as others judge it: a host, a pid, and the place the pid means something.

A pid names a process only within one PID namespace of one running kernel: two
containers on one host, pods with ``hostNetwork``, or two cloned machines may
each have a process 7 under the same host name, and neither is the other. The
*place* of a pid is the kernel's boot id and the device and inode of the PID
namespace (``/proc/sys/kernel/random/boot_id`` and ``/proc/self/ns/pid``, both
readable without privileges on Linux). Whether a holder of an agent or of a
claim is alive is asked of the kernel (``kill(pid, 0)``) only when its place is
this process's own: then a missing pid is a process that ended. Anywhere else,
or where the place cannot be known (not Linux), only the holder's renewals in
the database speak for it. It imports nothing of ours.
"""

from __future__ import annotations

import functools
import os


@functools.cache
def place() -> str | None:
    """Where this process's pid names it: ``"<boot id>/<device>:<inode>"`` of its kernel's
    boot and PID namespace, or None where that cannot be read (no ``/proc``)."""
    try:
        with open("/proc/sys/kernel/random/boot_id", encoding="ascii") as boot:
            boot_id = boot.read().strip()
        namespace = os.stat("/proc/self/ns/pid")
    except OSError:
        return None
    return f"{boot_id}/{namespace.st_dev}:{namespace.st_ino}"


def gone(their_place: str | None, pid: int) -> bool:
    """Whether process ``pid`` of ``their_place`` has surely ended.

    True only when ``their_place`` is this process's own and the kernel knows no
    process ``pid`` there; a pid used again by another process since counts as
    alive (its holder is then judged by its renewals alone).
    """
    mine = place()
    if mine is None or their_place != mine or pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # it exists, under another user
        return False
    return False


# A child may start in a PID namespace of its own (unshare(CLONE_NEWPID) applies to
# the children of the caller): it reads its place again.
os.register_at_fork(after_in_child=place.cache_clear)
