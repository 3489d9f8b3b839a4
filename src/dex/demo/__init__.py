"""``dex demo``: a server and a Worker, a conversation, and a Worker SIGKILLed mid-tool.

It runs on the embedded default (SQLite in a data directory, no other service) and
prints what Dex did, next to what the outside world's own records say happened.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from dex.client import SyncClient
from dex.demo.agents import choose_model
from dex.testing import Ledger, ServerProcess, WorkerProcess, wait_until

AGENTS = str(Path(__file__).with_name("agents.py"))
console = Console(highlight=False)


def run(data_dir: Path | None, port: int) -> int:
    world = Path(tempfile.mkdtemp(prefix="dex-demo-"))
    data = data_dir or world / "data"
    if data.exists():
        shutil.rmtree(data)
    server = ServerProcess(data, port=port, heartbeat_timeout=2.0)
    env = {"DEX_DEMO_DIR": str(world)}
    workers: list[WorkerProcess] = []

    def start_worker() -> WorkerProcess:
        w = WorkerProcess(AGENTS, server.address, world / f"worker-{len(workers) + 1}.log", env=env)
        workers.append(w.start())
        return w

    try:
        _say(f"The agent's model: {choose_model()[1]}.")
        _say(f"Starting a Dex Server on {server.address} (SQLite in {data}) ...")
        server.start()
        worker = start_worker()
        _say(f"Starting Worker 1 (pid {worker.pid}) serving the 'concierge' agent ...")
        with SyncClient(server.address, timeout=60) as client:
            wait_until(lambda: client.list_agents(), 20, what="the Worker registered")
            session = client.create_session("concierge")["id"]
            _say(f"Session {session}.\n")

            _turn(client, session, "What's the weather in Paris?")

            _say(
                "\n[bold]Now a non-idempotent write.[/] The Worker will be SIGKILLed while "
                "the booking runs."
            )
            turn = client.send_message(session, "Book a table for two at 8pm, please.")["turn"]
            wait_until(
                lambda: (world / "book_table.running").exists(), 20, what="the booking tool running"
            )
            worker.kill()
            _say(f"[red]SIGKILL[/] Worker 1 (pid {worker.pid}) in the middle of book_table.")
            worker = start_worker()
            _say(
                f"Started Worker 2 (pid {worker.pid}). Dex notices the dead attempt when its "
                "heartbeats stop ..."
            )
            _show_turn(client.wait_turn(session, turn, timeout=60))

            _say("\n[bold]Now an idempotent write.[/] SIGKILL again while it runs.")
            turn = client.send_message(session, "Send ACME the invoice.")["turn"]
            wait_until(
                lambda: (world / "send_invoice.1.running").exists(),
                20,
                what="the invoice tool running",
            )
            worker.kill()
            _say(f"[red]SIGKILL[/] Worker 2 (pid {worker.pid}) in the middle of send_invoice.")
            worker = start_worker()
            _say(f"Started Worker 3 (pid {worker.pid}).")
            wait_until(
                lambda: (world / "send_invoice.2.running").exists(),
                30,
                what="the invoice tool running again",
            )
            (world / "send_invoice.2.done").write_text("")
            _show_turn(client.wait_turn(session, turn, timeout=60))

            _say("\n[bold]What the outside world recorded[/] (the tools' own ledger):")
            entries = Ledger(world / "world.jsonl").entries()
            for entry in entries:
                _say(f"  - {entry}")
            snapshot = client.get_agent_snapshot(session)
            _say(
                f"\nThe session is {snapshot['session']['status']}; its history has "
                f"{len(snapshot['history'])} items. Full snapshot: "
                f"dex snapshot {session} --address {server.address}"
            )
        tables = [e for e in entries if e["effect"] == "table booked"]
        invoices = [e for e in entries if e["effect"] == "invoice sent"]
        runs = [e for e in entries if "invoice" in e["effect"]]
        _say(
            f"\n[green]Done.[/] Tables booked: {len(tables)} (Dex recorded the outcome as "
            f"unknown rather than book again). Invoice runs: {len(runs)}, with "
            f"{len({e['key'] for e in runs})} idempotency key; invoices the billing system "
            f"kept: {len(invoices)}."
        )
        ok = len(tables) == 1 and len(invoices) == 1
        return 0 if ok else 1
    finally:
        for w in workers:
            w.kill()
        server.kill()
        console.print(f"[dim]Logs and the outside world's ledger are in {world}[/]")


def _turn(client: SyncClient, session: str, text: str) -> None:
    _say(f"[cyan]user:[/] {text}")
    _show_turn(client.send_message(session, text, wait=True, timeout=60))


def _show_turn(turn: dict[str, Any]) -> None:
    if turn["tool_calls"]:
        table = Table("tool call", "kind", "status", "attempts", "idempotency key")
        for call in turn["tool_calls"]:
            step = next((s for s in turn["steps"] if s["id"] == call["step_id"]), None)
            tried = ", ".join(
                f"#{a['number']} {a['outcome']}" for a in (step["attempts"] if step else [])
            )
            table.add_row(
                call["name"], call["kind"] or "?", call["status"], tried, call["idempotency_key"]
            )
        console.print(table)
    _say(f"[magenta]agent:[/] {turn['text'] or turn['error']}")


def _say(text: str) -> None:
    console.print(text)
