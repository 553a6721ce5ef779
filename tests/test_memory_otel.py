"""Memories' OpenTelemetry spans, recorded with the SDK's in-memory exporter."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the OpenTelemetry SDK is not installed")
import _tracing
from zerda import Message, SummarizerError
from zerda.memory import ConversationBufferWindowMemory, ConversationSummaryBufferMemory
from zerda.tokens import ApproxCounter


@pytest.fixture(autouse=True)
def _spans() -> Any:
    _tracing.start()
    _tracing.clear()
    yield
    _tracing.clear()


def _attributes(scope: str = "zerda.memory") -> list[tuple[str, dict[str, Any]]]:
    return [(s.name, dict(s.attributes or {})) for s in _tracing.finished(scope)]


def test_each_memory_call_is_one_span_after_the_genai_conventions() -> None:
    memory = ConversationBufferWindowMemory(k=1, session_id="ada")
    memory.add_message(Message("user", "the secret is 42"))
    memory.add_message(Message("assistant", "noted"))
    context = memory.get_context()
    memory.get_history()
    memory.clear()
    got = _attributes()
    assert [name for name, _ in got] == [
        "update_memory zerda",
        "update_memory zerda",
        "search_memory zerda",
        "search_memory zerda",
        "delete_memory zerda",
    ]
    for name, attributes in got:
        assert attributes["gen_ai.operation.name"] == name.split()[0]
        assert attributes["gen_ai.provider.name"] == "zerda"
        assert attributes["gen_ai.memory.scope"] == "session"
        assert attributes["gen_ai.memory.type"] == "short_term"
        assert attributes["gen_ai.conversation.id"] == "ada"
        assert attributes["zerda.memory.kind"] == "ConversationBufferWindowMemory"
        assert "42" not in str(attributes), "no content in a span"
    assert got[2][1]["gen_ai.memory.search.result.count"] == len(context) == 2
    assert "gen_ai.memory.search.result.count" not in got[3][1]  # a history, not a context


def test_async_calls_are_spans_too_with_the_context_tokens() -> None:
    counter = ApproxCounter()
    memory = ConversationSummaryBufferMemory(100, token_counter=counter, session_id="bo")

    async def use() -> list[Message]:
        await memory.asave_context({"input": "hi"}, {"output": "hello"})
        return await memory.aget_context()

    context = asyncio.run(use())
    got = _attributes()
    assert [name for name, _ in got] == ["update_memory zerda", "search_memory zerda"]
    assert got[1][1]["zerda.context.tokens"] == counter.count_messages(context)


class _Failing:
    def summarize(self, previous_summary: str, messages: Any) -> str:
        raise SummarizerError("down")

    async def asummarize(self, previous_summary: str, messages: Any) -> str:
        raise SummarizerError("down")


def test_a_failed_call_marks_its_span_with_the_error_type() -> None:
    memory = ConversationSummaryBufferMemory(
        40, token_counter=ApproxCounter(), summarizer=_Failing(), strict=True
    )
    for i in range(8):
        try:
            memory.save_context({"input": f"question {i} " * 4}, {"output": "answer"})
        except SummarizerError:
            break
    else:
        pytest.fail("the summarizer was never called")
    assert _attributes()[-1][1]["error.type"] == "SummarizerError"
