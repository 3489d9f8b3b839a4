"""A node's lease on PostgreSQL: one lock connection that holds the node's locks.

Each node holds, on a connection of its own, the advisory lock ``(NODE_LOCKS, key)``
that says it is live, one ``(PARTITION_LOCKS, id)`` for each partition it owns, and, for
a standby that stands in when no other node serves, ``LEADER_KEY``. A thread of its own
pings the connection about every 500 ms (so a busy event loop delays no ping: slow is not
dead) and reads the cluster at each ping: which nodes are live and which partitions each
owns, straight from ``pg_locks`` (a ``View``). PostgreSQL is asked to end the session when
it goes quiet (``idle_session_timeout``, keepalives and ``tcp_user_timeout`` set per
session): a killed node frees its locks at once, a hung or cut-off one within
``session_timeout``.

On taking a partition, the node bumps its epoch (``dex_partitions.epoch``) in the
transaction that holds the partition's fence lock exclusively; the store of a node checks
the epochs of the partitions each write batch touches (``PostgresStore.fence``), so a
node that lost a partition can commit nothing to it. A batch that holds a fence lock
longer than ``fence_wait`` (its node stopped in the middle of it) has its session ended,
so no old owner can hold a takeover off.

``valid_until`` is a monotonic deadline, refreshed by each successful ping, shorter than
the time another node needs to take this one's partitions: what a node answers from
memory (a heartbeat reply, a single-attempt start) it answers only before that deadline.
Times stored come from the database's ``now()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from dex.errors import StorageError
from dex.server.clock import Clock
from dex.server.ha.cluster import Member, View
from dex.server.store.postgres import FENCE_LOCKS, LEADER_KEY, NODE_LOCKS, PARTITION_LOCKS

log = logging.getLogger("dex.ha")

Conn = psycopg.Connection[tuple[Any, ...]]

JOIN = (
    "INSERT INTO dex_nodes (id, address, standby, joined_at) VALUES (%s, %s, %s, now()) "
    "ON CONFLICT (id) DO UPDATE SET address = excluded.address, "
    "standby = excluded.standby, joined_at = excluded.joined_at RETURNING key"
)
BUMP = (
    "UPDATE dex_partitions SET epoch = epoch + 1, owner = %s, acquired_at = now() "
    "WHERE id = %s RETURNING epoch"
)
_THIS_DATABASE = "l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
LIVE_NODES = (
    "SELECT n.id, n.address, n.standby, l.pid FROM dex_nodes n JOIN pg_locks l ON "
    "l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 AND "
    f"l.classid::bigint = {NODE_LOCKS} AND l.objid::bigint = n.key AND {_THIS_DATABASE}"
)
HELD = (
    "SELECT l.objsubid, l.objid::bigint, l.pid FROM pg_locks l WHERE "
    f"l.locktype = 'advisory' AND l.granted AND {_THIS_DATABASE} AND ("
    f"(l.objsubid = 2 AND l.classid::bigint = {PARTITION_LOCKS}) OR "
    f"(l.objsubid = 1 AND l.classid::bigint = {LEADER_KEY >> 32} "
    f"AND l.objid::bigint = {LEADER_KEY & 0xFFFFFFFF}))"
)
"""Partition locks (objsubid 2: the partition in ``objid``) and the standby's lock."""
CHANNEL = "dex_cluster"
NOTIFY = f"NOTIFY {CHANNEL}"
"""Said by a node that joins, gives partitions up or leaves: every node looks now."""
END_FENCE_HOLDERS = (
    "SELECT l.pid, a.application_name, host(a.client_addr), pg_terminate_backend(l.pid) "
    "FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
    "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND d.datname = current_database() "
    f"AND l.classid::bigint = {FENCE_LOCKS} AND l.objid::bigint = %s AND l.objsubid = 2 "
    "AND l.mode = 'ShareLock' AND l.granted AND l.pid <> pg_backend_pid()"
)
"""End the sessions whose write batches hold a partition's fence lock (of this database:
another database on the server has its own lock under the same key)."""


