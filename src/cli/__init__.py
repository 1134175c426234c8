"""The ``effectful-durable`` command: inspect and repair a database from the shell.

One module per family of commands, each declaring its commands' flags beside the
functions that run them: ``reading`` (the reads), ``decisions`` (approve, deny,
send-event), ``repairs`` (rollback, fork, delete, ...), ``maintenance`` (prune, vacuum,
backup, copy), ``upgrades`` (check-upgrade, migrate-state, retarget), ``running``
(run) and ``page`` (ui). ``command`` holds what a command is, how it opens DB and the
one way to fail; ``output`` how it prints; ``loader`` the one ``MODULE:FUNC`` loader.

When imported it imports only the store, the errors and the two leaves of
``upgrades/`` (the report's types, and where the user's code raised): the commands
that load the user's agent code (``run``, ``check-upgrade``,
``migrate-state``, ``retarget``, ``approve --agents``) and ``ui`` import the rest when
they run, so that the others never load litellm. DB is an SQLite file or a
``postgresql://`` URL; reads open it read-only, and only ``copy`` creates a database,
its target.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext

from ..errors import DurableError
from . import decisions, maintenance, page, privacy, reading, repairs, running, upgrades
from .command import PROG, Command, fail

__all__ = ["PROG", "main", "parser"]

#: The families of commands, in the order ``--help`` lists them.
FAMILIES = (reading, decisions, repairs, maintenance, privacy, upgrades, running, page)


def main(argv: list[str] | None = None) -> int:
    """Run the ``effectful-durable`` command line.

    Every :class:`~effectful_durable.DurableError` (a file that is not ours, an
    unknown agent, an agent in use, ...) becomes one line on stderr,
    ``effectful-durable: error: <message>``, and exit code 1; no traceback.

    Args:
        argv: The arguments after the program name; ``sys.argv[1:]`` when None.

    Returns:
        The exit code: 0 on success, 1 on an error or a failed ``check``, 2 on a
        usage error (including ``delete`` and ``prune`` without ``--yes``, and
        ``reset-workflow`` without it when agents would be deleted, and JSON
        arguments that do not parse), 3 when ``check-upgrade`` finds work the new
        code cannot carry, 130 on Ctrl-C.

    Example::

        $ effectful-durable history state.db support-bot --version 3

    .. versionadded:: 0.1.0
    """
    try:
        args = parser().parse_args(argv)
    except SystemExit as stop:  # --help, or a usage error argparse already printed
        return stop.code if isinstance(stop.code, int) else 2
    command: Command = args.subcommand
    problem = command.prepare(args) if command.prepare is not None else None
    if problem is not None:
        return fail(problem, code=2)  # nothing was opened
    with nullcontext() if command.logs else _library_logs_quiet():
        try:
            return command.run(args)
        except DurableError as error:
            return fail(command.words(str(error), args))
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            # The reader (`| head`) left: stop quietly, like other Unix tools, and keep
            # Python from failing again when it flushes stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0


@functools.cache
def parser() -> argparse.ArgumentParser:
    """The command line's parser, every family's commands in it (built once)."""
    found = argparse.ArgumentParser(
        prog=PROG,
        description="Inspect and repair an effectful-durable database without loading an LLM.",
        epilog="Reads open DB read-only and take --json; no command creates DB.",
    )
    commands = found.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for family in FAMILIES:
        for command in family.COMMANDS.commands:
            command.add_to(commands)
    return found


# The libraries whose loggers a command keeps off the terminal: psycopg_pool logs
# each failed connection attempt as a WARNING, which Python's last-resort handler
# prints above the command's one line (docs.python.org/3/howto/logging.html, "What
# happens if no configuration is provided"). A program that calls main() with
# logging configured still gets them: the records propagate as before.
_LIBRARY_LOGGERS = ("psycopg",)


@contextmanager
def _library_logs_quiet() -> Iterator[None]:
    """Keep the libraries' log records off stderr while a command runs."""
    quiet = logging.NullHandler()
    loggers = [logging.getLogger(name) for name in _LIBRARY_LOGGERS]
    for logger in loggers:
        logger.addHandler(quiet)
    try:
        yield
    finally:
        for logger in loggers:
            logger.removeHandler(quiet)
