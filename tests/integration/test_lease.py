"""The lease and the fence against a real PostgreSQL (skipped only when it is unreachable).

Two nodes here are two ``Lease`` objects (and their stores) in one process: each has its
own connections, which is all PostgreSQL sees of a node.
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
from dex.server.engine.state import SessionState
from dex.server.ha.lease import Lease, LeaseSettings
from dex.server.records import write
from dex.server.store.postgres import FENCE_KEY, LEADER_KEY, PostgresStore
from dex.server.store.sql import statements
from dex.testing.proxy import TcpProxy
from dex.testing.wait import wait_until_async


@pytest.fixture
async def url(postgres_url: str) -> AsyncIterator[str]:
    """An empty database with Dex's schema (the lease row at epoch 0)."""
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


async def open_store(url: str, stores: list[PostgresStore], epoch: int) -> PostgresStore:
    store = PostgresStore(url)
    await store.open()
    store.fence_epoch = epoch
    stores.append(store)
    return store


def terminate(url: str, pid: int | None) -> None:
    assert pid is not None
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


def lease_row(url: str) -> tuple[int, str]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT epoch, holder FROM dex_lease").fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def lock_holders(url: str, key: int = LEADER_KEY) -> list[int]:
    """Backends holding the leader lock (or another advisory ``key``) of this database (a
    bigint key: classid high, objid low 32 bits; other databases on the server, other
    tests' or benchmarks', have their own lock under the same key)."""
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT l.pid FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
            "WHERE l.locktype = 'advisory' AND l.granted AND d.datname = current_database() "
            "AND l.classid::bigint = %s AND l.objid::bigint = %s",
            (key >> 32, key & 0xFFFFFFFF),
        ).fetchall()
    return [int(r[0]) for r in rows]


def ended_sessions(caplog: pytest.LogCaptureFixture) -> int:
    """How many sessions a bump ended because they held the fence lock (from the log)."""
    return sum(getattr(r, "action", None) == "lease.fence_holder_ended" for r in caplog.records)


def stopped(pid: int) -> bool:
    """Whether the process is stopped (SIGSTOP): state ``T`` in ``/proc/PID/stat``."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def session_ids(url: str) -> set[str]:
    with psycopg.connect(url) as conn:
        return {str(r[0]) for r in conn.execute("SELECT id FROM sessions").fetchall()}


def lease_threads(holder: str) -> list[threading.Thread]:
    """The threads that own a lease's lock connection (each closes it before it ends)."""
    return [t for t in threading.enumerate() if t.name == f"dex-lease {holder}"]


def idle(session_id: str) -> SessionState:
    return SessionState(id=session_id, agent="helper", created_at=1.0)


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
    tasks = {asyncio.create_task(a.acquire()): a, asyncio.create_task(b.acquire()): b}

    done, pending = await asyncio.wait(tasks, timeout=10, return_when=asyncio.FIRST_COMPLETED)

    [won] = done
    winner = tasks[won]
    assert won.result() == 1
    assert lease_row(url) == (1, winner.holder)
    assert lock_holders(url) == [winner.backend_pid]
    assert winner.valid()
    # the other keeps waiting while the winner holds the lock (a bounded check)
    [waiting] = pending
    with pytest.raises(TimeoutError):
        await asyncio.wait_for(asyncio.shield(waiting), 1.5)
    assert winner.valid() and not winner.lost.is_set()
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert lock_holders(url) == [winner.backend_pid]
    # the loser's lock thread stops trying and closes its connection
    loser = tasks[waiting]
    await wait_until_async(
        lambda: asyncio.sleep(0, not lease_threads(loser.holder)), 5, what="the thread ends"
    )
    assert lease_threads(winner.holder)  # the winner's pings on


