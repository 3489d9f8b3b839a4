"""The Worker's OpenTelemetry spans: one per attempt it runs, under the attempt's span on
the server (the hand-out's ``traceparent``), current while the model or tool code runs so
that spans the user's code makes nest under it.

Loaded only when ``WorkerConfig.tracing`` is on: with it off the Worker holds ``None``
and imports nothing of OpenTelemetry.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Status, StatusCode, TracerProvider
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import dex
from dex.errors import ToolError
from dex.tools import Interrupt
from dex.wire import StepType
from dex.wire.server_frames import Step

_PROPAGATOR = TraceContextTextMapPropagator()


class AttemptTracing:
    def __init__(self, worker_id: str, provider: TracerProvider | None = None) -> None:
        provider = provider or trace.get_tracer_provider()
        self.tracer = provider.get_tracer("dex.worker", dex.__version__)
        self.worker_id = worker_id

    @contextmanager
    def span(self, h: Step, traceparent: str | None, model: dict[str, Any]) -> Iterator[None]:
        """The span of one attempt, named for what runs: ``dex.model AGENT``, ``dex.compact
        AGENT`` or ``dex.tool TOOL``. A ``ToolError`` sets its status to error; a pause
        (``ctx.ask``, ``ctx.sleep``) or a cancellation does not."""
        attributes: dict[str, Any] = {
            "dex.session_id": h.session_id,
            "dex.step_id": h.step_id,
            "dex.step_type": h.step_type.value,
            "dex.attempt_id": h.attempt_id,
            "dex.attempt": h.attempt,
            "dex.agent": h.agent,
            "dex.worker_id": self.worker_id,
        }
        if h.step_type == StepType.RUN_MODEL:
            name = f"dex.model {h.agent}"
            attributes["gen_ai.system"] = str(model.get("provider", ""))
            attributes["gen_ai.request.model"] = str(model.get("name", ""))
        elif h.step_type == StepType.COMPACT_CONTEXT:
            name = f"dex.compact {h.agent}"
        else:
            name = f"dex.tool {h.tool}"
            attributes.update({"dex.tool": h.tool or "", "dex.call_id": h.call_id or ""})
        parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else None
        with self.tracer.start_as_current_span(
            name,
            context=parent,
            kind=SpanKind.CONSUMER,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield
            except Interrupt:
                span.set_attribute("dex.paused", True)  # asked a question, or sleeps
                raise
            except asyncio.CancelledError:
                span.set_attribute("dex.cancelled", True)
                raise
            except ToolError as e:
                span.set_status(Status(StatusCode.ERROR, e.message))
                raise
            except Exception as e:
                span.record_exception(e)
                span.set_status(Status(StatusCode.ERROR, f"{type(e).__name__}: {e}"))
                raise
