"""The message send, the session creation and the Worker channel, served without the
framework.

``POST /v1/sessions/{id}/messages`` is the one request of every turn and
``POST /v1/sessions`` the one of every conversation, and FastAPI's routing, dependency
solving and middleware cost more per request than either call itself (measured with
``bench.instructions``; for a creation, about two thirds of the server's CPU,
``bench.scale``). ``HotRoutes`` sits in front of the FastAPI app and answers those
routes when the request is well formed: a JSON body that the route's own model
(``SendMessage``, ``CreateSession``) accepts, and a node that serves. Anything else goes
on to the FastAPI app unchanged (its body replayed), so every refusal (a bad body, a
standby, an unknown session, a body of no declared length) is answered by the same code
the OpenAPI document describes. The routes stay declared in FastAPI too, with the same
parsing and rendering (``send`` and ``create`` in ``sessions.py``): one behaviour, two
ways in. A request of a tenant-scoped token goes to the FastAPI routes too: their
dependency is the one place that keeps it to its tenant (``tenancy``). The Worker
channel's upgrade goes straight to its raw endpoint (``workers.serve``) on a serving
node; on any other the app's gate refuses it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import FastAPI
from pydantic import BaseModel, ValidationError
from starlette.types import Message, Receive, Scope, Send

from dex.errors import DexError
from dex.server.api import workers
from dex.server.api.auth import TENANT_KEY
from dex.server.api.responses import encode
from dex.server.api.sessions import CreateSession, SendMessage, create, send
from dex.wire import error_body

log = logging.getLogger("dex.server.api")

MESSAGES = re.compile(r"/v1/sessions/([^/]+)/messages")
JSON = (b"content-type", b"application/json")
M = TypeVar("M", bound=BaseModel)


class HotRoutes:
    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send_: Send) -> None:
        if scope["type"] == "websocket" and scope["path"] == workers.PATH:
            node = self.app.state["node"]
            if node is not None and node.serving:  # else the app's gate refuses it
                await workers.serve(self.app, scope, receive, send_)
                return
        elif (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and TENANT_KEY not in scope  # a tenant's request: the routes' own check
            and _plain_json(scope)
        ):
            path: str = scope["path"]
            if path == "/v1/sessions":
                await self._serve(
                    scope,
                    receive,
                    send_,
                    CreateSession,
                    lambda body: create(self.app, body, body.tenant),
                )
                return
            match = MESSAGES.fullmatch(path)
            if match is not None:
                sid = match[1]
                await self._serve(
                    scope, receive, send_, SendMessage, lambda body: send(self.app, sid, body)
                )
                return
        await self.app(scope, receive, send_)

    async def _serve(
        self,
        scope: Scope,
        receive: Receive,
        send_: Send,
        model: type[M],
        call: Callable[[M], Awaitable[tuple[dict[str, Any], int]]],
    ) -> None:
        node = self.app.state["node"]  # by key: by attribute, State raises and catches first
        messages, body = await read_request(receive)
        if body is None or node is None or not node.serving:
            await self._fallback(scope, messages, receive, send_)
            return
        try:
            request = model.model_validate_json(body)
        except ValidationError:
            await self._fallback(scope, messages, receive, send_)
            return
        try:
            result, status = await call(request)
        except DexError as e:
            result, status = error_body(e.code, e.message, **e.details), e.status
        except Exception:
            log.exception(
                "request failed",
                extra={"action": "http.unhandled", "method": "POST", "path": scope["path"]},
            )
            result = error_body("internal_error", "the server failed to handle the request")
            status = 500
        payload = encode(result)  # msgspec: the answer may carry a turn's records
        await send_(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [JSON, (b"content-length", str(len(payload)).encode())],
            }
        )
        await send_({"type": "http.response.body", "body": payload})

    async def _fallback(
        self, scope: Scope, messages: list[Message], receive: Receive, send_: Send
    ) -> None:
        """The FastAPI app answers, reading the body this has read already."""

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send_)


def _plain_json(scope: Scope) -> bool:
    """A JSON body of a declared length (a streamed one is the body limit's to count)."""
    json = sized = False
    for name, value in scope["headers"]:
        if name == b"content-type":
            json = value == b"application/json" or value.startswith(b"application/json;")
        elif name == b"content-length":
            sized = True
    return json and sized


async def read_request(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's messages as received, and its body (None if it did not all come)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return messages, b"".join(chunks)
