"""The web console in a real browser, against a real server and Worker: a person sees what
waits, acts, and the tools' own ledger shows what really ran."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Locator, Page, Request, Route, expect

from dex.testing import ServerProcess, wait_until
from tests.browser.conftest import screenshot
from tests.support.rig import Rig, model_calls


def open_session(page: Page, rig: Rig, session_id: str) -> None:
    page.goto(f"{rig.server.address}/ui/sessions/{session_id}")
    expect(page.locator("h1")).to_contain_text(session_id)


def is_render(request: Request) -> bool:
    """The page's own fetch of itself, to render its state again (not a navigation)."""
    return request.resource_type == "fetch"


def call_status(page: Page, call_id: str) -> Locator:
    return page.locator(f"table.calls tr[data-call='{call_id}'] .call-status")


def test_approving_in_the_inbox_runs_the_tool_once(rig: Rig, page: Page) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("delete_all", {}))
    wait_until(lambda: rig.client.list_inbox()["items"], 10, what="the approval is in the inbox")

    page.goto(f"{rig.server.address}/ui")
    row = page.locator("table.inbox tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("delete_all")
    expect(row).to_contain_text("approval")
    screenshot(page, "inbox")
    row.get_by_role("link", name=sid).click()

    wait = page.locator(".wait.approval")
    expect(wait).to_contain_text("delete_all")
    screenshot(page, "session-waiting")
    # the same page, opened before the approval, that does not follow the session (no
    # script: the console's forms work without one)
    assert page.context.browser is not None
    stale = page.context.browser.new_context(java_script_enabled=False).new_page()
    stale.goto(page.url)
    assert rig.ledger.entries("delete_all") == []  # nothing runs while it waits

    wait.get_by_role("button", name="Approve").click()
    expect(page.locator(".waits")).to_have_count(0)  # the approval is recorded
    (call,) = rig.wait_turn(sid, turn)["tool_calls"]
    expect(call_status(page, call["id"])).to_have_text("succeeded")
    expect(page.locator(f"tr[data-call='{call['id']}']")).to_contain_text("approved by console")
    screenshot(page, "session")

    # the stale page's approval is refused with the API's 409, and runs nothing again
    stale.locator(".wait.approval").get_by_role("button", name="Approve").click()
    expect(stale.locator(".error h1")).to_contain_text("409")
    expect(stale.locator(".error .message")).to_contain_text("not waiting any more")
    assert len(rig.ledger.entries("delete_all")) == 1
    stale.context.close()

    page.goto(f"{rig.server.address}/ui/cluster")
    expect(page.locator("#role")).to_have_text("active")
    worker = page.locator("table.workers tbody tr")
    expect(worker).to_have_count(1)
    expect(worker).to_contain_text("waiter")
    expect(worker).to_contain_text("delete_all")
    screenshot(page, "cluster")


def test_a_denial_with_a_reason_reaches_the_model_and_nothing_runs(rig: Rig, page: Page) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("transfer", {"amount": 500}))
    wait_until(lambda: rig.client.list_inbox()["items"], 10, what="the approval is in the inbox")

    # the page renders itself again from the server once its event stream opens: hold
    # that render until a person is in the reason field, then let it land
    url = f"{rig.server.address}/ui/sessions/{sid}"
    held: list[Route] = []
    page.route(
        url, lambda route: held.append(route) if is_render(route.request) else route.continue_()
    )
    with page.expect_request(is_render):
        open_session(page, rig, sid)
    wait = page.locator(".wait.approval")
    expect(wait).to_contain_text("transfer")
    reason = wait.get_by_placeholder("why not")
    reason.click()
    for route in held:
        route.continue_()
    expect(page.locator("#held")).to_be_visible()  # the render waits for the person
    expect(reason).to_be_focused()  # and left the field alone: the keys land in it
    page.keyboard.type("too much money")
    expect(reason).to_have_value("too much money")
    page.unroute(url)

    wait.get_by_role("button", name="Deny").click()
    expect(page.locator(".waits")).to_have_count(0)  # the denial is recorded
    (call,) = rig.wait_turn(sid, turn)["tool_calls"]
    expect(call_status(page, call["id"])).to_have_text("denied")
    expect(page.locator(f"tr[data-call='{call['id']}'] .error-text")).to_contain_text(
        "too much money"
    )
    assert rig.ledger.entries("transfer") == []


