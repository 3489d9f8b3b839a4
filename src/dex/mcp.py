"""MCP servers as tool sources: ``dex.mcp_tools(url=...)`` or ``dex.mcp_tools(command=...)``.

Put the result among an agent's tools (``dex.Agent(tools=[dex.mcp_tools(...), ...])``).
A Worker connects to each server when it starts, lists its tools once, and registers
them with the agent's spec in its hello: the tool list an agent offers the model is fixed
for the life of the Worker process. It keeps one MCP session per server, and reconnects
by itself when the session is lost (the list stays the one it registered).

Each call carries Dex's idempotency key in the request's ``_meta``
(``IDEMPOTENCY_KEY_META``), so a server that de-duplicates can. An ``isError`` result is
a failed call the model sees (``ToolError``); a lost connection fails the attempt, and
the call's kind decides what follows (the crash matrix).

Needs ``dex-runtime[mcp]`` (the official ``mcp`` SDK); imported on first use.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, cast

from mcp import Client, StdioServerParameters
from mcp.shared.exceptions import MCPError
from mcp.types import (
    CONNECTION_CLOSED,
    INVALID_PARAMS,
    METHOD_NOT_FOUND,
    REQUEST_TIMEOUT,
    CallToolResult,
    RequestParamsMeta,
    TextContent,
)
from mcp.types import Tool as RemoteTool

from dex.errors import ToolError
from dex.tools import Tool, ToolContext
from dex.wire import TOOL_CALL_NOT_RUN_ERROR_PREFIX, RetryPolicy, ToolKind, ToolSpec

log = logging.getLogger("dex.mcp")

IDEMPOTENCY_KEY_META = "dex/idempotency_key"
"""The ``_meta`` key of every ``tools/call`` that holds the call's idempotency key: the
same for every attempt of one tool call, across Workers and servers."""
CALL_ID_META = "dex/call_id"
"""The ``_meta`` key that holds the Dex tool call's id."""
ATTEMPT_META = "dex/attempt"
"""The ``_meta`` key that holds the attempt's number (1, 2, ...)."""

_ANSWERED = frozenset({INVALID_PARAMS, METHOD_NOT_FOUND})
"""JSON-RPC errors with which a server refuses a call before running it (unknown tool,
bad arguments): the model sees them, as it sees an ``isError`` result."""


