"""Tenants: what a client token scoped to one tenant may see and do (docs/flow-control.md).

A client token of the tokens file may name a ``tenant``; the auth layer leaves it in the
ASGI scope (``TENANT_KEY``). Such a token sees and changes only its tenant's sessions:

- ``GUARD`` is a dependency of the routers of the sessions API and of the console. On a
  route about one session (a ``{session_id}`` in its path), a session of another tenant
  or of none is the very ``NotFound`` of a session that does not exist, before the route
  runs and before its parameters and body are validated (so a bad body tells nothing
  either): a new route under those routers cannot forget.
- Creations, the session list and the inbox ask ``tenant_for`` which tenant they are
  about: the token's own (a body or filter that names another is a 403).
- The views of the nodes and Workers (``/v1/workers``, ``/v1/cluster``, the console's
  cluster page) name every tenant's sessions: a scoped token is refused them
  (``UNSCOPED``, 403).

A request without a scoped token (auth off, an unscoped client token, an admin token)
passes every check unchanged.
"""

from __future__ import annotations

from fastapi import Depends, Request
from fastapi.params import Depends as DependsParam

from dex.errors import DexError
from dex.server.api.auth import TENANT_KEY
from dex.server.sessions import Sessions


class Forbidden(DexError):
    code = "forbidden"
    status = 403


def scoped(request: Request) -> str | None:
    """The tenant the request's token is scoped to; None: every session."""
    tenant: str | None = request.scope.get(TENANT_KEY)
    return tenant


async def guard(request: Request) -> None:
    """A session route's check: the session is the scoped token's tenant's, or the answer
    is a 404 as for a session that does not exist."""
    tenant = scoped(request)
    session_id = request.path_params.get("session_id")
    if tenant is None or session_id is None:
        return
    sessions: Sessions = request.app.state.sessions
    await sessions.reads.check_tenant(session_id, tenant)


def tenant_for(request: Request, asked: str | None) -> str | None:
    """The tenant a creation, a list or the inbox is about: ``asked`` (None: any, or no
    tenant for a new session), or for a scoped token its own tenant; another one is a 403,
    so that a filter never widens what a scoped token sees."""
    tenant = scoped(request)
    if tenant is None or asked in (None, tenant):
        return asked if tenant is None else tenant
    raise Forbidden(
        f"this token is scoped to tenant {tenant!r}: it cannot ask for tenant {asked!r}",
        tenant=asked,
    )


async def unscoped(request: Request) -> None:
    """Refuse a scoped token a view of every tenant's sessions (the nodes, the Workers)."""
    tenant = scoped(request)
    if tenant is not None:
        raise Forbidden(
            f"this token is scoped to tenant {tenant!r}: the nodes and Workers are shown "
            "to an unscoped client token or an admin token"
        )


GUARD: list[DependsParam] = [Depends(guard)]
UNSCOPED: list[DependsParam] = [Depends(unscoped)]
