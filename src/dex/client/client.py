"""``dex.Client``: talk to a Dex Server over HTTP (aiohttp)."""

from __future__ import annotations

import asyncio
import functools
import os
import ssl as ssl_module
import time
from collections.abc import AsyncGenerator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

import aiohttp
import orjson
from tenacity import (
    AsyncRetrying,
    retry_if_exception_type,
    stop_before_delay,
    wait_random_exponential,
)

from dex._address import addresses
from dex.client import sse
from dex.client.flow import FlowControl
from dex.errors import (
    AuthError,
    Conflict,
    DexError,
    InvalidInput,
    NotFound,
    ServerError,
    StorageError,
    Unavailable,
)

if TYPE_CHECKING:
    from dex.wire import OnBusy  # a Literal: the client does not import pydantic to send

LONG_POLL = 2.0
"""A request that waits for a turn waits at most this long on the server, then asks again:
a node that hung (paused, cut off) holds a client no longer than this plus the slack
before it moves on to the next address."""
LONG_POLL_SLACK = 2.0
RETRY_INITIAL = 0.05
RETRY_MAX = 1.0
"""Backoff between rounds over the addresses: full jitter, up to 0.05 s doubling to 1 s."""
STREAM_RETRY_MAX = 2.0
"""The same for opening an event stream again, up to 2 s."""
SILENCE = 45.0
"""An event stream quiet this long is dead: the server sends a keep-alive comment after
15 s without an event."""
KEEP_ALIVE = 4.0
"""Seconds an idle pooled connection is kept for the next request: less than the server
keeps it (uvicorn's ``timeout_keep_alive``, 5 s). An older one is closed, not used: the
server may have closed it, and a request written on it fails (a POST, as an approval, is
not sent again: it may have been committed). aiohttp checks the age when it takes the
connection, so this holds even for a caller whose event loop was blocked meanwhile and
never saw the server close it."""

Time = float | datetime
"""A moment: Unix seconds, or a timezone-aware datetime."""

_ERRORS: dict[int, type[DexError]] = {
    401: AuthError,
    403: AuthError,
    404: NotFound,
    409: Conflict,
    422: InvalidInput,
}


