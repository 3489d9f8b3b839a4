"""What the node does about browsers (``dex.server.api.browsers``), in process: a request
that a page of another site makes a browser send is refused with 403 and changes nothing,
on the console and on the API, with auth off and on; the console's own requests, and
programs', go on; the console's pages carry their security headers; and a 429 on a
console path is a page (a 500: test_api_errors). The browser test
(tests/browser/test_cross_site.py) forges such a request in Chromium."""

from __future__ import annotations

from pathlib import Path

import pytest
from starlette.testclient import TestClient, WebSocketDenialResponse

from dex.server.api.browsers import CSP
from dex.server.app import asgi
from dex.server.config import ServerConfig
from tests.integration.conftest import AGENT, CLIENT, Api, fastapi_of
from tests.integration.test_console import message

HERE = "http://testserver"
"""The origin of the pages TestClient's server serves (its Host is ``testserver``)."""
ELSEWHERE = "http://evil.example"

FORGED = {
    "sec-fetch-site: cross-site": {"sec-fetch-site": "cross-site", "origin": ELSEWHERE},
    # another port of the same host is the same site, and still another origin
    "sec-fetch-site: same-site": {"sec-fetch-site": "same-site", "origin": "http://testserver:1"},
    # Sec-Fetch-Site is the browser's word: a matching Origin does not outweigh it
    "cross-site with our origin": {"sec-fetch-site": "cross-site", "origin": HERE},
    "origin of another site": {"origin": ELSEWHERE},
    "origin of another port": {"origin": "http://testserver:8080"},
    "origin null": {"origin": "null"},
    "referer of another site": {"referer": f"{ELSEWHERE}/page.html"},
}
"""What a browser sends with a request that a page of another site makes it send (one
browser sends Sec-Fetch-Site, an older one only Origin, or only a Referer)."""
OURS = {
    "sec-fetch-site: same-origin": {"sec-fetch-site": "same-origin", "origin": HERE},
    "sec-fetch-site: none": {"sec-fetch-site": "none"},
    "our origin": {"origin": HERE},
    "our referer": {"referer": f"{HERE}/ui/sessions/s1"},
    "behind a proxy": {"origin": "https://dex.example.com", "x-forwarded-host": "dex.example.com"},
    "not a browser": {},
}
"""What a browser sends with the console's own requests, and a program with its own."""


def sent(api: Api) -> int:
    received: int = api.snapshot("s1")["session"]["messages_received"]
    return received


@pytest.mark.parametrize("headers", FORGED.values(), ids=FORGED.keys())
def test_a_form_of_another_site_is_refused_and_changes_nothing(
    api_with_agent: Api, headers: dict[str, str]
) -> None:
    api_with_agent.create("s1")
    before = api_with_agent.snapshot("s1")
    for path, form in [
        ("/ui/sessions/s1/messages", {"text": "hello"}),
        ("/ui/sessions/s1/cancel", {}),
        ("/ui/sessions/s1/calls/1.1/approve", {}),
        ("/ui/tenants", {"tenant": "acme", "max_tokens_per_day": "5"}),  # an admin's form
        ("/ui/login", {"token": "x"}),
        ("/ui/logout", {}),
    ]:
        refused = api_with_agent.http.post(path, data=form, headers=headers)
        assert refused.status_code == 403, (path, refused.text)
        assert refused.headers["content-type"].startswith("text/html")
        assert "cross_site" in refused.text and "Nothing was changed" in refused.text
        assert "may not send" in message(refused.text)
        assert refused.headers["content-security-policy"] == CSP
    assert api_with_agent.snapshot("s1") == before
    assert api_with_agent.http.get("/admin/tenants").json()["tenants"] == []


@pytest.mark.parametrize("headers", OURS.values(), ids=OURS.keys())
def test_the_console_s_own_form_and_a_program_s_request_go_on(
    api_with_agent: Api, headers: dict[str, str]
) -> None:
    api_with_agent.create("s1")
    done = api_with_agent.http.post(
        "/ui/sessions/s1/messages", data={"text": "hello"}, headers=headers, follow_redirects=False
    )
    assert (done.status_code, done.headers["location"]) == (303, "/ui/sessions/s1#send")
    assert sent(api_with_agent) == 1


