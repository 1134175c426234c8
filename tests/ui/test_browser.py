"""The page in a real browser (headless chromium): the token, each page of a database the
demo made, the history filter, a diff, a live update, HTML as text, a foreign host.

One browser for the module; the pages are served for real (``effectful-durable ui``).
Screenshots of the main pages are saved (tests/support/browser.py says where).
"""

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import browser
import pydantic
import pytest
from browser import enter, shot, text_of, wait_for
from ui_content import DESK, HTML
from ui_server import ROOT, Server, serving, write_turns

pytestmark = pytest.mark.slow

DEMO = ROOT / "examples" / "multi_agent" / "workflow.py"


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The page over a database the multi-agent demo made (run offline)."""
    folder = tmp_path_factory.mktemp("demo")
    db = str(folder / "demo.db")
    subprocess.run(
        [sys.executable, str(DEMO), "--db", db, "--out", str(folder / "project")],
        check=True,
        capture_output=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        timeout=300,
    )
    with serving(db) as server:
        yield server


@pytest.fixture(scope="module")
def desk(sqlite_content: str) -> Iterator[Server]:
    """The page over the test content (HTML everywhere, a refund that waits), in a copy
    of its own: the live test commits to it."""
    import shutil

    db = sqlite_content.replace("content.db", "content-browser.db")
    shutil.copy(sqlite_content, db)
    with serving(db) as server:
        yield server


class TestToken:
    def test_the_printed_address_lets_the_browser_in(self, driver: Any, demo: Server) -> None:
        """Without the token: a page saying how to get in. Through the printed address:
        the agents list, the token gone from the URL, the cookie out of scripts' reach."""
        driver.delete_all_cookies()
        driver.get(demo.base + "/")
        assert "Open the page through its address" in text_of(driver)
        enter(driver, demo)
        assert "architect" in text_of(driver)
        assert driver.execute_script("return document.cookie") == ""
        (cookie,) = driver.get_cookies()
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"

    def test_a_foreign_host_is_refused(self, driver: Any, demo: Server) -> None:
        """A name that resolves to this machine but is not its own (DNS rebinding) gets
        a refusal, and no agent."""
        port = demo.base.rsplit(":", 1)[1]
        driver.get(f"http://{browser.FOREIGN_HOST}:{port}/")
        shown = text_of(driver)
        assert "This host name is not allowed" in shown
        assert "architect" not in shown


class TestDemoPages:
    def test_agents_list(self, driver: Any, demo: Server) -> None:
        """The list shows the demo's four agents with their versions."""
        enter(driver, demo)
        rows = driver.find_elements("css selector", "table.agents tbody tr")
        assert [r.find_element("tag name", "a").text for r in rows] == [
            "architect",
            "coder-1",
            "coder-2",
            "reviewer",
        ]
        shot(driver, "agents")

    def test_timeline(self, driver: Any, demo: Server) -> None:
        """An agent's page: one block per turn, each tool call beside its result, the
        arguments folded until opened."""
        enter(driver, demo)
        driver.find_element("link text", "coder-1").click()
        wait_for(driver, lambda d: "Timeline" in text_of(d))
        turns = driver.find_elements("css selector", "li.turn")
        assert [t.get_attribute("id") for t in turns] == ["v4", "v3", "v2", "v1"]
        call = driver.find_element("css selector", "#v1 .call")
        assert "write_file" in call.find_element("css selector", ".tool").text
        assert "saved textkit/slugify.py" in call.find_element("css selector", ".result").text
        folded = call.find_element("css selector", "details.json dl.fields")
        assert not folded.is_displayed()
        call.find_element("css selector", "details.json summary").click()
        assert folded.is_displayed() and "path\ntextkit/slugify.py" in folded.text
        shot(driver, "timeline")

    def test_history_filter(self, driver: Any, demo: Server) -> None:
        """The filter keeps the turns with a matching message, and only those messages."""
        enter(driver, demo)
        driver.get(demo.base + "/agent?id=coder-1")
        field = driver.find_element("css selector", "form.filters input[name=text]")
        field.send_keys("redact")
        driver.find_element("css selector", "form.filters input[name=tool]").send_keys(
            "self__write_file"
        )
        driver.find_element("css selector", "form.filters button").click()
        wait_for(driver, lambda d: "text=redact" in d.current_url)
        turns = driver.find_elements("css selector", "li.turn")
        assert turns and all("match" in t.find_element("tag name", "header").text for t in turns)
        for call in driver.find_elements("css selector", ".call .tool"):
            assert call.text == "self__write_file"
        shot(driver, "filter")

    def test_diff(self, driver: Any, demo: Server) -> None:
        """Two versions chosen on the versions page show what changed between them."""
        enter(driver, demo)
        driver.get(demo.base + "/versions?id=reviewer")
        form = driver.find_element("css selector", "form.filters")
        older = form.find_element("css selector", "input[name=from]")
        older.clear()
        older.send_keys("1")
        form.find_element("tag name", "button").click()
        wait_for(driver, lambda d: "/diff" in d.current_url)
        shown = text_of(driver)
        assert "What changed from v1" in shown and "messages added" in shown
        assert driver.find_elements("css selector", ".diff-msg.plus")
        shot(driver, "diff")

    @pytest.mark.parametrize(
        ("path", "says"),
        [
            ("/state?id=coder-1", "written"),
            ("/waiting", "build-textkit"),
            ("/workflow?name=build-textkit", "architect#0"),
            ("/versions?id=coder-1", "diff with v3"),
        ],
    )
    def test_other_pages(self, driver: Any, demo: Server, path: str, says: str) -> None:
        """The state, waiting work, journal and versions pages show the demo's records."""
        enter(driver, demo)
        driver.get(demo.base + path)
        assert says in text_of(driver)

    @pytest.mark.parametrize(
        "path",
        [
            "/",
            "/agent?id=coder-1",
            "/send-event",
            "/reset-workflow?name=build-textkit&from=1",
        ],
    )
    def test_a_checkbox_is_a_box(self, driver: Any, demo: Server, path: str) -> None:
        """Each page's checkbox shows as a square box at least 12 pixels wide, with a tick
        once clicked."""
        enter(driver, demo)
        driver.get(demo.base + path)
        box = driver.find_element("css selector", "input[type=checkbox]")
        box.click()
        width, height, radius, tick = driver.execute_script(
            "const r = arguments[0].getBoundingClientRect(), s = getComputedStyle(arguments[0]);"
            "return [r.width, r.height, parseFloat(s.borderRadius), s.backgroundImage]",
            box,
        )
        assert box.is_selected() and width >= 12 and height >= 12
        assert radius < width / 4  # not rounded into a circle
        assert tick.startswith("url(")


