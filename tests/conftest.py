import os

# litellm downloads a price list on import unless told to use its bundled copy.
os.environ["LITELLM_LOCAL_MODEL_COST_MAP"] = "True"

from pathlib import Path

import pytest


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    """A path for a new database file in a fresh temporary directory."""
    return tmp_path / "state.db"