@dataclass(frozen=True)
class LeaseSettings:
    ping_interval: float = 0.25
    """Seconds between two pings of the lock connection (each reads the cluster: a dead
    node's partitions are free at once, and taken at the next ping)."""
    ping_timeout: float = 1.0
    """A ping that comes back later loses the lease (one that never comes back loses it
    when ``valid_until`` passes); also how long ``release()`` waits for the lock
    connection to close."""
    session_timeout: float = 3.0
    """How long PostgreSQL keeps a silent node's session (and so its locks): its
    ``idle_session_timeout``, ``tcp_user_timeout`` and keepalive window."""
    margin: float = 1.0
    """Of ``session_timeout``, what ``valid_until`` leaves unused (for slow pings and
    clock rates)."""
    fence_wait: float = 0.5
    """How long taking a partition waits for the write batches in flight to it (they hold
    its fence lock shared) before it ends their sessions. A batch takes milliseconds; one
    that still holds the lock after this long belongs to a previous owner that is stopped
    (a hung VM), cut off mid-batch, or lost the partition anyway, and PostgreSQL would
    wait for it without end (see ``_LockThread._bump``)."""

    def __post_init__(self) -> None:
        if not 0 < self.margin < self.session_timeout:
            raise ValueError("LeaseSettings: margin must be between 0 and session_timeout")
        if self.ping_interval + self.ping_timeout >= self.valid_for:
            raise ValueError("LeaseSettings: a ping must come back within valid_for")
        if self.fence_wait < 0.001:
            raise ValueError("LeaseSettings: fence_wait must be at least 1 ms")

    @property
    def valid_for(self) -> float:
        """Seconds after a ping was sent that the locks are surely still held: no other
        node can take them before PostgreSQL ends this session, ``session_timeout`` after
        its last sign of life (an operator's ``pg_terminate_backend`` aside: fencing covers
        that)."""
        return self.session_timeout - self.margin