class TestContent:
    def test_html_is_shown_as_text(self, driver: Any, desk: Server) -> None:
        """HTML in messages, ids, tool arguments and memory shows as text; no script of
        the database's runs."""
        enter(driver, desk)
        assert HTML in text_of(driver)  # the agent whose id is HTML
        driver.get(desk.base + f"/agent?id={DESK}")
        shown = text_of(driver)
        assert f"Looked it up. {HTML}" in shown
        sources = driver.execute_script("return [...document.scripts].map(s => s.src)")
        assert [source.rsplit("/", 1)[1] for source in sources] == [  # the page's own
            "htmx.min.js",
            "htmx-ext-sse.min.js",
            "actions.js",
            "live.js",
        ]
        assert driver.execute_script("return window.alerted === undefined")
        driver.get(desk.base + f"/state?id={DESK}&sql=SELECT+note+FROM+refunds")
        assert f"note {HTML}" in text_of(driver)

    def test_a_refund_that_waits_is_plain_to_see(self, driver: Any, desk: Server) -> None:
        """The agent's page opens with the tool call that waits for a person, and a link
        to decide it."""
        enter(driver, desk)
        driver.get(desk.base + f"/agent?id={DESK}")
        waiting = driver.find_element("css selector", "section.waiting article.approval")
        assert "Waits for a person" in waiting.text and "refund" in waiting.text
        assert "/approval?id=apr_" in waiting.find_element("link text", "Decide…").get_attribute(
            "href"
        )
        shot(driver, "approval")

    def test_a_commit_shows_without_a_reload(self, driver: Any, desk: Server) -> None:
        """Another process's commits appear on the open agents list and on the open
        timeline, neither of which is reloaded."""
        enter(driver, desk)
        db = str(desk.process.args[4])  # type: ignore[index]
        # Asked in one script each time: the live swap replaces the elements under a finder.
        for path, shows in [
            ("/", "[...document.querySelectorAll('table.agents a')].some(a => a.text === 'w')"),
            ("/agent?id=w", "document.querySelector('li#v2') !== null"),
        ]:
            driver.get(desk.base + path)
            wait_for(
                driver, lambda d: d.execute_script("return document.readyState") == "complete"
            )
            time.sleep(1)  # the live stream connects
            driver.execute_script("window.notReloaded = true")
            assert write_turns(db, 1).returncode == 0
            wait_for(driver, lambda d, shows=shows: d.execute_script(f"return {shows}"))
            assert driver.execute_script("return window.notReloaded") is True

    def test_what_the_user_opened_stays_open_through_a_commit(
        self, driver: Any, desk: Server
    ) -> None:
        """A fold the user opened (an approval's arguments on the waiting page) stays
        open, and one the user closed (on the agent's page, open by default) stays
        closed, when another process's commit refreshes the page."""
        enter(driver, desk)
        db = str(desk.process.args[4])  # type: ignore[index]
        for path, fold, opened in [
            ("/waiting", "#approvals details.json", True),
            (f"/agent?id={DESK}", "#waiting article.approval details.json", False),
        ]:
            driver.get(desk.base + path)
            wait_for(
                driver, lambda d: d.execute_script("return document.readyState") == "complete"
            )
            time.sleep(1)  # the live stream connects
            toggled = driver.find_element("css selector", f"{fold} summary")
            toggled.click()
            driver.execute_script("document.getElementById('live').dataset.before = 'yes'")
            assert write_turns(db, 1).returncode == 0
            # The live part is replaced (the mark on the old one is gone) ...
            wait_for(
                driver,
                lambda d: (
                    d.execute_script("return document.getElementById('live').dataset.before")
                    is None
                ),
            )
            # ... and the fold is as the user left it.
            state = driver.execute_script(f"return document.querySelector('{fold}').open")
            assert state is opened, (path, state)
            if opened:
                shot(driver, "live-kept-open")


