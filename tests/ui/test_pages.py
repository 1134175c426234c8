"""The page over HTTP, on SQLite and PostgreSQL: every route, who may see it, and what a
bad request gets. Driven in-process through Starlette's TestClient."""

from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import commit_message, edit_rows
from starlette.testclient import TestClient
from ui_content import BOB, BROKEN, DESK, HTML, HTML_AGENT

from effectful_durable import Store
from effectful_durable.ui import make_app

pytestmark = pytest.mark.slow

TOKEN = "the-token"
PORT = 8123
BASE = f"http://127.0.0.1:{PORT}"
COOKIE = f"effectful_durable_ui_{PORT}"


def client_for(db: str, *, read_only: bool = False) -> Iterator[TestClient]:
    """A client let in (through the token) to the page over ``db``: read-write as the
    command serves it, unless ``read_only``."""
    with Store(db, readonly=True) as store:
        writer = None if read_only else Store(db)
        try:
            app = make_app(store, token=TOKEN, port=PORT, writer=writer, by="alice")
            with TestClient(app, base_url=BASE, raise_server_exceptions=False) as client:
                entered = client.get(f"/?token={TOKEN}", follow_redirects=False)
                assert entered.status_code == 303
                yield client
        finally:
            if writer is not None:
                writer.close()


@pytest.fixture(scope="module")
def client(content: str) -> Iterator[TestClient]:
    yield from client_for(content)


def q(text: str) -> str:
    from urllib.parse import quote

    return quote(text, safe="")


#: Every route, with what its page must say.
ROUTES = [
    ("/", ["desk", "1 approval", "turn failed"]),
    ("/?q=desk&attention=1&sort=-updated", ["desk"]),
    ("/?page=1&sort=version", ["broken"]),
    (f"/agent?id={DESK}", ["Waits for a person", "refund", "suspended", "self__lookup"]),
    (f"/agent?id={DESK}&conversation=chat", ["messages replaced by a summary"]),
    (f"/agent?id={DESK}&errors=1", ["Tool execution failed", "1 of 6 match"]),
    (f"/agent?id={DESK}&role=tool&tool=self__lookup&text=delivered", ["1 of"]),
    (f"/agent?id={DESK}&before=3", ["v2", "v1"]),
    (f"/agent/compacted?id={DESK}&version=9&conversation=chat", ["chat message 0"]),
    (f"/agent?id={q(HTML_AGENT)}", ["hello"]),
    (f"/agent?id={BROKEN}", ["A turn failed", "ValueError"]),
    (f"/versions?id={DESK}", ["compaction", "diff with v8"]),
    (f"/diff?id={DESK}&from=1&to=9", ["Conversation chat", "Alarms", "apr_"]),
    (f"/diff?id={DESK}&from=9&to=1", ["removed", "no longer pending"]),
    (f"/state?id={DESK}", ["tickets", "customer", "refunds"]),
    (f"/state?id={DESK}&version=1&sql=SELECT+note+FROM+refunds", ["1 row", "note"]),
    (f"/state?id={DESK}&sql=DELETE+FROM+refunds", ["refused"]),
    (f"/table?id={DESK}&name=refunds", ["order_id", "A-1"]),
    ("/waiting", ["refund", "payment_received", "check back on A-1", "failed", "intake"]),
    ("/workflow?name=intake", ["desk@chat#0", "done"]),
    ("/?subject=user:ann", ["2 agents whose subject it is", "the whole agent", "alone"]),
    (f"/?subject={q(BOB)}", ["What holds subject user:bob&lt;script&gt;", "chat"]),
    (f"/erase?id={DESK}", ["Erase agent desk", "Type <code>desk</code> to confirm"]),
    (f"/erase?id={DESK}&conversation=chat", ["Erase conversation chat of desk"]),
    ("/erase?subject=user:ann", ["Erase everything subject user:ann holds"]),
    ("/erasures", ["No erasure yet"]),
]


