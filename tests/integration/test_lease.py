"""The lease and the fence against a real PostgreSQL (skipped only when it is unreachable),
one partition at a time.

Two nodes here are two ``Lease`` objects (and their stores) in one process: each has its
own connections, which is all PostgreSQL sees of a node. Each test works on partition
``P`` of the 64 a new database has, with sessions whose ids fall in it (``id_in``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import psycopg
import pytest

from dex.errors import CommitUnknown, Fenced, StorageError
from dex.server.ha.lease import Lease, LeaseSettings
from dex.server.records import write
from dex.server.store.postgres import FENCE_LOCKS, PARTITION_LOCKS, PostgresStore
from dex.server.store.sql import statements
from dex.testing.proxy import TcpProxy
from dex.testing.wait import wait_until_async
from tests.support.cluster import (
    id_in,
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

P = 5
"""The partition these tests contend for (any of the 64 would do)."""


@pytest.fixture
async def url(postgres_url: str) -> AsyncIterator[str]:
    """An empty database with Dex's schema (64 partitions at epoch 0)."""
    store = PostgresStore(postgres_url)
    await store.open()
    await store.close()
    yield postgres_url


@pytest.fixture
async def leases(url: str) -> AsyncIterator[list[Lease]]:
    """Leases a test makes; released at the end."""
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


def owners(url: str, partition: int = P) -> list[int]:
    """The backends holding the partition's lock (a node's lock connection)."""
    return lock_holders(url, PARTITION_LOCKS, partition)


def in_batch(url: str, partition: int = P) -> list[int]:
    """The backends whose write batches hold the partition's fence lock (shared)."""
    return lock_holders(url, FENCE_LOCKS, partition)


def ended_sessions(caplog: pytest.LogCaptureFixture) -> int:
    """How many sessions a bump ended because they held the fence lock (from the log)."""
    return sum(getattr(r, "action", None) == "lease.fence_holder_ended" for r in caplog.records)


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): state ``T`` in ``/proc/PID/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def lease_threads(holder: str) -> list[threading.Thread]:
    """The threads that own a lease's lock connection (each closes it before it ends)."""
    return [t for t in threading.enumerate() if t.name == f"dex-lease {holder}"]


FAST = LeaseSettings(ping_interval=0.1, ping_timeout=0.5, session_timeout=1.5, margin=0.5)
"""A lease that runs out after 1 s without a ping (``valid_for``), and whose session
PostgreSQL ends after 1.5 s of silence."""


def spin(seconds: float) -> None:
    """Keep the calling thread computing for ``seconds``: called on the event loop, it runs
    nothing else meanwhile (a node recovering on a starved machine), yet Python hands the
    GIL to other threads every few milliseconds."""
    end = time.monotonic() + seconds
    total = 0
    while time.monotonic() < end:
        total += sum(range(1000))


async def test_of_two_contenders_exactly_one_wins(url: str, leases: list[Lease]) -> None:
    a, b = Lease(url, "a"), Lease(url, "b")
    leases += [a, b]

    answers = await asyncio.wait_for(asyncio.gather(a.take_now([P]), b.take_now([P])), 10)

    assert sorted(answers, key=lambda got: got[P] is None) == [{P: 1}, {P: None}]
    winner, loser = (a, b) if answers[0][P] == 1 else (b, a)
    assert partition_row(url, P) == (1, winner.holder)
    assert owners(url) == [winner.backend_pid]
    assert winner.valid()
    # the other is refused each time it asks while the winner holds the lock (for 1.5 s),
    # and its asking bumps nothing
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:
        assert await loser.take_now([P]) == {P: None}
        await asyncio.sleep(0.1)
    assert winner.valid() and not winner.lost.is_set()
    assert partition_row(url, P) == (1, winner.holder)
    assert owners(url) == [winner.backend_pid]
    # the loser leaves: its lock thread closes its connection; the winner's pings on
    await loser.release()
    await wait_until_async(
        lambda: asyncio.sleep(0, not lease_threads(loser.holder)), 5, what="the thread ends"
    )
    assert lease_threads(winner.holder)
    assert owners(url) == [winner.backend_pid]


