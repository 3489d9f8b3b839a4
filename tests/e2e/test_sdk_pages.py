"""docs/typescript-worker.md and docs/go-worker.md, run as written: each page's first
program (its files, the blocks marked ``<!-- program: NAME -->``) written to a folder,
built as its commands say, and served against a real ``dex server``, where a turn calls
its tool and answers through the page's scripted model.

Offline, as the test command builds the SDKs: the TypeScript program installs the SDK from
this checkout (its compiler and Node types linked from the SDK's own ``node_modules``, the
registry's stand-in), and the Go program builds from ``sdk/go`` with the modules of
``/usr/share/gocode`` (``GOPROXY=off``, as ``scripts/go``)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import dex
from dex.testing import SdkWorkerProcess, ServerProcess, wait_until

ROOT = Path(__file__).parents[2]
CHECKOUT = "/path/to/dex"
"""Where the pages' files say the checkout of Dex is."""

TYPESCRIPT_RUN = [
    "(cd /path/to/dex/sdk/typescript && npm ci && npm run build)",
    "cd concierge",
    "npm install",
    "npm run build",
    "dex server --data-dir ./dex-data",
    "npm start",
    "dex new concierge --session-id first",
    'dex send first "Weather in Paris?"',
]
GO_RUN = [
    "cd concierge",
    "GOFLAGS=-mod=mod go build -o concierge .",
    "dex server --data-dir ./dex-data",
    "./concierge",
    "dex new concierge --session-id first",
    'dex send first "Weather in Paris?"',
]
"""Every command of each page's marked shell blocks, in order: what the tests run."""


def program(page: str) -> tuple[dict[str, str], list[str]]:
    """The page's marked files, by name, and the lines of its marked shell blocks."""
    text = (ROOT / "docs" / page).read_text()
    marked = re.findall(r"<!-- program: (\S+) -->\n```\w*\n(.*?)```", text, re.S)
    files = {name: body for name, body in marked if name != "commands"}
    commands = [
        line.strip()
        for name, body in marked
        if name == "commands"
        for line in body.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    return files, commands


def write(folder: Path, files: dict[str, str]) -> None:
    folder.mkdir()
    for name, body in files.items():
        (folder / name).write_text(body.replace(CHECKOUT, str(ROOT)))


def run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        command,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **(env or {})},
    )
    assert done.returncode == 0, f"{shlex.join(command)}:\n{done.stdout}\n{done.stderr}"


def serve_a_turn(tmp: Path, worker_command: list[str], answer: str) -> None:
    """``dex server``, the page's Worker, then ``dex new`` and ``dex send``: the turn calls
    get_weather and answers from its result."""
    server = ServerProcess(tmp / "dex-data").start()  # dex server --data-dir ./dex-data
    worker = SdkWorkerProcess(worker_command, server.address, tmp / "worker.log")

    def dex_(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "dex", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DEX_ADDRESS": server.address},
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    client = dex.SyncClient(server.address, timeout=30)
    try:
        worker.start()
        wait_until(lambda: client.list_agents(), 30, what="the page's Worker registered")
        dex_("new", "concierge", "--session-id", "first")
        said = dex_("send", "first", "Weather in Paris?")  # a summary for people

        turn = client.wait_turn("first", 1)
        assert turn["status"] == "completed", (turn, worker.log.read_text())
        assert answer in said, said
        assert turn["text"] == answer
        (call,) = turn["tool_calls"]
        assert (call["name"], call["status"]) == ("get_weather", "succeeded")
        assert call["arguments"] == {"city": "Paris"}
    finally:
        client.close()
        worker.kill()
        server.kill()


def test_the_typescript_page_runs_as_written(tmp_path: Path) -> None:
    files, commands = program("typescript-worker.md")
    assert commands == TYPESCRIPT_RUN  # the test runs what the page says
    assert set(files) == {"package.json", "tsconfig.json", "concierge.ts"}
    sdk = ROOT / "sdk" / "typescript"
    assert (sdk / "dist" / "src" / "index.js").exists(), "run scripts/typescript"  # npm ci && build
    package = json.loads(files["package.json"])
    assert package["dependencies"]["dex-runtime"] == f"file:{CHECKOUT}/sdk/typescript"
    assert package["scripts"]["start"] == "node dist/concierge.js"

    folder = tmp_path / "concierge"
    write(folder, files)
    # the registry's stand-in: the compiler and Node's types the SDK installed
    (folder / "node_modules" / "@types").mkdir(parents=True)
    for name in ("typescript", "@types/node"):
        (folder / "node_modules" / name).symlink_to(sdk / "node_modules" / name)
    run(["npm", "install", "--offline", "--no-audit", "--no-fund"], folder)
    run(["npm", "run", "build"], folder)

    answer = "Done: sunny in Paris"
    serve_a_turn(tmp_path, ["node", str(folder / "dist" / "concierge.js")], answer)  # npm start


def test_the_go_page_runs_as_written(tmp_path: Path) -> None:
    files, commands = program("go-worker.md")
    assert commands == GO_RUN
    assert set(files) == {"go.mod", "main.go"}
    assert f"replace github.com/dex-run/dex/sdk/go => {CHECKOUT}/sdk/go" in files["go.mod"]

    folder = tmp_path / "concierge"
    write(folder, files)
    offline = {
        "GOFLAGS": "-mod=mod",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "GOCACHE": os.environ.get("GOCACHE", "/tmp/dex-go-cache"),
        "GOPATH": os.environ.get("GOPATH", "/tmp/dex-go-path"),
    }
    run(["go", "build", "-o", "concierge", "."], folder, offline)

    serve_a_turn(tmp_path, [str(folder / "concierge")], 'Done: "sunny in Paris"')  # JSON
