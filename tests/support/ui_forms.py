"""What the tests of the page's actions share: a copy of the test content to write to,
the form token a page holds, and a logical dump of a database to show nothing changed."""

import re
from typing import Any

from helpers import is_postgres, persisted_rows

from effectful_durable import Store
from effectful_durable.store.copy import copy_store

_TABLES = {
    "sqlite": "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite%'",
    "postgres": "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()",
}


def copy_content(content: str, target: str) -> str:
    """``target`` (a new database) holding a copy of the test content ``content``."""
    with Store(content, readonly=True) as source, Store(target) as copy:
        copy_store(source, copy)  # subjects included
    return target


def dump(db: str) -> dict[str, list[str]]:
    """Every row of every table of ``db``, sorted: equal dumps, equal databases. Of the
    agents' holds (PostgreSQL), only which agents are held: a hold taken and let go
    leaves its row, which records who held the agent last, and holds nothing."""
    kind = "postgres" if is_postgres(db) else "sqlite"
    tables = sorted(name for (name,) in persisted_rows(db, _TABLES[kind]))
    return {
        table: sorted(
            repr(row) for row in persisted_rows(db, _ROWS.get(table, f'SELECT * FROM "{table}"'))
        )
        for table in tables
    }


_ROWS = {"agent_holds": "SELECT agent_id FROM agent_holds WHERE token IS NOT NULL"}


def token_in(page: str) -> str:
    """The form token the page's forms carry."""
    found = re.search(r'name="csrf" value="([^"]+)"', page)
    assert found is not None, "the page holds no form"
    return found[1]


def problem_in(page: str) -> str:
    """The text of the refusal a page shows (on a form or above the page), tags removed."""
    found = re.search(r'class="problem" role="alert">(.*?)</p>', page, re.S)
    assert found is not None, "the page shows no refusal"
    text = re.sub(r"<[^>]+>", "", found[1])
    return " ".join(text.replace("&#39;", "'").replace("&#34;", '"').split())


def notice_in(page: str) -> list[str]:
    """The notices the page shows (an action's outcome)."""
    return [
        n.replace("&#39;", "'") for n in re.findall(r'<p class="notice">(.*?)</p>', page, re.S)
    ]


def fields(**values: Any) -> dict[str, str]:
    """Form fields, as strings."""
    return {name: str(value) for name, value in values.items()}
