"""Builds the ASGI app of one Dex Server node and runs it."""

from __future__ import annotations

import asyncio
import errno
import inspect
import logging
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from types import FrameType
from typing import TYPE_CHECKING, Any, NoReturn

import uvicorn
from fastapi import FastAPI
from fastapi.responses import RedirectResponse
from starlette.types import ASGIApp

import dex
from dex import _loop
from dex.errors import DexError
from dex.server.api import cluster, errors, hot, limits, ops, sessions, tenants, workers
from dex.server.api.auth import Auth
from dex.server.api.browsers import Browsers
from dex.server.api.forward import Forward
from dex.server.api.gate import StandbyGate
from dex.server.api.peers import Peers
from dex.server.api.ratelimit import RateLimits
from dex.server.api.responses import ORJSONResponse
from dex.server.api.tokens import Role, Tokens, check_rate_limit
from dex.server.clock import Clock
from dex.server.config import ServerConfig
from dex.server.console import routes as console
from dex.server.dispatch.dispatcher import Dispatcher
from dex.server.engine.budget import DEFAULT_PRICES, Price, Prices
from dex.server.flow import ModelLimits
from dex.server.ha.leadership import Leadership, Solo
from dex.server.ha.node import Node
from dex.server.pages import PREFIX as CONSOLE
from dex.server.sessions import Sessions
from dex.server.start_lines import announce
from dex.server.store.base import Store
from dex.server.store.open import open_store
from dex.server.streams import open_streams

if TYPE_CHECKING:
    from dex.server.ha.lease import Lease  # psycopg: only on PostgreSQL

log = logging.getLogger("dex.server")


