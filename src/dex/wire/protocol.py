"""The Worker protocol: its rules, version, limits and close codes.

A Worker holds one WebSocket to the active node (``/v1/workers/connect``). Each
WebSocket message (a *frame*) is a JSON list of messages, so both sides batch what
is ready into one send. Each message is an object whose ``t`` names its type.

The frames are msgspec structs, one definition each, that both sides write and read:
``dex.wire.worker_frames`` (what a Worker sends) and ``dex.wire.server_frames`` (what
the server sends). The server decodes every frame a Worker sends with them and closes
the connection with code 4400 (and the problem as its reason) on the first frame that
does not fit; the Worker decodes what the server sends with them. Both send their
frames through ``dex.wire.outbox``. ``docs/worker-protocol.md`` is generated from the
structs; an SDK in another language is written from that page.

Ownership. An attempt belongs to the connection it was handed out on. A ``hb``,
``delta``, ``done``, ``fail`` or ``back`` about any other attempt changes nothing: a
heartbeat answers ``stop`` for it, a result gets ``ack`` with ``ok: false``.

Reconnecting. A Worker whose connection dropped reconnects with a ``hello`` that
names, in ``attempts``, every attempt it was handed and has not seen settled (by an
``ack``, a ``stop`` or a ``cancel``), and gives in ``resume`` the token of its last
``welcome``. Within the node's reconnect grace its attempts are bound to the new
connection; the ``welcome`` lists in ``stop`` the named attempts it does not hold any
more (the Worker stops them at once and drops their results). An attempt bound to this
Worker that the ``hello`` does not name was never received: it goes back to the queue
and uses no attempt. Without a valid ``resume`` (a new process), nothing is re-claimed
and the old connection's attempts fail when the grace ends.
"""

from __future__ import annotations

from typing import Any

PROTOCOL_VERSION = 1

MAX_ATTEMPTS_PER_MESSAGE = 100_000


class JSONOf:
    """Marks a frame's field kept as raw JSON (``msgspec.Raw``) with the type its JSON
    has: ``Annotated[msgspec.Raw, JSONOf(list[Item])]``. Decoding ignores it; the
    protocol's page shows that type's schema."""

    def __init__(self, kind: Any) -> None:
        self.kind = kind


# --- close codes -----------------------------------------------------------------------

CLOSE_BAD_FRAME = 4400
"""A frame that does not fit the protocol (the reason says where): fix the Worker."""
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
"""The hello names an agent this Worker's token may not serve (the reason names it): the
Worker stops, as for a refused token."""
CLOSE_ID_IN_USE = 4409
"""Another live connection uses this ``worker_id`` (reconnect later, or pick another)."""
CLOSE_NOT_READY = 4503
"""The node is starting, stopping or a standby: try the next address."""

__all__ = [
    "CLOSE_BAD_FRAME",
    "CLOSE_FORBIDDEN",
    "CLOSE_ID_IN_USE",
    "CLOSE_NOT_READY",
    "CLOSE_UNAUTHORIZED",
    "MAX_ATTEMPTS_PER_MESSAGE",
    "PROTOCOL_VERSION",
    "JSONOf",
]