async def test_killing_the_holders_session_lets_the_other_win_with_a_higher_epoch(
    url: str, leases: list[Lease]
) -> None:
    holder, standby = Lease(url, "holder"), Lease(url, "standby")
    leases += [holder, standby]
    assert await holder.acquire() == 1
    contender = asyncio.create_task(standby.acquire())

    killed = time.monotonic()
    terminate(url, holder.backend_pid)

    assert await asyncio.wait_for(contender, 5) == 2
    took = time.monotonic() - killed
    assert took < 2.0, f"the standby took {took:.2f}s"
    assert lease_row(url) == (2, "standby")
    await asyncio.wait_for(holder.lost.wait(), 2)  # the old holder notices by its ping
    assert not holder.valid()


async def test_release_frees_the_lock_at_once(url: str, leases: list[Lease]) -> None:
    holder, standby = Lease(url, "holder"), Lease(url, "standby")
    leases += [holder, standby]
    await holder.acquire()
    contender = asyncio.create_task(standby.acquire())

    released = time.monotonic()
    await holder.release()

    assert not holder.valid()
    assert await asyncio.wait_for(contender, 5) == 2
    assert time.monotonic() - released < 1.0  # one retry interval, not a timeout
    assert not holder.lost.is_set()  # a planned release is not a loss


async def test_valid_until_is_kept_fresh_by_pings_and_shorter_than_a_takeover(
    url: str, leases: list[Lease]
) -> None:
    lease = Lease(url, "a")
    leases.append(lease)
    before = time.monotonic()
    await lease.acquire()
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
    assert await lease.acquire() == 1
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
    assert lock_holders(url) == [pid]  # the same session held the lock all along
    assert lease_row(url) == (1, "busy")


async def test_a_holder_cut_off_from_the_database_loses_the_lease_before_a_standby_wins(
    url: str, leases: list[Lease]
) -> None:
    """A silent database (a partition: nothing passes, nothing is closed): the ping hangs
    in the driver, the watchdog loses the lease within ``valid_for``, before PostgreSQL
    ends the silent session and a standby can win; and ``release()`` does not hang."""
    db = urlsplit(url)
    assert db.hostname is not None and db.port is not None
    with TcpProxy(db.hostname, db.port).in_thread() as proxy:
        holder = Lease(url.replace(f":{db.port}/", f":{proxy.port}/"), "cut", settings=FAST)
        standby = Lease(url, "standby", settings=FAST)
        leases += [holder, standby]
        assert await holder.acquire() == 1
        contender = asyncio.create_task(standby.acquire())

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
    old = await open_store(url, stores, await old_lease.acquire())
    await old.write(write(session=idle("before"), create=True))
    contender = asyncio.create_task(new_lease.acquire())
    terminate(url, old_lease.backend_pid)
    new = await open_store(url, stores, await asyncio.wait_for(contender, 5))

    with pytest.raises(Fenced, match="epoch"):
        await old.write(write(session=idle("late"), create=True))
    # a batch of several writes is refused whole
    results = await asyncio.gather(
        *(old.write(write(session=idle(f"late{i}"), create=True)) for i in range(8)),
        return_exceptions=True,
    )
    assert all(isinstance(r, Fenced) for r in results), results

    await new.write(write(session=idle("after"), create=True))
    assert session_ids(url) == {"before", "after"}


