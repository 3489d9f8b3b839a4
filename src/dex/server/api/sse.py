"""A session's live events as a ``text/event-stream`` response (Server-Sent Events).

The stream backend (``dex.server.streams``) yields events, and None after a quiet
while; each becomes one message or a keep-alive comment, written by hand (three fields
and a JSON line: ``docs/dependencies.md`` has the measurement against sse-starlette).
The response ends when the client disconnects (Starlette's ``StreamingResponse`` watches
for it) or after a ``stream.dropped`` event, the backend's last word to a subscriber that
fell too far behind.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator

import orjson
from fastapi.responses import StreamingResponse

from dex.server.streams import Event

KEEP_ALIVE = b": keep-alive\n\n"
DROPPED = "stream.dropped"
HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}
"""Nothing caches the stream, and a proxy such as nginx passes each event on at once."""


def encode(event: Event) -> bytes:
    """One message. The data is one line of JSON (orjson escapes every newline in it).
    A notice of the stream's own (``stream.gap``, ``stream.dropped``: no id) carries no
    id: resuming after it is resuming after the last event this subscriber was sent."""
    data = orjson.dumps(event.data)
    if not event.id or event.type == DROPPED:
        return b"event: %s\ndata: %s\n\n" % (event.type.encode(), data)
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (event.id.encode(), event.type.encode(), data)


async def body(events: AsyncIterator[Event | None]) -> AsyncIterator[bytes]:
    try:
        async for event in events:
            if event is None:
                yield KEEP_ALIVE
                continue
            yield encode(event)
            if event.type == DROPPED:
                return
    finally:
        if isinstance(events, AsyncGenerator):
            await events.aclose()  # the subscription ends now, not when collected


def response(events: AsyncIterator[Event | None]) -> StreamingResponse:
    return StreamingResponse(body(events), media_type="text/event-stream", headers=HEADERS)
