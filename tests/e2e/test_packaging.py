"""Dex installs by its name from a wheel into a fresh virtualenv, with only the core
(no model SDK), and runs ``dex server`` with its web console; the TypeScript SDK installs by
its name from the tarball ``npm pack`` makes, and loads with ``import`` and ``require``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

from dex.testing import free_port, wait_until

ROOT = Path(__file__).parents[2]
SDK = ROOT / "sdk" / "typescript"


def run(
    *args: str | Path, timeout: float = 300, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )
    assert done.returncode == 0, f"{args}:\n{done.stdout}\n{done.stderr}"
    return done


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


PUBLIC = ["Client", "Worker", "defineAgent", "defineTool", "PENDING", "ToolError"]
"""Some of the SDK's names, each checked by both entries."""
USES = """
const tool = defineTool({
  name: "echo", description: "Echo.", kind: "read",
  parameters: { type: "object" }, run: () => "ok",
});
const client = new Client({ address: "http://127.0.0.1:9" });
client.close();
console.log(JSON.stringify({
  names: [Client, Worker, defineAgent, defineTool, PENDING, ToolError].map((x) => typeof x),
  tool: tool.options.name,
  toolError: new ToolError("no") instanceof Error,
}));
"""
TYPED = """
const args: Args = { city: "Paris" };
const options: WorkerOptions = { agents: [], capacity: 1 };
const kind: ToolKind = "read";
export const used = [args, options, kind, Worker, Client];
"""


def test_the_npm_tarball_installs_by_name_and_loads_with_import_and_require(
    tmp_path: Path,
) -> None:
    """``npm pack`` (of the built SDK, as scripts/typescript builds it), then ``npm install``
    of the tarball into a fresh folder, its dependencies from npm's cache where ``npm ci`` put
    them (their registry metadata, which ``npm ci`` does not need, from the registry once,
    then from the cache too: ``--offline`` fails before that): an ES module and a CommonJS
    file load it by its name, and TypeScript finds its types through both conditions of its
    ``exports`` map."""
    package = json.loads((SDK / "package.json").read_text())
    name = package["name"]
    assert (SDK / "dist" / "src" / "index.mjs").exists(), "run scripts/typescript"
    packed = run(
        "npm", "pack", "--json", "--ignore-scripts", "--pack-destination", tmp_path, cwd=SDK
    )
    (tarball,) = json.loads(packed.stdout)
    shipped = {f["path"] for f in tarball["files"]}
    assert {"package.json", "dist/src/index.js", "dist/src/index.mjs"} <= shipped
    assert {"dist/src/index.d.ts", "dist/src/index.d.mts"} <= shipped
    assert not [f for f in shipped if f.startswith(("src/", "test/", "dist/test/"))]

    app = tmp_path / "app"
    app.mkdir()
    (app / "package.json").write_text('{"name": "app", "private": true}')
    run(
        "npm",
        "install",
        "--prefer-offline",
        "--no-audit",
        "--no-fund",
        tmp_path / tarball["filename"],
        cwd=app,
    )
    assert json.loads((app / "node_modules" / name / "package.json").read_text())["name"] == name

    names = ", ".join(PUBLIC)
    (app / "check.mjs").write_text(f'import {{ {names} }} from "{name}";\n{USES}')
    (app / "check.cjs").write_text(f'const {{ {names} }} = require("{name}");\n{USES}')
    for script in ("check.mjs", "check.cjs"):
        said = json.loads(run("node", script, cwd=app).stdout)
        assert said == {
            "names": ["function", "function", "function", "function", "symbol", "function"],
            "tool": "echo",
            "toolError": True,
        }, script

    # the types, found by each condition: a .mts file imports, a .cts file (whose imports
    # TypeScript compiles to require) requires
    for module in ("typescript", "@types/node"):  # the registry's stand-in, as the SDK's own
        (app / "node_modules" / module).parent.mkdir(parents=True, exist_ok=True)
        (app / "node_modules" / module).symlink_to(SDK / "node_modules" / module)
    typed = "Args, Client, ToolKind, Worker, WorkerOptions"
    (app / "check.mts").write_text(f'import {{ {typed} }} from "{name}";\n{TYPED}')
    (app / "check.cts").write_text(f'import {{ {typed} }} from "{name}";\n{TYPED}')
    tsc = app / "node_modules" / "typescript" / "bin" / "tsc"
    strict = ["--noEmit", "--strict", "--module", "nodenext", "--target", "es2022"]
    run(tsc, *strict, "--types", "node", "check.mts", "check.cts", cwd=app)
