"""A node serves only while it leads: a standby answers 503 with its role and refuses
Workers; on winning the lead it recovers and serves; when it may have lost the lead it
answers no heartbeat; when it lost it, it steps down at once."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from dex.errors import StorageError
from dex.server.app import _wrap, create_app
from dex.server.config import ServerConfig
from dex.server.streams import MemoryStreams
from dex.testing import wait_until
from tests.integration.conftest import AGENT, Api, connect_fake_worker


class ManualLeadership:
    """A lease the test grants, doubts and takes away."""

    def __init__(self) -> None:
        self.lost = asyncio.Event()
        self.granted: asyncio.Event | None = None
        self.sure = True
        self.released = 0

    async def acquire(self) -> int:
        self.granted = asyncio.Event()
        await self.granted.wait()
        return 7

    async def release(self) -> None:
        self.released += 1

    def valid(self) -> bool:
        return self.sure


class Standby:
    def __init__(self, client: TestClient, app: object, lease: ManualLeadership) -> None:
        self.http = client
        self.api = Api(client, app)
        self.lease = lease
        self.stepped_down = 0

    def call(self, fn: Callable[[], Awaitable[None]]) -> None:
        assert self.http.portal is not None
        self.http.portal.call(fn)

    def grant(self) -> None:
        wait_until(lambda: self.lease.granted is not None, 5, what="the node asks for the lead")

        async def set_granted() -> None:
            assert self.lease.granted is not None
            self.lease.granted.set()

        self.call(set_granted)
        wait_until(lambda: self.http.get("/readyz").status_code == 200, 10, what="active")

    def take_away(self) -> None:
        async def lose() -> None:
            self.lease.lost.set()

        self.call(lose)


@pytest.fixture
def standby(tmp_path: Path) -> Iterator[Standby]:
    lease = ManualLeadership()
    holder: list[Standby] = []
    fastapi_app = create_app(
        ServerConfig(data_dir=tmp_path / "data"),
        leadership=lease,
        on_step_down=lambda: setattr(holder[0], "stepped_down", holder[0].stepped_down + 1),
    )
    with TestClient(_wrap(fastapi_app, ServerConfig())) as client:
        node = Standby(client, fastapi_app, lease)
        holder.append(node)
        yield node


def test_a_standby_refuses_the_api_and_workers_and_says_its_role(standby: Standby) -> None:
    http = standby.http
    assert http.get("/healthz").status_code == 200
    ready = http.get("/readyz")
    assert ready.status_code == 503 and ready.json() == {"status": "not ready", "role": "standby"}
    refused = http.post("/v1/sessions", json={"agent": "echo"})
    assert refused.status_code == 503
    assert refused.headers["x-dex-role"] == "standby"
    assert refused.json()["error"]["code"] == "unavailable"
    assert "standby" in refused.json()["error"]["message"]
    # the upgrade succeeds and the socket closes with 4503 ("try the next address"): a
    # refusal before the upgrade would reach a Worker as HTTP 403, "your token is refused"
    with (
        http.websocket_connect("/v1/workers/connect") as ws,
        pytest.raises(WebSocketDisconnect) as closed,
    ):
        ws.receive_bytes()
    assert closed.value.code == 4503 and closed.value.reason == "standby"


def test_on_winning_the_lead_it_recovers_and_serves(standby: Standby) -> None:
    standby.grant()
    assert standby.http.get("/readyz").json() == {"status": "ready", "role": "active", "epoch": 7}
    standby.api.register(AGENT)
    assert standby.api.create("s1")["id"] == "s1"


def test_without_a_sure_lease_no_heartbeat_is_answered(standby: Standby) -> None:
    standby.grant()
    api = standby.api
    api.register(AGENT)
    api.create("s1")
    api.send("s1", "charge")
    with connect_fake_worker(api) as worker:
        step = worker.step(session_id="s1")
        aid = step["attempt_id"]
        standby.lease.sure = False  # e.g. the pings to the lock stalled
        # in one frame, so the refusal's ack tells that the heartbeat was handled
        worker.send(
            {"t": "hb", "attempts": [aid], "seq": 1},
            {"t": "back", "attempt_id": "no/such/1"},
        )
        assert worker.ack("no/such/1")["ok"] is False
        standby.lease.sure = True
        worker.send({"t": "hb", "attempts": [aid], "seq": 2})
        reply = worker.expect("hb")
        assert reply == {"t": "hb", "status": {aid: "ok"}, "seq": 2}  # seq 1 got no answer
        assert not [m for m in worker.inbox if m.get("t") == "hb"]


def test_without_a_sure_lease_no_model_text_is_published(standby: Standby) -> None:
    """A node that may have been replaced publishes none of its Workers' text: its
    successor has discarded that attempt already, and subscribers must not see it."""
    standby.grant()
    api = standby.api
    api.register(AGENT)
    api.create("s1")
    api.send("s1", "hello")  # a RunModel Step
    streams = api.sessions.streams
    assert isinstance(streams, MemoryStreams)

    def texts() -> list[str]:
        ring = streams.rings._rings.get("s1")
        return [e.data["text"] for e in ring.events if e.type == "model.delta"] if ring else []

    listening = streams.subscribe("s1")  # a subscriber: the ring keeps deltas

    async def subscribed() -> None:
        await anext(listening)

    standby.call(subscribed)
    with connect_fake_worker(api) as worker:
        aid = worker.step(session_id="s1")["attempt_id"]
        standby.lease.sure = False
        worker.send(
            {"t": "delta", "attempt_id": aid, "text": "unsure"},
            {"t": "back", "attempt_id": "no/such/1"},  # its ack: the delta was handled
        )
        assert worker.ack("no/such/1")["ok"] is False
        assert texts() == []
        standby.lease.sure = True
        worker.send(
            {"t": "delta", "attempt_id": aid, "text": "sure"},
            {"t": "back", "attempt_id": "no/such/2"},
        )
        assert worker.ack("no/such/2")["ok"] is False
        assert texts() == ["sure"]
    standby.call(listening.aclose)


def test_a_node_that_lost_the_lead_steps_down_at_once(standby: Standby) -> None:
    standby.grant()
    api = standby.api
    api.register(AGENT)
    with connect_fake_worker(api) as worker:
        standby.take_away()
        with pytest.raises(ConnectionError, match="4503"):
            worker.expect("never")
    assert standby.stepped_down == 1
    ready = standby.http.get("/readyz")
    assert ready.status_code == 503 and ready.json()["role"] == "stepped-down"
    assert standby.http.get("/v1/sessions").status_code == 503


def test_recovery_that_fails_to_reach_storage_is_tried_again_until_it_commits(
    standby: Standby, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = standby.api.sessions
    real = sessions.start
    failures = [StorageError("the database is restarting", retryable=True)] * 2

    async def flaky_start(reason: str = "", parallel: int = 64) -> int:
        if failures:
            raise failures.pop()
        return await real(reason)

    monkeypatch.setattr(sessions, "start", flaky_start)
    standby.grant()  # waits until /readyz is 200
    assert failures == [] and standby.stepped_down == 0


def test_a_node_whose_leading_fails_steps_down_instead_of_hanging(
    standby: Standby, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def broken(reason: str = "", parallel: int = 64) -> int:
        raise RuntimeError("a bug in recovery")

    monkeypatch.setattr(standby.api.sessions, "start", broken)
    wait_until(lambda: standby.lease.granted is not None, 5, what="the node asks for the lead")

    async def grant() -> None:
        assert standby.lease.granted is not None
        standby.lease.granted.set()

    standby.call(grant)
    wait_until(lambda: standby.stepped_down == 1, 10, what="the node stepped down")
    assert standby.http.get("/readyz").json()["role"] == "stepped-down"
