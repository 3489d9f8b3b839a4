"""The cluster's promises at the level of the lease and the fence, against a real
PostgreSQL: two nodes never both write one partition, a node that handed one partition
over keeps writing its others, membership as each ping reads it, and the partition count
a database keeps.

A node here is a ``Lease`` and a ``PostgresStore`` in this process (each with its own
connections, which is all PostgreSQL sees of a node); its store's ``fence`` is the dict
of the partitions it owns, as ``Node`` wires it (``cluster.epochs``), and handing a
partition over is what ``Node._hand_over`` does: drop it from the fence, then ``give``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import psycopg
import pytest

from dex.errors import CommitUnknown, Fenced, StorageError, Unavailable
from dex.server.ha.cluster import Member, View
from dex.server.ha.lease import Lease
from dex.server.records import write
from dex.server.store.postgres import PARTITION_LOCKS, PostgresStore
from dex.server.store.sql import Statement, statements
from dex.testing.wait import wait_until_async
from tests.support.cluster import (
    idle,
    ids_in,
    lock_holders,
    open_store,
    own,
    partition_row,
    session_ids,
    take_when_free,
    terminate,
)

P, Q = 5, 9


@pytest.fixture
async def url(postgres_url: str) -> AsyncIterator[str]:
    """An empty database with Dex's schema (64 partitions at epoch 0), and a ledger."""
    store = PostgresStore(postgres_url)
    await store.open()
    await store.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE ledger (n BIGSERIAL PRIMARY KEY, node TEXT NOT NULL, "
            "session_id TEXT NOT NULL, epoch BIGINT NOT NULL)"
        )
    yield postgres_url


@pytest.fixture
async def leases(url: str) -> AsyncIterator[list[Lease]]:
    made: list[Lease] = []
    yield made
    for lease in made:
        await lease.release()


@pytest.fixture
async def stores(url: str) -> AsyncIterator[list[PostgresStore]]:
    made: list[PostgresStore] = []
    yield made
    for store in made:
        await store.close()


RECORD = (
    "INSERT INTO ledger (node, session_id, epoch) "
    "SELECT ?, ?, epoch FROM dex_partitions WHERE id = ?"
)
"""Inside a write's transaction: which node wrote, and the partition's epoch its statement
read. Its ``n`` comes from a sequence, drawn in the transaction after the fence check."""


def recorded(node: str, session_id: str, partition: int) -> list[Statement]:
    """A session's creation, and its line in the ledger, as one write."""
    return [
        *statements(write(session=idle(session_id), create=True)),
        (RECORD, [(node, session_id, partition)]),
    ]


def ledger(url: str) -> list[tuple[int, str, str, int]]:
    """(n, node, session id, epoch) of every write committed, in ``n`` order."""
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT n, node, session_id, epoch FROM ledger ORDER BY n").fetchall()
    return [(int(n), str(node), str(sid), int(epoch)) for n, node, sid, epoch in rows]


@dataclass
class Writers:
    """A node's writers: each writes new sessions of one partition, one after another,
    until ``stop``; every attempt's outcome is kept (None: acknowledged)."""

    node: str
    store: PostgresStore
    partition: int
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    outcomes: dict[str, BaseException | None] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    """Session ids in the order their outcomes came, across writers."""

    def acknowledged(self) -> set[str]:
        return {sid for sid, e in self.outcomes.items() if e is None}

    async def run(self, n: int, after_refusal: bool = True) -> None:
        for session_id in ids_in(self.partition, f"{self.node}{n:02}-"):
            if self.stop.is_set():
                return
            future = self.store._commit_write(
                recorded(self.node, session_id, self.partition), session_id
            )
            try:
                await future
                self.outcomes[session_id] = None
            except (StorageError, Unavailable) as e:  # Fenced, CommitUnknown, Unavailable
                self.outcomes[session_id] = e
            self.order.append(session_id)
            if self.outcomes[session_id] is not None and not after_refusal:
                return


