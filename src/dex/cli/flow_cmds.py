"""The operator's flow-control commands (docs/flow-control.md): ``dex limits`` (the model
groups' limits) and ``dex tenants`` (the tenants' budgets and usage). They send
``DEX_ADMIN_TOKEN`` when it is set: the routes need the admin token when auth is on."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import typer

from dex._address import DEFAULT_ADDRESS
from dex.cli.client_cmds import Address, By, JsonFlag, _call

if TYPE_CHECKING:
    from dex.client import SyncClient

app = typer.Typer()

limits_app = typer.Typer(
    help="The model limits (docs/flow-control.md): list them, or set and clear a group's at "
    "run time. Sends DEX_ADMIN_TOKEN when set (they need the admin token when auth is on).",
    invoke_without_command=True,
)
app.add_typer(limits_app, name="limits")


def _admin_call(address: str, action: Callable[[SyncClient], Any]) -> None:
    """``_call`` with the admin token, when one is set."""
    _call(address, action, os.environ.get("DEX_ADMIN_TOKEN"))


def _show_limits(groups: list[dict[str, Any]], json_output: bool) -> Any:
    if json_output:
        return groups
    if not groups:
        typer.echo("no model group has limits (set one with `dex limits set GROUP --rpm N`)")
        return None
    for g in groups:
        limit = g["limit"] or {}
        said = [
            f"{name} {limit[name]:g}" for name in ("concurrency", "rpm", "tpm") if limit.get(name)
        ]
        source = f" ({g['source']})" if g["source"] else ""
        lowered = f"  lowered to {g['lowered_to']:.0%}" if g["lowered_to"] < 1 else ""
        typer.echo(
            f"{g['group']}  {', '.join(said) or 'no limits'}{source}"
            f"  running {g['running']}  waiting {g['waiting']}{lowered}"
        )
    return None


@limits_app.callback()
def limits(
    ctx: typer.Context, address: Address = DEFAULT_ADDRESS, json_output: JsonFlag = False
) -> None:
    """Each model group with limits or calls: its limits, where they come from, and its
    calls running and Steps waiting on the node that answers."""
    if ctx.invoked_subcommand is None:
        _admin_call(address, lambda client: _show_limits(client.get_limits(), json_output))


@limits_app.command("set")
def set_limit(
    group: Annotated[
        str, typer.Argument(help="The model group (e.g. anthropic/claude-sonnet-4-5).")
    ],
    concurrency: Annotated[int | None, typer.Option(help="Model calls at once.")] = None,
    rpm: Annotated[float | None, typer.Option(help="Model calls started per minute.")] = None,
    tpm: Annotated[float | None, typer.Option(help="Input plus output tokens per minute.")] = None,
    address: Address = DEFAULT_ADDRESS,
    json_output: JsonFlag = False,
) -> None:
    """Set a group's limits at run time (stored, enforced by every node within seconds); a
    limit left out does not apply. They replace the server config's for the group."""
    _admin_call(
        address,
        lambda client: _show_limits(
            client.set_limit(group, concurrency=concurrency, rpm=rpm, tpm=tpm), json_output
        ),
    )


@limits_app.command("clear")
def clear_limit(
    group: Annotated[str, typer.Argument(help="The model group.")],
    address: Address = DEFAULT_ADDRESS,
    json_output: JsonFlag = False,
) -> None:
    """Drop the limits set at run time for a group: the server config's apply again."""
    _admin_call(address, lambda client: _show_limits(client.clear_limit(group), json_output))


tenants_app = typer.Typer(
    help="The tenants' budgets (docs/flow-control.md, A tenant's budget): list each tenant "
    "with its budget and usage today and this month (UTC), show one, or set or remove its "
    "budget. Sends DEX_ADMIN_TOKEN when set (they need the admin token when auth is on).",
    invoke_without_command=True,
)
app.add_typer(tenants_app, name="tenants")


def _show_tenants(found: list[dict[str, Any]], json_output: bool) -> Any:
    """Each tenant in a line (``--json``: the list)."""
    from dex.cli import render

    if json_output:
        return found
    if not found:
        typer.echo(
            "no tenant has a budget or used anything this month (set a budget with "
            "`dex tenants budget TENANT --max-tokens-per-day N`)"
        )
    for tenant in found:
        typer.echo(render.tenant_line(tenant))
    return None


@tenants_app.callback()
def tenants(
    ctx: typer.Context, address: Address = DEFAULT_ADDRESS, json_output: JsonFlag = False
) -> None:
    """Each tenant with a budget or with usage this month: its budget, what its sessions
    used today and this month (UTC), and how its budget is used up, if it is."""
    if ctx.invoked_subcommand is None:
        _admin_call(address, lambda client: _show_tenants(client.list_tenants(), json_output))


@tenants_app.command("show")
def show_tenant(
    tenant: Annotated[str, typer.Argument(help="The tenant.")],
    address: Address = DEFAULT_ADDRESS,
    json_output: JsonFlag = False,
) -> None:
    """One tenant's budget and usage (one with neither shows no budget and zeros)."""
    _admin_call(address, lambda client: _show_tenant(client.get_tenant(tenant), json_output))


def _show_tenant(tenant: dict[str, Any], json_output: bool) -> Any:
    """One tenant in a line (``--json``: the object)."""
    return tenant if json_output else _show_tenants([tenant], False)


@tenants_app.command("budget")
def tenant_budget(
    tenant: Annotated[str, typer.Argument(help="The tenant.")],
    max_tokens_per_day: Annotated[
        int | None, typer.Option(min=1, help="Input and output tokens in a UTC day.")
    ] = None,
    max_cost_usd_per_day: Annotated[
        float | None, typer.Option(help="What its model calls may cost in a UTC day, in USD.")
    ] = None,
    max_tokens_per_month: Annotated[
        int | None, typer.Option(min=1, help="Input and output tokens in a UTC month.")
    ] = None,
    max_cost_usd_per_month: Annotated[
        float | None, typer.Option(help="What its model calls may cost in a UTC month, in USD.")
    ] = None,
    remove: Annotated[bool, typer.Option("--remove", help="No limit any more.")] = False,
    address: Address = DEFAULT_ADDRESS,
    by: By = None,
    json_output: JsonFlag = False,
) -> None:
    """Set what all of a tenant's sessions may use in a UTC day and month (a limit left out
    does not apply; --remove: no limit). Its sessions' turns that wait for its budget go
    on once it is not used up."""
    limits = (
        max_tokens_per_day,
        max_cost_usd_per_day,
        max_tokens_per_month,
        max_cost_usd_per_month,
    )
    given = any(value is not None for value in limits)
    if remove and given:
        raise typer.BadParameter("either --remove or new limits, not both", param_hint="--remove")
    if not remove and not given:
        raise typer.BadParameter(
            "give a limit (--max-tokens-per-day, --max-cost-usd-per-day, "
            "--max-tokens-per-month, --max-cost-usd-per-month) or --remove",
            param_hint="TENANT",
        )

    def change(client: SyncClient) -> Any:
        if remove:
            done = client.remove_tenant_budget(tenant, by=by)
        else:
            done = client.set_tenant_budget(
                tenant,
                max_tokens_per_day=max_tokens_per_day,
                max_cost_usd_per_day=max_cost_usd_per_day,
                max_tokens_per_month=max_tokens_per_month,
                max_cost_usd_per_month=max_cost_usd_per_month,
                by=by,
            )
        return _show_tenant(done, json_output)

    _admin_call(address, change)
