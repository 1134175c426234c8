"""The page's actions over HTTP, on SQLite and PostgreSQL: each calls the Store function of
its command and says what it did; bad input shows the library's error on the form and
writes nothing; no other origin, missing or stale form token, or read-only page acts.

Each test writes to a copy of the test content of its own (tests/support/ui_content.py).
"""

import contextlib
import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from helpers import edit_rows, held_elsewhere, is_postgres
from starlette.testclient import TestClient
from ui_content import ANN, BOB, BROKEN, DESK, HTML, HTML_AGENT
from ui_forms import copy_content, dump, fields, notice_in, problem_in, token_in

from effectful_durable import Store
from effectful_durable.ui import make_app

pytestmark = pytest.mark.slow

TOKEN = "the-token"
PORT = 8124
BASE = f"http://127.0.0.1:{PORT}"
#: The arguments the desk's refund waits with (tests/support/ui_content.py).
ASKED = {"order": "A-1", "amount": 250.0}


@pytest.fixture
def db(content: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A copy of the test content, on the content's backend, for one test to write to."""
    if is_postgres(content):
        target: str = request.getfixturevalue("postgres_url")
    else:
        target = str(tmp_path / "page.db")
    return copy_content(content, target)


class Page:
    """A browser let into the page over a database: it reads pages and posts forms."""

    def __init__(self, client: TestClient) -> None:
        self.client = client

    def get(self, path: str) -> httpx.Response:
        return self.client.get(path)

    def token(self) -> str:
        """The form token the page gives this browser."""
        return token_in(self.get("/send-event").text)

    def post(
        self, path: str, *, token: str | None = None, origin: str | None = BASE, **values: Any
    ) -> httpx.Response:
        """Post a form as the page's own would (its token, this origin), unless told."""
        data = fields(**values)
        data["csrf"] = self.token() if token is None else token
        if not data["csrf"]:
            del data["csrf"]
        headers = {"origin": origin} if origin else {}
        return self.client.post(path, data=data, headers=headers, follow_redirects=False)

    def act(self, path: str, **values: Any) -> httpx.Response:
        """Post a form that must succeed; the page it leads to."""
        answer = self.post(path, **values)
        assert answer.status_code == 303, problem_in(answer.text)
        return self.get(answer.headers["location"])


@contextlib.contextmanager
def page_over(db: str, *, read_only: bool = False, token: str = TOKEN) -> Iterator[Page]:
    """The page over ``db`` as ``effectful-durable ui --by alice`` serves it."""
    with Store(db, readonly=True) as store:
        writer = None if read_only else Store(db)
        try:
            app = make_app(store, token=token, port=PORT, writer=writer, by="alice")
            with TestClient(app, base_url=BASE, raise_server_exceptions=False) as client:
                assert client.get(f"/?token={token}", follow_redirects=False).status_code == 303
                yield Page(client)
        finally:
            if writer is not None:
                writer.close()


@pytest.fixture
def page(db: str) -> Iterator[Page]:
    with page_over(db) as page:
        yield page


def pending(db: str) -> str:
    """The id of the desk's refund that waits."""
    with Store(db, readonly=True) as store:
        (approval,) = store.approvals()
    return approval.approval_id


class TestInbox:
    def test_what_waits_with_why_and_the_forms(self, db: str, page: Page) -> None:
        """The inbox shows the refund, its reason, its arguments as JSON, the turn's last
        messages, and the forms that decide it, with the tool's schema for the page's check."""
        shown = page.get("/inbox").text
        assert "Waiting for a decision (1)" in shown
        assert "refunds need a person" in shown and "You decide as <strong>alice</strong>" in shown
        assert "&#34;amount&#34;: 250.0" in shown  # formatted JSON, escaped
        assert "Refund it, please." in shown  # the turn that asked
        assert 'action="/approve"' in shown and 'action="/deny"' in shown
        assert "data-schema=" in shown and "&#34;required&#34;" in shown
        assert HTML not in shown

    def test_decided_ones_filtered(self, db: str, page: Page) -> None:
        """The audit trail filters decisions by decision, decider, agent text and day."""
        approval_id = pending(db)
        page.act("/approve", approval=approval_id, note="fine")
        today = datetime.now(UTC).date()
        listed = {
            "": 1,
            "?status=approved": 1,
            "?status=denied": 0,
            "?by=ALICE": 1,
            "?by=bob": 0,
            "?agent=ES": 1,
            "?agent=nobody": 0,
            f"?since={today}&until={today}": 1,
            f"?until={today - timedelta(days=1)}": 0,
        }
        for query, count in listed.items():
            shown = page.get(f"/inbox{query}").text
            assert shown.count('<tr class="status-') == count, query
        assert page.get("/inbox?since=yesterday").status_code == 400
        assert page.get("/inbox?status=pending").status_code == 400


#: Decisions the page refuses: the form, what it sends, what the page says.
BAD_DECISIONS = [
    (
        "/approve",
        {"arguments": '{"order": "A-1", "amount": "lots"}'},
        "arguments for refund do not fit its parameters: amount: 'lots' is not of "
        "type 'number'; nothing was changed",
    ),
    (
        "/approve",
        {"arguments": '{"order": "A-1", "amount": 2, "to": "me"}'},
        "Additional properties are not allowed ('to' was unexpected)",
    ),
    (
        "/approve",
        {"arguments": '{"order": "A-1", "amount": 2'},
        "the arguments are not valid JSON (Expecting ',' delimiter",
    ),
    ("/approve", {"arguments": '{"order": "A-1", "amount": NaN}'}, "NaN is not a JSON value"),
    ("/approve", {"arguments": "[1, 2]"}, "arguments must be a JSON object"),
    ("/deny", {"reason": "   "}, "reason must be a non-empty text"),
    ("/deny", {}, "reason must be a non-empty text"),
]


class TestDeciding:
    def test_approve_with_edited_arguments(self, db: str, page: Page) -> None:
        """Approving with a note and edited arguments records both under the page's name;
        the approval's page then says so, once, and that a runner resumes the turn."""
        approval_id = pending(db)
        shown = page.act(
            "/approve",
            approval=approval_id,
            note="goodwill",
            arguments='{"order": "A-1", "amount": 200}',
        ).text
        with Store(db, readonly=True) as store:
            decided = store.approval(approval_id)
        assert (decided.status, decided.decided_by, decided.note) == (
            "approved",
            "alice",
            "goodwill",
        )
        assert decided.decided_arguments == {"order": "A-1", "amount": 200}
        assert notice_in(shown) == [
            "Approved refund of desk as alice, with the arguments you edited."
        ]
        assert "Waiting for a runner" in shown
        assert notice_in(page.get(f"/approval?id={approval_id}").text) == []

    def test_deny_with_a_reason(self, db: str, page: Page) -> None:
        """Denying records the reason the model reads."""
        approval_id = pending(db)
        page.act("/deny", approval=approval_id, reason="no refunds on sale items")
        with Store(db, readonly=True) as store:
            decided = store.approval(approval_id)
        assert (decided.status, decided.note) == ("denied", "no refunds on sale items")

    def test_bad_input_is_shown_on_the_form(self, db: str, page: Page) -> None:
        """Arguments that do not fit or are not JSON, or no reason: the library's error
        on the form, what was typed kept, and nothing written."""
        approval_id = pending(db)
        before = dump(db)
        for path, values, says in BAD_DECISIONS:
            answer = page.post(path, approval=approval_id, **values)
            assert answer.status_code == 400, values
            assert says in problem_in(answer.text), values
            form = f"{path.strip('/')}-{approval_id}"
            assert f'id="{form}"' in answer.text  # shown on the form, which is still there
            for value in values.values():
                if value.strip():
                    assert value.replace('"', "&#34;") in answer.text
        assert dump(db) == before

    def test_an_unknown_approval(self, db: str, page: Page) -> None:
        """An id no approval has: the library's error, and nothing written."""
        before = dump(db)
        answer = page.post("/approve", approval="apr_nope")
        assert answer.status_code == 404
        assert "no approval 'apr_nope'" in problem_in(answer.text)
        assert dump(db) == before

    def test_a_lost_race_says_who_decided_first(self, db: str, page: Page) -> None:
        """A decision that comes after another (the command line's, here) changes nothing,
        and the page says who decided first and when, and shows that decision."""
        approval_id = pending(db)
        with Store(db) as store:
            first = store.deny(approval_id, reason="fraud", by="bob")
        before = dump(db)
        answer = page.post("/approve", approval=approval_id, note="late")
        assert answer.status_code == 409
        when = f"{first.decided_at:%Y-%m-%d %H:%M:%S} UTC"
        assert f"approval {approval_id} is denied already by bob at {when}" in problem_in(
            answer.text
        )
        assert 'action="/approve"' not in answer.text  # the form is gone: it was decided
        assert "Denied</mark> by <strong>bob</strong>" in answer.text
        assert dump(db) == before


class TestVersions:
    def test_rollback(self, db: str, page: Page) -> None:
        """The version page says what a rollback changes; the rollback commits a new
        version equal to it, cancelling the refund asked since."""
        shown = page.get(f"/version?id={DESK}&version=2").text
        assert "A rollback commits <strong>v10</strong>, equal to v2" in shown
        assert "conversation <strong>default</strong>" in shown
        after = page.act("/rollback", agent=DESK, version=2).text
        assert notice_in(after) == [f"{DESK}: version 10 committed, equal to version 2."]
        with Store(db, readonly=True) as store:
            (latest, *_) = store.version_page(DESK, limit=1)
            assert (latest.version, latest.kind, latest.detail) == (10, "rollback", {"to": 2})
            assert store.approvals() == []

    def test_fork(self, db: str, page: Page) -> None:
        """A fork of a version makes a new agent; the agents list shows it."""
        after = page.act("/fork", agent=DESK, version=2, new_id="desk-copy").text
        assert "desk-copy: version 1 committed, a copy of desk version 2" in notice_in(after)[0]
        with Store(db, readonly=True) as store:
            assert store.version_page("desk-copy")[0].detail == {"from": DESK, "version": 2}

    def test_bad_input_is_shown(self, db: str, page: Page) -> None:
        """A fork onto an existing id, of a suspended turn, under an invalid id, a
        rollback to no version: the library's error, and nothing written."""
        before = dump(db)
        for path, values, status, says in [
            ("/fork", {"version": 2, "new_id": BROKEN}, 400, "cannot fork into 'broken'"),
            ("/fork", {"version": 3, "new_id": "x"}, 400, "holds a turn suspended for approval"),
            ("/fork", {"version": 2, "new_id": " "}, 400, "invalid agent id"),
            ("/rollback", {"version": 99}, 404, "has no version 99"),
        ]:
            answer = page.post(path, agent=DESK, **values)
            assert answer.status_code == status, values
            assert says in problem_in(answer.text), values
        assert dump(db) == before

    def test_a_pruned_version(self, db: str, page: Page) -> None:
        """Rolling back to a version that was pruned: the library says so; nothing written."""
        with Store(db) as store:
            store.prune(DESK, keep_versions=2)
        before = dump(db)
        answer = page.post("/rollback", agent=DESK, version=2)
        assert answer.status_code == 404
        assert f"version 2 of agent '{DESK}' was pruned" in problem_in(answer.text)
        assert dump(db) == before

    def test_an_agent_whose_turn_is_running(self, db: str, page: Page) -> None:
        """While a turn of the agent runs, a rollback is refused, saying so; nothing written."""
        with held_elsewhere(db, DESK):
            before = dump(db)
            answer = page.post("/rollback", agent=DESK, version=2)
            assert answer.status_code == 409
            said = problem_in(answer.text)
            assert f"agent '{DESK}' is in use by" in said
            assert "try again once that turn has finished" in said
            assert dump(db) == before


class TestAlarmsAndEvents:
    def test_cancel_and_rearm(self, db: str, page: Page) -> None:
        """Cancel a pending alarm; re-arm a dead one: pending again, due now."""
        with Store(db, readonly=True) as store:
            (alarm,) = store.alarms(DESK)
        edit_rows(db, "UPDATE alarms SET status = 'dead' WHERE alarm_id = ?", alarm.alarm_id)
        page.act("/rearm", alarm=alarm.alarm_id)
        with Store(db, readonly=True) as store:
            (rearmed,) = store.alarms(DESK)
        assert (rearmed.status, rearmed.attempts) == ("pending", 0)
        after = page.act("/cancel-alarm", alarm=alarm.alarm_id, agent=DESK).text
        assert notice_in(after) == [f"{alarm.alarm_id} of {DESK}: cancelled."]
        with Store(db, readonly=True) as store:
            assert store.alarms(DESK) == []
        before = dump(db)
        again = page.post("/cancel-alarm", alarm=alarm.alarm_id, agent=DESK)
        assert again.status_code == 404 and "no pending or dead alarm" in problem_in(again.text)
        unknown = page.post("/rearm", alarm="alm_nope")
        assert unknown.status_code == 404 and "no pending or dead alarm" in problem_in(
            unknown.text
        )
        assert dump(db) == before

    def test_send_an_event(self, db: str, page: Page) -> None:
        """An event with a JSON payload and a key waits in the agent's inbox; sending it
        again with the key sends nothing."""
        sent = {"agent": DESK, "fixed": 1, "name": "ticket", "payload": '{"n": 1}', "key": "k1"}
        after = page.act("/send-event", **sent).text
        assert "'ticket' to desk pending; a runner delivers it." in notice_in(after)[0]
        again = page.act("/send-event", **sent).text
        assert "sent before with key 'k1'" in notice_in(again)[0]
        assert "nothing was sent again" in notice_in(again)[0]
        with Store(db, readonly=True) as store:
            assert [e.payload for e in store.events(DESK) if e.name == "ticket"] == [{"n": 1}]

    def test_an_event_for_a_new_agent(self, db: str, page: Page) -> None:
        """An unknown agent is refused unless the form says it is new."""
        sent = {"agent": "newcomer", "name": "hello"}
        before = dump(db)
        refused = page.post("/send-event", **sent)
        assert refused.status_code == 404
        assert "no agent 'newcomer'" in problem_in(refused.text)
        assert 'value="newcomer"' in refused.text  # the form, as it was sent
        assert dump(db) == before
        page.act("/send-event", create=1, **sent)
        with Store(db, readonly=True) as store:
            assert [e.name for e in store.events("newcomer")] == ["hello"]

    def test_a_bad_payload(self, db: str, page: Page) -> None:
        """A payload that is not JSON, or too large: the error on the form, nothing sent."""
        before = dump(db)
        for payload, says in [
            ('{"n": ', "the payload is not valid JSON"),
            ('"' + "x" * (64 * 1024) + '"', "the payload must be at most 65536 bytes as JSON"),
        ]:
            answer = page.post("/send-event", agent=DESK, fixed=1, name="ticket", payload=payload)
            assert answer.status_code == 400
            assert says in problem_in(answer.text)
            assert 'id="send-event"' in answer.text
        assert dump(db) == before


class TestWorkflowsAndConversations:
    def test_reset_a_workflow(self, db: str, page: Page) -> None:
        """The dry run's report comes first; the reset then forgets the steps and rolls
        the agent back."""
        report = page.get("/reset-workflow?name=intake&from=2").text
        assert "a dry run: nothing changed yet" in report and "3 steps forgotten" in report
        assert f"{DESK}</a> rolled back" in report
        after = page.act("/reset-workflow", name="intake", **{"from": 2}).text
        assert notice_in(after) == [
            f"intake: steps 2 and later forgotten (3). {DESK} rolled back."
        ]
        with Store(db, readonly=True) as store:
            assert [s.number for s in store.steps("intake")] == [1]

    def test_delete_a_conversation_once_its_id_is_typed(self, db: str, page: Page) -> None:
        """Without its id typed the deletion is refused; typed, a version without it."""
        before = dump(db)
        refused = page.post("/delete-conversation", agent=DESK, conversation="chat", typed="cha")
        assert refused.status_code == 400
        assert "type the conversation's id, 'chat', to confirm" in problem_in(refused.text)
        assert dump(db) == before
        after = page.act("/delete-conversation", agent=DESK, conversation="chat", typed="chat")
        assert "version 10 committed without conversation 'chat'" in notice_in(after.text)[0]
        with Store(db, readonly=True) as store:
            assert [c.conversation for c in store.conversations(DESK)] == ["default"]


def holders_in(page: str) -> str:
    """The fingerprint of what a subject holds that the erase form carries."""
    found = re.search(r'name="holders" value="([^"]*)"', page)
    assert found is not None, "the page holds no subject erasure form"
    return found[1]


def tags_out(page: str) -> str:
    """The text of a page, its tags removed (what the eye reads)."""
    return " ".join(re.sub(r"<[^>]+>", " ", page).split())


class TestErasing:
    """Forgetting a person: the subject filter, the erase pages, the erasure, the receipts."""

    def test_the_subject_filter_lists_what_holds_it(self, db: str, page: Page) -> None:
        """?subject= lists the agents whose subject it is, whole, and the conversations of
        other agents that carry it, with what each holds; the list and an agent's page
        name the subjects, escaped."""
        shown = page.get(f"/?subject={ANN}").text
        read = tags_out(shown)
        assert "2 agents whose subject it is, and 1 conversation of other agents" in read
        assert "broken conversation default alone v1 1" in read
        assert "desk subject user:ann the whole agent v9 19 chat · 4 default · 15" in read
        assert "1 approval 1 event 1 alarm" in read
        assert f'href="/erase?subject={ANN.replace(":", "%3A")}"' in shown
        assert HTML not in shown
        nobody = page.get("/?subject=user:nobody").text
        assert "Nothing in this database carries subject" in nobody
        agents = page.get("/").text
        assert "subject <a" in agents and HTML not in agents
        assert "user:bob&lt;script&gt;" in agents
        desk = tags_out(page.get(f"/agent?id={DESK}").text)
        assert "Subject user:ann · conversation chat: user:bob&lt;script&gt;" in desk
        assert page.get("/?subject=%20user").status_code == 400  # not a valid subject

    def test_the_erase_page_says_what_it_erases(self, db: str, page: Page) -> None:
        """Each erase page names what goes, counted, what stays, and the name to type."""
        agent = tags_out(page.get(f"/erase?id={DESK}").text)
        assert "Erase agent desk" in agent and "the whole agent v9 19" in agent
        assert "an approval erased is never decided" in agent
        assert "Type desk to confirm" in agent
        talk = tags_out(page.get(f"/erase?id={DESK}&conversation=chat").text)
        assert "Erase conversation chat of desk" in talk
        assert "Its agent's shared fields and memory stay" in talk
        assert "Type chat to confirm" in talk
        subject = tags_out(page.get(f"/erase?subject={ANN}").text)
        assert "Erase everything subject user:ann holds" in subject
        assert "Type user:ann to confirm" in subject
        for path, status in [
            ("/erase", 400),
            (f"/erase?id={DESK}&subject={ANN}", 400),
            (f"/erase?subject={ANN}&conversation=chat", 400),
            ("/erase?id=nobody", 404),
            (f"/erase?id={DESK}&conversation=nope", 404),
        ]:
            assert page.get(path).status_code == status, path

    def test_nothing_is_erased_without_the_name_typed(self, db: str, page: Page) -> None:
        """A wrong or missing confirmation is refused on the form, for each kind."""
        fingerprint = holders_in(page.get(f"/erase?subject={ANN}").text)
        before = dump(db)
        for values, name in [
            ({"agent": DESK}, DESK),
            ({"agent": DESK, "typed": "Desk"}, DESK),
            ({"agent": DESK, "conversation": "chat", "typed": DESK}, "chat"),
            ({"subject": ANN, "holders": fingerprint, "typed": "user:an"}, ANN),
        ]:
            answer = page.post("/erase", **values)
            assert answer.status_code == 400, values
            assert f"type {name!r} to confirm; nothing was erased" in problem_in(answer.text)
            assert 'id="erase"' in answer.text  # the form again
        assert dump(db) == before

    def test_erase_an_agent(self, db: str, page: Page) -> None:
        """Erasing an agent removes it whole and shows the receipt: its id, the counts,
        the digest, the scrub; none of the erased content."""
        shown = page.act("/erase", agent=DESK, typed=DESK).text
        with Store(db, readonly=True) as store:
            (receipt,) = store.erasures()
            assert DESK not in [a.agent_id for a in store.agents()]
            assert store.holders(BOB) == []
        assert receipt.agents == (DESK,) and receipt.verified
        assert notice_in(shown)[0].startswith("Erased 1 agent and 0 conversations (")
        assert f"receipt {receipt.erasure_id} kept" in notice_in(shown)[0]
        read = tags_out(shown)
        assert f"Erasure {receipt.erasure_id}" in read and receipt.digest in read
        assert f"messages · {receipt.counts['messages']}" in read
        assert f"versions {receipt.versions} " in read
        scrubbed = "the erased bytes left" if receipt.scrubbed_at else "pending"
        assert scrubbed in read
        for content in ("Where is my order", "Ann", "refunds need a person", "payment_received"):
            assert content not in shown, content
        listed = tags_out(page.get("/erasures").text)
        assert "1 erasure, newest first" in listed and receipt.erasure_id in listed
        rows = sum(receipt.counts.values())
        went = f"1 agent · 0 conversations {receipt.versions} versions · {rows} rows"
        assert f"agent {DESK} {went}" in listed
        assert page.get(f"/agent?id={DESK}").status_code == 404

    def test_erase_a_conversation(self, db: str, page: Page) -> None:
        """Erasing one conversation leaves the agent, its other conversation and its
        versions; the receipt names the conversation."""
        page.act("/erase", agent=DESK, conversation="chat", typed="chat")
        with Store(db, readonly=True) as store:
            (receipt,) = store.erasures()
            assert [c.conversation for c in store.conversations(DESK)] == ["default"]
            assert store.version_page(DESK, limit=1)[0].version == 9
            assert store.subjects(DESK) == {None: ANN}
        assert receipt.conversations == ((DESK, "chat"),) and receipt.agents == ()

    def test_erase_a_subject(self, db: str, page: Page) -> None:
        """Erasing a subject erases what holds it, and the receipt names the subject only
        by its digest."""
        fingerprint = holders_in(page.get(f"/erase?subject={ANN}").text)
        shown = page.act("/erase", subject=ANN, holders=fingerprint, typed=ANN).text
        with Store(db, readonly=True) as store:
            (receipt,) = store.erasures()
            assert store.holders(ANN) == []
            assert [a.agent_id for a in store.agents()] == [BROKEN]
            assert store.conversations(BROKEN) == []
        assert sorted(receipt.agents) == sorted([DESK, HTML_AGENT])
        assert receipt.conversations == ((BROKEN, "default"),)
        assert "subject" in receipt.selector and ANN not in shown
        assert "Erased 2 agents and 1 conversation" in notice_in(shown)[0]

    def test_a_subject_that_changed_since_the_page_is_refused(self, db: str, page: Page) -> None:
        """An agent named with the subject after the page was shown: the erasure is
        refused (it would erase what the person did not see), and the page shows it now."""
        fingerprint = holders_in(page.get(f"/erase?subject={ANN}").text)
        with Store(db) as store:
            store.set_subject("newcomer", ANN)
        before = dump(db)
        answer = page.post("/erase", subject=ANN, holders=fingerprint, typed=ANN)
        assert answer.status_code == 400
        said = problem_in(answer.text)
        assert "what the subject holds changed since the page was shown" in said
        assert "now 3 agents and 1 conversation" in said and "nothing was erased" in said
        assert "newcomer" in answer.text and holders_in(answer.text) != fingerprint
        assert dump(db) == before

    def test_an_agent_whose_turn_is_running(self, db: str, page: Page) -> None:
        """While a turn of an agent it reaches runs, an erasure is refused, saying so, and
        erases nothing, of that agent nor of the others."""
        with held_elsewhere(db, BROKEN):
            fingerprint = holders_in(page.get(f"/erase?subject={ANN}").text)
            before = dump(db)
            answer = page.post("/erase", subject=ANN, holders=fingerprint, typed=ANN)
            assert answer.status_code == 409
            said = problem_in(answer.text)
            assert f"agent '{BROKEN}' is in use by" in said and "nothing was erased" in said
            assert "try again once that turn has finished" in said
            assert dump(db) == before

    def test_an_unknown_agent_or_receipt(self, db: str, page: Page) -> None:
        """An agent or a conversation the database does not hold: a 404 page saying so,
        nothing erased and no receipt kept; a receipt it does not hold: a 404 page."""
        before = dump(db)
        for values, said in [
            ({"agent": "nobody", "typed": "nobody"}, "no agent 'nobody'"),
            (
                {"agent": DESK, "conversation": "nope", "typed": "nope"},
                f"agent '{DESK}' has no conversation 'nope'",
            ),
        ]:
            answer = page.post("/erase", **values)
            assert answer.status_code == 404, values
            assert said in problem_in(answer.text) and "Nothing was changed" in answer.text
        assert dump(db) == before
        assert page.get("/erasure?id=era_nope").status_code == 404
        assert "No erasure yet" in page.get("/erasures").text

    def test_bad_input_destroys_nothing(self, db: str, page: Page) -> None:
        """A form naming neither or both of a subject and an agent, a subject with a
        conversation, an invalid id or subject, a NUL: a page that says what was wrong,
        nothing erased and no receipt kept."""
        fingerprint = holders_in(page.get(f"/erase?subject={ANN}").text)
        before = dump(db)
        for values, status, said in [
            ({"typed": DESK}, 400, "name a subject (subject=) or an agent (id=)"),
            ({"subject": ANN, "agent": DESK, "typed": ANN}, 400, "not both and not neither"),
            (
                {"subject": ANN, "conversation": "chat", "typed": ANN},
                400,
                "a subject&#39;s erasure takes no conversation",
            ),
            ({"agent": " desk", "typed": " desk"}, 400, "invalid agent id &#39; desk&#39;"),
            (
                {"subject": " user", "holders": fingerprint, "typed": " user"},
                400,
                "invalid subject &#39; user&#39;",
            ),
            ({"agent": DESK, "typed": DESK + "\0"}, 400, "holds a NUL character"),
        ]:
            answer = page.post("/erase", **values)
            assert answer.status_code == status, values
            assert said in answer.text, values
            assert 'id="erase"' not in answer.text, values  # no form to send it again
        assert dump(db) == before

    def test_bad_addresses(self, db: str, page: Page) -> None:
        """The erase and receipt pages' malformed addresses are 400 pages naming what
        was wrong."""
        for path, said in [
            ("/erasure", "the parameter &#39;id&#39; is missing"),
            ("/erasures?page=0", "must be a whole number from 1"),
            ("/erasures?page=2", "there is no page 2"),
            ("/erase?subject=%20ann", "invalid subject"),
            ("/erase?id=desk%00", "holds a NUL character"),
        ]:
            answer = page.get(path)
            assert answer.status_code == 400, path
            assert said in answer.text, path


#: Every action, with a form that would succeed.
ACTIONS = [
    ("/approve", {"note": "ok"}),
    ("/deny", {"reason": "no"}),
    ("/rollback", {"agent": DESK, "version": 2}),
    ("/fork", {"agent": DESK, "version": 2, "new_id": "desk-copy"}),
    ("/send-event", {"agent": DESK, "name": "ticket"}),
    ("/reset-workflow", {"name": "intake", "from": 1}),
    ("/delete-conversation", {"agent": DESK, "conversation": "chat", "typed": "chat"}),
    ("/erase", {"agent": DESK, "typed": DESK}),
]


def with_approval(db: str, values: dict[str, Any]) -> dict[str, Any]:
    return {"approval": pending(db), **values}


class TestCrossSite:
    """No write without this page's origin and this session's form token; no write at all
    read-only. Each refused request leaves the database exactly as it was."""

    def test_another_origin_is_refused(self, db: str, page: Page) -> None:
        """A form posted from another site, even with a valid token, changes nothing."""
        before = dump(db)
        for path, values in ACTIONS:
            for origin in ("http://evil.example", f"http://127.0.0.1:{PORT + 1}", "null", ""):
                answer = page.post(path, origin=origin, **with_approval(db, values))
                assert answer.status_code == 403, (path, origin)
                assert "not sent by this page" in answer.text
        assert dump(db) == before

    def test_a_missing_or_stale_token_is_refused(self, db: str, page: Page) -> None:
        """No form token, another session's, or one of an earlier run: refused, nothing
        written."""
        with page_over(db) as other:
            another_session = other.token()
        with page_over(db, token="an-earlier-run") as earlier:
            earlier_run = earlier.token()
        own = page.token()
        assert len({own, another_session, earlier_run}) == 3
        before = dump(db)
        for path, values in ACTIONS:
            for token in ("", another_session, earlier_run, own[:-1]):
                answer = page.post(path, token=token, **with_approval(db, values))
                assert answer.status_code == 403, (path, token)
                assert "this form is out of date" in answer.text
        assert dump(db) == before

    def test_only_forms_are_taken(self, db: str, page: Page) -> None:
        """A write sent as JSON or as a multipart body is refused; so is an oversized form."""
        before = dump(db)
        headers = {"origin": BASE}
        body = {"csrf": page.token(), "approval": pending(db), "note": "x"}
        as_json = page.client.post("/approve", json=body, headers=headers)
        assert as_json.status_code == 415
        multipart = page.client.post("/approve", files={"note": b"x"}, data=body, headers=headers)
        assert multipart.status_code == 415
        huge = page.post("/approve", approval=pending(db), note="x" * (600 * 1024))
        assert huge.status_code == 413
        static = page.post("/-/static/app.css", note="x")  # public files take no form
        assert static.status_code == 405
        assert dump(db) == before

    def test_get_changes_nothing(self, db: str, page: Page) -> None:
        """An action's address fetched with GET does nothing; its form pages only show."""
        before = dump(db)
        approval_id = pending(db)
        assert page.get(f"/approve?approval={approval_id}").status_code == 405
        assert page.get(f"/rollback?agent={DESK}&version=2").status_code == 405
        for path in (
            f"/approval?id={approval_id}",
            f"/version?id={DESK}&version=2",
            f"/delete-conversation?id={DESK}&conversation=chat",
            f"/erase?id={DESK}",
            f"/erase?id={DESK}&conversation=chat",
            f"/erase?subject={ANN}",
            "/erasures",
            "/reset-workflow?name=intake",
            f"/send-event?id={DESK}",
        ):
            assert page.get(path).status_code == 200, path
        assert dump(db) == before

    def test_read_only(self, db: str) -> None:
        """Read-only: the pages say so and offer no action; the server refuses every one,
        even with this page's origin and form token."""
        with page_over(db) as writable:
            token = writable.token()
        before = dump(db)
        with page_over(db, read_only=True) as page:
            for path in (
                "/inbox",
                f"/approval?id={pending(db)}",
                f"/agent?id={DESK}",
                f"/version?id={DESK}&version=2",
                "/waiting",
                "/send-event",
                f"/erase?id={DESK}",
                f"/erase?subject={ANN}",
                f"/?subject={ANN}",
            ):
                shown = page.get(path).text
                assert "read-only" in shown, path
                assert 'method="post"' not in shown and 'name="csrf"' not in shown, path
            for path, values in ACTIONS:
                answer = page.post(path, token=token, **with_approval(db, values))
                assert answer.status_code == 403 and "--read-only" in answer.text, path
        assert dump(db) == before
