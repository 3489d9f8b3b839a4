"""The test MCP server (``mcp_server.py``) as a process serving Streamable HTTP."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from dex.testing import free_port, wait_until

SERVER = Path(__file__).with_name("mcp_server.py")


class MCPServerProcess:
    """``mcp_server.py http PORT``, its ledger and gates in ``env``; the same port across
    restarts, so a Worker finds it again."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.env = env
        self.log = log
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> MCPServerProcess:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, str(SERVER), "http", str(self.port)],
                env={**os.environ, **self.env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until(self._listening, 20, what=f"the MCP server listening on {self.port}")
        return self

    def _listening(self) -> bool:
        assert self.process is not None
        if self.process.poll() is not None:
            raise RuntimeError(f"the MCP server exited: see {self.log}")
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        return True

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)
