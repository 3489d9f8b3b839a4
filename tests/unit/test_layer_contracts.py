"""The layer contracts (pyproject.toml's ``[tool.importlinter]``, checked by ``lint-imports``
in scripts/test) name the domain's modules one by one: a module of ``dex.server`` that no
contract names would be free to import the layers above it. Every module of the server
below the API and the console is in both lists that name them."""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path
from typing import Any

import dex.server

ROOT = Path(__file__).parents[2]
ABOVE = {"dex.server.api", "dex.server.console", "dex.server.app"}
"""The layers above the domain: the HTTP routes, the console, and the app that wires them."""


def _contract(contracts: list[dict[str, Any]], name: str) -> dict[str, Any]:
    (found,) = [c for c in contracts if c["name"].startswith(name)]
    return found


def test_every_server_module_below_the_api_is_named_by_the_layer_contracts() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts = config["tool"]["importlinter"]["contracts"]
    below = {
        f"dex.server.{m.name}"
        for m in pkgutil.iter_modules(dex.server.__path__)
        if f"dex.server.{m.name}" not in ABOVE
    }
    sources = set(_contract(contracts, "Nothing below the API")["source_modules"])
    assert below - sources == set(), "add these to 'Nothing below the API ...'"
    store_forbidden = set(_contract(contracts, "The store imports nothing")["forbidden_modules"])
    assert below - store_forbidden - {"dex.server.store"} == set(), (
        "add these to 'The store imports nothing above it'"
    )
