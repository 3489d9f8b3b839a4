"""What the node does about browsers: it refuses the requests that a page of another site
makes a browser send it, and tells browsers how to treat the console's pages.

A page on any site can make its visitor's browser send a form (POST, urlencoded or plain
text), a ``fetch`` with a simple body, or a WebSocket handshake to any address, the
node's included, with the browser's cookies and from inside the visitor's network. With
auth off nothing else tells such a request from the console's own (docs/console.md), so
``Browsers`` refuses every request that can change something (any method but ``GET``,
``HEAD`` and ``OPTIONS``, and every WebSocket handshake) that a browser says comes from
a page of another origin (another site, or another port or subdomain of this one), with
a 403 ``cross_site`` (the console's error page on a console path) before anything reads
it. The check is a strict same-origin one, as Go's
``http.CrossOriginProtection`` makes it:

1. ``Sec-Fetch-Site`` (every current browser sends it): ``same-origin``, or ``none``
   (the person typed the address), passes; ``same-site`` (another port or subdomain of
   the same host) and ``cross-site`` are refused.
2. Without it, ``Origin`` (a browser sends it with every such request of another origin),
   else ``Referer``: its host and port must be the request's ``Host``, or a host in its
   ``X-Forwarded-Host`` (set by a proxy in front, or by the node of a cluster that
   forwarded the call). A page cannot set either header on a request to another site.
   ``Origin: null`` (a sandboxed page, a page that hides its referrer) is refused.
3. A request with none of them was not sent by a browser (an SDK, ``curl``): it passes.

The scheme is not compared: behind a proxy that ends TLS, the browser's ``https://``
reaches the node as ``http://``.

The JSON API needs the check too: with auth off a cross-site form cannot approve a call
(a body that is not ``application/json`` is refused: FastAPI's strict content type, and a
JSON body makes the browser ask first, which the node never grants), but it could post to
``/admin/step-down``, which has no body, and a page could open the Worker channel and take
Steps.

On a console path every answer also carries ``HEADERS``: a Content-Security-Policy that
runs only the console's own script and style sheet (no inline script), lets no other site
frame its pages (``frame-ancestors``, and ``X-Frame-Options`` for older browsers) and
forms post nowhere else; ``Referrer-Policy: same-origin``; and ``nosniff``.
"""

from __future__ import annotations

from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dex.server import pages
from dex.server.api.errors import refuse

SAFE = frozenset({"GET", "HEAD", "OPTIONS"})
"""Methods that change nothing: any site may send them (it cannot read the answer)."""
TOLD = frozenset({b"sec-fetch-site", b"origin", b"referer"})
"""The headers by which a browser tells where a request comes from."""
PASSES = frozenset({b"same-origin", b"none"})
"""The values of ``Sec-Fetch-Site`` that pass."""
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "object-src 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
    (b"x-content-type-options", b"nosniff"),
]
"""What every answer on a console path carries."""


class Browsers:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "websocket" or (kind == "http" and scope["method"] not in SAFE):
            why = cross_site(scope)
            if why is not None:
                await refuse(scope, send_to(scope, send), 403, "cross_site", why)
                return
        await self.app(scope, receive, send_to(scope, send))


def send_to(scope: Scope, send: Send) -> Send:
    """``send``, adding ``HEADERS`` to the answer on a console path."""
    if scope["type"] != "http" or not pages.owns(scope["path"]):
        return send

    async def headed(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", ()), *HEADERS]}
        await send(message)

    return headed


def cross_site(scope: Scope) -> str | None:
    """Why a browser sent this request for a page of another site; None if it did not
    (a page of this node's own origin, an address the person typed, or no browser)."""
    said: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in TOLD:
            said.setdefault(name, value)  # a browser sends each once
    fetch_site = said.get(b"sec-fetch-site")
    if fetch_site is not None:
        if fetch_site in PASSES:
            return None
        return (
            f"a page of another origin may not send this request (Sec-Fetch-Site: "
            f"{fetch_site.decode('latin-1')}): {_advice(scope)}"
        )
    source, header = said.get(b"origin"), "Origin"
    if source is None:
        source, header = said.get(b"referer"), "Referer"
        if source is None:
            return None  # no browser sent it
    host = urlsplit(source.decode("latin-1")).netloc.lower().encode("latin-1")
    hosts = [
        host.strip().lower()
        for name, value in scope["headers"]
        if name in (b"host", b"x-forwarded-host")
        for host in value.split(b",")
    ]
    if host and host in hosts:
        return None
    return (
        f"a page of {source.decode('latin-1')!r} ({header}) may not send a request to this "
        f"server ({b', '.join(hosts).decode('latin-1') or 'no Host'}): {_advice(scope)}"
    )


def _advice(scope: Scope) -> str:
    if pages.owns(scope["path"]):
        return "open the console at this server's own address and act there"
    return "call the API from a program, or from a page this server serves"