def create_app(
    config: ServerConfig,
    leadership: Leadership | None = None,
    on_step_down: Callable[[], None] | None = None,
    tracer_provider: Any = None,
    on_store_lost: Callable[[], None] | None = None,
) -> FastAPI:
    """The node's FastAPI app. ``leadership``: the lease it must hold to serve (default:
    ``Solo``, the embedded node that leads from the start). ``on_step_down``: what to do
    when the lead is lost (``serve`` exits the process). ``tracer_provider``: where spans
    go when ``config.tracing`` is on (default: OpenTelemetry's global provider).
    ``on_store_lost``: what to do when the store can no longer write (``serve`` exits)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = open_store(config.database_url, config.partitions)
        store.on_lost = on_store_lost
        await store.open()  # a DexError says why it cannot start (``serve`` logs it)
        dispatcher = Dispatcher(
            config.heartbeat_timeout,
            config.reconnect_grace,
            reclaim_window=config.reclaim_window,
        )
        streams = open_streams(config.streams)
        await streams.start()
        domain = Sessions(
            store,
            dispatcher,
            streams,
            tracing=_tracing(config, tracer_provider),
            prices=_prices(config),
        )
        dispatcher.weights = dict(config.tenant_weights)
        model_limits = ModelLimits(store, dispatcher.limits, config.model_limits)
        await model_limits.load()
        domain.tenants.cluster = _postgres(config)
        await domain.tenants.load()
        if _postgres(config):  # a cluster: the other nodes change them too
            dispatcher.supervisor.spawn(model_limits.follow())
        dispatcher.supervisor.spawn(domain.tenants.follow())  # new days end waits too

        lead = leadership or _leadership(config, store, dispatcher.clock)
        node = Node(store, dispatcher, domain, lead, on_step_down)
        node.handover_timeout = config.drain_timeout
        app.state.store = store
        app.state.dispatcher = dispatcher
        app.state.sessions = domain
        app.state.limits = model_limits
        model_limits.node_id = lambda: node.cluster.node_id if node.cluster else None
        app.state.node = node
        try:
            # a node that leads from the start recovers before it answers anything
            await node.start(wait=isinstance(lead, Solo))
            yield
        finally:
            await node.stop()
            await app.state.peers.close()
            await streams.close()
            await store.close()

    app = FastAPI(
        title="Dex",
        version=dex.__version__,
        summary="A durable runtime for AI agents.",
        default_response_class=ORJSONResponse,
        lifespan=lifespan,
        generate_unique_id_function=lambda route: route.name,
        # a body is JSON only when its content type says so: a page of another site can
        # send a body of no content type, or text/plain, without the browser asking first
        strict_content_type=True,
        **_fastapi_telemetry(config, tracer_provider),
    )
    app.state.config = config
    app.state.node = None
    app.state.peers = Peers()  # the HTTP client to the other nodes of a cluster
    errors.install(app)
    app.add_middleware(StandbyGate)
    app.include_router(ops.router)
    app.include_router(sessions.router)
    app.include_router(workers.router)
    app.include_router(cluster.router)
    app.include_router(limits.router)
    app.include_router(tenants.router)
    app.include_router(console.router)  # the web console at /ui (docs/console.md)
    app.add_api_route("/", lambda: RedirectResponse(CONSOLE), include_in_schema=False, name="root")
    return app


QUIET_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})


def _fastapi_telemetry(config: ServerConfig, provider: Any) -> dict[str, Any]:
    """FastAPI's own OpenTelemetry (FastAPI 0.16x): off unless tracing is on, and then only
    the spans of HTTP requests; no span for a Worker's WebSocket (it lives for hours), the
    probes or ``/metrics``. Dex has its own metrics and logs."""
    if "telemetry" not in inspect.signature(FastAPI.__init__).parameters:
        return {}  # an older FastAPI: it has none
    return {
        "telemetry": {
            "tracing": config.tracing,
            "tracer_provider": provider,
            "metrics": False,
            "logs": False,
            "operation_spans": False,
            "auto_configure": False,
            "exclude": lambda scope: scope["type"] != "http" or scope["path"] in QUIET_PATHS,
        }
    }


def _prices(config: ServerConfig) -> Prices:
    """The prices Dex ships, with the configured ones over them."""
    table = dict(DEFAULT_PRICES)
    table.update((name, Price(input=p.input, output=p.output)) for name, p in config.prices.items())
    return Prices(table)


def _tracing(config: ServerConfig, provider: Any) -> Any:
    if not config.tracing:
        return None
    from dex.server.tracing import Tracing  # OpenTelemetry: only when tracing is on

    return Tracing(provider)


def _leadership(config: ServerConfig, store: Store, clock: Clock) -> Leadership | Lease:
    """The embedded SQLite node leads from the start; nodes sharing PostgreSQL share its
    partitions out (docs/cluster.md), and a write that was fenced or whose commit is
    unknown loses the node its lease."""
    if _postgres(config):
        from dex.server.ha.lease import Lease  # psycopg is an optional extra
        from dex.server.store.postgres import PostgresStore

        assert isinstance(store, PostgresStore)
        lease = Lease(store.url, clock=clock, address=config.address, standby=config.standby)
        store.on_fatal = lambda e: lease.lose(f"{e.code}: {e.message}")
        return lease
    return Solo()


def _postgres(config: ServerConfig) -> bool:
    return config.database_url.startswith(("postgresql://", "postgres://"))


def asgi(config: ServerConfig, tracer_provider: Any = None) -> ASGIApp:
    return _wrap(create_app(config, tracer_provider=tracer_provider), config)


def _wrap(fastapi_app: FastAPI, config: ServerConfig) -> ASGIApp:
    """The layers in front of the routes: the forwarding of a cluster's calls to the node
    that serves their session, the refusal of requests from other sites' pages (and the
    console's security headers), auth and rate limits when they are on, the body limit, and
    the message send served without the framework (``hot``). The node's tokens
    are ``app.state.tokens`` (SIGHUP reads the file again)."""
    # with tracing on, every request goes through FastAPI, whose spans the turns link to
    routes: ASGIApp = fastapi_app if config.tracing else hot.HotRoutes(fastapi_app)
    app: ASGIApp = errors.BodyLimit(routes, config.max_body_bytes)
    tokens = Tokens(
        {
            Role.CLIENT: config.client_token,
            Role.WORKER: config.worker_token,
            Role.ADMIN: config.admin_token,
        },
        config.tokens_file,
    )
    fastapi_app.state.tokens = tokens
    if config.rate_limit is not None:
        check_rate_limit(config.rate_limit)
    limited = config.rate_limit is not None or any(t.rate_limit for t in tokens.tokens)
    limits = RateLimits(config.rate_limit) if limited or config.tokens_file else None
    fastapi_app.state.rate_limits = limits
    guarded = Auth(app, tokens, limits) if tokens.enabled or limits is not None else app
    # a call about a session another node serves goes there before anything else: the
    # owner checks where it comes from, its token, rate limit and body, once
    return Forward(Browsers(guarded), fastapi_app, config.max_body_bytes)


STARTUP_FAILED = 3
"""The exit status of a node that could not start (its address could not be bound, its
store would not open, a setting was refused), as uvicorn's."""

SWITCH_INTERVAL = 0.0005
"""Seconds a thread may hold the GIL while another waits (Python's default is 5 ms). Set
when the SQLite writer was a thread of the node, which needed the GIL for each statement
(with the default a busy event loop made every group commit wait milliseconds); kept for
the threads the node still runs (the PostgreSQL lease's, ``asyncio.to_thread``)."""


