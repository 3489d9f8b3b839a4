"""Writes the HTTP API's OpenAPI document, ``sdk/openapi.json``, from the app itself: the
TypeScript and Go Clients take their types from it.

    python -m dex.server.api.document sdk/openapi.json

``tests/unit/test_openapi_document.py`` fails when the committed document is stale.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def document() -> dict[str, Any]:
    """The OpenAPI document the app serves at ``/openapi.json`` (building the app opens no
    storage: that happens when it starts)."""
    from dex.server.app import create_app
    from dex.server.config import ServerConfig

    with tempfile.TemporaryDirectory() as data:
        app = create_app(ServerConfig(data_dir=Path(data)))
        return app.openapi()


def text() -> str:
    return json.dumps(document(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m dex.server.api.document sdk/openapi.json", file=sys.stderr)
        return 2
    Path(argv[0]).write_text(text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
