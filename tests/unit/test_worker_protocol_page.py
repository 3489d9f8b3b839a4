"""docs/worker-protocol.md is generated from the frame types: it must not be stale."""

from __future__ import annotations

from pathlib import Path

from dex.wire import protocol_page, server_frames, worker_frames

PAGE = Path(__file__).parents[2] / "docs" / "worker-protocol.md"


def test_the_committed_page_is_what_the_types_say() -> None:
    assert PAGE.read_text() == protocol_page.render(), (
        "docs/worker-protocol.md is stale: run "
        "`.venv/bin/python -m dex.wire.protocol_page docs/worker-protocol.md`"
    )


def test_every_message_type_is_on_the_page() -> None:
    text = PAGE.read_text()
    for tag in ("hello", "hb", "delta", "done", "fail", "back", "drain"):
        assert f"### `{tag}`" in text
    for tag in ("welcome", "step", "ack", "cancel", "members"):
        assert f"### `{tag}`" in text


def test_the_frames_both_sides_send_parse_as_the_page_says() -> None:
    hello = worker_frames.decode_hello(
        b'[{"t": "hello", "worker_id": "w", "agents": []}, {"t": "hb", "attempts": ["a/1/1"]}]'
    )
    assert hello.worker_id == "w"
    sent = worker_frames.decode(b'[{"t": "hb", "attempts": ["a/1/1"]}, {"t": "drain"}]')
    assert [type(m) for m in sent] == [worker_frames.Heartbeat, worker_frames.Drain]
    received = server_frames.decode(
        b'[{"t": "welcome", "worker_id": "w", "heartbeat_timeout": 10, "reconnect_grace": 1,'
        b' "resume": "r"}, {"t": "ack", "attempt_id": "a/1/1", "ok": true}]'
    )
    assert [type(m) for m in received] == [server_frames.Welcome, server_frames.Ack]
