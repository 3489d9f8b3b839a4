"""A planned step-down (``dex step-down``, ``POST /admin/step-down``): the active node
drains, gives the lease up at once and exits 0; the standby takes over and serves."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path

from dex.testing import wait_until
from tests.support.rig import Rig


def step_down(address: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dex", "step-down", "--address", address],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_active_node_steps_down_and_the_standby_serves(
    tmp_path: Path, postgres_url: str
) -> None:
    rig = Rig(tmp_path, postgres_url)
    try:
        rig.start_server()
        rig.start_worker()
        sid = rig.session()
        assert rig.client.send_message(sid, "before", wait=True)["text"] == "echo: before"
        active = rig.server
        (standby,) = [n for n in rig.nodes if n is not active]

        refused = step_down(standby.address)  # only the active node steps down
        assert refused.returncode == 1 and "standby" in refused.stderr

        done = step_down(active.address)
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["role"] == "draining"
        assert active.proc is not None and active.proc.wait(30) == 0
        wait_until(standby.ready, 10, what="the standby took over")
        rig.server = standby
        assert rig.client.send_message(sid, "after", wait=True)["text"] == "echo: after"
        assert "took 64 partitions" in standby.output()
        with urllib.request.urlopen(standby.address + "/readyz", timeout=5) as ready:
            assert json.loads(ready.read()) == {"status": "ready", "role": "active", "epoch": 2}
    finally:
        rig.close()
