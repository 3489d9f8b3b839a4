"""Operations: liveness, readiness, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dex.errors import Conflict
from dex.server.api import models
from dex.server.api.auth import GUARDED
from dex.server.api.models import errors
from dex.server.api.responses import ORJSONResponse

router = APIRouter(tags=["operations"], responses=errors(500))


@router.get("/healthz", response_model=models.Health)
async def healthz() -> ORJSONResponse:
    return ORJSONResponse({"status": "ok"})


@router.get(
    "/readyz",
    response_model=models.Readiness,
    responses={503: {"model": models.Readiness, "description": "The node is starting."}},
)
async def readyz(request: Request) -> ORJSONResponse:
    node = request.app.state.node
    role = node.role if node is not None else "starting"
    if role == "active":
        return ORJSONResponse({"status": "ready", "role": role, "epoch": node.epoch})
    return ORJSONResponse({"status": "not ready", "role": role}, 503)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
        **errors(401, 403),
    },
    dependencies=GUARDED,
)
async def metrics(request: Request) -> Response:
    """Prometheus text: attempts and turns by outcome, latencies, queue depths, Workers,
    the store's commits, the node's role and epoch."""
    sessions = request.app.state.sessions
    return Response(generate_latest(sessions.metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.post(
    "/admin/step-down",
    status_code=202,
    response_model=models.Readiness,
    responses=errors(401, 403, 409),
    dependencies=GUARDED,
)
async def step_down(request: Request) -> ORJSONResponse:
    """A planned step-down: the node drains (running attempts finish within its drain
    timeout), gives the lease up at once, and exits; a standby takes over. Needs the admin
    token when auth is on."""
    step_down = getattr(request.app.state, "step_down", None)
    if step_down is None or not step_down():
        node = request.app.state.node
        role = node.role if node is not None else "starting"
        raise Conflict(f"this node is {role}: only an active node run by `dex server` steps down")
    return ORJSONResponse({"status": "stepping down", "role": "draining"}, 202)