class Address(pydantic.BaseModel):
    city: str
    zip: str = pydantic.Field(pattern=r"^[0-9]{5}$")


class Params(pydantic.BaseModel):
    """The parameters of a tool, as effectful makes their schema: a pydantic model."""

    model_config = pydantic.ConfigDict(extra="forbid")
    order: str = pydantic.Field(min_length=1, max_length=10)
    amount: float = pydantic.Field(ge=0, multiple_of=0.1)
    count: int = 1
    note: str | None = None
    kind: Literal["full", "partial"] = "full"
    tags: list[str] = []
    per_item: dict[str, int] = {}
    pair: tuple[int, str] | None = None
    ship_to: Address | None = None


#: Arguments for Params: some fit, some do not, each in one way.
ARGUMENTS: list[Any] = [
    {"order": "A-1", "amount": 200},
    {"order": "A-1", "amount": 0.3, "count": 2, "note": None, "kind": "partial"},
    {"order": "A-1", "amount": 1, "tags": ["a", "b"], "per_item": {"x": 1}, "pair": [1, "a"]},
    {"order": "A-1", "amount": 1, "ship_to": {"city": "Lyon", "zip": "69001"}},
    {"order": "A-1", "amount": 1.0, "count": 3.0},
    {"order": "A-1", "amount": "200"},
    {"amount": 200},
    {"order": "A-1", "amount": 200, "currency": "EUR"},
    {"order": "", "amount": 1},
    {"order": "A-1-too-long-for-it", "amount": 1},
    {"order": "A-1", "amount": -1},
    {"order": "A-1", "amount": 0.25},
    {"order": "A-1", "amount": 1, "count": 1.5},
    {"order": "A-1", "amount": 1, "kind": "most"},
    {"order": "A-1", "amount": 1, "tags": [1]},
    {"order": "A-1", "amount": 1, "per_item": {"x": "one"}},
    {"order": "A-1", "amount": 1, "pair": ["a", 1]},
    {"order": "A-1", "amount": 1, "note": 5},
    {"order": "A-1", "amount": 1, "ship_to": {"zip": "69001"}},
    {"order": "A-1", "amount": 1, "ship_to": {"city": "Lyon", "zip": "6900"}},
    {"order": "A-1", "amount": True},
    [1, 2],
    None,
]


class TestFormChecks:
    def test_the_pages_schema_check_agrees_with_the_library(
        self, driver: Any, demo: Server
    ) -> None:
        """The page's check of edited arguments (static/actions.js) refuses exactly what
        the library's (jsonschema) refuses, on a schema with every kind of parameter
        a tool's signature makes."""
        import jsonschema

        enter(driver, demo)
        schema = Params.model_json_schema()
        library = jsonschema.Draft202012Validator(schema)
        assert len(ARGUMENTS) > 20
        for arguments in ARGUMENTS:
            page = driver.execute_script(
                "return window.effectfulDurableMisfits(arguments[0], arguments[1])",
                schema,
                arguments,
            )
            refused = list(library.iter_errors(arguments))
            assert bool(page) == bool(refused), (arguments, page, [e.message for e in refused])


def test_screenshots_are_pictures() -> None:
    """Each saved screenshot is a PNG (when the browser tests ran)."""
    for picture in browser.screenshots().glob("*.png"):
        assert Path(picture).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
