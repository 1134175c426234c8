"""AgentRunner: deliver agents' alarms as turns, in a long-running process."""

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
