"""``dex server`` starts without loading what only clients and Workers use (aiohttp and
the rest of their runtime): imports are most of a restart's time before it serves."""

from __future__ import annotations

import subprocess
import sys


def test_the_server_command_does_not_load_the_client_or_the_worker() -> None:
    code = (
        "import sys, dex, dex.cli.main, dex.server.app\n"
        "print(sorted(m for m in ('aiohttp', 'dex.client', 'dex.worker') if m in sys.modules))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[]"
