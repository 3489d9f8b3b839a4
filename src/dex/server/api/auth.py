"""Bearer tokens with three roles: ``client``, ``worker`` and ``admin``.

Auth is on when any token is configured. Then every request carries
``Authorization: Bearer <token>``: the Worker channel needs a worker token, the
client API a client token, ``/metrics`` an admin token, and an admin token opens
everything. ``/healthz`` and ``/readyz`` stay open for probes, and so does the API
description (``/openapi.json``, ``/docs``). A missing or unknown token is a 401, a
token of the wrong role a 403, each with a JSON error body. A refused WebSocket
handshake gets the same HTTP answer (401 or 403 with the JSON body) instead of the
upgrade; on a server without the ASGI denial-response extension it is closed before it
is accepted (code 4401 or 4403), which the server sends as a 403.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from enum import StrEnum

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from dex.wire import error_body

OPEN = ("/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect")


class Role(StrEnum):
    CLIENT = "client"
    WORKER = "worker"
    ADMIN = "admin"


def role_for(path: str) -> Role | None:
    """The role a path needs; None when it is open."""
    if path in OPEN:
        return None
    if path.startswith("/v1/workers/"):
        return Role.WORKER
    if path.startswith("/v1/"):
        return Role.CLIENT
    return Role.ADMIN


class Auth:
    def __init__(self, app: ASGIApp, tokens: Mapping[Role, str]) -> None:
        self.app = app
        self.tokens = {role: token.encode() for role, token in tokens.items() if token}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or not self.tokens:
            await self.app(scope, receive, send)
            return
        needed = role_for(scope["path"])
        if needed is None:
            await self.app(scope, receive, send)
            return
        held = self._role(scope)
        if held is None:
            await _refuse(
                scope,
                send,
                401,
                "unauthorized",
                "send Authorization: Bearer <token> with a valid token",
            )
        elif held not in (needed, Role.ADMIN):
            await _refuse(
                scope,
                send,
                403,
                "forbidden",
                f"this needs a {needed.value} token, not a {held.value} token",
            )
        else:
            await self.app(scope, receive, send)

    def _role(self, scope: Scope) -> Role | None:
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                offered = value[7:].strip()
                for role, token in self.tokens.items():
                    if hmac.compare_digest(offered, token):
                        return role
        return None


async def _refuse(scope: Scope, send: Send, status: int, code: str, message: str) -> None:
    body = orjson.dumps(error_body(code, message))
    headers = [(b"content-type", b"application/json")]
    if status == 401:
        headers.append((b"www-authenticate", b"Bearer"))
    kind = "http"
    if scope["type"] == "websocket":
        if "websocket.http.response" not in scope.get("extensions", {}):
            # a server that cannot send a handshake answer of our choosing answers 403
            await send({"type": "websocket.close", "code": 4000 + status, "reason": message})
            return
        kind = "websocket.http"  # the handshake's own HTTP answer, before any upgrade
    await send({"type": f"{kind}.response.start", "status": status, "headers": headers})
    await send({"type": f"{kind}.response.body", "body": body})
