"""Dex agents over MCP: ``dex mcp`` serves a Dex Server (or cluster) to MCP clients.

An MCP client (Claude Desktop, an IDE, another agent) sees Dex as a handful of tools:
list the agents, start a session, send a message and wait for its turn, act on what a
turn waits for (approve, deny, answer), read a session, list the inbox. Every call goes
through ``dex.Client``, so a cluster's addresses, retries and auth work as for any
client; this module holds no state of its own, and Dex keeps the sessions durable: an
MCP server restarted (or another one) goes on with the same sessions.

A turn that waits for a person does not block the tool call: ``send_message`` returns
what the turn waits for (each approval with its call id, tool and arguments, each
question with its choices, a budget with its reason), and the model asks its user, then
calls ``approve_tool_call``, ``deny_tool_call`` or ``answer_question``, which wait for
the turn again. A turn still running after ``wait`` seconds returns ``running``;
``wait_for_turn`` goes on waiting.

Auth: the Dex token is ``DEX_CLIENT_TOKEN``, as for every client command. Over
Streamable HTTP, a request with ``Authorization: Bearer TOKEN`` acts with that token
instead (each MCP client with its own, checked by Dex); a request without one acts
with the server's. A Dex error (unknown session, a wait already resolved, a refused
token) is a tool error with Dex's message.

Needs ``dex-runtime[mcp]`` (the official ``mcp`` SDK).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel, Field

from dex._address import addresses
from dex.client import Client
from dex.errors import DexError

log = logging.getLogger("dex.mcp_server")

DEFAULT_WAIT = 50.0
"""Seconds a tool call waits for a turn before it answers ``running``: under the 60 s
many MCP clients allow a request."""
MAX_WAIT = 600.0
PROGRESS_EVERY = 5.0
"""While it waits, a tool call reports progress this often (to a client that asked for
progress: some clients keep a request alive while it progresses)."""
LAST_MESSAGES = 10
MAX_VALUE_CHARS = 2_000
"""A tool's result or arguments longer than this as JSON are cut short in what a tool
answers (``get_session`` reads the rest of nothing: Dex's API has it all)."""
BY = "mcp"
"""Who approves, denies and answers, as Dex records it."""

TurnStatus = Literal["running", "waiting", "completed", "failed", "cancelled"]


# --- what the tools answer ---------------------------------------------------------------


class Wait(BaseModel):
    """Something a person must do before a turn goes on."""

    kind: Literal["approval", "question", "budget"] = Field(
        description="approval: approve_tool_call or deny_tool_call; question: "
        "answer_question; budget: an operator raises the session's budget."
    )
    session_id: str
    turn: int
    call_id: str = Field(description="The tool call to act on (empty for a budget).")
    tool: str = Field(description="The tool the agent wants to call (empty for a budget).")
    arguments: Any = Field(description="The call's arguments.")
    arguments_hash: str = Field(
        description="Pass it to approve_tool_call to approve exactly these arguments."
    )
    question: str | None = Field(None, description="What the tool asks (a question).")
    choices: list[str] | None = Field(None, description="The answers it takes, if it named them.")
    reason: str | None = Field(None, description="A budget: how much of it is used.")


class ToolCall(BaseModel):
    call_id: str
    tool: str
    status: str = Field(
        description="pending, succeeded, failed, denied, outcome_unknown, cancelled..."
    )
    result: Any = None
    error: str | None = None


class TurnOutcome(BaseModel):
    """Where a turn is: ended, waiting for a person, or still running."""

    session_id: str
    turn: int
    status: TurnStatus
    text: str | None = Field(None, description="The agent's answer (completed).")
    error: str | None = Field(None, description="Why the turn failed or was cancelled.")
    waiting_for: list[Wait] = Field(default_factory=list)
    tool_calls: list[ToolCall] = Field(default_factory=list)
    next: str = Field(description="What to do next.")


class AgentTool(BaseModel):
    name: str
    description: str
    kind: str = Field(description="read, write, idempotent_write or task.")
    approval: str = Field(description="never, always, or predicate (depends on the arguments).")


class AgentInfo(BaseModel):
    name: str
    instructions: str = Field(description="The start of the agent's instructions.")
    tools: list[AgentTool]
    workers: int = Field(description="Workers serving it now (0: its turns wait for one).")


class AgentList(BaseModel):
    agents: list[AgentInfo]


class SessionStarted(BaseModel):
    session_id: str
    agent: str
    tenant: str | None
    status: str
    next: str


class Message(BaseModel):
    """One item of a session's history."""

    role: Literal["user", "assistant", "tool_result", "note", "summary"]
    text: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool: str | None = None
    status: str | None = None
    result: Any = None
    error: str | None = None


class SessionView(BaseModel):
    session_id: str
    agent: str
    tenant: str | None
    status: str = Field(description="idle, running, waiting (for a person) or failed.")
    last_turn_status: str | None
    usage: dict[str, Any]
    budget: dict[str, Any] | None
    current_turn: TurnOutcome | None = Field(description="The turn that runs now, if any.")
    history_items: int
    last_messages: list[Message]


class InboxPage(BaseModel):
    items: list[Wait]
    next_cursor: str | None = Field(description="Pass it as cursor for the next page.")


# --- the bridge to Dex -----------------------------------------------------------------


class Dex:
    """The Dex Server(s) the tools call: one shared ``dex.Client`` with the server's
    token, or one per call with the bearer token an HTTP request carried."""

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        wait: float = DEFAULT_WAIT,
        timeout: float = 30.0,
    ) -> None:
        self.addresses = addresses(address)
        self.wait = wait
        self.timeout = timeout
        self._shared = Client(self.addresses, token=token, timeout=timeout)

    async def __aenter__(self) -> Dex:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._shared.close()

    @asynccontextmanager
    async def client(self, ctx: Context | None) -> AsyncIterator[Client]:
        """The client for this request; a Dex error leaves it as a tool error."""
        bearer = _bearer(ctx.headers if ctx is not None else None)
        try:
            if bearer is None:
                yield self._shared
            else:
                async with Client(self.addresses, token=bearer, timeout=self.timeout) as own:
                    yield own
        except DexError as e:
            raise ToolError(_explained(e)) from e

    async def follow(
        self,
        client: Client,
        ctx: Context | None,
        session_id: str,
        turn: int,
        wait: float | None,
        record: dict[str, Any] | None = None,
    ) -> TurnOutcome:
        """The turn once it ends or waits for a person, or ``running`` after ``wait``."""
        wait = self.wait if wait is None else wait
        start = time.monotonic()
        while record is None or record["status"] == "running":
            left = wait - (time.monotonic() - start)
            if record is not None and left <= 0:
                break
            record = await client.wait_turn(
                session_id, turn, timeout=max(0.0, min(left, PROGRESS_EVERY))
            )
            if record["status"] == "running" and ctx is not None:
                elapsed = time.monotonic() - start
                await ctx.report_progress(elapsed, None, f"turn {turn} is running")
        return outcome(record, waited=wait)


