"""How a crash test interrupts: a Worker kill, a server restart, or a takeover."""

from __future__ import annotations

import urllib.request

import pytest

from dex.testing import wait_until
from tests.support.rig import SERVER_RESTART_POSTGRES, TAKEOVER, AnyWorker, Rig

WORKER_KILL = "Worker kill"
SERVER_RESTART = "Server restart"
SERVER_SIDE = (SERVER_RESTART, SERVER_RESTART_POSTGRES, TAKEOVER)
"""The failures of the node. A Worker that lives through one reclaims the attempt it runs
(its result is kept): ``interrupt`` kills the Worker with the node, and the Worker that
survives is tested apart (``test_reclaim.py``)."""


def columns(
    row: str,
    *,
    worker_kill: bool = True,
    takeover: bool = False,
    typescript: bool = False,
    go: bool = False,
    reclaim: bool = False,
) -> pytest.MarkDecorator:
    """Parametrize a test over the failures, each marked as its cell of the matrix:
    Worker kill and Server restart (SQLite), and with ``takeover`` the Server restart of a
    node on PostgreSQL and the Takeover (three nodes on PostgreSQL: the one that owns the
    session's partition dies, another takes it over).
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

    ``reclaim``: the node's failures only, each of them (the Server restart on SQLite and
    on PostgreSQL, the Takeover): a Worker that lives through them reclaims its attempt."""
    python = [(WORKER_KILL, WORKER_KILL, "worker-kill")] if worker_kill else []
    python.append((SERVER_RESTART, SERVER_RESTART, "server-restart"))
    if takeover or reclaim:
        python.append((SERVER_RESTART_POSTGRES, SERVER_RESTART, "server-restart-postgres"))
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
    """SIGKILL the Worker, and with a server-side failure the serving node too (service
    comes back: a restart on its storage, or a takeover); start a new Worker.

    Returns the Worker that serves from now on."""
    worker.kill()
    if column in SERVER_SIDE:
        rig.restart_server()
    return rig.start_worker()


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
    worker.kill()
    if column == WORKER_KILL:
        wait_until(lambda: workers_connected(rig) == 0, 10, what="the killed Worker's link closed")
    else:
        rig.restart_server()
    worker = rig.start_worker()
    wait_until(lambda: workers_connected(rig) == 1, 20, what="a Worker connected")
    return worker
