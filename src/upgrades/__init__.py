"""Safe upgrades: what new agent code will do to every agent in flight, before it runs.

``check.py`` reads every agent's in-flight work (approvals, alarms, events,
fields, memory, histories) a page at a time and asks the new code whether it can
carry it (``agent_checks.py``), and replays each workflow's program in a dry run
(``dry_run.py``); ``report.py`` holds what it found, and ``user_code.py`` says
where the user's code raised. ``migrate.py`` commits state migrations; the
commands are the command line's (``cli/upgrades.py``). It sits above
``handlers/`` and ``agents/``: it imports them and the store, and nothing below
imports it but the leaves ``report.py`` and ``user_code.py``, which import only the
standard library: the page reads the report's types (``ui/pages/check.py``), and the
command line's loader says where the user's code raised.
"""

from .check import check_upgrade
from .migrate import MigratedAgent, migrate_states
from .report import Break, UpgradeReport, WorkflowRun

__all__ = [
    "Break",
    "MigratedAgent",
    "UpgradeReport",
    "WorkflowRun",
    "check_upgrade",
    "migrate_states",
]
