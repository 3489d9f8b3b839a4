"""The tenants' budgets and usage (docs/flow-control.md, A tenant's budget):
``GET /admin/tenants``, ``GET /admin/tenants/{tenant}``, and ``PUT`` or ``DELETE
/admin/tenants/{tenant}/budget``. An operator's routes: they need the admin token when
auth is on (a tenant's own client token cannot raise its budget)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Path, Query, Request
from pydantic import Field, model_validator

from dex.server.api import models
from dex.server.api.auth import GUARDED
from dex.server.api.responses import ORJSONResponse
from dex.server.fleet import TENANT
from dex.server.flow import TenantBudget, TenantBudgets
from dex.server.sessions import Sessions
from dex.wire import Wire

log = logging.getLogger("dex.flow")

router = APIRouter(tags=["tenants"], dependencies=GUARDED)

TenantName = Annotated[
    str,
    Path(pattern=f"^{TENANT.pattern}$", description="A tenant: 1-64 letters, digits or `_.-`."),
]


class SetTenantBudget(Wire):
    """What all of a tenant's sessions may use in a UTC day and in a UTC month: give one
    limit or more."""

    max_tokens_per_day: int | None = Field(None, ge=1, le=1 << 62)
    max_cost_usd_per_day: float | None = Field(None, gt=0, le=1e12, allow_inf_nan=False)
    max_tokens_per_month: int | None = Field(None, ge=1, le=1 << 62)
    max_cost_usd_per_month: float | None = Field(None, gt=0, le=1e12, allow_inf_nan=False)
    by: str | None = Field(None, max_length=200, description="Who changes it.")

    @model_validator(mode="after")
    def _a_limit(self) -> SetTenantBudget:
        if self.limits() == TenantBudget():
            raise ValueError(
                "a tenant's budget sets max_tokens_per_day, max_cost_usd_per_day, "
                "max_tokens_per_month or max_cost_usd_per_month (to remove it: "
                "DELETE /admin/tenants/{tenant}/budget)"
            )
        return self

    def limits(self) -> TenantBudget:
        return TenantBudget(
            max_tokens_per_day=self.max_tokens_per_day,
            max_cost_usd_per_day=self.max_cost_usd_per_day,
            max_tokens_per_month=self.max_tokens_per_month,
            max_cost_usd_per_month=self.max_cost_usd_per_month,
        )


def _tenants(request: Request) -> TenantBudgets:
    sessions: Sessions = request.app.state.sessions
    return sessions.tenants


@router.get("/admin/tenants", response_model=models.Tenants, responses=models.errors(401, 403, 500))
async def list_tenants(request: Request) -> ORJSONResponse:
    """Each tenant with a budget or with usage this month: its budget and what its
    sessions' model calls used today and this month (UTC), as storage counts them."""
    return ORJSONResponse({"tenants": await _tenants(request).view()})


@router.get(
    "/admin/tenants/{tenant}",
    response_model=models.Tenant,
    responses=models.errors(401, 403, 422, 500),
)
async def get_tenant(request: Request, tenant: TenantName) -> ORJSONResponse:
    """A tenant's budget and usage (a tenant with neither shows no budget and zeros)."""
    [view] = await _tenants(request).view(tenant)
    return ORJSONResponse(view)


@router.put(
    "/admin/tenants/{tenant}/budget",
    response_model=models.Tenant,
    responses=models.errors(400, 401, 403, 413, 422, 500, 503),
)
async def set_tenant_budget(
    request: Request, tenant: TenantName, body: SetTenantBudget
) -> ORJSONResponse:
    """Set a tenant's budget, stored and enforced at once on this node and within seconds
    on every node of a cluster. Turns of its sessions that wait for it go on if it allows
    them (each queues its model call once)."""
    return ORJSONResponse(await _change(request, tenant, body.limits(), body.by))


@router.delete(
    "/admin/tenants/{tenant}/budget",
    response_model=models.Tenant,
    responses=models.errors(401, 403, 422, 500, 503),
)
async def remove_tenant_budget(
    request: Request,
    tenant: TenantName,
    by: Annotated[str | None, Query(max_length=200, description="Who removes it.")] = None,
) -> ORJSONResponse:
    """Remove a tenant's budget: no limit. Turns of its sessions that wait for it go on."""
    return ORJSONResponse(await _change(request, tenant, None, by))


async def _change(
    request: Request, tenant: str, budget: TenantBudget | None, by: str | None
) -> dict[str, object]:
    tenants = _tenants(request)
    await tenants.set(tenant, budget, by)
    log.info(
        "tenant %s: budget %s",
        tenant,
        "removed" if budget is None else "set",
        extra={"action": "tenant_budget.changed", "tenant": tenant, "by": by},
    )
    [view] = await tenants.view(tenant)
    return view
