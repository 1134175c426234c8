"""The page's tests share one database of test content per backend (tests/ui/content.py)."""

import pytest

from tests.ui.content import build


@pytest.fixture(scope="session", params=["sqlite", "postgres"])
def content(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> str:
    """The page's test content, built once per backend for the session; never written."""
    if request.param == "sqlite":
        db = str(tmp_path_factory.mktemp("content") / "content.db")
    else:
        db = request.getfixturevalue("postgres_server").new_database()
    build(db)
    return db


@pytest.fixture(scope="session")
def sqlite_content(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The page's test content in an SQLite file alone, for the tests of the command."""
    db = str(tmp_path_factory.mktemp("content") / "content.db")
    build(db)
    return db
