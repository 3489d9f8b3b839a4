"""A session's live events as a ``text/event-stream`` response (Server-Sent Events).

The stream backend (``dex.server.streams``) yields events, and None after a quiet
while; each becomes one message or a keep-alive comment, written by hand (three fields
and a JSON line: ``docs/dependencies.md`` has the measurement against sse-starlette).
The response ends when the client disconnects (Starlette's ``StreamingResponse`` watches
for it) or after a ``stream.dropped`` event, the backend's last word to a subscriber that
fell too far behind.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import orjson
from fastapi.responses import StreamingResponse

from dex.server.streams import Event, MemoryStreams

KEEP_ALIVE = b": keep-alive\n\n"
DROPPED = "stream.dropped"
HEADERS = {"cache-control": "no-store", "x-accel-buffering": "no"}
"""Nothing caches the stream, and a proxy such as nginx passes each event on at once."""


def encode(event: Event) -> bytes:
    """One message. The data is one line of JSON (orjson escapes every newline in it).
    A notice of the stream's own (``stream.dropped``, an event with no id) carries no id:
    resuming after it is resuming after the last event this subscriber was sent."""
    data = orjson.dumps(event.data)
    ident = str(event.id)  # an int from the in-memory backend until it numbers with str
    if not ident or event.type == DROPPED:
        return b"event: %s\ndata: %s\n\n" % (event.type.encode(), data)
    return b"id: %s\nevent: %s\ndata: %s\n\n" % (ident.encode(), event.type.encode(), data)


async def body(events: AsyncGenerator[Event | None, None]) -> AsyncIterator[bytes]:
    async with contextlib.aclosing(events):
        async for event in events:
            if event is None:
                yield KEEP_ALIVE
                continue
            yield encode(event)
            if event.type == DROPPED:
                return


def response(events: AsyncGenerator[Event | None, None]) -> StreamingResponse:
    return StreamingResponse(body(events), media_type="text/event-stream", headers=HEADERS)


# Until the in-memory backend takes the id as a string too (the Redis Streams work), it
# numbers with ints: ``resume_after`` hands it the header's decimal id as one. Delete this
# and pass ``Last-Event-ID`` as it is once ``MemoryStreams.subscribe`` takes ``str``.
_AFTER = inspect.signature(MemoryStreams.subscribe).parameters.get("after")
_INT_IDS = _AFTER is not None and str(_AFTER.annotation) == "int | None"


def resume_after(last_event_id: str | None) -> Any:
    """``Last-Event-ID`` as the stream backend takes it: the string, unparsed (ids are
    opaque). An int-numbered backend gets a decimal id as its number, and one of another
    backend's form as an id it never sent (it replays its buffer)."""
    if last_event_id is None or not _INT_IDS:
        return last_event_id
    return int(last_event_id) if last_event_id.isdecimal() else 0
