"""Running: ``run``, the long-running process that delivers alarms, events and resumed
turns as agent turns. It loads the user's factories (and, through them or the default
handlers, litellm), and logs, the libraries' records too, as ``--log-format`` says."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
from typing import Any

from .command import FACTORY, Family, as_said, flag, positive
from .loader import load

COMMANDS = Family("Running")

# Attributes of a LogRecord that every record has; the rest came from ``extra=``.
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class KeyValueFormatter(logging.Formatter):
    """``time level logger message key=value ...``: the record's ``extra`` fields appended."""

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        extra = {k: v for k, v in vars(record).items() if k not in _STANDARD}
        pairs = " ".join(f"{k}={json.dumps(v, default=str)}" for k, v in extra.items())
        return f"{line} {pairs}" if pairs else line


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message and the ``extra`` fields."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": self.formatTime(record),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _STANDARD})
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def seconds(text: str) -> float:
    """A flag's number of seconds >= 0."""
    try:
        number = float(text)
    except ValueError:
        number = -1.0
    if not 0 <= number < float("inf"):
        msg = f"expected a number of seconds >= 0, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return number


@COMMANDS.command(
    "run",
    "deliver alarms as agent turns until stopped",
    FACTORY,
    flag(
        "--handlers",
        metavar="MODULE:FUNC",
        help="builds the handler stack from the config (default: LiteLLMProvider, retries)",
    ),
    flag("--config", metavar="FILE", help="TOML config, re-read on SIGHUP"),
    flag(
        "--concurrency",
        type=positive,
        metavar="N",
        help="turns of different agents run at once (default: the config's, 1)",
    ),
    flag(
        "--wait-for-database",
        type=seconds,
        metavar="SECONDS",
        help="PostgreSQL: how long to wait at start for a server that does not answer yet "
        "(default: the config's wait_for_database, else 5)",
    ),
    flag("--log-format", choices=["text", "json"], default="text", help="log line format"),
    flag("--log-level", default="INFO", help="logging level (default: INFO)"),
    words=as_said,
    logs=True,
)
def run(args: argparse.Namespace) -> int:
    """Run the runner the arguments describe until it is stopped; its exit status."""
    from ..runner import AgentRunner
    from ..store import Keys, Store

    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(
        JsonFormatter()
        if args.log_format == "json"
        else KeyValueFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    level = root.level
    root.addHandler(stream)
    root.setLevel(args.log_level.upper())
    try:  # called as a function (cli.main), the caller's logging is given back
        agents = load(args.agents, "--agents")
        handlers = load(args.handlers, "--handlers") if args.handlers else None
        keys = Keys.from_environment()
        with AgentRunner(
            Store(args.db, keys=keys) if keys is not None else args.db,
            agents=agents,
            handlers=handlers,
            config=args.config,
            max_concurrency=args.concurrency,
            wait_for_database=args.wait_for_database,
        ) as runner:
            status = runner.run()
    finally:
        root.removeHandler(stream)
        root.setLevel(level)
    # The process ends now: spare its last garbage collection the whole heap
    # (litellm's modules), seconds on a busy machine, between a stop and the
    # exit (``grace_seconds`` + 5 s at most). atexit handlers still run.
    gc.freeze()
    return status
