"""Deciding from the page, in a real browser (headless chromium), on SQLite and PostgreSQL.

The approvals example (examples/approvals/) runs as its README says, the page taking
the command line's place: two refunds wait; one is approved with an edited amount and
the other denied, while a second tab that missed the news tries to decide it too; an
event is sent; the example's runner resumes the turns, and the open page shows the
result. Then a fork and a rollback, a form from another site, a form without its token,
and the page read-only. The tests of this module are those steps, in order, over one
database per backend; screenshots of the inbox, a misfit on the approve form, and a
decided approval are saved (tests/support/browser.py says where).
"""

import contextlib
import http.server
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import click, enter, shot, shot_of, text_of, texts, wait_for
from ui_forms import dump
from ui_server import ROOT, Server, cli_json, serving

from effectful_durable import Store

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "approvals" / "refunds.py"
REASON = "Order B-2001 was delivered 44 days ago; our limit is 30 days. We repair boots free."
CLEO = {"customer": "Cleo", "text": "Please refund 20 EUR on order C-3001."}


@dataclass
class Refunds:
    """The example's database, its ledger, and the page over it (``--by alice``)."""

    backend: str
    db: str
    folder: Path
    server: Server

    def run(self, step: str) -> str:
        """Run a step of the example (``ask`` or ``run``) in a process of its own."""
        ran = subprocess.run(
            [sys.executable, str(EXAMPLE), step, "--db", self.db, "--ledger", str(self.ledger)],
            capture_output=True,
            text=True,
            cwd=self.folder,
            env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
            timeout=300,
        )
        assert ran.returncode == 0, ran.stderr
        return ran.stdout

    @property
    def ledger(self) -> Path:
        return self.folder / "payments.json"

    def paid(self) -> list[tuple[str, float, str]]:
        return [(p["order"], p["amount"], p["key"]) for p in json.loads(self.ledger.read_text())]

    def approval_of(self, agent_id: str) -> str:
        """The id of the agent's refund that waits (or waited)."""
        with Store(self.db, readonly=True) as store:
            (found,) = [a for a in store.approvals(status=None) if a.agent_id == agent_id]
        return found.approval_id

    def screenshot(self, driver: Any, name: str, selector: str | None = None) -> None:
        """Save a screenshot for the docs, of the page or of the element ``selector``
        finds (SQLite's run only: one copy of each)."""
        if self.backend != "sqlite":
            return
        if selector is None:
            shot(driver, name)
        else:
            wait_for(driver, lambda d: shot_of(d.find_element("css selector", selector), name))


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def refunds(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The example's first step done (two refunds wait), and the page served over it."""
    folder = tmp_path_factory.mktemp(f"refunds-{request.param}")
    if request.param == "sqlite":
        db = str(folder / "refunds.db")
    else:
        db = request.getfixturevalue("postgres_server").new_database()
    with contextlib.ExitStack() as stack:
        example = Refunds(request.param, db, folder, None)  # type: ignore[arg-type]
        example.run("ask")
        example.server = stack.enter_context(serving(db, "--by", "alice"))
        yield example


def card(driver: Any, agent_id: str) -> Any:
    """The inbox's card of the agent's refund."""
    for found in driver.find_elements("css selector", "article.approval"):
        if f"for {agent_id}" in found.find_element("tag name", "header").text:
            return found
    raise AssertionError(f"no card for {agent_id}")


def type_into(field: Any, text: str) -> None:
    """Replace what a field holds with ``text``, as a person types it."""
    from selenium.webdriver.common.keys import Keys

    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE)
    field.send_keys(text)


def submit(form: Any) -> None:
    """Press the form's button."""
    form.find_element("css selector", "button[type=submit]").click()


