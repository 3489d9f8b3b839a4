"""The event stream without I/O: the client's decoder (the HTML standard's parsing rules,
cut into chunks anywhere) and the server's encoding of a backend's events."""

from __future__ import annotations

from collections.abc import AsyncGenerator

import pytest

from dex.client.sse import Decoder, Message, event
from dex.errors import ServerError
from dex.server.api import sse
from dex.server.streams import Event

STREAM = (
    b"\xef\xbb\xbf: a comment first\r\n"
    b"retry: 2500\r\n"
    b"id: 1\r\n"
    b"event: history.item\r\n"
    b'data: {"index": 0,\r\n'
    b'data:  "text": "two lines"}\r\n'
    b"\r\n"
    b"id:2\n"  # no space after the colon
    b"event:model.delta\n"
    b'data:"caf\xc3\xa9 \xe2\x80\xa8"\n'  # U+2028 inside the data ends no line
    b"\n"
    b"id: 3\r"  # CR alone ends lines too
    b"data: 3\r"
    b"unknown: ignored\r"
    b"\r"
    b": keep-alive\n\n"
    b"data\n"  # a field with no colon: data with an empty value
    b"data\n"
    b"\n"
    b"id: 4\n"  # an id with no data dispatches nothing, but sets the last event id
    b"\n"
    b"data: not finished"  # the stream ends before its blank line: never dispatched
)
EXPECTED = [
    Message("1", "history.item", '{"index": 0,\n "text": "two lines"}'),
    Message("2", "model.delta", '"café \u2028"'),
    Message("3", "message", "3"),
    Message("3", "message", "\n"),
]


def decode(chunks: list[bytes]) -> tuple[list[Message], Decoder]:
    decoder = Decoder()
    messages = [m for chunk in chunks for m in decoder.feed(chunk)]
    return messages, decoder


def test_the_decoder_follows_the_standard() -> None:
    messages, decoder = decode([STREAM])
    assert messages == EXPECTED
    assert decoder.last_event_id == "4"
    assert decoder.retry == 2.5


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 64])
def test_chunks_cut_anywhere_decode_the_same(size: int) -> None:
    """Every cut: inside a CRLF, inside a UTF-8 character, inside a field name."""
    chunks = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    messages, decoder = decode(chunks)
    assert messages == EXPECTED
    assert decoder.last_event_id == "4"


def test_a_cut_after_every_byte_position_decodes_the_same() -> None:
    for cut in range(len(STREAM)):
        assert decode([STREAM[:cut], STREAM[cut:]])[0] == EXPECTED, cut


def test_a_crlf_cut_between_chunks_then_a_blank_line_dispatches() -> None:
    # the LF of the CRLF comes alone, and the blank line's LF after it: neither is lost
    assert decode([b"data: 1\r", b"\n", b"\n"])[0] == [Message("", "message", "1")]
    assert decode([b"data: 1\r", b"\n", b"\r\n"])[0] == [Message("", "message", "1")]


@pytest.mark.parametrize(
    "chunks",
    [
        [b"\xef\xbb", b"\xbfdata: 1\n\n"],
        [b"\xef", b"\xbb", b"\xbf", b"data: 1\n\n"],
        [b"\xef\xbb\xbf", b"data: 1\n\n"],
        [b"", b"\xef", b"\xbb\xbfdata: 1\n\n"],
    ],
)
def test_a_byte_order_mark_cut_between_chunks_is_dropped(chunks: list[bytes]) -> None:
    assert decode(chunks)[0] == [Message("", "message", "1")]


def test_only_the_first_byte_order_mark_is_dropped() -> None:
    messages, _ = decode([b"\xef\xbb\xbfdata: 1\n\n", b"\xef\xbb\xbfdata: 2\n\n"])
    assert messages == [Message("", "message", "1")]  # the second's field is not "data"


def test_a_long_line_in_many_chunks() -> None:
    text = "x" * 300_000
    payload = b'id: 9\ndata: "' + text.encode() + b'"\n\n'
    messages, _ = decode([payload[i : i + 4096] for i in range(0, len(payload), 4096)])
    assert [event(m) for m in messages] == [{"id": "9", "type": "message", "data": text}]


def test_a_new_connection_drops_the_unfinished_event_and_keeps_the_last_id() -> None:
    decoder = Decoder("7")
    assert decoder.feed(b"id: 8\ndata: 8\n\nid: 9\ndata: half") == [Message("8", "message", "8")]
    decoder.reset()
    assert decoder.last_event_id == "8"
    assert decoder.feed(b"data: 10\n\n") == [Message("8", "message", "10")]


def test_a_null_in_an_id_leaves_the_last_id() -> None:
    decoder = Decoder("5")
    assert decoder.feed(b"id: 6\x007\ndata: 1\n\n") == [Message("5", "message", "1")]


def test_an_event_whose_data_is_not_json_is_a_server_error() -> None:
    with pytest.raises(ServerError, match="not JSON"):
        event(Message("1", "model.delta", "{not json"))


# --- the server's side ---------------------------------------------------------------------


async def body_of(events: AsyncGenerator[Event | None, None]) -> bytes:
    return b"".join([chunk async for chunk in sse.body(events)])


async def test_the_body_sends_keep_alives_and_ends_after_stream_dropped() -> None:
    closed: list[bool] = []

    async def stream() -> AsyncGenerator[Event | None, None]:
        try:
            yield Event("1", "model.delta", {"text": "a\nb"})
            yield None
            yield Event("", "stream.dropped", {"reason": "too far behind"})
            yield Event("3", "model.delta", {"text": "never sent"})
        finally:
            closed.append(True)

    body = await body_of(stream())
    assert body == (
        b'id: 1\nevent: model.delta\ndata: {"text":"a\\nb"}\n\n'
        b": keep-alive\n\n"
        b'event: stream.dropped\ndata: {"reason":"too far behind"}\n\n'
    )
    assert closed == [True]  # the backend's subscription was closed, not left to the GC
    messages, decoder = decode([body])
    assert [m.type for m in messages] == ["model.delta", "stream.dropped"]
    assert decoder.last_event_id == "1"  # resuming starts after the last event sent


@pytest.mark.parametrize("ident", ["1764658364000001", "1733150000000-3"])
def test_an_id_of_either_backend_is_sent_as_it_is(ident: str) -> None:
    encoded = sse.encode(Event(ident, "turn.started", {"turn": 1}))
    assert encoded == b'id: %s\nevent: turn.started\ndata: {"turn":1}\n\n' % ident.encode()


def test_a_notice_without_an_id_is_sent_without_one() -> None:
    assert sse.encode(Event("", "stream.gap", {})) == b"event: stream.gap\ndata: {}\n\n"
