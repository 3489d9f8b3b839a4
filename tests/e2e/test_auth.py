"""A server with auth on, a Worker with its worker token, clients with and without theirs."""

from __future__ import annotations

import signal
import ssl
from pathlib import Path

import pytest
import trustme

import dex
from dex.server.api.tokens import digest
from dex.testing import ServerProcess, WorkerProcess, wait_until
from tests.support.rig import AGENTS, Rig

TOKENS = {"DEX_CLIENT_TOKEN": "c-123", "DEX_WORKER_TOKEN": "w-456", "DEX_ADMIN_TOKEN": "a-789"}


def test_tokens_let_the_right_processes_in(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    rig.server.env.update(TOKENS)  # the server reads all three from its environment
    rig.start_server()
    impostor = rig.start_worker(env={"DEX_WORKER_TOKEN": "c-123"})  # a client token
    # refused, it exits with a message that says what to fix instead of retrying forever
    wait_until(lambda: not impostor.alive, 20, what="the refused Worker exited")
    assert impostor.proc is not None and impostor.proc.returncode == 1
    assert "refused this Worker (HTTP 403" in impostor.output()
    assert "set DEX_WORKER_TOKEN" in impostor.output()
    rig.start_worker(env={"DEX_WORKER_TOKEN": "w-456"})

    with dex.SyncClient(rig.server.address, token="c-123") as client:
        wait_until(lambda: client.list_agents(), 20, what="the real Worker registered")
        sid = client.create_session("assistant")["id"]
        assert client.send_message(sid, "hi", wait=True)["text"] == "echo: hi"

    monkeypatch.delenv("DEX_CLIENT_TOKEN", raising=False)
    with (
        dex.SyncClient(rig.server.address) as anonymous,
        pytest.raises(dex.AuthError, match="Bearer"),
    ):
        anonymous.get_agent_snapshot(sid)
    with (
        dex.SyncClient(rig.server.address, token="w-456") as wrong_role,
        pytest.raises(dex.AuthError, match="needs a client token"),
    ):
        wrong_role.get_agent_snapshot(sid)


def test_a_tokens_file_rotates_on_sighup_and_a_scoped_worker_is_refused_for_other_agents(
    rig: Rig,
) -> None:
    tokens = rig.tmp / "tokens.toml"
    old, new, worker = "client-old", "client-new", "worker-scoped"

    def entry(role: str, token: str, extra: str = "") -> str:
        return f'[[token]]\nrole = "{role}"\nsha256 = "{digest(token).hex()}"\n{extra}\n'

    tokens.write_text(entry("client", old) + entry("worker", worker, 'agents = ["assistant"]'))
    rig.server.env["DEX_TOKENS_FILE"] = str(tokens)
    rig.start_server()
    # tests/support/agents.py serves more agents than its token allows: refused for good
    refused = rig.start_worker(env={"DEX_WORKER_TOKEN": worker})
    wait_until(lambda: not refused.alive, 20, what="the scoped Worker exited")
    assert refused.proc is not None and refused.proc.returncode == 1
    assert "may not serve" in refused.output() and "compactor" in refused.output()

    with dex.SyncClient(rig.server.address, token=old) as client:
        assert client.list_sessions()["sessions"] == []
    tokens.write_text(entry("client", old) + entry("client", new))
    assert rig.server.proc is not None
    rig.server.proc.send_signal(signal.SIGHUP)  # read at once, not at the next look
    with dex.SyncClient(rig.server.address, token=new) as client:
        wait_until(lambda: _lets_in(client), 5, what="the new token works after SIGHUP")
    assert rig.server.alive  # SIGHUP used to end the node (Python's default action)
    assert "tokens file read: 2 tokens" in rig.server.output()
    with dex.SyncClient(rig.server.address, token=old) as client:
        assert client.list_sessions()["sessions"] == []  # both valid during a rotation


def _lets_in(client: dex.SyncClient) -> bool:
    try:
        client.list_sessions()
    except dex.AuthError:
        return False
    return True


def test_tls_with_a_certificate_made_here_serves_clients_and_workers(tmp_path: Path) -> None:
    """``dex server --tls-cert --tls-key`` (here by their environment variables): clients
    verify it with ``Client(ssl=...)``, a Worker process with ``SSL_CERT_FILE``."""
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert_file, key_file, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_pem.write_to_path(str(key_file))
    cert.cert_chain_pems[0].write_to_path(str(cert_file))
    ca.cert_pem.write_to_path(str(ca_file))
    context = ssl.create_default_context(cafile=str(ca_file))
    server = ServerProcess(
        tmp_path / "data",
        tls=context,
        env={"DEX_TLS_CERT": str(cert_file), "DEX_TLS_KEY": str(key_file)},
    )
    worker = WorkerProcess(
        AGENTS, server.address, tmp_path / "worker.log", env={"SSL_CERT_FILE": str(ca_file)}
    )
    try:
        server.start()
        assert server.address.startswith("https://")
        worker.start()
        with dex.SyncClient(server.address, ssl=context) as client:
            wait_until(lambda: client.list_agents(), 20, what="the Worker registered over wss")
            sid = client.create_session("assistant")["id"]
            assert client.send_message(sid, "over tls", wait=True)["text"] == "echo: over tls"
        # a client that does not trust the certificate is refused, not answered in clear
        with (
            dex.SyncClient(server.address, timeout=2) as untrusting,
            pytest.raises(dex.Unavailable, match="CERTIFICATE_VERIFY_FAILED"),
        ):
            untrusting.list_agents()
    finally:
        worker.kill()
        server.kill()
