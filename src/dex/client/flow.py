"""The Client's operator calls for flow control (docs/flow-control.md): model groups'
limits and tenants' budgets. They need an admin token when the server has auth on.
(A session's own budget is a session call: ``Client.set_budget``.)"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote


class FlowControl:
    """What ``Client`` does for an operator of flow control; it gives ``_request``."""

    _request: Callable[..., Awaitable[dict[str, Any]]]
    """``Client._request``: one request to whichever node serves."""

    async def get_limits(self) -> list[dict[str, Any]]:
        """The model groups with limits or calls: each one's ``limit`` (``concurrency``,
        ``rpm``, ``tpm``), its ``source`` (``config``, or ``api`` when set at run time), and
        its calls ``running`` and Steps ``waiting`` on the node that answered. Needs an
        admin token when the server has auth on (docs/flow-control.md)."""
        result = await self._request("GET", "/admin/limits")
        groups: list[dict[str, Any]] = result["groups"]
        return groups

    async def set_limit(
        self,
        group: str,
        *,
        concurrency: int | None = None,
        rpm: float | None = None,
        tpm: float | None = None,
    ) -> list[dict[str, Any]]:
        """Set a model group's limits at run time (stored; every node enforces them within
        seconds); a limit left out does not apply. Needs an admin token."""
        body = {"concurrency": concurrency, "rpm": rpm, "tpm": tpm}
        result = await self._request("PUT", f"/admin/limits/{quote(group)}", body)
        groups: list[dict[str, Any]] = result["groups"]
        return groups

    async def clear_limit(self, group: str) -> list[dict[str, Any]]:
        """Drop the limits set at run time for a group: the server config's apply again."""
        result = await self._request("DELETE", f"/admin/limits/{quote(group)}")
        groups: list[dict[str, Any]] = result["groups"]
        return groups

    async def list_tenants(self) -> list[dict[str, Any]]:
        """Each tenant with a budget or with usage this month: its ``budget``, and what its
        sessions' model calls used ``today`` and ``this_month`` (UTC: ``input_tokens``,
        ``output_tokens``, ``tokens``, ``cost_usd``, ``calls``), and ``reached`` (how its
        budget is used up, or None). Needs an admin token (docs/flow-control.md)."""
        result = await self._request("GET", "/admin/tenants")
        tenants: list[dict[str, Any]] = result["tenants"]
        return tenants

    async def get_tenant(self, tenant: str) -> dict[str, Any]:
        """One tenant's budget and usage, as ``list_tenants`` shows each."""
        tenant_view: dict[str, Any] = await self._request("GET", f"/admin/tenants/{quote(tenant)}")
        return tenant_view

    async def set_tenant_budget(
        self,
        tenant: str,
        *,
        max_tokens_per_day: int | None = None,
        max_cost_usd_per_day: float | None = None,
        max_tokens_per_month: int | None = None,
        max_cost_usd_per_month: float | None = None,
        by: str | None = None,
    ) -> dict[str, Any]:
        """Set what all of a tenant's sessions may use in a UTC day and month (at least one
        limit; one left out does not apply). Its sessions' turns that wait for it go on if
        it allows them. Needs an admin token. Returns the tenant as ``get_tenant`` does."""
        body = {
            "max_tokens_per_day": max_tokens_per_day,
            "max_cost_usd_per_day": max_cost_usd_per_day,
            "max_tokens_per_month": max_tokens_per_month,
            "max_cost_usd_per_month": max_cost_usd_per_month,
            "by": by,
        }
        path = f"/admin/tenants/{quote(tenant)}/budget"
        result: dict[str, Any] = await self._request("PUT", path, body, retry=True)
        return result

    async def remove_tenant_budget(self, tenant: str, *, by: str | None = None) -> dict[str, Any]:
        """Remove a tenant's budget: its sessions' turns that wait for it go on."""
        params = {"by": by} if by is not None else None
        path = f"/admin/tenants/{quote(tenant)}/budget"
        result: dict[str, Any] = await self._request("DELETE", path, params=params, retry=True)
        return result
