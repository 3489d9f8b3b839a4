"""The public names of ``dex`` are chosen on purpose: adding or removing one is a decision,
so this list changes with it."""

from __future__ import annotations

import dex


def test_the_public_names_are_exactly_these() -> None:
    assert sorted(dex.__all__) == sorted(
        [
            "PENDING",
            "TOOL_CALL_NOT_RUN_ERROR_PREFIX",
            "Agent",
            "AuthError",
            "Checked",
            "Client",
            "Conflict",
            "DexError",
            "InvalidInput",
            "NotFound",
            "RetryPolicy",
            "ServerError",
            "StorageError",
            "SyncClient",
            "Tool",
            "ToolContext",
            "ToolError",
            "ToolKind",
            "Unavailable",
            "Worker",
            "WorkerConfig",
            "mcp_tools",
            "timer_tool",
            "tool",
        ]
    )
    for name in dex.__all__:
        assert getattr(dex, name) is not None, name


def test_the_not_run_prefix_is_the_documented_text() -> None:
    assert dex.TOOL_CALL_NOT_RUN_ERROR_PREFIX == (
        "the tool did not run, so it is safe to call again"
    )
