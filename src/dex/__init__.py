"""Dex: a durable runtime for AI agents.

A crash repeats at most the one call that was running; a tool call with a side
effect is never silently run twice.
"""

from importlib import import_module as _import_module
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

from dex.agent import Agent
from dex.errors import (
    AuthError,
    Conflict,
    DexError,
    InvalidInput,
    NotFound,
    ServerError,
    StorageError,
    ToolError,
    Unavailable,
)
from dex.tools import PENDING, Checked, Tool, ToolContext, timer_tool, tool
from dex.wire import TOOL_CALL_NOT_RUN_ERROR_PREFIX, RetryPolicy, ToolKind

if TYPE_CHECKING:
    from dex.client import Client, SyncClient
    from dex.mcp import mcp_tools
    from dex.worker import Worker, WorkerConfig
else:
    _LAZY = {
        "mcp_tools": "dex.mcp",  # needs dex-runtime[mcp]
        "Client": "dex.client",
        "SyncClient": "dex.client",
        "Worker": "dex.worker",
        "WorkerConfig": "dex.worker",
    }

    def __getattr__(name: str) -> Any:
        """The client and the Worker runtime (aiohttp and theirs) load on first use, so a
        process that needs neither (``dex server``) starts without them."""
        if name not in _LAZY:
            raise AttributeError(f"module 'dex' has no attribute {name!r}")
        value = getattr(_import_module(_LAZY[name]), name)
        globals()[name] = value
        return value


try:
    __version__ = _version("dex-runtime")
except PackageNotFoundError:  # run from a source tree that was not installed
    __version__ = "0+unknown"

__all__ = [
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
