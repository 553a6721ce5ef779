"""What memories tell an operator: log records on ``zerda.memory`` and OpenTelemetry spans.

Logging (standard ``logging``; Zerda adds no handler):

- DEBUG, one record per context built: ``context built`` with the session, the memory kind,
  the tokens by part, turns kept and evicted, and the repairs. The same fields ride on the
  record as ``record.zerda`` (a dict) for structured handlers.
- INFO, one per summary fold stored (``summary folded``), WARNING when a summarizer fails
  and when a context needed repairs (once per session).
- No message content at INFO or above, ever; the DEBUG record holds counts, not text.

Tracing (extra ``otel``): with ``opentelemetry-api`` installed and a tracer provider set,
every memory call is a span after OpenTelemetry's GenAI semantic conventions for memory
operations (in development upstream): ``search_memory zerda`` for reads, ``update_memory
zerda`` for writes and folds, ``delete_memory zerda`` for ``clear``; with
``gen_ai.provider.name`` ``zerda``, ``gen_ai.memory.scope`` ``session``, ``gen_ai.memory.type``
``short_term``, ``gen_ai.conversation.id`` (the session id) and ``zerda.memory.kind``; a read
adds ``gen_ai.memory.search.result.count`` (messages in the context) and
``zerda.context.tokens``. Without a provider, nothing is traced and a call costs one check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from zerda.memory._base import _View

try:
    from opentelemetry import trace
    from opentelemetry.trace import ProxyTracerProvider
except ImportError:  # pragma: no cover - depends on what is installed
    trace = None  # type: ignore[assignment]

__all__ = ["log", "log_context", "span"]

log = logging.getLogger("zerda.memory")

# The operation each flow is, by the name of the generator function that makes it.
_OPERATIONS = {
    "_write_flow": "update_memory",
    "_append_flow": "update_memory",
    "_fold_flow": "update_memory",
    "_clear_flow": "delete_memory",
}


_tracers: list[Any] = []  # the tracer, once a provider is set (it is set once per process)
_UNKNOWN = object()


def _tracer() -> Any:
    """The tracer, or ``None`` when no tracer provider is set (or OpenTelemetry is absent).

    Every memory call asks: with no provider set, the answer costs an attribute read (the
    API's global, ``None`` until ``set_tracer_provider``), not the API's lookup."""
    if _tracers:
        return _tracers[0]
    if trace is None or getattr(trace, "_TRACER_PROVIDER", _UNKNOWN) is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, ProxyTracerProvider):  # nothing configured: no-op spans
        return None
    _tracers.append(provider.get_tracer("zerda.memory"))
    return _tracers[0]


@contextmanager
def span(kind: str, session_id: str, flow: Generator[Any, Any, Any]) -> Iterator[None]:
    """A span around driving ``flow`` for a memory of ``kind`` (nothing without tracing)."""
    tracer = _tracer()
    if tracer is None:
        yield
        return
    code = getattr(flow, "gi_code", None)
    operation = _OPERATIONS.get(code.co_name if code else "", "search_memory")
    attributes = {
        "gen_ai.operation.name": operation,
        "gen_ai.provider.name": "zerda",
        "gen_ai.memory.scope": "session",
        "gen_ai.memory.type": "short_term",
        "gen_ai.conversation.id": session_id,
        "zerda.memory.kind": kind,
    }
    with tracer.start_as_current_span(f"{operation} zerda", attributes=attributes) as current:
        try:
            yield
        except Exception as exc:
            current.set_attribute("error.type", type(exc).__name__)
            raise


def tracing() -> bool:
    """Whether memory calls are traced now (a tracer provider is set)."""
    return _tracer() is not None


def log_context(
    kind: str, session_id: str, view: _View, accounting: Callable[[_View], dict[str, int]]
) -> None:
    """The DEBUG record of a context built, and the current span's read attributes."""
    debug = log.isEnabledFor(logging.DEBUG)
    current = None
    if trace is not None:
        current = trace.get_current_span()
        if not current.is_recording():
            current = None
    if not debug and current is None:
        return
    turns = accounting(view)
    shown = turns["turns_in_context"]
    fields: dict[str, Any] = {
        "session": session_id,
        "memory": kind,
        "context_tokens": view.context_tokens if view.error is None else 0,
        "tokens_by_part": view.tokens_by_part(),
        "turns_kept": shown,
        **turns,
        "repairs": view.repairs_made(),
        "overflow": view.error is not None,
    }
    if debug:
        log.debug(
            "context built: session=%r memory=%s tokens=%d %s turns_kept=%d turns_evicted=%d "
            "repairs=%s",
            session_id,
            kind,
            fields["context_tokens"],
            fields["tokens_by_part"],
            shown,
            fields["turns_evicted"],
            fields["repairs"] or "none",
            extra={"zerda": fields},
        )
    if current is not None:
        messages = 0 if view.error is not None else len(view.context())
        current.set_attribute("gen_ai.memory.search.result.count", messages)
        current.set_attribute("zerda.context.tokens", fields["context_tokens"])