async def test_killing_the_holders_session_lets_the_other_win_with_a_higher_epoch(
    url: str, leases: list[Lease]
) -> None:
    holder, standby = Lease(url, "holder"), Lease(url, "standby")
    leases += [holder, standby]
    assert await holder.take_now([P]) == {P: 1}
    await standby.join()
    contender = asyncio.create_task(take_when_free(standby, P))

    killed = time.monotonic()
    terminate(url, holder.backend_pid)

    assert await asyncio.wait_for(contender, 5) == 2
    took = time.monotonic() - killed
    assert took < 2.0, f"the standby took {took:.2f}s"
    assert partition_row(url, P) == (2, "standby")
    assert owners(url) == [standby.backend_pid]
    await asyncio.wait_for(holder.lost.wait(), 2)  # the old holder notices by its ping
    assert not holder.valid()


async def test_release_frees_the_lock_at_once(url: str, leases: list[Lease]) -> None:
    holder, standby = Lease(url, "holder"), Lease(url, "standby")
    leases += [holder, standby]
    await holder.take_now([P])
    await standby.join()
    contender = asyncio.create_task(take_when_free(standby, P))

    released = time.monotonic()
    await holder.release()

    assert not holder.valid()
    assert await asyncio.wait_for(contender, 5) == 2
    assert time.monotonic() - released < 1.0  # no session timeout waited for
    assert not holder.lost.is_set()  # a planned release is not a loss


async def test_giving_a_partition_frees_its_lock_and_keeps_the_rest(
    url: str, leases: list[Lease]
) -> None:
    """A hand-over frees one partition's lock; the node keeps its others, and its lease."""
    holder, other = Lease(url, "holder"), Lease(url, "other")
    leases += [holder, other]
    assert await holder.take_now([P, P + 1]) == {P: 1, P + 1: 1}
    await other.join()

    holder.give([P])

    assert await asyncio.wait_for(take_when_free(other, P), 5) == 2
    assert owners(url, P) == [other.backend_pid]
    assert owners(url, P + 1) == [holder.backend_pid]
    assert await other.take_now([P + 1]) == {P + 1: None}
    assert partition_row(url, P + 1) == (1, "holder")
    assert holder.valid() and not holder.lost.is_set()


async def test_valid_until_is_kept_fresh_by_pings_and_shorter_than_a_takeover(
    url: str, leases: list[Lease]
) -> None:
    lease = Lease(url, "a")
    leases.append(lease)
    before = time.monotonic()
    await lease.join()
    first = lease.valid_until
    assert before < first <= time.monotonic() + lease.settings.valid_for
    assert lease.settings.valid_for < lease.settings.session_timeout

    await wait_until_async(
        lambda: asyncio.sleep(0, lease.valid_until > first + 0.4), 5, what="pings refresh it"
    )
    assert lease.valid()


async def test_a_holder_whose_event_loop_is_busy_keeps_the_lease(
    url: str, leases: list[Lease]
) -> None:
    """Slow is not dead: the lock connection's pings do not wait for the event loop."""
    lease = Lease(url, "busy", settings=FAST)
    leases.append(lease)
    assert await lease.take_now([P]) == {P: 1}
    pid = lease.backend_pid

    spin(2.5 * FAST.valid_for)  # longer than valid_for, and than the session timeout

    assert lease.valid(), "the lease ran out while the event loop was busy"
    after = time.monotonic()
    # the loop runs again (its watchdog too), and pings sent since keep the lease fresh
    await wait_until_async(
        lambda: asyncio.sleep(0, lease.valid_until > after + FAST.valid_for),
        5,
        what="a ping sent after the busy stretch",
    )
    assert lease.valid() and not lease.lost.is_set()
    assert owners(url) == [pid]  # the same session held the lock all along
    assert partition_row(url, P) == (1, "busy")


