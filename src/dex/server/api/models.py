"""What each route answers, for the OpenAPI document.

The routes render plain dicts with ``ORJSONResponse``; FastAPI does not validate a
response a route returns itself, so these models cost nothing on the hot path. They
describe the JSON exactly: ``tests/integration/test_openapi_fuzz.py`` checks every
response against them. The records of a turn (``Turn``, ``Step``, ``ToolCall``, ...) are
the engine's own (msgspec structs, which pydantic does not read), read through the
domain's ``dex.server.views`` (the API does not import the engine): each is documented as
a dataclass made from its fields (``documented``), so the document follows them when they
change.
"""

from __future__ import annotations

import dataclasses
import functools
import operator
import types
import typing
from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Literal

import msgspec
from pydantic import BaseModel, Field

from dex.server import views
from dex.server.flow import Limit
from dex.server.views import FleetStatus, TurnStatus
from dex.wire import AgentSpec, Item


@functools.cache
def documented(struct: type[msgspec.Struct]) -> Any:
    """A dataclass with the name, docstring, fields and defaults of an engine record (and
    of the records it holds), for pydantic to describe."""
    fields = []
    for f in msgspec.structs.fields(struct):
        if f.default is not msgspec.NODEFAULT:
            spec = dataclasses.field(default=f.default)
        elif f.default_factory is not msgspec.NODEFAULT:
            spec = dataclasses.field(default_factory=f.default_factory)
        else:
            spec = dataclasses.field()
        fields.append((f.name, _documented_type(f.type), spec))
    made = dataclasses.make_dataclass(
        struct.__name__, fields, kw_only=True, namespace={"__doc__": struct.__doc__}
    )
    made.__module__ = __name__
    return made


def _documented_type(tp: Any) -> Any:
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return documented(tp)
    args = typing.get_args(tp)
    if not args:
        return tp
    inner = tuple(_documented_type(a) for a in args)
    origin = typing.get_origin(tp)
    if origin in (types.UnionType, typing.Union):
        return functools.reduce(operator.or_, inner)
    return origin[inner]


if TYPE_CHECKING:
    from dex.server.views import ForkedFrom as ForkedFrom
    from dex.server.views import QueuedMessage as QueuedMessage
    from dex.server.views import Step as Step
    from dex.server.views import ToolCall as ToolCall
    from dex.server.views import Turn as Turn
else:
    Step = documented(views.Step)
    ToolCall = documented(views.ToolCall)
    Turn = documented(views.Turn)
    QueuedMessage = documented(views.QueuedMessage)
    ForkedFrom = documented(views.ForkedFrom)


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable and machine-readable: see the table in docs/api.md.")
    message: str = Field(description="What was refused and why, for a person.")
    details: dict[str, Any] | None = Field(
        None,
        description="Facts about the refusal: for a 422 `invalid_request`, `problems` "
        "(a list of `{where, problem}`).",
    )


class ErrorResponse(BaseModel):
    """Every error the server answers."""

    error: ErrorDetail


WHEN = {
    400: "The body is not readable JSON (invalid UTF-8, or nested too deep): `http_error`.",
    401: "Auth is on and the request has no valid bearer token: `unauthorized`.",
    403: "Auth is on and the token's role may not use this route: `forbidden`; or a browser "
    "sent the request for a page of another site: `cross_site`.",
    404: "An unknown session, agent, turn or tool call: `not_found`.",
    409: "The state refuses the change: `conflict`.",
    413: "The body is over the server's limit: `body_too_large`.",
    422: "The body, a parameter or a header is not valid (`invalid_request`, with "
    "`details.problems`), or valid but unusable (`invalid_input`).",
    429: "The token (or, with auth off, the address) is over its rate limit on the client "
    "API: `rate_limited`, with `Retry-After` (seconds) and `details.limit`, "
    "`details.retry_after`.",
    500: "A bug in the server, logged with its traceback: `internal_error`.",
    503: "The node does not serve now (starting, a standby, stepped down: `unavailable`, "
    "with the `x-dex-role` header; try another address), or the store could not commit "
    "(nothing was written, retry: `storage_error`).",
}


