"""What a Worker says about its life, the same in Python, TypeScript and Go and in both
log formats (docs/operations.md, "Logs"): one line when it connects (the address, its
agents, its capacity), one when it loses the server and one when it is back (not a line
per failed try), and one when it stops (why)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from dex.testing import wait_until
from tests.support.rig import AnyWorker, Rig

CONSOLE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"(?P<logger>\S+) (?P<message>.*?) (?P<fields>action=.*)$"
)
FIELD = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|\S*)')
JSON_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")

LIFE = ("worker.connected", "worker.connection_lost", "worker.reconnected", "worker.stopped")


def lines(worker: AnyWorker, log_format: str) -> list[dict[str, Any]]:
    """The Worker's log lines as dicts: every field, and level, logger and message. Console
    values stay text (a list is its items joined by commas)."""
    entries = []
    for line in worker.output().splitlines():
        if log_format == "json":
            if not line.startswith("{"):
                continue
            entry = json.loads(line)
            assert JSON_TIME.match(entry["time"]), line
            assert entry["level"] in ("debug", "info", "warning", "error", "critical"), line
        else:
            head = CONSOLE.match(line)
            if head is None:
                continue
            entry = {
                "level": head["level"].lower(),
                "logger": head["logger"],
                "message": head["message"],
            }
            for key, value in FIELD.findall(head["fields"]):
                entry[key] = json.loads(value) if value.startswith('"') else value
        if "action" in entry:  # a Dex line (a library's may have none)
            entries.append(entry)
    return entries


def life(worker: AnyWorker, log_format: str) -> list[dict[str, Any]]:
    return [e for e in lines(worker, log_format) if e["action"] in LIFE]


@pytest.mark.parametrize("log_format", ["console", "json"])
@pytest.mark.parametrize("language", ["python", "typescript", "go"])
def test_a_worker_logs_connecting_losing_the_server_reconnecting_and_stopping(
    rig: Rig, language: str, log_format: str
) -> None:
    rig.start_server()
    worker = rig.start_worker(language=language, env={"DEX_LOG_FORMAT": log_format})
    wait_until(lambda: rig.client.list_workers(), 20, what="the Worker connected")
    wait_until(lambda: life(worker, log_format), 10, what="the Worker logged its connection")
    (served,) = rig.client.list_workers()
    (connected,) = life(worker, log_format)
    assert connected["action"] == "worker.connected"
    assert connected["level"] == "info" and connected["logger"] == "dex.worker"
    assert connected["message"] == f"connected to {rig.server.address}"
    agents = connected["agents"] if log_format == "json" else connected["agents"].split(",")
    assert sorted(agents) == sorted(a["name"] for a in served["agents"])
    assert str(connected["capacity"]) == str(served["capacity"]) == "16"
    assert connected["address"] == rig.server.address
    assert connected["worker_id"] == served["worker_id"]
    assert set(connected) == {
        *(("time",) if log_format == "json" else ()),
        *("level", "logger", "message", "action", "address", "agents", "capacity", "worker_id"),
    }

    rig.restart_server()  # SIGKILL, then the same node on its storage
    wait_until(
        lambda: lines(worker, log_format)[-1]["action"] == "worker.reconnected",
        20,
        what="the Worker logged its reconnect",
    )
    after = lines(worker, log_format)[lines(worker, log_format).index(connected) + 1 :]
    # one line for the outage, however many tries it took, then the reconnect
    assert [e["action"] for e in after] == ["worker.connection_lost", "worker.reconnected"]
    lost, back = after
    assert lost["level"] == "warning" and lost["address"] == rig.server.address
    assert lost["error"] and lost["message"].startswith(
        f"lost the connection to {rig.server.address}"
    )
    assert back["level"] == "info" and back["address"] == rig.server.address
    assert int(back["tries"]) >= 1 and 0 < float(back["seconds"]) < 20
    assert back["worker_id"] == connected["worker_id"]
    assert back["message"].startswith(f"reconnected to {rig.server.address} after ")
    assert not any("cannot reach" in e["message"] for e in lines(worker, log_format))

    assert worker.terminate() == 0  # SIGTERM: a drain, and a clean exit
    tail = [e["action"] for e in lines(worker, log_format)][-2:]
    assert tail == ["worker.draining", "worker.stopped"]
    stopped = lines(worker, log_format)[-1]
    assert stopped["level"] == "info" and stopped["reason"] == "SIGTERM"
    assert stopped["message"] == "stopped: SIGTERM, drained"
    assert stopped["worker_id"] == connected["worker_id"]


@pytest.mark.parametrize("log_format", ["console", "json"])
@pytest.mark.parametrize("language", ["python", "typescript", "go"])
def test_a_worker_refused_for_good_logs_that_it_stopped_and_why(
    rig: Rig, language: str, log_format: str
) -> None:
    rig.server.env.update({"DEX_CLIENT_TOKEN": "c-1", "DEX_WORKER_TOKEN": "w-2"})
    rig.start_server()
    impostor = rig.start_worker(
        language=language, env={"DEX_WORKER_TOKEN": "c-1", "DEX_LOG_FORMAT": log_format}
    )
    wait_until(lambda: not impostor.alive, 20, what="the refused Worker exited")
    assert impostor.proc is not None and impostor.proc.returncode == 1
    stopped = lines(impostor, log_format)[-1]
    assert stopped["action"] == "worker.stopped" and stopped["level"] == "error"
    assert stopped["reason"] == "error" and "403" in stopped["error"]
    assert stopped["message"] == f"stopped: {stopped['error']}"
    assert not any(e["action"] == "worker.connected" for e in lines(impostor, log_format))
