"""Plain ASGI routes for the hottest client calls, in front of the FastAPI app.

``POST /v1/sessions`` is served here when its request is well formed: the body is
validated by the route's own model and the domain call is the same, but none of the
framework's per-request layers run (they were about two thirds of the server's CPU per
creation). Anything else, a request this route does not take as it comes (a node that
does not serve, another content type, a body that does not validate), goes on to the
FastAPI app unchanged, which answers it as it always did: its 503, its 422 with every
problem named. FastAPI still declares the route, so the OpenAPI document is unchanged.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from dex.errors import DexError
from dex.server.api.sessions import CreateSession
from dex.wire import error_body

log = logging.getLogger("dex.server.api")

JSON = b"application/json"


class PlainRoutes:
    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == "/v1/sessions"
            and scope["method"] == "POST"
        ):
            await self._create_session(scope, receive, send)
        else:
            await self.app(scope, receive, send)

    async def _create_session(self, scope: Scope, receive: Receive, send: Send) -> None:
        messages, body = await _read_body(receive)
        node = self.app.state.node
        request: CreateSession | None = None
        if node is not None and node.serving and _is_json(scope):
            try:
                request = CreateSession.model_validate_json(body)
            except ValidationError:
                pass  # FastAPI names every problem
        if request is None:
            await self.app(scope, _replay(messages, receive), send)
            return
        try:
            state = await self.app.state.sessions.create(request.agent, request.session_id)
        except DexError as e:
            await _respond(send, e.status, error_body(e.code, e.message, **e.details))
            return
        except Exception:
            log.exception(
                "request failed",
                extra={"action": "http.unhandled", "method": "POST", "path": scope["path"]},
            )
            failed = error_body("internal_error", "the server failed to handle the request")
            await _respond(send, 500, failed)
            return
        created = {
            "id": state.id,
            "agent": state.agent,
            "status": state.status.value,
            "created_at": state.created_at,
        }
        await _respond(send, 201, created)


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value.split(b";", 1)[0].strip().lower() == JSON)
    return False


async def _read_body(receive: Receive) -> tuple[list[Message], bytes]:
    """The request's messages as received (to replay them) and its whole body. The body's
    size was bounded already (``BodyLimit``, in front of this)."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return messages, b"".join(chunks)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    async def replay() -> Message:
        return messages.pop(0) if messages else await receive()

    return replay


async def _respond(send: Send, status: int, content: Any) -> None:
    body = orjson.dumps(content)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", JSON),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
