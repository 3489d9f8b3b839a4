"""Routing in a cluster (issue #34, item 4), with two or three real nodes in this process,
each a real uvicorn server on its own port and its own SQLite store, and a fake cluster
membership on each (``FakeCluster``: the methods ``Node.cluster`` answers) that says which
node serves which session. The real membership, partitions and takeovers are tested with
real PostgreSQL nodes elsewhere; here, what a client sees of the forwarding and of the
cluster-wide views."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import uvicorn
from fastapi import FastAPI
from multidict import CIMultiDictProxy
from typer.testing import CliRunner

from dex.cli.main import app as cli
from dex.errors import Unavailable
from dex.server.app import asgi
from dex.server.config import ServerConfig
from dex.server.sessions import Sessions
from dex.testing import free_port, wait_until_async
from tests.integration.conftest import AGENT, fastapi_of

CLIENT_TOKEN = "client-secret"
AUTH = {"authorization": f"Bearer {CLIENT_TOKEN}"}


@dataclass(frozen=True)
class FakeMember:
    node_id: str
    address: str
    standby: bool = False
    partitions: tuple[int, ...] = ()
    here: bool = False


@dataclass
class FakeCluster:
    """What a node's cluster membership answers, set by the test."""

    node_id: str
    routes: dict[str, str | None] = field(default_factory=dict)
    """Session id -> the owner's address (None: this node); absent: this node."""
    unowned: set[str] = field(default_factory=set)
    """Sessions whose partition no live node owns now."""
    member_list: list[FakeMember] = field(default_factory=list)
    owns: bool = True
    partition_count: int = 4
    asked: list[str] = field(default_factory=list)

    def route(self, session_id: str) -> str | None:
        self.asked.append(session_id)
        if session_id in self.unowned:
            raise Unavailable(f"no live node owns the partition of {session_id} now")
        return self.routes.get(session_id)

    def members(self) -> list[FakeMember]:
        return self.member_list

    def owns_any(self) -> bool:
        return self.owns


@dataclass
class Node:
    address: str
    app: FastAPI

    @property
    def sessions(self) -> Sessions:
        sessions: Sessions = self.app.state.sessions
        return sessions

    def join(self, cluster: FakeCluster) -> FakeCluster:
        # ``Node.cluster`` is the cluster core's (issue #34): set here as it would set it
        setattr(self.app.state.node, "cluster", cluster)  # noqa: B010
        return cluster


@contextlib.asynccontextmanager
async def node(data_dir: Path, **options: Any) -> AsyncIterator[Node]:
    """A real node in this process, serving ``AGENT``."""
    port = free_port()
    config = ServerConfig(data_dir=data_dir, listen=f"127.0.0.1:{port}", **options)
    app = asgi(config)
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
    )
    task = asyncio.create_task(server.serve())
    address = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:

            async def ready() -> bool:
                if task.done():
                    task.result()
                    raise RuntimeError("the server stopped while starting")
                try:
                    async with http.get(address + "/readyz") as response:
                        return response.status == 200
                except aiohttp.ClientConnectionError:
                    return False

            await wait_until_async(ready, timeout=20, what="the node answers /readyz")
        found = Node(address, fastapi_of(app))
        await found.sessions.register_agents([AGENT])
        yield found
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 20)


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as session:
        yield session


@pytest.fixture
async def two(tmp_path: Path) -> AsyncIterator[tuple[Node, Node]]:
    async with node(tmp_path / "a") as a, node(tmp_path / "b") as b:
        yield a, b


async def call(
    http: aiohttp.ClientSession, method: str, url: str, **options: Any
) -> tuple[int, Any, CIMultiDictProxy[str]]:
    async with http.request(method, url, **options) as response:
        body = await response.read()
        return response.status, orjson.loads(body) if body else None, response.headers


async def listed(http: aiohttp.ClientSession, n: Node) -> set[str]:
    """The ids of the sessions stored on node ``n`` (the list is not forwarded)."""
    status, body, _ = await call(http, "GET", n.address + "/v1/sessions")
    assert status == 200, body
    return {s["id"] for s in body["sessions"]}


def assert_unavailable(status: int, body: Any, headers: Any) -> None:
    assert status == 503, body
    assert body["error"]["code"] == "unavailable"
    assert headers["retry-after"] == "1"


# --- a call goes to the node that serves its session --------------------------------------


