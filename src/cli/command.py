"""What a command is, declared beside its function; how it opens DB; the one way to fail.

A family module holds a :class:`Family` and declares each command with one of its
decorators, naming the command, its help and its flags right above the function that
runs it: ``reads`` and ``writes`` open DB as a Store and hand it over, ``command`` hands
over the arguments alone. ``main`` dispatches every command the same way.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..store import Keys, Store
from ..store.engine.seam import is_postgres_url, redacted
from ..store.keys import KEY_FILE_VARIABLE, KEY_STORE_VARIABLE, KEY_VARIABLE

PROG = "effectful-durable"

type Run = Callable[[argparse.Namespace], int]
type StoreRun = Callable[[Store, argparse.Namespace], int]
type Flag = Callable[[argparse.ArgumentParser], object]
type Prepare = Callable[[argparse.Namespace], str | None]
type Words = Callable[[str, argparse.Namespace], str]


def fail(message: str, *, code: int = 1) -> int:
    """Say ``message`` on stderr in one line, ``effectful-durable: error: ...``; ``code``."""
    line = " ".join(message.splitlines())  # one line, whatever an error quotes
    print(f"{PROG}: error: {line}", file=sys.stderr)
    return code


# -- flags ------------------------------------------------------------------------


def flag(*names: str, **options: Any) -> Flag:
    """An argument of a command, as :meth:`argparse.ArgumentParser.add_argument` takes it."""

    def add(parser: argparse.ArgumentParser) -> object:
        return parser.add_argument(*names, **options)

    return add


AGENT = flag("agent", metavar="AGENT", help="the agent id")
CONVERSATION = flag(
    "--conversation",
    default="default",
    metavar="ID",
    help="the conversation (default: the agent's default one)",
)
YES = flag("--yes", action="store_true", help="confirm the deletion")
#: The ``--agents`` of the commands that run agents of the user's code.
FACTORY = flag(
    "--agents", required=True, metavar="MODULE:FUNC", help="builds an agent from its id"
)


def at_version(what: str) -> Flag:
    """``--version N``: ``what`` it selects (default: the latest)."""
    return flag("--version", type=int, metavar="N", help=f"{what} (default: latest)")


def positive(text: str) -> int:
    """A flag's whole number >= 1."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        msg = f"expected a whole number >= 1, not {text!r}"
        raise argparse.ArgumentTypeError(msg)
    return number


# -- commands -----------------------------------------------------------------------


def in_cli_words(message: str, args: argparse.Namespace) -> str:
    """An error of a command on DB, in the command line's words (:func:`cli_words`)."""
    return cli_words(message, redacted(args.db))


def as_said(message: str, args: argparse.Namespace) -> str:
    """An error as the library said it (the commands that load the user's code)."""
    return message


