"""The web console in process: its pages, its refusals (a page with the API's status that
changes nothing), its paging, and its log-in. The browser tests (tests/browser) drive it
with real processes."""

from __future__ import annotations

import html
import re

import pytest
from starlette.testclient import TestClient

from tests.integration.conftest import ADMIN, CLIENT, WORKER, Api
from tests.integration.test_standby import Standby, standby

__all__ = ["standby"]


def message(page: str) -> str:
    """What an error page says was wrong."""
    (said,) = re.findall(r'<p class="message"[^>]*>(.*?)</p>', page, re.S)
    return html.unescape(said)


def test_every_page_renders_with_auth_off(api_with_agent: Api) -> None:
    http = api_with_agent.http
    session_id = api_with_agent.create("s1")["id"]
    pages = ("/ui", "/ui/sessions", "/ui/cluster", "/ui/tenants", f"/ui/sessions/{session_id}")
    for path in pages:
        page = http.get(path)
        assert page.status_code == 200, path
        assert page.headers["content-type"].startswith("text/html")
    listed = http.get("/ui/sessions").text
    assert 'href="/ui/sessions/s1"' in listed
    assert "Log out" not in listed  # no log-in with auth off
    login = http.get("/ui/login?next=/ui/cluster", follow_redirects=False)
    assert (login.status_code, login.headers["location"]) == (303, "/ui/cluster")


@pytest.mark.parametrize(
    ("method", "path", "status", "says"),
    [
        ("GET", "/ui/sessions/nope", 404, "unknown session"),
        ("GET", "/ui/sessions?show=everything", 422, "query.show"),
        ("GET", "/ui/sessions?cursor=bogus", 422, "not one this server gave out"),
        ("GET", "/ui/nothing-here", 404, "Not Found"),
        ("POST", "/ui/sessions/s1/calls/1.1/approve", 404, "no tool call 1.1"),
        ("POST", "/ui/sessions/s1/calls/1.1/deny", 422, "form.reason"),
        ("POST", "/ui/sessions/s1/cancel", 409, "no running turn"),
        ("POST", "/ui/sessions/s1/calls/1.1/reconcile", 422, "form.status"),
        ("POST", "/ui/sessions/s1/messages", 422, "form.text"),
        ("POST", "/ui/sessions/s1/budget", 422, "a budget sets max_tokens"),
    ],
)
def test_bad_input_is_a_4xx_page_that_changes_nothing(
    api_with_agent: Api, method: str, path: str, status: int, says: str
) -> None:
    api_with_agent.create("s1")
    before = api_with_agent.snapshot("s1")
    page = api_with_agent.http.request(method, path, data={})
    assert page.status_code == status, page.text
    assert page.headers["content-type"].startswith("text/html")
    assert says in message(page.text)
    assert "Nothing was changed" in page.text
    assert api_with_agent.snapshot("s1") == before


