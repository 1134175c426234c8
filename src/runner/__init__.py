"""AgentRunner: deliver agents' alarms as turns, in a long-running process.

It drives agents through PersistenceHandler and claims alarms through the
Store's alarm queue, so it imports ``handlers``, ``agents`` and ``store``;
only the command (``cli/running.py``, ``run``) and the package's public API import it.
"""

from .clock import Clock, FakeClock, SystemClock
from .config import AgentSettings, ConfigError, RunnerConfig
from .runner import AgentRunner

__all__ = [
    "AgentRunner",
    "AgentSettings",
    "Clock",
    "ConfigError",
    "FakeClock",
    "RunnerConfig",
    "SystemClock",
]
