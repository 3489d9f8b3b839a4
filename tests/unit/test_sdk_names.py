"""The names the reference page gives exist in every language, with the same value: a
program compares a tool call's error with the prefix that says the tool never ran, in
Python, TypeScript or Go alike."""

from __future__ import annotations

import re
from pathlib import Path

import dex

ROOT = Path(__file__).resolve().parents[2]


def constant(path: str, pattern: str) -> str:
    """The string value a source file gives a constant (``pattern``: its declaration, up to
    the opening quote)."""
    source = (ROOT / path).read_text()
    found = re.search(pattern + r'"((?:[^"\\]|\\.)*)"', source)
    assert found is not None, f"{path} declares no such constant: {pattern}"
    return found.group(1)


def test_the_tool_call_not_run_prefix_is_the_same_in_every_language() -> None:
    python = dex.TOOL_CALL_NOT_RUN_ERROR_PREFIX
    typescript = constant(
        "sdk/typescript/src/agent.ts", r"export const toolCallNotRunErrorPrefix\s*=\s*"
    )
    go = constant("sdk/go/dex/wire.go", r"const ToolCallNotRunErrorPrefix\s*=\s*")
    assert typescript == python
    assert go == python
