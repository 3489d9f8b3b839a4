"""The model limits (docs/flow-control.md): ``GET /admin/limits``, and ``PUT`` or
``DELETE /admin/limits/{group}`` to change a group's at run time. An operator's routes:
they need the admin token when auth is on."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Request

from dex.server.api import models
from dex.server.api.auth import GUARDED
from dex.server.api.responses import ORJSONResponse
from dex.server.flow import Limit, ModelLimits

router = APIRouter(tags=["limits"], dependencies=GUARDED)

Group = Annotated[
    str,
    Path(
        min_length=1,
        max_length=200,
        pattern=r"^[^\x00-\x1f\x7f]+$",
        description="A model group: the `group` of an agent's model config, or the provider "
        "and the model (`anthropic/claude-sonnet-4-5`).",
    ),
]


def _limits(request: Request) -> ModelLimits:
    limits: ModelLimits = request.app.state.limits
    return limits


@router.get(
    "/admin/limits",
    response_model=models.LimitsView,
    responses=models.errors(401, 403, 500),
)
async def get_limits(request: Request) -> ORJSONResponse:
    """Each model group with limits, or with calls on this node: its limits, where they
    come from (`config`, or `api` when set at run time), and its calls running and Steps
    held queued on the node that answers."""
    return ORJSONResponse({"groups": _limits(request).view()})


@router.put(
    "/admin/limits/{group:path}",
    response_model=models.LimitsView,
    responses=models.errors(400, 401, 403, 404, 413, 422, 500, 503),
)
async def set_limit(request: Request, group: Group, limit: Limit) -> ORJSONResponse:
    """Set a model group's limits, stored and enforced at once on this node and within
    seconds on every node of a cluster; they replace the server config's for the group.
    `{}` lifts every limit of the group."""
    limits = _limits(request)
    await limits.set(group, limit)
    return ORJSONResponse({"groups": limits.view()})


@router.delete(
    "/admin/limits/{group:path}",
    response_model=models.LimitsView,
    responses=models.errors(401, 403, 404, 422, 500, 503),
)
async def clear_limit(request: Request, group: Group) -> ORJSONResponse:
    """Drop the limits set at run time for a group: the server config's apply again."""
    limits = _limits(request)
    await limits.clear(group)
    return ORJSONResponse({"groups": limits.view()})
