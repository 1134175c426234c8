"""The first connection of a PostgreSQL Store, and what a server's refusal of it means.

The pool connects in a thread of its own and only logs why it failed, so a URL
the server refuses (no such database, a wrong password) looked from the Store
like a server that does not answer: a 5 s wait, then "cannot reach". Before the
pool opens, :func:`first_connection` connects once in the caller's thread:

- a refusal that lasts (the server answered: no such database or role, a
  credential refused, no ``pg_hba.conf`` rule, no ``CONNECT`` privilege, an
  invalid URL) raises :class:`~effectful_durable.DatabaseAccessError` at once,
  with the server's words and advice that fits;
- a failure that may pass (no answer, a name that did not resolve, a server
  starting up or out of connection slots) is tried again, with backoff, until
  the deadline, then raises :class:`~effectful_durable.DatabaseUnavailableError`
  with the last reason.

libpq keeps no SQLSTATE for a failed connection attempt (psycopg's error has
only libpq's message), so the refusals are recognised by the English text of
PostgreSQL's messages (a server whose ``lc_messages`` is ``C`` or ``en_*``, the
default). A refusal in another language is taken for a failure that may pass:
the wait, then DatabaseUnavailableError, with the server's words as its reason.
"""

from __future__ import annotations

import math
import os
import re
import secrets
import shlex
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Self, cast

import psycopg
from psycopg.conninfo import conninfo_to_dict

from ....errors import AccessProblem, DatabaseAccessError, DatabaseUnavailableError
from .connections import DeadlineConnection

_RETRY_FIRST = 0.1  # seconds before the second attempt; doubles up to _RETRY_MAX
_RETRY_MAX = 0.5
_MIN_CONNECT_TIMEOUT = 2  # libpq takes a connect_timeout below 2 s as 2 s


def first_connection(
    url: str,
    location: str,
    options: Mapping[str, Any],
    *,
    timeout: float,
    connection_class: type[DeadlineConnection] = DeadlineConnection,
    opening: bool = True,
) -> DeadlineConnection:
    """Connect to ``url`` once, within ``timeout`` seconds (the pool's first
    connection, or one of the Store's own: the holds' renewals).

    Args:
        url: The ``postgresql://`` URL, as given.
        location: The URL without its password, to name in messages.
        options: psycopg's connection options, as the pool will pass them.
        timeout: Seconds to wait for a server that does not answer, or answers
            that it cannot take the connection now.
        connection_class: The class of the connection made.
        opening: Whether the Store is opening (its error then says that nothing
            was read or written).

    Returns:
        The connection (the pool takes over the first one: :func:`pool_connections`).

    Raises:
        DatabaseAccessError: The server refused the connection for a reason
            that lasts, or the URL is invalid; raised by the attempt that meets
            it, without waiting further.
        DatabaseUnavailableError: No attempt succeeded within ``timeout``.
    """
    deadline = time.monotonic() + timeout
    try:
        return patient_connection(
            connection_class, url, options, lambda: deadline - time.monotonic()
        )
    except psycopg.Error as error:
        if refused_options(error) and "options" in options:
            raise  # a pooler: the caller connects without them (opening_connection)
        refusal = access_error(error, url, location)
        if refusal is not None:
            raise refusal from error
        raise unavailable(error, url, location, opening=opening) from error


def opening_connection(
    url: str,
    location: str,
    options: dict[str, Any],
    *,
    timeout: float,
    connection_class: type[DeadlineConnection],
) -> tuple[DeadlineConnection, bool]:
    """The Store's first connection, and whether ``url`` reaches a pooler in
    transaction mode (PgBouncer's ``pool_mode = transaction``) rather than the server.

    A pooler refuses libpq's ``options`` ("unsupported startup parameter"), or
    is set to ignore them: then they are dropped from ``options`` (in place), and
    the caller sets its sessions' settings in each transaction instead, since the
    server session under a client changes from one transaction to the next.
    Whether they were ignored is told by a setting of our own with a random
    value (:data:`PROBE`), sent with them and read back: nothing else sets it, so
    no database's or role's own settings can look like ours applied.

    Raises:
        DatabaseAccessError, DatabaseUnavailableError: As :func:`first_connection`.
    """
    deadline = time.monotonic() + timeout
    mark = secrets.token_hex(8)
    probing = dict(options)
    if "options" in options:
        probing["options"] = f"{options['options']} -c {PROBE}={mark}"
    try:
        conn = first_connection(
            url, location, probing, timeout=timeout, connection_class=connection_class
        )
    except psycopg.Error:  # the options refused: only a pooler does
        del options["options"]
        remaining = max(deadline - time.monotonic(), 1.0)
        conn = first_connection(
            url, location, options, timeout=remaining, connection_class=connection_class
        )
        return conn, True
    if "options" not in options:
        return conn, False
    try:
        applied = conn.execute("SELECT current_setting(%s, true)", (PROBE,)).fetchone()
    except psycopg.Error as error:
        conn.close()
        raise unavailable(error, url, location, opening=True) from error
    if applied is not None and applied[0] == mark:
        return conn, False
    del options["options"]  # ignored (ignore_startup_parameters): harmless, but not ours
    return conn, True