class MCPTools:
    """The tools of one MCP server, listed when a Worker starts. Build it with
    ``dex.mcp_tools``."""

    def __init__(
        self,
        *,
        url: str | None = None,
        command: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        kinds: Mapping[str, ToolKind | str] | None = None,
        include: Sequence[str] | None = None,
        prefix: str = "",
        retry: RetryPolicy | None = None,
        connect_timeout: float = 10.0,
    ) -> None:
        if (url is None) == (command is None):
            raise ValueError("dex.mcp_tools needs exactly one of url=... or command=[...]")
        if command is not None and (isinstance(command, str) or not command):
            raise ValueError("command is the program and its arguments, as a list: ['python', ...]")
        if url is not None and not url.startswith(("http://", "https://")):
            raise ValueError(
                f"url must be the http(s) address of a Streamable HTTP server: {url!r}"
            )
        if (env is not None or cwd is not None) and command is None:
            raise ValueError("env and cwd are for a stdio server (command=...)")
        if isinstance(include, str):
            raise ValueError("include is a list of tool names: ['search', ...]")
        if connect_timeout <= 0:
            raise ValueError("connect_timeout must be positive")
        self.kinds = {name: ToolKind(kind) for name, kind in (kinds or {}).items()}
        if tasks := sorted(n for n, k in self.kinds.items() if k == ToolKind.TASK):
            raise ValueError(f"an MCP tool cannot be a task (it has no poll): {tasks}")
        self.include = None if include is None else list(include)
        self.prefix = prefix
        self.retry = retry
        self.connect_timeout = connect_timeout
        self.target: str | StdioServerParameters
        if url is not None:
            self.target = url
            self.label = url
        else:
            assert command is not None
            program, *args = command
            self.target = StdioServerParameters(
                command=program, args=args, env=None if env is None else dict(env), cwd=cwd
            )
            self.label = " ".join(command)
        self._tools: list[MCPTool] | None = None
        self._session = _Session(self.target, self.label, connect_timeout)

    def __repr__(self) -> str:
        return f"dex.mcp_tools({self.label!r})"

    def listed(self) -> list[Tool]:
        """The tools listed when the Worker started (``open``)."""
        if self._tools is None:
            raise RuntimeError(
                f"the tools of MCP server {self.label} are not listed yet: a Worker lists "
                "them when it starts (await tools.open() to list them yourself)"
            )
        return list(self._tools)

    async def open(self) -> None:
        """Connect and list the tools, once: a second call keeps the first list."""
        if self._tools is not None:
            return
        await self._session.start()
        try:
            remote = await self._session.list_tools()
        except Exception as e:
            raise RuntimeError(f"listing the tools of MCP server {self.label} failed: {e}") from e
        names = {t.name for t in remote}
        unknown = sorted((set(self.kinds) | set(self.include or ())) - names)
        if unknown:
            raise ValueError(
                f"MCP server {self.label} lists no tool named {unknown}; it lists {sorted(names)}"
            )
        wanted = [t for t in remote if self.include is None or t.name in self.include]
        self._tools = [MCPTool(self, t, self._kind(t)) for t in wanted]
        log.info(
            "listed %d tools of MCP server %s",
            len(self._tools),
            self.label,
            extra={"action": "mcp.listed", "server": self.label, "tools": len(self._tools)},
        )

    async def aclose(self) -> None:
        await self._session.close()

    def _kind(self, tool: RemoteTool) -> ToolKind:
        """A tool's kind: the override, else its annotations (``readOnlyHint``: ``read``,
        ``idempotentHint``: ``idempotent_write``), else ``write``, the safe default."""
        if tool.name in self.kinds:
            return self.kinds[tool.name]
        hints = tool.annotations
        if hints is not None and hints.read_only_hint:
            return ToolKind.READ
        if hints is not None and hints.idempotent_hint:
            return ToolKind.IDEMPOTENT_WRITE
        return ToolKind.WRITE

    async def call(
        self, name: str, arguments: dict[str, Any], ctx: ToolContext, *, checked: bool = False
    ) -> CallToolResult:
        """``tools/call`` with the call's ids in ``_meta``; ``checked``: on a session that
        answers a probe first."""
        meta = {
            IDEMPOTENCY_KEY_META: ctx.idempotency_key,
            CALL_ID_META: ctx.call_id,
            ATTEMPT_META: ctx.attempt,
        }
        return await self._session.call(name, arguments, meta, checked=checked)


