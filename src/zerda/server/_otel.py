"""OpenTelemetry spans for the service's memory operations (extra ``otel``).

One span per request to a session route, named and attributed after OpenTelemetry's GenAI
semantic conventions for memory operations (in development upstream): ``search_memory`` for
reads, ``update_memory`` for appends and metadata changes, ``delete_memory`` for deletions,
with ``gen_ai.provider.name`` ``zerda``, ``gen_ai.memory.scope`` ``session``,
``gen_ai.memory.type`` ``short_term``, ``gen_ai.conversation.id`` (the session id as the
client knows it), ``gen_ai.memory.namespace`` (the tenant) and, for reads,
``gen_ai.memory.search.result.count``; ``error.type`` when the request failed. No content is
recorded: message text never leaves through a span.

Without ``opentelemetry-api`` installed nothing is traced; with it but no SDK configured, the
spans are the API's no-op ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from starlette.requests import Request

try:
    from opentelemetry import trace
except ImportError:  # pragma: no cover - depends on what is installed
    trace = None  # type: ignore[assignment]

__all__ = ["RESULTS", "memory_span", "operation_of"]

RESULTS = "zerda.results"
"""The request scope key a handler sets to the number of items it returned."""


def operation_of(method: str, template: str) -> str | None:
    """The GenAI memory operation a request is, or ``None`` for one that is not (health,
    metrics, the description)."""
    if not template.startswith("/v1/sessions"):
        return None
    if method == "DELETE":
        return "delete_memory"
    if method in ("POST", "PATCH"):
        return "update_memory"
    return "search_memory"


_tracers: list[Any] = []


def _tracer() -> Any:
    """The service's tracer, got once: the API's proxy follows a provider set later."""
    if not _tracers:
        assert trace is not None
        _tracers.append(trace.get_tracer("zerda.server"))
    return _tracers[0]


class _Outcome:
    """What the handler's answer says, filled in before the span ends."""

    __slots__ = ("error",)

    def __init__(self) -> None:
        self.error: str | None = None


@contextmanager
def memory_span(request: Request, template: str) -> Iterator[_Outcome]:
    """A span around one request's memory operation (nothing when tracing is off)."""
    outcome = _Outcome()
    name = operation_of(request.method, template)
    if trace is None or name is None:
        yield outcome
        return
    tracer = _tracer()
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": name,
        "gen_ai.provider.name": "zerda",
        "gen_ai.memory.scope": "session",
        "gen_ai.memory.type": "short_term",
        "http.route": template,
    }
    session_id = request.path_params.get("session_id")
    if session_id is not None:
        attributes["gen_ai.conversation.id"] = session_id
    with tracer.start_as_current_span(f"{name} zerda", attributes=attributes) as span:
        yield outcome
        tenant = request.scope.get("zerda.tenant")
        if tenant is not None:
            span.set_attribute("gen_ai.memory.namespace", tenant)
        results = request.scope.get(RESULTS)
        if results is not None:
            span.set_attribute("gen_ai.memory.search.result.count", results)
        if outcome.error is not None:
            span.set_attribute("error.type", outcome.error)
            span.set_status(trace.Status(trace.StatusCode.ERROR, outcome.error))
