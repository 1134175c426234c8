"""The runner tests' fixtures."""

import os

import pytest

FULL = os.environ.get("EFFECTFUL_DURABLE_CRASH") == "full"


@pytest.fixture
def fleet_url(store_url: str) -> str:
    """``store_url``, on PostgreSQL only unless the run is full."""
    if not FULL and "://" not in store_url:
        pytest.skip("a fleet shares PostgreSQL; SQLite with EFFECTFUL_DURABLE_CRASH=full")
    return store_url
