"""Operations: liveness, readiness, metrics."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from dex.server.api.responses import ORJSONResponse

router = APIRouter(tags=["operations"])


@router.get("/healthz")
async def healthz() -> ORJSONResponse:
    return ORJSONResponse({"status": "ok"})


@router.get("/readyz")
async def readyz(request: Request) -> ORJSONResponse:
    node = request.app.state.node
    role = node.role if node is not None else "starting"
    if role == "active":
        return ORJSONResponse({"status": "ready", "role": role, "epoch": node.epoch})
    return ORJSONResponse({"status": "not ready", "role": role}, 503)


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Prometheus text: attempts and turns by outcome, latencies, queue depths, Workers,
    the store's commits, the node's role and epoch."""
    sessions = request.app.state.sessions
    return Response(generate_latest(sessions.metrics.registry), media_type=CONTENT_TYPE_LATEST)
