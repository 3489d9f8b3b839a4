"""Test helpers for Dex and for users testing their own agents: real server and Worker
processes, failpoints, a side-effect ledger, and waiting on conditions with deadlines."""

from dex.testing.gates import Gates
from dex.testing.harness import (
    SdkWorkerProcess,
    ServerProcess,
    WorkerProcess,
    free_port,
)
from dex.testing.ledger import Ledger
from dex.testing.wait import wait_until, wait_until_async

__all__ = [
    "Gates",
    "Ledger",
    "SdkWorkerProcess",
    "ServerProcess",
    "WorkerProcess",
    "free_port",
    "wait_until",
    "wait_until_async",
]