class MCPTool(Tool):
    """One tool of an MCP server: its schema and description are the server's, and a call
    is a ``tools/call`` on the Worker's session with that server."""

    def __init__(self, source: MCPTools, remote: RemoteTool, kind: ToolKind) -> None:
        # not Tool.__init__: the arguments' schema is the server's, not a signature's
        self.fn = None  # type: ignore[assignment]
        self.kind = kind
        self.name = source.prefix + remote.name
        self.remote_name = remote.name
        self.description = remote.description or remote.title or ""
        self.retry = source.retry or RetryPolicy()
        self.approval = False
        self.poll_interval = 1.0
        self.concurrency_key = None
        self.concurrency_limit = 1
        self.poll_fn = None
        self.check_fn = None
        self._context_param = None
        self._spec = None
        self._source = source
        self._schema = dict(remote.input_schema)

    def _build_spec(self) -> ToolSpec:
        schema = {k: v for k, v in self._schema.items() if k != "title"}
        return ToolSpec(
            name=self.name,
            description=self.description,
            kind=self.kind,
            parameters=schema,
            retry=self.retry,
        )

    def validate(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """The server validates the arguments (a bad one is an ``isError`` result)."""
        return dict(arguments)

    async def invoke(self, ctx: ToolContext, kwargs: dict[str, Any]) -> Any:
        write = self.kind == ToolKind.WRITE
        try:
            # a write goes only on a session that answered just now: a server that restarted
            # since the last call is found before the call, not by losing it
            result = await self._source.call(self.remote_name, kwargs, ctx, checked=write)
        except MCPUnreachable as e:
            if write:  # nothing was sent: a known outcome, not an unknown one
                raise ToolError(f"{TOOL_CALL_NOT_RUN_ERROR_PREFIX}: {e}") from e
            raise
        except MCPError as e:
            if e.code in _ANSWERED:  # refused before it ran
                raise ToolError(f"MCP server {self._source.label} refused the call: {e}") from e
            raise
        if result.is_error:
            raise ToolError(_text(result) or f"MCP tool {self.remote_name} failed")
        return _value(result)


def _text(result: CallToolResult) -> str:
    return "\n".join(c.text for c in result.content if isinstance(c, TextContent))


def _value(result: CallToolResult) -> Any:
    """What the model sees of a result: its text (the usual case), else its structured
    content, else its content blocks as JSON."""
    if result.content and all(isinstance(c, TextContent) for c in result.content):
        return _text(result)
    if result.structured_content is not None:
        return result.structured_content
    return [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in result.content]


class MCPUnreachable(Exception):
    """No session with the MCP server answered within ``connect_timeout``: the call was not
    sent. A ``read`` or an ``idempotent_write`` fails the attempt (it runs again); a
    ``write`` records ``failed``, with ``TOOL_CALL_NOT_RUN_ERROR_PREFIX``."""

    retryable = True


class MCPConnectionLost(Exception):
    """The session was lost while the call was in flight: the call may or may not have
    run. The attempt fails, and the call's kind decides what follows."""

    retryable = True


class _Session:
    """One MCP session with a server, held by a task of its own (the SDK's connection must
    be opened and closed in one task), and opened again after it is lost."""

    def __init__(
        self, target: str | StdioServerParameters, label: str, connect_timeout: float
    ) -> None:
        self.target = target
        self.label = label
        self.connect_timeout = connect_timeout
        self._client: Client | None = None
        self._up = asyncio.Event()
        self._lost = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failure: str = "not connected yet"
        self._closing = False
        self.connections = 0
        """How many sessions were opened (1 at start; each reconnect adds one)."""

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._hold(), name=f"dex-mcp {self.label}")
        await self._connected()

    async def close(self) -> None:
        """Close the session and stop reopening it. The SDK's connect code can swallow a
        cancellation (anyio's cancel scopes), so the holder also checks ``_closing``, and
        is cancelled again until it ends."""
        self._closing = True
        task = self._task
        while task is not None and not task.done():
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)

    async def _hold(self) -> None:
        delay = 0.1
        quiet = False  # a try that opens no session, after one that failed too: debug level
        while not self._closing:
            opened = False
            try:
                async with Client(self.target) as client:
                    opened = True
                    self.connections += 1
                    self._client = client
                    self._up.set()
                    delay = 0.1
                    log.info(
                        "MCP session with %s open",
                        self.label,
                        extra={
                            "action": "mcp.connected",
                            "server": self.label,
                            "connections": self.connections,
                        },
                    )
                    await self._lost.wait()
                    self._failure = "a call found the session broken"
            except Exception as e:
                self._failure = _describe(e)
            finally:
                self._client = None
                self._up.clear()
                self._lost.clear()
            log.log(
                logging.DEBUG if quiet and not opened else logging.WARNING,
                "MCP session with %s %s: %s",
                self.label,
                "lost" if opened else "not opened",
                self._failure,
                extra={"action": "mcp.connection_lost", "server": self.label, "opened": opened},
            )
            quiet = not opened
            await asyncio.sleep(delay * random.uniform(0.5, 1.0))
            delay = min(delay * 2, 2.0)

    async def _connected(self) -> Client:
        if self._task is None:
            raise MCPUnreachable(f"the Worker has not opened MCP server {self.label}")
        if self._task.done():  # closed: say so rather than hang
            raise MCPUnreachable(f"the session with MCP server {self.label} was closed")
        try:
            await asyncio.wait_for(self._up.wait(), self.connect_timeout)
        except TimeoutError:
            raise MCPUnreachable(
                f"MCP server {self.label} unreachable for {self.connect_timeout:g}s: "
                f"{self._failure}"
            ) from None
        assert self._client is not None
        return self._client

    def _drop(self, client: Client) -> None:
        """The session ``client`` is broken: close it, and open another."""
        if self._client is client:  # calls from now on wait for the next session
            self._client = None
            self._up.clear()
            self._lost.set()

    async def list_tools(self) -> list[RemoteTool]:
        client = await self._connected()
        tools: list[RemoteTool] = []
        cursor: str | None = None
        while True:
            page = await client.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return tools

    async def call(
        self, name: str, arguments: dict[str, Any], meta: dict[str, Any], *, checked: bool
    ) -> CallToolResult:
        client = await self._connected()
        if checked:
            client = await self._alive(client)
        try:
            return await client.call_tool(name, arguments, meta=cast(RequestParamsMeta, meta))
        except MCPError as e:
            if e.code in (CONNECTION_CLOSED, REQUEST_TIMEOUT):
                self._drop(client)
                raise MCPConnectionLost(f"lost the MCP session with {self.label}: {e}") from e
            raise
        except Exception as e:  # the transport failed: the call may or may not have run
            self._drop(client)
            raise MCPConnectionLost(
                f"lost the MCP session with {self.label}: {_describe(e)}"
            ) from e

    async def _alive(self, client: Client) -> Client:
        """A session that answers now: ``client``, or (it did not answer) the next one
        opened; ``MCPUnreachable`` if that one does not answer either. The probe is a
        ``tools/list`` past the cache (protocol 2026-07-28 has no ``ping``)."""
        for _ in range(2):
            try:
                probe = client.list_tools(cache_mode="bypass")
                await asyncio.wait_for(probe, self.connect_timeout)
                return client
            except Exception as e:
                self._failure = _describe(e)
                self._drop(client)
            client = await self._connected()
        raise MCPUnreachable(f"MCP server {self.label} does not answer: {self._failure}")


