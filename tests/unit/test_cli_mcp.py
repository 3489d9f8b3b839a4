"""``dex mcp`` without the MCP SDK installed: a message that says what to install."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

import dex
from dex.cli.main import app


def test_dex_mcp_without_the_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in [n for n in sys.modules if n == "mcp" or n.startswith("mcp.")] or ["mcp"]:
        monkeypatch.setitem(sys.modules, name, None)  # importing it raises ImportError
    monkeypatch.delitem(sys.modules, "dex.mcp_server", raising=False)
    monkeypatch.delattr(dex, "mcp_server", raising=False)  # imported by another test

    result = CliRunner().invoke(app, ["mcp"], prog_name="dex")

    assert result.exit_code == 1
    assert "dex mcp needs the MCP SDK: pip install 'dex-runtime[mcp]'" in result.output