def _bearer(headers: Mapping[str, str] | None) -> str | None:
    """The token of an ``Authorization: Bearer`` header; None without the header."""
    if not headers:
        return None
    value = next((v for k, v in headers.items() if k.lower() == "authorization"), None)
    if value is None:
        return None
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ToolError("the Authorization header is not 'Bearer TOKEN'")
    return token.strip()


def _explained(e: DexError) -> str:
    """Dex's message, its kind first, with each problem the server found in the request."""
    problems = e.details.get("problems") or []
    found = "; ".join(f"{p.get('where')}: {p.get('problem')}" for p in problems)
    return f"{e.code}: {e.message}" + (f" ({found})" if found else "")


# --- the answers, from Dex's records -----------------------------------------------------


def trimmed(value: Any) -> Any:
    """``value``, or the start of its JSON when that is longer than ``MAX_VALUE_CHARS``."""
    text = json.dumps(value, default=str)
    if len(text) <= MAX_VALUE_CHARS:
        return value
    return text[:MAX_VALUE_CHARS] + f"... ({len(text)} characters in all)"


def wait_of(item: dict[str, Any]) -> Wait:
    return Wait(
        kind=item["kind"],
        session_id=item["session_id"],
        turn=item["turn"],
        call_id=item["call_id"],
        tool=item["tool"],
        arguments=trimmed(item["arguments"]),
        arguments_hash=item["arguments_hash"],
        question=item.get("question"),
        choices=item.get("choices"),
        reason=item.get("reason"),
    )