def errors(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """The ``responses`` entry for these error statuses, each with the error body."""
    return {s: {"model": ErrorResponse, "description": WHEN[s]} for s in statuses}


# --- sessions ------------------------------------------------------------------------------


NEXT_CURSOR = (
    "Pass it as `cursor` for the next page (with the same filters); null on the last page."
)


class SessionUsage(BaseModel):
    """The tokens and cost of a session's model calls whose results committed."""

    input_tokens: int
    output_tokens: int
    cost_usd: float = Field(description="At the server's prices (docs/flow-control.md).")


class SessionBudget(BaseModel):
    """What a session may use in all. A limit that is null does not apply."""

    max_tokens: int | None = Field(None, description="Input and output tokens together.")
    max_cost_usd: float | None = Field(None, description="US dollars.")


class Session(BaseModel):
    id: str
    agent: str
    tenant: str | None = Field(
        None, description="Whose session it is (given at creation, never changed); null: none."
    )
    status: FleetStatus = Field(
        description="`idle`, `running`, `waiting` (the turn waits for a person: an approval "
        "or an answer), or `failed` (no turn runs, and the last one failed)."
    )
    created_at: float = Field(description="Unix time.")
    updated_at: float = Field(description="Unix time of the session's latest change.")
    waiting_since: float | None = Field(
        description="Since when the turn waits for a person (Unix time); null if it does not."
    )
    outcome_unknown: int = Field(
        description="How many of its tool calls are `outcome_unknown`, not reconciled yet."
    )
    usage: SessionUsage | None = Field(
        None, description="The tokens and cost of its model calls so far."
    )


class SessionList(BaseModel):
    sessions: list[Session] = Field(description="Newest first by the `order` asked for.")
    next_cursor: str | None = Field(description=NEXT_CURSOR)


class SnapshotSession(Session):
    last_turn_status: TurnStatus | None = Field(description="How the latest ended turn ended.")
    messages_received: int
    priority: int = Field(
        0, description="Its place among its tenant's sessions in the queues (higher first)."
    )
    queued_messages: list[QueuedMessage]
    forked_from: ForkedFrom | None = Field(
        description="For a fork: the session it was made from, and the first of its turns "
        "the fork does not have."
    )
    budget: SessionBudget | None = Field(None, description="Its budget; null: no limit.")
    tenant_usage: Tenant | None = Field(
        None,
        description="Its tenant's budget and usage today and this month; null for a session "
        "without a tenant.",
    )


class BudgetSet(BaseModel):
    session_id: str
    budget: SessionBudget | None = Field(description="The budget now; null: no limit.")
    usage: SessionUsage
    status: FleetStatus = Field(
        description="The session's status after the change: a turn that waited for its "
        "budget and may go on is `running` again."
    )


class Forked(Session):
    forked_from: ForkedFrom
    messages_received: int = Field(description="Its next message starts turn this + 1.")


class HeldByLimit(BaseModel):
    key: str = Field(
        description="The model group (`anthropic/claude-sonnet-4-5`), or the tool's "
        "concurrency key (`tool:AGENT/TOOL=KEY`)."
    )
    limit: str = Field(
        description="`concurrency`, `rpm`, `tpm`, or `retry_after` (the provider refused a call "
        "of the group and said when to come back)."
    )
    until: float | None = Field(
        description="When it may go (Unix time); null: when a call under `key` ends."
    )


class GroupLimits(BaseModel):
    group: str
    limit: Limit | None = Field(description="Its limits; null: none.")
    source: Literal["config", "api"] | None = Field(
        description="`config`: the server config's; `api`: set at run time (they win)."
    )
    running: int = Field(description="Its model calls running, handed out by this node.")
    waiting: int = Field(description="Its Steps this node holds queued for a limit.")
    lowered_to: float = Field(
        description="The part of its limits it admits after the provider refused calls "
        "(1: all); it grows back as calls succeed."
    )


class LimitsView(BaseModel):
    groups: list[GroupLimits]


class TenantBudgetView(BaseModel):
    """What all of a tenant's sessions may use in a UTC day and month. A limit that is
    null does not apply."""

    max_tokens_per_day: int | None = None
    max_cost_usd_per_day: float | None = None
    max_tokens_per_month: int | None = None
    max_cost_usd_per_month: float | None = None


class TenantUsage(BaseModel):
    """What a tenant's model calls whose results committed used in a period."""

    input_tokens: int
    output_tokens: int
    tokens: int = Field(description="Input and output tokens together.")
    cost_usd: float = Field(description="At the server's prices (docs/flow-control.md).")
    calls: int


class Tenant(BaseModel):
    tenant: str
    budget: TenantBudgetView | None = Field(description="Its budget; null: none.")
    day: str = Field(description="Today (UTC), as `2026-12-08`: the day `today` counts.")
    today: TenantUsage
    this_month: TenantUsage = Field(description="This UTC month, today included.")
    reached: str | None = Field(
        description="How its budget is used up, in words: its sessions' next model calls "
        "wait (`AwaitBudget`) until it is raised or the day or month ends; null if not."
    )


class Tenants(BaseModel):
    tenants: list[Tenant] = Field(
        description="Each tenant with a budget or with usage this month, by name."
    )


class QueuedStep(BaseModel):
    step_id: str
    queue: str
    not_before: float | None
    waiting_for: str = Field(
        description="`backoff`, `the model provider's rate limit`, `a free Worker`, the queue "
        "nobody serves, or the limit that holds it (`limit`)."
    )
    limit: HeldByLimit | None = Field(
        None, description="The limit that holds it queued (docs/flow-control.md)."
    )


class WaitInfo(BaseModel):
    step_id: str
    type: str
    call_id: str | None
    since: float
    deadline: float | None
    question: str | None
    choices: list[str] | None
    reason: str | None = Field(
        None, description="An `AwaitBudget`: how much of the budget is used, in words."
    )
    resolution_recorded: bool


class PendingApproval(BaseModel):
    call_id: str
    tool: str
    arguments: dict[str, Any]
    arguments_hash: str
    since: float


class RunningAttempt(BaseModel):
    attempt_id: str
    worker_id: str
    output_chars: int


@dataclass(kw_only=True)
class SessionToolCall(ToolCall):
    turn: int


class Snapshot(BaseModel):
    session: SnapshotSession
    current_turn: Turn | None
    waiting: list[QueuedStep]
    waits: list[WaitInfo]
    approvals: list[PendingApproval]
    running: list[RunningAttempt]
    history: list[Item]
    tool_calls: list[SessionToolCall]


class PersonWait(BaseModel):
    """Something a person must do for a turn to go on."""

    session_id: str
    agent: str
    turn: int
    call_id: str = Field(
        description="The tool call to approve, deny or answer; empty for a `budget`."
    )
    step_id: str
    kind: Literal["approval", "question", "budget"] = Field(
        description="`approval`: approve or deny the call; `question`: answer it; `budget`: "
        "raise or remove the session's budget (`PUT /v1/sessions/{id}/budget`), or its "
        "tenant's when `tenant` is set, or cancel."
    )
    tool: str = Field(description="The tool of the call; empty for a `budget`.")
    arguments: dict[str, Any] = Field(description="The call's arguments; empty for a `budget`.")
    arguments_hash: str = Field(description="What an approval is bound to.")
    question: str | None = Field(description="What the tool asks (a `question`).")
    choices: list[str] | None = Field(description="The answers it takes, if it named them.")
    since: float = Field(description="Unix time the wait started.")
    reason: str | None = Field(
        None, description="A `budget`: how much of the budget is used, in words."
    )
    tenant: str | None = Field(
        None,
        description="A `budget` on the session's tenant's budget (not its own): the tenant, "
        "whose budget an admin raises or removes (`PUT /admin/tenants/{tenant}/budget`); "
        "null for a wait on the session's budget.",
    )
    budget: SessionBudget | None = Field(None, description="A `budget`: the session's budget.")
    usage: SessionUsage | None = Field(None, description="A `budget`: what the session used.")


class Inbox(BaseModel):
    items: list[PersonWait] = Field(
        description="What waits for a person, the sessions that started waiting last first."
    )
    next_cursor: str | None = Field(description=NEXT_CURSOR)


class ShownTurnStatus(StrEnum):
    """A turn's status as answered: ``waiting`` is a running turn that waits for a person."""

    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class TurnResult(BaseModel):
    """A turn: only `session_id`, `turn` and `status` while it runs; while it waits for a
    person, its record so far and `waiting_for`."""

    session_id: str
    turn: int
    status: ShownTurnStatus
    waiting_for: list[PersonWait] = Field(
        default_factory=list,
        description="With `waiting`: each approval, answer or budget the turn waits for.",
    )
    text: str | None = None
    error: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    steps: list[Step] = Field(default_factory=list)
    started_at: float | None = None
    ended_at: float | None = None


class SentMessage(TurnResult):
    created: bool = Field(
        description="False when this `message_id` was sent before: the first send's turn "
        "and outcome."
    )
    outcome: Literal["started", "queued", "interrupted", "steered"] = Field(
        description="What the message did (docs/mid-turn.md): `started` its turn (the "
        "session was idle); `queued` (its turn starts once the running one ends); "
        "`interrupted` the running turn (cancelled; its turn started at once); `steered` "
        "into the running turn (`turn` is that turn, which answers it)."
    )
    interrupted: int | None = Field(
        None, description="With `interrupted`: the turn the message cancelled."
    )


class ServedAgent(AgentSpec):
    workers: int = Field(
        description="How many connected Workers serve this agent now (0: sessions of it "
        "wait until one connects)."
    )


class AgentList(BaseModel):
    agents: list[ServedAgent]


class WorkerAgent(BaseModel):
    name: str
    tools: list[str]


class ConnectedWorker(BaseModel):
    worker_id: str
    connected_at: float = Field(description="Unix time of the connection.")
    capacity: int = Field(description="How many attempts it runs at once.")
    draining: bool
    agents: list[WorkerAgent] = Field(description="The agents it serves, with their tools.")
    running: list[str] = Field(description="The attempts it holds now.")
    node: str | None = Field(
        None,
        description="The id of the node it is connected to (a Worker connects to every "
        "node of a cluster: one entry per node); null on a node alone.",
    )


class WorkerList(BaseModel):
    workers: list[ConnectedWorker] = Field(
        description="The Workers connected to every node of the cluster that answered "
        "(to this node only when asked with `x-dex-local: 1`, or on a node alone)."
    )
    unreachable: list[str] = Field(
        default_factory=list,
        description="The ids of the other nodes that did not answer in time: their "
        "Workers are missing from the list.",
    )


# --- cluster -------------------------------------------------------------------------------


class ClusterMember(BaseModel):
    node_id: str
    address: str = Field(description="The base URL other nodes reach it at.")
    standby: bool = Field(
        description="Started as a standby: it owns partitions only once another node fails."
    )
    partitions: list[int] = Field(description="The partitions it owns now.")
    here: bool = Field(description="Whether it is the node that answered.")


class ClusterView(BaseModel):
    node_id: str | None = Field(
        description="The id of the node that answered; null on a node alone (SQLite, or "
        "no cluster), which serves every session itself."
    )
    partition_count: int | None = Field(
        description="How many partitions the sessions are spread over (null on a node alone)."
    )
    members: list[ClusterMember] = Field(
        description="The live nodes and the partitions each owns (empty on a node alone)."
    )


# --- waits -----------------------------------------------------------------------------------


class ApprovalList(BaseModel):
    approvals: list[PendingApproval]


class Approved(BaseModel):
    call_id: str
    approved: bool


class Answered(BaseModel):
    call_id: str
    answered: bool


class Cancelled(BaseModel):
    session_id: str
    turn: int
    status: TurnStatus


EVENT_ID = r"^[0-9]{1,19}(-[0-9]{1,19})?$"
"""An event id, as ``Last-Event-ID`` gives it back: opaque to clients, and of the stream
backend's form (``57`` in memory, a Redis stream id such as ``1733150000000-3``)."""

SSE_EVENT: dict[str, Any] = {
    "type": "object",
    "description": "One Server-Sent Event (keep-alive comments are not events).",
    "properties": {
        "id": {
            "type": "string",
            "pattern": EVENT_ID,
            "description": "For Last-Event-ID: opaque, give it back as it came. Absent on "
            "the stream's notices (`stream.gap`, `stream.dropped`), so that resuming "
            "starts after the last event delivered.",
        },
        "event": {
            "type": "string",
            "description": "history.item, turn.started, turn.completed, turn.failed, "
            "turn.cancelled, wait.started, wait.ended (a budget wait), budget.changed, "
            "message.queued, message.steered, model.delta, model.discard; "
            "the stream's own notices, with no id: stream.gap (events after the "
            "Last-Event-ID are no longer kept) first, stream.dropped (this subscriber "
            "fell too far behind: the response ends, resume with Last-Event-ID) last",
        },
        "data": {"type": "string", "contentMediaType": "application/json"},
    },
    "required": ["event", "data"],
}


# --- operations ------------------------------------------------------------------------------


class Health(BaseModel):
    status: str


class Readiness(BaseModel):
    status: str = Field(description="`ready`, or `not ready` (with a 503).")
    role: str | None = Field(
        None,
        description="The node's role: `active` (ready), or `starting`, `standby`, "
        "`recovering`, `draining`, `stopped`, `stepped-down`.",
    )
    epoch: int | None = Field(None, description="The lease epoch of an active node.")


# --- links: what a response's ids open (OpenAPI links; Schemathesis follows them) --------------


def _links(source: str, targets: list[str], **extra: str) -> dict[str, Any]:
    return {
        f"{target}": {"operationId": target, "parameters": {"session_id": source, **extra}}
        for target in targets
    }


SESSION_LINKS = _links(
    "$response.body#/id",
    [
        "get_agent_snapshot",
        "send_message",
        "list_approvals",
        "stream_events",
        "cancel",
        "approve",
        "deny",
        "answer",
        "reconcile",
        "set_budget",
        "remove_budget",
    ],
)
"""A created session's id, for every route about one session."""

TURN_LINKS = {
    **_links("$response.body#/session_id", ["get_turn"], number="$response.body#/turn"),
    **_links("$response.body#/session_id", ["cancel", "approve", "deny", "answer", "reconcile"]),
}
"""A sent message's turn, and its session's waits."""
