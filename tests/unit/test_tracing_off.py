"""With tracing off (the default) a Worker's attempts go through no span and nothing of
OpenTelemetry is imported: a fresh interpreter tells."""

from __future__ import annotations

import subprocess
import sys

PROGRAM = """
import sys
import dex
from dex.models import Scripted, say
from dex.wire import StepType
from dex.wire.server_frames import Step

agent = dex.Agent(name="a", model=Scripted(lambda history: say("hi")))
worker = dex.Worker([agent], "http://127.0.0.1:1")
handout = Step(attempt_id="s/1.1/1", session_id="s", step_id="1.1",
               step_type=StepType.RUN_MODEL, attempt=1, agent="a")
from dex.worker.runner import Attempt
traceparent = "00-" + "1" * 32 + "-" + "2" * 16 + "-01"
with worker._runner._span(Attempt(handout, None, traceparent=traceparent), agent):
    pass
traced = ("opentelemetry", "dex.server.tracing", "dex.worker.tracing")
print(sorted(m for m in sys.modules if m.startswith(traced)))
"""


def test_a_worker_with_tracing_off_imports_no_opentelemetry() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]"
