"""A node giving partitions up (a hand-over when another node joins, or its own drain)
lets the attempts it handed out finish first, including one whose hand-out was recorded
in a commit still in flight when the hand-over began: it is not held yet, but it is on
its way to a Worker, and once the partition is given up its result can no longer be
committed (the next owner would fail it as cut off, NOT_COMPLETED: for a single-attempt
tool, an outcome nobody knows). Once a drain freed the partitions, the node writes
nothing to them: a call still on its way is refused, not fenced.

One node in this process (on SQLite, one partition; or on PostgreSQL), its cluster
bookkeeping and lease stood in for (``Node`` acts on them as on PostgreSQL), and a
Worker connection that records what it is sent. The store holds the commit of the
message that hands the Step out until the test lets it go.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from dex.errors import StorageError, Unavailable
from dex.server.dispatch.dispatcher import Dispatcher, WorkerConn
from dex.server.ha.cluster import Cluster
from dex.server.ha.node import Node
from dex.server.sessions import Sessions
from dex.server.store.base import Write
from dex.server.store.postgres import PostgresStore
from dex.server.store.sqlite import SqliteStore
from dex.testing import wait_until_async
from dex.wire import ModelResponse, server_frames
from dex.wire.server_frames import ServerMessage
from tests.integration.conftest import AGENT


class HeldStore(SqliteStore):
    """Commits each write only once ``gate`` is set, while it is given (None: at once)."""

    gate: asyncio.Event | None = None
    held = 0
    """Writes given while the gate was closed."""

    def submit(self, write: Write) -> asyncio.Future[None]:
        gate = self.gate
        if gate is None or gate.is_set():
            return super().submit(write)
        self.held += 1
        submit = super().submit

        async def later() -> None:
            await gate.wait()
            await submit(write)

        return asyncio.ensure_future(later())


@dataclass
class StandInLease:
    """What ``Node`` asks of its lease when it gives partitions up or stops."""

    given: list[list[int]] = field(default_factory=list)
    released: bool = False
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    def give(self, partitions: list[int]) -> None:
        self.given.append(partitions)

    async def release(self) -> None:
        self.released = True

    def valid(self) -> bool:
        return not self.released


@dataclass
class Rig:
    store: SqliteStore | PostgresStore
    sessions: Sessions
    node: Node
    lease: StandInLease
    cluster: Cluster
    sent: list[ServerMessage]

    def steps(self) -> list[server_frames.Step]:
        return [m for m in self.sent if isinstance(m, server_frames.Step)]

    def gave_up(self) -> bool:
        """The partition was given up (a hand-over) or the lease released (a drain)."""
        return bool(self.lease.given) or self.lease.released


async def start(store: SqliteStore | PostgresStore, epochs: dict[int, int]) -> Rig:
    """A node on ``store`` that owns the partitions in ``epochs`` (taken with those epochs),
    with a Worker connected."""
    dispatcher = Dispatcher(heartbeat_timeout=30)
    sessions = Sessions(store, dispatcher)
    lease = StandInLease()
    node = Node(store, dispatcher, sessions, lease)  # type: ignore[arg-type]
    cluster = Cluster("a", store.partition_count, standby=False)
    cluster.serving.update(epochs)
    cluster.epochs.update(epochs)
    store.fence = cluster.epochs  # as Node._join wires them
    node.cluster = cluster
    node.role = "active"
    dispatcher.dispatches = cluster.dispatches
    await sessions.register_agents([AGENT])
    attempts = sessions.attempts
    dispatcher.start(attempts.assign, attempts.expire, sessions.fire_timer)
    sent: list[ServerMessage] = []
    worker = WorkerConn(id="w", queues={f"model:{AGENT.name}"}, capacity=4, send=sent.append)
    dispatcher.connect(worker, [], None)
    return Rig(store, sessions, node, lease, cluster, sent)


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    store = HeldStore(tmp_path / "dex.sqlite3")
    await store.open()
    started = await start(store, {0: 1})
    try:
        yield started
    finally:
        await started.node.dispatcher.stop()
        await store.close()


@pytest.mark.parametrize("how", ["hand-over", "drain"])
async def test_a_step_handed_out_in_a_commit_in_flight_finishes_before_the_partition_goes(
    rig: Rig, how: str
) -> None:
    store = rig.store
    assert isinstance(store, HeldStore)
    await rig.sessions.create(AGENT.name, "s1")
    gate = store.gate = asyncio.Event()
    # the message's commit hands its RunModel to the free Worker, and is held in flight
    sending = asyncio.ensure_future(rig.sessions.send("s1", "hi", None))
    await wait_until_async(lambda: _now(store.held == 1), what="the commit in flight")

    async def leave() -> None:
        if how == "hand-over":  # as Node._on_view gives a partition up
            rig.cluster.serving.discard(0)
            rig.cluster.draining.add(0)
            await rig.node._hand_over({0})
        else:
            await rig.node.drain(timeout=20)

    leaving = asyncio.ensure_future(leave())
    done, _ = await asyncio.wait([leaving], timeout=0.5)
    assert not done and not rig.gave_up(), "it gave the partition up with a hand-out in flight"

    gate.set()
    sent, created = await sending
    assert (sent.turn, created) == (1, True)
    await wait_until_async(lambda: _now(bool(rig.steps())), what="the Step sent to the Worker")
    (step,) = rig.steps()
    assert not rig.gave_up()  # its attempt runs: the node waits for it

    response = ModelResponse(text="echo: hi").model_dump(mode="json")
    await rig.sessions.attempts.complete(step.attempt_id, response)
    await asyncio.wait_for(leaving, 10)
    assert rig.gave_up()
    stored = await store.load_turn("s1", 1)  # the turn ended, its one attempt succeeded
    assert stored is not None and json.loads(stored.turn)["status"] == "completed"
    (run_model,) = [json.loads(raw) for raw in stored.steps]
    assert [(a["number"], a["outcome"]) for a in run_model["attempts"]] == [(1, "succeeded")]


async def _now(value: bool) -> bool:
    return value


async def test_a_call_that_reaches_its_commit_after_a_drain_is_refused_and_writes_nothing(
    postgres_url: str,
) -> None:
    """A call the node took before it stopped may reach its commit after the drain freed
    the partitions, and after another node took them: it is refused (503, its client asks
    the next owner), and the node, which owns nothing any more, has no write fenced (which
    would make it step down, exiting with status 4 instead of 0)."""
    store = PostgresStore(postgres_url)
    await store.open()
    fatal: list[StorageError] = []
    store.on_fatal = fatal.append
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT id, epoch FROM dex_partitions").fetchall()
    rig = await start(store, {int(p): int(epoch) for p, epoch in rows})
    try:
        await rig.sessions.create(AGENT.name, "s1")

        assert await rig.node.drain(timeout=5) == 0
        assert rig.lease.released
        with psycopg.connect(postgres_url) as conn:  # another node takes every partition
            conn.execute("UPDATE dex_partitions SET epoch = epoch + 1")
        with pytest.raises(Unavailable):  # the call's send, as the route runs it
            await rig.sessions.send("s1", "late", "m1")

        assert fatal == []
        stored = await store.load_session("s1")
        assert stored is not None and json.loads(stored.state)["messages_received"] == 0
    finally:
        await rig.node.dispatcher.stop()
        await store.close()
