"""Builds the ASGI app of one Dex Server node and runs it."""

from __future__ import annotations

import logging
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

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

log = logging.getLogger("dex.server")


def create_app(config: ServerConfig) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = SqliteStore(config.database_path)
        await store.open()
        dispatcher = Dispatcher(config.heartbeat_timeout)
        domain = Sessions(store, dispatcher)
        app.state.store = store
        app.state.dispatcher = dispatcher
        app.state.sessions = domain
        failed = await domain.start()
        dispatcher.start(domain.assign, domain.expire, domain.fire_timer)
        app.state.ready = True
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
        generate_unique_id_function=lambda route: route.name,
    )
    app.state.config = config
    app.state.ready = False
    errors.install(app)
    app.include_router(ops.router)
    app.include_router(sessions.router)
    app.include_router(workers.router)
    return app


def asgi(config: ServerConfig) -> ASGIApp:
    app = errors.BodyLimit(create_app(config), config.max_body_bytes)
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


def serve(config: ServerConfig) -> None:
    """Run one node until SIGINT or SIGTERM."""
    server = uvicorn.Server(
        uvicorn.Config(
            asgi(config),
            host=config.host,
            port=config.port,
            lifespan="on",
            log_level="warning",
            access_log=False,
            ws_max_size=64 << 20,
            timeout_graceful_shutdown=5,
        )
    )
    sys.setswitchinterval(SWITCH_INTERVAL)
    _loop.run(server.serve())
