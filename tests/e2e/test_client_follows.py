"""The Python client rides out a node's restart: reads, and sends that carry a
``message_id``, are tried again until the client's timeout."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import dex
from tests.support.rig import Rig


def test_reads_and_keyed_sends_wait_out_a_restart(rig: Rig) -> None:
    rig.start_server()
    rig.start_worker()
    sid = rig.session()
    rig.server.kill()
    outcomes: dict[str, Any] = {}

    def during_the_gap() -> None:
        with dex.SyncClient(rig.server.address, timeout=30) as client:
            outcomes["asked_at"] = time.monotonic()
            outcomes["snapshot"] = client.get_agent_snapshot(sid)
            outcomes["sent"] = client.send_message(sid, "hello again", message_id="m-1", wait=True)

    caller = threading.Thread(target=during_the_gap)
    caller.start()
    rig.start_server()
    up_at = time.monotonic()
    caller.join(60)
    assert outcomes["asked_at"] < up_at  # asked while no node answered
    assert outcomes["snapshot"]["session"]["id"] == sid
    assert outcomes["sent"]["text"] == "echo: hello again"
    history = rig.client.get_agent_snapshot(sid)["history"]
    assert [i["text"] for i in history if i["type"] == "user"] == ["hello again"]


def test_a_send_without_a_message_id_is_not_repeated_and_says_so(rig: Rig) -> None:
    rig.start_server()
    rig.server.kill()
    with dex.SyncClient(rig.server.address, timeout=2) as client:
        started = time.monotonic()
        with pytest.raises(dex.Unavailable, match="no Dex Server answered"):
            client.send_message("s", "hi")
        assert time.monotonic() - started < 2  # tried once, not until the timeout
