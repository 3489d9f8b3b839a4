"""Tenants: a client token scoped to a tenant sees and changes only its tenant's sessions.

Every route of the app's route table is tried: each route about one session (a
``{session_id}`` in its path) answers a scoped token, for a session of another tenant or
of none, exactly what it answers for a session that does not exist, and changes nothing;
every other client route is listed below with how it keeps to the tenant (a new route
that is not fails the test: decide before it ships)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.routing import BaseRoute
from starlette.testclient import TestClient
from typer.testing import CliRunner

import dex
from dex.cli.chat import open_session
from dex.cli.main import app as cli
from dex.errors import AuthError, InvalidInput, NotFound
from dex.server.api.auth import Role, role_for
from dex.server.api.tokens import read_file
from dex.server.app import asgi
from dex.server.config import ServerConfig
from dex.server.pages import PREFIX
from dex.testing import wait_until_async
from tests.integration.conftest import (
    ADMIN,
    CLIENT,
    FAST_WORKER,
    HELPER,
    WORKER,
    Api,
    connect_fake_worker,
    fastapi_of,
    run_server,
)
from tests.integration.test_api import Response, assert_error
from tests.integration.test_auth import bearer, entry, routes
from tests.integration.test_fleet_api import GATED, charge, model_calls

ACME, BOLT = "acme-secret", "bolt-secret"
"""Client tokens scoped to the tenants ``acme`` and ``bolt``."""

ACROSS = {
    "create_session": "a scoped token creates in its tenant; another tenant is a 403",
    "list_sessions": "the token's tenant's sessions only; ?tenant= of another is a 403",
    "list_inbox": "the token's tenant's waits only; ?tenant= of another is a 403",
    "console_inbox": "the console's inbox: the token's tenant's waits only",
    "console_sessions": "the console's session list: the token's tenant's sessions only",
}
"""Client routes across sessions, each narrowed to the scoped token's tenant (tested below)."""
UNSCOPED = {
    "list_workers": "Workers with the attempts they run: other tenants' session ids",
    "get_cluster": "the nodes of the cluster: an operator's view",
    "console_cluster": "the console's nodes and Workers, with other tenants' attempts",
}
"""Client routes a scoped token is refused (403): they show every tenant's sessions."""
SHARED = {
    "list_agents": "the agents Workers serve: every tenant uses the same, no session data",
}
"""Client routes that hold nothing of any session: the same for every token."""

BODIES: dict[str, dict[str, Any]] = {
    "fork_session": {"turn": 2},
    "send_message": {"text": "hello"},
    "approve": {"by": "acme"},
    "deny": {"reason": "no"},
    "answer": {"answer": "M"},
    "cancel": {},
    "reconcile": {"status": "failed", "error": "it did not happen"},
    "console_approve": {},
    "console_deny": {"reason": "no"},
    "console_answer": {"answer": "M"},
    "console_reconcile": {"status": "failed", "note": "it did not happen"},
    "console_send": {"text": "hello"},
    "console_cancel": {},
    "set_budget": {"max_tokens": 10},
    "console_budget": {"max_tokens": "10"},
}
"""A body each session route would act on, were the session the token's."""


@pytest.fixture
def api(tmp_path: Path) -> Iterator[Api]:
    """A node with a tokens file: ``ACME`` and ``BOLT`` scoped, ``CLIENT`` unscoped; the
    test client sends the admin token unless a request says otherwise."""
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        entry("client", ACME, "acme-app", tenant="acme")
        + entry("client", BOLT, "bolt-app", tenant="bolt")
        + entry("client", CLIENT, "web")
        + entry("worker", WORKER, "workers")
        + entry("admin", ADMIN, "ops")
    )
    app = asgi(ServerConfig(data_dir=tmp_path / "data", tokens_file=tokens))
    with TestClient(app, headers=bearer(ADMIN)) as client:
        api = Api(client, fastapi_of(app))
        api.register(GATED)
        yield api


def create(api: Api, token: str, **body: Any) -> Response:
    return api.http.post("/v1/sessions", json={"agent": GATED.name, **body}, headers=bearer(token))


def created(api: Api, token: str, **body: Any) -> dict[str, Any]:
    response = create(api, token, **body)
    assert response.status_code == 201, response.text
    result: dict[str, Any] = response.json()
    return result


