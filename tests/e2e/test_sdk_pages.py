"""The SDKs' pages, run as written: each page's first program (its files, the blocks
marked ``<!-- program: NAME -->``) written to a folder and built as its commands say.
docs/typescript-worker.md's and docs/go-worker.md's are served against a real
``dex server``, where a turn calls its tool and answers through the page's scripted model;
docs/typescript-client.md's and docs/go-client.md's ask that Worker's ``concierge``, and
print what the server's own record (the Python Client's) says, as the page shows it.

Offline, as the test command builds the SDKs: the TypeScript program installs the SDK from
this checkout (its compiler and Node types linked from the SDK's own ``node_modules``, the
registry's stand-in), and the Go program builds from ``sdk/go`` with the modules of
``/usr/share/gocode`` (``GOPROXY=off``, as ``scripts/go``; the Client's, with none)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
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
TYPESCRIPT_CLIENT_RUN = ["cd ask", "npm install", "npm run build", "npm start"]
GO_CLIENT_RUN = ["cd ask", "GOFLAGS=-mod=mod go build -o ask .", "./ask"]
"""Every command of each page's marked shell blocks, in order: what the tests run."""
PAGE_SESSION = "s_0193f4b6c2a18e5d9c03b7f2"
"""The session id in the Client pages' marked output, where the server makes one."""


def marked(page: str) -> list[tuple[str, str]]:
    text = (ROOT / "docs" / page).read_text()
    return re.findall(r"<!-- program: (\S+) -->\n```\w*\n(.*?)```", text, re.S)


def program(page: str) -> tuple[dict[str, str], list[str]]:
    """The page's marked files, by name, and the lines of its marked shell blocks."""
    blocks = marked(page)
    files = {name: body for name, body in blocks if name not in ("commands", "output")}
    commands = [
        line.strip()
        for name, body in blocks
        if name == "commands"
        for line in body.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    return files, commands


def printed(page: str) -> str:
    """What the page shows its program printing: its marked ``output`` block."""
    (output,) = [body for name, body in marked(page) if name == "output"]
    return output


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


def build_typescript(folder: Path, files: dict[str, str]) -> None:
    """``npm install`` and ``npm run build`` in the folder, offline."""
    write(folder, files)
    sdk = ROOT / "sdk" / "typescript"
    # the registry's stand-in: the compiler and Node's types the SDK installed
    (folder / "node_modules" / "@types").mkdir(parents=True)
    for name in ("typescript", "@types/node"):
        (folder / "node_modules" / name).symlink_to(sdk / "node_modules" / name)
    run(["npm", "install", "--offline", "--no-audit", "--no-fund"], folder)
    run(["npm", "run", "build"], folder)


def build_go(folder: Path, files: dict[str, str], name: str) -> None:
    """``GOFLAGS=-mod=mod go build -o NAME .`` in the folder, offline."""
    write(folder, files)
    offline = {
        "GOFLAGS": "-mod=mod",
        "GOPROXY": "off",
        "GOTOOLCHAIN": "local",
        "GOCACHE": os.environ.get("GOCACHE", "/tmp/dex-go-cache"),
        "GOPATH": os.environ.get("GOPATH", "/tmp/dex-go-path"),
    }
    run(["go", "build", "-o", name, "."], folder, offline)


@contextmanager
def served(tmp: Path, worker_command: list[str]) -> Iterator[tuple[str, dex.SyncClient]]:
    """``dex server`` and the page's Worker, once it registered: the server's address, and
    a Python Client of it."""
    server = ServerProcess(tmp / "dex-data").start()  # dex server --data-dir ./dex-data
    worker = SdkWorkerProcess(worker_command, server.address, tmp / "worker.log")
    client = dex.SyncClient(server.address, timeout=30)
    try:
        worker.start()
        wait_until(lambda: client.list_agents(), 30, what="the page's Worker registered")
        yield server.address, client
    except BaseException:
        if worker.log.exists():
            print(worker.log.read_text())  # shown with the failure
        raise
    finally:
        client.close()
        worker.kill()
        server.kill()


def serve_a_turn(tmp: Path, worker_command: list[str], answer: str) -> None:
    """``dex server``, the page's Worker, then ``dex new`` and ``dex send``: the turn calls
    get_weather and answers from its result."""
    with served(tmp, worker_command) as (address, client):

        def dex_(*args: str) -> str:
            done = subprocess.run(
                [sys.executable, "-m", "dex", *args],
                capture_output=True,
                text=True,
                timeout=60,
                env={**os.environ, "DEX_ADDRESS": address},
            )
            assert done.returncode == 0, done.stderr
            return done.stdout

        dex_("new", "concierge", "--session-id", "first")
        said = dex_("send", "first", "Weather in Paris?")  # a summary for people

        turn = client.wait_turn("first", 1)
        assert turn["status"] == "completed", turn
        assert answer in said, said
        assert turn["text"] == answer
        (call,) = turn["tool_calls"]
        assert (call["name"], call["status"]) == ("get_weather", "succeeded")
        assert call["arguments"] == {"city": "Paris"}


def ask_the_concierge(
    tmp: Path, worker_command: list[str], client_command: list[str], page: str, answer: str
) -> None:
    """``dex server``, the Worker page's concierge, then the Client page's program, whose
    output must be the server's record of what it did, and what the page shows."""
    with served(tmp, worker_command) as (address, client):
        done = subprocess.run(
            client_command,
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, "DEX_ADDRESS": address},
        )
        assert done.returncode == 0, f"{shlex.join(client_command)}:\n{done.stdout}\n{done.stderr}"

        (session,) = client.list_sessions(agent="concierge")["sessions"]  # the one it made
        turn = client.wait_turn(session["id"], 1)
        assert (turn["status"], turn["text"]) == ("completed", answer), turn
        calls = client.get_agent_snapshot(session["id"])["tool_calls"]
        assert [(c["name"], c["arguments"]) for c in calls] == [("get_weather", {"city": "Paris"})]
        assert done.stdout.splitlines() == [
            f"session {session['id']}, turn 1: completed",
            *(
                f"{c['name']} {json.dumps(c['arguments'], separators=(',', ':'))}: {c['status']}"
                for c in calls
            ),
            answer,
        ]
        assert done.stdout == printed(page).replace(PAGE_SESSION, session["id"])


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
    build_typescript(folder, files)

    answer = "Done: sunny in Paris"
    serve_a_turn(tmp_path, ["node", str(folder / "dist" / "concierge.js")], answer)  # npm start