@pytest.mark.parametrize("how", ["killed", "given"])
async def test_two_nodes_racing_for_one_partition_never_both_write_it(
    url: str, leases: list[Lease], stores: list[PostgresStore], how: str
) -> None:
    """A owns P and writes it with 16 writers; B takes P (A's lock session killed, or A
    gives P while its store still writes to it: a node that hands over without draining)
    and writes it with 16 writers, while A's keep trying. From the database: every write
    of A committed before every write of B, each with its own node's epoch; A's writes
    after the takeover were refused; every write either committed or raised."""
    a_lease, b_lease = Lease(url, "a"), Lease(url, "b")
    leases += [a_lease, b_lease]
    a = Writers("a", await open_store(url, stores, await own(a_lease, [P])), P)
    a_tasks = [asyncio.create_task(a.run(n)) for n in range(16)]
    await wait_until_async(
        lambda: asyncio.sleep(0, len(a.acknowledged()) >= 200), 20, what="A's writes flow"
    )
    await b_lease.join()

    contender = asyncio.create_task(take_when_free(b_lease, P))
    if how == "killed":
        terminate(url, a_lease.backend_pid)
    else:
        a_lease.give([P])
    epoch = await asyncio.wait_for(contender, 10)
    assert epoch == 2
    b = Writers("b", await open_store(url, stores, {P: epoch}), P)
    attempts_before_b = len(a.order)
    b_tasks = [asyncio.create_task(b.run(n, after_refusal=False)) for n in range(16)]
    await wait_until_async(
        lambda: asyncio.sleep(0, len(b.acknowledged()) >= 200), 20, what="B's writes flow"
    )
    a.stop.set()
    b.stop.set()
    await asyncio.wait_for(asyncio.gather(*a_tasks, *b_tasks), 20)

    rows = ledger(url)
    a_rows = [r for r in rows if r[1] == "a"]
    b_rows = [r for r in rows if r[1] == "b"]
    assert len(a_rows) >= 200 and len(b_rows) >= 200
    assert {r[3] for r in a_rows} == {1} and {r[3] for r in b_rows} == {2}
    assert max(r[0] for r in a_rows) < min(r[0] for r in b_rows), "A wrote after B began"
    # A kept trying while B wrote, and every one of those attempts was refused
    assert len(a.order) - attempts_before_b >= 16
    first_refused = next(i for i, sid in enumerate(a.order) if a.outcomes[sid] is not None)
    late = [a.outcomes[sid] for sid in a.order[first_refused:]]
    assert all(isinstance(e, Fenced | Unavailable | CommitUnknown) for e in late), late
    assert any(isinstance(e, Fenced) for e in late)
    assert all(e is None for e in b.outcomes.values())
    # nothing lost silently: the acknowledged are stored, the stored were acknowledged
    # (or their commit was unknown to their node, which then steps down)
    a_stored = {r[2] for r in a_rows}
    unknown = {sid for sid, e in a.outcomes.items() if isinstance(e, CommitUnknown)}
    assert a.acknowledged() <= a_stored <= a.acknowledged() | unknown
    assert {r[2] for r in b_rows} == b.acknowledged()
    assert session_ids(url) == a_stored | b.acknowledged()


async def test_a_partition_handed_over_is_refused_alone_and_the_node_keeps_the_rest(
    url: str, leases: list[Lease], stores: list[PostgresStore]
) -> None:
    """A owns P and Q and hands Q over; B takes Q. A still writes to P, A's writes to Q
    are refused with Unavailable (a routing answer: try the other node), not Fenced, and
    nothing tells A to step down."""
    a_lease, b_lease = Lease(url, "a"), Lease(url, "b")
    leases += [a_lease, b_lease]
    a = await open_store(url, stores, await own(a_lease, [P, Q]))
    fatal: list[StorageError] = []
    a.on_fatal = fatal.append
    in_p, in_q = ids_in(P, "p"), ids_in(Q, "q")
    await a.write(write(session=idle(next(in_p)), create=True))
    await a.write(write(session=idle(next(in_q)), create=True))

    assert a.fence is not None
    del a.fence[Q]  # as Node._hand_over does: stop writing to it, then free its lock
    a_lease.give([Q])
    await b_lease.join()
    assert await asyncio.wait_for(take_when_free(b_lease, Q), 5) == 2
    b = await open_store(url, stores, {Q: 2})

    for _ in range(5):
        await a.write(write(session=idle(next(in_p)), create=True))
    with pytest.raises(Unavailable):
        await a.write(write(session=idle(next(in_q)), create=True))
    await b.write(write(session=idle(next(in_q)), create=True))
    await a.write(write(session=idle(next(in_p)), create=True))

    assert fatal == []
    assert a_lease.valid() and not a_lease.lost.is_set()
    assert partition_row(url, P) == (1, "a") and partition_row(url, Q) == (2, "b")
    assert lock_holders(url, PARTITION_LOCKS, P) == [a_lease.backend_pid]
    assert lock_holders(url, PARTITION_LOCKS, Q) == [b_lease.backend_pid]
    stored = session_ids(url)
    assert len({s for s in stored if s.startswith("p")}) == 7
    assert len({s for s in stored if s.startswith("q")}) == 2  # A's first, B's


