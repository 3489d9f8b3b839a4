"""Client routes: sessions, messages, turns, snapshots."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field, model_validator

from dex.server import views
from dex.server.api import models, sse, tenancy
from dex.server.api.auth import GUARDED
from dex.server.api.models import errors
from dex.server.api.responses import ORJSONResponse, RecordsResponse
from dex.server.fleet import TENANT, Filters
from dex.server.sessions import Sessions
from dex.server.views import Turn
from dex.wire import OnBusy, Wire

router = APIRouter(
    prefix="/v1",
    tags=["sessions"],
    responses=errors(401, 403, 429, 500, 503),
    dependencies=[*GUARDED, *tenancy.GUARD],  # a scoped token sees its tenant's sessions only
)
BODY = errors(400, 413, 422)
"""What any route with a JSON body may answer before it runs."""
WAIT = {**BODY, **errors(404, 409, 503)}


TENANT_PATTERN = f"^{TENANT.pattern}$"


class Budget(Wire):
    """What a session may use in all: give one limit or both."""

    max_tokens: int | None = Field(
        None, ge=1, le=1 << 62, description="Input and output tokens together."
    )
    max_cost_usd: float | None = Field(
        None, gt=0, le=1e12, allow_inf_nan=False, description="US dollars."
    )

    @model_validator(mode="after")
    def _a_limit(self) -> Budget:
        if self.max_tokens is None and self.max_cost_usd is None:
            raise ValueError(
                "a budget sets max_tokens, max_cost_usd or both (to remove a session's "
                "budget: DELETE /v1/sessions/{id}/budget)"
            )
        return self

    def limits(self) -> views.Budget:
        return views.Budget(max_tokens=self.max_tokens, max_cost_usd=self.max_cost_usd)


class SetBudget(Budget):
    by: str | None = Field(None, max_length=200, description="Who changes it.")


class CreateSession(Wire):
    agent: str = Field(min_length=1, max_length=128)
    session_id: str | None = Field(None, min_length=1, max_length=128)
    tenant: str | None = Field(
        None,
        pattern=TENANT_PATTERN,
        description="Whose session it is (1-64 letters, digits or `_.-`), for good: a "
        "client token scoped to a tenant sees only that tenant's sessions, and its sessions "
        "are its tenant's without this (another tenant is a 403).",
    )
    priority: int = Field(
        0,
        ge=-1000,
        le=1000,
        description="Its Steps go ahead of those of its tenant's sessions of a lower "
        "priority, for good (tenants still share the Workers fairly).",
    )
    budget: Budget | None = Field(
        None,
        description="What the session may use in all: a turn whose next model call would "
        "start at or over it waits until the budget is raised (docs/flow-control.md).",
    )


class Fork(Wire):
    turn: int = Field(
        ge=1,
        le=1 << 62,
        description="The first turn the fork does not have: it keeps the history before "
        "this turn's user message, and its next message is its turn `turn`. One past the "
        "last turn keeps the whole history.",
    )
    session_id: str | None = Field(None, min_length=1, max_length=128)


class SendMessage(Wire):
    text: str = Field(min_length=1, max_length=1_000_000)
    message_id: str | None = Field(
        None,
        min_length=1,
        max_length=128,
        description="A client-chosen id: sending the same id again returns the first "
        "send's turn and outcome, and changes nothing.",
    )
    on_busy: OnBusy | None = Field(
        None,
        description="What the message does if a turn runs (docs/mid-turn.md): `enqueue` "
        "(wait for it to end), `reject` (a 409 `conflict` naming the turn; nothing "
        "changes), `interrupt` (cancel it and start a turn with this message, in one "
        "commit), `steer` (join it: its next model call sees the message). Absent: the "
        "agent's `on_busy`, `enqueue` unless its Worker declares another.",
    )
    wait_seconds: float = Field(
        0,
        ge=0,
        le=3600,
        description="Hold the response until the turn ends or waits for a person (an "
        "approval, an answer), up to this long.",
    )


class Approve(Wire):
    by: str | None = Field(None, max_length=200, description="Who approves.")
    arguments_hash: str | None = Field(
        None, description="The arguments_hash the approver saw: a mismatch is a 409."
    )


class Deny(Wire):
    reason: str = Field(min_length=1, max_length=10_000)
    by: str | None = Field(None, max_length=200)


class Answer(Wire):
    answer: str = Field(min_length=1, max_length=100_000)
    by: str | None = Field(None, max_length=200)


class Cancel(Wire):
    reason: str = Field("cancelled by a client", max_length=10_000)


class Reconcile(Wire):
    """What really happened: ``succeeded`` with its ``result``, or ``failed`` with its
    ``error``. The other field would be dropped, so a body that gives it is refused."""

    status: Literal["succeeded", "failed"]
    result: Any = None
    error: str | None = Field(None, max_length=100_000)
    by: str | None = Field(None, max_length=200)

    @model_validator(mode="after")
    def _one_outcome(self) -> Reconcile:
        if self.status == "failed" and self.result is not None:
            raise ValueError("a failed call has an error, not a result: drop result")
        if self.status == "succeeded" and self.error is not None:
            raise ValueError("a succeeded call has a result, not an error: drop error")
        return self


def _sessions(request: Request) -> Sessions:
    sessions: Sessions = request.app.state.sessions
    return sessions


def _turn_body(
    session_id: str, number: int, turn: Turn | None, waits: list[dict[str, Any]]
) -> dict[str, Any]:
    if turn is None:
        return {"session_id": session_id, "turn": number, "status": "running"}
    return {
        "session_id": session_id,
        "turn": number,
        "status": "waiting" if waits else turn.status.value,
        "waiting_for": waits,
        "text": turn.text,
        "error": turn.error,
        "tool_calls": turn.tool_calls,  # records: a RecordsResponse encodes them as they are
        "steps": turn.steps,
        "started_at": turn.started_at,
        "ended_at": turn.ended_at,
    }


@router.post(
    "/sessions",
    status_code=201,
    response_model=models.Session,
    responses={201: {"links": models.SESSION_LINKS}, **BODY, **errors(404, 409, 503)},
)
async def create_session(body: CreateSession, request: Request) -> ORJSONResponse:
    tenant = tenancy.tenant_for(request, body.tenant)
    result, status = await create(request.app, body, tenant)
    return ORJSONResponse(result, status)


async def create(app: Any, body: CreateSession, tenant: str | None) -> tuple[dict[str, Any], int]:
    """The session creation (of ``tenant``), as this route and ``hot.HotRoutes`` both
    answer it: the body and the status."""
    sessions: Sessions = app.state["sessions"]
    budget = body.budget.limits() if body.budget is not None else None
    state = await sessions.create(body.agent, body.session_id, tenant, body.priority, budget)
    return views.session_row(state), 201


def _time(description: str) -> Any:
    return Query(ge=0, allow_inf_nan=False, description=description + " (Unix time).")


Limit = Annotated[int, Query(ge=1, le=1000, description="At most this many per page.")]
Tenant = Annotated[
    str | None,
    Query(
        pattern=TENANT_PATTERN,
        description="Only this tenant's sessions. A token scoped to a tenant sees only "
        "that tenant's anyway; naming another is a 403.",
    ),
]
Cursor = Annotated[
    str | None,
    Query(max_length=1000, description="The `next_cursor` of the previous page."),
]


@router.post(
    "/sessions/{session_id}/fork",
    status_code=201,
    response_model=models.Forked,
    responses={**BODY, **errors(404, 409, 503)},
)
async def fork_session(session_id: str, body: Fork, request: Request) -> ORJSONResponse:
    """A new session whose history is this one's before turn `turn` (time travel: try a
    turn again, differently). The original does not change. 409 while it is in a turn."""
    state = await _sessions(request).fork(session_id, body.turn, body.session_id)
    assert state.forked_from is not None
    return ORJSONResponse(
        {
            **views.session_row(state),
            "forked_from": views.plain(state.forked_from),
            "messages_received": state.messages_received,
        },
        201,
    )


@router.get("/sessions", response_model=models.SessionList, responses=errors(422))
async def list_sessions(
    request: Request,
    agent: Annotated[str | None, Query(min_length=1, max_length=128)] = None,
    tenant: Tenant = None,
    status: Annotated[
        Literal["idle", "running", "waiting", "failed", "outcome_unknown"] | None,
        Query(
            description="A session status, or `outcome_unknown`: sessions with a tool call "
            "whose outcome is unknown and not reconciled."
        ),
    ] = None,
    created_since: Annotated[float | None, _time("Created at or after")] = None,
    created_before: Annotated[float | None, _time("Created before")] = None,
    updated_since: Annotated[float | None, _time("Last changed at or after")] = None,
    updated_before: Annotated[float | None, _time("Last changed before")] = None,
    order: Annotated[
        Literal["created", "updated"],
        Query(description="Newest first by creation, or by the latest change."),
    ] = "created",
    limit: Limit = 100,
    cursor: Cursor = None,
) -> ORJSONResponse:
    """Sessions newest first, filtered, one page at a time. Each page costs the same at any
    depth and any number of sessions: one filter with either order reads one index."""
    filters = Filters(
        agent=agent,
        status=status,
        tenant=tenancy.tenant_for(request, tenant),
        created_since=created_since,
        created_before=created_before,
        updated_since=updated_since,
        updated_before=updated_before,
        order=order,
    )
    rows, next_cursor = await _sessions(request).reads.list_sessions(filters, limit, cursor)
    return ORJSONResponse({"sessions": [row.__dict__ for row in rows], "next_cursor": next_cursor})


@router.get("/inbox", tags=["waits"], response_model=models.Inbox, responses=errors(422))
async def list_inbox(
    request: Request, limit: Limit = 100, cursor: Cursor = None, tenant: Tenant = None
) -> ORJSONResponse:
    """What waits for a person across sessions: tool calls to approve or deny, questions to
    answer. A page holds the waits of up to `limit` sessions, the sessions that started
    waiting last first."""
    asked = tenancy.tenant_for(request, tenant)
    items, next_cursor = await _sessions(request).reads.inbox(limit, cursor, asked)
    return ORJSONResponse({"items": items, "next_cursor": next_cursor})


@router.get("/sessions/{session_id}", response_model=models.Snapshot, responses=errors(404, 422))
async def get_agent_snapshot(session_id: str, request: Request) -> ORJSONResponse:
    """History, state, the current turn with its Steps and attempts, waits, and every tool
    call of the session with its status."""
    return ORJSONResponse(await _sessions(request).reads.snapshot(session_id))


@router.post(
    "/sessions/{session_id}/messages",
    status_code=201,
    response_model=models.SentMessage,
    responses={
        201: {"links": models.TURN_LINKS},
        200: {
            "model": models.SentMessage,
            "description": "This `message_id` was sent before: the first send's turn, "
            "unchanged (`created` is false).",
        },
        **BODY,
        **errors(404, 409, 503),
    },
)
async def send_message(session_id: str, body: SendMessage, request: Request) -> RecordsResponse:
    result, status = await send(request.app, session_id, body)
    return RecordsResponse(result, status)


async def send(app: Any, session_id: str, body: SendMessage) -> tuple[dict[str, Any], int]:
    """The message send, as this route and ``hot.HotRoutes`` both answer it: the body and
    the status."""
    sessions: Sessions = app.state["sessions"]
    sent, created = await sessions.send(session_id, body.text, body.message_id, body.on_busy)
    turn: Turn | None = None
    waits: list[dict[str, Any]] = []
    if body.wait_seconds > 0:  # the turn that answers the message (a steered one's: its own)
        wait = min(body.wait_seconds, app.state["config"].max_wait_seconds)
        turn, waits = await sessions.reads.wait_turn(session_id, sent.turn, wait)
    result = _turn_body(session_id, sent.turn, turn, waits)
    result["created"] = created
    result["outcome"] = sent.outcome.value
    result["interrupted"] = sent.interrupted
    return result, 201 if created else 200


@router.get(
    "/sessions/{session_id}/turns/{number}",
    response_model=models.TurnResult,
    responses=errors(404, 422),
)
async def get_turn(
    session_id: str,
    number: int,
    request: Request,
    wait_seconds: Annotated[
        float,
        Query(
            ge=0,
            le=3600,
            description="Hold the answer until the turn ends or waits for a person, up to "
            "this long.",
        ),
    ] = 0,
) -> RecordsResponse:
    """Turn `number`: `running`, `waiting` (for a person: `waiting_for` says for what), or
    how it ended."""
    sessions = _sessions(request)
    wait = min(wait_seconds, request.app.state["config"].max_wait_seconds)
    turn, waits = await sessions.reads.wait_turn(session_id, number, wait)
    return RecordsResponse(_turn_body(session_id, number, turn, waits))


@router.get("/agents", tags=["agents"], response_model=models.AgentList)
async def list_agents(request: Request) -> ORJSONResponse:
    """The agents Workers have registered, each with how many connected Workers serve it
    now."""
    sessions = _sessions(request)
    serving: dict[str, int] = {}
    for conn in sessions.dispatcher.workers.values():
        for name in conn.agents:
            serving[name] = serving.get(name, 0) + 1
    agents = [
        {**a.model_dump(mode="json"), "workers": serving.get(a.name, 0)}
        for a in sessions.agents.values()
    ]
    return ORJSONResponse({"agents": agents})


@router.get(
    "/sessions/{session_id}/approvals",
    tags=["waits"],
    response_model=models.ApprovalList,
    responses=errors(404, 422),
)
async def list_approvals(session_id: str, request: Request) -> ORJSONResponse:
    """Tool calls waiting for approval, with the arguments and their hash."""
    return ORJSONResponse({"approvals": await _sessions(request).reads.approvals(session_id)})


CALL = "/sessions/{session_id}/tool_calls/{call_id}"
"""The path of one tool call: its decisions (approve, deny, answer) and reconcile go under it."""


async def _decide(
    request: Request, session_id: str, call_id: str, kind: str, body: Approve | Deny | Answer
) -> None:
    """Record a person's decision (``kind``: approve, deny, answer) on tool call ``call_id``,
    which waits for it: the record keeps who decided and the body's own field."""
    entry = {"kind": kind, "call_id": call_id, "by": body.by, **body.model_dump(exclude={"by"})}
    await _sessions(request).resolve(session_id, entry)


