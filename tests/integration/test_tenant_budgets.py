"""Tenant budgets through the HTTP API and the Worker protocol: a tenant's usage summed
over its sessions by UTC day and month (in the snapshot, ``/admin/tenants`` and the
metrics), the budget wait its sessions' turns enter once it is used up, a raise, a removal
and a new day that end it with one model call each, tenants that do not touch each
other, a restart that keeps budget, usage and waits, and bad input that changes nothing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from dex.testing import wait_until
from tests.integration.conftest import (
    Api,
    FakeWorker,
    connect_fake_worker,
)
from tests.integration.test_api import _metrics
from tests.integration.test_budgets import PRICED, answer, run_tool

DAY = 86_400.0


@pytest.fixture
def worker(api: Api) -> Iterator[FakeWorker]:
    with connect_fake_worker(api, agents=[PRICED]) as fake:
        yield fake


def create(api: Api, session_id: str, tenant: str | None) -> None:
    body = {"agent": PRICED.name, "session_id": session_id, "tenant": tenant}
    response = api.http.post("/v1/sessions", json=body)
    assert response.status_code == 201, response.text


def put_budget(api: Api, tenant: str, **body: Any) -> Any:
    return api.http.put(f"/admin/tenants/{tenant}/budget", json=body)


def tenant(api: Api, name: str) -> dict[str, Any]:
    response = api.http.get(f"/admin/tenants/{name}")
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


def step_types(api: Api, session_id: str, turn: int) -> list[str]:
    return [s["type"] for s in api.turn(session_id, turn)["steps"]]


def test_a_tenant_s_day_budget_holds_every_session_of_it_and_a_raise_resumes_each_once(
    api: Api, worker: FakeWorker
) -> None:
    ok = put_budget(api, "acme", max_tokens_per_day=1_000, by="ops")
    assert ok.status_code == 200, ok.text
    assert ok.json()["budget"]["max_tokens_per_day"] == 1_000
    for sid, name in (("a1", "acme"), ("a2", "acme"), ("b1", "beta"), ("n1", None)):
        create(api, sid, name)
    api.send("a1", "hi")
    answer(worker, "a1", (1_000, 100), tool=True)  # a1's call takes acme past its day
    run_tool(worker, "a1")
    reason = "tenant acme: 1100 tokens used today of 1000"
    assert api.turn("a1", 1, wait=10)["status"] == "waiting"
    api.send("a2", "hi")  # another session of acme: its first call waits too
    turn = api.turn("a2", 1, wait=10)
    assert turn["status"] == "waiting"
    [waiting] = turn["waiting_for"]
    assert waiting["kind"] == "budget" and waiting["reason"] == reason
    assert waiting["tenant"] == "acme"  # a client need not read the reason's words
    snapshot = api.snapshot("a2")
    assert snapshot["waiting"] == [] and snapshot["waits"][0]["reason"] == reason
    used = snapshot["session"]["tenant_usage"]
    assert used["today"]["tokens"] == 1_100 and used["this_month"]["calls"] == 1
    assert used["reached"] == reason
    assert snapshot["session"]["usage"]["input_tokens"] == 0  # a2 itself used nothing
    inbox = api.http.get("/v1/inbox", params={"tenant": "acme"}).json()["items"]
    assert sorted((i["session_id"], i["kind"]) for i in inbox) == [
        ("a1", "budget"),
        ("a2", "budget"),
    ]

    for sid in ("b1", "n1"):  # other tenants, and no tenant, are not held
        api.send(sid, "hi")
        answer(worker, sid, (5_000, 5_000))
        assert api.turn(sid, 1, wait=10)["status"] == "completed"

    still = put_budget(api, "acme", max_tokens_per_day=1_050)  # raised, still used up
    assert still.json()["reached"] == "tenant acme: 1100 tokens used today of 1050"
    assert api.turn("a2", 1)["status"] == "waiting"
    raised = put_budget(api, "acme", max_tokens_per_day=10_000)
    assert raised.json()["reached"] is None
    for sid in ("a1", "a2"):
        answer(worker, sid, (10, 1))
        assert api.turn(sid, 1, wait=10)["status"] == "completed"
    assert step_types(api, "a1", 1) == ["RunModel", "CallTool", "AwaitBudget", "RunModel"]
    assert step_types(api, "a2", 1) == ["AwaitBudget", "RunModel"]

    acme = tenant(api, "acme")
    assert acme["today"] == {
        "input_tokens": 1_020,
        "output_tokens": 102,
        "tokens": 1_122,
        "cost_usd": pytest.approx((1_020 * 3 + 102 * 15) / 1e6),
        "calls": 3,
    }
    assert acme["this_month"] == acme["today"]
    listed = api.http.get("/admin/tenants").json()["tenants"]
    assert [t["tenant"] for t in listed] == ["acme", "beta"]
    assert listed[1]["budget"] is None and listed[1]["today"]["tokens"] == 10_000
    m = _metrics(api)
    assert m['dex_tenant_tokens_total{direction="input",tenant="acme"}'] == 1_020
    assert m['dex_tenant_tokens_total{direction="output",tenant="beta"}'] == 5_000
    assert m['dex_tenant_cost_usd_total{tenant="beta"}'] == pytest.approx(0.09)


def test_a_cost_budget_s_removal_resumes_the_wait(api: Api, worker: FakeWorker) -> None:
    put_budget(api, "acme", max_cost_usd_per_month=0.01)
    create(api, "a1", "acme")
    api.send("a1", "hi")
    answer(worker, "a1", (1_000, 1_000))  # $0.018
    api.send("a1", "more")
    turn = api.turn("a1", 2, wait=10)
    assert turn["status"] == "waiting"
    assert turn["waiting_for"][0]["reason"] == "tenant acme: $0.018000 used this month of $0.01"
    removed = api.http.delete("/admin/tenants/acme/budget", params={"by": "ops"})
    assert removed.status_code == 200, removed.text
    assert removed.json()["budget"] is None
    answer(worker, "a1", (1, 1))
    assert api.turn("a1", 2, wait=10)["status"] == "completed"


def test_a_new_day_ends_a_day_budget_s_wait_but_not_a_month_s(api: Api, worker: FakeWorker) -> None:
    clock = api.sessions.clock
    clock.offset = JUNE_10 - time.time()  # the node's clock: mid-month, so a day on stays in it
    put_budget(api, "day", max_tokens_per_day=100)
    put_budget(api, "month", max_tokens_per_month=100)
    for sid, name in (("d1", "day"), ("m1", "month")):
        create(api, sid, name)
        api.send(sid, "hi")
        answer(worker, sid, (100, 0))
        api.send(sid, "more")
        assert api.turn(sid, 2, wait=10)["status"] == "waiting"
    assert tenant(api, "day")["day"] == "2026-06-10"

    clock.offset += DAY  # the 11th: nobody raises anything
    wait_until(lambda: api.turn("d1", 2)["status"] == "running", timeout=10)
    answer(worker, "d1", (1, 1))
    assert api.turn("d1", 2, wait=10)["status"] == "completed"
    assert step_types(api, "d1", 2) == ["AwaitBudget", "RunModel"]
    turn = api.turn("m1", 2)
    assert turn["status"] == "waiting"
    assert turn["waiting_for"][0]["reason"] == "tenant month: 100 tokens used this month of 100"
    day = tenant(api, "day")
    assert (day["day"], day["today"]["tokens"], day["this_month"]["tokens"]) == (
        "2026-06-11",
        2,
        102,
    )


JUNE_10 = 1_781_092_800.0  # 2026-06-10 12:00 UTC
