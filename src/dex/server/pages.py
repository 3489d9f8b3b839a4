"""Rendering the console's pages: one Jinja2 environment over the console's templates,
the filters the templates use, and the error page every refusal shows.

Errors on a console path are pages, not JSON: ``dex.server.api.errors`` and the auth
layer call ``error_page`` and ``refusal`` for any path ``owns`` says is the console's.
That is why this module sits below both the API and the console (``dex.server.console``,
the layer above the API, whose routes render their pages here) and imports neither: the
API answers a console path with a page without importing the console (README, Layout).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from jinja2 import Environment, FileSystemLoader, select_autoescape
from starlette.requests import Request
from starlette.responses import HTMLResponse

PREFIX = "/ui"
COOKIE = "dex_console_token"
"""The HttpOnly cookie that carries a console user's token (when auth is on)."""
CONSOLE = Path(__file__).parent / "console"
"""The console's package data: its templates, and the static files it serves."""
STATIC = CONSOLE / "static"

ENV = Environment(
    loader=FileSystemLoader(CONSOLE / "templates"),
    autoescape=select_autoescape(default=True),
    trim_blocks=True,
    lstrip_blocks=True,
)


ADMIN_PAGES = (f"{PREFIX}/tenants",)
"""The console's pages (and their actions below them) that need the admin token, as the
API routes they show and call do (``/admin/tenants``)."""


def owns(path: str) -> bool:
    """Whether a request path is the console's."""
    return path == PREFIX or path.startswith(PREFIX + "/")


def for_admin(path: str) -> bool:
    """Whether a console path is an admin's (``ADMIN_PAGES``)."""
    return any(path == page or path.startswith(page + "/") for page in ADMIN_PAGES)


def _when(value: float | None) -> str:
    """A Unix time as UTC, to the second (what a person compares across pages)."""
    if value is None:
        return ""
    return datetime.fromtimestamp(value, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _ago(value: float | None) -> str:
    if value is None:
        return ""
    seconds = max(0, int(time.time() - value))
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit} ago"
    return f"{seconds} s ago"


def _json(value: Any) -> str:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


ENV.filters.update(when=_when, ago=_ago, json=_json)


def render(
    request: Request | None, template: str, status_code: int = 200, **context: Any
) -> HTMLResponse:
    """A whole page. Every page knows whether auth is on (to offer a log-out)."""
    auth = request is not None and request.app.state.tokens.enabled
    page = ENV.get_template(template).render(prefix=PREFIX, auth=auth, **context)
    return HTMLResponse(page, status_code, headers={"cache-control": "no-store"})


def error_page(request: Request | None, status: int, code: str, message: str) -> HTMLResponse:
    """The page of a refused request: what was wrong, and that nothing changed."""
    return render(request, "error.html", status, status=status, code=code, message=message)


def refusal(status: int, message: str) -> bytes:
    """The page the auth layer answers a console request without a valid token with (401),
    or with one of the wrong role (403): the log-in form, and why."""
    return (
        ENV.get_template("login.html")
        .render(prefix=PREFIX, auth=True, status=status, message=message, next="")
        .encode()
    )
