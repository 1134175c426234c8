"""Forgetting a person from the page, in a real browser (headless chromium), on SQLite and
PostgreSQL.

The approvals example (examples/approvals/) has two customers' agents, each with a
refund that waits; each is named with its customer's subject, and a phone desk agent
holds a conversation with each customer, named with that customer's subject too. A
privacy officer finds what holds Ann's subject from the agents list, opens the erase
page, types the subject wrong and then right, and reads the receipt; the command line
agrees. Then Ben's agent is erased from its own page, a mistyped id refused first;
then Ben's call with the phone desk, found from his subject, alone: refused while a
turn of the desk runs, done once it is over. A read-only page offers no form. The
tests of this module are those steps, in order, over one database per backend;
screenshots of the subject's holders, the erase page, a refusal on it, a receipt and
the list of receipts are saved (tests/support/browser.py says where).
"""

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from browser import enter, shot, text_of, wait_for
from helpers import held_elsewhere
from ui_forms import dump
from ui_server import ROOT, Server, cli_json, serving

from effectful_durable import Store
from effectful_durable.store.history import HistoryChange

pytestmark = pytest.mark.slow

EXAMPLE = ROOT / "examples" / "approvals" / "refunds.py"
ANN, BEN = "customer:ann", "customer:ben"
PHONE = "phone-desk"


@dataclass
class Office:
    """The example's database, named with subjects, and the page over it."""

    backend: str
    db: str
    server: Server

    def screenshot(self, driver: Any, name: str) -> None:
        """Save a screenshot of the page for the docs (SQLite's run only: one copy)."""
        if self.backend == "sqlite":
            shot(driver, name)


