"""One node's life: it joins (a cluster on PostgreSQL) or leads from the start (SQLite),
recovers and serves, until it stops (a drain) or loses its lease (a step down).

    starting -> standby -> recovering -> active -> draining -> stopped
                                           \\-> stepped-down (the lease was lost: exit)

On SQLite the node leads alone (``Solo``). On PostgreSQL it joins the cluster
(``dex.server.ha.lease``): a node that is not a standby is ``active`` at once and takes
its share of the partitions (``dex.server.ha.cluster``), recovering each batch of
partitions it takes before serving them, and hands partitions over (drained) when others
join; a standby stays ``standby`` until it stands in for nodes that are gone.

Only an ``active`` node answers ``/readyz`` with 200 and takes Worker connections; the
client API answers while ``active`` and while ``draining`` (new work queues in storage
for the next node). A node that loses its lease stops handing out Steps and answering
heartbeats at once and leaves: its process exits, and a supervisor starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from dex.errors import StorageError
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.ha.cluster import Cluster, View
from dex.server.ha.leadership import Leadership, Solo
from dex.server.metrics import node_gauges
from dex.server.sessions import Sessions
from dex.server.store.base import Store
from dex.wire.protocol import CLOSE_NOT_READY

if TYPE_CHECKING:
    from dex.server.ha.lease import Lease  # psycopg: only on PostgreSQL

log = logging.getLogger("dex.node")

SERVING = ("active", "draining")


class Node:
    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        sessions: Sessions,
        leadership: Leadership | Lease,
        on_step_down: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.sessions = sessions
        self.leadership = leadership
        self.on_step_down = on_step_down
        self.role = "starting"
        self.epoch = 0
        self.cluster: Cluster | None = None
        """On PostgreSQL: this node's partitions and the cluster's view; None on SQLite."""
        self.handover_timeout = 20.0
        """How long a partition handed over waits for its running attempts to finish
        before they fail (``dex server --drain-timeout``)."""
        self._members: list[str] = []
        """The addresses Workers should be connected to (every node that serves)."""
        self._to_recover: set[int] = set()
        self._settled = asyncio.Event()
        """Set while no partition is being taken or recovered here (``settled``)."""
        self._settled.set()
        self._active = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        sessions.metrics.watch(lambda: node_gauges(self))

    @property
    def serving(self) -> bool:
        """Whether the client API is served (active, or draining)."""
        return self.role in SERVING

    async def start(self, *, wait: bool) -> None:
        """Start leading in the background; with ``wait``, return once active (a node
        that leads from the start recovers before it answers anything)."""
        run = self._join() if getattr(self.leadership, "clustered", False) else self._lead()
        self._task = asyncio.create_task(run, name="dex-node")
        self._task.add_done_callback(self._lead_ended)
        if wait:
            active = asyncio.create_task(self._active.wait())
            done, _ = await asyncio.wait([self._task, active], return_when=asyncio.FIRST_COMPLETED)
            if self._task in done:
                active.cancel()
                self._task.result()  # raises why it could not start

    @property
    def shared(self) -> bool:
        """Whether other nodes may lead instead (they share a database): only then do its
        roles (standby, active) mean anything to a person."""
        return not isinstance(self.leadership, Solo)

    async def _lead(self) -> None:
        """A node alone (the embedded one): wait for the lead, recover everything, serve."""
        self.role = "standby"
        self.epoch = await cast(Leadership, self.leadership).acquire()
        self.role = "recovering"
        failed = await self._recover("the node restarted")
        attempts = self.sessions.attempts
        self.dispatcher.start(attempts.assign, attempts.expire, self.sessions.fire_timer)
        self.role = "active"
        self._active.set()
        log.info(
            "recovered from storage",
            extra={"action": "node.ready", "epoch": self.epoch, "failed_attempts": failed},
        )
        await self.leadership.lost.wait()
        self.step_down("the lease was lost")

    async def _recover(self, reason: str, partitions: set[int] | None = None) -> int:
        """Run the recovery a start runs until it commits (it is idempotent): a storage
        error (the database restarting) is retried while the lease holds. ``partitions``:
        only those (a cluster node that took them)."""
        cluster = self.cluster
        only = None
        if cluster is not None and partitions is not None:
            only = lambda session_id: cluster.partition(session_id) in partitions  # noqa: E731
        delay = 0.1
        while True:
            try:
                if only is None:
                    return await self.sessions.start(reason)
                return await self.sessions.start(reason, partitions=only)
            except StorageError as e:
                if self.leadership.lost.is_set():
                    raise
                log.warning(
                    "recovery failed, trying again in %.1fs: %s",
                    delay,
                    e,
                    extra={"action": "node.recovery_retry"},
                )
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    # --- a cluster on PostgreSQL ------------------------------------------------------

    @property
    def _lease(self) -> Lease:
        return cast("Lease", self.leadership)

    async def _join(self) -> None:
        """Join the cluster, then take, recover, serve and hand over partitions as each
        ping's view says (``_on_view``), until the lease is lost."""
        lease = self._lease
        cluster = Cluster(lease.holder, self.store.partition_count, lease.standby)
        self.cluster = cluster
        self.store.fence = cluster.epochs  # every write now checks its partition's epoch
        self.sessions.serves = cluster.serves
        self.sessions.reads.serves = cluster.serves
        self.dispatcher.dispatches = cluster.dispatches
        self.dispatcher.limits.share = lambda: len(cluster.serving) / cluster.partition_count
        self.sessions.attempts.members = lambda: list(self._members)
        self.sessions.attempts.recovered = cluster.recovered
        self.role = "standby" if lease.standby else "starting"
        if lease.standby:
            log.info("standby: waiting for nodes to stand in for", extra={"action": "node.standby"})
        lease.on_view = self._on_view
        lease.on_taken = self._on_taken
        view = await lease.join()
        await self.sessions.load_agents()
        attempts = self.sessions.attempts
        self.dispatcher.start(attempts.assign, attempts.expire, self.sessions.fire_timer)
        if not lease.standby:
            self._serve()
        self._on_view(view)
        await lease.lost.wait()
        self.step_down("the lease was lost")

    def _serve(self) -> None:
        if self.role in ("starting", "standby"):
            self.role = "active"
            self._active.set()
            log.info(
                "node active",
                extra={"action": "node.ready", "node_id": self.cluster and self.cluster.node_id},
            )

    def _on_view(self, view: View) -> None:
        """A ping's view of the cluster (on the loop): take or give partitions."""
        cluster = self.cluster
        if cluster is None or self.role in ("stepped-down", "draining", "stopped"):
            return
        cluster.view = view
        members = cluster.worker_addresses()
        if members != self._members:
            self._members = members
            self.sessions.attempts.announce_members(members)
        plan = cluster.next_plan()
        if plan.lead:
            self._lease.lead()
        if plan.take:
            cluster.taking.update(plan.take)
            self._moved()
            self._lease.take(plan.take)
        give = {p for p in plan.give if p in cluster.serving}
        if give:
            cluster.serving -= give
            cluster.draining |= give
            self.sessions.supervisor.spawn(self._hand_over(give))

    def _on_taken(self, partition: int, epoch: int | None) -> None:
        """The lock thread took ``partition`` (with its new epoch) or missed it (None)."""
        cluster = self.cluster
        assert cluster is not None
        cluster.taking.discard(partition)
        if epoch is not None:
            cluster.epochs[partition] = epoch
            cluster.recovering.add(partition)
            self.epoch = max(self.epoch, epoch)
            self._to_recover.add(partition)
        if not cluster.taking and self._to_recover:
            taken, self._to_recover = self._to_recover, set()
            self.sessions.supervisor.spawn(self._take_over(taken))
        self._moved()

    async def _take_over(self, partitions: set[int]) -> None:
        """Recover the sessions of partitions just taken, then serve them."""
        cluster = self.cluster
        assert cluster is not None
        started = time.monotonic()
        # nothing this node may have read of them while another node owned them counts
        self.sessions.forget(lambda session_id: cluster.partition(session_id) in partitions)
        failed = await self._recover("its partition was taken over by another node", partitions)
        cluster.recovering -= partitions
        cluster.serving |= partitions
        self._moved()
        self._serve()
        log.info(
            "took %d partitions",
            len(partitions),
            extra={
                "action": "node.partitions_taken",
                "partitions": sorted(partitions),
                "failed_attempts": failed,
                "recovery_seconds": round(time.monotonic() - started, 3),
            },
        )

    def _moved(self) -> None:
        """Partitions began or ended coming in (taken, being recovered)."""
        cluster = self.cluster
        if cluster is not None and (cluster.taking or cluster.recovering):
            self._settled.clear()
        else:
            self._settled.set()

    async def settled(self, timeout: float) -> None:
        """Wait, up to ``timeout``, until no partition is being taken or recovered here:
        a reconnecting Worker's hello waits for this, for the attempts it claims may be
        in such a partition, and can be reclaimed only once it is recovered
        (``Dispatcher.await_reclaim``)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._settled.wait(), timeout)

    async def _hand_over(self, partitions: set[int]) -> None:
        """Give partitions up: hand out nothing new of theirs, let their running attempts
        finish (up to ``handover_timeout``; then they fail), stop writing to them, forget
        their sessions, free their locks."""
        cluster = self.cluster
        assert cluster is not None

        def in_them(session_id: str) -> bool:
            return cluster.partition(session_id) in partitions

        deadline = time.monotonic() + self.handover_timeout
        # a Step handed out in a commit still in flight is held once it is durable: wait
        # for that too, or its attempt would run on past the hand-over, and the next
        # owner would fail it as cut off
        while time.monotonic() < deadline and self.dispatcher.busy(in_them):
            await asyncio.sleep(0.05)
        failed = await self.sessions.fail_held(
            f"its partition was handed over to another node, and it did not finish within "
            f"{self.handover_timeout:g}s",
            only=in_them,
        )
        for p in partitions:
            cluster.epochs.pop(p, None)  # the store refuses writes to them from here on
        self.sessions.forget(in_them)
        self.sessions.streams.end_sessions(in_them)
        cluster.draining -= partitions
        self._lease.give(sorted(partitions))
        log.info(
            "handed over %d partitions",
            len(partitions),
            extra={
                "action": "node.partitions_given",
                "partitions": sorted(partitions),
                "failed_attempts": failed,
            },
        )

    def _lead_ended(self, task: asyncio.Task[None]) -> None:
        """Nothing may fail here unseen: a node that cannot lead steps down (and leaves)."""
        if task.cancelled() or task.exception() is None:
            return
        log.error(
            "the node cannot lead",
            exc_info=task.exception(),
            extra={"action": "node.lead_failed", "epoch": self.epoch},
        )
        self.step_down(f"leading failed: {task.exception()!r}")

    def step_down(self, why: str) -> None:
        """Stop serving at once: no hand-out, no timer, no heartbeat reply; close the
        Workers (they move on to the next address); then leave."""
        if self.role == "stepped-down":
            return
        self.role = "stepped-down"
        self.dispatcher.pause()
        self.dispatcher.close_all(CLOSE_NOT_READY, "this node stepped down")
        log.error("stepping down: %s", why, extra={"action": "node.step_down", "epoch": self.epoch})
        if self.on_step_down is not None:
            self.on_step_down()

    def lease_valid(self) -> bool:
        """Whether answers from memory (heartbeat replies, start acks) may be given now."""
        return self.role in SERVING and self.leadership.valid()

    async def drain(self, timeout: float) -> int:
        """A graceful stop: hand out no new Step and fire no timer (new work queues, the
        API keeps answering), let running attempts finish for up to ``timeout`` seconds,
        then fail what is left, close the Worker connections and give up the lead at once.
        Returns how many attempts failed."""
        if self.role != "active":
            return 0
        self.role = "draining"
        self.dispatcher.pause()
        log.info(
            "draining: handing out nothing new, waiting up to %gs for %d running attempts",
            timeout,
            len(self.dispatcher.held),
            extra={"action": "node.draining", "running": len(self.dispatcher.held)},
        )
        failed = 0
        if not await self.dispatcher.wait_none_held(timeout):
            failed = await self.sessions.fail_held(
                f"the node stopped: its drain timeout ({timeout:g}s) passed"
            )
        self.role = "stopped"
        if self.cluster is not None:
            # a call that came in before the stop may still be on its way to a commit: it
            # is refused here (503: its client asks the next owner), as the next owner
            # would fence it once it took the partition, making this node step down
            self.cluster.epochs.clear()
        self.sessions.reads.end_waits()
        self.dispatcher.close_all(CLOSE_NOT_READY, "the node is stopping")
        await self.leadership.release()
        log.info("drained", extra={"action": "node.drained", "failed_attempts": failed})
        return failed

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        await self.dispatcher.stop()
        await self.sessions.stop()
        await self.leadership.release()
