"""zerda serve's OpenTelemetry spans, recorded with the SDK's in-memory exporter."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")
pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed")
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan

import _tracing
from test_serve import TOOL_TURN, Live, key_for
from zerda.stores import InMemoryStore


@pytest.fixture(scope="module", autouse=True)
def _tracing_on() -> None:
    _tracing.start()


@pytest.fixture
def live() -> Iterator[Live]:
    server = Live(InMemoryStore())
    yield server
    server.close()


@pytest.fixture
def spans() -> Iterator[Callable[[], list[ReadableSpan]]]:
    _tracing.clear()
    # The service's own spans (the memories it drives add theirs under zerda.memory).
    yield lambda: _tracing.finished("zerda.server")
    _tracing.clear()


def test_each_memory_operation_is_a_span_after_the_genai_conventions(
    live: Live, spans: Callable[[], list[ReadableSpan]]
) -> None:
    with live.client(key_for(live, "acme")) as http:
        http.post("/v1/sessions/ada/messages", json={"messages": TOOL_TURN})
        http.get("/v1/sessions/ada/context", params={"k": 1})
        http.get("/v1/sessions/ada/messages")
        http.get("/v1/sessions")
        http.delete("/v1/sessions/ada")
        http.get("/v1/sessions/ada/messages")  # 404 now
    live.http.get("/healthz")  # not a memory operation: no span
    got = [(s.name, dict(s.attributes or {})) for s in spans()]
    assert [name for name, _ in got] == [
        "update_memory zerda",
        "search_memory zerda",
        "search_memory zerda",
        "search_memory zerda",
        "delete_memory zerda",
        "search_memory zerda",
    ]
    for name, attributes in got:
        assert attributes["gen_ai.operation.name"] == name.split()[0]
        assert attributes["gen_ai.provider.name"] == "zerda"
        assert attributes["gen_ai.memory.scope"] == "session"
        assert attributes["gen_ai.memory.namespace"] == "acme"
    assert got[0][1]["gen_ai.conversation.id"] == "ada"
    assert got[1][1]["gen_ai.memory.search.result.count"] == 4  # the one turn, whole
    assert got[2][1]["gen_ai.memory.search.result.count"] == 4
    assert got[3][1]["gen_ai.memory.search.result.count"] == 1  # one session
    assert got[5][1]["error.type"] == "NotFound"
    assert spans()[5].status.status_code is trace.StatusCode.ERROR
    for span in spans():  # no message text in any span
        assert "42" not in str(dict(span.attributes or {}))


def test_a_refused_key_is_an_error_span_without_a_tenant(
    live: Live, spans: Callable[[], list[ReadableSpan]]
) -> None:
    live.http.get("/v1/sessions/x/messages", headers={"Authorization": "Bearer nope"})
    (span,) = spans()
    attributes = dict(span.attributes or {})
    assert attributes["error.type"] == "Unauthorized"
    assert "gen_ai.memory.namespace" not in attributes
