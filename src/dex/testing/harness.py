"""Start real Dex Server and Worker processes, SIGKILL them, start them again."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Generic, TypeVar

from dex.testing.wait import wait_until

T = TypeVar("T")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class _Process:
    def __init__(self, log: Path, wrap: Sequence[str] = ()) -> None:
        self.log = log
        self.wrap = list(wrap)
        """A command the process runs under (``valgrind --tool=callgrind``, say)."""
        self.proc: subprocess.Popen[bytes] | None = None

    def _spawn(self, args: list[str], env: Mapping[str, str]) -> None:
        self._spawn_command([sys.executable, "-m", "dex", *args], env)

    def _spawn_command(self, command: list[str], env: Mapping[str, str]) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [*self.wrap, *command],
                env={**os.environ, **env},
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL, and wait until the process is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, and wait for a graceful exit. Returns the exit code."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


class ServerProcess(_Process):
    """``dex server`` on a data directory (or ``database``, a URL several nodes share);
    restart it on the same storage after a kill."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        heartbeat_timeout: float = 2.0,
        env: Mapping[str, str] | None = None,
        database: str | None = None,
        wrap: Sequence[str] = (),
        tls: ssl.SSLContext | None = None,
        standby: bool = False,
    ) -> None:
        """``tls``: the node serves HTTPS (give ``DEX_TLS_CERT`` and ``DEX_TLS_KEY`` in
        ``env``); the context verifies it, for the probes. ``standby``: on PostgreSQL, a
        hot standby (``--standby``), which owns nothing while another node serves."""
        super().__init__(data_dir.parent / f"{data_dir.name}-server.log", wrap)
        self.data_dir = data_dir
        self.port = port or free_port()
        self.heartbeat_timeout = heartbeat_timeout
        self.env = dict(env or {})
        self.database = database
        self.tls = tls
        self.standby = standby

    @property
    def address(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def start(
        self, env: Mapping[str, str] | None = None, timeout: float = 30.0, *, ready: bool = True
    ) -> ServerProcess:
        """Start the node and wait until it serves (``ready``), or, for a node that may
        come up a standby, until it answers ``/healthz``."""
        storage = ["--database", self.database] if self.database else []
        if self.standby:
            storage.append("--standby")
        self._spawn(
            [
                "server",
                "--data-dir",
                str(self.data_dir),
                *storage,
                "--listen",
                f"127.0.0.1:{self.port}",
                "--heartbeat-timeout",
                str(self.heartbeat_timeout),
            ],
            {**self.env, **(env or {})},
        )
        probe = self.ready if ready else self.answers
        try:
            wait_until(lambda: probe() or not self.alive, timeout, 0.02, "server up")
        except TimeoutError:
            raise TimeoutError(
                f"the server did not come up within {timeout}s:\n{self.output()[-3000:]}"
            ) from None
        if not self.alive:
            raise RuntimeError(f"server exited:\n{self.output()[-3000:]}")
        return self

    def ready(self) -> bool:
        """Whether it serves: ``/readyz`` answers 200 (the active node)."""
        return self._get("/readyz")

    def answers(self) -> bool:
        """Whether the process answers at all (``/healthz``): a standby does."""
        return self._get("/healthz")

    def _get(self, path: str) -> bool:
        try:
            with urllib.request.urlopen(self.address + path, timeout=1, context=self.tls) as r:
                return bool(r.status == 200)
        except OSError:
            return False


class _Worker(_Process, Generic[T]):
    """A Worker process pointed at a server (its addresses, comma-separated). ``runs``:
    what it runs, the module of ``WorkerProcess`` or the command of ``SdkWorkerProcess``."""

    def __init__(
        self,
        runs: T,
        address: str,
        log: Path,
        *,
        env: Mapping[str, str] | None = None,
        capacity: int = 16,
        wrap: Sequence[str] = (),
    ) -> None:
        super().__init__(log, wrap)
        self.runs = runs
        self.address = address
        self.env = dict(env or {})
        self.capacity = capacity


class WorkerProcess(_Worker[str]):
    """``dex worker MODULE`` pointed at a server (``runs`` is the MODULE)."""

    def start(self, env: Mapping[str, str] | None = None) -> WorkerProcess:
        self._spawn(
            ["worker", self.runs, "--address", self.address, "--capacity", str(self.capacity)],
            {**self.env, **(env or {})},
        )
        return self


class SdkWorkerProcess(_Worker[Sequence[str | Path]]):
    """A Worker written with another SDK, started as the command ``runs`` (``node
    agents.js`` for the TypeScript SDK, a built executable for the Go SDK) and given the
    server's address and the capacity through ``DEX_ADDRESS`` and ``DEX_WORKER_CAPACITY``.
    It has the methods of ``WorkerProcess``."""

    def start(self, env: Mapping[str, str] | None = None) -> SdkWorkerProcess:
        self._spawn_command(
            [str(part) for part in self.runs],
            {
                "DEX_ADDRESS": self.address,
                "DEX_WORKER_CAPACITY": str(self.capacity),
                **self.env,
                **(env or {}),
            },
        )
        return self
