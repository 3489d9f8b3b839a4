"""The other nodes of a cluster, as the HTTP layer sees them: who they are (``Cluster``,
``Member``: what the node's cluster membership answers), and one HTTP client to reach
them (``Peers``), shared by the forwarding layer (``forward``) and the cluster-wide views
(``cluster``).

A node that is not part of a cluster (SQLite, or a node without one in tests) has no
``cluster``: then nothing here is used, and no HTTP client is ever made.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import orjson

if TYPE_CHECKING:
    import aiohttp  # loaded on the first call to another node: a node alone never does

log = logging.getLogger("dex.server.api")

FORWARDED_BY = "x-dex-forwarded-by"
"""The header a node adds to a call it forwards (its node id): a call that carries it is
never forwarded again."""
LOCAL = "x-dex-local"
"""The header that asks a node for its own part of a cluster-wide view (``1``)."""
CONNECT_TIMEOUT = 2.0
"""Seconds to open a connection to another node before it counts as unreachable."""
VIEW_TIMEOUT = 1.0
"""Seconds a node waits for another's part of a cluster-wide view."""


class Member(Protocol):
    @property
    def node_id(self) -> str: ...
    @property
    def address(self) -> str: ...
    @property
    def standby(self) -> bool: ...
    @property
    def partitions(self) -> tuple[int, ...]: ...
    @property
    def here(self) -> bool: ...


class Cluster(Protocol):
    """What a node knows of its cluster, on the loop, at no cost (no I/O)."""

    @property
    def node_id(self) -> str: ...
    @property
    def partition_count(self) -> int: ...
    def route(self, session_id: str) -> str | None:
        """None: this node serves the session; else the owner's base URL. Raises
        ``Unavailable`` when no live node owns the session's partition now."""
        ...

    def members(self) -> Sequence[Member]: ...
    def owns_any(self) -> bool: ...


def cluster_of(node: Any) -> Cluster | None:
    """The node's cluster; None for a node alone (or no node yet)."""
    cluster: Cluster | None = getattr(node, "cluster", None)
    return cluster


class Peers:
    """One ``aiohttp`` client for the calls to other nodes, made on the first one, closed
    with the app (its lifespan). Bodies pass through as they are (no decompression)."""

    def __init__(self) -> None:
        self._http: aiohttp.ClientSession | None = None

    @property
    def http(self) -> aiohttp.ClientSession:
        import aiohttp

        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession(
                # no total or read timeout: an event stream or a long poll lasts
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=CONNECT_TIMEOUT),
                auto_decompress=False,
                skip_auto_headers=("User-Agent", "Accept-Encoding"),
                connector=aiohttp.TCPConnector(limit=0),  # as many as the callers make
            )
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None

    async def views(
        self, members: Sequence[Member], path: str, headers: dict[str, str]
    ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """``GET path`` of each member, asking for its own part (``x-dex-local: 1``), all
        at once, each within ``VIEW_TIMEOUT``: the JSON answers by node id, and the ids of
        the nodes that did not answer 200 in time, sorted."""
        asked = {**headers, LOCAL: "1"}
        answers = await asyncio.gather(*(self._view(m, path, asked) for m in members))
        found = {m.node_id: a for m, a in zip(members, answers, strict=True) if a is not None}
        missing = sorted(m.node_id for m, a in zip(members, answers, strict=True) if a is None)
        return found, missing

    async def _view(
        self, member: Member, path: str, headers: dict[str, str]
    ) -> dict[str, Any] | None:
        import aiohttp

        try:
            async with asyncio.timeout(VIEW_TIMEOUT):
                async with self.http.get(member.address + path, headers=headers) as response:
                    body = await response.read()
                    if response.status != 200:
                        raise ValueError(f"answered {response.status}: {body[:200]!r}")
                    answer: dict[str, Any] = orjson.loads(body)
                    return answer
        except (aiohttp.ClientError, TimeoutError, ValueError) as e:
            log.warning(
                "node %s did not answer %s: %r",
                member.node_id,
                path,
                e,
                extra={"action": "cluster.peer_unreachable", "node_id": member.node_id},
            )
            return None
