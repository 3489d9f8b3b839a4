"""The screenshots of docs/console.md (docs/img/console-*.png), taken from real processes.

A ``dex server`` and a ``dex worker`` (capacity 3) serving a scripted support agent, a
few sessions in the states a person meets (a conversation where a question was answered
and a refund sent from the page waits for approval, then is approved; questions and
refunds waiting; finished conversations; reports that fill the Worker so one more waits
in the queue), and Debian's Chromium (``scripts/browser``) driven by Playwright:

    PYTHONPATH=src .venv/bin/python scripts/console-screenshots.py [OUT_DIR]

OUT_DIR defaults to docs/img. Everything else lives in a temporary directory, and every
process started here is stopped at the end.
"""

from __future__ import annotations

import sys
import tempfile
import textwrap
from pathlib import Path

from playwright.sync_api import FloatRect, Page, ViewportSize, expect, sync_playwright

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until

CHROMIUM = "/usr/bin/chromium"
VIEWPORT: ViewportSize = {"width": 1320, "height": 760}

AGENTS = '''
import asyncio

import dex
from dex.models import Scripted, say
from dex.wire import AssistantItem, ModelResponse, ModelToolCall, Usage, UserItem


@dex.tool(kind="read")
async def lookup_order(order_id: str) -> dict:
    """An order, as the shop's database has it."""
    return {"order_id": order_id, "status": "delivered", "total": 49.90, "charges": 2}


@dex.tool(kind="write", approval=True)
async def refund(order_id: str, amount: float) -> str:
    """Refund a charge: a person approves it first."""
    return f"refunded {amount} on order {order_id}"


@dex.tool(kind="idempotent_write")
async def ship_replacement(order_id: str, ctx: dex.ToolContext) -> str:
    """Ship a replacement, once the customer's address is known."""
    where = await ctx.ask(f"Ship the replacement of order {order_id} to which address?",
                          choices=["home", "office"])
    return f"replacement of {order_id} ships to {where}"


@dex.tool(kind="read")
async def build_report(name: str) -> str:
    """A slow report."""
    await asyncio.sleep(600)
    return f"report {name}"


def script(history):
    last = max(i for i, item in enumerate(history) if isinstance(item, UserItem))
    text = history[last].text
    done = sum(isinstance(item, AssistantItem) for item in history[last + 1:])

    def calls(*wanted):
        return [ModelToolCall(id=f"c{i}", name=n, arguments=a) for i, (n, a) in enumerate(wanted)]

    if text.startswith("refund "):
        order = text.split()[1]
        if done == 0:
            return ModelResponse(text=f"Let me look up order {order}.",
                                 tool_calls=calls(("lookup_order", {"order_id": order})),
                                 stop_reason="tool_use")
        if done == 1:
            return ModelResponse(
                text=f"Order {order} was charged twice: two charges of 49.90 for one "
                "delivery. I will refund the second charge, 49.90, to the card it came "
                "from. A refund needs a person's approval: it waits for yours.",
                tool_calls=calls(("refund", {"order_id": order, "amount": 49.90})),
                stop_reason="tool_use")
        return say("Done: the second charge is refunded.")
    if text.startswith("broken "):
        order = text.split()[1]
        if done == 0:
            return ModelResponse(text="I am sorry it arrived broken: I will send another.",
                                 tool_calls=calls(("ship_replacement", {"order_id": order})),
                                 stop_reason="tool_use")
        return say("The replacement is on its way.")
    if text.startswith("reports"):
        if done == 0:
            names = ["sales", "returns", "stock", "refunds"]
            return ModelResponse(tool_calls=calls(*[("build_report", {"name": n}) for n in names]),
                                 stop_reason="tool_use")
        return say("The reports are ready.")
    return say(f"Our opening hours are 9:00 to 18:00, Monday to Friday. You asked: {text}")


support = dex.Agent(
    name="support",
    model=Scripted(script, chunk_chars=5, delay_per_chunk=0.02),
    instructions="You help the shop's customers.",
    tools=[lookup_order, refund, ship_replacement, build_report],
)


def quote(history):
    answer = say("Here is your quote: 3 seats at 49.90 a month.")
    answer.usage = Usage(input_tokens=60_000, output_tokens=4_000)  # a long document read
    return answer


quotes = dex.Agent(name="quotes", model=Scripted(quote, name="claude-sonnet-4-5"))
'''


