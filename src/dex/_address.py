"""Where the Dex Server is: one address or a list, from an argument or ``DEX_ADDRESS``."""

from __future__ import annotations

import os
from collections.abc import Sequence

DEFAULT_ADDRESS = "http://127.0.0.1:7450"


def addresses(address: str | Sequence[str] | None = None) -> list[str]:
    if address is None:
        address = os.environ.get("DEX_ADDRESS", DEFAULT_ADDRESS)
    parts = address.split(",") if isinstance(address, str) else list(address)
    found = [p.strip().rstrip("/") for p in parts if p.strip()]
    if not found:
        raise ValueError("no Dex Server address given")
    for a in found:
        if not a.startswith(("http://", "https://")):
            raise ValueError(f"a Dex Server address starts with http:// or https://, not {a!r}")
    return found