#: The setting :func:`opening_connection` sends with the startup options and reads
#: back: a custom (dotted) name, which any server takes without declaring it.
PROBE = "effectful_durable.probe"

#: PgBouncer's words for a startup parameter it does not pass on to the server.
_UNSUPPORTED = re.compile(r"unsupported startup parameter")


def refused_options(error: psycopg.Error) -> bool:
    """Whether connecting failed because a pooler refused a startup parameter."""
    return _UNSUPPORTED.search(str(error)) is not None


def patient_connection(
    connection_class: type[DeadlineConnection],
    url: str,
    options: Mapping[str, Any],
    remaining: Callable[[], float],
    failed: Callable[[psycopg.Error], object] = lambda error: None,
) -> DeadlineConnection:
    """Connect, trying again (0.1 s apart, then up to 0.5 s) while the failure may pass
    and ``remaining()`` seconds are left; ``failed`` hears of each failed attempt.

    Raises:
        psycopg.Error: The last attempt's error, at once for a lasting refusal.
    """
    given_timeout = connect_timeout_given(url)
    pause = _RETRY_FIRST
    while True:
        attempt = dict(options)
        if not given_timeout:
            attempt["connect_timeout"] = connect_timeout(remaining())
        try:
            return connection_class.connect(url, **attempt)
        except psycopg.Error as error:
            failed(error)
            lasting = access_error(error, url, "") is not None or refused_options(error)
            if remaining() <= 0 or lasting:
                raise
        time.sleep(max(0.0, min(pause, remaining())))  # the last attempt at the deadline
        pause = min(pause * 2, _RETRY_MAX)


def connect_timeout_given(url: str) -> bool:
    """Whether the URL (or ``PGCONNECT_TIMEOUT``) sets libpq's ``connect_timeout``."""
    return bool(_conninfo(url).get("connect_timeout") or os.environ.get("PGCONNECT_TIMEOUT"))


def connect_timeout(seconds: float) -> int:
    """libpq's ``connect_timeout`` for an attempt of at most ``seconds``."""
    return max(_MIN_CONNECT_TIMEOUT, math.ceil(seconds))


def pool_connections(
    first: DeadlineConnection,
    connection_class: type[DeadlineConnection],
    closed: Callable[[], bool],
) -> type[DeadlineConnection]:
    """A connection class for the pool whose first ``connect()`` returns ``first``.

    The pool makes its connections with ``connection_class.connect(conninfo,
    **kwargs)``; the first one is then the connection :func:`first_connection`
    made (with the same options), not a second one to the server. The others
    try again and again while the failure may pass, until the pool is
    ``closed()``: so that the pool's own backoff (1 s, doubling) never delays
    it once the server is back. A failed attempt is kept (``last_failure``): a
    caller that waited for a connection in vain says why.
    """
    handed = [first]

    class PoolConnection(connection_class):  # type: ignore[valid-type, misc]
        last_failure: psycopg.Error | None = None

        @classmethod
        def connect(cls, conninfo: str = "", **kwargs: Any) -> Self:
            try:
                return cast(Self, handed.pop())
            except IndexError:  # the first one is taken: a new one
                pass

            def remaining() -> float:
                return 0.0 if closed() else _RETRY_MAX

            def failed(error: psycopg.Error) -> None:
                PoolConnection.last_failure = error

            connection = patient_connection(connection_class, conninfo, kwargs, remaining, failed)
            PoolConnection.last_failure = None
            return cast(Self, connection)

    return PoolConnection


