"""The tracer provider of the ``dex`` command's processes, when tracing is on.

A program that configures OpenTelemetry itself (or runs under ``opentelemetry-instrument``)
keeps its provider. Otherwise ``dex server --tracing`` and ``dex worker --tracing`` set
one up from the standard variables: ``OTEL_TRACES_EXPORTER`` (``otlp``, the default, over
HTTP to ``OTEL_EXPORTER_OTLP_ENDPOINT`` and its other ``OTEL_EXPORTER_OTLP_*`` settings;
``console``; or ``none``), ``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES``.
"""

from __future__ import annotations

import os

EXPORTERS = ("otlp", "console", "none")


def install_provider(service_name: str) -> None:
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import (
            BatchSpanProcessor,
            ConsoleSpanExporter,
            SpanExporter,
        )
    except ImportError:
        raise ValueError("tracing needs OpenTelemetry: pip install 'dex-runtime[otel]'") from None
    if isinstance(trace.get_tracer_provider(), TracerProvider):
        return  # configured by the program, or by opentelemetry-instrument
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter_name not in EXPORTERS:
        raise ValueError(f"OTEL_TRACES_EXPORTER={exporter_name!r}: choose {', '.join(EXPORTERS)}")
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    provider = TracerProvider(resource=Resource.create(attributes))
    exporter: SpanExporter | None = None
    if exporter_name == "otlp":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = OTLPSpanExporter()
    elif exporter_name == "console":
        exporter = ConsoleSpanExporter()
    if exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