async def test_a_holder_cut_off_from_the_database_loses_the_lease_before_a_standby_wins(
    url: str, leases: list[Lease]
) -> None:
    """A silent database (a partition: nothing passes, nothing is closed): the ping hangs
    in the driver, the watchdog loses the lease within ``valid_for``, before PostgreSQL
    ends the silent session and a standby can take its partition; and ``release()`` does
    not hang."""
    db = urlsplit(url)
    assert db.hostname is not None and db.port is not None
    with TcpProxy(db.hostname, db.port).in_thread() as proxy:
        holder = Lease(url.replace(f":{db.port}/", f":{proxy.port}/"), "cut", settings=FAST)
        standby = Lease(url, "standby", settings=FAST)
        leases += [holder, standby]
        assert await holder.take_now([P]) == {P: 1}
        await standby.join()
        contender = asyncio.create_task(take_when_free(standby, P))

        proxy.cut()
        cut = time.monotonic()
        await asyncio.wait_for(holder.lost.wait(), 5)
        lost_after = time.monotonic() - cut

        assert not holder.valid()
        assert lost_after < FAST.valid_for + 0.3, lost_after  # the watchdog looks every 0.1 s
        assert not contender.done()  # the standby cannot win before the session ends
        assert await asyncio.wait_for(contender, 5) == 2
        assert FAST.valid_for < time.monotonic() - cut

        released = time.monotonic()
        await holder.release()  # its lock thread is still stuck in the ping
        assert time.monotonic() - released < FAST.ping_timeout + 0.5


async def test_a_store_with_a_stale_epoch_is_fenced_and_writes_nothing(
    url: str, leases: list[Lease], stores: list[PostgresStore]
) -> None:
    old_lease, new_lease = Lease(url, "old"), Lease(url, "new")
    leases += [old_lease, new_lease]
    old = await open_store(url, stores, await own(old_lease, [P]))
    before, after = id_in(P, "before"), id_in(P, "after")
    await old.write(write(session=idle(before), create=True))
    await new_lease.join()
    contender = asyncio.create_task(take_when_free(new_lease, P))
    terminate(url, old_lease.backend_pid)
    new = await open_store(url, stores, {P: await asyncio.wait_for(contender, 5)})

    late = ids_in(P, "late")
    with pytest.raises(Fenced, match="epoch"):
        await old.write(write(session=idle(next(late)), create=True))
    # a batch of several writes is refused whole
    results = await asyncio.gather(
        *(old.write(write(session=idle(next(late)), create=True)) for _ in range(8)),
        return_exceptions=True,
    )
    assert all(isinstance(r, Fenced) for r in results), results

    await new.write(write(session=idle(after), create=True))
    assert session_ids(url) == {before, after}