def test_a_message_sent_from_the_box_is_the_apis_message(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    sent = api_with_agent.http.post(
        "/ui/sessions/s1/messages", data={"text": "  hello  "}, follow_redirects=False
    )
    assert (sent.status_code, sent.headers["location"]) == (303, "/ui/sessions/s1#send")
    snapshot = api_with_agent.snapshot("s1")
    assert snapshot["session"]["messages_received"] == 1
    assert snapshot["history"][0] == {"type": "user", "text": "hello"}
    page = api_with_agent.http.get("/ui/sessions/s1").text
    assert re.search(r'class="msg user"[^>]*data-turn="1"', page)
    assert '<p class="text">hello</p>' in page


def test_the_budget_form_sets_and_removes_the_api_s_budget(api_with_agent: Api) -> None:
    api_with_agent.create("s1")
    http = api_with_agent.http
    refused = http.post("/ui/sessions/s1/budget", data={"max_tokens": "many"})
    assert refused.status_code == 422 and "form.max_tokens" in message(refused.text)
    assert api_with_agent.snapshot("s1")["session"]["budget"] is None
    set_ = http.post(
        "/ui/sessions/s1/budget",
        data={"max_tokens": "5000", "max_cost_usd": ""},
        follow_redirects=False,
    )
    assert (set_.status_code, set_.headers["location"]) == (303, "/ui/sessions/s1")
    budget = {"max_tokens": 5000, "max_cost_usd": None}
    assert api_with_agent.snapshot("s1")["session"]["budget"] == budget
    assert "5,000 tokens" in http.get("/ui/sessions/s1").text
    http.post("/ui/sessions/s1/budget", data={"remove": "1", "max_tokens": "5000"})
    assert api_with_agent.snapshot("s1")["session"]["budget"] is None


def test_the_session_list_pages_by_the_fleet_cursor_newest_first(api_with_agent: Api) -> None:
    for n in range(55):
        api_with_agent.create(f"s{n:02d}")
    first = api_with_agent.http.get("/ui/sessions").text
    shown = re.findall(r'data-session="(s\d+)"', first)
    assert shown == [f"s{n:02d}" for n in range(54, 4, -1)]  # 50, the newest first
    (cursor,) = re.findall(r'cursor=([^"&]+)"', first)
    second = api_with_agent.http.get(f"/ui/sessions?show=all&cursor={cursor}").text
    assert re.findall(r'data-session="(s\d+)"', second) == ["s04", "s03", "s02", "s01", "s00"]
    assert "Next page" not in second
    failed = api_with_agent.http.get("/ui/sessions?show=failed").text
    assert re.findall(r'data-session="(s\d+)"', failed) == []


def test_with_auth_on_a_page_without_a_token_is_the_log_in_form(guarded: TestClient) -> None:
    refused = guarded.get("/ui/sessions")
    assert refused.status_code == 401
    assert refused.headers["content-type"].startswith("text/html")
    assert 'name="token"' in refused.text
    assert guarded.get("/ui/static/console.js").status_code == 200  # open, like the form
    assert guarded.get("/ui/login").status_code == 200


@pytest.mark.parametrize(
    ("token", "status", "says"),
    [("", 400, "enter a token"), ("nope", 401, "not valid"), (WORKER, 403, "needs a client")],
)
def test_the_log_in_form_refuses_what_the_api_refuses(
    guarded: TestClient, token: str, status: int, says: str
) -> None:
    refused = guarded.post("/ui/login", data={"token": token}, follow_redirects=False)
    assert refused.status_code == status
    assert says in refused.text
    assert "set-cookie" not in refused.headers


@pytest.mark.parametrize("token", [CLIENT, ADMIN])
def test_a_client_or_admin_token_logs_in_and_the_cookie_opens_console_paths_only(
    guarded: TestClient, token: str
) -> None:
    logged_in = guarded.post(
        "/ui/login", data={"token": token, "next": "/ui/cluster"}, follow_redirects=False
    )
    assert logged_in.status_code == 303
    assert logged_in.headers["location"] == "/ui/cluster"
    cookie = logged_in.headers["set-cookie"]
    assert "HttpOnly" in cookie and "Path=/ui" in cookie and "SameSite=strict" in cookie
    value = guarded.cookies["dex_console_token"]
    assert guarded.get("/ui/cluster").status_code == 200
    assert "Log out" in guarded.get("/ui/cluster").text
    # the JSON API stays bearer-only: the same token as a cookie opens nothing there
    as_cookie = {"cookie": f"dex_console_token={value}"}
    assert guarded.get("/v1/sessions", headers=as_cookie).status_code == 401
    assert guarded.post("/ui/logout", follow_redirects=False).status_code == 303
    guarded.cookies.clear()
    assert guarded.get("/ui/cluster").status_code == 401


def test_a_worker_token_may_not_read_the_console_and_a_bearer_header_works_too(
    guarded: TestClient,
) -> None:
    forbidden = guarded.get("/ui", headers={"authorization": f"Bearer {WORKER}"})
    assert forbidden.status_code == 403
    assert "needs a client token" in forbidden.text
    assert guarded.get("/ui", headers={"authorization": f"Bearer {CLIENT}"}).status_code == 200


def test_after_logging_in_it_goes_back_to_a_console_page_never_another_site(
    guarded: TestClient,
) -> None:
    for target in ("https://elsewhere.example/", "//elsewhere.example/ui", "/v1/sessions"):
        logged_in = guarded.post(
            "/ui/login", data={"token": CLIENT, "next": target}, follow_redirects=False
        )
        assert logged_in.headers["location"] == "/ui", target


def test_a_standby_console_shows_its_role_and_serves_sessions_once_it_leads(
    standby: Standby,
) -> None:
    http = standby.http
    refused = http.get("/ui/sessions")
    assert refused.status_code == 503
    assert "it is standby" in message(refused.text)
    waiting = http.get("/ui/cluster")
    assert waiting.status_code == 200
    assert re.search(r'id="role">standby<', waiting.text)
    standby.grant()
    assert http.get("/ui/sessions").status_code == 200
    cluster = http.get("/ui/cluster").text
    assert re.search(r'id="role">active<', cluster) and re.search(r'id="epoch">7<', cluster)