async def test_sixteen_writers_across_a_takeover_never_commit_with_the_old_epoch(
    url: str, leases: list[Lease], stores: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    old_lease, new_lease = Lease(url, "old"), Lease(url, "new")
    leases += [old_lease, new_lease]
    old = await open_store(url, stores, await old_lease.acquire())
    acknowledged: list[str] = []

    async def writer(n: int) -> str:
        for i in range(100_000):
            session_id = f"w{n:02}-{i:06}"
            try:
                await old.write(write(session=idle(session_id), create=True))
            except Fenced:
                return "fenced"
            acknowledged.append(session_id)
        return "never fenced"

    writers = [asyncio.create_task(writer(n)) for n in range(16)]
    await wait_until_async(
        lambda: asyncio.sleep(0, len(acknowledged) >= 200), 20, what="writes flow"
    )
    contender = asyncio.create_task(new_lease.acquire())
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
    print("epoch", await lease.acquire(), flush=True)
    await lease.lost.wait()
    print("lost", flush=True)

asyncio.run(main())
"""


async def test_a_paused_holder_loses_the_lock_after_its_session_timeout_and_notices(
    url: str, leases: list[Lease]
) -> None:
    holder = await asyncio.create_subprocess_exec(
        sys.executable, "-c", HOLDER, url, stdout=asyncio.subprocess.PIPE
    )
    assert holder.stdout is not None
    try:
        line = await asyncio.wait_for(holder.stdout.readline(), 20)
        assert line == b"epoch 1\n"
        standby = Lease(url, "standby")
        leases.append(standby)

        os.kill(holder.pid, signal.SIGSTOP)  # hung: its sockets stay open, it says nothing
        stopped = time.monotonic()
        assert await asyncio.wait_for(standby.acquire(), 10) == 2
        took = time.monotonic() - stopped

        # Not before the paused holder's valid_until ran out (it could not tell), and
        # within its session timeout plus a ping and a retry.
        settings = standby.settings
        assert settings.valid_for < took < settings.session_timeout + 1.5, took
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
    lease, store = Lease(sys.argv[1], "old"), PostgresStore(sys.argv[1])
    await store.open()
    store.fence_epoch = await lease.acquire()
    store.on_fatal = lambda e: lease.lose(e.message)  # as the server wires them
    await store.write(write(session=idle("before"), create=True))
    print("epoch", store.fence_epoch, flush=True)
    try:
        await store.write(write(session=idle("paused"), create=True))  # stopped in it
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
    """A leader SIGSTOPped inside a write batch, after its fence check took the fence lock
    shared (a hung VM): the standby wins the leader lock once the stopped leader's lease
    session times out, and its epoch bump ends the batch's session instead of waiting for
    it. The batch rolls back: it was never acknowledged. Resumed, the old leader hears of
    it as a commit it cannot vouch for and loses its lease."""
    leader = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        LEADER,
        url,
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
            lambda: asyncio.sleep(0, stopped(leader.pid) and lock_holders(url, FENCE_KEY)),
            10,
            what="the leader stopped, holding the fence lock in a batch",
        )
        [in_batch] = lock_holders(url, FENCE_KEY)
        standby = Lease(url, "standby")
        leases.append(standby)
        settings = standby.settings

        began = time.monotonic()
        assert await asyncio.wait_for(standby.acquire(), 20) == 2
        took = time.monotonic() - began

        # The stopped leader's lease session ends after session_timeout; then the bump
        # waits fence_wait for the batch, ends its session, and goes on.
        assert took < settings.session_timeout + settings.fence_wait + 1.5, took
        assert in_batch not in lock_holders(url, FENCE_KEY)
        assert ended_sessions(caplog) == 1
        assert lease_row(url) == (2, "standby")
        new = await open_store(url, stores, 2)
        await new.write(write(session=idle("after"), create=True))

        os.kill(leader.pid, signal.SIGCONT)
        rest = await asyncio.wait_for(leader.stdout.read(), 20)
        assert rest == b"refused CommitUnknown\nlost\n"
        assert await asyncio.wait_for(leader.wait(), 10) == 0
        assert session_ids(url) == {"before", "after"}  # the stopped batch never committed
    finally:
        if leader.returncode is None:
            leader.kill()
            await leader.wait()


async def test_a_running_old_leader_whose_batch_outlasts_fence_wait_is_ended_and_steps_down(
    url: str, leases: list[Lease], stores: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    """Slow, not stopped: the old leader lost its lease session (an operator ended it) while
    one of its batches runs a statement that takes a minute. The bump gives the batch
    ``fence_wait``, then ends its session: the batch rolls back, and the old node hears of
    it as a commit it cannot vouch for, loses the lease at once and is fenced after."""
    old_lease, new_lease = Lease(url, "old"), Lease(url, "new")
    leases += [old_lease, new_lease]
    old = await open_store(url, stores, await old_lease.acquire())
    fatal: list[StorageError] = []

    def on_fatal(e: StorageError) -> None:  # as the server wires it, and counted
        fatal.append(e)
        old_lease.lose(e.message)

    old.on_fatal = on_fatal
    slow = old._commit_write(
        [*statements(write(session=idle("slow"), create=True)), ("SELECT pg_sleep(60)", [()])]
    )
    await wait_until_async(
        lambda: asyncio.sleep(0, lock_holders(url, FENCE_KEY)), 5, what="the batch runs"
    )
    contender = asyncio.create_task(new_lease.acquire())

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
        await old.write(write(session=idle("late"), create=True))
    new = await open_store(url, stores, 2)
    await new.write(write(session=idle("after"), create=True))
    assert session_ids(url) == {"after"}
    assert ended_sessions(caplog) == 1  # and the operator can read which, and why


async def test_a_role_that_may_not_end_the_batch_waits_for_it_and_says_so_once(
    url: str, leases: list[Lease], stores: list[PostgresStore], caplog: pytest.LogCaptureFixture
) -> None:
    """The new leader's role may not end the old leader's session (a superuser's, here):
    the bump keeps waiting, as it did before ``fence_wait``, logs why once, and goes on as
    soon as the batch ends some other way (an operator ends it)."""
    role = "dex_fence_" + secrets.token_hex(4)
    with psycopg.connect(url, autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role} LOGIN")
        admin.execute(f"GRANT USAGE ON SCHEMA public TO {role}")
        admin.execute(f"GRANT SELECT, UPDATE ON dex_lease TO {role}")
    old_lease = Lease(url, "old")
    new_lease = Lease(url.replace("//postgres@", f"//{role}@"), "new")
    leases.append(old_lease)
    try:
        old = await open_store(url, stores, await old_lease.acquire())
        slow = old._commit_write([("SELECT pg_sleep(60)", [()])])
        await wait_until_async(
            lambda: asyncio.sleep(0, lock_holders(url, FENCE_KEY)), 5, what="the batch runs"
        )
        [in_batch] = lock_holders(url, FENCE_KEY)
        contender = asyncio.create_task(new_lease.acquire())
        terminate(url, old_lease.backend_pid)

        def refused() -> int:
            return sum(getattr(r, "action", None) == "lease.fence_held" for r in caplog.records)

        await wait_until_async(lambda: asyncio.sleep(0, refused()), 10, what="it says why")
        assert "pg_signal_backend" in caplog.text
        assert not contender.done()  # still waiting for the batch
        assert lock_holders(url, FENCE_KEY) == [in_batch]
        wait = new_lease.settings.fence_wait
        with pytest.raises(TimeoutError):  # a few more rounds: still waiting, said once
            await asyncio.wait_for(asyncio.shield(contender), 2 * wait + 0.5)

        terminate(url, in_batch)  # an operator ends the batch's session
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
    store = await open_store(url, stores, await lease.acquire())
    store.on_fatal = lambda e: lease.lose(e.message)
    await store.write(write(session=idle("s1"), create=True))
    assert lease.valid() and not lease.lost.is_set()

    with psycopg.connect(url, autocommit=True) as admin:  # another node took over
        admin.execute("UPDATE dex_lease SET epoch = epoch + 1")
    with pytest.raises(Fenced):
        await store.write(write(session=idle("s2"), create=True))

    assert lease.lost.is_set()
    assert not lease.valid()


async def test_the_lease_corrects_the_nodes_clock_to_the_databases(url: str) -> None:
    from dex.server.clock import Clock

    clock = Clock()
    clock.offset = 1e6  # nonsense until the first reading
    lease = Lease(url, holder="clocked", clock=clock)
    try:
        await lease.acquire()
        assert abs(clock.offset) < 1.0  # the database runs on this host: near 0
        clock.offset = 1e6
        await wait_until_async(
            lambda: asyncio.sleep(0, abs(clock.offset) < 1.0), 5, what="a ping corrects it"
        )
    finally:
        await lease.release()