class Client(FlowControl):
    """Async client. Use ``async with Client(...) as client``, or call ``close()``."""

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        timeout: float = 30.0,
        connections: int = 100,
        token: str | None = None,
        ssl: ssl_module.SSLContext | None = None,
    ) -> None:
        """``token``: the client token, when the server has auth on (default:
        ``DEX_CLIENT_TOKEN`` from the environment). ``ssl``: how to verify an ``https://``
        node (default: the system's CAs, or the file ``SSL_CERT_FILE`` names)."""
        self.addresses = addresses(address)
        token = token or os.environ.get("DEX_CLIENT_TOKEN")
        self._auth = {"authorization": f"Bearer {token}"} if token else {}
        self.timeout = timeout
        self._connections = connections
        self._ssl = ssl
        self._http: aiohttp.ClientSession | None = None
        self._current = 0

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    # --- sessions ---------------------------------------------------------------------

    async def create_session(
        self,
        agent: str,
        session_id: str | None = None,
        *,
        tenant: str | None = None,
        priority: int = 0,
        budget: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """A new session of ``agent``. ``tenant``: whose it is, for good (1-64 letters,
        digits or ``_.-``); with a tenant-scoped token, its tenant by default, and another
        one raises ``AuthError``. ``priority``: its Steps go ahead of those of its
        tenant's sessions of a lower one (-1000 to 1000). ``budget``: what the session may
        use in all, ``{"max_tokens": ...}``, ``{"max_cost_usd": ...}`` or both; a turn whose
        next model call would start at or over it waits until the budget is raised
        (``set_budget``)."""
        body: dict[str, Any] = {"agent": agent}
        if session_id is not None:
            body["session_id"] = session_id
        if tenant is not None:
            body["tenant"] = tenant
        if priority:
            body["priority"] = priority
        if budget is not None:
            body["budget"] = budget
        return await self._request("POST", "/v1/sessions", body)

    async def set_budget(
        self,
        session_id: str,
        *,
        max_tokens: int | None = None,
        max_cost_usd: float | None = None,
        by: str | None = None,
    ) -> dict[str, Any]:
        """Set the session's budget (one limit or both). A turn that waits for its budget
        goes on if the new one is not used up. Returns the budget, the usage and the
        session's status."""
        body = {"max_tokens": max_tokens, "max_cost_usd": max_cost_usd, "by": by}
        return await self._request("PUT", f"/v1/sessions/{session_id}/budget", body, retry=True)

    async def remove_budget(self, session_id: str, *, by: str | None = None) -> dict[str, Any]:
        """Remove the session's budget: no limit; a turn that waits for its budget goes on."""
        params = {"by": by} if by is not None else None
        return await self._request(
            "DELETE", f"/v1/sessions/{session_id}/budget", params=params, retry=True
        )

    async def fork_session(
        self, session_id: str, turn: int, new_session_id: str | None = None
    ) -> dict[str, Any]:
        """A new session whose history is ``session_id``'s before turn ``turn`` (its next
        message is its turn ``turn``; one past the last turn copies the whole history).
        The original does not change; a session in a turn raises ``Conflict``."""
        body: dict[str, Any] = {"turn": turn}
        if new_session_id is not None:
            body["session_id"] = new_session_id
        return await self._request("POST", f"/v1/sessions/{session_id}/fork", body)

    async def list_sessions(
        self,
        *,
        agent: str | None = None,
        tenant: str | None = None,
        status: str | None = None,
        created_since: Time | None = None,
        created_before: Time | None = None,
        updated_since: Time | None = None,
        updated_before: Time | None = None,
        order: str = "created",
        limit: int = 100,
        cursor: str | None = None,
    ) -> dict[str, Any]:
        """One page of sessions, newest first by ``order`` (``created`` or ``updated``):
        ``{"sessions": [...], "next_cursor": ...}``; pass ``next_cursor`` as ``cursor``
        (with the same filters) for the next page, until it is None.

        ``status``: ``idle``, ``running``, ``waiting`` (for a person), ``failed`` (the last
        turn failed) or ``outcome_unknown`` (a tool call's outcome is unknown and not
        reconciled). ``tenant``: only that tenant's sessions (a tenant-scoped token sees
        only its own; naming another raises ``AuthError``). Times are Unix seconds or aware
        datetimes; a range is ``[since, before)``."""
        params = _params(
            agent=agent,
            tenant=tenant,
            status=status,
            created_since=_unix(created_since),
            created_before=_unix(created_before),
            updated_since=_unix(updated_since),
            updated_before=_unix(updated_before),
            order=order,
            limit=limit,
            cursor=cursor,
        )
        return await self._request("GET", "/v1/sessions", params=params)

    async def list_inbox(
        self, *, limit: int = 100, cursor: str | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        """What waits for a person across sessions, the latest first: ``{"items": [...],
        "next_cursor": ...}``. Each item names the session, the tool call, its ``kind``
        (``approval``: approve or deny it; ``question``: answer it), the tool and its
        arguments, and the question and choices. A page holds the waits of up to
        ``limit`` sessions (``tenant``: of that tenant's sessions only)."""
        params = _params(limit=limit, cursor=cursor, tenant=tenant)
        return await self._request("GET", "/v1/inbox", params=params)

    async def send_message(
        self,
        session_id: str,
        text: str,
        *,
        message_id: str | None = None,
        on_busy: OnBusy | None = None,
        wait: bool = False,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Send a user message. Its turn starts now if the session is idle; if a turn runs,
        ``on_busy`` decides (None: the agent's policy, ``enqueue`` unless its Worker
        declares another; docs/mid-turn.md): ``enqueue`` starts its turn after the running
        one ends, ``reject`` raises ``Conflict`` (its ``details["turn"]``: the running
        turn), ``interrupt`` cancels the running turn and starts the message's at once,
        ``steer`` adds the message to the running turn, whose next model call sees it.
        The answer's ``outcome`` says which happened (``started``, ``queued``,
        ``interrupted``: with ``interrupted``, the turn cancelled; ``steered``), and its
        ``turn`` is the turn that answers the message (for ``steered``, the running one).

        With ``wait=True`` return once the turn has ended, or as soon as it waits for a
        person (``status`` ``waiting``: ``waiting_for`` lists each call to approve or
        question to answer), or when ``timeout`` passed (``running``). Sending again with
        the same ``message_id`` returns the first send's turn and outcome and changes
        nothing.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + timeout
        body: dict[str, Any] = {"text": text}
        if message_id is not None:
            body["message_id"] = message_id
        if on_busy is not None:
            body["on_busy"] = on_busy
        if wait:
            body["wait_seconds"] = min(timeout, LONG_POLL)
        result = await self._request(
            "POST",
            f"/v1/sessions/{session_id}/messages",
            body,
            read_timeout=timeout + LONG_POLL_SLACK,
            per_try=(min(timeout, LONG_POLL) if wait else 0) + LONG_POLL_SLACK,
            retry=message_id is not None,  # the same id again returns the first send's turn
        )
        if wait and result["status"] == "running":
            # The server holds a request only so long: wait out the rest of our timeout.
            remaining = max(0.0, deadline - time.monotonic())
            ended = await self.wait_turn(session_id, result["turn"], timeout=remaining)
            ended["created"] = result["created"]
            ended["outcome"] = result["outcome"]
            ended["interrupted"] = result["interrupted"]
            return ended
        return result

    async def wait_turn(
        self, session_id: str, turn: int, timeout: float | None = None
    ) -> dict[str, Any]:
        """The turn once it has ended or waits for a person (``waiting``, with
        ``waiting_for``); if ``timeout`` passes first, its current record."""
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            remaining = max(0.0, deadline - time.monotonic())
            chunk = min(remaining, LONG_POLL)
            result = await self._request(
                "GET",
                f"/v1/sessions/{session_id}/turns/{turn}",
                params={"wait_seconds": chunk},
                read_timeout=remaining + LONG_POLL_SLACK,
                per_try=chunk + LONG_POLL_SLACK,
            )
            if result["status"] != "running" or time.monotonic() >= deadline:
                return result

    async def get_agent_snapshot(self, session_id: str) -> dict[str, Any]:
        """History, state, the current turn with its Steps and attempts, and tool calls."""
        return await self._request("GET", f"/v1/sessions/{session_id}")

    async def list_agents(self) -> list[dict[str, Any]]:
        result = await self._request("GET", "/v1/agents")
        agents: list[dict[str, Any]] = result["agents"]
        return agents

    async def list_workers(self) -> list[dict[str, Any]]:
        """The Workers connected to the server: their agents and tools, capacity, and the
        attempts they run; in a cluster, those of every node that answered, each with the
        ``node`` it is connected to."""
        result = await self._request("GET", "/v1/workers")
        workers: list[dict[str, Any]] = result["workers"]
        return workers

    async def get_cluster(self) -> dict[str, Any]:
        """The nodes of the cluster (``members``: each one's ``node_id``, ``address``,
        ``standby``, and the ``partitions`` it owns now) and the ``node_id`` of the node
        that answered; no members on a node alone."""
        return await self._request("GET", "/v1/cluster")

    async def stream_events(
        self, session_id: str, *, last_event_id: str | None = None, reconnect: bool = True
    ) -> AsyncGenerator[dict[str, Any], None]:
        """The session's events as they happen (Server-Sent Events): ``history.item``,
        ``turn.started`` / ``turn.completed`` / ``turn.failed`` / ``turn.cancelled``,
        ``wait.started`` (and ``wait.ended``, ``budget.changed`` for a budget wait),
        ``message.queued``, ``message.steered`` and live ``model.delta`` text. Each is
        ``{"id", "type", "data"}``; ids are opaque strings: pass the last one you saw as
        ``last_event_id`` to resume after it.

        With ``reconnect`` (the default), a stream that breaks or ends (a node restarting,
        a standby taking over, a network error, a 5xx) is opened again with the last id
        seen as ``Last-Event-ID``, over every address, with backoff (and no sooner than the
        server's ``retry:``), until the client's timeout has passed without one: then
        ``Unavailable``. A 4xx raises at once (``NotFound`` for an unknown session).
        Without ``reconnect``, a break raises ``Unavailable`` and the end of the stream
        ends the iteration.

        The stream's own notices come as events with the last id seen: ``stream.gap``
        (events after that id are no longer kept, as after the restart of a node with
        the in-memory backend: the snapshot has what is durable), ``stream.dropped``
        (this reader fell too far behind; the stream goes on after the last id seen)."""
        decoder = sse.Decoder(last_event_id or "")
        path = f"/v1/sessions/{session_id}/events"
        while True:
            try:
                response, first = await self._open_stream(path, decoder, reconnect)
            except _NoAnswer as e:
                raise _broken(session_id, e.last) from None
            broke: Exception | None = None
            async with response:
                try:
                    chunk = first
                    while chunk:
                        for message in decoder.feed(chunk):
                            yield sse.event(message)
                        chunk = await response.content.readany()
                except (
                    aiohttp.ClientConnectionError,
                    aiohttp.ClientPayloadError,
                    TimeoutError,
                ) as e:
                    broke = e
            if not reconnect:
                if broke is not None:
                    raise _broken(session_id, broke) from broke
                return
            decoder.reset()  # an event the stream did not finish is not dispatched
            if decoder.retry:
                await asyncio.sleep(decoder.retry)

    # --- waits, cancel, reconcile ---------------------------------------------------------

    async def list_approvals(self, session_id: str) -> list[dict[str, Any]]:
        """Tool calls waiting for approval: call id, tool, arguments, arguments_hash, since."""
        result = await self._request("GET", f"/v1/sessions/{session_id}/approvals")
        approvals: list[dict[str, Any]] = result["approvals"]
        return approvals

    async def approve(
        self,
        session_id: str,
        call_id: str,
        *,
        by: str | None = None,
        arguments_hash: str | None = None,
    ) -> dict[str, Any]:
        """Approve a tool call: it runs once. Pass the ``arguments_hash`` you reviewed to
        refuse an approval of other arguments (409)."""
        body = {"by": by, "arguments_hash": arguments_hash}
        return await self._on_call(session_id, call_id, "approve", body)

    async def deny(
        self, session_id: str, call_id: str, reason: str, *, by: str | None = None
    ) -> dict[str, Any]:
        """Deny a tool call: it records ``denied`` and the model sees the reason."""
        return await self._on_call(session_id, call_id, "deny", {"reason": reason, "by": by})

    async def answer(
        self, session_id: str, call_id: str, answer: str, *, by: str | None = None
    ) -> dict[str, Any]:
        """Answer the question a tool asked (``ctx.ask``): the tool runs again with it."""
        return await self._on_call(session_id, call_id, "answer", {"answer": answer, "by": by})

    async def cancel_turn(
        self, session_id: str, reason: str = "cancelled by a client"
    ) -> dict[str, Any]:
        """Cancel the running turn: queued Steps fail as not started, running ones stop."""
        return await self._request("POST", f"/v1/sessions/{session_id}/cancel", {"reason": reason})

    async def reconcile(
        self,
        session_id: str,
        call_id: str,
        *,
        status: str,
        result: Any = None,
        error: str | None = None,
        by: str | None = None,
    ) -> dict[str, Any]:
        """Record what really happened to an ``outcome_unknown`` call (``succeeded`` with a
        result, or ``failed`` with an error). The model sees it in the history."""
        body = {"status": status, "result": result, "error": error, "by": by}
        return await self._on_call(session_id, call_id, "reconcile", body)

    async def _on_call(
        self, session_id: str, call_id: str, action: str, body: dict[str, Any]
    ) -> dict[str, Any]:
        """POST ``action`` (approve, deny, answer, reconcile) on one tool call."""
        return await self._request(
            "POST", f"/v1/sessions/{session_id}/tool_calls/{call_id}/{action}", body
        )

    # --- transport ----------------------------------------------------------------------

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self._connections,
                    ssl=self._ssl if self._ssl is not None else True,
                    keepalive_timeout=KEEP_ALIVE,
                ),
                json_serialize=lambda o: orjson.dumps(o).decode(),
            )
        return self._http

    async def _request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        params: dict[str, Any] | None = None,
        read_timeout: float | None = None,
        per_try: float | None = None,
        retry: bool | None = None,
    ) -> dict[str, Any]:
        """One request to whichever node serves. A request that is safe to repeat (a read,
        or ``retry=True``: a send that carries a ``message_id``) is tried again across the
        addresses, with backoff, until the client's timeout: a node restarting or a standby
        taking over is a gap, not an error. Others try each address once."""
        http = self._session()
        data = orjson.dumps(body) if body is not None else None
        timeout = aiohttp.ClientTimeout(total=per_try or read_timeout or self.timeout)
        safe = method == "GET" if retry is None else retry
        started = time.monotonic()
        send = functools.partial(self._round, http, method, path, data, params, timeout)
        try:
            return await send()
        except _NoAnswer as first:
            if not safe:
                raise self._unavailable(first.last) from None
        # a gap (a node restarting, a standby taking over): rounds with backoff (tenacity)
        retrying = AsyncRetrying(
            stop=stop_before_delay(
                max(0.0, (read_timeout or self.timeout) - (time.monotonic() - started))
            ),
            wait=wait_random_exponential(multiplier=RETRY_INITIAL, max=RETRY_MAX),
            retry=retry_if_exception_type(_NoAnswer),
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    return await send()
        except _NoAnswer as last:
            raise self._unavailable(last.last) from None
        raise AssertionError("unreachable")  # tenacity returns or raises

    async def _round(
        self,
        http: aiohttp.ClientSession,
        method: str,
        path: str,
        data: bytes | None,
        params: dict[str, Any] | None,
        timeout: aiohttp.ClientTimeout,
    ) -> dict[str, Any]:
        """One try at each address, from the one that answered last; ``_NoAnswer`` if none
        did (an error answer is raised as it is)."""
        last: Exception | None = None
        for _ in self.addresses:
            base = self.addresses[self._current % len(self.addresses)]
            try:
                async with http.request(
                    method,
                    base + path,
                    data=data,
                    params=params,
                    timeout=timeout,
                    headers=(
                        {"content-type": "application/json", **self._auth}
                        if data is not None
                        else self._auth
                    ),
                ) as response:
                    payload = await response.read()
                    if response.status == 503:
                        last = _not_serving(base, payload)
                        if not isinstance(last, StorageError):
                            self._current += 1  # a standby, or a node starting: the next one
                        continue
                    decoded = orjson.loads(payload) if payload else None
                    if response.status >= 400:
                        raise _error(response.status, decoded)
                    if not isinstance(decoded, dict):
                        raise ServerError(f"unexpected answer from {base}: {payload[:200]!r}")
                    return decoded
            except (
                TimeoutError,
                aiohttp.ClientConnectionError,
                aiohttp.ClientPayloadError,  # the node died while it sent the body
                OSError,
            ) as e:
                last = e
                self._current += 1
        raise _NoAnswer(last)

    async def _open_stream(
        self, path: str, decoder: sse.Decoder, retry: bool
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        """An event stream that answered (200 and its first bytes) at whichever node
        serves; with ``retry``, rounds over the addresses with backoff (never sooner than
        the server's ``retry:``) until the client's timeout. ``_NoAnswer`` if none did."""
        http = self._session()
        headers = {"accept": "text/event-stream", **self._auth}
        if decoder.last_event_id:
            headers["last-event-id"] = decoder.last_event_id
        send = functools.partial(self._stream_round, http, path, headers)
        if not retry:
            return await send()
        backoff = wait_random_exponential(multiplier=RETRY_INITIAL, max=STREAM_RETRY_MAX)
        retrying = AsyncRetrying(
            stop=stop_before_delay(self.timeout),
            wait=lambda state: max(decoder.retry or 0.0, backoff(state)),
            retry=retry_if_exception_type(_NoAnswer),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                return await send()
        raise AssertionError("unreachable")  # tenacity returns or raises

    async def _stream_round(
        self, http: aiohttp.ClientSession, path: str, headers: dict[str, str]
    ) -> tuple[aiohttp.ClientResponse, bytes]:
        """One try at each address, as ``_round``: a 5xx or a stream that ends before its
        first bytes is no answer; a 4xx is raised as it is."""
        last: Exception | None = None
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=self.timeout, sock_read=SILENCE)
        for _ in self.addresses:
            base = self.addresses[self._current % len(self.addresses)]
            response: aiohttp.ClientResponse | None = None
            try:
                response = await http.get(base + path, headers=headers, timeout=timeout)
                if response.status == 200:
                    first = await response.content.readany()
                    if first:
                        opened, response = response, None  # the caller's to close
                        return opened, first
                    last = Unavailable(f"{base} ended the event stream before it began")
                else:
                    payload = await response.read()
                    if response.status < 500:
                        raise _error(response.status, orjson.loads(payload) if payload else None)
                    last = (
                        _not_serving(base, payload)
                        if response.status == 503
                        else ServerError(f"{base} answered {response.status}: {payload[:200]!r}")
                    )
            except (
                TimeoutError,
                aiohttp.ClientConnectionError,
                aiohttp.ClientPayloadError,
                OSError,
            ) as e:
                last = e
            finally:
                if response is not None:
                    response.close()
            if not isinstance(last, StorageError):
                self._current += 1
        raise _NoAnswer(last)

    def _unavailable(self, last: Exception | None) -> DexError:
        if isinstance(last, StorageError):
            return last  # the node serves, but its store cannot commit now (a full disk)
        return Unavailable(
            f"no Dex Server answered at {', '.join(self.addresses)}: {last}", retryable=True
        )


class _NoAnswer(Exception):
    """No address answered in one round."""

    def __init__(self, last: Exception | None) -> None:
        super().__init__(str(last))
        self.last = last


def _broken(session_id: str, last: Exception | None) -> Unavailable:
    return Unavailable(f"the event stream of {session_id} broke: {last}", retryable=True)


def _unix(value: Time | None) -> float | None:
    if isinstance(value, datetime):
        if value.tzinfo is None:
            raise ValueError("give the datetime a timezone: a naive one names no moment")
        return value.timestamp()
    return value


def _params(**values: Any) -> dict[str, Any]:
    """Query parameters, leaving out the ones not given."""
    return {k: v for k, v in values.items() if v is not None}


def _not_serving(base: str, payload: bytes) -> DexError:
    """A 503: the node does not serve (a standby, starting), or it serves but its store
    could not commit (``storage_error``: nothing was written)."""
    try:
        decoded = orjson.loads(payload)
    except orjson.JSONDecodeError:
        decoded = None
    error = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(error, dict) and error.get("code") == "storage_error":
        details = error.get("details")
        return StorageError(
            str(error.get("message")),
            retryable=True,
            **(details if isinstance(details, dict) else {}),
        )
    return Unavailable(f"{base} is not serving: {payload[:200]!r}")


def _error(status: int, body: Any) -> DexError:
    error = body.get("error", {}) if isinstance(body, dict) else {}
    message = error.get("message", f"HTTP {status}")
    cls = _ERRORS.get(status, ServerError)
    exc = cls(message, **error.get("details", {}))
    exc.status = status
    exc.code = error.get("code", exc.code)
    return exc
