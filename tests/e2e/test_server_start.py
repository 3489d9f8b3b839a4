"""What a person sees when ``dex server`` starts: where it listens, the console, the
database, the streams, whether auth is on; and a start that cannot go on is one line and a
non-zero exit, before anything claims to serve."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dex.testing import ServerProcess, free_port, wait_until


@pytest.fixture
def node(tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(tmp_path / "data")
    try:
        yield server
    finally:
        server.kill()


def start_lines(server: ServerProcess) -> list[str]:
    """The node's log lines, once the start lines are out (the last one is about auth)."""
    wait_until(lambda: "auth: " in server.output(), 10, what="the start lines")
    return server.output().splitlines()


def test_a_single_node_says_where_it_listens_and_what_it_uses(node: ServerProcess) -> None:
    node.start()

    lines = start_lines(node)
    text = "\n".join(lines)
    assert f"listening on http://127.0.0.1:{node.port}" in text
    assert f"web console: http://127.0.0.1:{node.port}/ui" in text
    assert f"database: SQLite at {(node.data_dir / 'dex.sqlite3').resolve()}" in text
    assert "live events: in this node's memory" in text
    assert "auth: off (only this machine reaches 127.0.0.1)" in text
    assert "WARNING" not in text
    # one node on SQLite has no role to speak of
    assert "standby" not in text and "waiting for the lead" not in text
    assert "node active" not in text


def test_auth_off_on_an_address_others_reach_is_a_warning(tmp_path: Path) -> None:
    log = tmp_path / "open.log"
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "dex", "server"),
                *("--data-dir", str(tmp_path / "open"), "--listen", f"0.0.0.0:{port}"),
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "auth: " in log.read_text(), 20, what="the start lines")
        [line] = [line for line in log.read_text().splitlines() if "auth: " in line]
        assert "WARNING" in line and f"0.0.0.0:{port} can be reached from other machines" in line
        assert "--tokens-file" in line
    finally:
        proc.kill()
        proc.wait(10)


def test_a_node_with_tokens_says_auth_is_on(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "data", env={"DEX_CLIENT_TOKEN": "secret"})
    try:
        server.start()
        lines = start_lines(server)
        assert any("auth: on" in line for line in lines)
        assert not any("auth: off" in line for line in lines)
    finally:
        server.kill()


def dex_server(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dex", "server", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DEX_LOG_LEVEL": "info"},
    )


def assert_one_line_refusal(done: subprocess.CompletedProcess[str], *why: str) -> None:
    output = (done.stdout + done.stderr).strip()
    assert done.returncode != 0, output
    [line] = output.splitlines()  # no traceback, nothing before it
    assert "cannot start: " in line and "action=node.start_failed" in line
    for part in why:
        assert part in line, line
    for claim in ("node active", "node.ready", "listening on", "recovered"):
        assert claim not in output


def test_a_port_in_use_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        done = dex_server("--data-dir", str(tmp_path / "data"), "--listen", f"127.0.0.1:{port}")
    assert_one_line_refusal(done, f"cannot listen on 127.0.0.1:{port}", "in use")
    assert not (tmp_path / "data" / "dex.sqlite3").exists()  # the store was never opened


def test_a_data_directory_in_use_is_one_line(node: ServerProcess) -> None:
    node.start()

    done = dex_server("--data-dir", str(node.data_dir), "--listen", f"127.0.0.1:{free_port()}")

    assert_one_line_refusal(done, "is in use by another Dex server")
    assert node.ready()  # the first node goes on serving


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("mysql://db/dex", "unknown database URL 'mysql://db/dex'"),
        ("sqlite:///", "names no file"),
    ],
)
def test_a_bad_database_url_is_one_line(tmp_path: Path, url: str, why: str) -> None:
    done = dex_server("--database", url, "--listen", f"127.0.0.1:{free_port()}")
    assert_one_line_refusal(done, why)