class Lease:
    """A node's locks on PostgreSQL: ``await join()``, then ``take``/``give`` partitions and
    ``lead`` (a standby); ``on_view`` hears each ping's ``View``, ``on_taken`` each
    partition taken (with its new epoch) or missed (None). ``lost`` is an event,
    ``valid()`` says whether the locks are surely held, ``await release()`` frees them.

    The lock connection belongs to a thread (``_LockThread``); everything else here runs
    on the event loop, which hears from the thread through ``call_soon_threadsafe``."""

    clustered = True
    """A ``Node`` joins a cluster with it (``Leadership``'s ``acquire`` is a lone node's)."""

    def __init__(
        self,
        url: str,
        holder: str | None = None,
        settings: LeaseSettings | None = None,
        clock: Clock | None = None,
        *,
        address: str = "",
        standby: bool = False,
    ) -> None:
        self.url = url
        self.clock = clock
        """Corrected to the database's clock at every ping (the node's durable deadlines)."""
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        """The node's id in the cluster."""
        self.address = address
        self.standby = standby
        self.settings = settings or LeaseSettings()
        self.lost = asyncio.Event()
        """Set when the lock connection dies or a ping fails: stop at once."""
        self.on_view: Callable[[View], None] | None = None
        self.on_taken: Callable[[int, int | None], None] | None = None
        self._lock: _LockThread | None = None
        self._watchdog: asyncio.Task[None] | None = None
        self._asked: dict[int, asyncio.Future[int | None]] = {}

    @property
    def valid_until(self) -> float:
        """``time.monotonic()`` before which the locks are surely held: the send time of
        the last ping that came back in time, plus ``valid_for``; 0 once lost or
        released."""
        lock = self._lock
        if lock is None or self.lost.is_set():
            return 0.0
        return lock.valid_until

    def valid(self) -> bool:
        """Whether the locks are surely still held now."""
        return time.monotonic() < self.valid_until

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend that holds the locks (for operators and tests)."""
        return self._lock.backend_pid if self._lock is not None else None

    async def join(self) -> View:
        """Connect, register this node, hold its node lock, start pinging. Returns the
        cluster's first view."""
        if self._lock is not None:
            raise RuntimeError("the lease is held already")
        lock = _LockThread(self, asyncio.get_running_loop())
        lock.start()
        try:
            view, reading = await lock.joined
        except BaseException:  # cancelled, or no tables: hold nothing
            lock.stop(unlock=False)  # closing its connection frees what it took
            raise
        self._lock = lock
        self.lost.clear()
        if lock.failure is not None:  # its first ping failed before this ran
            self.lose(lock.failure)
        self._observe(reading)
        self._watchdog = asyncio.create_task(self._watch(), name="dex-lease-watchdog")
        log.info(
            "joined the cluster",
            extra={"action": "lease.joined", "holder": self.holder, "standby": self.standby},
        )
        return view

    def take(self, partitions: list[int]) -> None:
        """Try to take these partitions (each answers ``on_taken``)."""
        if self._lock is not None:
            self._lock.command(("take", partitions))

    async def take_now(self, partitions: list[int]) -> dict[int, int | None]:
        """Join if not joined yet, take ``partitions`` and wait for the answers: each
        one's new epoch, or None if another node holds it (for tests and tools; a node
        uses ``take`` and ``on_taken``)."""
        if self._lock is None:
            await self.join()
        if self.lost.is_set():  # its lock thread may be gone: nobody would answer
            raise StorageError("the lease was lost: it takes no partition")
        loop = asyncio.get_running_loop()
        asked = {p: self._asked.setdefault(p, loop.create_future()) for p in partitions}
        self.take(partitions)
        return dict(zip(asked, await asyncio.gather(*asked.values()), strict=True))

    def give(self, partitions: list[int]) -> None:
        """Free these partitions' locks (the node drained them)."""
        if self._lock is not None:
            self._lock.command(("give", partitions))

    def lead(self) -> None:
        """A standby: try the standby's lock (the next view says who holds it)."""
        if self._lock is not None:
            self._lock.command(("lead", []))

    async def release(self) -> None:
        """Free every lock at once (a planned stop); others take the partitions without
        waiting. Waits for the lock connection to close for up to ``ping_timeout``, no
        longer: a thread stuck in the driver (a silent database) is left behind, and
        PostgreSQL frees the locks when it ends that session."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        lock, self._lock = self._lock, None  # valid() is False from here on
        self._unasked("the lease was released")
        if lock is None:
            return  # never joined, or released already
        lock.stop(unlock=True)
        try:
            async with asyncio.timeout(self.settings.ping_timeout):
                await lock.ended
        except TimeoutError:
            log.warning(
                "lease released, but its connection did not close within %gs: PostgreSQL "
                "frees the locks when it ends that session",
                self.settings.ping_timeout,
                extra={"action": "lease.release_slow", "holder": self.holder},
            )
            return
        log.info("lease released", extra={"action": "lease.released", "holder": self.holder})

    async def _watch(self) -> None:
        """Lose the lease as soon as ``valid_until`` passes without a ping coming back. A
        ping to a database that went silent (a partition) may take far longer than its
        timeout to give up (the driver blocks the lock thread until the socket fails);
        the node must not wait for it."""
        while not self.lost.is_set():
            await asyncio.sleep(0.1)
            if time.monotonic() > self.valid_until:
                self.lose(f"no ping came back within {self.settings.valid_for:g}s")

    def _observe(self, reading: _Reading | None) -> None:
        """A reading of the database's clock, taken by the lock thread (on the loop)."""
        if self.clock is not None and reading is not None:
            self.clock.observe(*reading)

    def _pinged(self, lock: _LockThread, view: View, reading: _Reading | None) -> None:
        if lock is not self._lock:
            return
        self._observe(reading)
        if self.on_view is not None:
            self.on_view(view)

    def _taken(self, lock: _LockThread, partition: int, epoch: int | None) -> None:
        if lock is not self._lock:
            return
        asked = self._asked.pop(partition, None)
        if asked is not None and not asked.done():
            asked.set_result(epoch)
        if self.on_taken is not None:
            self.on_taken(partition, epoch)

    def _failed(self, lock: _LockThread, reason: str) -> None:
        """The lock thread's report of a failed ping (on the loop). A thread the lease
        already let go of (released, or its join cancelled) reports no loss."""
        if not lock.dropped:
            self.lose(reason)

    def lose(self, reason: str) -> None:
        """Take the lease as lost (a ping failed, or the store was fenced or lost a
        commit): ``valid()`` turns False and ``lost`` is set at once. The lock connection
        is left to ``release()`` or the process's exit."""
        if not self.lost.is_set():
            self.lost.set()
            log.error(
                "lease lost: %s",
                reason,
                extra={"action": "lease.lost", "holder": self.holder},
            )
        self._unasked(f"the lease was lost: {reason}")

    def _unasked(self, why: str) -> None:
        """Fail ``take_now``'s waiters: the lock thread may never answer them."""
        asked, self._asked = self._asked, {}
        for fut in asked.values():
            if not fut.done():
                fut.set_exception(StorageError(why))


_Reading = tuple[float, float, float]
"""The database's clock, and this host's ``time.time()`` before and after reading it
(``Clock.observe``'s arguments)."""

Command = tuple[str, list[int]]