def unavailable(
    error: BaseException, url: str, location: str, *, opening: bool = False
) -> DatabaseUnavailableError:
    """The DatabaseUnavailableError for ``error`` (connecting, or a connection lost)."""
    reason = unavailable_reason(error, url)
    advice = None
    if _TOO_MANY.search(reason):
        advice = CONNECTIONS_NEEDED
    return DatabaseUnavailableError(location, reason, opening=opening, advice=advice)


#: What a refusal for lack of connection slots advises (SQLSTATE 53300).
CONNECTIONS_NEEDED = (
    "Each process using a Store needs at least 2 connections (one pooled, one to "
    "renew the agents' holds) and one more per concurrent turn, up to pool_size + 1. "
    "Raise the limit (ALTER ROLE "
    "... CONNECTION LIMIT, ALTER DATABASE ... CONNECTION LIMIT, or the server's "
    "max_connections), lower pool_size, or run fewer processes"
)

# PostgreSQL's words for a refusal for lack of slots (postinit.c): the server's
# max_connections, a role's or a database's CONNECTION LIMIT.
_TOO_MANY = re.compile(r"too many clients already|too many connections for (role|database)")


def access_error(error: psycopg.Error, url: str, location: str) -> DatabaseAccessError | None:
    """The lasting refusal ``error`` (from connecting to ``url``) reports, or None.

    None means the failure may pass (the server did not answer, or answered
    that it cannot take the connection now), or is not one we recognise.
    """
    text = _scrubbed(str(error), url)
    if isinstance(error, psycopg.ProgrammingError):  # libpq refused the URL itself
        reason = first_line(text)
        advice = (
            "Correct the URL (libpq's connection parameters: "
            "postgresql.org/docs/current/libpq-connect.html), or the PG* environment "
            "variables that fill it in"
        )
        return DatabaseAccessError(location, reason, problem="settings", advice=advice)
    settings = _conninfo(url)
    for refusal in _REFUSALS:
        for line in text.splitlines():
            match = refusal.pattern.search(line)
            if match is not None:
                advice = refusal.advice(match, settings)
                reason = _server_words(line)
                return DatabaseAccessError(
                    location, reason, problem=refusal.problem, advice=advice
                )
    if error.pgconn is not None and error.pgconn.needs_password:
        # libpq's "no password supplied", in whatever language it speaks.
        return DatabaseAccessError(
            location,
            _server_words(first_line(text)),
            problem="authentication",
            advice=_NO_PASSWORD,
        )
    return None


def unavailable_reason(error: BaseException, url: str) -> str:
    """Why connecting failed, in one line without psycopg's prefix or a password."""
    if isinstance(error, psycopg.errors.ConnectionTimeout):
        return "the server did not accept a connection in time (connect_timeout)"
    line = first_line(_scrubbed(str(error), url))
    return re.sub(r"^connection (?:failed|is bad): ", "", line)


# -- the refusals ------------------------------------------------------------------


@dataclass(frozen=True)
class _Refusal:
    """A lasting refusal: the English words that report it, and what to do about it."""

    pattern: re.Pattern[str]
    problem: AccessProblem
    advice: Callable[[re.Match[str], Mapping[str, str]], str]


_NO_PASSWORD = (
    "The server asks for a password and none was given: put it in the URL "
    "(postgresql://user:password@host/dbname), in PGPASSWORD or in ~/.pgpass"
)


def _create_database(match: re.Match[str], settings: Mapping[str, str]) -> str:
    command = ["createdb"]
    for option, key in (("-h", "host"), ("-p", "port"), ("-U", "user")):
        value = settings.get(key)
        if value and "," not in value:  # one host: a list names several servers
            command += [option, value]
    command.append(match["name"])
    return f"Create it (`{shlex.join(command)}`), or correct the database name in the URL"


def _create_role(match: re.Match[str], settings: Mapping[str, str]) -> str:
    return (
        "Correct the user name in the URL, or create the role (as a superuser: "
        f'CREATE ROLE "{match["name"]}" LOGIN)'
    )


def _wrong_password(match: re.Match[str], settings: Mapping[str, str]) -> str:
    return "Check the user name and password in the URL (or in PGPASSWORD or ~/.pgpass)"


