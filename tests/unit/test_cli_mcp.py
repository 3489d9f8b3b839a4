"""``dex mcp`` without the MCP SDK installed: a message that says what to install."""

from __future__ import annotations

import sys

import pytest
from typer.testing import CliRunner

from dex.cli.main import app


def test_dex_mcp_without_the_sdk_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mcp", None)  # import mcp raises ImportError
    monkeypatch.delitem(sys.modules, "dex.mcp_server", raising=False)

    result = CliRunner().invoke(app, ["mcp"], prog_name="dex")

    assert result.exit_code == 1
    assert "dex mcp needs the MCP SDK: pip install 'dex-runtime[mcp]'" in result.output
