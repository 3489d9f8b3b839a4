"""Failover cases beyond a dead node: one address behind a balancer that follows
``/readyz``, and a restart of PostgreSQL itself."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.request
from pathlib import Path

import pytest

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until
from dex.testing.proxy import TcpProxy
from tests.support.rig import AGENTS


def readyz_epoch(node: ServerProcess) -> int | None:
    try:
        with urllib.request.urlopen(node.address + "/readyz", timeout=1) as r:
            return int(json.loads(r.read())["epoch"])
    except OSError:
        return None


def test_one_address_behind_a_balancer_that_follows_readyz(
    tmp_path: Path, postgres_url: str
) -> None:
    """Workers and clients know one address; the balancer behind it sends connections to
    the node whose /readyz is 200. After a takeover they follow by themselves."""
    a = ServerProcess(tmp_path / "a", database=postgres_url)
    b = ServerProcess(tmp_path / "b", database=postgres_url)
    a.start()
    b.start(ready=False)
    with TcpProxy("127.0.0.1", a.port).in_thread() as balancer:
        address = f"http://127.0.0.1:{balancer.port}"
        worker = WorkerProcess(AGENTS, address, tmp_path / "worker.log").start()
        try:
            with dex.SyncClient(address, timeout=60) as client:
                wait_until(lambda: client.list_agents(), 20, what="the Worker registered")
                sid = client.create_session("assistant")["id"]
                assert client.send_message(sid, "one", wait=True)["text"] == "echo: one"
                a.kill()
                wait_until(b.ready, 20, what="the standby took over")
                balancer.retarget("127.0.0.1", b.port)  # what a readiness probe does
                sent = client.send_message(sid, "two", message_id="m-2", wait=True)
                assert sent["text"] == "echo: two"
        finally:
            worker.kill()
            a.kill()
            b.kill()


def _pg_ctl() -> list[str] | None:
    if os.geteuid() != 0 or shutil.which("pg_ctlcluster") is None:
        return None
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not versions:
        return None
    return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main"]


def test_after_postgresql_restarts_exactly_one_node_leads_with_a_higher_epoch(
    tmp_path: Path, postgres_url: str
) -> None:
    ctl = _pg_ctl()
    if ctl is None:
        pytest.skip("restarting PostgreSQL needs root and pg_ctlcluster")
    nodes = [ServerProcess(tmp_path / n, database=postgres_url) for n in ("a", "b")]
    nodes[0].start()
    nodes[1].start(ready=False)
    address = ",".join(n.address for n in nodes)
    worker = WorkerProcess(AGENTS, address, tmp_path / "worker.log").start()
    try:
        before = readyz_epoch(nodes[0])
        assert before == 1
        subprocess.run([*ctl, "restart", "-m", "fast"], check=True, timeout=120)

        def leaders() -> list[int]:
            for node in nodes:  # a node that lost its lease exits: a supervisor restarts it
                if not node.alive:
                    node.start(ready=False)
            return [e for e in map(readyz_epoch, nodes) if e is not None]

        (epoch,) = wait_until(leaders, 60, 0.2, what="one node leads again")
        assert epoch > before
        with dex.SyncClient(address, timeout=60) as client:
            wait_until(lambda: client.list_agents(), 30, what="the Worker is back")
            sid = client.create_session("assistant")["id"]
            assert client.send_message(sid, "after", wait=True)["text"] == "echo: after"
        assert len([e for e in map(readyz_epoch, nodes) if e is not None]) == 1
    finally:
        worker.kill()
        for node in nodes:
            node.kill()
