"""Every error leaves the server as JSON: ``{"error": {"code", "message", "details"?}}``;
on a console path (``/ui``) as the console's error page, with the same status: the
routes' errors (``install``), and the refusals of the layers in front of the routes
(``refuse``: auth and rate limits, requests from other sites, forwarding, the body limit),
and a request that failed (``CatchAll``)."""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.middleware.body_limit import MAX_BODY_SIZE_SCOPE_KEY, RequestBodyLimitMiddleware
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dex.errors import DexError
from dex.server import pages
from dex.server.api.responses import ORJSONResponse
from dex.wire import error_body

log = logging.getLogger("dex.server.api")


def install(app: FastAPI) -> None:
    @app.exception_handler(DexError)
    async def dex_error(request: Request, exc: DexError) -> Response:
        body = error_body(exc.code, exc.message, **exc.details)
        return _answer(request, body, exc.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        problems = [
            {"where": ".".join(str(p) for p in e["loc"]), "problem": e["msg"]} for e in exc.errors()
        ]
        body = error_body("invalid_request", "the request is not valid", problems=problems)
        return _answer(request, body, 422)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        if exc.status_code == 413:  # RequestBodyLimitMiddleware, counting a streamed body
            limit = request.scope.get(MAX_BODY_SIZE_SCOPE_KEY)
            return _answer(request, error_body(*_too_large_error(limit)), 413)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
        return _answer(request, error_body(code, str(exc.detail)), exc.status_code)

    app.add_middleware(CatchAll)


def _answer(request: Request, body: dict[str, Any], status: int) -> Response:
    """The error as JSON; on a console path, as the console's page for a person."""
    if not pages.owns(request.url.path):
        return ORJSONResponse(body, status)
    error = body["error"]
    message = error["message"]
    for problem in error.get("details", {}).get("problems", []):
        message += f"; {problem['where']}: {problem['problem']}"
    return pages.error_page(request, status, error["code"], message)


class CatchAll:
    """An exception no handler knows still answers: a 500 ``internal_error`` that names no
    internals (JSON, or on a console path a page), with the traceback in the log."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception:
            log.exception(
                "request failed",
                extra={
                    "action": "http.unhandled",
                    "method": scope["method"],
                    "path": scope["path"],
                },
            )
            if started:
                raise  # part of the answer is out: the server ends the connection
            await refuse(
                scope, send, 500, "internal_error", "the server failed to handle the request"
            )


class BodyLimit:
    """Refuse request bodies over ``limit`` bytes with 413, declared or streamed.

    A declared ``Content-Length`` is checked here, before anything runs (the HTTP server
    then holds the body to that length). A body without one (chunked) is counted as the
    route reads it by Starlette's ``RequestBodyLimitMiddleware``, whose 413 the
    ``HTTPException`` handler answers as JSON. See docs/dependencies.md."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit
        self._streamed = RequestBodyLimitMiddleware(app, limit)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope["headers"]:
            if name == b"content-length":
                # past 18 digits it is over any limit, and int() may refuse it (5,000 digits)
                if value.isdigit() and (len(value) > 18 or int(value) > self.limit):
                    await refuse(scope, send, 413, *_too_large_error(self.limit))
                    return
                await self.app(scope, receive, send)
                return
        await self._streamed(scope, receive, send)


def _too_large_error(limit: Any) -> tuple[str, str]:
    return "body_too_large", f"the request body is over {limit} bytes"


async def refuse(
    scope: Scope,
    send: Send,
    status: int,
    code: str,
    message: str,
    headers: list[tuple[bytes, bytes]] | None = None,
    page: bytes | None = None,
    **details: object,
) -> None:
    """Answer a request before it reaches a route: a JSON error, or on a console path a
    page (the console's error page, or ``page``), with ``status``. A WebSocket is refused
    before its upgrade, with the same answer where the server can send one."""
    if page is None and pages.owns(scope["path"]) and scope["type"] == "http":
        page = bytes(pages.error_page(None, status, code, message).body)
    if page is not None:
        body, content_type = page, b"text/html; charset=utf-8"
    else:
        body, content_type = orjson.dumps(error_body(code, message, **details)), b"application/json"
    all_headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        *(headers or []),
    ]
    kind = "http"
    if scope["type"] == "websocket":
        if "websocket.http.response" not in scope.get("extensions", {}):
            # a server that cannot send a handshake answer of our choosing answers 403
            await send({"type": "websocket.close", "code": 4000 + status, "reason": message})
            return
        kind = "websocket.http"  # the handshake's own HTTP answer, before any upgrade
    await send({"type": f"{kind}.response.start", "status": status, "headers": all_headers})
    await send({"type": f"{kind}.response.body", "body": body})
