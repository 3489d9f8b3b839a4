"""The committed OpenAPI document (``sdk/openapi.json``), from which the TypeScript and Go
Clients take their types, is the one the app serves."""

from __future__ import annotations

from pathlib import Path

from dex.server.api import document

COMMITTED = Path(__file__).resolve().parents[2] / "sdk" / "openapi.json"


def test_the_committed_openapi_document_is_the_app_s() -> None:
    assert COMMITTED.read_text() == document.text(), (
        "sdk/openapi.json is stale: regenerate it with "
        "`.venv/bin/python -m dex.server.api.document sdk/openapi.json`, then the Clients' "
        "types (docs/sdk-clients.md)"
    )
