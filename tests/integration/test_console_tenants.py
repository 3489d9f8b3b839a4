"""The console's Tenants page in process: each tenant's budget and usage, its forms that
set and remove a budget through the API's own routes (a refusal is a 4xx page that changes
nothing), the admin token it needs, and the session page of a tenant's session: its
tenant's usage, and a wait on its tenant's budget that a raise from the page ends. The
browser test (tests/browser) drives it with real processes."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.integration.conftest import ADMIN, CLIENT, Api, FakeWorker, connect_fake_worker
from tests.integration.test_budgets import PRICED, answer, run_tool
from tests.integration.test_console import message
from tests.integration.test_tenant_budgets import create, tenant


@pytest.fixture
def worker(api: Api) -> Iterator[FakeWorker]:
    with connect_fake_worker(api, agents=[PRICED]) as fake:
        yield fake


def post(api: Api, **fields: str) -> Any:
    return api.http.post("/ui/tenants", data=fields, follow_redirects=False)


def row(page: str, name: str) -> str:
    """The tenants page's row of ``name`` (its cells, without its form)."""
    (found,) = re.findall(rf'<tr id="tenant-{re.escape(name)}".*?</tr>', page, re.S)
    return re.sub(r"<[^>]+>", " ", found)


def test_the_tenants_page_sets_shows_and_removes_a_tenant_s_budget(api: Api) -> None:
    empty = api.http.get("/ui/tenants")
    assert empty.status_code == 200 and empty.headers["content-type"].startswith("text/html")
    assert "No tenant has a budget" in empty.text
    assert 'href="/ui/tenants"' in api.http.get("/ui").text  # in the nav

    set_ = post(api, tenant="acme", max_tokens_per_day="1000", max_cost_usd_per_month="5")
    assert (set_.status_code, set_.headers["location"]) == (303, "/ui/tenants#tenant-acme")
    assert tenant(api, "acme")["budget"] == {
        "max_tokens_per_day": 1_000,
        "max_cost_usd_per_day": None,
        "max_tokens_per_month": None,
        "max_cost_usd_per_month": 5.0,
    }
    page = api.http.get("/ui/tenants").text
    shown = " ".join(row(page, "acme").split())
    assert "1,000 tokens a day, $5 a month" in shown
    assert "0 tokens · $0.0000 · 0 calls" in shown and "used up" not in shown
    assert 'name="max_tokens_per_day" type="number"' in page
    assert 'value="1000"' in page  # the form shows the budget it changes

    again = post(api, tenant="acme", max_tokens_per_month="20000")  # replaces the budget
    assert again.status_code == 303
    assert tenant(api, "acme")["budget"]["max_tokens_per_month"] == 20_000
    assert tenant(api, "acme")["budget"]["max_tokens_per_day"] is None
    removed = post(api, tenant="acme", remove="1", max_tokens_per_day="7")
    assert removed.status_code == 303
    assert tenant(api, "acme")["budget"] is None


@pytest.mark.parametrize(
    ("fields", "says"),
    [
        ({"tenant": "", "max_tokens_per_day": "5"}, "form.tenant"),
        ({"tenant": "no such name", "max_tokens_per_day": "5"}, "form.tenant"),
        ({"tenant": "acme", "max_tokens_per_day": "many"}, "form.max_tokens_per_day"),
        ({"tenant": "acme", "max_cost_usd_per_day": "-1"}, "form.max_cost_usd_per_day"),
        ({"tenant": "acme", "max_tokens_per_day": ""}, "a tenant's budget sets"),
    ],
)
def test_a_bad_tenant_form_is_a_422_page_that_changes_nothing(
    api: Api, fields: dict[str, str], says: str
) -> None:
    post(api, tenant="acme", max_tokens_per_day="1000")
    refused = post(api, **fields)
    assert refused.status_code == 422, refused.text
    assert says in message(refused.text)
    assert "Nothing was changed" in refused.text
    assert tenant(api, "acme")["budget"]["max_tokens_per_day"] == 1_000
    assert [t["tenant"] for t in api.http.get("/admin/tenants").json()["tenants"]] == ["acme"]


def test_the_tenants_page_needs_an_admin_token(guarded: TestClient) -> None:
    client = {"authorization": f"Bearer {CLIENT}"}
    refused = guarded.get("/ui/tenants", headers=client)
    assert refused.status_code == 403 and 'name="token"' in refused.text  # the log-in form
    assert "needs a admin token" in refused.text
    acted = guarded.post("/ui/tenants", headers=client, data={"tenant": "acme", "remove": "1"})
    assert acted.status_code == 403
    assert guarded.get("/ui/sessions", headers=client).status_code == 200
    admin = {"authorization": f"Bearer {ADMIN}"}
    assert guarded.get("/ui/tenants", headers=admin).status_code == 200
    guarded.post("/ui/login", data={"token": ADMIN})  # the console's cookie opens it too
    assert guarded.get("/ui/tenants").status_code == 200


def test_a_session_page_shows_its_tenant_s_budget_wait_and_a_raise_from_the_page_ends_it(
    api: Api, worker: FakeWorker
) -> None:
    post(api, tenant="acme", max_tokens_per_day="1000")
    create(api, "a1", "acme")
    create(api, "n1", None)
    assert 'id="tenant-usage"' not in api.http.get("/ui/sessions/n1").text  # no tenant
    api.send("a1", "hi")
    answer(worker, "a1", (1_000, 100), tool=True)  # takes acme past its day
    run_tool(worker, "a1")
    assert api.turn("a1", 1, wait=10)["status"] == "waiting"

    reason = "tenant acme: 1100 tokens used today of 1000"
    page = api.http.get("/ui/sessions/a1").text
    (wait,) = re.findall(r'<div class="wait budget tenant-budget".*?</div>', page, re.S)
    assert "waits for its tenant's budget" in wait and reason in wait
    assert 'href="/ui/tenants#tenant-acme"' in wait
    assert "budget-form" not in wait  # the session's own budget is not what it waits for
    assert "budget-change" in page  # which stays to change, as with no wait
    (usage,) = re.findall(r'<dd id="tenant-usage">(.*?)</dd>', page, re.S)
    usage = " ".join(re.sub(r"<[^>]+>", " ", usage).split())
    assert usage == (
        "1,000 tokens a day · today 1,100 tokens · $0.0045 · 1 call · this month 1,100 tokens"
        f" · $0.0045 · 1 call · used up {reason}"
    )
    listed = " ".join(row(api.http.get("/ui/tenants").text, "acme").split())
    assert f"used up {reason}" in listed

    raised = post(api, tenant="acme", max_tokens_per_day="10000")
    assert raised.status_code == 303
    answer(worker, "a1", (10, 1))
    assert api.turn("a1", 1, wait=10)["status"] == "completed"
    page = api.http.get("/ui/sessions/a1").text
    assert "tenant-budget" not in page and "used up" not in page
