"""Dex installs by its name from a wheel into a fresh virtualenv, with only the core
(no model SDK), and runs ``dex server`` with its web console."""

from __future__ import annotations

import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from dex.testing import free_port, wait_until

ROOT = Path(__file__).parents[2]


def run(*args: str | Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=True
    )


def test_the_wheel_installs_by_name_and_serves(tmp_path: Path) -> None:
    wheels = tmp_path / "wheels"
    run(sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", wheels, ROOT)
    (wheel,) = wheels.glob("dex_runtime-*.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    python = venv / "bin" / "python"
    run(python, "-m", "pip", "install", "-q", "--disable-pip-version-check", wheel)

    version = run(venv / "bin" / "dex", "--version")
    assert version.stdout.startswith("dex ")
    # the core is the client and the server: no model SDK comes with it
    missing = subprocess.run(
        [python, "-c", "from dex.models import Anthropic"], capture_output=True, text=True
    )
    assert missing.returncode == 1
    assert "pip install 'dex-runtime[anthropic]'" in missing.stderr

    port = free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [
            venv / "bin" / "dex",
            "server",
            "--data-dir",
            tmp_path / "data",
            "--listen",
            f"127.0.0.1:{port}",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def ready() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                    return bool(r.status == 200)
            except OSError:
                return False

        wait_until(lambda: ready() or server.poll() is not None, 60, what="dex server ready")
        assert server.poll() is None, (tmp_path / "server.log").read_text()
        # the console's templates and static files are package data in the wheel
        for page in ("/ui", "/ui/sessions", "/ui/static/console.js"):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{page}", timeout=5) as r:
                assert r.status == 200, page
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(30)
        log.close()
    assert code == 0
