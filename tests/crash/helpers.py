"""How a crash test interrupts: a Worker kill, a server restart, or a takeover."""

from __future__ import annotations

import urllib.request

import pytest

from dex.testing import wait_until
from tests.support.rig import SERVER_RESTART_POSTGRES, TAKEOVER, AnyWorker, Rig

WORKER_KILL = "Worker kill"
SERVER_RESTART = "Server restart"
SERVER_SIDE = (SERVER_RESTART, SERVER_RESTART_POSTGRES, TAKEOVER)
"""The failures of the node."""
RESTARTS = (SERVER_RESTART, SERVER_RESTART_POSTGRES)
"""The failures after which a Worker that lived through them reclaims the attempt it runs
(its result is kept): ``interrupt`` kills the Worker with the node, and the Worker that
survives is tested apart (``test_reclaim.py``)."""


def survived(column: str) -> bool:
    """Whether the Worker ran on through the interruption without reclaiming its attempt
    (a takeover in a cluster: its attempt fails, and a late run of it is refused)."""
    return column == TAKEOVER


def columns(
    row: str,
    *,
    worker_kill: bool = True,
    takeover: bool = False,
    typescript: bool = False,
    go: bool = False,
    restarts_only: bool = False,
) -> pytest.MarkDecorator:
    """Parametrize a test over the failures, each marked as its cell of the matrix:
    Worker kill and Server restart (SQLite), and with ``takeover`` the Server restart of a
    node on PostgreSQL and the Takeover of a hot standby (two nodes on PostgreSQL).
    ``worker_kill=False`` leaves out the Worker kill, for a row whose moment is in the
    server only (a Worker killed then interrupts nothing of the row).

    With ``typescript`` and ``go`` the Worker kill, the Server restart (SQLite) and, with
    ``takeover``, the Takeover run once more against a Worker written with that SDK (its
    port of the test agents, ``tests.support.rig.SDK_AGENTS``; case ids such as
    ``worker-kill-typescript``, ``takeover-go``): the same test, the same assertions, each
    mark naming its Worker. The Server restart on PostgreSQL stays Python's: it differs
    from the SQLite restart only on the server's side.

    The rig reads the language from the ``worker_language`` fixture, parametrized
    indirectly, and only such tests get that parameter.

    ``restarts_only``: the Server restart on SQLite and on PostgreSQL, nothing else (a
    Worker that lives through a restart and reclaims its attempt)."""
    python = [(WORKER_KILL, WORKER_KILL, "worker-kill")] if worker_kill else []
    python.append((SERVER_RESTART, SERVER_RESTART, "server-restart"))
    if takeover or restarts_only:
        python.append((SERVER_RESTART_POSTGRES, SERVER_RESTART, "server-restart-postgres"))
    if takeover and not restarts_only:
        python.append((TAKEOVER, TAKEOVER, "takeover"))
    languages = [name for name, wanted in (("typescript", typescript), ("go", go)) if wanted]
    if not languages:
        return pytest.mark.parametrize(
            "column",
            [
                pytest.param(failure, marks=pytest.mark.crash(row, cell), id=id_)
                for failure, cell, id_ in python
            ],
        )
    # Every cell then names its Worker's language too (Python unless told otherwise), and
    # each SDK's cell follows Python's of the same failure.
    params = []
    for failure, cell, id_ in python:
        params.append(pytest.param(failure, "python", marks=pytest.mark.crash(row, cell), id=id_))
        if failure == SERVER_RESTART_POSTGRES:
            continue
        params += [
            pytest.param(
                failure,
                language,
                marks=pytest.mark.crash(row, cell, worker=language),
                id=f"{id_}-{language}",
            )
            for language in languages
        ]
    return pytest.mark.parametrize(
        ("column", "worker_language"), params, indirect=["worker_language"]
    )


def interrupt(rig: Rig, column: str, worker: AnyWorker) -> AnyWorker:
    """SIGKILL the Worker and start a new one; or SIGKILL the serving node and bring
    service back: a restart on its storage, with the Worker killed too and a new one
    started (``RESTARTS``), or a takeover, with the Worker running on.

    Returns the Worker that serves from now on."""
    if column == WORKER_KILL:
        worker.kill()
        return rig.start_worker()
    if column in RESTARTS:
        worker.kill()
        rig.restart_server()
        return rig.start_worker()
    rig.restart_server()
    return worker


def workers_connected(rig: Rig) -> int:
    """How many Workers the server holds a connection with (its ``/metrics``)."""
    with urllib.request.urlopen(rig.server.address + "/metrics", timeout=5) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("dex_workers_connected "):
                return int(float(line.split()[1]))
    raise AssertionError("the server reports no dex_workers_connected")


def interrupt_and_reconnect(rig: Rig, column: str, worker: AnyWorker) -> AnyWorker:
    """``interrupt``, and return once the server serves through one live Worker again: the
    killed Worker's connection is gone before the new one starts, and the new Worker (or,
    after a restart, the old one) is connected. From then on anything that was to run
    again has been handed out."""
    if column == WORKER_KILL:
        worker.kill()
        wait_until(lambda: workers_connected(rig) == 0, 10, what="the killed Worker's link closed")
        worker = rig.start_worker()
    elif column in RESTARTS:
        worker.kill()
        rig.restart_server()
        worker = rig.start_worker()
    else:
        rig.restart_server()
    wait_until(lambda: workers_connected(rig) == 1, 20, what="a Worker connected")
    return worker