def listed(api: Api, token: str, path: str = "/v1/sessions", **params: Any) -> Response:
    return api.http.get(path, params=params, headers=bearer(token))


def session_ids(response: Response) -> list[str]:
    assert response.status_code == 200, response.text
    return sorted(s["id"] for s in response.json()["sessions"])


@pytest.fixture
def world(api: Api) -> Iterator[dict[str, str]]:
    """``acme``'s session, ``bolt``'s session waiting for an approval, a session of no
    tenant; and the id of the call ``bolt``'s waits on."""
    with connect_fake_worker(api, agents=[GATED]) as worker:
        mine = created(api, ACME, session_id="a1")
        theirs = created(api, BOLT, session_id="b1")
        none = created(api, ADMIN, session_id="n1")
        assert (mine["tenant"], theirs["tenant"], none["tenant"]) == ("acme", "bolt", None)
        sent = api.http.post("/v1/sessions/b1/messages", json={"text": "pay"}, headers=bearer(BOLT))
        assert sent.status_code == 201, sent.text
        model_calls(worker, "b1", charge(5))
        [wait] = api.snapshot("b1")["approvals"]
        yield {"mine": "a1", "theirs": "b1", "none": "n1", "call_id": wait["call_id"]}


# --- creation ------------------------------------------------------------------------------------


def test_a_scoped_token_creates_in_its_tenant_and_may_not_name_another(api: Api) -> None:
    assert created(api, ACME)["tenant"] == "acme"
    assert created(api, ACME, tenant="acme")["tenant"] == "acme"
    assert created(api, CLIENT, tenant="bolt")["tenant"] == "bolt"  # unscoped: any tenant
    assert created(api, CLIENT)["tenant"] is None  # as before tenants
    before = api.all_sessions()

    refused = assert_error(create(api, ACME, tenant="bolt", session_id="x1"), 403, "forbidden")
    assert "scoped to tenant 'acme'" in refused["message"]
    for bad in ("", "has space", "a" * 65, "é", "a/b"):
        assert_error(create(api, ADMIN, tenant=bad, session_id="x2"), 422)

    assert api.all_sessions() == before


def test_the_tenant_shows_in_the_snapshot_and_the_list_and_a_fork_keeps_it(
    api: Api, world: dict[str, str]
) -> None:
    assert api.snapshot("a1")["session"]["tenant"] == "acme"
    forked = api.http.post("/v1/sessions/a1/fork", json={"turn": 1}, headers=bearer(ACME))
    assert forked.status_code == 201, forked.text
    assert forked.json()["tenant"] == "acme"
    rows = {s["id"]: s["tenant"] for s in api.all_sessions()}
    assert rows == {"a1": "acme", "b1": "bolt", "n1": None, forked.json()["id"]: "acme"}


# --- every route ----------------------------------------------------------------------------------


def test_every_session_route_answers_another_tenants_session_as_one_that_does_not_exist(
    api: Api, world: dict[str, str]
) -> None:
    table = {getattr(r, "name", ""): r for r in routes(fastapi_of(api.http.app).routes)}
    client_routes = {n for n, r in table.items() if role_for(_path(r)) == Role.CLIENT}
    per_session = {n for n in client_routes if "{session_id}" in _path(table[n])}
    listed_here = set(ACROSS) | set(UNSCOPED) | set(SHARED)
    assert client_routes - per_session == listed_here, (
        "say how each client route keeps to a token's tenant: "
        f"{(client_routes - per_session) ^ listed_here}"
    )
    assert len(per_session) >= 18
    before = _everything(api)

    for name in sorted(per_session):
        route = table[name]
        answers = {
            sid: _call(api, route, BODIES.get(name, {}), sid, world["call_id"])
            for sid in (world["theirs"], world["none"], "no-such-session")
        }
        for sid, response in answers.items():
            assert response.status_code == 404, (name, sid, response.text)
        shown = {_without(r.text, sid) for sid, r in answers.items()}
        assert len(shown) == 1, (name, shown)  # the same answer, whoever's the session is
        if "POST" in getattr(route, "methods", set()):  # a bad body tells nothing either
            for sid in (world["theirs"], "no-such-session"):
                bad = _call(api, route, {"text": "", "turn": 0}, sid, world["call_id"])
                assert bad.status_code == 404, (name, sid, bad.text)

    assert _everything(api) == before  # nothing changed