def outcome(record: dict[str, Any], waited: float = 0.0) -> TurnOutcome:
    """A turn record of Dex's API (``GET .../turns/{n}``) as a tool answers it."""
    session_id, turn, status = record["session_id"], record["turn"], record["status"]
    waits = [wait_of(w) for w in record.get("waiting_for") or []]
    calls = [
        ToolCall(
            call_id=c["id"],
            tool=c["name"],
            status=c["status"],
            result=trimmed(c.get("result")),
            error=c.get("error"),
        )
        for c in record.get("tool_calls") or []
    ]
    return TurnOutcome(
        session_id=session_id,
        turn=turn,
        status=status,
        text=record.get("text"),
        error=record.get("error"),
        waiting_for=waits,
        tool_calls=calls,
        next=_next(status, session_id, turn, waits, waited),
    )


def _next(status: str, session_id: str, turn: int, waits: list[Wait], waited: float) -> str:
    if status == "completed":
        return "The turn completed: text is the agent's answer. send_message goes on."
    if status == "failed":
        return "The turn failed (error says why). send_message starts a new turn."
    if status == "cancelled":
        return "The turn was cancelled. send_message starts a new turn."
    if status == "running":
        return (
            f"Still running after {waited:g} s: call wait_for_turn with session_id "
            f"{session_id!r} and turn {turn} to wait on."
        )
    todo = []
    kinds = {w.kind for w in waits}
    if "approval" in kinds:
        todo.append(
            "show the user each tool call to approve (tool, arguments) and ask; then "
            "approve_tool_call (with its arguments_hash) or deny_tool_call (with a reason)"
        )
    if "question" in kinds:
        todo.append("ask the user each question (with its choices); then answer_question")
    if "budget" in kinds:
        todo.append(
            "the session's budget is used up: an operator raises it (dex budget "
            f"{session_id} --max-tokens N) and the turn goes on"
        )
    return "The turn waits for a person: " + "; ".join(todo) + "."


def message_of(item: dict[str, Any]) -> Message:
    kind = item.get("type")
    if kind == "assistant":
        calls = [
            {"tool": c["name"], "arguments": trimmed(c.get("arguments"))}
            for c in item.get("tool_calls") or []
        ]
        return Message(role="assistant", text=item.get("text"), tool_calls=calls or None)
    if kind == "tool_result":
        return Message(
            role="tool_result",
            tool=item.get("name"),
            status=item.get("status"),
            result=trimmed(item.get("result")),
            error=item.get("error"),
        )
    role = kind if kind in ("user", "note", "summary") else "note"
    return Message(role=role, text=item.get("text"))


# --- the tools ---------------------------------------------------------------------------

SessionId = Annotated[str, Field(description="The session's id (from start_session).")]
CallId = Annotated[str, Field(description="The tool call's call_id (from waiting_for).")]
WaitSeconds = Annotated[
    float | None,
    Field(
        ge=0,
        le=MAX_WAIT,
        description="How long to wait for the turn to end or to wait for a person before "
        "answering 'running' (default: the server's, 50 s).",
    ),
]

READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)


