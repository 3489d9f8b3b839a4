"""Helpers for the tests of a cluster's lease and fence on PostgreSQL: sessions of a chosen
partition, who holds a partition's locks (``pg_locks``), its epoch (``dex_partitions``),
and taking a partition as soon as it is free."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator

import psycopg

from dex.server.engine.state import SessionState
from dex.server.ha.lease import Lease
from dex.server.store.partitions import DEFAULT_PARTITIONS, partition_of
from dex.server.store.postgres import PostgresStore
from dex.testing.wait import wait_until_async


def ids_in(partition: int, prefix: str = "s", count: int = DEFAULT_PARTITIONS) -> Iterator[str]:
    """Session ids ``{prefix}0``, ``{prefix}1``, ... that fall in ``partition`` (of
    ``count``), in that order."""
    for i in itertools.count():
        session_id = f"{prefix}{i}"
        if partition_of(session_id, count) == partition:
            yield session_id


def id_in(partition: int, prefix: str = "s", count: int = DEFAULT_PARTITIONS) -> str:
    """The first session id ``{prefix}N`` in ``partition``."""
    return next(ids_in(partition, prefix, count))


def idle(session_id: str) -> SessionState:
    return SessionState(id=session_id, agent="helper", created_at=1.0)


def lock_holders(url: str, space: int, partition: int) -> list[int]:
    """The backends holding the advisory lock ``(space, partition)`` of this database
    (``PARTITION_LOCKS`` or ``FENCE_LOCKS``: a two-int key, ``objsubid`` 2; other databases
    on the server, other tests' or benchmarks', have their own lock under the same key)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database() "
            "AND l.objsubid = 2 AND l.classid::bigint = %s AND l.objid::bigint = %s",
            (space, partition),
        ).fetchall()
    return sorted(int(r[0]) for r in rows)


def partition_row(url: str, partition: int) -> tuple[int, str]:
    """The partition's epoch and the node that last took it."""
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT epoch, owner FROM dex_partitions WHERE id = %s", (partition,)
        ).fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def session_ids(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {str(r[0]) for r in conn.execute("SELECT id FROM sessions").fetchall()}


def terminate(url: str, pid: int | None) -> None:
    """End a backend as an operator would (``pg_terminate_backend``)."""
    assert pid is not None
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def take_when_free(lease: Lease, partition: int, timeout: float = 10.0) -> int:
    """Ask for ``partition`` until the lease gets it (another node's lock is freed when its
    session ends); its new epoch."""

    async def taken() -> int | None:
        return (await lease.take_now([partition]))[partition]

    epoch = await wait_until_async(taken, timeout, interval=0.02, what=f"partition {partition}")
    assert epoch is not None
    return epoch


async def open_store(url: str, stores: list[PostgresStore], fence: dict[int, int]) -> PostgresStore:
    """An open store that writes with ``fence`` (partition -> epoch), as a node's does."""
    store = PostgresStore(url)
    await store.open()
    store.fence = fence
    stores.append(store)
    return store


async def settle(future: asyncio.Future[None]) -> BaseException | None:
    """A write's outcome: None (committed) or what it raised."""
    try:
        await future
    except Exception as e:
        return e
    return None


async def own(lease: Lease, partitions: list[int]) -> dict[int, int]:
    """Take ``partitions``, which must be free: each one's new epoch (a store's fence)."""
    answers = await lease.take_now(partitions)
    epochs = {p: e for p, e in answers.items() if e is not None}
    assert len(epochs) == len(answers), f"not free: {answers}"
    return epochs
