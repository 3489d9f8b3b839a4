"""The README's main command: ``dex demo`` runs end to end and tells what happened."""

from __future__ import annotations

import os
import subprocess
import sys

from dex.testing import free_port


def test_demo_books_once_and_deduplicates_the_invoice() -> None:
    without_keys = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY")}
    done = subprocess.run(
        [sys.executable, "-m", "dex", "demo", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
        env=without_keys,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())
    assert "the scripted model (no ANTHROPIC_API_KEY or OPENAI_API_KEY is set)" in out
    assert "outcome_unknown" in out
    assert "Tables booked: 1" in out
    assert "invoices the billing system kept: 1" in out
