"""Forwarding: in a cluster any node answers any call, and a call about a session owned by
another node is proxied to that node.

``Forward`` is the node's outermost layer. On a node alone (``node.cluster`` is None) it
checks that one attribute and passes everything on. In a cluster it looks at the HTTP
requests that name a session (``/v1/sessions/{id}`` and everything under it, its event
stream and long polls included, and the console's pages of one session,
``/ui/sessions/{id}...``) and asks the cluster who serves that session
(``Cluster.route``): this node, or another whose address it gives. A call for another
node goes there as it came (method, path, query, headers with ``Authorization`` and the
console's cookie, body), with ``x-dex-forwarded-by: <this node's id>`` added, and its
answer comes back as it is produced: an event stream flows event by event. The owner
checks the token, the rate limit and the body limit, once; a forwarded call is never
forwarded again (it carries the header): if the node it reached does not serve the session
either, the partition is moving, and the answer is a 503 ``unavailable`` with
``Retry-After: 1``, as when no live node owns the partition or the owner cannot be reached
(it may just have died: another node takes its partitions over within seconds).

``POST /v1/sessions`` names its session in the body (``session_id``): it is routed by that
id; without one, a node that owns partitions creates the session here (it picks an id in
its own partitions), and one that owns none forwards the call to a node that does.

The Worker channel (a WebSocket) is never forwarded: Workers connect to every node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import TYPE_CHECKING, Any

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from yarl import URL

from dex.errors import Unavailable
from dex.server.api.browsers import send_to
from dex.server.api.errors import refuse
from dex.server.api.hot import read_request
from dex.server.api.peers import FORWARDED_BY, Cluster, Peers
from dex.server.pages import PREFIX as CONSOLE

if TYPE_CHECKING:
    import aiohttp  # loaded only on a node of a cluster (``Peers.http``)

log = logging.getLogger("dex.server.api")

ROUTED = ("/v1/sessions/", f"{CONSOLE}/sessions/")
"""The path prefixes whose next segment is a session id."""
CREATE = "/v1/sessions"
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
    }
)
"""Headers of one connection, not of the call: never passed on (either way)."""
FORWARDED_HOST = "x-forwarded-host"
"""The Host the caller asked for, added to a forwarded call unless a proxy in front added
it already."""
ANSWERED_HERE = HOP_BY_HOP | {b"date", b"server"}
"""Headers of the owner's answer that the server sending it on writes itself."""


class Forward:
    def __init__(self, app: ASGIApp, fastapi_app: FastAPI, max_body_bytes: int) -> None:
        self.app = app
        self.state = fastapi_app.state
        self.max_body_bytes = max_body_bytes
        self._turn = itertools.count()  # spreads creations over the owning nodes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # one attribute on a node alone: ``cluster_of`` inlined, the state read by key
        node = self.state["node"]
        cluster: Cluster | None = None if node is None else node.cluster
        if cluster is None or scope["type"] != "http" or not node.serving:
            # a standby (or a node starting or stopping) forwards nothing: the gate
            # refuses the call with its role, and the client moves on
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        here = receive  # what the call is served with here
        body: bytes | None = None
        if path == CREATE and scope["method"] == "POST":
            # a creation names its session in its body, or leaves the id to the node
            messages, body = await _read(receive, _declared_length(scope), self.max_body_bytes)
            session_id = _session_id_in(body) if body is not None else None
            here = _replay(messages, receive)
        else:
            session_id = _session_of(path)
            if session_id is None:
                await self.app(scope, receive, send)
                return
        try:
            if session_id is not None:
                owner = cluster.route(session_id)
            elif body is None or cluster.owns_any():
                owner = None  # a creation too large, streamed, or ours to name: served here
            else:
                owner = self._any_owner(cluster)
        except Unavailable as e:
            await _unavailable(scope, send, e.message)
            return
        if owner is None:
            await self.app(scope, here, send)
        else:
            await self._forward(cluster, owner, scope, receive, send, session_id, body)

    def _any_owner(self, cluster: Cluster) -> str:
        owners = sorted(
            (m.address for m in cluster.members() if m.partitions and not m.here),
        )
        if not owners:
            raise Unavailable("no node owns a partition now: try again", retryable=True)
        return owners[next(self._turn) % len(owners)]

    async def _forward(
        self,
        cluster: Cluster,
        owner: str,
        scope: Scope,
        receive: Receive,
        send: Send,
        session_id: str | None,
        body: bytes | None = None,
    ) -> None:
        """The call, sent to ``owner``; ``body``: the request's body if it was read
        already (a creation's)."""
        headers = [
            (name.decode("latin-1"), value.decode("latin-1"))
            for name, value in scope["headers"]
            if name not in HOP_BY_HOP
        ]
        if any(name == FORWARDED_BY for name, _ in headers):
            # it came from another node that thought this one served the session: the
            # partition is moving, and a second hop could go round in circles
            await _unavailable(
                scope,
                send,
                f"the partition of session {session_id} is moving between nodes: try again",
            )
            return
        headers.append((FORWARDED_BY, cluster.node_id))
        if not any(name == FORWARDED_HOST for name, _ in headers):
            # the address the caller asked for, which the owner's ``Browsers`` compares
            # with the Origin of a browser's request (its Host is the owner's own)
            headers += [
                (FORWARDED_HOST, v.decode("latin-1")) for n, v in scope["headers"] if n == b"host"
            ]
        target = scope.get("raw_path") or scope["path"].encode()
        if scope["query_string"]:
            target += b"?" + scope["query_string"]
        url = URL(owner + target.decode("latin-1"), encoded=True)  # sent on as it came
        peers: Peers = self.state["peers"]
        call = _Call(scope, receive, send, body)
        try:
            await call.run(peers.http, owner, url, headers)
        except _Unreachable as e:
            log.warning(
                "could not forward %s %s to %s: %r",
                scope["method"],
                scope["path"],
                owner,
                e.__cause__,
                extra={"action": "http.forward_failed", "session_id": session_id, "to": owner},
            )
            what = f"session {session_id}" if session_id else "new sessions"
            await _unavailable(
                scope, send, f"the node that serves {what} did not answer: try again"
            )