@router.post(f"{CALL}/approve", tags=["waits"], response_model=models.Approved, responses=WAIT)
async def approve(session_id: str, call_id: str, body: Approve, request: Request) -> ORJSONResponse:
    await _decide(request, session_id, call_id, "approve", body)
    return ORJSONResponse({"call_id": call_id, "approved": True})


@router.post(f"{CALL}/deny", tags=["waits"], response_model=models.Approved, responses=WAIT)
async def deny(session_id: str, call_id: str, body: Deny, request: Request) -> ORJSONResponse:
    await _decide(request, session_id, call_id, "deny", body)
    return ORJSONResponse({"call_id": call_id, "approved": False})


@router.post(f"{CALL}/answer", tags=["waits"], response_model=models.Answered, responses=WAIT)
async def answer(session_id: str, call_id: str, body: Answer, request: Request) -> ORJSONResponse:
    await _decide(request, session_id, call_id, "answer", body)
    return ORJSONResponse({"call_id": call_id, "answered": True})


def _budget_body(session_id: str, state: views.SessionState) -> dict[str, Any]:
    return {
        "session_id": session_id,
        "budget": views.plain(state.budget) if state.budget else None,
        "usage": views.usage(state.usage),
        "status": state.fleet_status().value,
    }


@router.put(
    "/sessions/{session_id}/budget",
    tags=["sessions"],
    response_model=models.BudgetSet,
    responses={**BODY, **errors(404, 503)},
)
async def set_budget(session_id: str, body: SetBudget, request: Request) -> ORJSONResponse:
    """Set the session's budget. A turn that waits for its budget goes on if the new one
    is not used up: its model call is queued once."""
    state = await _sessions(request).set_budget(session_id, body.limits(), body.by)
    return ORJSONResponse(_budget_body(session_id, state))


