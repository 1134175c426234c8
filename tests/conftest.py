"""What every test shares: the import path, the fixtures of databases and servers.

The tests' shared modules (``support/``) and the programs they start
(``programs/``) are imported by bare name (``from helpers import persisted``):
``paths.install()`` puts both folders on ``sys.path`` here and on ``PYTHONPATH``
for every process a test starts. Tests never import ``tests.<something>``.
"""

import contextlib
import gc
import itertools
import os
import subprocess
import sys

# litellm downloads a price list on import unless told to use its bundled copy.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import paths
import pytest

if TYPE_CHECKING:
    from helpers import NewDatabases
    from netns import Network
    from pgbouncer_server import PgBouncer
    from postgres_server import PostgresServer

paths.install()

# -- the fast tier (``make check``): no server, no child process, no browser ----------

#: Fixtures that start a server, a network or a browser.
OUTSIDE_FIXTURES = frozenset(
    {
        "postgres_server",
        "postgres_url",
        "pgbouncer",
        "pooled_url",
        "net",
        "listening_server",
        "listening_bouncer",
        "driver",
    }
)
#: Folders whose every test starts processes: the crash, fault and fleet suites, the examples.
OUTSIDE_FOLDERS = frozenset({"processes", "examples"})


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="run only the tests that need no server, no child process and no browser",
    )


def needs_outside(item: pytest.Item) -> bool:
    """Whether ``item`` starts a server, a process or a browser (so ``--fast`` leaves it)."""
    if item.get_closest_marker("slow") or item.get_closest_marker("processes"):
        return True
    if OUTSIDE_FIXTURES & set(getattr(item, "fixturenames", ())):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and any(value == "postgres" for value in callspec.params.values()):
        return True
    return item.path.parent.name in OUTSIDE_FOLDERS


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("--fast"):
        return
    inside, outside = [], []
    for item in items:
        (outside if needs_outside(item) else inside).append(item)
    config.hook.pytest_deselected(items=outside)
    items[:] = inside


@pytest.fixture(autouse=True)
def _fast_tier_starts_nothing(request: pytest.FixtureRequest) -> Iterator[None]:
    """Under ``--fast``, a test that starts a process fails, saying how to mark it."""
    if not request.config.getoption("--fast"):
        yield
        return

    def refuse(*args: object, **kwargs: object) -> NoReturn:
        raise AssertionError(
            f"{request.node.nodeid} starts a process: mark it @pytest.mark.processes "
            "(make check runs none; make test runs it)"
        )

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess.Popen, "_execute_child", refuse)
        patch.setattr(os, "fork", refuse)
        yield


@pytest.fixture(autouse=True, scope="session")
def _private_cache_home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """PostgreSQL Stores keep their SQL workspace files under $XDG_CACHE_HOME: a
    temporary directory here (children inherit it), never the user's ~/.cache."""
    before = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
    yield
    if before is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = before


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A path for a new database file in a fresh temporary directory."""
    return tmp_path / "state.db"


# -- PostgreSQL: a throwaway cluster for the session, a fresh database per test ----


@pytest.fixture(scope="session")
def postgres_server() -> "Iterator[PostgresServer]":
    """A PostgreSQL cluster on a Unix socket in a temp dir, for the whole session.

    Skipped, with one line saying how to enable it, where no server binaries or no
    psycopg are installed; a failure instead when $EFFECTFUL_DURABLE_REQUIRE_POSTGRES
    is set (CI sets it: our CI must run these tests).
    """
    from postgres_server import PostgresServer, running

    with running(PostgresServer) as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: "PostgresServer") -> "Iterator[str]":
    """The URL of a new, empty database on the session's PostgreSQL server."""
    url = postgres_server.new_database()
    yield url
    gc.collect()  # Stores a test left open let go of their pools first
    postgres_server.drop_database(url)


