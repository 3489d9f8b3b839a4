"""Workers written with the TypeScript SDK (``sdk/typescript``) and the Go SDK
(``sdk/go``) against a real server, each serving its port of the test agents: a whole
turn, a server SIGKILLed and restarted while the Worker holds an attempt, a drain on
SIGTERM, a SIGTERM while the server is down, a refused token, addresses tried in turn,
and the history cache that keeps a long session's hand-outs short. (The crash cells run
against them too: the ``-typescript`` and ``-go`` cases of ``tests/crash``.)"""

from __future__ import annotations

import signal
import urllib.request

import pytest

import dex
from dex.testing import SdkWorkerProcess, free_port, wait_until
from tests.support.rig import Rig, attempts, metric, results, sdk_command

LANGUAGES = pytest.mark.parametrize("language", ["typescript", "go"])


@LANGUAGES
def test_the_worker_serves_a_turn_model_tool_model(rig: Rig, language: str) -> None:
    rig.start_server()
    rig.start_worker(language=language)
    sid = rig.session()
    turn = rig.call(sid, ("lookup", {"key": "k"}), ("refuse", {"reason": "no"}))
    t = rig.wait_turn(sid, turn)

    assert t["status"] == "completed"
    assert attempts(t, "RunModel") == [[(1, "succeeded")], [(1, "succeeded")]]
    assert results(t) == [
        {
            "name": "lookup",
            "status": "succeeded",
            "result": {"key": "k", "value": "K"},
            "error": None,
        },
        {"name": "refuse", "status": "failed", "result": None, "error": "no"},
    ]
    (effect,) = rig.ledger.entries("lookup")
    assert effect["attempt"] == 1
    assert effect["idempotency_key"] == t["tool_calls"][0]["idempotency_key"]
    # streamed text reaches the server as deltas and ends as the turn's answer
    streamed = rig.session("streamer")
    answer = rig.wait_turn(streamed, rig.client.send_message(streamed, "hi there")["turn"])
    assert answer["text"] == "echo: hi there"


@LANGUAGES
def test_the_worker_outlives_a_server_restart_while_it_holds_an_attempt(
    rig: Rig, language: str
) -> None:
    rig.start_server()
    worker = rig.start_worker(language=language)
    sid = rig.session()
    turn = rig.call(sid, ("upsert", {"key": "order-9", "gate": "g"}))
    rig.wait_entered("g", 1)

    rig.restart_server()  # SIGKILL, then the same node on its storage
    # the Worker reconnects and reclaims attempt 1, which runs on
    wait_until(
        lambda: metric(rig, "dex_attempts_reclaimed_total") == 1, 20, what="attempt 1 reclaimed"
    )
    rig.open_gate("g")
    t = rig.wait_turn(sid, turn)

    assert worker.alive  # the same Worker process served on, through its reconnect
    assert len(rig.workers) == 1
    (call,) = t["tool_calls"]
    assert call["status"] == "succeeded"
    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    effects = rig.ledger.entries("upsert")
    assert [e["attempt"] for e in effects] == [1]
    assert {e["idempotency_key"] for e in effects} == {call["idempotency_key"]}
    follow = rig.wait_turn(sid, rig.client.send_message(sid, "still there?")["turn"])
    assert follow["text"] == "echo: still there?"


@LANGUAGES
def test_the_worker_drains_on_sigterm(rig: Rig, language: str) -> None:
    rig.start_server()
    worker = rig.start_worker(language=language)
    sid = rig.session()
    turn = rig.call(sid, ("upsert", {"key": "k", "gate": "g"}))
    rig.wait_entered("g", 1)

    assert worker.proc is not None
    worker.proc.send_signal(signal.SIGTERM)
    rig.open_gate("g")  # the running attempt finishes within the drain
    assert worker.proc.wait(20) == 0

    rig.start_worker(language=language)  # the turn's last model call needs a Worker
    t = rig.wait_turn(sid, turn)
    assert attempts(t, "CallTool") == [[(1, "succeeded")]]
    assert [e["attempt"] for e in rig.ledger.entries("upsert")] == [1]


