"""The session page's conversation in a real browser, against a real server and Worker
serving ``tests/browser/agents.py``: what was said in order, with each tool call, who
approved it, each question with its answer and who gave it, the live text of the attempt
that runs now only, a message sent from the page's own box; and the sessions list."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Locator, Page, expect

from dex.testing import wait_until
from tests.browser.conftest import screenshot
from tests.support.rig import Rig

AGENTS = str(Path(__file__).with_name("agents.py"))

WATCH_THE_STREAM = """() => {
    // counts the model.delta events the page's stream delivers (before the page's own
    // listener sees each one, in the same dispatch)
    const Native = window.EventSource;
    window.__deltas = 0;
    window.EventSource = class extends Native {
        constructor(...args) {
            super(...args);
            super.addEventListener("model.delta", () => window.__deltas++);
        }
    };
    // and the texts the live box showed (on every page: sending the form loads it anew)
    window.seen = new Set();
    document.addEventListener("DOMContentLoaded", () => {
        const live = document.getElementById("live");
        new MutationObserver(() => window.seen.add(live.textContent))
            .observe(live, {childList: true, characterData: true, subtree: true});
    });
}"""


def start(rig: Rig) -> str:
    rig.start_server()
    rig.start_worker(module=AGENTS)
    return rig.session("chat")


def open_session(page: Page, rig: Rig, session_id: str) -> None:
    page.goto(f"{rig.server.address}/ui/sessions/{session_id}")
    expect(page.locator("h1")).to_contain_text(session_id)


def said(page: Page) -> Locator:
    """The conversation's entries, oldest first."""
    return page.locator("#conversation .msg")


def send_from_the_box(page: Page, text: str) -> None:
    page.locator("#send textarea").fill(text)
    page.locator("#send").get_by_role("button", name="Send").click()


def test_a_message_sent_from_the_box_gets_its_reply_in_the_conversation(
    rig: Rig, page: Page
) -> None:
    sid = start(rig)
    open_session(page, rig, sid)
    expect(page.locator("#conversation .empty")).to_be_visible()

    send_from_the_box(page, "hello there")
    expect(said(page)).to_have_count(2)
    expect(said(page).nth(0)).to_contain_text("hello there")
    expect(said(page).nth(1)).to_contain_text("echo: hello there")
    assert rig.wait_turn(sid, 1)["text"] == "echo: hello there"  # the API's own turn
    expect(page.locator("#send textarea")).to_have_value("")  # sent, and ready for the next

    send_from_the_box(page, "  ")  # nothing to send: refused, and nothing is sent
    expect(page.locator(".error h1")).to_contain_text("422")
    expect(page.locator(".error")).to_contain_text("Nothing was changed")
    assert rig.client.get_agent_snapshot(sid)["session"]["messages_received"] == 1


def test_a_question_its_answer_and_who_answered_stay_in_the_conversation(
    rig: Rig, page: Page
) -> None:
    sid = start(rig)
    rig.client.send_message(sid, "hi", wait=True)
    open_session(page, rig, sid)
    rig.client.send_message(sid, "order a shirt")

    wait = page.locator(".wait.question")
    expect(wait.locator(".question")).to_have_text("Which size of shirt?")
    call = page.locator("#conversation .call", has_text="order")
    expect(call.locator(".wait-line.question")).to_contain_text("waits for a person's answer")
    wait.get_by_role("button", name="M", exact=True).click()

    expect(said(page).last).to_contain_text("done: ordered shirt in M")
    texts = said(page).all_inner_texts()
    assert [t.strip().splitlines()[-1].strip() for t in texts] == [
        "hi",
        "echo: hi",
        "order a shirt",
        '← "ordered shirt in M"',
        "done: ordered shirt in M",
    ], texts
    expect(call.locator(".asked-question")).to_have_text("Which size of shirt?")
    expect(call.locator(".answer")).to_have_text("answer: M, by console")
    expect(call.locator(".call-status")).to_have_text("succeeded")
    expect(page.locator(".waits")).to_have_count(0)
    screenshot(page, "conversation-answered")
    assert [(e["item"], e["size"]) for e in rig.ledger.entries("order")] == [("shirt", "M")]