def test_an_answer_resumes_the_tool(rig: Rig, page: Page) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("order", {"item": "shirt"}))
    open_session(page, rig, sid)

    wait = page.locator(".wait.question")
    expect(wait.locator(".question")).to_have_text("Which size of shirt?")
    wait.get_by_role("button", name="M", exact=True).click()
    expect(page.locator(".waits")).to_have_count(0)  # the answer is recorded
    (call,) = rig.wait_turn(sid, turn)["tool_calls"]
    expect(call_status(page, call["id"])).to_have_text("succeeded")
    ordered = rig.ledger.entries("order")
    assert [(e["item"], e["size"]) for e in ordered] == [("shirt", "M")]


def test_an_unknown_outcome_is_found_and_reconciled(rig: Rig, page: Page) -> None:
    rig.start_server()
    worker = rig.start_worker()
    sid = rig.session()
    turn = rig.call(
        sid, ("charge", {"amount": 5, "gate": "g"}), ("lookup", {"key": "k", "gate": "h"})
    )
    rig.wait_entered("g", 1)
    rig.wait_entered("h", 1)
    worker.kill()  # mid-call: a single-attempt write may have run, a read runs again

    def lookup_queued() -> bool:
        waiting = rig.client.get_agent_snapshot(sid)["waiting"]
        return any(w["queue"] == "tool:assistant/lookup" for w in waiting)

    wait_until(lookup_queued, 10, what="the read is queued again, with no Worker to take it")
    page.goto(f"{rig.server.address}/ui/cluster")
    expect(page.locator("table.workers")).to_have_count(0)
    queued = page.locator("table.queued tbody tr")
    expect(queued).to_have_count(1)
    expect(queued).to_contain_text("lookup")
    expect(queued).to_contain_text("assistant")
    screenshot(page, "cluster-queued")
    rig.open_gate("h")
    rig.start_worker()
    call, read = rig.wait_turn(sid, turn)["tool_calls"]
    assert (call["status"], read["status"]) == ("outcome_unknown", "succeeded")

    page.goto(f"{rig.server.address}/ui/sessions")
    page.get_by_role("link", name="has outcome_unknown").click()
    listed = page.locator("table.sessions tbody tr")
    expect(listed).to_have_count(1)
    expect(listed).to_contain_text(sid)
    screenshot(page, "sessions")
    listed.get_by_role("link", name=sid).click()

    row = page.locator(f"table.calls tr[data-call='{call['id']}']")
    expect(row.locator(".call-status")).to_have_text("outcome_unknown")
    expect(row.locator(".key")).to_have_text(call["idempotency_key"])
    row.locator("select[name=status]").select_option("succeeded")
    row.get_by_placeholder("what happened").fill("the bank shows the charge")
    row.get_by_role("button", name="Reconcile").click()

    expect(row.locator(".call-status")).to_have_text("succeeded")
    expect(row).to_contain_text("reconciled by console")
    assert rig.client.get_agent_snapshot(sid)["session"]["outcome_unknown"] == 0
    assert len(rig.ledger.entries("charge")) == 1  # it ran once, and never again
    page.goto(f"{rig.server.address}/ui/sessions?show=outcome_unknown")
    expect(page.locator("table.sessions tbody tr")).to_have_count(0)


def test_streamed_model_text_arrives_on_the_session_page(rig: Rig, page: Page) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("streamer")  # streams 4 characters every 10 ms
    open_session(page, rig, sid)
    page.evaluate(
        """() => {
            window.seen = new Set();
            const live = document.getElementById("live");
            new MutationObserver(() => window.seen.add(live.textContent.length))
                .observe(live, {childList: true, characterData: true, subtree: true});
        }"""
    )
    text = "stream me please " * 20
    turn = rig.client.send_message(sid, text)["turn"]

    page.wait_for_function(f"() => window.seen.has({len(f'echo: {text}')})")  # all of it, live
    assert page.evaluate("window.seen.size") > 5  # it grew piece by piece, as it streamed
    assert rig.wait_turn(sid, turn)["text"] == f"echo: {text}"
    expect(page.locator(f"article[data-turn='{turn}'] .text")).to_have_text(f"echo: {text}")
    # once committed, the reply is in the conversation, and the live box lets it go
    expect(page.locator("#conversation .msg.agent .text")).to_have_text(f"echo: {text}")
    expect(page.locator("#live")).to_have_text("")


def test_the_page_recovers_when_the_server_restarts(rig: Rig, page: Page) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("delete_all", {}))
    open_session(page, rig, sid)
    expect(page.locator(".wait.approval")).to_be_visible()

    rig.server.kill()
    expect(page.locator("#connection")).to_be_visible()  # the page says it lost the server
    rig.server.start()
    expect(page.locator("#connection")).to_be_hidden()
    expect(page.locator(".wait.approval")).to_contain_text("delete_all")  # still waiting
    wait_until(lambda: rig.client.list_workers(), 20, what="the Worker is back")

    page.locator(".wait.approval").get_by_role("button", name="Approve").click()
    expect(page.locator(".waits")).to_have_count(0)
    (call,) = rig.wait_turn(sid, turn)["tool_calls"]
    expect(call_status(page, call["id"])).to_have_text("succeeded")
    assert len(rig.ledger.entries("delete_all")) == 1


