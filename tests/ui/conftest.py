"""The page's tests share one database of test content per backend (tests/support/ui_content.py),
and one headless chromium per module that drives a browser (tests/support/browser.py)."""

from collections.abc import Iterator
from typing import Any

import browser
import pytest
from ui_content import build


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


@pytest.fixture(scope="module")
def driver() -> Iterator[Any]:
    """One headless chromium for the module; skipped without one, unless CI requires it."""
    reason = browser.unavailable()
    if reason is not None:
        if browser.required():
            pytest.fail(f"{reason} (and CI or {browser.REQUIRE_ENV} is set)")
        pytest.skip(reason)
    chromium = browser.start()
    chromium.implicitly_wait(0)
    try:
        yield chromium
    finally:
        chromium.quit()