async def test_a_batch_to_an_owned_and_a_handed_over_partition_commits_the_owned_ones(
    url: str, leases: list[Lease], stores: list[PostgresStore]
) -> None:
    """Writes to P and Q queued in one batch, and Q handed over before the batch is sent:
    P's writes commit, in that one batch; Q's are refused alone, with Unavailable."""
    lease = Lease(url, "a")
    leases.append(lease)
    store = await open_store(url, stores, await own(lease, [P, Q]))
    fatal: list[StorageError] = []
    store.on_fatal = fatal.append
    to_p, to_q = ids_in(P, "p"), ids_in(Q, "q")
    ids = [next(ids) for _ in range(4) for ids in (to_p, to_q)]
    commits = store.counters().commits

    queued = [store.submit(write(session=idle(sid), create=True)) for sid in ids]
    assert store.fence is not None
    del store.fence[Q]  # the writer task has not run yet: the batch forms without Q
    results = await asyncio.gather(*queued, return_exceptions=True)

    outcome = dict(zip(ids, results, strict=True))
    assert [outcome[s] for s in ids if s.startswith("p")] == [None] * 4
    assert all(isinstance(outcome[s], Unavailable) for s in ids if s.startswith("q")), outcome
    assert store.counters().commits == commits + 1
    assert session_ids(url) == {s for s in ids if s.startswith("p")}
    assert fatal == []
    # and a write to Q from here on is refused at once, alone
    with pytest.raises(Unavailable):
        await store.write(write(session=idle(next(to_q)), create=True))
    await store.write(write(session=idle(next(to_p)), create=True))


@dataclass
class Watched:
    """A lease and every view its pings read."""

    lease: Lease
    views: list[View] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.lease.on_view = self.views.append


def members_of(view: View) -> dict[str, tuple[str, bool, tuple[int, ...]]]:
    return {m.node_id: (m.address, m.standby, m.partitions) for m in view.members.values()}


THREE = {
    "a": ("http://a:7070", False, (0, 1)),
    "b": ("http://b:7070", False, (2,)),
    "c": ("http://c:7070", True, (3,)),
}


@pytest.mark.parametrize("how", ["released", "killed"])
async def test_each_view_lists_the_live_members_and_drops_one_that_goes_within_a_second(
    url: str, leases: list[Lease], how: str
) -> None:
    nodes = {
        name: Watched(Lease(url, name, address=address, standby=standby))
        for name, (address, standby, _) in THREE.items()
    }
    leases += [w.lease for w in nodes.values()]
    for w in nodes.values():
        await w.lease.join()
    assert await own(nodes["a"].lease, [0, 1]) == {0: 1, 1: 1}
    assert await own(nodes["b"].lease, [2]) == {2: 1}
    assert await own(nodes["c"].lease, [3]) == {3: 1}
    nodes["c"].lease.lead()  # a standby standing in: it holds the standby's lock

    def settled(w: Watched) -> bool:
        return bool(w.views) and w.views[-1].leader == "c"

    await wait_until_async(
        lambda: asyncio.sleep(0, all(settled(w) for w in nodes.values())), 5, what="views"
    )
    seen = {name: len(w.views) for name, w in nodes.items()}
    await wait_until_async(  # three more pings each
        lambda: asyncio.sleep(0, all(len(w.views) >= seen[n] + 3 for n, w in nodes.items())),
        5,
        what="three pings",
    )
    for name, w in nodes.items():
        for view in w.views[seen[name] - 1 :]:
            assert members_of(view) == THREE, name
            assert view.owners == {0: "a", 1: "a", 2: "b", 3: "c"}, name
            assert view.leader == "c"
            assert view.members[name] == Member(name, *THREE[name], here=True)

    gone = nodes.pop("c")
    began = time.monotonic()
    if how == "released":
        await gone.lease.release()
    else:
        terminate(url, gone.lease.backend_pid)

    def dropped(w: Watched) -> bool:
        return bool(w.views) and "c" not in w.views[-1].members

    await wait_until_async(
        lambda: asyncio.sleep(0, all(dropped(w) for w in nodes.values())), 1.0, what="c gone"
    )
    assert time.monotonic() - began < 1.0
    for name, w in nodes.items():
        view = w.views[-1]
        assert members_of(view) == {n: THREE[n] for n in ("a", "b")}, name
        assert view.owners == {0: "a", 1: "a", 2: "b"}, name  # 3 is free
        assert view.leader is None


def partition_ids(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        return [int(r[0]) for r in conn.execute("SELECT id FROM dex_partitions ORDER BY id")]


async def test_the_partition_count_is_chosen_when_the_database_is_created_and_kept(
    postgres_url: str,
) -> None:
    first = PostgresStore(postgres_url, partitions=8)
    await first.open()
    await first.close()
    assert first.partition_count == 8
    assert partition_ids(postgres_url) == list(range(8))

    later = PostgresStore(postgres_url, partitions=64)
    await later.open()
    await later.close()

    assert later.partition_count == 8  # what the database has, not what was asked
    assert partition_ids(postgres_url) == list(range(8))