def say(store: Store, agent_id: str, conversation: str, asked: str, answered: str) -> None:
    """Commit one turn of ``agent_id`` in ``conversation``: a question and its answer."""
    with store.turns.start(
        agent_id, template="call", arguments={}, conversation=conversation
    ) as start:
        messages = [
            (start.version, {"id": f"{conversation}-q", "role": "user", "content": asked}),
            (
                start.version + 0.5,
                {"id": f"{conversation}-a", "role": "assistant", "content": answered},
            ),
        ]
        change = HistoryChange(added=messages, removed=[], removed_count=0)
        store.turns.commit(
            agent_id,
            base_version=start.version,
            template="call",
            change=change,
            state=None,
            conversation=conversation,
        )


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def office(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The example's first step done, its agents and the phone desk's calls named with
    their customers' subjects, and the page served over it."""
    folder: Path = tmp_path_factory.mktemp(f"forgetting-{request.param}")
    if request.param == "sqlite":
        db = str(folder / "refunds.db")
    else:
        db = request.getfixturevalue("postgres_server").new_database()
    subprocess.run(
        [sys.executable, str(EXAMPLE), "ask", "--db", db, "--ledger", str(folder / "pay.json")],
        check=True,
        capture_output=True,
        cwd=folder,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
        timeout=300,
    )
    with Store(db) as store:
        say(store, PHONE, "call-ann", "Hi, it's Ann: where is my coat?", "On its way, Ann.")
        say(store, PHONE, "call-ben", "Ben here, about my boots.", "Your boots are at repair.")
        store.set_subject("support-ann", ANN)
        store.set_subject("support-ben", BEN)
        store.set_subject(PHONE, ANN, conversation="call-ann")
        store.set_subject(PHONE, BEN, conversation="call-ben")
    with serving(db, "--by", "alice") as server:
        yield Office(request.param, db, server)


def submit(form: Any) -> None:
    """Press the form's button."""
    form.find_element("css selector", "button[type=submit]").click()


def confirm(driver: Any, typed: str) -> None:
    """Type ``typed`` into the erase form's confirmation, and send it."""
    from selenium.webdriver.common.keys import Keys

    form = driver.find_element("id", "erase")
    field = form.find_element("css selector", "input[name=typed]")
    field.send_keys(Keys.CONTROL, "a")
    field.send_keys(Keys.DELETE)
    field.send_keys(typed)
    submit(form)


class TestForgettingAPerson:
    """A privacy officer's steps, in order, over one database per backend."""

    def test_find_erase_and_read_the_receipt(self, driver: Any, office: Office) -> None:
        """The officer filters the agents by Ann's subject, opens the erase page, which
        lists Ann's agent whole and her call alone; a mistyped subject erases nothing;
        typed right, both go, and the receipt shows what was erased, counted, without
        any of it; the command line lists the same receipt and nothing that holds Ann."""
        enter(driver, office.server)
        assert "subject customer:ann" in text_of(driver)
        field = driver.find_element("css selector", "form.subject-filter input[name=subject]")
        field.send_keys(ANN)
        submit(driver.find_element("css selector", "form.subject-filter"))
        wait_for(driver, lambda d: "What holds subject customer:ann" in text_of(d))
        shown = text_of(driver)
        assert "1 agent whose subject it is, and 1 conversation of other agents" in shown
        rows = [r.text for r in driver.find_elements("css selector", "table.holdings tbody tr")]
        assert len(rows) == 2
        assert rows[0].startswith(PHONE) and "conversation call-ann alone" in rows[0]
        assert rows[1].startswith("support-ann") and "the whole agent" in rows[1]
        assert "1 approval" in rows[1]
        office.screenshot(driver, "subject")

        driver.find_element("link text", f"Erase everything {ANN} holds…").click()
        wait_for(driver, lambda d: "/erase?subject=" in d.current_url)
        assert "Erase everything subject customer:ann holds" in text_of(driver)
        assert "Its agent's shared fields and memory stay" in text_of(driver)
        assert "an approval erased is never decided" in text_of(driver)
        office.screenshot(driver, "erase")

        before = dump(office.db)
        confirm(driver, "customer:an")
        wait_for(driver, lambda d: "Not done: type 'customer:ann' to confirm" in text_of(d))
        assert dump(office.db) == before

        confirm(driver, ANN)
        wait_for(driver, lambda d: "/erasure?id=" in d.current_url)
        shown = text_of(driver)
        (receipt,) = cli_json("erasures", office.db)
        assert f"Erased 1 agent and 1 conversation ({sum(receipt['counts'].values())} rows)" in (
            shown
        )
        assert f"Erasure {receipt['erasure_id']}" in shown and receipt["digest"] in shown
        assert receipt["agents"] == ["support-ann"]
        assert receipt["conversations"] == [[PHONE, "call-ann"]]
        assert f"messages · {receipt['counts']['messages']}" in shown
        assert "matches the receipt" in shown
        if receipt["scrubbed_at"] is None:
            assert "pending" in shown
        else:
            assert "the erased bytes left the database's live files" in shown
        for erased in (ANN, "coat", "A-1002", "Hi, it's Ann"):
            assert erased not in shown, erased
        office.screenshot(driver, "erasure")
        assert cli_json("agents", office.db, "--subject", ANN) == []
        assert [a["agent_id"] for a in cli_json("agents", office.db)] == [PHONE, "support-ben"]

        driver.find_element("link text", "Erasures").click()
        wait_for(driver, lambda d: d.current_url.endswith("/erasures"))
        assert receipt["erasure_id"] in text_of(driver)
        assert "1 erasure, newest first" in text_of(driver)

    def test_erase_an_agent_from_its_page(self, driver: Any, office: Office) -> None:
        """The officer opens Ben's agent from the list and its Erase link: the page counts
        what goes (the agent whole, its messages, its refund that waits); a mistyped id is
        refused on the form, which keeps what was typed, and erases nothing; typed right,
        the agent goes, its refund with it, and the receipt names it."""
        enter(driver, office.server)
        driver.find_element("link text", "support-ben").click()
        wait_for(driver, lambda d: "Subject customer:ben" in text_of(d))
        driver.find_element("link text", "Erase this agent…").click()
        wait_for(driver, lambda d: "Erase agent support-ben" in text_of(d))
        shown = text_of(driver)
        (row,) = [r.text for r in driver.find_elements("css selector", "table.holdings tbody tr")]
        assert row.startswith("support-ben") and "the whole agent" in row
        assert "1 approval" in row
        assert "Of each agent erased whole: every version" in shown
        assert "an approval erased is never decided" in shown
        assert "Type support-ben to confirm" in shown

        before = dump(office.db)
        confirm(driver, "Support-Ben")
        wait_for(driver, lambda d: "Not done: type 'support-ben' to confirm" in text_of(d))
        assert "nothing was erased" in text_of(driver)
        field = driver.find_element("css selector", "#erase input[name=typed]")
        assert field.get_attribute("value") == "Support-Ben"
        assert dump(office.db) == before
        office.screenshot(driver, "erase-refused")

        confirm(driver, "support-ben")
        wait_for(driver, lambda d: "/erasure?id=" in d.current_url)
        shown = text_of(driver)
        assert "Erased 1 agent and 0 conversations" in shown
        assert "asked\nagent support-ben" in shown
        first, latest = cli_json("erasures", office.db)
        assert latest["agents"] == ["support-ben"] and latest["conversations"] == []
        assert latest["erasure_id"] in shown and latest["digest"] in shown
        assert latest["previous"] == first["digest"]  # chained, and linked to
        assert f"previous receipt\n{first['digest']} · {first['erasure_id']}" in shown
        assert "Order B-2001" not in shown
        assert [a["agent_id"] for a in cli_json("agents", office.db)] == [PHONE]
        with Store(office.db, readonly=True) as store:
            assert store.approvals() == []  # Ann's refund and Ben's: erased, never decided
            assert store.holders(BEN) == [(PHONE, "call-ben")]
        driver.get(office.server.base + "/agent?id=support-ben")
        assert "no agent 'support-ben'" in text_of(driver)

    def test_a_running_turn_refuses_the_erasure(self, driver: Any, office: Office) -> None:
        """Ben's call with the phone desk, opened from his subject's holders, is erased
        alone: while a turn of the desk runs the erasure is refused, saying so, and erases
        nothing; once the turn is over it goes through, and the desk keeps its
        versions."""
        base = office.server.base
        enter(driver, office.server)
        driver.find_element("link text", BEN).click()
        wait_for(driver, lambda d: "What holds subject customer:ben" in text_of(d))
        driver.find_element("css selector", "table.holdings a").click()
        wait_for(driver, lambda d: "conversation call-ben" in text_of(d))
        assert "/agent?id=phone-desk&conversation=call-ben" in driver.current_url
        driver.find_element("link text", "Erase conversation call-ben…").click()
        wait_for(driver, lambda d: "Erase conversation call-ben of phone-desk" in text_of(d))
        shown = text_of(driver)
        assert "conversation call-ben alone" in shown
        assert "Its agent's shared fields and memory stay" in shown
        assert "Of each agent erased whole" not in shown

        with held_elsewhere(office.db, PHONE):
            before = dump(office.db)
            confirm(driver, "call-ben")
            wait_for(driver, lambda d: f"Not done: agent '{PHONE}' is in use by" in text_of(d))
            shown = text_of(driver)
            assert "nothing was erased" in shown and "try again once that turn has finished" in (
                shown
            )
            assert dump(office.db) == before
        confirm(driver, "call-ben")
        wait_for(driver, lambda d: "/erasure?id=" in d.current_url)
        assert "Erased 0 agents and 1 conversation" in text_of(driver)
        assert "Your boots are at repair" not in text_of(driver)
        with Store(office.db, readonly=True) as store:
            assert [r.conversations for r in store.erasures()][-1] == ((PHONE, "call-ben"),)
            assert store.holders(BEN) == []
            assert store.conversations(PHONE) == []
            assert store.version_page(PHONE, limit=1)[0].version == 2  # its versions stay

        driver.get(base + "/erasures")
        wait_for(driver, lambda d: "3 erasures, newest first" in text_of(d))
        rows = [r.text for r in driver.find_elements("css selector", "table.erasures tbody tr")]
        assert len(rows) == 3
        assert "conversation call-ben of phone-desk" in rows[0]
        assert "0 agents · 1 conversation\n0 versions" in rows[0]
        assert "agent support-ben" in rows[1] and "1 agent · 0 conversations" in rows[1]
        assert "a subject" in rows[2] and "1 agent · 1 conversation" in rows[2]
        office.screenshot(driver, "erasures")

    def test_read_only(self, driver: Any, office: Office) -> None:
        """--read-only: the erase pages say what would go and the command to use; no form,
        and the agent's page offers no Erase link."""
        with serving(office.db, "--read-only") as server:
            enter(driver, server)
            driver.get(server.base + f"/erase?subject={BEN}")
            shown = text_of(driver)
            assert "Erase everything subject customer:ben holds" in shown
            assert "effectful-durable erase DB --subject customer:ben --yes" in shown
            assert not driver.find_elements("css selector", "form[method=post]")
            driver.get(server.base + f"/erase?id={PHONE}")
            shown = text_of(driver)
            assert f"Erase agent {PHONE}" in shown and "the whole agent" in shown
            assert f"effectful-durable erase DB --agent {PHONE} --yes" in shown
            assert not driver.find_elements("css selector", "form[method=post]")
            driver.get(server.base + f"/agent?id={PHONE}")
            assert "read-only" in text_of(driver)
            assert not driver.find_elements("partial link text", "Erase")