@router.delete(
    "/sessions/{session_id}/budget",
    tags=["sessions"],
    response_model=models.BudgetSet,
    responses=errors(404, 422, 503),
)
async def remove_budget(
    session_id: str,
    request: Request,
    by: Annotated[str | None, Query(max_length=200, description="Who removes it.")] = None,
) -> ORJSONResponse:
    """Remove the session's budget: no limit. A turn that waits for its budget goes on."""
    state = await _sessions(request).set_budget(session_id, None, by)
    return ORJSONResponse(_budget_body(session_id, state))


@router.post(
    "/sessions/{session_id}/cancel",
    tags=["sessions"],
    response_model=models.Cancelled,
    responses=WAIT,
)
async def cancel(session_id: str, body: Cancel, request: Request) -> ORJSONResponse:
    """Cancel the running turn: queued Steps fail as NOT_STARTED, running attempts stop."""
    number = await _sessions(request).cancel(session_id, body.reason)
    return ORJSONResponse({"session_id": session_id, "turn": number, "status": "cancelled"})


@router.post(f"{CALL}/reconcile", tags=["waits"], response_model=models.ToolCall, responses=WAIT)
async def reconcile(
    session_id: str, call_id: str, body: Reconcile, request: Request
) -> ORJSONResponse:
    """Record what really happened to an outcome_unknown call; the model is told."""
    call = await _sessions(request).reconcile(
        session_id, call_id, body.status, body.result, body.error, body.by
    )
    return ORJSONResponse(views.plain(call))