def _describe(e: BaseException) -> str:
    while isinstance(e, BaseExceptionGroup) and len(e.exceptions) == 1:
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"


def mcp_tools(
    *,
    url: str | None = None,
    command: Sequence[str] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    kinds: Mapping[str, ToolKind | str] | None = None,
    include: Sequence[str] | None = None,
    prefix: str = "",
    retry: RetryPolicy | None = None,
    connect_timeout: float = 10.0,
) -> MCPTools:
    """The tools of an MCP server, to put among an agent's tools.

    ``url``: a Streamable HTTP server (``http://host:port/mcp``); or ``command``: a stdio
    server, started by the Worker (``["python", "server.py"]``, in ``cwd``; it gets only a
    safe few of the Worker's variables, such as ``PATH`` and ``HOME``, and those of ``env``).

    A tool's kind comes from its annotations: ``readOnlyHint`` makes it a ``read``,
    ``idempotentHint`` an ``idempotent_write``, anything else a ``write`` (runs at most
    once; a crash records ``outcome_unknown``). ``kinds={"search": "read"}`` overrides
    them by the server's tool name. ``include``: only these tools (all by default).
    ``prefix``: put before each name the model sees (to tell two servers' tools apart).
    ``retry``: the attempts of its ``read`` and ``idempotent_write`` calls.

    The Worker lists the tools when it starts and fails to start if the server does not
    answer within ``connect_timeout`` seconds."""
    return MCPTools(
        url=url,
        command=command,
        env=env,
        cwd=cwd,
        kinds=kinds,
        include=include,
        prefix=prefix,
        retry=retry,
        connect_timeout=connect_timeout,
    )


__all__ = [
    "ATTEMPT_META",
    "CALL_ID_META",
    "IDEMPOTENCY_KEY_META",
    "MCPConnectionLost",
    "MCPTool",
    "MCPTools",
    "MCPUnreachable",
    "mcp_tools",
]