@pytest.fixture(scope="session")
def pgbouncer(postgres_server: "PostgresServer") -> "Iterator[PgBouncer]":
    """A PgBouncer in transaction mode in front of the session's cluster, for the whole
    session, on a Unix socket in a temp dir (support/pgbouncer_server.py).

    Skipped, with one line saying how to enable it, where pgbouncer is not installed;
    a failure instead when $EFFECTFUL_DURABLE_REQUIRE_POSTGRES is set (CI).
    """
    from pgbouncer_server import running

    with running(postgres_server) as bouncer:
        yield bouncer


@pytest.fixture
def pooled_url(pgbouncer: "PgBouncer", postgres_url: str) -> str:
    """The URL, through the session's PgBouncer, of the test's new database
    (``postgres_url``, the same database reached directly)."""
    return pgbouncer.pooled(postgres_url)


# -- a network the tests can cut (support/netns.py), and servers listening on it ------


@pytest.fixture(scope="module")
def net() -> "Iterator[Network]":
    """A network of the tests' own in 198.18.0.0/15, for the module: its hosts are
    network namespaces that a test cuts off and heals. Skipped where namespaces
    cannot be made (a failure where CI requires PostgreSQL)."""
    from netns import namespaces, network

    namespaces()
    with network() as made:
        yield made


@pytest.fixture(scope="module")
def listening_server(net: "Network") -> "Iterator[PostgresServer]":
    """A PostgreSQL cluster of the module's own, listening on ``net``'s server address
    (for its hosts) and on its Unix socket (for the tests' own clients)."""
    from postgres_server import PostgresServer, running

    class Listening(PostgresServer):
        def __init__(self, bindir: str) -> None:
            super().__init__(bindir, listen=str(net.server))

    with running(Listening) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def listening_bouncer(net: "Network", listening_server: "PostgresServer") -> "Iterator[PgBouncer]":
    """PgBouncer in transaction mode in front of ``listening_server``, listening on
    ``net``'s server address, port 6432."""
    from pgbouncer_server import running

    with running(listening_server, {"listen_addr": str(net.server)}) as pooler:
        yield pooler


@pytest.fixture(params=["sqlite", "postgres"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The database of a conformance test: an SQLite file, then a PostgreSQL database.

    A test of a part not yet carried on PostgreSQL says so with
    ``@pytest.mark.sqlite_only("reason")`` and runs on SQLite only.
    """
    if request.param == "sqlite":
        return str(tmp_path / "state.db")
    marker = request.node.get_closest_marker("sqlite_only")
    if marker is not None:
        pytest.skip(f"SQLite only: {marker.args[0]}")
    url: str = request.getfixturevalue("postgres_url")
    return url


@pytest.fixture
def store_server(store_url: str, request: pytest.FixtureRequest) -> "PostgresServer | None":
    """The PostgreSQL server behind ``store_url`` (its files, its ``pg_dump``), or None
    on SQLite: for a test that reads what the database's files hold."""
    if not store_url.startswith("postgresql://"):
        return None
    found: PostgresServer = request.getfixturevalue("postgres_server")
    return found


@pytest.fixture(params=["sqlite", "postgres"])
def new_databases(request: pytest.FixtureRequest, tmp_path: Path) -> "NewDatabases":
    """Make empty databases, SQLite files and then PostgreSQL databases, for a test
    that needs a fresh one per Hypothesis example."""
    from helpers import NewDatabases

    if request.param == "sqlite":
        numbers = itertools.count(1)

        @contextlib.contextmanager
        def new_file() -> Iterator[str]:
            yield str(tmp_path / f"state-{next(numbers)}.db")

        return NewDatabases(new_file, postgres=False)
    server: PostgresServer = request.getfixturevalue("postgres_server")

    @contextlib.contextmanager
    def new_database() -> Iterator[str]:
        url = server.new_database()
        try:
            yield url
        finally:
            gc.collect()  # Stores the example left open let go of their pools first
            server.drop_database(url)

    return NewDatabases(new_database, postgres=True)
