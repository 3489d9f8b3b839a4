"""How a crash test interrupts: a Worker kill or a server restart."""

from __future__ import annotations

import pytest

from dex.testing import WorkerProcess
from tests.support.rig import Rig

WORKER_KILL = "Worker kill"
SERVER_RESTART = "Server restart"


def columns(row: str) -> pytest.MarkDecorator:
    """Parametrize a test over both failures, each marked as its cell of the matrix."""
    return pytest.mark.parametrize(
        "column",
        [
            pytest.param(WORKER_KILL, marks=pytest.mark.crash(row, WORKER_KILL), id="worker-kill"),
            pytest.param(
                SERVER_RESTART, marks=pytest.mark.crash(row, SERVER_RESTART), id="server-restart"
            ),
        ],
    )


def interrupt(rig: Rig, column: str, worker: WorkerProcess) -> WorkerProcess:
    """SIGKILL the Worker and start a new one, or SIGKILL and restart the server.

    Returns the Worker that serves from now on."""
    if column == WORKER_KILL:
        worker.kill()
        return rig.start_worker()
    rig.restart_server()
    return worker