def test_with_auth_on_the_console_asks_for_a_client_token(tmp_path: object, page: Page) -> None:

    assert isinstance(tmp_path, Path)
    server = ServerProcess(
        tmp_path / "data", env={"DEX_CLIENT_TOKEN": "c-secret", "DEX_WORKER_TOKEN": "w-secret"}
    )
    try:
        server.start()
        answer = page.goto(f"{server.address}/ui/sessions")
        assert answer is not None and answer.status == 401
        form = page.locator(".login form")
        form.get_by_label("Token").fill("w-secret")  # a worker token may not read sessions
        form.get_by_role("button", name="Log in").click()
        expect(page.locator(".login .message")).to_contain_text("needs a client token")
        page.locator(".login form").get_by_label("Token").fill("c-secret")
        page.locator(".login form").get_by_role("button", name="Log in").click()
        expect(page.locator("h1")).to_have_text("Sessions")  # back where it was refused
        cookie = next(c for c in page.context.cookies() if c["name"] == "dex_console_token")
        assert cookie["httpOnly"] and cookie["path"] == "/ui"
        page.get_by_role("button", name="Log out").click()
        page.goto(f"{server.address}/ui/sessions")
        expect(page.locator(".login form")).to_be_visible()
    finally:
        server.kill()


SLOW_REFRESHES = """() => {
    // every refresh of the page answers late, as on a slow network; window.__processed
    // counts the answers the page has acted on (a task after the answer's microtasks)
    const fetch = window.fetch;
    window.__fetches = 0;
    window.__processed = 0;
    window.fetch = async (...args) => {
        window.__fetches++;
        await new Promise((resolve) => setTimeout(resolve, 500));
        const answer = await fetch(...args);
        const text = answer.text.bind(answer);
        answer.text = async () => {
            const body = await text();
            setTimeout(() => window.__processed++, 0);
            return body;
        };
        return answer;
    };
}"""


def test_a_refresh_that_answers_while_a_person_types_keeps_what_they_typed(
    rig: Rig, page: Page
) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    rig.call(sid, ("transfer", {"amount": 500}))
    open_session(page, rig, sid)
    wait = page.locator(".wait.approval")
    expect(wait).to_contain_text("transfer")
    page.evaluate(SLOW_REFRESHES)

    rig.client.send_message(sid, "more")  # message.queued: the page refreshes
    page.wait_for_function("() => window.__fetches > 0")
    reason = wait.get_by_placeholder("why not")
    reason.fill("too much money")
    reason.blur()  # typed, then looked elsewhere: still not sent
    page.wait_for_function("() => window.__processed > 0")

    expect(reason).to_have_value("too much money")
    wait.get_by_role("button", name="Deny").click()
    expect(page.locator(".waits")).to_have_count(0)


