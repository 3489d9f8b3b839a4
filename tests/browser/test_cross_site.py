"""A page of another origin (another site, or another port of the console's host) forges
the console's approval in Chromium: its form and its ``fetch`` reach the server, which
refuses them and changes nothing; the same approval from the console's own page runs the
tool, once. The tools' own ledger says what ran."""

from __future__ import annotations

import html
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from playwright.sync_api import Page, expect

from dex.testing import free_port, wait_until
from tests.support.rig import Rig

FORGERY = """<!doctype html>
<title>Win a prize</title>
<form id="forged" method="post" action="{console}">
  <input type="hidden" name="arguments_hash" value="{arguments_hash}">
</form>
<script>
  // the API's approval as a request needing no preflight (a text/plain body), then the
  // console's form, sent as the page loads
  fetch("{api}", {{method: "POST", mode: "no-cors", body: '{{"by": "a prize"}}'}})
    .finally(() => document.getElementById("forged").submit());
</script>
"""


@contextmanager
def other_site(host: str, page_html: str) -> Iterator[str]:
    """A web server on ``host`` and another port than the console's (its origin is
    another) serving one page; its address."""
    body = page_html.encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet

    port = free_port()
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{host}:{port}/prize.html"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


@pytest.mark.parametrize(
    "host",
    [
        "localhost",  # another site: Sec-Fetch-Site: cross-site
        # the console's host on another port: the same site (a SameSite=Strict cookie
        # goes with its requests), another origin: Sec-Fetch-Site: same-site
        "127.0.0.1",
    ],
)
def test_a_page_of_another_origin_cannot_approve_and_the_console_can(
    rig: Rig, page: Page, host: str
) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session("waiter")
    turn = rig.call(sid, ("delete_all", {}))
    wait_until(lambda: rig.client.list_inbox()["items"], 10, what="the approval is in the inbox")
    (wait,) = rig.client.list_inbox()["items"]
    call = wait["call_id"]
    forgery = FORGERY.format(
        console=f"{rig.server.address}/ui/sessions/{sid}/calls/{call}/approve",
        api=f"{rig.server.address}/v1/sessions/{sid}/tool_calls/{call}/approve",
        arguments_hash=html.escape(wait["arguments_hash"]),
    )

    with other_site(host, forgery) as prize:
        answers: list[tuple[str, str, int]] = []
        page.on(
            "response",
            lambda r: answers.append((r.request.method, r.url, r.status)),
        )
        page.goto(prize)
        # the forged form reached the server, and was refused: the console's error page
        expect(page.locator(".error h1")).to_contain_text("403 · cross_site")
        expect(page.locator(".error .message")).to_contain_text("another origin")
    assert any(m == "POST" and "/ui/" in url and s == 403 for m, url, s in answers), answers

    # nothing changed: the call still waits, and the tool never ran
    snapshot = rig.client.get_agent_snapshot(sid)
    assert snapshot["session"]["status"] == "waiting"
    assert [w["call_id"] for w in rig.client.list_inbox()["items"]] == [call]
    assert [c["status"] for c in snapshot["current_turn"]["tool_calls"]] == ["pending"]
    assert rig.ledger.entries("delete_all") == []

    # the same approval, from the console's own page
    page.goto(f"{rig.server.address}/ui/sessions/{sid}")
    page.locator(".wait.approval").get_by_role("button", name="Approve").click()
    expect(page.locator(".waits")).to_have_count(0)
    (done,) = rig.wait_turn(sid, turn)["tool_calls"]
    assert (done["status"], done["approval"]["by"]) == ("succeeded", "console")
    assert len(rig.ledger.entries("delete_all")) == 1
