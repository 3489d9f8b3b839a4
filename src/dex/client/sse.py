"""Reading ``text/event-stream``, as the HTML standard's event stream interpretation says
(https://html.spec.whatwg.org/multipage/server-sent-events.html#event-stream-interpretation).

Lines end with CRLF, LF or CR, also across chunks; a line starting with ``:`` is a
comment; ``field: value`` loses one space after the colon, and a line with no colon is a
field with an empty value. ``data`` lines are joined with LF; ``event`` names the type
(``message`` if none); ``id`` sets the last event id, which stays until an ``id`` changes
it; ``retry`` sets the reconnection time; anything else is ignored. A blank line
dispatches the event, if it has data. Lines are split as bytes, then decoded (UTF-8,
with replacement), so that no character inside a JSON string can end one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from dex.errors import ServerError

BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True, slots=True)
class Message:
    """One dispatched event: ``id`` is the last event id when it was dispatched."""

    id: str
    type: str
    data: str


class Decoder:
    """Turns the chunks of one stream into messages; keeps, between streams, the last event
    id (``Last-Event-ID`` for a reconnect) and the server's reconnection time."""

    def __init__(self, last_event_id: str = "") -> None:
        self.last_event_id = last_event_id
        """The id of the last event dispatched (or given to start from)."""
        self.retry: float | None = None
        """The reconnection time the server asked for (``retry:``), in seconds."""
        self._id = last_event_id  # the id buffer: set by a field, read at dispatch
        self._type = ""
        self._data: list[str] = []
        self._partial: list[bytes] = []  # the pieces of a line not ended yet
        self._after_cr = False
        self._head: bytes | None = b""
        """The stream's first bytes while they may still be a byte order mark cut between
        chunks; None once it is past them."""

    def reset(self) -> None:
        """A new connection: an event the last one did not finish is dropped."""
        self._type, self._data, self._partial, self._after_cr = "", [], [], False
        self._id = self.last_event_id
        self._head = b""

    def feed(self, chunk: bytes) -> list[Message]:
        """The messages that ``chunk`` completes."""
        if self._head is not None:  # a byte order mark, once, even cut between chunks
            chunk = self._head + chunk
            if len(chunk) < len(BOM) and BOM.startswith(chunk):
                self._head = chunk
                return []
            self._head = None
            chunk = chunk.removeprefix(BOM)
        if self._after_cr and chunk.startswith(b"\n"):
            chunk = chunk[1:]  # the LF of a CRLF cut between chunks
            self._after_cr = False
        if not chunk:
            return []
        if b"\n" not in chunk and b"\r" not in chunk:
            self._partial.append(chunk)  # a long line: joined once it ends
            self._after_cr = False
            return []
        if self._partial:
            self._partial.append(chunk)
            chunk = b"".join(self._partial)
        lines = chunk.splitlines()  # on CRLF, LF and CR only: bytes know no other
        last = chunk[-1:]
        self._after_cr = last == b"\r"
        self._partial = [] if last in (b"\n", b"\r") else [lines.pop()]
        messages: list[Message] = []
        for line in lines:  # one loop, no call per line: this is the client's hot path
            if not line:
                if (data := self._dispatch()) is not None:
                    messages.append(Message(self.last_event_id, self._type or "message", data))
                    self._type, self._data = "", []
                continue
            name, _, value = line.partition(b":")
            if not name:
                continue  # a comment (a keep-alive)
            if value[:1] == b" ":
                value = value[1:]
            if name == b"data":
                self._data.append(value.decode(errors="replace"))
            elif name == b"event":
                self._type = value.decode(errors="replace")
            elif name == b"id":
                if b"\0" not in value:
                    self._id = value.decode(errors="replace")
            elif name == b"retry" and value.isdigit():
                self.retry = int(value) / 1000
        return messages

    def _dispatch(self) -> str | None:
        """The end of an event: its data, or None if it has none (it is not dispatched)."""
        self.last_event_id = self._id
        if not self._data:
            self._type = ""
            return None
        return self._data[0] if len(self._data) == 1 else "\n".join(self._data)


def event(message: Message) -> dict[str, Any]:
    """A Dex event as ``Client.stream_events`` yields it: the data is JSON."""
    try:
        data = orjson.loads(message.data)
    except orjson.JSONDecodeError:
        raise ServerError(
            f"an event whose data is not JSON: {message.type} {message.data[:200]!r}"
        ) from None
    return {"id": message.id, "type": message.type, "data": data}
