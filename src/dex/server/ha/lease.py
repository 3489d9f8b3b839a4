"""Leadership: a session advisory lock on a dedicated connection, and an epoch row.

The active node holds ``pg_try_advisory_lock(LEADER_KEY)`` on a connection of its own,
pings it about every 500 ms from a thread of its own (so a busy event loop delays no
ping: slow is not dead), and asks PostgreSQL to end the session when it goes quiet
(``idle_session_timeout``, keepalives and ``tcp_user_timeout`` set per session): a killed
holder frees the lock at once, a hung or cut-off one within ``session_timeout``. On
winning, a node bumps ``dex_lease.epoch`` in the transaction that holds the fence lock
(``pg_advisory_xact_lock(FENCE_KEY)``) exclusively; the store of a node checks that epoch
on every write batch (``PostgresStore.fence_epoch``), so an old leader that still runs
can commit nothing after the takeover. A batch that holds the fence lock longer than
``fence_wait`` (its node stopped in the middle of it) has its session ended, so no old
leader can hold a takeover off.

``valid_until`` is a monotonic deadline, refreshed by each successful ping, shorter than
the time a standby needs to win: what a node answers from memory (a heartbeat reply, a
single-attempt start) it answers only before that deadline. Times stored come from the
database's ``now()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from dex.errors import StorageError
from dex.server.clock import Clock
from dex.server.store.postgres import FENCE_KEY, LEADER_KEY

log = logging.getLogger("dex.ha")

Conn = psycopg.Connection[tuple[Any, ...]]

BUMP = (
    "UPDATE dex_lease SET epoch = epoch + 1, holder = %s, acquired_at = now() "
    "WHERE id = 1 RETURNING epoch"
)
END_FENCE_HOLDERS = (
    "SELECT l.pid, a.application_name, host(a.client_addr), pg_terminate_backend(l.pid) "
    "FROM pg_locks l JOIN pg_database d ON d.oid = l.database "
    "LEFT JOIN pg_stat_activity a ON a.pid = l.pid "
    "WHERE l.locktype = 'advisory' AND d.datname = current_database() "
    "AND l.classid::bigint = %s AND l.objid::bigint = %s AND l.objsubid = 1 "
    "AND l.mode = 'ShareLock' AND l.granted AND l.pid <> pg_backend_pid()"
)
"""End the sessions whose write batches hold the fence lock (of this database: another
database on the server has its own lock under the same key)."""


@dataclass(frozen=True)
class LeaseSettings:
    ping_interval: float = 0.5
    """Seconds between two pings of the lock connection."""
    ping_timeout: float = 1.0
    """A ping that comes back later loses the lease (one that never comes back loses it
    when ``valid_until`` passes); also how long ``release()`` waits for the lock
    connection to close."""
    retry_interval: float = 0.25
    """How often a standby tries to take the lock."""
    session_timeout: float = 3.0
    """How long PostgreSQL keeps a silent holder's session (and so the lock): its
    ``idle_session_timeout``, ``tcp_user_timeout`` and keepalive window."""
    margin: float = 1.0
    """Of ``session_timeout``, what ``valid_until`` leaves unused (for slow pings and
    clock rates)."""
    fence_wait: float = 1.0
    """How long a new leader's epoch bump waits for the write batches in flight (they hold
    the fence lock shared) before it ends their sessions. A batch takes milliseconds; one
    that still holds the lock after this long belongs to a previous leader that is stopped
    (a hung VM), cut off mid-batch, or lost the lease anyway, and PostgreSQL would wait
    for it without end (see ``_LockThread._bump``)."""

    def __post_init__(self) -> None:
        if not 0 < self.margin < self.session_timeout:
            raise ValueError("LeaseSettings: margin must be between 0 and session_timeout")
        if self.ping_interval + self.ping_timeout >= self.valid_for:
            raise ValueError("LeaseSettings: a ping must come back within valid_for")
        if self.fence_wait < 0.001:
            raise ValueError("LeaseSettings: fence_wait must be at least 1 ms")

    @property
    def valid_for(self) -> float:
        """Seconds after a ping was sent that the lease is surely still held: a standby
        cannot win before PostgreSQL ends this session, ``session_timeout`` after its
        last sign of life (an operator's ``pg_terminate_backend`` aside: fencing covers
        that)."""
        return self.session_timeout - self.margin


class Lease:
    """The PostgreSQL ``Leadership`` (``dex.server.ha.leadership``): ``await acquire()``
    (the new epoch), ``lost`` (an event), ``valid()``, ``await release()``.

    The lock connection belongs to a thread (``_LockThread``); everything else here runs
    on the event loop, which hears from the thread through ``call_soon_threadsafe``."""

    def __init__(
        self,
        url: str,
        holder: str | None = None,
        settings: LeaseSettings | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.url = url
        self.clock = clock
        """Corrected to the database's clock at every ping (the node's durable deadlines)."""
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}"
        self.settings = settings or LeaseSettings()
        self.epoch: int | None = None
        self.lost = asyncio.Event()
        """Set when the lock connection dies or a ping fails: stop at once."""
        self._lock: _LockThread | None = None
        self._watchdog: asyncio.Task[None] | None = None

    @property
    def valid_until(self) -> float:
        """``time.monotonic()`` before which the lease is surely held: the send time of
        the last ping that came back in time, plus ``valid_for``; 0 once lost or
        released."""
        lock = self._lock
        if lock is None or self.lost.is_set():
            return 0.0
        return lock.valid_until

    def valid(self) -> bool:
        """Whether the lock is surely still held now (``Leadership.valid``)."""
        return time.monotonic() < self.valid_until

    @property
    def backend_pid(self) -> int | None:
        """The PostgreSQL backend that holds the lock (for operators and tests)."""
        return self._lock.backend_pid if self._lock is not None else None

    async def acquire(self) -> int:
        """Wait until this node holds the lock, bump the epoch, start pinging. Returns the
        new epoch."""
        if self._lock is not None:
            raise RuntimeError("the lease is held already")
        lock = _LockThread(self, asyncio.get_running_loop())
        lock.start()
        try:
            epoch, reading = await lock.won
        except BaseException:  # cancelled, or no lease row: hold nothing
            lock.stop(unlock=False)  # closing its connection frees the lock if it won
            raise
        self._lock, self.epoch = lock, epoch
        self.lost.clear()
        if lock.failure is not None:  # its first ping failed before this ran
            self.lose(lock.failure)
        self._observe(reading)  # right before recovery arms timers
        self._watchdog = asyncio.create_task(self._watch(), name="dex-lease-watchdog")
        log.info(
            "lease acquired",
            extra={"action": "lease.acquired", "epoch": epoch, "holder": self.holder},
        )
        return epoch

    async def release(self) -> None:
        """Free the lock at once (a planned step-down); the next node wins without waiting.
        Waits for the lock connection to close for up to ``ping_timeout``, no longer: a
        thread stuck in the driver (a silent database) is left behind, and PostgreSQL
        frees the lock within ``session_timeout``."""
        watchdog, self._watchdog = self._watchdog, None
        if watchdog is not None:
            watchdog.cancel()
        lock, self._lock = self._lock, None  # valid() is False from here on
        if lock is None:
            return  # never held (a standby stopping), or released already
        lock.stop(unlock=True)
        try:
            async with asyncio.timeout(self.settings.ping_timeout):
                await lock.ended
        except TimeoutError:
            log.warning(
                "lease released, but its connection did not close within %gs: PostgreSQL "
                "frees the lock when it ends that session",
                self.settings.ping_timeout,
                extra={"action": "lease.release_slow", "epoch": self.epoch},
            )
            return
        log.info("lease released", extra={"action": "lease.released", "epoch": self.epoch})

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

    def _failed(self, lock: _LockThread, reason: str) -> None:
        """The lock thread's report of a failed ping (on the loop). A thread the lease
        already let go of (released, or its acquire cancelled) reports no loss."""
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
                extra={"action": "lease.lost", "epoch": self.epoch, "holder": self.holder},
            )


_Reading = tuple[float, float, float]
"""The database's clock, and this host's ``time.time()`` before and after reading it
(``Clock.observe``'s arguments)."""


class _LockThread:
    """The lock connection (a sync psycopg connection) and the thread that owns it: it
    takes the leader lock, bumps the epoch, then pings every ``ping_interval`` until it
    is stopped or a ping fails. Only this thread touches the connection. Python hands the
    GIL to a waiting thread every few milliseconds, so a ping comes back in time while the
    event loop is busy for seconds; and a ping stuck in the driver blocks this thread
    only, never the loop (the lease's watchdog notices that ``valid_until`` passed)."""

    def __init__(self, lease: Lease, loop: asyncio.AbstractEventLoop) -> None:
        self.url, self.holder, self.settings = lease.url, lease.holder, lease.settings
        self.lease = lease
        self.loop = loop
        self.won: asyncio.Future[tuple[int, _Reading | None]] = loop.create_future()
        """The new epoch and a first clock reading, once this thread holds the lock."""
        self.ended: asyncio.Future[None] = loop.create_future()
        """Done when the thread has closed its connection and exits."""
        self.valid_until = 0.0
        """Written by this thread only: see ``Lease.valid_until``."""
        self.backend_pid: int | None = None
        """The session that holds the lock; set by this thread once it won."""
        self.failure: str | None = None
        """Why a ping failed (set by this thread before it reports it)."""
        self.dropped = False
        """Loop side: the lease let go of this thread (``stop``)."""
        self._stop = threading.Event()
        self._unlock = False
        self._thread = threading.Thread(
            target=self._run, name=f"dex-lease {self.holder}", daemon=True
        )

    def start(self) -> None:
        self._thread.start()

    def stop(self, unlock: bool) -> None:
        """From the loop: stop trying or pinging, and close the connection (after
        ``pg_advisory_unlock`` if ``unlock``). Returns at once."""
        self.dropped = True
        self._unlock = unlock
        self._stop.set()

    def _run(self) -> None:
        conn: Conn | None = None
        try:
            conn = self._take()
            if conn is not None:
                self._ping(conn)
        except Exception as e:  # no lease row, or a bug: the loop hears of it either way
            if self.backend_pid is None:  # not won yet: acquire raises it
                self._to_loop(_reject, self.won, e)
            else:
                log.exception(
                    "the lease's lock thread failed",
                    extra={"action": "lease.thread_failed", "holder": self.holder},
                )
                self._fail(f"the lock thread failed: {e!r}")
        finally:
            if conn is not None:
                self._close(conn)
            self._to_loop(_resolve, self.ended, None)

    def _take(self) -> Conn | None:
        """Try the lock every ``retry_interval`` until it is won (then bump the epoch and
        return the connection) or ``stop`` is called (None)."""
        s = self.settings
        conn: Conn | None = None
        try:
            while not self._stop.is_set():
                try:
                    if conn is None or conn.closed:
                        conn = self._connect()
                    row = conn.execute("SELECT pg_try_advisory_lock(%s)", (LEADER_KEY,)).fetchone()
                    if row is not None and row[0] and not self._stop.is_set():
                        sent = time.monotonic()
                        epoch = self._bump(conn)
                        if epoch is None:  # stopped while batches held the fence
                            break
                        reading = _read_clock(conn)
                        self.valid_until = sent + s.valid_for
                        self.backend_pid = conn.info.backend_pid
                        self._to_loop(_resolve, self.won, (epoch, reading))
                        return conn
                except psycopg.Error as e:
                    log.warning(
                        "lease: cannot reach PostgreSQL: %s",
                        e,
                        extra={"action": "lease.retry", "holder": self.holder},
                    )
                    if conn is not None:
                        conn.close()  # frees the lock, if this session had it
                    conn = None
                self._stop.wait(s.retry_interval)
        except BaseException:
            if conn is not None:
                conn.close()
            raise
        if conn is not None:
            conn.close()  # stopped: frees the lock, if this session took it meanwhile
        return None

    def _ping(self, conn: Conn) -> None:
        """Ping until stopped; a ping that fails or comes back after ``ping_timeout`` ends
        the lease (and this thread)."""
        s = self.settings
        while not self._stop.wait(s.ping_interval):
            sent = time.monotonic()
            try:
                reading = _read_clock(conn)  # the ping reads the database's clock
            except psycopg.Error as e:
                self._fail(f"the lock connection failed a ping: {e!r}")
                return
            took = time.monotonic() - sent
            if took > s.ping_timeout:
                self._fail(f"a ping took {took:.2f}s, more than {s.ping_timeout:g}s")
                return
            self.valid_until = sent + s.valid_for
            self._to_loop(self.lease._observe, reading)

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
                conn.execute("SELECT pg_advisory_unlock(%s)", (LEADER_KEY,))
        conn.close()  # ending the session frees the lock in any case

    def _connect(self) -> Conn:
        s = self.settings
        timeout_ms = int(s.session_timeout * 1000)
        conn = psycopg.Connection.connect(
            self.url,
            autocommit=True,
            application_name=f"dex-lease {self.holder}",
            connect_timeout=max(2, int(s.session_timeout)),
            keepalives=1,
            keepalives_idle=1,
            keepalives_interval=1,
            keepalives_count=max(1, int(s.session_timeout) - 1),
            tcp_user_timeout=timeout_ms,
        )
        # The server's side of the same promise: end this session (and free the lock)
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

    def _bump(self, conn: Conn) -> int | None:
        """Bump the epoch in a transaction that holds the fence lock exclusively: taking it
        waits for the write batches in flight (each holds it shared until it ends), and
        from then on every batch of an older epoch is refused. Returns the new epoch, or
        None if ``stop`` was called meanwhile.

        A batch whose node stopped in the middle of it (SIGSTOP, a hung VM, a partition)
        holds the shared lock for as long as its session lives, and nothing ends that
        session soon: its pipeline sent no Sync, so PostgreSQL counts it as active, not
        idle in a transaction (``idle_in_transaction_session_timeout`` never fires), and
        the client's kernel still answers keepalives. So the bump waits at most
        ``fence_wait`` (``lock_timeout``), then ends the sessions that hold the lock
        shared (``pg_terminate_backend``) and asks again. That is safe: this node holds
        the leader lock, so they are writes of a node that lost it; a batch that had not
        committed rolls back, and it was never acknowledged (its node hears of a lost
        connection: ``CommitUnknown``, and steps down); a batch already committing
        finishes before its locks are released, so before the bump."""
        wait = f"{max(1, int(self.settings.fence_wait * 1000))}ms"
        warned = False
        while not self._stop.is_set():
            try:
                with conn.transaction():
                    conn.execute("SELECT set_config('lock_timeout', %s, true)", (wait,))
                    conn.execute("SELECT pg_advisory_xact_lock(%s)", (FENCE_KEY,))
                    row = conn.execute(BUMP, (self.holder,)).fetchone()
            except psycopg.errors.LockNotAvailable:
                warned = self._end_fence_holders(conn, warned)
                continue
            if row is None:
                raise StorageError("no lease row: open the PostgreSQL store first (migrations)")
            return int(row[0])
        return None

    def _end_fence_holders(self, conn: Conn, warned: bool) -> bool:
        """End the sessions that held the fence lock shared for ``fence_wait``. Without the
        right to (a role that is neither theirs nor in ``pg_signal_backend``) the bump
        keeps waiting, as it did before, and says why once. Returns whether it said so."""
        try:
            rows = conn.execute(END_FENCE_HOLDERS, (FENCE_KEY >> 32, FENCE_KEY & 0xFFFFFFFF))
            ended = rows.fetchall()
        except psycopg.errors.InsufficientPrivilege as e:
            if not warned:
                log.error(
                    "lease: write batches of a previous leader hold the fence lock for more "
                    "than %gs, and this role may not end their sessions (%s): the takeover "
                    "waits for them; grant it pg_signal_backend",
                    self.settings.fence_wait,
                    e,
                    extra={"action": "lease.fence_held", "holder": self.holder},
                )
            return True
        for pid, application, address, _ in ended:
            log.warning(
                "lease: ended session %s (%s at %s): its write batch held the fence lock for "
                "more than %gs; it rolls back unacknowledged",
                pid,
                application,
                address or "a local socket",
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
    if not future.done():  # an acquire cancelled meanwhile, or a release that gave up
        future.set_result(result)


def _reject(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