class _LockThread:
    """The lock connection (a sync psycopg connection) and the thread that owns it: it
    registers the node and takes its node lock, then pings every ``ping_interval`` (and
    runs the loop's commands) until it is stopped or a ping fails. Only this thread
    touches the connection. Python hands the GIL to a waiting thread every few
    milliseconds, so a ping comes back in time while the event loop is busy for seconds;
    and a ping stuck in the driver blocks this thread only, never the loop (the lease's
    watchdog notices that ``valid_until`` passed)."""

    def __init__(self, lease: Lease, loop: asyncio.AbstractEventLoop) -> None:
        self.url, self.holder, self.settings = lease.url, lease.holder, lease.settings
        self.lease = lease
        self.loop = loop
        self.joined: asyncio.Future[tuple[View, _Reading | None]] = loop.create_future()
        """The first view and clock reading, once the node lock is held."""
        self.ended: asyncio.Future[None] = loop.create_future()
        """Done when the thread has closed its connection and exits."""
        self.valid_until = 0.0
        """Written by this thread only: see ``Lease.valid_until``."""
        self.backend_pid: int | None = None
        """The session that holds the locks; set by this thread once it joined."""
        self.failure: str | None = None
        """Why a ping failed (set by this thread before it reports it)."""
        self.dropped = False
        """Loop side: the lease let go of this thread (``stop``)."""
        self._commands: queue.SimpleQueue[Command] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        """What wakes the thread's ``select`` (a command, a stop)."""
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._pipe_lock = threading.Lock()
        self._pipe_closed = False
        self._stop = threading.Event()
        self._unlock = False
        self._thread = threading.Thread(
            target=self._run, name=f"dex-lease {self.holder}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def command(self, command: Command) -> None:
        """From the loop: run this before the next ping, at once."""
        self._commands.put(command)
        self._wake_up()

    def _wake_up(self) -> None:
        self._wake.set()
        with self._pipe_lock:
            if not self._pipe_closed:
                with contextlib.suppress(BlockingIOError):  # full: it wakes anyway
                    os.write(self._wake_w, b".")

    def stop(self, unlock: bool) -> None:
        """From the loop: stop pinging and close the connection (after unlocking
        everything if ``unlock``). Returns at once."""
        self.dropped = True
        self._unlock = unlock
        self._stop.set()
        self._wake_up()

    def _run(self) -> None:
        conn: Conn | None = None
        try:
            conn = self._join()
            if conn is not None:
                self._ping(conn)
        except Exception as e:  # no tables, or a bug: the loop hears of it either way
            if self.backend_pid is None:  # not joined yet: join() raises it
                self._to_loop(_reject, self.joined, e)
            else:
                log.exception(
                    "the lease's lock thread failed",
                    extra={"action": "lease.thread_failed", "holder": self.holder},
                )
                self._fail(f"the lock thread failed: {e!r}")
        finally:
            if conn is not None:
                self._close(conn)
            with self._pipe_lock:
                self._pipe_closed = True
                os.close(self._wake_r)
                os.close(self._wake_w)
            self._to_loop(_resolve, self.ended, None)

    def _join(self) -> Conn | None:
        """Connect, register and take the node lock, retrying every ``ping_interval``
        while PostgreSQL cannot be reached, until joined (the connection) or stopped
        (None)."""
        while not self._stop.is_set():
            conn: Conn | None = None
            try:
                conn = self._connect()
                sent = time.monotonic()
                row = conn.execute(
                    JOIN, (self.holder, self.lease.address, self.lease.standby)
                ).fetchone()
                assert row is not None
                conn.execute("SELECT pg_advisory_lock(%s, %s)", (NODE_LOCKS, int(row[0])))
                conn.execute(f"LISTEN {CHANNEL}")
                conn.execute(NOTIFY)  # the others make room for it now
                reading = _read_clock(conn)
                view = self._view(conn)
                self.valid_until = sent + self.settings.valid_for
                self.backend_pid = conn.info.backend_pid
                self._to_loop(_resolve, self.joined, (view, reading))
                return conn
            except psycopg.errors.UndefinedTable as e:
                if conn is not None:
                    conn.close()
                raise StorageError(
                    "no cluster tables: open the PostgreSQL store first (migrations)"
                ) from e
            except psycopg.Error as e:
                log.warning(
                    "lease: cannot reach PostgreSQL: %s",
                    e,
                    extra={"action": "lease.retry", "holder": self.holder},
                )
                if conn is not None:
                    conn.close()
            self._stop.wait(self.settings.ping_interval)
        return None

    def _ping(self, conn: Conn) -> None:
        """Run commands and ping until stopped; a ping that fails or comes back after
        ``ping_timeout`` ends the lease (and this thread). A node that joins, gives
        partitions up or leaves says so (``NOTIFY``): every node pings at once then, so
        the partitions it frees are taken without waiting for the next ping."""
        s = self.settings
        next_ping = time.monotonic() + s.ping_interval
        while not self._stop.is_set():
            try:
                if self._wait(conn, next_ping):
                    next_ping = time.monotonic()  # the cluster changed: look now
                if self._stop.is_set():
                    return
                while not self._commands.empty():
                    self._run_command(conn, self._commands.get_nowait())
                if time.monotonic() < next_ping:
                    continue
                sent = time.monotonic()
                reading = _read_clock(conn)  # the ping reads the database's clock
                view = self._view(conn)
            except psycopg.Error as e:
                self._fail(f"the lock connection failed: {e!r}")
                return
            took = time.monotonic() - sent
            if took > s.ping_timeout:
                self._fail(f"a ping took {took:.2f}s, more than {s.ping_timeout:g}s")
                return
            self.valid_until = sent + s.valid_for
            next_ping = sent + s.ping_interval
            self._to_loop(self.lease._pinged, self, view, reading)

    def _wait(self, conn: Conn, until: float) -> bool:
        """Wait until ``until`` (monotonic), a command, or a notice that the cluster
        changed (True): one ``select`` on the connection's socket and the wake pipe, so
        an idle node's thread wakes only to ping."""
        while not self._wake.is_set():
            left = until - time.monotonic()
            if left <= 0:
                return False
            readable, _, _ = select.select([conn.pgconn.socket, self._wake_r], [], [], left)
            if self._wake_r in readable:
                os.read(self._wake_r, 4096)
            if conn.pgconn.socket in readable:
                for _ in conn.notifies(timeout=0.0, stop_after=1):
                    return True
        self._wake.clear()
        return False

    def _run_command(self, conn: Conn, command: Command) -> None:
        what, partitions = command
        if what == "lead":
            conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_KEY,))
            return
        for p in partitions:
            if self._stop.is_set():
                return
            if what == "give":
                conn.execute("SELECT pg_advisory_unlock(%s, %s)", (PARTITION_LOCKS, p))
                if p == partitions[-1]:
                    conn.execute(NOTIFY)
                continue
            row = conn.execute(
                "SELECT pg_try_advisory_lock(%s, %s)", (PARTITION_LOCKS, p)
            ).fetchone()
            epoch = self._bump(conn, p) if row is not None and row[0] else None
            self._to_loop(self.lease._taken, self, p, epoch)

    def _view(self, conn: Conn) -> View:
        nodes = conn.execute(LIVE_NODES).fetchall()
        by_pid = {pid: node_id for node_id, _, _, pid in nodes}
        owners: dict[int, str] = {}
        leader = None
        for subid, objid, pid in conn.execute(HELD).fetchall():
            owner = by_pid.get(pid)
            if owner is None:
                continue  # a session that is no node's (an operator's, say)
            if subid == 1:
                leader = owner
            else:
                owners[int(objid)] = owner
        owned: dict[str, list[int]] = {}
        for p, owner in sorted(owners.items()):
            owned.setdefault(owner, []).append(p)
        members = {
            node_id: Member(
                node_id,
                address,
                standby,
                tuple(owned.get(node_id, ())),
                here=node_id == self.holder,
            )
            for node_id, address, standby, _ in nodes
        }
        return View(members, owners, leader)

    def _fail(self, reason: str) -> None:
        self.failure = reason
        self.valid_until = 0.0  # valid() is False at once, before the loop hears of it
        self._to_loop(self.lease._failed, self, reason)

    def _to_loop(self, callback: Callable[..., object], *args: object) -> None:
        try:
            self.loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop is closed: nobody holds this lease any more
            self._stop.set()

    def _close(self, conn: Conn) -> None:
        if self._unlock:
            with contextlib.suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock_all()")
                conn.execute(NOTIFY)
        conn.close()  # ending the session frees the locks in any case

    def _connect(self) -> Conn:
        s = self.settings
        timeout_ms = int(s.session_timeout * 1000)
        conn = psycopg.Connection.connect(
            self.url,
            autocommit=True,
            application_name=f"dex-lease {self.holder}"[:63],
            connect_timeout=max(2, int(s.session_timeout)),
            keepalives=1,
            keepalives_idle=1,
            keepalives_interval=1,
            keepalives_count=max(1, int(s.session_timeout) - 1),
            tcp_user_timeout=timeout_ms,
        )
        # The server's side of the same promise: end this session (and free the locks)
        # soon after the node stops answering, whatever the server's defaults are.
        for setting, value in (
            ("idle_session_timeout", timeout_ms),
            ("idle_in_transaction_session_timeout", timeout_ms),
            ("tcp_user_timeout", timeout_ms),
            ("tcp_keepalives_idle", 1),
            ("tcp_keepalives_interval", 1),
            ("tcp_keepalives_count", max(1, int(s.session_timeout) - 1)),
            ("client_connection_check_interval", 1000),
        ):
            conn.execute("SELECT set_config(%s, %s, false)", (setting, str(value)))
        return conn

    def _bump(self, conn: Conn, partition: int) -> int | None:
        """Bump the partition's epoch in a transaction that holds its fence lock
        exclusively: taking it waits for the write batches in flight to the partition
        (each holds it shared until it ends), and from then on every batch of an older
        epoch is refused. Returns the new epoch, or None if ``stop`` was called meanwhile.

        A batch whose node stopped in the middle of it (SIGSTOP, a hung VM, a partition)
        holds the shared lock for as long as its session lives, and nothing ends that
        session soon: its pipeline sent no Sync, so PostgreSQL counts it as active, not
        idle in a transaction (``idle_in_transaction_session_timeout`` never fires), and
        the client's kernel still answers keepalives. So the bump waits at most
        ``fence_wait`` (``lock_timeout``), then ends the sessions that hold the lock
        shared (``pg_terminate_backend``) and asks again. That is safe: this node holds
        the partition's lock, so they are writes of a node that lost it; a batch that had
        not committed rolls back, and it was never acknowledged (its node hears of a lost
        connection: ``CommitUnknown``, and steps down); a batch already committing
        finishes before its locks are released, so before the bump."""
        wait = f"{max(1, int(self.settings.fence_wait * 1000))}ms"
        warned = False
        while not self._stop.is_set():
            sent = time.monotonic()
            try:
                with conn.transaction():
                    conn.execute("SELECT set_config('lock_timeout', %s, true)", (wait,))
                    conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (FENCE_LOCKS, partition))
                    row = conn.execute(BUMP, (self.holder, partition)).fetchone()
            except psycopg.errors.LockNotAvailable:
                # The session answered, as a ping would: no ping runs while this waits,
                # and the node must not lose all its partitions over this one.
                self.valid_until = sent + self.settings.valid_for
                warned = self._end_fence_holders(conn, partition, warned)
                continue
            if row is None:
                raise StorageError(f"no partition {partition}: the database has fewer")
            return int(row[0])
        return None

    def _end_fence_holders(self, conn: Conn, partition: int, warned: bool) -> bool:
        """End the sessions that held the partition's fence lock shared for
        ``fence_wait``. Without the right to (a role that is neither theirs nor in
        ``pg_signal_backend``) the bump keeps waiting, and says why once. Returns whether
        it said so."""
        try:
            ended = conn.execute(END_FENCE_HOLDERS, (partition,)).fetchall()
        except psycopg.errors.InsufficientPrivilege as e:
            if not warned:
                log.error(
                    "lease: write batches of a previous owner hold partition %d's fence lock "
                    "for more than %gs, and this role may not end their sessions (%s): the "
                    "takeover waits for them; grant it pg_signal_backend",
                    partition,
                    self.settings.fence_wait,
                    e,
                    extra={"action": "lease.fence_held", "holder": self.holder},
                )
            return True
        for pid, application, address, _ in ended:
            log.warning(
                "lease: ended session %s (%s at %s): its write batch held partition %d's "
                "fence lock for more than %gs; it rolls back unacknowledged",
                pid,
                application,
                address or "a local socket",
                partition,
                self.settings.fence_wait,
                extra={"action": "lease.fence_holder_ended", "holder": self.holder, "pid": pid},
            )
        return warned


def _read_clock(conn: Conn) -> _Reading | None:
    """One round trip: the database's clock, to correct the node's (``Lease.clock``)."""
    sent = time.time()
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    return None if row is None else (float(row[0]), sent, time.time())


def _resolve(future: asyncio.Future[Any], result: Any) -> None:
    if not future.done():  # a join cancelled meanwhile, or a release that gave up
        future.set_result(result)


def _reject(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