@router.get(
    "/sessions/{session_id}/events",
    tags=["sessions"],
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "The event stream, until the client disconnects (or after "
            "`stream.dropped`).",
            "content": {"text/event-stream": {"itemSchema": models.SSE_EVENT}},
        },
        **errors(404, 422),
    },
)
async def stream_events(
    session_id: str,
    request: Request,
    last_event_id: Annotated[
        str | None,
        Header(
            pattern=models.EVENT_ID,
            description="Resume after this event (the `id` of the last one you saw, as it "
            "came: ids are opaque). Events the stream no longer keeps (or an id it never "
            "gave) start with a `stream.gap` notice. Anything but digits, or "
            "digits-digits (1-19 ASCII digits each), is a 422.",
        ),
    ] = None,
) -> StreamingResponse:
    """Server-Sent Events: the session's new history items, turn and wait lifecycle
    events, and live model output (``model.delta``). Resume with ``Last-Event-ID``.

    With the in-memory stream backend, live events are this node's: after a restart or
    takeover a resuming subscriber gets ``stream.gap`` first, and the durable history
    (the snapshot) has everything but the lost partial output. A subscriber that falls
    too far behind gets ``stream.dropped`` last, and the response ends."""
    sessions = _sessions(request)
    events = await sessions.reads.events(session_id, last_event_id)  # 404 before streaming
    return sse.response(events)