def test_with_auth_on_a_form_of_another_site_is_refused_even_with_the_cookie(
    guarded: TestClient,
) -> None:
    api = Api(guarded, fastapi_of(guarded.app))
    api.register(AGENT)
    guarded.headers["authorization"] = f"Bearer {CLIENT}"
    api.create("s1")
    del guarded.headers["authorization"]
    logged_in = guarded.post("/ui/login", data={"token": CLIENT}, follow_redirects=False)
    assert logged_in.status_code == 303  # the cookie is set: the browser sends it
    # a page on another port of the same host is the same site, so SameSite=Strict sends
    # the cookie with its form: the origin check is what refuses it
    forged = {"sec-fetch-site": "same-site", "origin": "http://testserver:1"}
    refused = guarded.post("/ui/sessions/s1/messages", data={"text": "hi"}, headers=forged)
    assert refused.status_code == 403
    assert "cross_site" in refused.text
    own = guarded.post(
        "/ui/sessions/s1/messages",
        data={"text": "hi"},
        headers={"sec-fetch-site": "same-origin"},
        follow_redirects=False,
    )
    assert own.status_code == 303, own.text
    guarded.headers["authorization"] = f"Bearer {CLIENT}"
    assert sent(api) == 1  # the console's own, only


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/sessions/s1/messages", '{"text": "hello"}'),
        ("/v1/sessions/s1/cancel", '{"reason": "forged"}'),
        ("/admin/step-down", ""),  # no body: no content type refuses it
    ],
)
def test_on_the_api_a_request_of_another_site_is_refused_as_json(
    api_with_agent: Api, path: str, body: str
) -> None:
    api_with_agent.create("s1")
    before = api_with_agent.snapshot("s1")
    refused = api_with_agent.http.post(
        path, content=body, headers={"content-type": "text/plain", "origin": ELSEWHERE}
    )
    assert refused.status_code == 403, refused.text
    assert refused.json()["error"]["code"] == "cross_site"
    assert "content-security-policy" not in refused.headers
    assert api_with_agent.snapshot("s1") == before


@pytest.mark.parametrize("content_type", [None, "text/plain", "application/x-www-form-urlencoded"])
def test_the_api_reads_a_body_only_as_json_so_a_simple_cross_site_request_cannot_act(
    api_with_agent: Api, content_type: str | None
) -> None:
    """A request a page can send without asking the node first (no preflight) has no
    content type, or one of these: the body is refused, whoever sent it."""
    api_with_agent.create("s1")
    headers = {"content-type": content_type} if content_type else {}
    refused = api_with_agent.http.post(
        "/v1/sessions/s1/messages", content=b'{"text": "hello"}', headers=headers
    )
    assert refused.status_code == 422, refused.text
    assert sent(api_with_agent) == 0


def test_a_page_of_another_site_may_not_open_the_worker_channel(api_with_agent: Api) -> None:
    http = api_with_agent.http
    with (
        pytest.raises(WebSocketDenialResponse) as refused,
        http.websocket_connect("/v1/workers/connect", headers={"origin": ELSEWHERE}),
    ):
        pass
    assert refused.value.status_code == 403
    assert "cross_site" in refused.value.text
    with http.websocket_connect("/v1/workers/connect", headers={"origin": HERE}):
        pass  # a page of the node's own origin may (auth decides the rest)


def test_console_pages_carry_the_security_headers_and_the_api_does_not(
    api_with_agent: Api,
) -> None:
    api_with_agent.create("s1")
    http = api_with_agent.http
    for path in ("/ui", "/ui/sessions/s1", "/ui/static/console.js", "/ui/sessions/nope"):
        answer = http.get(path)
        assert answer.headers["content-security-policy"] == CSP, path
        assert answer.headers["x-frame-options"] == "DENY"
        assert answer.headers["referrer-policy"] == "same-origin"
        assert answer.headers["x-content-type-options"] == "nosniff"
    assert "frame-ancestors 'none'" in CSP and "'unsafe-inline'" not in CSP
    page = http.get("/ui/sessions/s1").text
    assert "<script>" not in page and "javascript:" not in page  # nothing inline to run
    assert "content-security-policy" not in http.get("/v1/sessions").headers


def test_the_log_in_page_carries_them_too(guarded: TestClient) -> None:
    refused = guarded.get("/ui/sessions")
    assert refused.status_code == 401
    assert refused.headers["content-security-policy"] == CSP
    assert "<script>" not in refused.text


def test_over_the_rate_limit_a_console_page_is_a_page_and_the_api_stays_json(
    tmp_path: Path,
) -> None:
    with TestClient(asgi(ServerConfig(data_dir=tmp_path, rate_limit="2/minute"))) as http:
        assert [http.get("/ui").status_code for _ in range(2)] == [200, 200]
        over = http.get("/ui")
        assert over.status_code == 429
        assert over.headers["content-type"].startswith("text/html")
        assert "try again in" in message(over.text)
        assert int(over.headers["retry-after"]) > 0
        assert over.headers["x-frame-options"] == "DENY"
        api = http.get("/v1/sessions")
        assert api.status_code == 429
        assert api.json()["error"]["code"] == "rate_limited"