def test_an_approval_shows_who_approved_and_what_the_tool_returned(rig: Rig, page: Page) -> None:
    sid = start(rig)
    open_session(page, rig, sid)
    rig.client.send_message(sid, "delete everything")

    call = page.locator("#conversation .call", has_text="delete_all")
    expect(call.locator(".wait-line.approval")).to_contain_text("waits for a person's approval")
    agent = said(page).nth(1)
    expect(agent).to_contain_text("I will delete everything: that needs your approval.")
    assert rig.ledger.entries("delete_all") == []  # nothing runs while it waits

    page.locator(".wait.approval").get_by_role("button", name="Approve").click()
    expect(call.locator(".wait-line.approval")).to_have_text("approved by console")
    expect(call.locator(".call-status")).to_have_text("succeeded")
    expect(call.locator(".result")).to_contain_text('"deleted"')
    expect(said(page).last).to_contain_text("done: deleted")
    assert len(rig.ledger.entries("delete_all")) == 1


def test_the_live_box_shows_the_running_attempt_only_and_the_badges_agree(
    rig: Rig, page: Page
) -> None:
    sid = start(rig)
    page.add_init_script(f"({WATCH_THE_STREAM})()")
    open_session(page, rig, sid)
    text = "stream me please " * 10
    turn = rig.client.send_message(sid, text)["turn"]
    page.wait_for_function("() => [...window.seen].some((t) => t.startsWith('echo: stream'))")
    rig.wait_turn(sid, turn)
    # once committed, the reply is the conversation's, and the live box lets it go
    expect(page.locator("#live")).to_have_text("")
    expect(page.locator("#live-box")).to_be_hidden()
    expect(said(page).nth(1)).to_contain_text(f"echo: {text.strip()}")

    # the next turn says nothing and waits for an approval: no text of turn 1 shows, and
    # the turn reads waiting as the session does
    rig.client.send_message(sid, "quietly delete")
    expect(page.locator(".wait.approval")).to_be_visible()
    expect(page.locator("#status")).to_have_text("waiting")
    expect(page.locator("article[data-turn='2'] h3 .badge")).to_have_text("waiting")
    expect(page.locator("#live")).to_have_text("")
    expect(page.locator("#conversation .msg.user[data-turn='2'] .turn-status")).to_have_text(
        "waiting"
    )

    # a page opened now gets every buffered delta of turn 1 again: none of it is live
    page.reload()
    page.wait_for_function("() => window.__deltas > 0")
    expect(page.locator("#live")).to_have_text("")
    expect(page.locator("#live-box")).to_be_hidden()
    expect(page.locator("article[data-turn='1'] h3 .badge")).to_have_text("completed")
    expect(page.locator("article[data-turn='2'] h3 .badge")).to_have_text("waiting")

    page.locator(".wait.approval").get_by_role("button", name="Approve").click()
    expect(page.locator("#status")).to_have_text("idle")
    expect(page.locator("article[data-turn='2'] h3 .badge")).to_have_text("completed")


def test_the_sessions_list_shows_agent_status_last_message_and_what_each_waits_for(
    rig: Rig, page: Page
) -> None:
    idle = start(rig)
    rig.client.send_message(idle, "good morning", wait=True)
    approval = rig.session("chat")
    rig.client.send_message(approval, "delete everything", wait=True)
    question = rig.session("chat")
    rig.client.send_message(question, "order a shirt", wait=True)
    fresh = rig.session("chat")
    wait_until(lambda: len(rig.client.list_inbox()["items"]) == 2, 20, what="two waits")

    page.goto(f"{rig.server.address}/ui/sessions")
    heads = page.locator("table.sessions thead th").all_inner_texts()
    assert heads[:5] == ["Session", "Agent", "Status", "Last message", "Waits for"], heads

    def row(session_id: str) -> Locator:
        return page.locator(f"table.sessions tr[data-session='{session_id}']")

    expect(row(idle).locator(".agent")).to_have_text("chat")
    expect(row(idle).locator(".status")).to_have_text("idle")
    expect(row(idle).locator(".last")).to_have_text("chat: echo: good morning")
    expect(row(idle).locator(".waits-for")).to_have_text("")
    expect(row(approval).locator(".status")).to_have_text("waiting")
    expect(row(approval).locator(".last")).to_have_text(
        "chat: I will delete everything: that needs your approval."
    )
    expect(row(approval).locator(".waits-for")).to_have_text("approval of delete_all")
    expect(row(question).locator(".last")).to_have_text("user: order a shirt")
    expect(row(question).locator(".waits-for")).to_have_text("an answer to “Which size of shirt?”")
    expect(row(fresh).locator(".last")).to_have_text("")
    screenshot(page, "sessions-columns")
