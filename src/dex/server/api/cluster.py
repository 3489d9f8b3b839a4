"""The cluster-wide views: ``GET /v1/cluster`` (the live nodes and their partitions), and
the Workers of every node (``GET /v1/workers``, the console's cluster page).

A Worker connects to every node, so each node knows only its own connections: a node
asked for all the Workers asks every other member for theirs (``x-dex-local: 1``) at once,
waits at most ``peers.VIEW_TIMEOUT`` for each, and names those that did not answer in
``unreachable``. The session list, the inbox and the fleet view need none of this: they
are read from the database the nodes share.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import unquote

from fastapi import APIRouter, Request

from dex.server.api import models, tenancy
from dex.server.api.auth import GUARDED
from dex.server.api.peers import Cluster, Peers, cluster_of
from dex.server.api.responses import ORJSONResponse
from dex.server.pages import COOKIE
from dex.server.sessions import Sessions

router = APIRouter()


@router.get(
    "/v1/cluster",
    tags=["cluster"],
    response_model=models.ClusterView,
    responses=models.errors(401, 403, 429, 500, 503),
    dependencies=[*GUARDED, *tenancy.UNSCOPED],
)
async def get_cluster(request: Request) -> ORJSONResponse:
    """The nodes of the cluster, the partitions each owns now, and which one answered."""
    return ORJSONResponse(cluster_view(cluster_of(request.app.state.node)))


def cluster_view(cluster: Cluster | None) -> dict[str, Any]:
    if cluster is None:
        return {"node_id": None, "partition_count": None, "members": []}
    members = [
        {
            "node_id": m.node_id,
            "address": m.address,
            "standby": m.standby,
            "partitions": list(m.partitions),
            "here": m.here,
        }
        for m in cluster.members()
    ]
    return {
        "node_id": cluster.node_id,
        "partition_count": cluster.partition_count,
        "members": sorted(members, key=lambda m: m["node_id"]),
    }


async def all_workers(request: Request, *, local: bool = False) -> dict[str, Any]:
    """The Workers of every node (``workers``, each with its ``node``), and the other nodes
    that did not answer (``unreachable``); with ``local``, this node's own only."""
    sessions: Sessions = request.app.state.sessions
    here = sessions.reads.workers_view()
    cluster = cluster_of(request.app.state.node)
    if cluster is None:
        return {"workers": here, "unreachable": []}
    for worker in here:
        worker["node"] = cluster.node_id
    if local:
        return {"workers": here, "unreachable": []}
    others = [m for m in cluster.members() if not m.here]
    peers: Peers = request.app.state.peers
    answers, unreachable = await peers.views(others, "/v1/workers", _credentials(request))
    found = list(here)
    for node_id, answer in answers.items():
        for worker in answer.get("workers", []):
            found.append({**worker, "node": worker.get("node") or node_id})
    found.sort(key=lambda w: (w["worker_id"], w["node"]))
    return {"workers": found, "unreachable": unreachable}


def _credentials(request: Request) -> dict[str, str]:
    """The caller's token, to ask the other nodes with: its bearer header, or on the
    console the token of its cookie (the nodes share their tokens)."""
    authorization = request.headers.get("authorization")
    if authorization is not None:
        return {"authorization": authorization}
    token = request.cookies.get(COOKIE)  # set percent-encoded
    return {"authorization": f"Bearer {unquote(token)}"} if token else {}