class _Server(uvicorn.Server):
    """uvicorn, with a drain before it stops: the first SIGTERM or SIGINT drains the node
    (``drain``) and then exits; a second one exits at once."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, drain_timeout: float) -> None:
        super().__init__(config)
        self.app = app
        self.drain_timeout = drain_timeout
        self._draining: asyncio.Task[None] | None = None
        app.state.step_down = self.step_down

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            announce(self.app.state.config, self.app.state.tokens.enabled)

    def step_down(self) -> bool:
        """A planned step-down (``POST /admin/step-down``, or the first SIGTERM): drain,
        give the lease up, exit. False if the node is not active (nothing to step down)."""
        node: Node | None = self.app.state.node
        if self._draining is not None or node is None or node.role != "active":
            return False
        self._draining = asyncio.get_event_loop().create_task(self._drain_then_exit(node))
        return True

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if not self.step_down():
            self.should_exit = True
            if sig == signal.SIGINT and self._draining is not None:
                self.force_exit = True

    async def _drain_then_exit(self, node: Node) -> None:
        try:
            await node.drain(self.drain_timeout)
        finally:
            self.should_exit = True


WS_MAX_SIZE = 64 << 20
"""The largest WebSocket message (a Worker's frame) the node takes, in bytes."""

STEPPED_DOWN = 4
"""The exit status of a node that lost the lead: restart it, and it comes back a standby."""


def _exit_stepped_down() -> None:
    logging.shutdown()
    os._exit(STEPPED_DOWN)  # nothing in flight here may be trusted any more: leave now


STORE_LOST = 5
"""The exit status of a node whose store could no longer write (its SQLite writer process
died): restart it, and it recovers from what was committed."""


def _exit_store_lost() -> None:
    logging.shutdown()
    os._exit(STORE_LOST)  # what was in flight has an unknown outcome: recover from storage


def serve(config: ServerConfig, leadership: Leadership | None = None) -> None:
    """Run one node until SIGINT or SIGTERM (then drain, and exit); SIGHUP reads the
    tokens file again. It binds its address first, then opens its store and recovers,
    then serves: a start-up error is one line and exit status ``STARTUP_FAILED``."""
    fastapi_app = create_app(
        config, leadership, on_step_down=_exit_stepped_down, on_store_lost=_exit_store_lost
    )
    try:
        app = _wrap(fastapi_app, config)
    except DexError as e:
        _cannot_start(e.message)
    try:
        listener = _bind(config)
    except OSError as e:
        _cannot_start(_bind_error(config, e))
    server = _Server(
        uvicorn.Config(
            app,
            host=config.host,
            port=config.port,
            lifespan="off",  # run by ``_run``: a store that will not open is one line
            log_level="warning",
            access_log=False,
            # no access log; a rate limit with auth off keys on the peer's own address
            proxy_headers=False,
            server_header=False,  # uvicorn checks each header of every response
            ws_max_size=WS_MAX_SIZE,
            timeout_graceful_shutdown=5,
            ssl_certfile=config.tls_cert,
            ssl_keyfile=config.tls_key,
        ),
        fastapi_app,
        config.drain_timeout,
    )
    tokens: Tokens = fastapi_app.state.tokens
    signal.signal(signal.SIGHUP, lambda sig, frame: tokens.reload())
    sys.setswitchinterval(SWITCH_INTERVAL)
    _loop.tune_gc()
    if not _loop.run(_run(server, fastapi_app, listener)):
        sys.exit(STARTUP_FAILED)


async def _run(server: _Server, app: FastAPI, listener: socket.socket) -> bool:
    """Open the store and recover (the app's lifespan), then serve on ``listener`` until
    told to stop. False if the node could not start."""
    async with AsyncExitStack() as stack:
        try:
            await stack.enter_async_context(app.router.lifespan_context(app))
        except DexError as e:
            listener.close()
            _start_failed(e.message)
            return False
        await server.serve(sockets=[listener])
    return server.started


def _bind(config: ServerConfig) -> socket.socket:
    """The listening socket, bound before the node claims anything (a port in use fails
    here, before the store opens)."""
    host = config.host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, config.port), family=family, backlog=2048)


def _bind_error(config: ServerConfig, e: OSError) -> str:
    why = (e.strerror or str(e)).split(" (while attempting")[0]  # create_server's addition
    if e.errno == errno.EADDRINUSE:
        why = "the port is in use (another Dex server?): stop it, or choose another --listen"
    elif e.errno == errno.EADDRNOTAVAIL:
        why = "no network interface of this machine has that address"
    return f"cannot listen on {config.listen}: {why}"


def _cannot_start(why: str) -> NoReturn:
    _start_failed(why)
    sys.exit(STARTUP_FAILED)


def _start_failed(why: str) -> None:
    one_line = " ".join(why.split())  # a driver's message may span lines
    log.error("cannot start: %s", one_line, extra={"action": "node.start_failed"})
