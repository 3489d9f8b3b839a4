"""A Worker in a cluster: it learns the nodes from the one it reaches (``welcome.members``,
then ``members`` frames) and keeps a connection to each, sharing one capacity.

The nodes here are two real single-node servers in this process, each on SQLite in its
own data dir, whose ``Attempts.members`` says both are members: what a cluster's nodes
tell a Worker, without the cluster."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import pytest

import dex
from dex.server.attempts import Attempts
from dex.server.dispatch.dispatcher import BACK_OFF
from dex.testing import free_port, wait_until_async
from tests.integration.conftest import (
    AGENT,
    FAST_WORKER,
    HELPER,
    HOLD,
    Api,
    connect_fake_worker,
    run_server,
)


class Members:
    """What every node says the members are, and each node's ``Attempts`` (in the order
    the nodes started)."""

    def __init__(self) -> None:
        self.listed: list[str] = []
        self.attempts: list[Attempts] = []

    def announce(self, members: list[str]) -> None:
        """The membership changes: every node tells its Workers, as a cluster would."""
        self.listed[:] = members
        for attempts in self.attempts:
            attempts.announce_members(members)


@pytest.fixture
def members(monkeypatch: pytest.MonkeyPatch) -> Iterator[Members]:
    state = Members()
    original = Attempts.__init__

    def init(self: Attempts, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.members = lambda: list(state.listed)
        state.attempts.append(self)

    monkeypatch.setattr(Attempts, "__init__", init)
    yield state


def test_the_welcome_lists_the_members_and_a_change_reaches_every_connected_worker(
    api: Api,
) -> None:
    api.register(AGENT)
    attempts = api.sessions.attempts
    with connect_fake_worker(api, "w-alone") as alone:
        assert alone.welcome["members"] == []  # a single node: nothing changes
    nodes = ["http://10.0.0.1:7450", "http://10.0.0.2:7450"]
    attempts.members = lambda: list(nodes)
    with connect_fake_worker(api, "w-1") as one, connect_fake_worker(api, "w-2") as two:
        assert one.welcome["members"] == nodes and two.welcome["members"] == nodes
        assert api.http.portal is not None
        api.http.portal.call(attempts.announce_members, nodes[:1])
        for fake in (one, two):
            assert fake.expect("members") == {"t": "members", "members": nodes[:1]}


async def workers_on(address: str) -> list[str]:
    async with dex.Client(address, timeout=10) as client:
        return [w["worker_id"] for w in await client.list_workers()]


async def registered(client: dex.Client) -> bool:
    return any(a["name"] == HELPER.name for a in await client.list_agents())


async def test_a_worker_seeded_with_one_node_connects_to_every_member_and_runs_their_steps(
    tmp_path: Path, members: Members, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="dex.worker")
    a, b = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    members.listed[:] = [a, b]
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(run_server(tmp_path / "a", port=int(a.split(":")[-1])))
        await stack.enter_async_context(run_server(tmp_path / "b", port=int(b.split(":")[-1])))
        worker = await stack.enter_async_context(dex.Worker([HELPER], a, FAST_WORKER))
        client_a = await stack.enter_async_context(dex.Client(a, timeout=15))
        client_b = await stack.enter_async_context(dex.Client(b, timeout=15))

        async def on_both() -> bool:
            return await registered(client_a) and await registered(client_b)

        await wait_until_async(on_both, what="the Worker connected to both nodes")
        assert await workers_on(a) == [worker.id] and await workers_on(b) == [worker.id]
        for client, text in ((client_a, "add 1 2"), (client_b, "add 3 4")):
            session = await client.create_session("helper")
            turn = await client.send_message(session["id"], text, wait=True)
            assert turn["status"] == "completed", turn
            assert turn["tool_calls"][0]["result"] == sum(int(n) for n in text.split()[1:])
    connected = {
        getattr(r, "address", None)
        for r in caplog.records
        if r.name == "dex.worker" and getattr(r, "action", "") == "worker.connected"
    }  # the Worker's lines (the in-process nodes log their side under the same action)
    assert connected == {a, b}  # one line per node, naming it


async def test_one_capacity_over_two_nodes_hands_back_what_does_not_fit(
    tmp_path: Path, members: Members
) -> None:
    a, b = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    members.listed[:] = [a, b]
    HOLD["entered"], HOLD["open"] = asyncio.Event(), asyncio.Event()
    config = FAST_WORKER.model_copy(update={"capacity": 1})
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(run_server(tmp_path / "a", port=int(a.split(":")[-1])))
        await stack.enter_async_context(run_server(tmp_path / "b", port=int(b.split(":")[-1])))
        worker = await stack.enter_async_context(dex.Worker([HELPER], a, config))
        client_a = await stack.enter_async_context(dex.Client(a, timeout=15))
        client_b = await stack.enter_async_context(dex.Client(b, timeout=15))

        async def on_both() -> bool:
            return await registered(client_a) and await registered(client_b)

        await wait_until_async(on_both, what="the Worker connected to both nodes")
        runner = worker._runner
        most = 0

        def watch() -> None:  # the attempts running at once, at every turn of the loop
            nonlocal most
            most = max(most, len(runner.running))
            if not stopped:
                asyncio.get_running_loop().call_soon(watch)

        stopped = False
        watch()
        held = await client_a.create_session("helper")
        holding = asyncio.create_task(client_a.send_message(held["id"], "hold", wait=True))
        await asyncio.wait_for(HOLD["entered"].wait(), 10)
        other = await client_b.create_session("helper")
        sending = asyncio.create_task(client_b.send_message(other["id"], "add 5 6", wait=True))

        async def handed_back() -> bool:
            return runner.handed_back >= 1

        await wait_until_async(handed_back, what="node B's Step handed back")
        # node B backs off a full Worker (Dispatcher.back_off): over a second it hands the
        # Step out a few times, not at the pace of its commits (about 160 a second without)
        before = runner.handed_back
        await asyncio.sleep(1.0)  # a window to count in, not a wait for anything
        assert runner.handed_back - before <= 1.0 / BACK_OFF + 2
        assert not sending.done()
        HOLD["open"].set()
        first, second = await asyncio.wait_for(asyncio.gather(holding, sending), 15)
        stopped = True
        assert first["status"] == "completed" and second["status"] == "completed"
        assert second["tool_calls"][0]["result"] == 11
        assert most == 1  # never two at once


async def test_a_node_no_member_lists_is_not_reconnected_to_once_its_connection_is_down(
    tmp_path: Path, members: Members, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="dex.worker")  # every try
    a, b = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    port_b = int(b.split(":")[-1])
    members.listed[:] = [a, b]
    async with AsyncExitStack() as stack:
        await stack.enter_async_context(run_server(tmp_path / "a", port=int(a.split(":")[-1])))
        node_b = AsyncExitStack()
        await node_b.enter_async_context(run_server(tmp_path / "b", port=port_b))
        worker = await stack.enter_async_context(dex.Worker([HELPER], a, FAST_WORKER))

        async def on_b() -> bool:
            return await workers_on(b) == [worker.id]

        await wait_until_async(on_b, what="the Worker connected to node B")
        await node_b.aclose()  # B goes down: the Worker tries it again

        def lines(action: str) -> int:
            return sum(
                getattr(r, "action", "") == action and getattr(r, "address", None) == b
                for r in caplog.records
            )

        async def tried() -> bool:
            return lines("worker.connect_failed") > 0

        await wait_until_async(tried, what="the Worker tried node B again")
        members.announce([a])  # then B leaves the cluster

        async def let_go() -> bool:
            return lines("worker.node_left") == 1

        await wait_until_async(let_go, what="the Worker let node B go")
        tries = lines("worker.connect_failed")
        assert await workers_on(a) == [worker.id]  # the seed's node is kept
        client = await stack.enter_async_context(dex.Client(a, timeout=15))
        session = await client.create_session("helper")
        for n in range(3):  # meanwhile a Worker that tried B again would log each try
            turn = await client.send_message(session["id"], f"add {n} 2", wait=True)
            assert turn["status"] == "completed"
        assert lines("worker.connect_failed") == tries

        # B comes back and joins again: the Worker connects to it again
        await stack.enter_async_context(run_server(tmp_path / "b", port=port_b))
        members.announce([a, b])
        await wait_until_async(on_b, what="the Worker connected to node B again")


async def test_a_seed_that_left_the_cluster_is_not_retried_while_a_member_is_connected(
    tmp_path: Path, members: Members, caplog: pytest.LogCaptureFixture
) -> None:
    """The seed's node leaves: its connection is not tried again while another node is
    connected (as for a load balancer's address, which no node lists)."""
    caplog.set_level(logging.DEBUG, logger="dex.worker")  # every try
    a, b = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    members.listed[:] = [a, b]
    async with AsyncExitStack() as stack:
        node_a = AsyncExitStack()
        await node_a.enter_async_context(run_server(tmp_path / "a", port=int(a.split(":")[-1])))
        await stack.enter_async_context(run_server(tmp_path / "b", port=int(b.split(":")[-1])))
        worker = await stack.enter_async_context(dex.Worker([HELPER], a, FAST_WORKER))

        async def on_b() -> bool:
            return await workers_on(b) == [worker.id]

        await wait_until_async(on_b, what="the Worker connected to node B")
        members.announce([b])

        async def heard() -> bool:  # the members frame came before A's close
            return worker._cluster.listed() == {b}

        await wait_until_async(heard, what="the Worker heard that A left")
        await node_a.aclose()

        async def let_go() -> bool:
            return any(
                getattr(r, "action", "") == "worker.connection_lost"
                and getattr(r, "address", None) == a
                and "not reconnecting" in r.getMessage()
                for r in caplog.records
            )

        await wait_until_async(let_go, what="the Worker stopped trying node A")
        assert await workers_on(b) == [worker.id]
        client = await stack.enter_async_context(dex.Client(b, timeout=15))
        session = await client.create_session("helper")
        for n in range(3):  # meanwhile a Worker that tried A again would log each try
            turn = await client.send_message(session["id"], f"add {n} 2", wait=True)
            assert turn["status"] == "completed"
        tries = [r for r in caplog.records if getattr(r, "action", "") == "worker.connect_failed"]
        assert tries == []


async def test_while_no_node_is_connected_the_worker_keeps_every_member(
    tmp_path: Path, members: Members
) -> None:
    """Both nodes down at once: no node says who left, so the Worker keeps trying both,
    and reaches B again when it comes back though the seed (A) stays down."""
    a, b = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    port_a, port_b = int(a.split(":")[-1]), int(b.split(":")[-1])
    members.listed[:] = [a, b]
    async with AsyncExitStack() as stack:
        node_a, node_b = AsyncExitStack(), AsyncExitStack()
        await node_a.enter_async_context(run_server(tmp_path / "a", port=port_a))
        await node_b.enter_async_context(run_server(tmp_path / "b", port=port_b))
        worker = await stack.enter_async_context(dex.Worker([HELPER], a, FAST_WORKER))

        async def on_b() -> bool:
            return await workers_on(b) == [worker.id]

        await wait_until_async(on_b, what="the Worker connected to node B")
        await asyncio.gather(node_a.aclose(), node_b.aclose())

        async def down() -> bool:
            return not worker._cluster.linked

        await wait_until_async(down, what="both connections down")
        await stack.enter_async_context(run_server(tmp_path / "b", port=port_b))
        await wait_until_async(on_b, what="the Worker reconnected to node B")
