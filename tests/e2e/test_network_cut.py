"""A leader cut off from PostgreSQL (a partition: silence, no close) steps down by itself
within seconds, and the standby, which still reaches the database, takes over."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import urlsplit

import dex
from dex.testing import ServerProcess, WorkerProcess, wait_until
from dex.testing.proxy import TcpProxy
from tests.support.rig import AGENTS


def test_a_leader_cut_off_from_the_database_steps_down_and_the_standby_serves(
    tmp_path: Path, postgres_url: str
) -> None:
    db = urlsplit(postgres_url)
    assert db.hostname is not None and db.port is not None
    with TcpProxy(db.hostname, db.port).in_thread() as proxy:
        through_proxy = postgres_url.replace(f":{db.port}/", f":{proxy.port}/")
        leader = ServerProcess(tmp_path / "a", database=through_proxy, standby=True)
        standby = ServerProcess(tmp_path / "b", database=postgres_url, standby=True)
        address = f"{leader.address},{standby.address}"
        worker = WorkerProcess(AGENTS, address, tmp_path / "worker.log")
        try:
            leader.start()
            standby.start(ready=False)
            worker.start()
            with dex.SyncClient(address, timeout=60) as client:
                wait_until(lambda: client.list_agents(), 20, what="the Worker registered")
                sid = client.create_session("assistant")["id"]
                assert client.send_message(sid, "before", wait=True)["text"] == "echo: before"

                proxy.cut()
                cut_at = time.monotonic()
                wait_until(lambda: not leader.alive, 20, what="the cut-off leader left")
                assert leader.proc is not None and leader.proc.returncode == 4  # stepped down
                assert "lease lost" in leader.output()
                wait_until(standby.ready, 20, what="the standby took over")
                took = time.monotonic() - cut_at
                after = client.send_message(sid, "after", message_id="m-after", wait=True)
                assert after["text"] == "echo: after"
            assert took < 20
        finally:
            proxy.restore()
            worker.kill()
            leader.kill()
            standby.kill()