def test_a_scoped_token_reaches_its_own_sessions(api: Api, world: dict[str, str]) -> None:
    """The 404s above are the tenant's doing: the same routes answer the session's own."""
    table = {getattr(r, "name", ""): r for r in routes(fastapi_of(api.http.app).routes)}
    for name in ("get_agent_snapshot", "list_approvals", "console_session"):
        assert _call(api, table[name], {}, "a1", "1.1").status_code == 200, name
    approved = _call(api, table["approve"], {}, "b1", world["call_id"], token=BOLT)
    assert approved.status_code == 200, approved.text


def test_routes_that_show_every_tenant_refuse_a_scoped_token(api: Api) -> None:
    for path in ("/v1/workers", "/v1/cluster"):
        assert_error(api.http.get(path, headers=bearer(ACME)), 403, "forbidden")
        assert api.http.get(path, headers=bearer(CLIENT)).status_code == 200
    page = api.http.get(f"{PREFIX}/cluster", headers=bearer(ACME))
    assert page.status_code == 403 and "scoped to tenant" in page.text
    assert api.http.get("/v1/agents", headers=bearer(ACME)).status_code == 200
    for path in ("/metrics", "/admin/step-down"):  # admin routes stay admin's
        method = "POST" if path.startswith("/admin") else "GET"
        refused = api.http.request(method, path, headers=bearer(ACME))
        assert refused.status_code == 403, path


# --- lists ----------------------------------------------------------------------------------------


def test_lists_and_the_inbox_show_only_the_tokens_tenant(api: Api, world: dict[str, str]) -> None:
    assert session_ids(listed(api, ACME)) == ["a1"]
    assert session_ids(listed(api, ACME, tenant="acme")) == ["a1"]
    assert session_ids(listed(api, ACME, status="waiting")) == []
    assert session_ids(listed(api, BOLT, status="waiting")) == ["b1"]
    assert session_ids(listed(api, CLIENT)) == ["a1", "b1", "n1"]
    assert session_ids(listed(api, ADMIN, tenant="bolt")) == ["b1"]
    assert_error(listed(api, ACME, tenant="bolt"), 403, "forbidden")
    assert_error(listed(api, ADMIN, tenant="not a name"), 422)

    def inbox(token: str, **params: Any) -> list[str]:
        response = listed(api, token, "/v1/inbox", **params)
        assert response.status_code == 200, response.text
        return [i["session_id"] for i in response.json()["items"]]

    assert inbox(ACME) == []
    assert inbox(BOLT) == ["b1"]
    assert inbox(CLIENT) == ["b1"]
    assert inbox(ADMIN, tenant="acme") == []
    assert_error(listed(api, ACME, "/v1/inbox", tenant="bolt"), 403, "forbidden")


def test_the_console_shows_a_scoped_token_only_its_tenants_sessions(
    api: Api, world: dict[str, str]
) -> None:
    def page(token: str, path: str) -> str:
        response = api.http.get(f"{PREFIX}{path}", headers=bearer(token))
        assert response.status_code == 200, response.text
        return response.text

    mine = page(ACME, "/sessions")
    assert "a1" in mine and "b1" not in mine and "n1" not in mine
    assert '<small class="tenant">· acme</small>' in mine
    assert '<dd id="tenant">acme</dd>' in page(ACME, "/sessions/a1")
    assert "b1" not in page(ACME, "")  # the inbox
    assert "b1" in page(BOLT, "") and "b1" in page(BOLT, "/sessions")
    every = page(CLIENT, "/sessions")
    assert all(sid in every for sid in ("a1", "b1", "n1"))


# --- the Python Client and the CLI ---------------------------------------------------------------


