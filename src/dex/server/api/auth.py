"""Bearer tokens with three roles (``client``, ``worker``, ``admin``), and rate limits on
the client API.

Auth is on when any token is configured (``--client-token``, ``--worker-token``,
``--admin-token``, or a ``--tokens-file``: see ``dex.server.api.tokens``). Then every
request carries ``Authorization: Bearer <token>``: the Worker channel needs a worker
token, the client API a client token, ``/metrics`` and ``/admin`` an admin token, and an
admin token opens everything. ``/healthz`` and ``/readyz`` stay open for probes, and so
does the API description (``/openapi.json``, ``/docs``, ``/redoc``). A missing or unknown token is a
401, a token of the wrong role a 403, each with a JSON error body. A refused WebSocket
handshake gets the same HTTP answer (401 or 403 with the JSON body) instead of the
upgrade; on a server without the ASGI denial-response extension it is closed before it
is accepted (code 4401 or 4403), which the server sends as a 403. A worker token scoped
to some agents is checked against the Worker's hello (``dex.auth.agents`` in the scope);
a client token scoped to a tenant sees only that tenant's sessions (``dex.auth.tenant`` in
the scope, which ``dex.server.api.tenancy`` enforces).

The web console (``/ui``, ``dex.server.console``) is guarded like the client API: a
client token reads and acts, an admin token opens it too; its tenants page
(``pages.ADMIN_PAGES``) needs the admin token, as the ``/admin/tenants`` routes do. A
browser cannot send the header from a link or an ``EventSource``, so on console paths the
token may come from the console's HttpOnly cookie instead (set by its log-in form, which
stays open with its static files); a console request refused gets the log-in page (HTML)
with the same status, and one over its rate limit the console's error page (429). The
cookie is honoured on console paths only: the JSON API stays bearer-only.

The check runs once per HTTP request and once per Worker connection (not per message).
"""

from __future__ import annotations

from urllib.parse import unquote_to_bytes

from fastapi import Security
from fastapi.params import Security as SecurityParam
from fastapi.security import HTTPBearer
from starlette.types import ASGIApp, Receive, Scope, Send

from dex.server import pages
from dex.server.api.errors import refuse
from dex.server.api.ratelimit import RateLimits
from dex.server.api.tokens import Role, Token, Tokens

OPEN = ("/", "/healthz", "/readyz", "/openapi.json", "/docs", "/docs/oauth2-redirect", "/redoc")
"""Open paths: the probes, the API description, and ``/`` (a redirect to the console)."""
CONSOLE_OPEN = (f"{pages.PREFIX}/login", f"{pages.PREFIX}/logout")
AGENTS_KEY = "dex.auth.agents"
"""Where a connection's agent scope is left in the ASGI scope (absent: any agent)."""
TOKEN_KEY = "dex.auth.token"
"""Where the name of the request's token is left in the ASGI scope (absent: auth off)."""
TENANT_KEY = "dex.auth.tenant"
"""Where a tenant-scoped client token's tenant is left in the ASGI scope (absent: every
session; ``dex.server.api.tenancy`` reads it)."""

__all__ = [
    "AGENTS_KEY",
    "GUARDED",
    "OPEN",
    "TENANT_KEY",
    "TOKEN_KEY",
    "Auth",
    "Role",
    "refusal",
    "role_for",
]

BEARER = HTTPBearer(
    auto_error=False,  # the Auth layer refuses, before any route runs
    scheme_name="bearer",
    description="A client, worker or admin token (when the node has auth on). "
    "`/docs` sends it once you authorize.",
)
GUARDED: list[SecurityParam] = [Security(BEARER)]
"""The dependency of every guarded route: it puts the bearer scheme in the OpenAPI
document (``/docs`` can authorize); the check itself is ``Auth``'s."""


def role_for(path: str) -> Role | None:
    """The role a path needs; None when it is open."""
    if path in OPEN or path in CONSOLE_OPEN or path.startswith(f"{pages.PREFIX}/static/"):
        return None
    if path.startswith("/v1/workers/"):
        return Role.WORKER
    if path.startswith("/v1/") or (pages.owns(path) and not pages.for_admin(path)):
        return Role.CLIENT
    return Role.ADMIN


def refusal(token: Token | None, needed: Role) -> tuple[int, str, str] | None:
    """Why ``token`` may not do what needs ``needed``: (status, code, message); None if it
    may. The one check of every request, and of the console's log-in form."""
    if token is None:
        return 401, "unauthorized", "send Authorization: Bearer <token> with a valid token"
    if token.role not in (needed, Role.ADMIN):
        return (
            403,
            "forbidden",
            f"this needs a {needed.value} token, not a {token.role.value} token",
        )
    return None


class Auth:
    """The ASGI layer in front of the node: who is asking, may they, and not too often."""

    def __init__(self, app: ASGIApp, tokens: Tokens, limits: RateLimits | None = None) -> None:
        self.app = app
        self.tokens = tokens
        self.limits = limits

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        needed = role_for(scope["path"])
        if needed is None:
            await self.app(scope, receive, send)
            return
        token: Token | None = None
        if self.tokens.enabled:
            token = self._token(scope)
            refused = refusal(token, needed)
            if refused is not None:
                await _refuse(scope, send, *refused)
                return
            assert token is not None
            scope[TOKEN_KEY] = token.name
            if token.agents is not None:
                scope[AGENTS_KEY] = token.agents
            if token.tenant is not None:
                scope[TENANT_KEY] = token.tenant
        if needed == Role.CLIENT and self.limits is not None and scope["type"] == "http":
            key = token.name if token is not None else _address(scope)
            over = self.limits.check(key, token.rate_limit if token else None)
            if over is not None:
                limit, retry_after = over
                who = f"token {token.name!r}" if token is not None else f"address {key}"
                await refuse(
                    scope,
                    send,
                    429,
                    "rate_limited",
                    f"{who} is over its rate limit of {limit}: try again in {retry_after} s",
                    headers=[(b"retry-after", str(retry_after).encode())],
                    limit=limit,
                    retry_after=retry_after,
                )
                return
        await self.app(scope, receive, send)

    def _token(self, scope: Scope) -> Token | None:
        """The request's token: its bearer header, or on a console path the console's
        cookie."""
        cookie = None
        for name, value in scope["headers"]:
            if name == b"authorization" and value[:7].lower() == b"bearer ":
                return self.tokens.match(value[7:].strip())
            if name == b"cookie":
                cookie = value
        if cookie is not None and pages.owns(scope["path"]):
            offered = _cookie(cookie, pages.COOKIE.encode())
            return self.tokens.match(offered) if offered else None
        return None


def _cookie(header: bytes, name: bytes) -> bytes | None:
    for part in header.split(b";"):
        key, _, value = part.strip().partition(b"=")
        if key == name:
            return unquote_to_bytes(value)  # the console sets it percent-encoded
    return None


def _address(scope: Scope) -> str:
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


async def _refuse(scope: Scope, send: Send, status: int, code: str, message: str) -> None:
    """No token (401), or one of another role (403): on a console path the log-in form,
    and why."""
    page = None
    if scope["type"] == "http" and pages.owns(scope["path"]):
        page = pages.refusal(status, message)  # a person's browser
    challenge = [(b"www-authenticate", b"Bearer")] if status == 401 else None
    await refuse(scope, send, status, code, message, challenge, page)
