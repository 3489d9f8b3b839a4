"""OpenAI: ``POST /v1/chat/completions`` and ``POST /v1/responses`` on one server, with
OpenAI's key check and error bodies."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from dex.testing.fake_providers._chat import ChatCompletions
from dex.testing.fake_providers._responses import Responses
from dex.testing.fake_providers._server import FakeProvider

_ERRORS = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
}


class FakeOpenAI(FakeProvider):
    """``POST /v1/chat/completions`` and ``POST /v1/responses``; the SDK's ``base_url`` is
    ``server.base_url`` (which ends in ``/v1``)."""

    endpoints = (ChatCompletions(), Responses())

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def admit(self, request: web.Request) -> web.Response | None:
        if self.api_key is not None and (
            request.headers.get("authorization") != f"Bearer {self.api_key}"
        ):
            return self.error(401, "Incorrect API key provided")
        return None

    def error_body(self, status: int, message: str, error_type: str | None) -> dict[str, Any]:
        kind, code = _ERRORS.get(status, ("server_error", None))
        if error_type is not None:
            kind = code = error_type
        return {"error": {"message": message, "type": kind, "param": None, "code": code}}

    def response_headers(self) -> dict[str, str]:
        return {"x-request-id": self.new_id("req")}
