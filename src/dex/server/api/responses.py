"""The JSON response every route renders with (orjson).

FastAPI deprecated its own ``ORJSONResponse``; this is the same few lines, ours.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.responses import JSONResponse


class ORJSONResponse(JSONResponse):
    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return orjson.dumps(content, option=orjson.OPT_NON_STR_KEYS)
