"""The runner's configuration: a TOML file (stdlib ``tomllib``), re-read on SIGHUP."""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Literal, NoReturn

from ..errors import DurableError
from ..store.engine.seam import is_postgres_url


class ConfigError(DurableError, ValueError):
    """A runner configuration file does not parse or holds a bad value.

    .. versionadded:: 0.2.0
    """


_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class AgentSettings:
    """What the configuration says about one agent (its ``[agents.<id>]`` table).

    Args:
        paused: Deliver none of its alarms until the configuration changes.
        max_attempts: Overrides the runner's ``max_attempts`` for this agent.
        extra: Every other key of the table, for the agent's ``on_config_update``.

    .. versionadded:: 0.2.0
    """

    paused: bool = False
    max_attempts: int | None = None
    extra: Mapping[str, Any] = _EMPTY


@dataclass(frozen=True)
class RunnerConfig:
    """How an :class:`~effectful_durable.AgentRunner` runs; every field has a default.

    In a TOML file, ``model`` is a top-level key, the runner's settings live in
    a ``[runner]`` table, each agent's in ``[agents.<agent id>]``, and feature
    flags in ``[features]``::

        model = "gpt-4o-mini"

        [runner]
        poll_interval = 0.5     # seconds; how soon other processes' alarms are noticed
        lease_seconds = 300     # only for claimers without heartbeats: see below
        max_attempts = 5        # failed deliveries before an alarm is dead
        backoff_base = 10       # first retry after 10 s, then 20 s, 40 s, ...
        backoff_max = 3600      # ... at most an hour apart
        missed = "coalesce"     # or "each": deliver every missed occurrence
        grace_seconds = 30      # SIGTERM lets the turns in progress finish this long
        concurrency = 1         # turns of different agents run at once (SIGHUP may change it)
        statement_timeout = 10  # PostgreSQL: longest wait for the server per call (0: none)
        wait_for_database = 60  # PostgreSQL: how long starting waits for the server
        # renewal_url = "postgresql://..."  # PostgreSQL behind PgBouncer: see below

        [agents.support-bot]
        paused = false
        max_attempts = 3

        [features]
        summaries = true

    Args:
        model: The model name the default handler stack gives ``LiteLLMProvider``.
        poll_interval: Longest sleep between two looks at the database, in
            seconds: an alarm or event another process made due starts within
            it. Each look is one indexed read of the pending alarms.
        lease_seconds: The lease of a claim, which matters only for a claimer
            that keeps no heartbeat. A runner's claims are held by its
            heartbeat instead: it writes one every 5 seconds (one write,
            however many turns are in flight), its claims are its own while its
            heartbeat is at most 15 seconds old, however long its turns, and a
            runner silent for longer (or whose process is gone from this host)
            is dead: within 2 seconds more, another runner takes its claims
            back (see :doc:`/production`, "Heartbeats"). So ``lease_seconds``
            bounds neither a turn nor the wait for a dead runner's claims.
        max_attempts: Deliveries tried before an alarm is dead.
        backoff_base: Delay before the first retry; it doubles with each attempt.
        backoff_max: Longest delay between retries.
        missed: ``"coalesce"`` delivers a recurring alarm's missed occurrences once;
            ``"each"`` delivers each of them.
        grace_seconds: How long a stop waits for the turns in progress.
        concurrency: How many turns, of different agents, run at once (see
            :doc:`/production`); ``AgentRunner(max_concurrency=...)`` and ``run
            --concurrency`` override it.
        statement_timeout: PostgreSQL only: the Store's ``statement_timeout``
            (the longest any call waits for the server; 0: no limit). Unset, the
            Store keeps its own (10 s unless it was opened with another). A
            reload applies it from the next call on.
        wait_for_database: PostgreSQL only: how long starting the runner waits
            for a server that does not answer yet (``run --wait-for-database``
            overrides it); unset, the Store's default (5 s).
        renewal_url: PostgreSQL only: the Store's ``renewal_url``, where the
            renewals of the runner's holds on agents connect (behind a pooler:
            the server, or a pooler database with a pool of its own; see
            :doc:`/production`, "Renewals"). Read when the runner starts.
        agents: Per-agent settings, by agent id.
        features: Feature flags, passed on to agents' ``on_config_update``.
        source: The file it was read from, if any.

    .. versionadded:: 0.2.0
    """

    model: str | None = None
    poll_interval: float = 0.5
    lease_seconds: float = 300.0
    max_attempts: int = 5
    backoff_base: float = 10.0
    backoff_max: float = 3600.0
    missed: Literal["coalesce", "each"] = "coalesce"
    grace_seconds: float = 30.0
    concurrency: int = 1
    statement_timeout: float | None = None
    wait_for_database: float | None = None
    renewal_url: str | None = None
    agents: Mapping[str, AgentSettings] = field(default_factory=dict)
    features: Mapping[str, Any] = field(default_factory=dict)
    source: str | None = None

    def __post_init__(self) -> None:
        for name in ("poll_interval", "lease_seconds", "backoff_base", "backoff_max"):
            value = getattr(self, name)
            if not _number(value) or value <= 0:
                _bad(f"{name} must be a number of seconds above 0, not {value!r}")
        for name in ("grace_seconds", "statement_timeout", "wait_for_database"):
            value = getattr(self, name)
            if (value is not None or name == "grace_seconds") and (
                not _number(value) or value < 0
            ):
                _bad(f"{name} must be a number of seconds >= 0, not {value!r}")
        if self.poll_interval > 1.0:
            _bad(f"poll_interval must be at most 1 second, not {self.poll_interval!r}")
        if not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            _bad(f"max_attempts must be an integer >= 1, not {self.max_attempts!r}")
        if self.missed not in ("coalesce", "each"):
            _bad(f"missed must be 'coalesce' or 'each', not {self.missed!r}")
        check_concurrency(self.concurrency, "concurrency")
        if self.model is not None and not isinstance(self.model, str):
            _bad(f"model must be a string, not {self.model!r}")
        if self.renewal_url is not None and not (
            isinstance(self.renewal_url, str) and is_postgres_url(self.renewal_url)
        ):
            _bad("renewal_url must be a postgresql:// URL")

    @property
    def store_timeout(self) -> float | None:
        """``statement_timeout`` as a Store takes it: None for no limit (0 here)."""
        return self.statement_timeout or None

    def agent(self, agent_id: str) -> AgentSettings:
        """The settings of ``agent_id`` (defaults when the file names it not)."""
        return self.agents.get(agent_id) or AgentSettings()

    def retry_delay(self, attempts: int) -> float:
        """Seconds before retrying a delivery that failed ``attempts`` times (>= 1)."""
        return float(min(self.backoff_max, self.backoff_base * 2 ** max(attempts - 1, 0)))

    @classmethod
    def from_toml(cls, path: str | os.PathLike[str]) -> RunnerConfig:
        """Read a configuration file.

        Raises:
            ConfigError: The file cannot be read, is not TOML, has an unknown key,
                or a value of the wrong type.
        """
        source = os.fspath(path)
        try:
            with open(source, "rb") as file:
                data = tomllib.load(file)
        except (OSError, tomllib.TOMLDecodeError) as e:
            msg = f"cannot read runner config {source}: {e}"
            raise ConfigError(msg) from e
        try:
            return cls.from_mapping(data, source=source)
        except ConfigError as e:
            msg = f"runner config {source}: {e}"
            raise ConfigError(msg) from e

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str | None = None) -> RunnerConfig:
        """Build a configuration from parsed TOML.

        Raises:
            ConfigError: An unknown key, or a value of the wrong type.
        """
        unknown = set(data) - {"model", "runner", "agents", "features"}
        if unknown:
            _bad(
                f"unknown top-level key(s) {sorted(unknown)}; expected model, [runner], "
                "[agents.<id>], [features]"
            )
        runner = _table(data, "runner")
        allowed = {
            "poll_interval",
            "lease_seconds",
            "max_attempts",
            "backoff_base",
            "backoff_max",
            "missed",
            "grace_seconds",
            "concurrency",
            "statement_timeout",
            "wait_for_database",
            "renewal_url",
        }
        unknown = set(runner) - allowed
        if unknown:
            _bad(f"unknown key(s) {sorted(unknown)} in [runner]; expected {sorted(allowed)}")
        agents = {}
        for agent_id, table in _table(data, "agents").items():
            if not isinstance(table, Mapping):
                _bad(f"[agents.{agent_id}] must be a table")
            paused = table.get("paused", False)
            attempts = table.get("max_attempts")
            if not isinstance(paused, bool):
                _bad(f"[agents.{agent_id}] paused must be true or false, not {paused!r}")
            if attempts is not None and (not isinstance(attempts, int) or attempts < 1):
                _bad(f"[agents.{agent_id}] max_attempts must be an integer >= 1")
            extra = {k: v for k, v in table.items() if k not in ("paused", "max_attempts")}
            agents[agent_id] = AgentSettings(paused, attempts, MappingProxyType(extra))
        try:
            return cls(
                model=data.get("model"),
                agents=MappingProxyType(agents),
                features=MappingProxyType(dict(_table(data, "features"))),
                source=source,
                **runner,
            )
        except TypeError as e:
            msg = str(e)
            raise ConfigError(msg) from e


def _table(data: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    table = data.get(name, {})
    if not isinstance(table, Mapping):
        _bad(f"{name} must be a table ([{name}])")
    checked: Mapping[str, Any] = table
    return checked


#: The most turns one runner may run at once.
MAX_CONCURRENCY = 1024


def check_concurrency(value: object, name: str) -> None:
    """Raise ConfigError unless ``value`` is a number of turns a runner may run at once."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CONCURRENCY:
        _bad(f"{name} must be an integer from 1 to {MAX_CONCURRENCY}, not {value!r}")


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _bad(reason: str) -> NoReturn:
    raise ConfigError(reason)