class _Unreachable(Exception):
    """The owner could not be reached, before any of its answer came back."""


class _Call:
    """One forwarded call: the request's body sent on as it comes (or as it was read
    already), the answer streamed back as it comes, and both ended when the client goes
    away."""

    def __init__(self, scope: Scope, receive: Receive, send: Send, body: bytes | None) -> None:
        self.scope = scope
        self.receive = receive
        self.send = send
        self.body = body
        self.gone = asyncio.Event()  # the client disconnected
        self._listener: asyncio.Future[None] | None = None

    async def run(
        self, http: aiohttp.ClientSession, owner: str, url: URL, headers: list[tuple[str, str]]
    ) -> None:
        pump = asyncio.ensure_future(self._pump(http, owner, url, headers))
        gone = asyncio.ensure_future(self.gone.wait())
        try:
            await asyncio.wait({pump, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, gone, self._listener):
                if task is not None and not task.done():
                    task.cancel()  # the client went away: stop reading the owner's answer
            await asyncio.gather(pump, gone, return_exceptions=True)
            if self._listener is not None:
                await asyncio.gather(self._listener, return_exceptions=True)
        if not pump.cancelled():
            pump.result()  # _Unreachable, or a failure of this node's own

    def _listen(self) -> None:
        """Once the body is in, only the client's going away is left to hear."""

        async def until_disconnect() -> None:
            while (await self.receive())["type"] != "http.disconnect":
                pass
            self.gone.set()

        self._listener = asyncio.ensure_future(until_disconnect())

    async def _streamed(self) -> Any:
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                self.gone.set()
                return
            chunk = message.get("body", b"")
            if chunk:
                yield chunk
            if not message.get("more_body", False):
                break
        self._listen()

    async def _data(self) -> Any:
        """What to send on: the body read already, a body as it comes, or none."""
        if self.body is not None:
            self._listen()
            return self.body
        if _has_body(self.scope):
            return self._streamed()
        message = await self.receive()  # the one empty http.request
        if message["type"] == "http.disconnect":
            self.gone.set()
        else:
            self._listen()
        return None

    async def _pump(
        self, http: aiohttp.ClientSession, owner: str, url: URL, headers: list[tuple[str, str]]
    ) -> None:
        import aiohttp

        data = await self._data()
        try:
            response = await http.request(
                self.scope["method"], url, headers=headers, data=data, allow_redirects=False
            )
        except (aiohttp.ClientConnectionError, TimeoutError) as e:
            raise _Unreachable() from e
        async with response:
            await self.send(
                {
                    "type": "http.response.start",
                    "status": response.status,
                    "headers": [
                        (name, value)
                        for name, value in response.raw_headers
                        if name.lower() not in ANSWERED_HERE
                    ],
                }
            )
            try:
                async for chunk in response.content.iter_any():
                    more = {"type": "http.response.body", "body": chunk, "more_body": True}
                    await self.send(more)
            except aiohttp.ClientError as e:
                # the owner went away mid-answer: leave the answer unfinished, so that the
                # client sees a cut (an event stream resumes with Last-Event-ID)
                log.warning(
                    "the forwarded answer from %s was cut: %r",
                    owner,
                    e,
                    extra={"action": "http.forward_cut", "to": owner},
                )
                return
            await self.send({"type": "http.response.body", "body": b""})


def _has_body(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


def _session_of(path: str) -> str | None:
    """The session a path names, if any."""
    for prefix in ROUTED:
        if path.startswith(prefix):
            session_id = path[len(prefix) :].partition("/")[0]
            return session_id or None
    return None


def _session_id_in(body: bytes) -> str | None:
    """The ``session_id`` a creation's body names (None when it names none, or is not the
    JSON object the route reads: then this node answers it, as it would alone)."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    session_id = parsed.get("session_id") if isinstance(parsed, dict) else None
    return session_id if isinstance(session_id, str) and session_id else None


def _declared_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _read(
    receive: Receive, declared: int | None, limit: int
) -> tuple[list[Message], bytes | None]:
    """The request's messages as received, and its body; None (and nothing read) for a
    body of no declared length or over the limit: the node's own layers refuse those."""
    if declared is None or declared > limit:
        return [], None
    return await read_request(receive)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay


async def _unavailable(scope: Scope, send: Send, message: str) -> None:
    """A 503: JSON, or on a console path a page, with the console's headers (the call
    never reaches this node's ``Browsers``)."""
    await refuse(scope, send_to(scope, send), 503, "unavailable", message, [(b"retry-after", b"1")])
