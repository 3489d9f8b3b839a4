"""The fleet view: the session list's filters and cursors, and the inbox of what waits
for a person across sessions.

Both lists page by keyset: a page asks the store for the rows strictly after the last
one of the previous page, in the list's order, so every page costs the same however far
in it is and however many sessions are stored. The position travels to the client as an
opaque cursor (the order, the time and the id of that last row).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import orjson

from dex.errors import InvalidInput
from dex.server.store.base import SessionQuery, SessionRow, Store

OUTCOME_UNKNOWN = "outcome_unknown"
"""The status filter that selects sessions with an unsettled ``outcome_unknown`` call."""
INBOX = "inbox"
"""The cursor kind of the inbox (the session list's kinds are its orders)."""
TENANT = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A tenant's name (docs/flow-control.md, Tenants)."""
TENANT_RULE = "1-64 letters, digits or _.-"


@dataclass(frozen=True)
class Filters:
    agent: str | None = None
    status: str | None = None
    """``idle``, ``running``, ``waiting``, ``failed`` or ``outcome_unknown``."""
    tenant: str | None = None
    created_since: float | None = None
    created_before: float | None = None
    updated_since: float | None = None
    updated_before: float | None = None
    order: str = "created"


def encode_cursor(kind: str, time: float, session_id: str) -> str:
    raw = orjson.dumps([kind, time, session_id])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_cursor(kind: str, cursor: str) -> tuple[float, str]:
    """The (time, id) a cursor of ``kind`` points after; ``InvalidInput`` for anything else
    (a cursor of another list or order, or not one at all)."""
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        got, time, session_id = orjson.loads(raw)
        valid = isinstance(time, int | float) and isinstance(session_id, str)
    except (binascii.Error, ValueError, TypeError):
        valid, got = False, None
    if not valid:
        raise InvalidInput(
            "the cursor is not one this server gave out: pass the next_cursor of the "
            "previous page as it was",
            cursor=cursor,
        )
    if got != kind:
        what = "the inbox" if got == INBOX else f"the session list in order={got}"
        raise InvalidInput(f"the cursor belongs to {what}: start again without it")
    return float(time), session_id


async def list_sessions(
    store: Store, filters: Filters, limit: int, cursor: str | None, *, last_message: bool = False
) -> tuple[list[SessionRow], str | None]:
    """One page of the session list, and the cursor of the next page (None at the end).
    ``last_message``: each row is a ``ListedSession``, with the session's last message."""
    unknown = filters.status == OUTCOME_UNKNOWN
    query = SessionQuery(
        limit=limit + 1,  # one more tells whether there is a next page
        order=filters.order,
        before=decode_cursor(filters.order, cursor) if cursor else None,
        agent=filters.agent,
        status=None if unknown else filters.status,
        tenant=filters.tenant,
        outcome_unknown=unknown,
        created=(filters.created_since, filters.created_before),
        updated=(filters.updated_since, filters.updated_before),
        last_message=last_message,
    )
    rows = await store.list_sessions(query)
    if len(rows) <= limit:
        return rows, None
    rows = rows[:limit]
    last = rows[-1]
    time = last.created_at if filters.order == "created" else last.updated_at
    return rows, encode_cursor(filters.order, time, last.id)


async def inbox(
    store: Store,
    waits_of: Callable[[str], Awaitable[list[dict[str, Any]]]],
    limit: int,
    cursor: str | None,
    tenant: str | None = None,
) -> tuple[list[dict[str, Any]], str | None]:
    """What waits for a person in up to ``limit`` sessions (``tenant``: of that tenant),
    the sessions that started waiting last first, and the cursor of the next page. A
    session in a turn stays in memory, so its waits are read from there: no read per
    session."""
    before = decode_cursor(INBOX, cursor) if cursor else None
    found = await store.waiting_sessions(limit + 1, before, tenant)
    page = found[:limit]
    items = []
    for session_id, _ in page:
        # the session may have moved on since the page was read: then it shows nothing
        items.extend(await waits_of(session_id))
    if len(found) <= limit:
        return items, None
    session_id, since = page[-1]
    return items, encode_cursor(INBOX, since, session_id)