async def test_the_client_and_the_cli_create_and_list_in_the_tokens_tenant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = tmp_path / "tokens.toml"
    tokens.write_text(
        entry("client", ACME, "acme-app", tenant="acme")
        + entry("worker", WORKER, "workers")
        + entry("admin", ADMIN, "ops")
    )
    config = FAST_WORKER.model_copy(update={"token": WORKER})
    async with (
        run_server(tmp_path / "data", tokens_file=tokens) as address,
        dex.Client(address, token=ADMIN) as admin,
        dex.Client(address, token=ACME) as acme,
        dex.Worker([HELPER], address, config),
    ):

        async def registered() -> bool:
            return any(a["name"] == HELPER.name for a in await admin.list_agents())

        await wait_until_async(registered, what="the Worker registered its agent")
        theirs = await admin.create_session(HELPER.name, "b1", tenant="bolt")
        mine = await acme.create_session(HELPER.name, "a1")
        assert (theirs["tenant"], mine["tenant"]) == ("bolt", "acme")
        with pytest.raises(AuthError):
            await acme.create_session(HELPER.name, "a2", tenant="bolt")
        with pytest.raises(AuthError):
            await acme.list_sessions(tenant="bolt")
        with pytest.raises(NotFound):
            await acme.get_agent_snapshot("b1")
        assert [s["id"] for s in (await acme.list_sessions())["sessions"]] == ["a1"]
        assert [s["id"] for s in (await admin.list_sessions(tenant="bolt"))["sessions"]] == ["b1"]
        assert (await acme.list_inbox())["items"] == []
        chatting = await open_session(admin, HELPER.name, None, tenant="bolt")
        assert (await admin.get_agent_snapshot(chatting))["session"]["tenant"] == "bolt"

        monkeypatch.setenv("DEX_CLIENT_TOKEN", ACME)

        def dex_command(*args: str) -> str:
            result = CliRunner().invoke(cli, [*args, "--address", address], prog_name="dex")
            assert result.exit_code == 0, result.output
            return result.output

        made = await asyncio.to_thread(dex_command, "new", HELPER.name, "--session-id", "a3")
        assert "session a3 of tenant acme" in made
        listed = await asyncio.to_thread(dex_command, "sessions")
        assert "TENANT" in listed and "a3" in listed and "b1" not in listed


# --- the tokens file ------------------------------------------------------------------------------


def test_the_tokens_file_scopes_client_tokens_only_to_a_valid_tenant(tmp_path: Path) -> None:
    path = tmp_path / "tokens.toml"
    path.write_text(entry("client", ACME, "acme-app", tenant="acme"))
    [token] = read_file(path)
    assert (token.role, token.tenant) == (Role.CLIENT, "acme")
    for role, tenant, problem in (
        ("worker", "acme", "'tenant' limits a client token, not a worker one"),
        ("admin", "acme", "'tenant' limits a client token, not a admin one"),
        ("client", "a b", "a tenant is 1-64 letters, digits or _.-"),
    ):
        path.write_text(entry(role, ACME, "x", tenant=tenant))
        with pytest.raises(InvalidInput, match=re.escape(problem)):
            read_file(path)


# --- helpers --------------------------------------------------------------------------------------


def _path(route: BaseRoute) -> str:
    path: str = getattr(route, "path", "")
    return path


def _call(
    api: Api,
    route: BaseRoute,
    body: dict[str, Any],
    session_id: str,
    call_id: str,
    token: str = ACME,
) -> Response:
    values = {"session_id": session_id, "call_id": call_id, "number": "1"}
    path = re.sub(r"{(\w+)}", lambda m: values[m[1]], _path(route))
    method = sorted(getattr(route, "methods", set()) - {"HEAD"})[0]
    if method == "GET":
        return api.http.get(path, headers=bearer(token))
    if method == "DELETE":
        return api.http.delete(path, headers=bearer(token))
    if path.startswith(PREFIX):  # the console's forms
        return api.http.post(path, data=body, headers=bearer(token), follow_redirects=False)
    return api.http.request(method, path, json=body, headers=bearer(token))


def _without(text: str, session_id: str) -> str:
    return text.replace(session_id, "<id>")


def _everything(api: Api) -> dict[str, Any]:
    rows = api.all_sessions()
    return {"rows": rows, "snapshots": {r["id"]: api.snapshot(r["id"]) for r in rows}}


def test_dex_token_writes_a_tenant_scoped_client_entry_the_file_reads(tmp_path: Path) -> None:
    made = CliRunner().invoke(cli, ["token", "client", "--tenant", "acme"], prog_name="dex")
    assert made.exit_code == 0, made.output
    path = tmp_path / "tokens.toml"
    path.write_text(made.stdout)
    [token] = read_file(path)
    assert (token.role, token.tenant) == (Role.CLIENT, "acme")
    for args in (["worker", "--tenant", "acme"], ["client", "--tenant", "a b"]):
        refused = CliRunner().invoke(cli, ["token", *args], prog_name="dex")
        assert refused.exit_code != 0 and "tenant" in refused.output, refused.output