async def test_a_creation_and_a_send_through_one_node_are_served_by_the_owner(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, b = two
    a.join(FakeCluster("A", routes={"s1": b.address}))
    b.join(FakeCluster("B"))

    status, created, _ = await call(
        http, "POST", a.address + "/v1/sessions", json={"agent": AGENT.name, "session_id": "s1"}
    )
    assert status == 201, created
    assert created["id"] == "s1"
    assert await listed(http, b) == {"s1"}
    assert await listed(http, a) == set()

    status, sent, _ = await call(
        http,
        "POST",
        a.address + "/v1/sessions/s1/messages",
        json={"text": "hello", "message_id": "m1"},
    )
    assert status in (200, 201), sent
    assert sent["session_id"] == "s1" and sent["turn"] == 1
    # the owner has the message; the query string went along with the path
    status, turn, _ = await call(
        http, "GET", a.address + "/v1/sessions/s1/turns/1", params={"wait_seconds": "0"}
    )
    assert status == 200, turn
    status, snapshot, _ = await call(http, "GET", b.address + "/v1/sessions/s1")
    assert status == 200
    assert snapshot["session"]["messages_received"] == 1


async def test_a_streamed_body_and_the_console_s_session_page_go_to_the_owner(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, b = two
    a.join(FakeCluster("A", routes={"s1": b.address}))
    b.join(FakeCluster("B"))
    await call(
        http, "POST", b.address + "/v1/sessions", json={"agent": AGENT.name, "session_id": "s1"}
    )

    async def chunks() -> AsyncIterator[bytes]:
        yield b'{"text": "in two'
        yield b' pieces"}'

    status, sent, _ = await call(
        http,
        "POST",
        a.address + "/v1/sessions/s1/messages",
        data=chunks(),  # no content-length: sent chunked, and on as it comes
        headers={"content-type": "application/json"},
    )
    assert status in (200, 201), sent
    status, snapshot, _ = await call(http, "GET", b.address + "/v1/sessions/s1")
    assert snapshot["history"][0]["text"] == "in two pieces"

    async with http.get(a.address + "/ui/sessions/s1") as response:
        page = await response.text()
    assert response.status == 200, page
    assert "in two pieces" in page


async def test_the_owner_compares_a_console_form_s_origin_with_the_address_it_was_sent_to(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    """A browser that sends Origin (and no Sec-Fetch-Site) posts a form to node A, which
    forwards it to the owner B: B compares the Origin with the address the browser asked
    for (``X-Forwarded-Host``, which A adds), not with its own."""
    a, b = two
    a.join(FakeCluster("A", routes={"s1": b.address}))
    b.join(FakeCluster("B"))
    await call(
        http, "POST", b.address + "/v1/sessions", json={"agent": AGENT.name, "session_id": "s1"}
    )
    form = {"text": "from the console"}
    async with http.post(
        a.address + "/ui/sessions/s1/messages",
        data=form,
        headers={"origin": "http://evil.example"},
        allow_redirects=False,
    ) as refused:
        assert refused.status == 403
        assert "cross_site" in await refused.text()
    async with http.post(
        a.address + "/ui/sessions/s1/messages",
        data=form,
        headers={"origin": a.address},
        allow_redirects=False,
    ) as done:
        assert done.status == 303, await done.text()
    _, snapshot, _ = await call(http, "GET", b.address + "/v1/sessions/s1")
    assert [item["text"] for item in snapshot["history"]] == ["from the console"]


async def test_the_owner_checks_the_token_the_client_sent(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with (
        node(tmp_path / "a", client_token=CLIENT_TOKEN) as a,
        node(tmp_path / "b", client_token=CLIENT_TOKEN) as b,
    ):
        a.join(FakeCluster("A", routes={"s1": b.address}))
        b.join(FakeCluster("B"))
        body = {"agent": AGENT.name, "session_id": "s1"}
        status, created, _ = await call(
            http, "POST", a.address + "/v1/sessions", json=body, headers=AUTH
        )
        assert status == 201, created

        status, refused, headers = await call(http, "GET", a.address + "/v1/sessions/s1")
        assert status == 401, refused
        assert headers["www-authenticate"] == "Bearer"
        status, snapshot, _ = await call(http, "GET", a.address + "/v1/sessions/s1", headers=AUTH)
        assert status == 200, snapshot


async def test_an_event_stream_through_another_node_delivers_each_event_as_it_happens(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, b = two
    a.join(FakeCluster("A", routes={"s1": b.address}))
    b.join(FakeCluster("B"))
    await call(
        http, "POST", b.address + "/v1/sessions", json={"agent": AGENT.name, "session_id": "s1"}
    )

    async with http.get(a.address + "/v1/sessions/s1/events") as stream:
        assert stream.status == 200
        assert stream.headers["content-type"].startswith("text/event-stream")

        async def next_event() -> dict[str, str]:
            fields: dict[str, str] = {}
            while True:
                line = (await stream.content.readline()).decode().rstrip("\n")
                if not line:
                    if "event" in fields:
                        return fields
                    continue
                if line.startswith(":"):
                    continue  # a keep-alive comment
                name, _, value = line.partition(": ")
                fields[name] = value

        # each message sent while the stream is open: its events arrive before the stream
        # ends (it never does); the second waits behind the first turn (no Worker runs it)
        for text, expected in (("first", "turn.started"), ("second", "message.queued")):
            status, sent, _ = await call(
                http, "POST", b.address + "/v1/sessions/s1/messages", json={"text": text}
            )
            assert status in (200, 201), sent
            seen: list[str] = []
            while not seen or seen[-1] != expected:
                event = await asyncio.wait_for(next_event(), 10)
                seen.append(event["event"])
                assert "id" in event and orjson.loads(event["data"])
            assert "history.item" in seen or expected == "message.queued"


async def test_a_client_leaving_a_forwarded_stream_ends_it_on_the_owner(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, b = two
    a.join(FakeCluster("A", routes={"s1": b.address}))
    b.join(FakeCluster("B"))
    await call(
        http, "POST", b.address + "/v1/sessions", json={"agent": AGENT.name, "session_id": "s1"}
    )
    streams = b.sessions.streams

    async def subscribed() -> bool:
        return streams.subscribers == 1

    async with (
        aiohttp.ClientSession() as leaving,
        leaving.get(a.address + "/v1/sessions/s1/events") as stream,
    ):
        assert stream.status == 200
        await wait_until_async(subscribed, what="the owner streams to the forwarding node")

    async def left() -> bool:
        return streams.subscribers == 0

    await wait_until_async(left, what="the owner's stream ended with the client's")


async def test_a_created_session_without_an_id_goes_to_a_node_that_owns_partitions(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, b = two
    members = [
        FakeMember("A", a.address, standby=True, here=True),
        FakeMember("B", b.address, partitions=(0, 1, 2, 3)),
    ]
    a.join(FakeCluster("A", member_list=members, owns=False))
    b.join(FakeCluster("B"))

    status, created, _ = await call(
        http, "POST", a.address + "/v1/sessions", json={"agent": AGENT.name}
    )
    assert status == 201, created
    assert await listed(http, b) == {created["id"]}
    assert await listed(http, a) == set()

    # a node that owns partitions names the session itself
    a.join(FakeCluster("A", member_list=members, owns=True))
    status, created, _ = await call(
        http, "POST", a.address + "/v1/sessions", json={"agent": AGENT.name}
    )
    assert status == 201, created
    assert await listed(http, a) == {created["id"]}


# --- refusals: the client tries again ---------------------------------------------------------


async def test_a_forwarded_call_is_never_forwarded_again(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, b = two
    # each thinks the other serves s1 (the partition is moving): no ping-pong
    cluster_a = a.join(FakeCluster("A", routes={"s1": b.address}))
    cluster_b = b.join(FakeCluster("B", routes={"s1": a.address}))

    assert_unavailable(*await call(http, "GET", a.address + "/v1/sessions/s1"))
    assert cluster_a.asked == ["s1"] and cluster_b.asked == ["s1"]

    # a call that was forwarded is served where it arrives when that node serves it
    cluster_b.routes.clear()
    status, body, _ = await call(
        http, "GET", b.address + "/v1/sessions/s1", headers={"x-dex-forwarded-by": "A"}
    )
    assert status == 404, body  # B serves s1, which does not exist
    assert body["error"]["code"] == "not_found"


async def test_a_session_no_live_node_owns_now_is_a_503(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, _ = two
    a.join(FakeCluster("A", unowned={"s1"}))
    assert_unavailable(*await call(http, "GET", a.address + "/v1/sessions/s1/approvals"))
    assert_unavailable(
        *await call(
            http, "POST", a.address + "/v1/sessions", json={"agent": AGENT.name, "session_id": "s1"}
        )
    )


async def test_an_owner_that_cannot_be_reached_is_a_503(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, _ = two
    gone = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    a.join(FakeCluster("A", routes={"s1": gone}))
    status, body, headers = await call(
        http, "POST", a.address + "/v1/sessions/s1/messages", json={"text": "hi"}
    )
    assert_unavailable(status, body, headers)
    assert "did not answer" in body["error"]["message"]
    # the console's page of that session: the same 503, as a page
    async with http.get(a.address + "/ui/sessions/s1") as page:
        assert page.status == 503
        assert page.headers["content-type"].startswith("text/html")
        assert page.headers["retry-after"] == "1"
        assert page.headers["x-frame-options"] == "DENY"
        assert "did not answer" in await page.text()


# --- the cluster-wide views ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def worker_on(
    http: aiohttp.ClientSession, n: Node, worker_id: str
) -> AsyncIterator[aiohttp.ClientWebSocketResponse]:
    """A Worker connection to node ``n`` that said hello and was welcomed."""
    async with http.ws_connect(n.address + "/v1/workers/connect") as ws:
        hello = {
            "t": "hello",
            "worker_id": worker_id,
            "agents": [AGENT.model_dump(mode="json")],
            "capacity": 2,
        }
        await ws.send_bytes(orjson.dumps([hello]))
        frame = await asyncio.wait_for(ws.receive(), 10)
        assert orjson.loads(frame.data)[0]["t"] == "welcome", frame
        yield ws


async def test_the_workers_of_every_node_are_listed_with_their_node(
    tmp_path: Path, two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, b = two
    silent = f"http://127.0.0.1:{free_port()}"
    members = [
        FakeMember("A", a.address, partitions=(0, 1), here=True),
        FakeMember("B", b.address, partitions=(2, 3)),
        FakeMember("C", silent, standby=True),
    ]
    cluster_a = a.join(FakeCluster("A", member_list=members, routes={"s1": b.address}))
    b.join(FakeCluster("B", member_list=[]))

    async with worker_on(http, a, "w-a"), worker_on(http, b, "w-b"):
        # the Worker channel is never forwarded: each connection stays on its node
        assert cluster_a.asked == []
        status, found, _ = await call(http, "GET", a.address + "/v1/workers")
        assert status == 200, found
        assert [(w["worker_id"], w["node"]) for w in found["workers"]] == [
            ("w-a", "A"),
            ("w-b", "B"),
        ]
        assert found["unreachable"] == ["C"]

        status, own, _ = await call(
            http, "GET", a.address + "/v1/workers", headers={"x-dex-local": "1"}
        )
        assert status == 200
        assert [(w["worker_id"], w["node"]) for w in own["workers"]] == [("w-a", "A")]
        assert own["unreachable"] == []

        async with http.get(a.address + "/ui/cluster") as response:
            page = await response.text()
        assert response.status == 200
        for node_id in ("A", "B", "C"):
            assert f'data-node="{node_id}"' in page
        assert 'data-worker="w-a" data-node="A"' in page
        assert 'data-worker="w-b" data-node="B"' in page
        assert "Not answering (their Workers are not listed): C<" in page

        # the command line: each Worker with its node, and the nodes
        listed = await asyncio.to_thread(dex_command, a, "workers")
        assert "w-a  node A  capacity 2" in listed and "w-b  node B  capacity 2" in listed
        nodes = await asyncio.to_thread(dex_command, a, "cluster")
        assert nodes.splitlines() == [
            "3 nodes, 4 partitions",
            f"A  {a.address}  active  2 partitions  (answered)",
            f"B  {b.address}  active  2 partitions",
            f"C  {silent}  standby  0 partitions",
        ]


def dex_command(n: Node, *args: str) -> str:
    """What ``dex ARGS`` prints against node ``n`` (run in a thread: the nodes run on the
    test's loop)."""
    result = CliRunner().invoke(cli, [*args, "--address", n.address], prog_name="dex")
    assert result.exit_code == 0, result.output
    return result.output


async def test_a_node_alone_lists_its_workers_without_a_node(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with node(tmp_path / "alone") as alone, worker_on(http, alone, "w-1"):
        status, found, _ = await call(http, "GET", alone.address + "/v1/workers")
        assert status == 200
        assert [w["worker_id"] for w in found["workers"]] == ["w-1"]
        assert "node" not in found["workers"][0] and found["unreachable"] == []
        status, view, _ = await call(http, "GET", alone.address + "/v1/cluster")
        assert status == 200
        assert view == {"node_id": None, "partition_count": None, "members": []}


async def test_the_cluster_view_lists_the_members_and_their_partitions(
    two: tuple[Node, Node], http: aiohttp.ClientSession
) -> None:
    a, b = two
    members = [
        FakeMember("B", b.address, partitions=(2, 3)),
        FakeMember("A", a.address, partitions=(0, 1), here=True),
    ]
    a.join(FakeCluster("A", member_list=members, partition_count=4))
    status, view, _ = await call(http, "GET", a.address + "/v1/cluster")
    assert status == 200, view
    assert view == {
        "node_id": "A",
        "partition_count": 4,
        "members": [
            {
                "node_id": "A",
                "address": a.address,
                "standby": False,
                "partitions": [0, 1],
                "here": True,
            },
            {
                "node_id": "B",
                "address": b.address,
                "standby": False,
                "partitions": [2, 3],
                "here": False,
            },
        ],
    }
