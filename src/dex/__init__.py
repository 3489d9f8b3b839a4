"""Dex: a durable runtime for AI agents.

A crash repeats at most the one call that was running; a tool call with a side
effect is never silently run twice.
"""

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version

from dex.agent import Agent
from dex.client import Client, SyncClient
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
from dex.worker import Worker, WorkerConfig

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
    "timer_tool",
    "tool",
]
