"""A failpoint spec a Worker cannot read (a typo in ``DEX_FAILPOINTS``) stops it at start,
naming the spec, the same way in each SDK: no Worker runs on with a failpoint that
neither pauses nor fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from dex.testing import SdkWorkerProcess, WorkerProcess, free_port
from tests.support.rig import AGENTS, sdk_command


@pytest.mark.parametrize("language", ["python", "typescript", "go"])
def test_a_worker_refuses_to_start_with_a_failpoint_spec_it_cannot_read(
    tmp_path: Path, language: str
) -> None:
    env = {"DEX_FAILPOINTS": "worker.tool_running=pasue", "DEX_FAILPOINT_DIR": str(tmp_path)}
    address = f"http://127.0.0.1:{free_port()}"  # nobody there: a Worker that ran would retry
    log = tmp_path / "worker.log"
    worker: WorkerProcess | SdkWorkerProcess
    if language == "python":
        worker = WorkerProcess(AGENTS, address, log, env=env)
    else:
        worker = SdkWorkerProcess(sdk_command(language), address, log, env=env)
    worker.start()
    try:
        assert worker.proc is not None and worker.proc.wait(30) != 0
    finally:
        worker.kill()
    said = 'DEX_FAILPOINTS: "worker.tool_running=pasue": unknown action "pasue" ('
    assert said in " ".join(worker.output().split())  # a traceback may wrap it