def shoot(page: Page, out: Path, name: str, most: int = VIEWPORT["height"]) -> None:
    """The page's top: as tall as its content, at most ``most`` pixels."""
    height = page.evaluate(
        "document.querySelector('main').getBoundingClientRect().bottom + window.scrollY"
    )
    clip: FloatRect = {"x": 0, "y": 0, "width": VIEWPORT["width"], "height": min(most, height)}
    path = out / f"{name}.png"
    page.screenshot(path=path, clip=clip, full_page=True)
    print(f"{path}: {path.stat().st_size // 1024} KB")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="dex-console-shots-") as tmp_dir:
        tmp = Path(tmp_dir)
        module = tmp / "shop.py"
        module.write_text(textwrap.dedent(AGENTS))
        server = ServerProcess(tmp / "data")
        worker = WorkerProcess(str(module), server.address, tmp / "worker.log", capacity=3)
        client = dex.SyncClient(server.address, timeout=30)
        try:
            server.start()
            worker.start()
            wait_until(lambda: client.list_agents(), 20, what="the Worker registered its agent")
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(
                    executable_path=CHROMIUM, args=["--headless", "--no-sandbox"]
                )
                page = browser.new_context(viewport=VIEWPORT).new_page()
                page.set_default_timeout(20_000)
                scene(page, client, server.address, out)
                browser.close()
        finally:
            client.close()
            worker.kill()
            server.kill()


def scene(page: Page, client: dex.SyncClient, address: str, out: Path) -> None:
    for sid, text in [("hours-311", "When are you open?"), ("hours-312", "Open on Saturday?")]:
        client.create_session("support", sid)
        client.send_message(sid, text, wait=True)

    # a conversation on an open session page: a question answered from the page, then a
    # refund sent from the page's message box, which streams and waits for approval
    client.create_session("support", "order-2077")
    page.goto(f"{address}/ui/sessions/order-2077")
    client.send_message("order-2077", "broken 2077")
    page.locator(".wait.question").get_by_role("button", name="office").click()
    said = page.locator("#conversation .msg")
    expect(said.last).to_contain_text("The replacement is on its way.")
    page.locator("#send textarea").fill("refund 2077")
    page.locator("#send").get_by_role("button", name="Send").click()
    expect(page.locator(".wait.approval")).to_contain_text("refund")
    expect(said.last).to_contain_text("waits for yours.")
    shoot(page, out, "console-session", most=1500)
    page.locator(".wait.approval").get_by_role("button", name="Approve").click()
    expect(said.last).to_contain_text("Done: the second charge is refunded.")
    shoot_conversation(page, out, "console-conversation")

    for sid, text in [
        ("refund-1042", "refund 1042"),
        ("broken-2078", "broken 2078"),
        ("refund-1187", "refund 1187"),
    ]:
        client.create_session("support", sid)
        client.send_message(sid, text, wait=True)
    wait_until(lambda: len(client.list_inbox()["items"]) == 3, 20, what="three waits")
    page.goto(f"{address}/ui")
    expect(page.locator("table.inbox tbody tr")).to_have_count(3)
    shoot(page, out, "console-inbox")

    # four slow reports on a Worker of capacity 3: one waits in the queue
    client.create_session("support", "reports-q3")
    client.send_message("reports-q3", "reports")
    wait_until(
        lambda: client.get_agent_snapshot("reports-q3")["waiting"], 20, what="a queued report"
    )
    page.goto(f"{address}/ui/sessions")
    expect(page.locator("table.sessions tbody tr")).to_have_count(7)
    shoot(page, out, "console-sessions")
    page.goto(f"{address}/ui/cluster")
    expect(page.locator("table.queued tbody tr")).to_have_count(1)
    shoot(page, out, "console-cluster")

    # tenants: acme's sessions use up its day budget (64,000 tokens a call), and its next
    # turn waits for an admin to raise it; globex is well within its own. The slow reports
    # are cancelled first: they hold the Worker's every slot
    client.cancel_turn("reports-q3", "the screenshots are taken")
    client.set_tenant_budget("acme", max_tokens_per_day=100_000, max_cost_usd_per_month=50)
    client.set_tenant_budget("globex", max_cost_usd_per_day=5)
    for sid, tenant in [("acme-quote-1", "acme"), ("acme-quote-2", "acme"), ("globex-1", "globex")]:
        client.create_session("quotes", sid, tenant=tenant)
        turn = client.send_message(sid, "A quote for 3 seats, please.")["turn"]
        client.wait_turn(sid, turn, timeout=20)
    client.send_message("acme-quote-1", "And for 5 seats?")
    wait_until(
        lambda: client.get_tenant("acme")["reached"] and client.list_inbox(tenant="acme")["items"],
        20,
        what="acme's turn waits for its budget",
    )
    page.goto(f"{address}/ui/tenants")
    expect(page.locator("tr#tenant-acme td.reached")).to_contain_text("used up")
    shoot(page, out, "console-tenants")


def shoot_conversation(page: Page, out: Path, name: str) -> None:
    """The conversation alone, with the message box."""
    box = page.locator("section.conversation").bounding_box()
    assert box is not None
    clip: FloatRect = {
        "x": 0,
        "y": box["y"] - 8,
        "width": VIEWPORT["width"],
        "height": box["height"] + 16,
    }
    path = out / f"{name}.png"
    page.screenshot(path=path, clip=clip, full_page=True)
    print(f"{path}: {path.stat().st_size // 1024} KB")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("docs/img"))
