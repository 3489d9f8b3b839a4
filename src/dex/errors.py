"""Dex's exceptions.

    DexError
    ├── ToolError            a tool ran and failed with a known outcome (no retry)
    ├── NotFound             an unknown session, agent, tool, turn or attempt (HTTP 404)
    ├── Conflict             a state change that the current state refuses (HTTP 409)
    ├── InvalidInput         input that is well-formed JSON but makes no sense (HTTP 422)
    ├── AuthError            no valid token (HTTP 401), or one of the wrong role (HTTP 403)
    ├── StorageError         the store could not commit; nothing was acknowledged
    │   ├── CommitUnknown    the connection died during COMMIT: it may or may not have committed
    │   └── Fenced           another node holds the lease now: this node's write was refused
    ├── CorruptRecord        a stored record cannot be read: its session fails, others serve
    └── ServerError          the server answered with an error the client cannot map
        └── Unavailable      no node answered, or the node is a standby

Retryability is a field (``retryable``), not a class.
"""

from __future__ import annotations

from typing import Any


class DexError(Exception):
    code = "dex_error"
    status = 500

    def __init__(self, message: str, *, retryable: bool = False, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.details = details


class ToolError(DexError):
    """Raise from a tool when it ran and failed with a known outcome.

    The call records ``failed`` at once and the model sees the message. Any other
    exception is a failed *attempt* and may be retried.
    """

    code = "tool_error"


class NotFound(DexError):
    code = "not_found"
    status = 404


class Conflict(DexError):
    code = "conflict"
    status = 409


class InvalidInput(DexError):
    code = "invalid_input"
    status = 422


class AuthError(DexError):
    code = "unauthorized"
    status = 401


class StorageError(DexError):
    code = "storage_error"
    status = 503


class CommitUnknown(StorageError):
    """The connection was lost while a commit was in flight: it may have committed. The node
    must step down (its memory may disagree with storage), never assume nothing was written."""

    code = "commit_unknown"


class Fenced(StorageError):
    """The store's lease epoch is no longer the current one: another node took over. Nothing
    of the refused batch was written; the node must step down."""

    code = "fenced"


class CorruptRecord(DexError):
    """A stored record (a session's state or history, a turn, an agent) that cannot be read:
    damaged on disk, or written by hand. The session it belongs to answers this error (a
    500 naming it, logged); every other session keeps serving, and a node starts anyway."""

    code = "corrupt_record"
    status = 500


class ServerError(DexError):
    code = "server_error"


class Unavailable(ServerError):
    code = "unavailable"
    status = 503