@LANGUAGES
def test_a_worker_whose_server_is_down_stops_at_once_on_sigterm(rig: Rig, language: str) -> None:
    rig.start_server()
    worker = rig.start_worker(language=language, env={"DEX_LOG_LEVEL": "debug"})
    wait_until(lambda: metric(rig, "dex_workers_connected") == 1, 20, what="the Worker connected")
    rig.server.kill()
    # tries that failed one after another (each at debug level): the wait has grown
    wait_until(
        lambda: worker.output().count("action=worker.connect_failed") >= 6,
        20,
        what="the Worker retried the dead server",
    )

    assert worker.terminate(timeout=2) == 0  # it does not wait out its backoff first


@LANGUAGES
def test_a_worker_with_a_refused_token_exits_and_says_why(rig: Rig, language: str) -> None:
    rig.server.env.update({"DEX_CLIENT_TOKEN": "c-1", "DEX_WORKER_TOKEN": "w-2"})
    rig.start_server()
    impostor = rig.start_worker(language=language, env={"DEX_WORKER_TOKEN": "c-1"})
    wait_until(lambda: not impostor.alive, 20, what="the refused Worker exited")
    assert impostor.proc is not None and impostor.proc.returncode == 1
    assert "HTTP 403" in impostor.output()
    assert "token" in impostor.output()

    rig.start_worker(language=language, env={"DEX_WORKER_TOKEN": "w-2"})
    with dex.SyncClient(rig.server.address, token="c-1") as client:
        wait_until(lambda: client.list_agents(), 20, what="the Worker registered")
        sid = client.create_session("assistant")["id"]
        assert client.send_message(sid, "hi", wait=True)["text"] == "echo: hi"


@LANGUAGES
def test_the_worker_tries_the_addresses_in_turn(rig: Rig, language: str) -> None:
    rig.start_server()
    nobody = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    worker = SdkWorkerProcess(
        sdk_command(language),
        f"{nobody},{rig.server.address}",
        rig.tmp / "worker-addresses.log",
    )
    rig.workers.append(worker.start())
    sid = rig.session()
    assert rig.wait_turn(sid, rig.client.send_message(sid, "hi")["turn"])["text"] == "echo: hi"
    assert nobody in worker.output()  # it did try the first address, and said so


def handed_back(rig: Rig, step_type: str) -> float:
    """How many attempts of ``step_type`` Workers handed back (``dex_attempts``)."""
    with urllib.request.urlopen(rig.server.address + "/metrics", timeout=5) as response:
        lines = response.read().decode().splitlines()
    wanted = ('outcome="handed_back"', f'step_type="{step_type}"')
    return sum(
        float(line.split()[-1])
        for line in lines
        if line.startswith("dex_attempts_total{") and all(w in line for w in wanted)
    )


@LANGUAGES
def test_the_worker_keeps_the_history_so_a_long_sessions_hand_outs_stay_short(
    rig: Rig, language: str
) -> None:
    rig.start_server()
    rig.start_worker(language=language)
    sid = rig.session()
    long = "x" * 20_000  # its echo doubles it: the whole view is over 40 kB from here on
    assert rig.wait_turn(sid, rig.client.send_message(sid, long)["turn"])["text"] == f"echo: {long}"

    def sent_bytes() -> float:
        return metric(rig, "dex_worker_sent_bytes_total")

    # turn 2: two RunModel hand-outs, each building on the view the Worker kept (the
    # first carries the 20 kB echo, which the Worker made but was never handed); the model
    # finds the turn's message and the tool's result only if the Worker joined them right
    before = sent_bytes()
    t = rig.wait_turn(sid, rig.call(sid, ("lookup", {"key": "k"})))
    second = sent_bytes() - before
    before = sent_bytes()
    follow = rig.wait_turn(sid, rig.client.send_message(sid, "and now?")["turn"])
    third = sent_bytes() - before

    assert results(t)[0]["result"] == {"key": "k", "value": "K"}
    assert follow["text"] == "echo: and now?"
    # whole views would be over 80 kB for turn 2 and over 40 kB for turn 3
    assert second < 30_000 and third < 5_000, f"bytes sent per turn: {second}, {third}"
    assert handed_back(rig, "RunModel") == 0  # the Worker never lacked what a delta built on
