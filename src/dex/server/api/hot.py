"""The message send, served without the framework: the one request of every turn.

``POST /v1/sessions/{id}/messages`` is most of what clients ask of a node, and FastAPI's
routing, dependency solving and middleware cost more per request than the send itself
(measured with ``bench.instructions``). ``HotRoutes`` sits in front of the FastAPI app
and answers that route when the request is well formed: a JSON body that the route's
own model (``SendMessage``) accepts, and a node that serves. Anything else goes on to
the FastAPI app unchanged (its body replayed), so every refusal (a bad body, a standby,
an unknown session) is answered by the same code the OpenAPI document describes. The
route stays declared in FastAPI too, with the same parsing and rendering
(``send_message`` in ``sessions.py``): one behaviour, two ways in.
"""

from __future__ import annotations

import logging
import re

import orjson
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.types import Message, Receive, Scope, Send

from dex.errors import DexError
from dex.server.api.sessions import SendMessage, send
from dex.wire import error_body

log = logging.getLogger("dex.server.api")

MESSAGES = re.compile(r"/v1/sessions/([^/]+)/messages")
JSON = (b"content-type", b"application/json")


class HotRoutes:
    def __init__(self, app: FastAPI) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send_: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            match = MESSAGES.fullmatch(scope["path"])
            if match is not None and _is_json(scope):
                await self._send_message(scope, receive, send_, match[1])
                return
        await self.app(scope, receive, send_)

    async def _send_message(self, scope: Scope, receive: Receive, send_: Send, sid: str) -> None:
        node = self.app.state.node
        messages, body = await _read(receive)
        if body is None or node is None or not node.serving:
            await self._fallback(scope, messages, receive, send_)
            return
        try:
            message = SendMessage.model_validate_json(body)
        except ValidationError:
            await self._fallback(scope, messages, receive, send_)
            return
        try:
            result, status = await send(self.app, sid, message)
        except DexError as e:
            result, status = error_body(e.code, e.message, **e.details), e.status
        except Exception:
            log.exception(
                "request failed",
                extra={"action": "http.unhandled", "method": "POST", "path": scope["path"]},
            )
            result = error_body("internal_error", "the server failed to handle the request")
            status = 500
        payload = orjson.dumps(result, option=orjson.OPT_NON_STR_KEYS)
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


def _is_json(scope: Scope) -> bool:
    for name, value in scope["headers"]:
        if name == b"content-type":
            return bool(value == b"application/json" or value.startswith(b"application/json;"))
    return False


async def _read(receive: Receive) -> tuple[list[Message], bytes | None]:
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