class TestRefundsFromThePage:
    def test_the_inbox_shows_what_waits(self, driver: Any, refunds: Refunds) -> None:
        """Both refunds, oldest first: agent, tool, reason, the arguments as JSON, and the
        turn that asked; the forms to decide each; the decider's name."""
        enter(driver, refunds.server)
        driver.get(refunds.server.base + "/inbox")
        cards = driver.find_elements("css selector", "#pending article.approval")
        assert [c.get_attribute("id") for c in cards] == [
            refunds.approval_of("support-ann"),
            refunds.approval_of("support-ben"),
        ]
        ann = cards[0].text
        assert "refund for support-ann" in ann
        assert "refunds over 100 EUR need a person's approval" in ann
        assert '"amount": 250.0' in ann
        assert "Please refund 35 EUR on order A-1001 and 250 EUR on order A-1002." in ann
        assert "Approve" in ann and "Deny" in ann
        assert "You decide as alice" in text_of(driver)
        refunds.screenshot(driver, "inbox")

    def test_a_misfit_is_shown_before_anything_is_sent(
        self, driver: Any, refunds: Refunds
    ) -> None:
        """Edited arguments that do not fit the tool's schema are refused in the page,
        saying why, and nothing is written."""
        before = dump(refunds.db)
        driver.get(refunds.server.base + "/inbox")
        ann = refunds.approval_of("support-ann")
        form = driver.find_element("id", f"approve-{ann}")  # kept as is by live updates
        form.find_element("tag name", "summary").click()
        field = form.find_element("tag name", "textarea")
        type_into(field, '{"order": "A-1002", "amount": 200, "currency": "EUR"}')
        submit(form)
        misfit = form.find_element("css selector", ".misfit")
        assert misfit.is_displayed()
        assert misfit.text == "currency: is not a parameter of the tool. Nothing was sent."
        type_into(field, '{\n  "order": "A-1002",\n  "amount": "200 EUR"\n}')
        submit(form)
        assert misfit.text == (
            'amount: must be a number, not a string ("200 EUR"). Nothing was sent.'
        )
        assert driver.current_url.endswith("/inbox")
        refunds.screenshot(driver, "approve-misfit", f"article[id='{ann}']")
        assert dump(refunds.db) == before

    def test_decide_race_send_and_resume(self, driver: Any, refunds: Refunds) -> None:
        """Approve Ann's refund with an edited amount; deny Ben's while a second tab that
        missed it tries to approve it (and learns who decided first); send Cleo's event.
        A runner process then resumes both turns and delivers the event: the open page
        shows the resumed turn without a reload, the ledger the refund paid once, with
        the edited amount, and Ben's answer the reason."""
        base = refunds.server.base
        ann, ben = refunds.approval_of("support-ann"), refunds.approval_of("support-ben")
        first = driver.current_window_handle

        # Approve Ann's refund with 200 EUR instead of 250.
        driver.get(base + "/inbox")
        form = driver.find_element("id", f"approve-{ann}")
        form.find_element("css selector", "input[name=note]").send_keys("goodwill: 200 of 250")
        form.find_element("tag name", "summary").click()
        type_into(form.find_element("tag name", "textarea"), '{"order": "A-1002", "amount": 200}')
        submit(form)
        wait_for(driver, lambda d: f"/approval?id={ann}" in d.current_url)
        shown = text_of(driver)
        assert "Approved refund of support-ann as alice, with the arguments you edited." in shown
        assert "Approved by alice" in shown and "Waiting for a runner" in shown

        # A second tab opens Ben's refund; its live updates are cut (a laptop asleep).
        driver.switch_to.new_window("tab")
        second = driver.current_window_handle
        driver.execute_cdp_cmd("Network.enable", {})
        driver.execute_cdp_cmd("Network.setBlockedURLs", {"urls": ["*/-/live*"]})
        driver.get(base + f"/approval?id={ben}")
        assert driver.find_elements("css selector", "form.approve")

        # The first tab denies it.
        driver.switch_to.window(first)
        driver.get(base + f"/approval?id={ben}")
        deny = driver.find_element("css selector", "form.deny")
        deny.find_element("tag name", "textarea").send_keys(REASON)
        submit(deny)
        wait_for(driver, lambda d: "Denied refund of support-ben as alice." in text_of(d))

        # The second tab approves it: too late, and it says who decided first, and when.
        driver.switch_to.window(second)
        before = dump(refunds.db)
        submit(driver.find_element("css selector", "form.approve"))
        wait_for(driver, lambda d: d.current_url.endswith("/approve"))
        with Store(refunds.db, readonly=True) as store:
            decided = store.approval(ben)
        assert decided.decided_at is not None
        when = f"{decided.decided_at:%Y-%m-%d %H:%M:%S} UTC"
        shown = text_of(driver)
        assert f"Not done: approval {ben} is denied already by alice at {when}" in shown
        assert "Denied by alice" in shown and not driver.find_elements("css selector", "form")
        assert dump(refunds.db) == before
        driver.close()
        driver.switch_to.window(first)

        # Cleo writes in: an event for an agent the database does not know yet.
        driver.get(base + "/send-event")
        form = driver.find_element("id", "send-event")
        form.find_element("css selector", "input[name=agent]").send_keys("support-cleo")
        form.find_element("css selector", "input[name=create]").click()
        form.find_element("css selector", "input[name=name]").send_keys("refund_request")
        form.find_element("css selector", "textarea[name=payload]").send_keys(json.dumps(CLEO))
        submit(form)
        wait_for(driver, lambda d: "/waiting" in d.current_url)
        assert "'refund_request' to support-cleo pending" in text_of(driver)
        (events,) = texts(driver, "#events")
        assert "support-cleo" in events and "refund_request" in events

        # A runner resumes the turns; the open page shows Ann's, without a reload.
        driver.get(base + f"/approval?id={ann}")
        wait_for(driver, lambda d: d.execute_script("return document.readyState") == "complete")
        driver.execute_script("window.notReloaded = true")
        assert "runner: 3 turns, 0 errors" in refunds.run("run")
        answer = "Dear Ann, Refunded 35.00 EUR on A-1001. Refunded 200.00 EUR on A-1002."
        wait_for(driver, lambda d: answer in text_of(d))
        assert "Resumed in v2" in text_of(driver)
        assert driver.execute_script("return window.notReloaded") is True
        refunds.screenshot(driver, "approval-decided", "article.approval")
        assert refunds.paid() == [
            ("A-1001", 35.0, "support-ann/A-1001/35.0"),
            ("A-1002", 200.0, ann),  # once, with the edited amount, keyed by the approval
            ("C-3001", 20.0, "support-cleo/C-3001/20.0"),
        ]
        with Store(refunds.db, readonly=True) as store:
            said = store.history("support-ben")[-1]["content"]
            assert store.events() == []
        assert f"I cannot refund order B-2001: {REASON}" in json.dumps(said)

        # The audit trail lists both decisions, the newest first.
        driver.get(base + "/inbox?by=alice")
        rows = texts(driver, "table.decided tbody tr")
        assert [row.split("\t")[1] for row in rows] == ["support-ben", "support-ann"]
        assert "edited" in rows[1] and "resumed in v2" in rows[1]

    def test_fork_and_rollback(self, driver: Any, refunds: Refunds) -> None:
        """Fork Ann at v2 and roll her back to v1 from the page; the command line's
        versions and agents then agree with what the page shows."""
        base = refunds.server.base
        driver.get(base + "/versions?id=support-ann")
        click(driver, "xpath", "//tr[td/a[text()='v2']]//a[text()='fork…']")
        form = driver.find_element("id", "fork")
        form.find_element("css selector", "input[name=new_id]").send_keys("support-ann-copy")
        submit(form)
        wait_for(driver, lambda d: "versions?id=support-ann-copy" in d.current_url)
        assert "support-ann-copy: version 1 committed, a copy of support-ann version 2" in (
            text_of(driver)
        )

        driver.get(base + "/versions?id=support-ann")
        click(driver, "xpath", "//tr[td/a[text()='v1']]//a[text()='roll back or fork…']")
        assert "A rollback commits v3, equal to v1" in text_of(driver)
        submit(driver.find_element("id", "rollback"))
        wait_for(driver, lambda d: "support-ann: version 3 committed" in text_of(d))
        shown = [row.split("\t")[:2] for row in texts(driver, "table tbody tr")]
        assert shown == [["v3", "rollback"], ["v2", "turn"], ["v1", "turn"]]

        versions = cli_json("versions", refunds.db, "support-ann")
        assert [(v["version"], v["kind"], v["detail"]) for v in versions][-1] == (
            3,
            "rollback",
            {"to": 1},
        )
        agents = {a["agent_id"]: a["version"] for a in cli_json("agents", refunds.db)}
        assert agents["support-ann-copy"] == 1 and agents["support-ann"] == 3
        driver.get(base + "/")
        assert texts(driver, "table.agents td:first-child > a") == sorted(agents)

    def test_a_form_from_another_site_changes_nothing(self, driver: Any, refunds: Refunds) -> None:
        """A page on another port of this machine (the browser sends the cookie there)
        posts a denial with the page's own form token: refused, as another origin. The
        page's own form without its token: refused. Nothing is written."""
        base = refunds.server.base
        ann = refunds.approval_of("support-ann")  # waits again since the rollback
        driver.get(base + f"/approval?id={ann}")
        token = driver.find_element("css selector", "form.deny input[name=csrf]")
        leaked = token.get_attribute("value")
        before = dump(refunds.db)
        attack = (
            f'<form method="post" action="{base}/deny">'
            f'<input name="csrf" value="{leaked}"><input name="approval" value="{ann}">'
            '<input name="reason" value="forged"></form>'
            "<script>document.forms[0].submit()</script>"
        )
        with foreign_site(attack) as site:
            driver.get(site)
            wait_for(driver, lambda d: "Refused: not sent by this page" in text_of(d))
        assert dump(refunds.db) == before

        driver.get(base + f"/approval?id={ann}")
        form = driver.find_element("css selector", "form.deny")
        form.find_element("tag name", "textarea").send_keys("no token")
        driver.execute_script("arguments[0].querySelector('[name=csrf]').remove()", form)
        submit(form)
        wait_for(driver, lambda d: "Refused: this form is out of date" in text_of(d))
        assert dump(refunds.db) == before

    def test_read_only(self, driver: Any, refunds: Refunds) -> None:
        """--read-only: the pages say so and offer no form; the server refuses a post
        from the page itself; nothing is written."""
        before = dump(refunds.db)
        ann = refunds.approval_of("support-ann")
        with serving(refunds.db, "--read-only") as server:
            enter(driver, server)
            driver.get(server.base + "/inbox")
            shown = text_of(driver)
            assert "read-only" in shown and "decide them from the command line" in shown
            assert not driver.find_elements("css selector", "form[method=post]")
            driver.get(server.base + f"/approval?id={ann}")
            status = driver.execute_script(
                "return fetch('/deny', {method: 'POST', body: new URLSearchParams("
                f"{{approval: '{ann}', reason: 'no'}})}}).then(r => r.status)"
            )
            assert status == 403
        assert dump(refunds.db) == before


@contextlib.contextmanager
def foreign_site(page: str) -> Iterator[str]:
    """Serve ``page`` at another port of this machine: another origin, the same site."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = page.encode()
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