def _other_method(match: re.Match[str], settings: Mapping[str, str]) -> str:
    return (
        f"The server's pg_hba.conf asks for {match['method']} authentication of this "
        "connection: check the user name in the URL and that credential, or ask the "
        "server's administrator for a rule that fits"
    )


def _no_rule(match: re.Match[str], settings: Mapping[str, str]) -> str:
    return (
        "The server's pg_hba.conf lets no such connection in (this host, user and "
        "database): ask its administrator for a rule, or check the user, database and "
        "sslmode in the URL"
    )


def _no_connect(match: re.Match[str], settings: Mapping[str, str]) -> str:
    role = settings.get("user") or "<role>"
    return (
        f'Have the database\'s owner run GRANT CONNECT ON DATABASE "{match["name"]}" '
        f'TO "{role}", or connect as another role'
    )


def _no_login(match: re.Match[str], settings: Mapping[str, str]) -> str:
    return f'Have a superuser run ALTER ROLE "{match["name"]}" LOGIN, or connect as another role'


def _closed_database(match: re.Match[str], settings: Mapping[str, str]) -> str:
    return (
        f'Database "{match["name"]}" does not allow connections (ALLOW_CONNECTIONS false, '
        "as template0): name another database in the URL"
    )


def _bad_setting(match: re.Match[str], settings: Mapping[str, str]) -> str:
    return "Correct the connection settings in the URL (its options or sslmode) or PGOPTIONS"


def _refusal(pattern: str, problem: AccessProblem, advice: Callable[..., str]) -> _Refusal:
    return _Refusal(re.compile(pattern), problem, advice)


# PostgreSQL's own words (src/backend/utils/init/postinit.c, libpq/auth.c,
# libpq/hba.c), first match wins: a password refusal before other methods'.
_REFUSALS = (
    _refusal(r'database "(?P<name>[^"]*)" does not exist', "missing-database", _create_database),
    _refusal(r'role "(?P<name>[^"]*)" does not exist', "missing-role", _create_role),
    _refusal(r'password authentication failed for user "', "authentication", _wrong_password),
    _refusal(r"no password supplied", "authentication", lambda *_: _NO_PASSWORD),
    _refusal(r'(?P<method>\S+) authentication failed for user "', "authentication", _other_method),
    _refusal(r"no pg_hba\.conf entry for ", "not-permitted", _no_rule),
    _refusal(r"pg_hba\.conf rejects connection ", "not-permitted", _no_rule),
    _refusal(r'permission denied for database "(?P<name>[^"]*)"', "not-permitted", _no_connect),
    _refusal(r'role "(?P<name>[^"]*)" is not permitted to log in', "not-permitted", _no_login),
    _refusal(
        r'database "(?P<name>[^"]*)" is not currently accepting connections',
        "not-permitted",
        _closed_database,
    ),
    _refusal(
        r"unrecognized configuration parameter|invalid value for parameter|"
        r"server does not support SSL, but SSL was required",
        "settings",
        _bad_setting,
    ),
)


# -- words -------------------------------------------------------------------------


def user_options(url: str) -> str:
    """The libpq ``options`` the user gave: the URL's, else ``PGOPTIONS``'s."""
    return (_conninfo(url).get("options") or os.environ.get("PGOPTIONS", "")).strip()


def _conninfo(url: str) -> dict[str, str]:
    """libpq's settings from ``url`` (empty if it cannot parse it)."""
    try:
        return {key: str(value) for key, value in conninfo_to_dict(url).items()}
    except psycopg.Error:
        return {}


def _scrubbed(text: str, url: str) -> str:
    """``text`` without the URL's password (libpq quotes a URL it cannot parse)."""
    password = urllib.parse.urlsplit(url).password
    if not password:
        return text
    for form in {password, urllib.parse.unquote(password)}:
        if form:
            text = text.replace(form, "***")
    return text


def first_line(text: str) -> str:
    """The first line of an error's text that says something."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "no reason given"


def _server_words(line: str) -> str:
    """The server's message in libpq's line, without the prefixes naming the attempt."""
    line = re.sub(r"^connection (?:failed|is bad): ", "", line.strip())
    line = re.sub(r"^connection to server (?:on|at) .*? failed: ", "", line)
    return re.sub(r"^(?:FATAL|ERROR):\s+", "", line)