async def test_sixteen_writers_across_a_takeover_never_commit_with_the_old_epoch(
    url: str, leases: list[Lease], stores: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    old_lease, new_lease = Lease(url, "old"), Lease(url, "new")
    leases += [old_lease, new_lease]
    old = await open_store(url, stores, await own(old_lease, [P]))
    acknowledged: list[str] = []

    async def writer(n: int) -> str:
        for session_id in ids_in(P, f"w{n:02}-"):
            try:
                await old.write(write(session=idle(session_id), create=True))
            except Fenced:
                return "fenced"
            acknowledged.append(session_id)
        return "never fenced"

    await new_lease.join()
    writers = [asyncio.create_task(writer(n)) for n in range(16)]
    await wait_until_async(
        lambda: asyncio.sleep(0, len(acknowledged) >= 200), 20, what="writes flow"
    )
    contender = asyncio.create_task(take_when_free(new_lease, P))
    terminate(url, old_lease.backend_pid)  # the old node's writers keep going
    assert await asyncio.wait_for(contender, 5) == 2
    # Everything the old epoch committed is in by now: the bump waited for batches in flight.
    at_takeover = session_ids(url)

    outcomes = await asyncio.wait_for(asyncio.gather(*writers), 20)

    assert outcomes == ["fenced"] * 16
    assert session_ids(url) == at_takeover  # nothing committed after the takeover
    assert set(acknowledged) == at_takeover  # and every acknowledged write is there
    assert len(at_takeover) >= 200
    assert ended_sessions(caplog) == 0  # batches that end by themselves are waited for


HOLDER = """
import asyncio, sys
from dex.server.ha.lease import Lease

async def main() -> None:
    lease = Lease(sys.argv[1], "paused")
    partition = int(sys.argv[2])
    print("epoch", (await lease.take_now([partition]))[partition], flush=True)
    await lease.lost.wait()
    print("lost", flush=True)

asyncio.run(main())
"""


async def test_a_paused_holder_loses_the_lock_after_its_session_timeout_and_notices(
    url: str, leases: list[Lease]
) -> None:
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, url, str(P), stdout=asyncio.subprocess.PIPE
    )
    assert holder.stdout is not None
    try:
        line = await asyncio.wait_for(holder.stdout.readline(), 20)
        assert line == b"epoch 1\n"
        standby = Lease(url, "standby")
        leases.append(standby)
        await standby.join()
        assert await standby.take_now([P]) == {P: None}  # held by the running holder

        os.kill(holder.pid, signal.SIGSTOP)  # hung: its sockets stay open, it says nothing
        paused = time.monotonic()
        assert await take_when_free(standby, P, 10) == 2
        took = time.monotonic() - paused

        # Not before the paused holder's valid_until ran out (it could not tell), and
        # within its session timeout plus a ping and a retry.
        settings = standby.settings
        assert settings.valid_for < took < settings.session_timeout + 1.5, took
        assert partition_row(url, P) == (2, "standby")
        os.kill(holder.pid, signal.SIGCONT)
        line = await asyncio.wait_for(holder.stdout.readline(), 10)
        assert line == b"lost\n"  # its next ping failed: it knows
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


LEADER = """
import asyncio, sys
from dex.server.engine.state import SessionState
from dex.server.ha.lease import Lease
from dex.server.records import write
from dex.server.store.postgres import PostgresStore

def idle(session_id):
    return SessionState(id=session_id, agent="helper", created_at=1.0)

async def main() -> None:
    url, partition, before, paused = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    lease, store = Lease(url, "old"), PostgresStore(url)
    await store.open()
    store.fence = await lease.take_now([partition])
    store.on_fatal = lambda e: lease.lose(e.message)  # as the server wires them
    await store.write(write(session=idle(before), create=True))
    print("epoch", store.fence[partition], flush=True)
    try:
        await store.write(write(session=idle(paused), create=True))  # stopped in it
        print("committed", flush=True)
    except Exception as e:
        print("refused", type(e).__name__, flush=True)
    await asyncio.wait_for(lease.lost.wait(), 10)
    print("lost", flush=True)
    await store.close()
    await lease.release()

asyncio.run(main())
"""