class TestRoutes:
    @pytest.mark.parametrize(("path", "says"), ROUTES, ids=[p for p, _ in ROUTES])
    def test_each_page(self, client: TestClient, path: str, says: list[str]) -> None:
        """Each route answers 200 with what it shows; HTML from the database is escaped."""
        page = client.get(path)
        assert page.status_code == 200, page.text
        for text in says:
            assert text in page.text, text
        assert HTML not in page.text
        assert "<script>alert" not in page.text

    def test_html_shows_as_text(self, client: TestClient) -> None:
        """A message, an agent id, a tool argument, memory and SQL values holding HTML are
        shown escaped, as text."""
        escaped = "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;"
        pages = [
            client.get("/").text,
            client.get(f"/agent?id={DESK}").text,
            client.get(f"/agent?id={q(HTML_AGENT)}").text,
            client.get(f"/?subject={q(BOB)}").text,
            client.get("/?subject=user:ann").text,
            client.get(f"/state?id={DESK}&sql=SELECT+note+FROM+refunds").text,
        ]
        assert all(escaped in page for page in pages)

    def test_static_files(self, client: TestClient) -> None:
        """The vendored files are served from the package, cacheable."""
        for name in (
            "htmx.min.js",
            "htmx-ext-sse.min.js",
            "pico.classless.min.css",
            "app.css",
            "actions.js",
            "live.js",
        ):
            found = client.get(f"/-/static/{name}")
            assert found.status_code == 200 and found.content
            assert "no-store" not in found.headers.get("cache-control", "")


class TestAccess:
    def test_without_the_cookie_a_page_says_how_to_get_in(self, content: str) -> None:
        """No cookie: 403, and the page says to open the printed address."""
        with Store(content, readonly=True) as store:
            app = make_app(store, token=TOKEN, port=PORT)
            with TestClient(app, base_url=BASE) as stranger:
                for path in ("/", f"/agent?id={DESK}", "/-/live"):
                    page = stranger.get(path)
                    assert page.status_code == 403
                    assert "?token=" in page.text
                assert "desk" not in stranger.get("/").text
                assert stranger.get("/?token=wrong").status_code == 403
                assert stranger.get("/-/static/app.css").status_code == 200

    def test_the_token_is_exchanged_for_a_strict_cookie(self, content: str) -> None:
        """The printed address redirects to itself without the token, setting an
        HttpOnly, SameSite=Strict cookie; the cookie alone then lets the browser in."""
        with Store(content, readonly=True) as store:
            app = make_app(store, token=TOKEN, port=PORT)
            with TestClient(app, base_url=BASE) as browser:
                entered = browser.get(f"/agent?id={DESK}&token={TOKEN}", follow_redirects=False)
                assert entered.status_code == 303
                assert entered.headers["location"] == f"/agent?id={DESK}"
                cookie = entered.headers["set-cookie"]
                assert cookie.startswith(f"{COOKIE}=")
                assert "HttpOnly" in cookie and "SameSite=strict" in cookie
                assert TOKEN not in cookie
                assert browser.get(f"/agent?id={DESK}").status_code == 200
                away = browser.get(f"{BASE}//evil.example/?token={TOKEN}", follow_redirects=False)
                assert away.headers["location"] == "/evil.example/"

    @pytest.mark.parametrize(
        "host", ["localhost:8123", "127.0.0.1:8123", "[::1]:8123", "127.0.0.2", "LOCALHOST"]
    )
    def test_loopback_hosts(self, client: TestClient, host: str) -> None:
        """Every loopback name of this machine is let in."""
        assert client.get("/", headers={"host": host}).status_code == 200

    @pytest.mark.parametrize(
        "host", ["evil.example", "evil.example:8123", "127.0.0.1.evil.example", "10.0.0.1", ""]
    )
    def test_a_foreign_host_is_refused(self, client: TestClient, host: str) -> None:
        """Another host name (DNS rebinding) is refused even with the cookie."""
        page = client.get("/", headers={"host": host})
        assert page.status_code == 403
        assert "host name is not allowed" in page.text
        assert DESK not in page.text

    def test_a_host_it_was_started_for(self, content: str) -> None:
        """A --host name is let in besides the loopback ones."""
        with Store(content, readonly=True) as store:
            app = make_app(store, token=TOKEN, port=PORT, hosts=frozenset({"box.lan"}))
            with TestClient(app, base_url=f"http://box.lan:{PORT}") as browser:
                assert browser.get(f"/?token={TOKEN}").status_code == 200

    def test_no_cors_and_safe_headers(self, client: TestClient) -> None:
        """No answer allows another origin; each forbids framing, sniffing and caching."""
        page = client.get("/", headers={"origin": "http://evil.example"})
        assert not [h for h in page.headers if h.lower().startswith("access-control-")]
        assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
        assert "script-src 'self'" in page.headers["content-security-policy"]
        assert page.headers["x-content-type-options"] == "nosniff"
        assert page.headers["cache-control"] == "no-store"
        assert page.headers["referrer-policy"] == "same-origin"  # forms send their Origin
        preflight = client.options("/", headers={"origin": "http://evil.example"})
        assert not [h for h in preflight.headers if h.lower().startswith("access-control-")]

    def test_writes_from_another_origin_are_refused(self, client: TestClient) -> None:
        """A POST from another site, or from no page at all, is refused before any route
        (tests/ui/test_actions.py posts the forms themselves)."""
        foreign = client.post("/", headers={"origin": "http://evil.example"})
        assert foreign.status_code == 403 and "not sent by this page" in foreign.text
        assert client.post("/").status_code == 403  # no Origin, no Referer

    def test_read_only(self, content: str) -> None:
        """--read-only says so on every page and refuses writes from the page itself."""
        for client in client_for(content, read_only=True):
            assert "read-only" in client.get("/").text
            refused = client.post("/", headers={"origin": BASE})
            assert refused.status_code == 403 and "--read-only" in refused.text


