"""The loop of the tests' fork servers (runner_child.py, fleet_app.py).

Importing litellm costs seconds (a quarter of a minute on a busy machine), too long
to start a runner afresh after every kill. A fork server imports everything once,
prints ``loaded``, and then for each ``go`` line on stdin forks a child and prints
``child <pid>``. SIGCHLD is ignored so that killed children are reaped at once: a
zombie would look alive to a runner on this host, which frees the claims of dead
runners it sees.
"""

import os
import signal
import sys
from collections.abc import Callable

from child import say


def serve(child: Callable[[], int], *, own_group: bool = False) -> int:
    """Fork a child running ``child()`` (its exit code) per ``go`` line, until stdin ends.

    With ``own_group``, each child leads a process group of its own, so that the
    test can kill it with everything it started.
    """
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    say("loaded")
    for line in sys.stdin:
        if line.strip() != "go":
            continue
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            code = 1
            try:
                if own_group:
                    os.setpgid(0, 0)
                code = child()
            finally:
                os._exit(code)
        if own_group:
            try:
                os.setpgid(pid, pid)  # also here: the parent may kill the group at once
            except (PermissionError, ProcessLookupError):
                pass  # the child did it already, or died
        say("child", pid)
    return 0
