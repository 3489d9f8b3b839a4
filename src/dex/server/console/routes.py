"""The console's pages and actions.

Reads use the domain calls the JSON API uses: the inbox (``GET /v1/inbox``), the fleet
view's filters and keyset cursor (``GET /v1/sessions``), the session's snapshot and turns,
the connected Workers (``GET /v1/workers``), the tenants' budgets and usage (``GET
/admin/tenants``: an admin's page). An action parses its form into the JSON API's
own body model and calls the API's own route function, so a console approval *is* an API
approval: the same validation, the same ``Sessions`` method, the same refusals. Then it
redirects (303) to the session page, which renders again from the state; a refusal is an
error page with the API's status, and changes nothing.

The session page follows the session live through the API's own event stream
(``stream_events``, mounted under ``/ui`` so the console's cookie reaches it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import parse_qs, quote

from fastapi import APIRouter, Header, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, RedirectResponse, Response, StreamingResponse
from pydantic import BaseModel, Field, ValidationError

from dex.errors import DexError, NotFound
from dex.server import views
from dex.server.api import models, tenancy
from dex.server.api import sessions as api
from dex.server.api import tenants as tenants_api
from dex.server.api.auth import TOKEN_KEY, refusal
from dex.server.api.cluster import all_workers, cluster_view
from dex.server.api.peers import cluster_of
from dex.server.api.tokens import Role, Tokens
from dex.server.console.conversation import conversation, live, shown
from dex.server.fleet import TENANT, Filters
from dex.server.ha.node import Node
from dex.server.pages import COOKIE, PREFIX, STATIC, render
from dex.server.sessions import Sessions

router = APIRouter(prefix=PREFIX, include_in_schema=False, dependencies=tenancy.GUARD)
"""A scoped token's console shows and acts on its tenant's sessions only (``tenancy``)."""
PAGE = 50
"""Sessions per page of the session list and the inbox."""
M = TypeVar("M", bound=BaseModel)

SHOW = {
    "all": None,
    "running": "running",
    "approval": "waiting",
    "question": "waiting",
    "outcome_unknown": "outcome_unknown",
    "failed": "failed",
}
"""The session list's filters: the fleet status each one asks the store for. Approvals and
questions are both ``waiting``; the page keeps the sessions whose waits are of that kind."""
Show = Literal["all", "running", "approval", "question", "outcome_unknown", "failed"]


class NotServing(DexError):
    code = "unavailable"
    status = 503


def _sessions(request: Request) -> Sessions:
    """The node's sessions, once it serves (a standby's console shows the cluster only).
    Every session page and every action asks first: console paths are not under ``/v1``,
    so the API's standby gate does not refuse them."""
    node: Node | None = request.app.state.node
    if node is None or not node.serving:
        role = node.role if node is not None else "starting"
        raise NotServing(f"this node does not serve sessions now (it is {role}): try another")
    sessions: Sessions = request.app.state.sessions
    return sessions


# --- pages -----------------------------------------------------------------------------


@router.get("", name="console_inbox")
async def inbox(request: Request, cursor: Annotated[str | None, Query()] = None) -> Response:
    """Home: what waits for a person across sessions, the latest to start waiting first."""
    tenant = tenancy.tenant_for(request, None)
    items, next_cursor = await _sessions(request).reads.inbox(PAGE, cursor, tenant)
    return render(request, "inbox.html", items=items, next_cursor=next_cursor)


@router.get("/sessions", name="console_sessions")
async def session_list(
    request: Request,
    show: Annotated[Show, Query()] = "all",
    cursor: Annotated[str | None, Query(max_length=1000)] = None,
) -> Response:
    """The fleet, newest first, one page at a time (the cursor of ``GET /v1/sessions``):
    each session's agent, status, last message (read with the page, by the store), and
    what it waits for (a session waiting for a person is in memory: no read per row)."""
    sessions = _sessions(request)
    filters = Filters(status=SHOW[show], tenant=tenancy.tenant_for(request, None))
    rows, next_cursor = await sessions.reads.list_sessions(filters, PAGE, cursor, last_message=True)
    listed = []
    for row in rows:
        waits = await sessions.reads.person_waits(row.id) if row.status == "waiting" else []
        if show in ("approval", "question") and show not in {w["kind"] for w in waits}:
            continue
        listed.append({**dataclasses.asdict(row), "waits": waits})
    return render(
        request,
        "sessions.html",
        rows=listed,
        show=show,
        filters=list(SHOW),
        next_cursor=next_cursor,
    )


