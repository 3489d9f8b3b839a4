"""The standby gate: only a serving node (active, or draining) answers the client API.

A standby, a node still recovering and one that stepped down answer every ``/v1`` request
with 503, a JSON error naming their role, and an ``x-dex-role`` header, so a client or a
load balancer moves on to the node that serves; a Worker connection is closed with 4503.
Probes (``/healthz``, ``/readyz``, ``/metrics``) and the API description stay open.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from dex.server.ha.node import Node
from dex.wire import error_body
from dex.wire.protocol import CLOSE_NOT_READY


class StandbyGate:
    """A pure ASGI middleware inside the FastAPI app (which puts itself in ``scope``)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket") and scope["path"].startswith("/v1/"):
            node: Node | None = scope["app"].state.node
            role = node.role if node is not None else "starting"
            if node is None or not node.serving:
                await _refuse(scope, receive, send, role)
                return
        await self.app(scope, receive, send)


async def _refuse(scope: Scope, receive: Receive, send: Send, role: str) -> None:
    if scope["type"] == "websocket":
        # Accept, then close with 4503: a close before the accept reaches the Worker as an
        # HTTP 403, which it takes for a refused token (and exits).
        await receive()  # websocket.connect
        await send({"type": "websocket.accept"})
        await send({"type": "websocket.close", "code": CLOSE_NOT_READY, "reason": role})
        return
    body = orjson.dumps(
        error_body("unavailable", f"this node does not serve now (it is {role}): try another")
    )
    await send(
        {
            "type": "http.response.start",
            "status": 503,
            "headers": [
                (b"content-type", b"application/json"),
                (b"x-dex-role", role.encode()),
                (b"retry-after", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