async def test_a_leader_stopped_in_the_middle_of_a_batch_holds_no_takeover_off(
    url: str,
    leases: list[Lease],
    stores: list[PostgresStore],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An owner SIGSTOPped inside a write batch, after its fence check took the
    partition's fence lock shared (a hung VM): another node takes the partition once the
    stopped owner's lease session times out, and its epoch bump ends the batch's session
    instead of waiting for it. The batch rolls back: it was never acknowledged. Resumed,
    the old owner hears of it as a commit it cannot vouch for and loses its lease."""
    before, paused, after = id_in(P, "before"), id_in(P, "paused"), id_in(P, "after")
    leader = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LEADER,
        url,
        str(P),
        before,
        paused,
        stdout=asyncio.subprocess.PIPE,
        env={
            **os.environ,
            "DEX_FAILPOINTS": "store.in_fenced_batch=stop@2",  # the batch of "paused"
            "DEX_FAILPOINT_DIR": str(tmp_path),
        },
    )
    assert leader.stdout is not None
    try:
        assert await asyncio.wait_for(leader.stdout.readline(), 20) == b"epoch 1\n"
        await wait_until_async(
            lambda: asyncio.sleep(0, stopped(leader.pid) and in_batch(url)),
            10,
            what="the owner stopped, holding the fence lock in a batch",
        )
        [batch] = in_batch(url)
        standby = Lease(url, "standby")
        leases.append(standby)
        settings = standby.settings
        await standby.join()

        began = time.monotonic()
        assert await take_when_free(standby, P, 20) == 2
        took = time.monotonic() - began

        # The stopped owner's lease session ends after session_timeout; then the bump
        # waits fence_wait for the batch, ends its session, and goes on.
        assert took < settings.session_timeout + settings.fence_wait + 1.5, took
        assert batch not in in_batch(url)
        assert ended_sessions(caplog) == 1
        assert partition_row(url, P) == (2, "standby")
        new = await open_store(url, stores, {P: 2})
        await new.write(write(session=idle(after), create=True))

        os.kill(leader.pid, signal.SIGCONT)
        rest = await asyncio.wait_for(leader.stdout.read(), 20)
        assert rest == b"refused CommitUnknown\nlost\n"
        assert await asyncio.wait_for(leader.wait(), 10) == 0
        assert session_ids(url) == {before, after}  # the stopped batch never committed
    finally:
        if leader.returncode is None:
            leader.kill()
            await leader.wait()


async def test_a_running_old_owner_whose_batch_outlasts_fence_wait_is_ended_and_steps_down(
    url: str, leases: list[Lease], stores: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    """Slow, not stopped: the old owner lost its lease session (an operator ended it) while
    one of its batches runs a statement that takes a minute. The bump gives the batch
    ``fence_wait``, then ends its session: the batch rolls back, and the old node hears of
    it as a commit it cannot vouch for, loses the lease at once and is fenced after."""
    old_lease, new_lease = Lease(url, "old"), Lease(url, "new")
    leases += [old_lease, new_lease]
    old = await open_store(url, stores, await own(old_lease, [P]))
    fatal: list[StorageError] = []

    def on_fatal(e: StorageError) -> None:  # as the server wires it, and counted
        fatal.append(e)
        old_lease.lose(e.message)

    old.on_fatal = on_fatal
    slow_id = id_in(P, "slow")
    slow = old._commit_write(
        [*statements(write(session=idle(slow_id), create=True)), ("SELECT pg_sleep(60)", [()])],
        slow_id,
    )
    await wait_until_async(lambda: asyncio.sleep(0, in_batch(url)), 5, what="the batch runs")
    await new_lease.join()
    contender = asyncio.create_task(take_when_free(new_lease, P))

    began = time.monotonic()
    terminate(url, old_lease.backend_pid)
    assert await asyncio.wait_for(contender, 10) == 2
    took = time.monotonic() - began

    fence_wait = new_lease.settings.fence_wait
    assert fence_wait <= took < fence_wait + 1.5, took  # it waited for the batch, then ended it
    with pytest.raises(CommitUnknown):
        await asyncio.wait_for(slow, 5)
    assert [type(e) for e in fatal] == [CommitUnknown]
    assert old_lease.lost.is_set() and not old_lease.valid()
    with pytest.raises(Fenced):  # its next batch reconnects and is refused
        await old.write(write(session=idle(id_in(P, "late")), create=True))
    new = await open_store(url, stores, {P: 2})
    after = id_in(P, "after")
    await new.write(write(session=idle(after), create=True))
    assert session_ids(url) == {after}
    assert ended_sessions(caplog) == 1  # and the operator can read which, and why


async def test_a_role_that_may_not_end_the_batch_waits_for_it_and_says_so_once(
    url: str, leases: list[Lease], stores: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    """The new owner's role may not end the old owner's session (a superuser's, here):
    the bump keeps waiting, as it did before ``fence_wait``, logs why once, and goes on as
    soon as the batch ends some other way (an operator ends it)."""
    role = "dex_fence_" + secrets.token_hex(4)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        admin.execute(f"GRANT SELECT, UPDATE ON dex_partitions TO {role}")
        admin.execute(f"GRANT SELECT, INSERT, UPDATE ON dex_nodes TO {role}")
        admin.execute(f"GRANT USAGE ON SEQUENCE dex_nodes_key_seq TO {role}")
    old_lease = Lease(url, "old")
    new_lease = Lease(url.replace("//postgres@", f"//{role}@"), "new")
    leases.append(old_lease)
    try:
        old = await open_store(url, stores, await own(old_lease, [P]))
        slow = old._commit_write([("SELECT pg_sleep(60)", [()])], id_in(P, "slow"))
        await wait_until_async(lambda: asyncio.sleep(0, in_batch(url)), 5, what="the batch runs")
        [batch] = in_batch(url)
        await new_lease.join()
        contender = asyncio.create_task(take_when_free(new_lease, P))
        terminate(url, old_lease.backend_pid)

        def refused() -> int:
            return sum(getattr(r, "action", None) == "lease.fence_held" for r in caplog.records)

        await wait_until_async(lambda: asyncio.sleep(0, refused()), 10, what="it says why")
        assert "pg_signal_backend" in caplog.text
        assert not contender.done()  # still waiting for the batch
        assert in_batch(url) == [batch]
        wait = new_lease.settings.fence_wait
        with pytest.raises(TimeoutError):  # a few more rounds: still waiting, said once
            await asyncio.wait_for(asyncio.shield(contender), 2 * wait + 0.5)
        # longer than valid_for with no ping: the waiting node keeps its lease all along
        # (each round answered is as good as a ping)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.shield(contender), new_lease.settings.valid_for)
        assert new_lease.valid() and not new_lease.lost.is_set()

        terminate(url, batch)  # an operator ends the batch's session
        assert await asyncio.wait_for(contender, 5) == 2
        assert refused() == 1 and ended_sessions(caplog) == 0
        with pytest.raises(CommitUnknown):
            await asyncio.wait_for(slow, 5)
    finally:
        await new_lease.release()
        with psycopg.connect(url, autocommit=True) as admin:
            admin.execute(f"DROP OWNED BY {role}")
            admin.execute(f"DROP ROLE {role}")


async def test_a_fenced_write_loses_the_lease_at_once(
    url: str, leases: list[Lease], stores: list[PostgresStore]
) -> None:
    """How the server wires them: the store's ``on_fatal`` is the lease's ``lose``."""
    lease = Lease(url, "node")
    leases.append(lease)
    store = await open_store(url, stores, await own(lease, [P]))
    store.on_fatal = lambda e: lease.lose(e.message)
    late = ids_in(P)
    first, second = next(late), next(late)
    await store.write(write(session=idle(first), create=True))
    assert lease.valid() and not lease.lost.is_set()

    with psycopg.connect(url, autocommit=True) as admin:  # another node took the partition
        admin.execute("UPDATE dex_partitions SET epoch = epoch + 1 WHERE id = %s", (P,))
    with pytest.raises(Fenced):
        await store.write(write(session=idle(second), create=True))

    assert lease.lost.is_set()
    assert not lease.valid()


async def test_the_lease_corrects_the_nodes_clock_to_the_databases(url: str) -> None:
    from dex.server.clock import Clock

    clock = Clock()
    clock.offset = 1e6  # nonsense until the first reading
    lease = Lease(url, holder="clocked", clock=clock)
    try:
        await lease.join()
        assert abs(clock.offset) < 1.0  # the database runs on this host: near 0
        clock.offset = 1e6
        await wait_until_async(
            lambda: asyncio.sleep(0, abs(clock.offset) < 1.0), 5, what="a ping corrects it"
        )
    finally:
        await lease.release()


async def test_asking_a_lost_lease_for_a_partition_raises_instead_of_waiting_forever(
    url: str, leases: list[Lease]
) -> None:
    """Its lock thread ended with the lost connection: nobody would ever answer."""
    lease = Lease(url, "node")
    leases.append(lease)
    assert await lease.take_now([P]) == {P: 1}
    terminate(url, lease.backend_pid)
    await asyncio.wait_for(lease.lost.wait(), 5)

    with pytest.raises(StorageError, match="lost"):
        await asyncio.wait_for(lease.take_now([P + 1]), 5)
    assert partition_row(url, P + 1) == (0, "")