@router.get("/sessions/{session_id}", name="console_session")
async def session_page(session_id: str, request: Request) -> Response:
    """One session: what it waits for, the conversation (with the live text of the model
    attempt that runs now), a box to send a message, and every turn with its Steps,
    attempts and tool calls, newest turn first."""
    sessions = _sessions(request)
    snapshot, turns = await sessions.reads.timeline(session_id)
    session, current = snapshot["session"], snapshot["current_turn"]
    plain = shown([views.plain(turn) for turn in turns], session["status"])
    return render(
        request,
        "session.html",
        session=session,
        waits=await sessions.reads.person_waits(session_id),
        running=snapshot["running"],
        waiting=snapshot["waiting"],
        current=current,
        conversation=conversation(snapshot["history"], plain, session["queued_messages"]),
        live=live(session, current),
        turns=list(reversed(plain)),
    )


@router.get("/sessions/{session_id}/events", name="console_events")
async def session_events(
    session_id: str,
    request: Request,
    last_event_id: Annotated[str | None, Header(pattern=models.EVENT_ID)] = None,
) -> StreamingResponse:
    """The API's event stream of the session, for the page's ``EventSource``."""
    _sessions(request)
    return await api.stream_events(session_id, request, last_event_id)


@router.get("/cluster", name="console_cluster", dependencies=tenancy.UNSCOPED)
async def cluster(request: Request) -> Response:
    """This node (role, epoch), the nodes of its cluster with their partitions, the Workers
    connected to every node with what they serve, and the Steps queued on this node for a
    Worker, by queue (a tool, or an agent's model)."""
    node: Node | None = request.app.state.node
    sessions: Sessions = request.app.state.sessions
    queued = sorted(sessions.dispatcher.queued().items())
    workers = await all_workers(request)
    return render(
        request,
        "cluster.html",
        role=node.role if node is not None else "starting",
        epoch=node.epoch if node is not None else 0,
        cluster=cluster_view(cluster_of(node)),
        workers=workers["workers"],
        unreachable=workers["unreachable"],
        queued=[(*_queue(name), count) for name, count in queued],
        running=len(sessions.dispatcher.held),
    )


@router.get("/tenants", name="console_tenants")
async def tenants(request: Request) -> Response:
    """Each tenant with a budget or with usage this month (``GET /admin/tenants``): its
    budget, what its sessions used today and this month (UTC), how its budget is used up,
    and a form to set or remove it; and a form for a tenant not listed yet. An admin's
    page (``pages.ADMIN_PAGES``)."""
    listed = await _sessions(request).tenants.view()
    return render(request, "tenants.html", tenants=listed, limits=TENANT_LIMITS)


def _queue(name: str) -> tuple[str, str]:
    """A dispatcher queue as (what runs, for which agent): ``tool:billing/charge`` is the
    tool ``charge`` of ``billing``, ``model:billing`` its model."""
    kind, _, rest = name.partition(":")
    if kind == "tool":
        agent, _, tool = rest.partition("/")
        return tool, agent
    return "(model)", rest


# --- actions ---------------------------------------------------------------------------