def build(dex: Dex, name: str = "dex") -> MCPServer[Any]:
    """An MCP server whose tools call ``dex``."""
    server: MCPServer[Any] = MCPServer(
        name,
        instructions=(
            "Dex runs durable AI agents. list_agents shows them; start_session opens a "
            "session with one; send_message talks to it and answers the agent's reply, or "
            "what its turn waits for: a tool call to approve or deny, a question to answer. "
            "Ask the user before approving, denying or answering on their behalf."
        ),
        log_level="WARNING",
    )

    @server.tool(annotations=READ)
    async def list_agents(ctx: Context) -> AgentList:
        """List the agents Dex serves: each one's tools (and which need approval) and how
        many Workers serve it now."""
        async with dex.client(ctx) as client:
            found = await client.list_agents()
        return AgentList(
            agents=[
                AgentInfo(
                    name=a["name"],
                    instructions=a.get("instructions", "")[:500],
                    tools=[
                        AgentTool(
                            name=t["name"],
                            description=t.get("description", ""),
                            kind=t.get("kind", "write"),
                            approval=t.get("approval", "never"),
                        )
                        for t in a.get("tools", [])
                    ],
                    workers=a.get("workers", 0),
                )
                for a in found
            ]
        )

    @server.tool(annotations=WRITE)
    async def start_session(
        agent: Annotated[str, Field(description="The agent's name (from list_agents).")],
        ctx: Context,
        tenant: Annotated[
            str | None,
            Field(description="Whose session it is, for good (optional; 1-64 of A-Za-z0-9_.-)."),
        ] = None,
        session_id: Annotated[
            str | None,
            Field(description="An id of your choice (optional; Dex makes one)."),
        ] = None,
    ) -> SessionStarted:
        """Start a session with an agent. It keeps its history across turns: send_message
        talks to it."""
        async with dex.client(ctx) as client:
            made = await client.create_session(agent, session_id, tenant=tenant)
        return SessionStarted(
            session_id=made["id"],
            agent=made["agent"],
            tenant=made.get("tenant"),
            status=made["status"],
            next=f"send_message with session_id {made['id']!r}",
        )

    @server.tool(annotations=WRITE)
    async def send_message(
        session_id: SessionId,
        text: Annotated[str, Field(description="The user's message to the agent.")],
        ctx: Context,
        message_id: Annotated[
            str | None,
            Field(
                description="Optional: sending again with the same id answers the first "
                "send's turn instead of starting another."
            ),
        ] = None,
        wait_seconds: WaitSeconds = None,
    ) -> TurnOutcome:
        """Send a message to the session's agent and wait for its turn. Answers the agent's
        final text when the turn completes; when it stops for a person, what it waits
        for (tool calls to approve or deny, questions to answer, a budget); a failed
        turn's error; or 'running' when it takes longer (then wait_for_turn)."""
        async with dex.client(ctx) as client:
            sent = await client.send_message(session_id, text, message_id=message_id)
            return await dex.follow(client, ctx, session_id, sent["turn"], wait_seconds)

    @server.tool(annotations=READ)
    async def wait_for_turn(
        session_id: SessionId,
        turn: Annotated[int, Field(ge=1, description="The turn's number.")],
        ctx: Context,
        wait_seconds: WaitSeconds = None,
    ) -> TurnOutcome:
        """Wait for a turn that was still running: answers as send_message does."""
        async with dex.client(ctx) as client:
            return await dex.follow(client, ctx, session_id, turn, wait_seconds)

    async def resolve(
        ctx: Context, session_id: str, call_id: str, wait: float | None, action: str, **args: Any
    ) -> TurnOutcome:
        """Approve, deny or answer a call, then follow its turn."""
        async with dex.client(ctx) as client:
            snapshot = await client.get_agent_snapshot(session_id)
            turn = next(
                (c["turn"] for c in snapshot["tool_calls"] if c["id"] == call_id),
                (snapshot["current_turn"] or {}).get("number"),
            )
            await getattr(client, action)(session_id, call_id, by=BY, **args)
            if turn is None:  # Dex took it, yet the snapshot named no turn of it
                raise ToolError(f"{action}: recorded; get_session shows where the session is")
            return await dex.follow(client, ctx, session_id, turn, wait)

    @server.tool(annotations=WRITE)
    async def approve_tool_call(
        session_id: SessionId,
        call_id: CallId,
        ctx: Context,
        arguments_hash: Annotated[
            str | None,
            Field(
                description="The arguments_hash of the wait: the approval is refused if the "
                "call's arguments are not the ones shown."
            ),
        ] = None,
        wait_seconds: WaitSeconds = None,
    ) -> TurnOutcome:
        """Approve a tool call the turn waits for (ask the user first): the tool runs once,
        and the turn goes on. Answers the turn as send_message does."""
        return await resolve(
            ctx, session_id, call_id, wait_seconds, "approve", arguments_hash=arguments_hash
        )

    @server.tool(annotations=WRITE)
    async def deny_tool_call(
        session_id: SessionId,
        call_id: CallId,
        reason: Annotated[str, Field(description="Why: the agent sees it.")],
        ctx: Context,
        wait_seconds: WaitSeconds = None,
    ) -> TurnOutcome:
        """Deny a tool call the turn waits for: the tool does not run, the agent is told
        the reason and the turn goes on. Answers the turn as send_message does."""
        return await resolve(ctx, session_id, call_id, wait_seconds, "deny", reason=reason)

    @server.tool(annotations=WRITE)
    async def answer_question(
        session_id: SessionId,
        call_id: CallId,
        answer: Annotated[
            str, Field(description="The user's answer (one of the choices, if it has some).")
        ],
        ctx: Context,
        wait_seconds: WaitSeconds = None,
    ) -> TurnOutcome:
        """Answer the question a tool asked: the tool goes on with it, and the turn too.
        Answers the turn as send_message does."""
        return await resolve(ctx, session_id, call_id, wait_seconds, "answer", answer=answer)

    @server.tool(annotations=READ)
    async def get_session(
        session_id: SessionId,
        ctx: Context,
        last: Annotated[
            int, Field(ge=0, le=200, description="How many of the last history items to show.")
        ] = LAST_MESSAGES,
    ) -> SessionView:
        """Read a session: its status, its usage and budget, the turn that runs now and
        what it waits for, and its last messages."""
        async with dex.client(ctx) as client:
            snapshot = await client.get_agent_snapshot(session_id)
            session, current = snapshot["session"], snapshot["current_turn"]
            turn = None
            if current is not None:
                turn = outcome(await client.wait_turn(session_id, current["number"], timeout=0))
        history = snapshot["history"]
        return SessionView(
            session_id=session["id"],
            agent=session["agent"],
            tenant=session.get("tenant"),
            status=session["status"],
            last_turn_status=session.get("last_turn_status"),
            usage=session.get("usage") or {},
            budget=session.get("budget"),
            current_turn=turn,
            history_items=len(history),
            last_messages=[message_of(i) for i in history[len(history) - last :]] if last else [],
        )

    @server.tool(annotations=READ)
    async def list_inbox(
        ctx: Context,
        tenant: Annotated[
            str | None, Field(description="Only this tenant's sessions (optional).")
        ] = None,
        limit: Annotated[int, Field(ge=1, le=100, description="Sessions per page.")] = 20,
        cursor: Annotated[
            str | None, Field(description="The next_cursor of the previous page.")
        ] = None,
    ) -> InboxPage:
        """List what waits for a person across sessions, latest first: tool calls to
        approve or deny, questions to answer, budgets used up."""
        async with dex.client(ctx) as client:
            page = await client.list_inbox(limit=limit, cursor=cursor, tenant=tenant)
        return InboxPage(items=[wait_of(i) for i in page["items"]], next_cursor=page["next_cursor"])

    return server


# --- running it --------------------------------------------------------------------------


async def serve_stdio(dex: Dex) -> None:
    """Serve over stdin and stdout until the client closes them."""
    async with dex:
        await build(dex).run_stdio_async()


async def serve_http(dex: Dex, host: str = "127.0.0.1", port: int = 7460) -> None:
    """Serve Streamable HTTP at ``http://HOST:PORT/mcp`` until stopped. Stateless: each
    request stands alone, so a restart (or another instance) loses no MCP session."""
    import uvicorn

    app = build(dex).streamable_http_app(stateless_http=True, host=host)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
    async with dex:
        log.info(
            "serving MCP on http://%s:%d/mcp for %s",
            host,
            port,
            ",".join(dex.addresses),
            extra={"action": "mcp.serve"},
        )
        await uvicorn.Server(config).serve()