@dataclass(frozen=True)
class Command:
    """One subcommand: its name, help and flags, and the function that runs it.

    ``prepare`` checks (and parses) the arguments before anything is opened, and
    returns why they cannot run, a usage error; ``words`` turns a DurableError's
    message into the line the command prints; ``logs`` keeps the libraries' log
    records on the terminal (only ``run`` logs).
    """

    name: str
    help: str
    run: Run
    flags: tuple[Flag, ...] = ()
    description: str | None = None
    db: bool = True
    json: bool = False
    prepare: Prepare | None = None
    words: Words = in_cli_words
    logs: bool = False

    def add_to(self, commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        """Add the command's parser, DB and ``--json`` first, to ``commands``."""
        parser = commands.add_parser(
            self.name, help=self.help, description=self.description or self.help
        )
        if self.db:
            parser.add_argument(
                "db", metavar="DB", help="the database file, or a postgresql:// URL"
            )
        if self.json:
            parser.add_argument("--json", action="store_true", help="print JSON")
        for add in self.flags:
            add(parser)
        parser.set_defaults(subcommand=self)


class Family:
    """The commands one module declares, in the order ``--help`` lists them; ``title``
    names the section of the docs (``cli.rst``) that documents them."""

    def __init__(self, title: str) -> None:
        self.title = title
        self.commands: list[Command] = []

    def command(
        self,
        name: str,
        help: str,
        *flags: Flag,
        description: str | None = None,
        db: bool = True,
        json: bool = False,
        prepare: Prepare | None = None,
        words: Words = in_cli_words,
        logs: bool = False,
    ) -> Callable[[Run], Run]:
        """Declare the command that the function below runs with its arguments."""

        def declare(run: Run) -> Run:
            self.commands.append(
                Command(name, help, run, flags, description, db, json, prepare, words, logs)
            )
            return run

        return declare

    def reads(
        self, name: str, help: str, *flags: Flag, json: bool = True
    ) -> Callable[[StoreRun], StoreRun]:
        """Declare a command that reads DB: the function below gets it read-only."""

        def declare(run: StoreRun) -> StoreRun:
            self.command(name, help, *flags, json=json)(on_store(run, readonly=True))
            return run

        return declare

    def writes(
        self,
        name: str,
        help: str,
        *flags: Flag,
        json: bool = False,
        prepare: Prepare | None = None,
    ) -> Callable[[StoreRun], StoreRun]:
        """Declare a command that writes to DB: the function below gets it read-write."""

        def declare(run: StoreRun) -> StoreRun:
            self.command(name, help, *flags, json=json, prepare=prepare)(
                on_store(run, readonly=False)
            )
            return run

        return declare


# -- opening DB ---------------------------------------------------------------------


def on_store(run: StoreRun, *, readonly: bool) -> Run:
    """``run`` with DB opened as a Store; no command creates DB."""

    def opened(args: argparse.Namespace) -> int:
        problem = unusable(args.db)
        if problem:
            return fail(problem)
        keys = keys_from_environment()
        if is_postgres_url(args.db) and not readonly:
            # Refuses an empty database: none is made.
            Store(args.db, readonly=True, keys=keys).close()
        with Store(args.db, readonly=readonly, keys=keys) as store:
            return run(store, args)

    return opened


#: Where the commands find the master key of an encrypted database: a key file, or
#: the key itself; and the key store, when it is not ``DB.keys`` beside an SQLite file.
KEY_FILE, KEY_TEXT, KEY_STORE = KEY_FILE_VARIABLE, KEY_VARIABLE, KEY_STORE_VARIABLE


def keys_from_environment() -> Keys | None:
    """The keys the environment names (:data:`KEY_FILE` or :data:`KEY_TEXT`), or None."""
    return Keys.from_environment()


def unusable(path: str) -> str | None:
    """Why ``path`` cannot be opened without creating or changing it, or None."""
    if is_postgres_url(path):
        return None  # the Store says what is wrong with a server or its database
    if not os.path.exists(path):
        return f"no database at {path}: the file does not exist (nothing was created)"
    if os.path.isdir(path):
        return f"{path} is a directory; pass the path of a database file"
    if os.path.getsize(path) == 0:
        return f"{path} is an empty file, not an effectful-durable database yet"
    return None


def report_path(db: str, chosen: str | None) -> str | None:
    """Where the report of ``check-upgrade`` is kept for the page: the path chosen, else
    ``DB.check.json`` beside an SQLite file (a PostgreSQL database has no beside)."""
    if chosen is not None:
        return chosen
    return None if is_postgres_url(db) else f"{db}.check.json"


def cli_words(message: str, db: str) -> str:
    """An error message in the command line's words rather than the Python API's."""
    for python, shell in (
        ("Store.agents() lists the agents it holds", f"`{PROG} agents {db}` lists them"),
        (
            "Store.workflows() lists the journals it holds",
            f"`{PROG} workflows {db}` lists them",
        ),
        (
            "wait for that turn to finish, pass wait=<seconds> to PersistenceHandler to "
            "wait for it, or fork the agent to run a copy.",
            "run the command again once that turn has finished.",
        ),
        (
            "Retry, or raise busy_timeout if writers hold it this long on purpose.",
            "Run the command again once that writer has finished.",
        ),
        (
            "open it read-write once (Store(path)) to roll that write back, then read it",
            f"run `{PROG} vacuum {db}` once to roll that write back, then read it",
        ),
        (
            "open it once read-write to migrate it",
            f"run `{PROG} vacuum {db}` once to migrate it",
        ),
        (
            "`effectful-durable approvals` (Store.approvals()) lists them",
            f"`{PROG} approvals {db}` lists them",
        ),
        ("(Store.agents() lists them)", f"(`{PROG} agents {db}` lists them)"),
        ("Store.alarms() lists them", f"`{PROG} alarms {db}` lists them"),
        ("Store.events() lists them", f"`{PROG} events {db}` lists them"),
        ("pass create=True (--create)", "pass --create"),
        ("resealing needs keys (keys=Keys.from_file(...))", f"it needs a key: set {KEY_FILE}"),
        (
            "open it with keys= (Keys.from_file, Keys.from_env)",
            f"set {KEY_FILE} (or {KEY_TEXT}, and {KEY_STORE} where the key store is elsewhere)",
        ),
        ("invalid agent_id", "invalid agent id"),
        ("made with Store.backup", f"made with `{PROG} backup`"),
        (
            "pass on_unreadable='quarantine' to move it aside and start a new database",
            "move it aside with its -wal and -shm files to start a new database",
        ),
        (f"`{PROG} check`", f"`{PROG} check {db}`"),
    ):
        message = message.replace(python, shell)
    return re.sub(r", found during [\w.]+\(\)", "", message)