class TestBadInput:
    @pytest.mark.parametrize(
        ("path", "status", "says"),
        [
            ("/agent?id=nobody", 404, "no agent &#39;nobody&#39;"),
            ("/agent", 400, "the parameter &#39;id&#39; is missing"),
            (f"/agent?id={DESK}&before=x", 400, "whole number"),
            (f"/agent?id={DESK}&before=0", 400, "whole number from 1"),
            (f"/agent?id={DESK}&role=robot", 400, "must be one of"),
            (f"/agent?id={DESK}&conversation=nope", 404, "no conversation"),
            ("/?page=0", 400, "whole number from 1"),
            ("/?page=9", 400, "no page 9"),
            ("/?sort=size", 400, "must be one of"),
            (f"/diff?id={DESK}&from=1&to=99", 404, "no version 99"),
            (f"/diff?id={DESK}&from=1", 400, "choose two versions"),
            (f"/versions?id={q(' x')}", 400, "invalid agent"),
            (f"/table?id={DESK}&name=nope", 404, "no SQL table"),
            ("/workflow?name=nope", 404, "no workflow"),
            (f"/?subject={q(' x')}", 400, "invalid subject"),
            ("/erase", 400, "name a subject (subject=) or an agent (id=)"),
            ("/erase?id=nobody", 404, "no agent &#39;nobody&#39;"),
            ("/erasure?id=era_nope", 404, "no erasure &#39;era_nope&#39;"),
            ("/erasures?page=2", 400, "no page 2"),
            ("/nowhere", 404, "No such page"),
        ],
    )
    def test_error_pages(self, client: TestClient, path: str, status: int, says: str) -> None:
        """A bad request gets a page that says what was wrong, never a traceback."""
        page = client.get(path)
        assert page.status_code == status, page.text
        assert says in page.text
        assert "Traceback" not in page.text

    def test_a_failure_is_a_page_without_a_traceback(
        self, content: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An unexpected exception is a 500 page; its details go to the terminal only."""
        for client in client_for(content):

            def broken(*args: object, **kwargs: object) -> None:
                raise RuntimeError("secret detail")

            monkeypatch.setattr(Store, "agent_page", broken)
            page = client.get("/")
            assert page.status_code == 500
            assert "Something went wrong" in page.text
            assert "secret detail" not in page.text and "Traceback" not in page.text


@pytest.mark.sqlite_only("row checksums are SQLite's")
def test_a_damaged_row_is_named_on_its_agent_page(store_url: str) -> None:
    """A message row that fails its checksum: that agent's page names it; the list and
    the other agents read as usual."""
    with Store(store_url) as store:
        commit_message(store, "hurt", "fine")
        commit_message(store, "well", "fine")
    edit_rows(store_url, "UPDATE messages SET body = '{}' WHERE agent_id = 'hurt'", foreign=True)
    for client in client_for(store_url):
        hurt = client.get("/agent?id=hurt")
        assert hurt.status_code == 500
        assert "a row of messages (agent &#39;hurt&#39;" in hurt.text
        assert client.get("/").status_code == 200
        assert client.get("/agent?id=well").status_code == 200


def test_paths_are_the_packages(tmp_path: Path) -> None:
    """Templates and static files are found beside the code (they ship as package data)."""
    from effectful_durable.ui import app, render

    assert (render.TEMPLATES / "base.html").is_file()
    assert (app.STATIC / "htmx.min.js").is_file()
