"""The JSON responses routes render with: orjson for plain data, msgspec for an answer
that carries engine records (a turn's Steps and tool calls, msgspec structs), which it
encodes as they are, without first copying them into plain dicts.

FastAPI deprecated its own ``ORJSONResponse``; this is the same few lines, ours.
"""

from __future__ import annotations

from typing import Any

import msgspec
import orjson
from starlette.responses import JSONResponse


class ORJSONResponse(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)


encode = msgspec.json.Encoder().encode
"""JSON of plain data and engine records alike (msgspec)."""


class RecordsResponse(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return encode(content)
