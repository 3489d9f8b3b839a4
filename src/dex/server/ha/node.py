"""One node's life: standby until it leads, then recover and serve, until it stops
(a drain) or loses the lead (a step down).

    starting -> standby -> recovering -> active -> draining -> stopped
                                           \\-> stepped-down (the lease was lost: exit)

Only an ``active`` node answers ``/readyz`` with 200 and takes Worker connections; the
client API answers while ``active`` and while ``draining`` (new work queues in storage
for the next node). A node that loses the lead stops handing out Steps and answering
heartbeats at once and leaves: its process exits, and a supervisor starts it again as a
standby.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dex.errors import StorageError
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.ha.leadership import Leadership, Solo
from dex.server.metrics import node_gauges
from dex.server.sessions import Sessions
from dex.server.store.base import Store
from dex.wire.protocol import CLOSE_NOT_READY

log = logging.getLogger("dex.node")

SERVING = ("active", "draining")


class Node:
    def __init__(
        self,
        store: Store,
        dispatcher: Dispatcher,
        sessions: Sessions,
        leadership: Leadership,
        on_step_down: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.sessions = sessions
        self.leadership = leadership
        self.on_step_down = on_step_down
        self.role = "starting"
        self.epoch = 0
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
        self._task = asyncio.create_task(self._lead(), name="dex-node")
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
        self.role = "standby"
        if self.shared:
            log.info("standby: waiting for the lead", extra={"action": "node.standby"})
        self.epoch = await self.leadership.acquire()
        self.role = "recovering"
        self.store.fence_epoch = self.epoch  # every write now checks it (PostgreSQL)
        reason = "the node restarted" if self.epoch <= 1 else "a standby took over"
        failed = await self._recover(reason)
        attempts = self.sessions.attempts
        self.dispatcher.start(attempts.assign, attempts.expire, self.sessions.fire_timer)
        self.role = "active"
        self._active.set()
        log.info(
            "node active" if self.shared else "recovered from storage",
            extra={"action": "node.ready", "epoch": self.epoch, "failed_attempts": failed},
        )
        await self.leadership.lost.wait()
        self.step_down("the lease was lost")

    async def _recover(self, reason: str) -> int:
        """Run the recovery a start runs until it commits (it is idempotent): a storage
        error (the database restarting) is retried while the lease holds."""
        delay = 0.1
        while True:
            try:
                return await self.sessions.start(reason)
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