def test_a_turn_in_its_budget_wait_resumes_from_the_console(rig: Rig, page: Page) -> None:
    """A session whose budget its first model call uses up: its turn waits for a bigger
    budget with nothing queued; the form on its page raises it, and the turn goes on with
    one more model call."""
    rig.start_server()
    rig.start_worker()
    rig.session("spender")  # the agent is registered
    sid = rig.client.create_session("spender", budget={"max_tokens": 1_000})["id"]
    turn = rig.call(sid, ("lookup", {"key": "a"}))  # 1,100 tokens, then the tool
    wait_until(
        lambda: rig.client.wait_turn(sid, turn, timeout=0)["status"] == "waiting",
        20,
        what="the turn waits for its budget",
    )
    assert len(model_calls(rig, sid)) == 1

    page.goto(f"{rig.server.address}/ui")
    row = page.locator("table.inbox tbody tr")
    expect(row).to_have_count(1)
    expect(row).to_contain_text("a bigger budget")
    expect(row).to_contain_text("1100 tokens used of a budget of 1000")
    row.get_by_role("link", name=sid).click()

    wait = page.locator(".wait.budget")
    expect(wait).to_contain_text("1100 tokens used of a budget of 1000")
    expect(page.locator("#usage")).to_contain_text("1,000 in · 100 out · $0.0045")
    expect(page.locator("#budget")).to_contain_text("1,000 tokens")
    screenshot(page, "session-budget-wait")
    assert len(model_calls(rig, sid)) == 1  # nothing runs while it waits

    tokens = wait.get_by_placeholder("max tokens")
    tokens.fill("1050")  # raised, but still used up: it waits on
    wait.get_by_role("button", name="Set the budget").click()
    expect(page.locator(".wait.budget")).to_contain_text("1100 tokens used of a budget of 1050")
    assert rig.client.wait_turn(sid, turn, timeout=0)["status"] == "waiting"

    page.locator(".wait.budget").get_by_placeholder("max tokens").fill("10000")
    page.locator(".wait.budget").get_by_role("button", name="Set the budget").click()
    ended = rig.wait_turn(sid, turn)
    assert ended["status"] == "completed"
    steps = [s["type"] for s in ended["steps"]]
    assert steps == ["RunModel", "CallTool", "AwaitBudget", "RunModel"]
    assert model_calls(rig, sid) == [1, 1]  # one model call after the raise
    expect(page.locator(".waits")).to_have_count(0)
    expect(page.locator("#status")).to_have_text("idle")
    expect(page.locator("#usage")).to_contain_text("2,000 in · 200 out · $0.0090")
    expect(page.locator("#budget")).to_contain_text("10,000 tokens")
    expect(page.locator(f"article.turn[data-turn='{turn}'] .turn-usage")).to_contain_text(
        "2,000 in · 200 out · $0.0090"
    )
    screenshot(page, "session-budget-raised")
    page.goto(f"{rig.server.address}/ui/sessions")
    row = page.locator("table tbody tr", has_text=sid)
    expect(row.locator(".usage")).to_have_text("2,200 tokens · $0.0090")


def test_a_tenant_s_turns_in_its_budget_wait_resume_from_the_tenants_page(
    rig: Rig, page: Page
) -> None:
    """Two sessions of a tenant whose day budget the first one's model call uses up: both
    turns wait for the tenant's budget, the second before its first model call. The
    session page points to the Tenants page, whose form raises the tenant's budget, and
    both turns go on to complete (the first with one model call more)."""
    rig.start_server()
    rig.start_worker()
    rig.session("spender")  # the agent is registered
    rig.client.set_tenant_budget("acme", max_tokens_per_day=1_000)
    first = rig.client.create_session("spender", tenant="acme")["id"]
    second = rig.client.create_session("spender", tenant="acme")["id"]
    turns = {first: rig.call(first, ("lookup", {"key": "a"}))}  # 1,100 tokens, the tool

    def waiting(sid: str) -> bool:
        return bool(rig.client.wait_turn(sid, turns[sid], timeout=0)["status"] == "waiting")

    wait_until(lambda: waiting(first), 20, what="the first turn waits for acme's budget")
    turns[second] = rig.call(second, ("lookup", {"key": "b"}))
    wait_until(lambda: waiting(second), 20, what="the second turn waits for acme's budget")
    assert len(model_calls(rig, first)) == 1 and model_calls(rig, second) == []

    reason = "tenant acme: 1100 tokens used today of 1000"
    open_session(page, rig, second)
    wait = page.locator(".wait.tenant-budget")
    expect(wait).to_contain_text(f"waits for its tenant's budget: {reason}")
    expect(wait.locator("form")).to_have_count(0)  # not the session's budget to raise
    expect(page.locator("#tenant-usage")).to_contain_text("1,000 tokens a day · today 1,100")
    screenshot(page, "session-tenant-budget-wait")
    wait.get_by_role("link", name="Tenants").click()

    expect(page.locator("h1")).to_have_text("Tenants")
    row = page.locator("tr#tenant-acme")
    expect(row).to_contain_text("1,000 tokens a day")
    expect(row.locator("td.reached")).to_contain_text(f"used up {reason}")
    screenshot(page, "tenants-used-up")
    form = page.locator("tr.change[data-tenant='acme'] form")
    form.get_by_placeholder("max tokens a day").fill("10000")
    form.get_by_role("button", name="Set the budget").click()
    expect(page.locator("tr#tenant-acme td.budget")).to_have_text("10,000 tokens a day")

    for sid in (first, second):
        ended = rig.wait_turn(sid, turns[sid])
        assert ended["status"] == "completed"
        assert "AwaitBudget" in [s["type"] for s in ended["steps"]]
    assert model_calls(rig, first) == [1, 1]  # one model call after the raise
    assert model_calls(rig, second) == [1, 1]  # its first and, after the tool, its last
    page.reload()
    expect(page.locator("tr#tenant-acme td.reached")).to_have_text("")
    expect(page.locator("tr#tenant-acme td.today")).to_contain_text(
        "4,400 tokens · $0.0180 · 4 calls"
    )
    screenshot(page, "tenants-raised")