async def _form(request: Request) -> dict[str, str]:
    """The form's fields (urlencoded; a field sent twice keeps its first value)."""
    fields = parse_qs((await request.body()).decode(errors="replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


async def _action(request: Request) -> dict[str, str]:
    """An action's form, once this node serves sessions (asked first, as every action
    asks)."""
    _sessions(request)
    return await _form(request)


def _body(model: type[M], **fields: Any) -> M:
    """The JSON API's body model from a form's fields: its validation, its 422."""
    try:
        return model(**fields)
    except ValidationError as e:
        problems = [{**error, "loc": ("form", *error["loc"])} for error in e.errors()]
        raise RequestValidationError(problems) from None


def _by(request: Request) -> str:
    """Who acts, as the record keeps it: the token's name when auth is on."""
    name = request.scope.get(TOKEN_KEY)
    return f"console:{name}" if name else "console"


def _back(session_id: str, at: str = "") -> RedirectResponse:
    return RedirectResponse(f"{PREFIX}/sessions/{quote(session_id, safe='')}{at}", 303)


async def _decide(
    request: Request,
    session_id: str,
    call_id: str,
    route: Callable[[str, str, M, Request], Awaitable[object]],
    model: type[M],
    **fields: str | None,
) -> Response:
    """Approve, deny or answer the call through the API's ``route``: its body ``model``
    from the form's ``fields``, with who acts."""
    await route(session_id, call_id, _body(model, by=_by(request), **fields), request)
    return _back(session_id)


@router.post("/sessions/{session_id}/calls/{call_id}/approve", name="console_approve")
async def approve(session_id: str, call_id: str, request: Request) -> Response:
    """Approve the call for the arguments the page showed (their hash): other arguments
    are a 409."""
    hash_ = (await _action(request)).get("arguments_hash") or None
    return await _decide(
        request, session_id, call_id, api.approve, api.Approve, arguments_hash=hash_
    )


@router.post("/sessions/{session_id}/calls/{call_id}/deny", name="console_deny")
async def deny(session_id: str, call_id: str, request: Request) -> Response:
    reason = (await _action(request)).get("reason", "").strip()
    return await _decide(request, session_id, call_id, api.deny, api.Deny, reason=reason)


@router.post("/sessions/{session_id}/calls/{call_id}/answer", name="console_answer")
async def answer(session_id: str, call_id: str, request: Request) -> Response:
    text = (await _action(request)).get("answer", "").strip()
    return await _decide(request, session_id, call_id, api.answer, api.Answer, answer=text)


@router.post("/sessions/{session_id}/calls/{call_id}/reconcile", name="console_reconcile")
async def reconcile(session_id: str, call_id: str, request: Request) -> Response:
    """Record what really happened to an outcome_unknown call: succeeded (the note is its
    result) or failed (the note is its error)."""
    form = await _action(request)
    status, note = form.get("status"), form.get("note", "").strip() or None
    body = _body(
        api.Reconcile,
        status=status,
        result=note if status == "succeeded" else None,
        error=note if status == "failed" else None,
        by=_by(request),
    )
    await api.reconcile(session_id, call_id, body, request)
    return _back(session_id)


@router.post("/sessions/{session_id}/messages", name="console_send")
async def send(session_id: str, request: Request) -> Response:
    """Send a message, as ``POST /v1/sessions/{id}/messages`` does (without waiting for
    the turn): it starts a turn, or waits for the running one to end. Then the page,
    at the message box, follows the reply as it streams."""
    form = await _action(request)
    body = _body(api.SendMessage, text=form.get("text", "").strip())
    await api.send_message(session_id, body, request)
    return _back(session_id, "#send")


@router.post("/sessions/{session_id}/budget", name="console_budget")
async def budget(session_id: str, request: Request) -> Response:
    """Set the session's budget from the form (an empty field: no such limit), or remove it
    (``remove``), through ``PUT`` or ``DELETE /v1/sessions/{id}/budget``: a turn that waits
    for its budget goes on once it is not used up."""
    form = await _action(request)
    if form.get("remove"):
        await api.remove_budget(session_id, request, by=_by(request))
        return _back(session_id)
    limits = {
        name: value
        for name in ("max_tokens", "max_cost_usd")
        if (value := form.get(name, "").strip())
    }
    await api.set_budget(session_id, _body(api.SetBudget, by=_by(request), **limits), request)
    return _back(session_id)


TENANT_LIMITS = (
    "max_tokens_per_day",
    "max_cost_usd_per_day",
    "max_tokens_per_month",
    "max_cost_usd_per_month",
)
"""The fields of a tenant's budget, as ``PUT /admin/tenants/{tenant}/budget`` takes them."""


class TenantField(BaseModel):
    """The tenant a tenant's budget form is about, checked as the API's path checks it."""

    tenant: str = Field(pattern=f"^{TENANT.pattern}$")


@router.post("/tenants", name="console_tenant_budget")
async def tenant_budget(request: Request) -> Response:
    """Set the form's ``tenant``'s budget (an empty field: no such limit), or remove it
    (``remove``), through ``PUT`` or ``DELETE /admin/tenants/{tenant}/budget``: its
    sessions' turns that wait for it go on once it is not used up."""
    form = await _action(request)
    tenant = _body(TenantField, tenant=form.get("tenant", "").strip()).tenant
    if form.get("remove"):
        await tenants_api.remove_tenant_budget(request, tenant, by=_by(request))
    else:
        limits = {name: value for name in TENANT_LIMITS if (value := form.get(name, "").strip())}
        body = _body(tenants_api.SetTenantBudget, by=_by(request), **limits)
        await tenants_api.set_tenant_budget(request, tenant, body)
    return RedirectResponse(f"{PREFIX}/tenants#tenant-{quote(tenant, safe='')}", 303)


@router.post("/sessions/{session_id}/cancel", name="console_cancel")
async def cancel(session_id: str, request: Request) -> Response:
    form = await _action(request)
    reason = form.get("reason", "").strip() or "cancelled from the console"
    await api.cancel(session_id, _body(api.Cancel, reason=reason), request)
    return _back(session_id)


# --- log-in, static files --------------------------------------------------------------


@router.get("/login", name="console_login_form")
async def login_form(request: Request, next: str = "") -> Response:
    tokens: Tokens = request.app.state.tokens
    if not tokens.enabled:
        return RedirectResponse(_next(next), 303)  # auth is off: nothing to log in to
    return render(request, "login.html", status=200, message=None, next=_next(next))


@router.post("/login", name="console_login")
async def login(request: Request) -> Response:
    """Check the token as every request is checked (it must open the client API), then
    keep it in an HttpOnly cookie that only console paths read."""
    tokens: Tokens = request.app.state.tokens
    form = await _form(request)
    target = _next(form.get("next", ""))
    if not tokens.enabled:
        return RedirectResponse(target, 303)  # auth is off: nothing to log in to
    offered = form.get("token", "").strip()
    if not offered:
        return render(request, "login.html", 400, status=400, message="enter a token", next=target)
    refused = refusal(tokens.match(offered.encode()), Role.CLIENT)
    if refused is not None:
        status, _, message = refused
        return render(
            request,
            "login.html",
            status,
            status=status,
            message="that token is not valid" if status == 401 else message,
            next=target,
        )
    done = RedirectResponse(target, 303)
    done.set_cookie(
        COOKIE,
        quote(offered, safe=""),
        path=PREFIX,
        httponly=True,
        samesite="strict",  # a page of another site cannot act with it
        secure=request.url.scheme == "https",
    )
    return done


@router.post("/logout", name="console_logout")
async def logout() -> Response:
    done = RedirectResponse(f"{PREFIX}/login", 303)
    done.delete_cookie(COOKIE, path=PREFIX)
    return done


def _next(target: str) -> str:
    """Where to go after logging in: a console page, never another site."""
    if target.startswith(PREFIX) and not target.startswith("//"):
        return target
    return PREFIX


@router.get("/static/{name}", name="console_static")
async def static(name: str) -> FileResponse:
    """The console's own files (its script and style sheet), by name only."""
    path = STATIC / name
    if "/" in name or name.startswith(".") or not path.is_file():
        raise NotFound(f"no console file {name!r}")
    return FileResponse(path, headers={"cache-control": "max-age=300"})
