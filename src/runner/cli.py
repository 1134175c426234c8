"""``effectful-durable run``: load the user's factories, set up logging, run the runner."""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import logging
import os
import sys
import sysconfig
import traceback
from typing import Any

from ..errors import DurableError
from .runner import AgentRunner

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


def load(spec: str, what: str) -> Any:
    """Import ``module:attribute`` (the current directory is on the path, as for uvicorn).

    Raises:
        DurableError: In one line, naming the module, its file and line: the
            module is missing, does not parse, or raised while it was imported,
            or has no such attribute.
    """
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        msg = f"{what} must be given as MODULE:FUNCTION, not {spec!r}"
        raise DurableError(msg)
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name + ".").startswith(e.name + "."):
            msg = f"cannot load {what} {spec!r}: {e}"
            raise DurableError(msg) from e
        msg = f"cannot load {what} {spec!r}: importing {module_name} failed: {failure(e)}"
        raise DurableError(msg) from e
    except (Exception, SystemExit) as e:  # a SyntaxError, or the module raised at import
        msg = f"cannot load {what} {spec!r}: importing {module_name} failed: {failure(e)}"
        raise DurableError(msg) from e
    try:
        return getattr(module, attribute)
    except AttributeError as e:
        msg = f"cannot load {what} {spec!r}: {e}"
        raise DurableError(msg) from e


def failure(error: BaseException) -> str:
    """``error`` in one line, with where the user's code raised it: ``KeyError: 'x' (at
    shop.py, line 12)``. That is the innermost frame outside the standard library,
    the installed packages and this package; else the innermost frame."""
    text = " ".join(str(error).split())
    if isinstance(error, SyntaxError) and error.filename:
        return f"{type(error).__name__}: {error.msg} (at {error.filename}, line {error.lineno})"
    frames = traceback.extract_tb(error.__traceback__)
    own = [frame for frame in frames if not _library(frame.filename)]
    frame = (own or frames)[-1] if frames else None
    where = f" (at {frame.filename}, line {frame.lineno})" if frame is not None else ""
    return f"{type(error).__name__}: {text}{where}" if text else f"{type(error).__name__}{where}"


# Where code that is not the user's lives: the standard library, installed packages, us.
_LIBRARIES = tuple(
    {
        os.path.realpath(path) + os.sep
        for path in (
            sysconfig.get_paths()["stdlib"],
            sysconfig.get_paths()["purelib"],
            sysconfig.get_paths()["platlib"],
            os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
        )
    }
)


def _library(filename: str) -> bool:
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return True
    return os.path.realpath(filename).startswith(_LIBRARIES)


def run_command(args: argparse.Namespace) -> int:
    """Run the runner the arguments describe; return the exit status."""
    stream = logging.StreamHandler(sys.stderr)
    stream.setFormatter(
        JsonFormatter()
        if args.log_format == "json"
        else KeyValueFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    root = logging.getLogger()
    root.addHandler(stream)
    root.setLevel(args.log_level.upper())
    try:
        agents = load(args.agents, "--agents")
        handlers = load(args.handlers, "--handlers") if args.handlers else None
        with AgentRunner(
            args.db,
            agents=agents,
            handlers=handlers,
            config=args.config,
            max_concurrency=getattr(args, "concurrency", None),
            wait_for_database=getattr(args, "wait_for_database", None),
        ) as runner:
            status = runner.run()
        # The process ends now: spare its last garbage collection the whole heap
        # (litellm's modules), seconds on a busy machine, between a stop and the
        # exit (``grace_seconds`` + 5 s at most). atexit handlers still run.
        gc.freeze()
        return status
    except DurableError as error:
        print(f"effectful-durable: error: {error}", file=sys.stderr)
        return 1
