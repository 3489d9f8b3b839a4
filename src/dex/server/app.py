"""Builds the ASGI app of one Dex Server node and runs it."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import FrameType

import uvicorn
from fastapi import FastAPI
from starlette.types import ASGIApp

from dex import _loop
from dex.server.api import errors, ops, sessions, workers
from dex.server.api.auth import Auth, Role
from dex.server.api.responses import ORJSONResponse
from dex.server.config import ServerConfig
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.sessions import Sessions
from dex.server.store.sqlite import SqliteStore
from dex.wire.protocol import CLOSE_NOT_READY

log = logging.getLogger("dex.server")


def create_app(config: ServerConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = SqliteStore(config.database_path)
        await store.open()
        dispatcher = Dispatcher(config.heartbeat_timeout, config.reconnect_grace)
        domain = Sessions(store, dispatcher)
        app.state.store = store
        app.state.dispatcher = dispatcher
        app.state.sessions = domain
        failed = await domain.start()
        dispatcher.start(domain.assign, domain.expire, domain.fire_timer)
        app.state.ready = True
        app.state.role = "active"
        log.info("node ready", extra={"action": "node.ready", "failed_attempts": failed})
        try:
            yield
        finally:
            app.state.ready = False
            await dispatcher.stop()
            await domain.stop()
            await store.close()

    app = FastAPI(
        title="Dex",
        version="0.1.0",
        summary="A durable runtime for AI agents.",
        default_response_class=ORJSONResponse,
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.ready = False
    errors.install(app)
    app.include_router(ops.router)
    app.include_router(sessions.router)
    app.include_router(workers.router)
    return app


async def drain(app: FastAPI, timeout: float) -> int:
    """A graceful stop: hand out no new Step and fire no timer (new work queues, the API
    keeps answering), let running attempts finish for up to ``timeout`` seconds, then fail
    what is left, turn ``/readyz`` to 503 and close the Worker connections. Returns how
    many attempts failed."""
    state = app.state
    sessions: Sessions = state.sessions
    dispatcher = sessions.dispatcher
    state.role = "draining"
    dispatcher.pause()
    log.info(
        "draining: handing out nothing new, waiting up to %gs for %d running attempts",
        timeout,
        len(dispatcher.held),
        extra={"action": "node.draining", "running": len(dispatcher.held)},
    )
    failed = 0
    if not await dispatcher.wait_none_held(timeout):
        failed = await sessions.fail_held(
            f"the node stopped: its drain timeout ({timeout:g}s) passed"
        )
    state.ready = False
    dispatcher.close_all(CLOSE_NOT_READY, "the node is stopping")
    log.info("drained", extra={"action": "node.drained", "failed_attempts": failed})
    return failed


def asgi(config: ServerConfig) -> ASGIApp:
    return _wrap(create_app(config), config)


def _wrap(fastapi_app: FastAPI, config: ServerConfig) -> ASGIApp:
    """The layers in front of the routes: the body limit, and auth when it is on."""
    app = errors.BodyLimit(fastapi_app, config.max_body_bytes)
    tokens = {
        Role.CLIENT: config.client_token,
        Role.WORKER: config.worker_token,
        Role.ADMIN: config.admin_token,
    }
    configured = {role: token for role, token in tokens.items() if token}
    return Auth(app, configured) if configured else app


SWITCH_INTERVAL = 0.0005
"""Seconds a thread may hold the GIL while another waits (Python's default is 5 ms). The
SQLite writer thread needs the GIL briefly for each statement; with the default, a busy
event loop made every group commit wait milliseconds for it."""


class _Server(uvicorn.Server):
    """uvicorn, with a drain before it stops: the first SIGTERM or SIGINT drains the node
    (``drain``) and then exits; a second one exits at once."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout: float) -> None:
        super().__init__(config)
        self.app = app
        self.drain_timeout = drain_timeout
        self._draining: asyncio.Task[None] | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self._draining is not None or not self.app.state.ready:
            self.should_exit = True
            if sig == signal.SIGINT and self._draining is not None:
                self.force_exit = True
            return
        self._draining = asyncio.get_event_loop().create_task(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        try:
            await drain(self.app, self.drain_timeout)
        finally:
            self.should_exit = True


def serve(config: ServerConfig) -> None:
    """Run one node until SIGINT or SIGTERM (then drain, and exit)."""
    fastapi_app = create_app(config)
    server = _Server(
        uvicorn.Config(
            _wrap(fastapi_app, config),
            host=config.host,
            port=config.port,
            lifespan="on",
            log_level="warning",
            access_log=False,
            ws_max_size=64 << 20,
            timeout_graceful_shutdown=5,
        ),
        fastapi_app,
        config.drain_timeout,
    )
    sys.setswitchinterval(SWITCH_INTERVAL)
    _loop.run(server.serve())