def test_the_go_page_runs_as_written(tmp_path: Path) -> None:
    files, commands = program("go-worker.md")
    assert commands == GO_RUN
    assert set(files) == {"go.mod", "main.go"}
    assert f"replace github.com/dex-run/dex/sdk/go => {CHECKOUT}/sdk/go" in files["go.mod"]

    folder = tmp_path / "concierge"
    build_go(folder, files, "concierge")

    serve_a_turn(tmp_path, [str(folder / "concierge")], 'Done: "sunny in Paris"')  # JSON


def test_the_typescript_client_page_runs_as_written(tmp_path: Path) -> None:
    files, commands = program("typescript-client.md")
    assert commands == TYPESCRIPT_CLIENT_RUN
    assert set(files) == {"package.json", "tsconfig.json", "ask.ts"}
    package = json.loads(files["package.json"])
    assert package["dependencies"]["dex-runtime"] == f"file:{CHECKOUT}/sdk/typescript"
    assert package["scripts"]["start"] == "node dist/ask.js"
    # the agent it asks: the TypeScript Worker page's program, built as that page says
    concierge = tmp_path / "concierge"
    build_typescript(concierge, program("typescript-worker.md")[0])

    ask = tmp_path / "ask"
    build_typescript(ask, files)
    worker = ["node", str(concierge / "dist" / "concierge.js")]
    client = ["node", str(ask / "dist" / "ask.js")]  # npm start
    ask_the_concierge(tmp_path, worker, client, "typescript-client.md", "Done: sunny in Paris")


def test_the_go_client_page_runs_as_written(tmp_path: Path) -> None:
    files, commands = program("go-client.md")
    assert commands == GO_CLIENT_RUN
    assert set(files) == {"go.mod", "main.go"}
    assert f"replace github.com/dex-run/dex/sdk/go => {CHECKOUT}/sdk/go" in files["go.mod"]
    assert "/usr/share/gocode" not in files["go.mod"]  # the Client needs no other module
    concierge = tmp_path / "concierge"
    build_go(concierge, program("go-worker.md")[0], "concierge")

    ask = tmp_path / "ask"
    build_go(ask, files, "ask")
    worker, client = [str(concierge / "concierge")], [str(ask / "ask")]
    ask_the_concierge(tmp_path, worker, client, "go-client.md", 'Done: "sunny in Paris"')
