"""Where the tests' folders are, and the one way their modules are found: by bare name.

The shared modules (``tests/support/``: ``from helpers import persisted``) and the
programs the tests start (``tests/programs/``: ``from alarms_app import Keeper``, and
``effectful-durable run --agents heartbeat_app:make_agent``) are imported by bare
name. :func:`install` puts both folders first on this process's ``sys.path`` and on
``PYTHONPATH``, so that every process it starts (a child program, a runner, a
``python -c`` script) finds the same modules. ``tests/conftest.py`` calls it for
every test run; a script outside pytest (``bench/``) puts this folder on ``sys.path``
and calls it too.
"""

import os
import sys
from pathlib import Path

#: The repository's root: ``examples/``, ``docs/``, ``bench/`` are under it.
ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
#: The tests' shared modules: helpers, throwaway servers, fault injectors.
SUPPORT = TESTS / "support"
#: The child programs the tests start, and the agents they run.
PROGRAMS = TESTS / "programs"
#: Databases of older schemas, and the scripts that made them.
FIXTURES = TESTS / "fixtures"


def install() -> None:
    """Make ``support/`` and ``programs/`` importable here and in every child (idempotent)."""
    folders = [str(SUPPORT), str(PROGRAMS)]
    sys.path[:] = folders + [p for p in sys.path if p not in folders]
    inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        folders + [p for p in inherited if p not in folders]
    )
