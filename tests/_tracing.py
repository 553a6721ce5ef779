"""One OpenTelemetry SDK provider per test process, recording into one in-memory exporter.

The global tracer provider can be set once per process, and pytest-xdist runs several test
modules in one process: every module that checks spans takes them from here, each keeping
to the spans of its own instrumentation scope (``zerda.server``, ``zerda.memory``).
"""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER = InMemorySpanExporter()
_PROVIDER: list[TracerProvider] = []


def start() -> None:
    """Set the SDK provider (once per process)."""
    if not _PROVIDER:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):  # none set yet (a docs example may have)
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
        _PROVIDER.append(provider)


def clear() -> None:
    _EXPORTER.clear()


def finished(scope: str) -> list[ReadableSpan]:
    """The spans finished since :func:`clear` by the tracer named ``scope``, in order."""
    return [
        s
        for s in _EXPORTER.get_finished_spans()
        if s.instrumentation_scope is not None and s.instrumentation_scope.name == scope
    ]
