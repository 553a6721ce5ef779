"""The local OpenAI-compatible server of ``_fake_openai`` speaks well enough for the real SDK."""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from _fake_openai import FakeOpenAI, Reply, calls, failure, text

openai = pytest.importorskip("openai", reason="the openai extra is not installed")

USER = [{"role": "user", "content": "Two oat lattes for Ada, please."}]


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def client(fake: FakeOpenAI) -> Iterator[Any]:
    with openai.OpenAI(base_url=fake.url, api_key="test", max_retries=0) as sdk_client:
        yield sdk_client


def accumulate_tool_calls(chunks: list[Any]) -> list[tuple[str, str, str]]:
    """Reassemble streamed tool call deltas by index, the way a client does."""
    found: dict[int, list[str]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            for delta in choice.delta.tool_calls or ():
                call = found.setdefault(delta.index, ["", "", ""])
                call[0] += delta.id or ""
                call[1] += (delta.function and delta.function.name) or ""
                call[2] += (delta.function and delta.function.arguments) or ""
    return [(call_id, name, arguments) for call_id, name, arguments in found.values()]


def test_a_text_reply_with_its_usage(fake: FakeOpenAI, client: Any) -> None:
    fake.script(text("Order A-1042 is in.", usage=(321, 17)))

    answer = client.chat.completions.create(model="test-model", messages=USER)

    assert answer.model == "test-model"
    assert answer.choices[0].message.content == "Order A-1042 is in."
    assert answer.choices[0].finish_reason == "stop"
    assert answer.choices[0].message.tool_calls is None
    assert (answer.usage.prompt_tokens, answer.usage.completion_tokens) == (321, 17)
    assert answer.usage.total_tokens == 338


def test_tool_calls_are_parsed(fake: FakeOpenAI, client: Any) -> None:
    fake.script(
        calls(("call_1", "add_item", {"item": "oat latte"}), ("call_2", "pay", '{"card": 7731}'))
    )

    answer = client.chat.completions.create(model="m", messages=USER)

    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    assert [(c.id, c.function.name, c.function.arguments) for c in choice.message.tool_calls] == [
        ("call_1", "add_item", '{"item": "oat latte"}'),
        ("call_2", "pay", '{"card": 7731}'),
    ]


def test_a_streamed_text_reply_reassembles_with_a_final_usage_chunk(
    fake: FakeOpenAI, client: Any
) -> None:
    content = "Two oat lattes,\n  coming  right up. "
    fake.script(text(content, usage=(7, 3)), text(content))

    chunks = list(
        client.chat.completions.create(
            model="m", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    plain = list(client.chat.completions.create(model="m", messages=USER, stream=True))

    pieces = [c.choices[0].delta.content for c in chunks if c.choices]
    assert len(pieces) > 3
    assert "".join(p or "" for p in pieces) == content
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == []
    assert (chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens) == (7, 3)
    assert all(c.choices and c.usage is None for c in plain)


def test_streamed_tool_calls_reassemble(fake: FakeOpenAI, client: Any) -> None:
    scripted = calls(
        ("call_1", "add_item", {"item": "oat latte", "quantity": 2}), ("call_2", "pay", {})
    )
    fake.script(scripted)

    chunks = list(client.chat.completions.create(model="m", messages=USER, stream=True))

    assert accumulate_tool_calls(chunks) == list(scripted.tool_calls)
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_500_raises_internal_server_error(fake: FakeOpenAI, client: Any) -> None:
    fake.script(failure(500, "the kitchen is on fire"))

    with pytest.raises(openai.InternalServerError, match="the kitchen is on fire"):
        client.chat.completions.create(model="m", messages=USER)


def test_a_stall_longer_than_the_timeout_times_out(fake: FakeOpenAI) -> None:
    fake.script(Reply(content="late", stall=2))

    with (
        openai.OpenAI(base_url=fake.url, api_key="test", max_retries=0, timeout=0.3) as client,
        pytest.raises(openai.APITimeoutError),
    ):
        client.chat.completions.create(model="m", messages=USER)


def test_a_dropped_connection_raises_a_connection_error(fake: FakeOpenAI, client: Any) -> None:
    fake.script(Reply(drop=True))

    with pytest.raises(openai.APIConnectionError):
        client.chat.completions.create(model="m", messages=USER)


def test_echo_then_responder_answer_when_the_script_is_used_up(
    fake: FakeOpenAI, client: Any
) -> None:
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    multipart = [{"role": "user", "content": parts}]
    first = client.chat.completions.create(model="m", messages=USER)
    second = client.chat.completions.create(model="m", messages=multipart)
    fake.responder = lambda body: text(f"{len(body['messages'])} messages")
    third = client.chat.completions.create(model="m", messages=USER * 3)

    assert first.choices[0].message.content == "echo: Two oat lattes for Ada, please."
    assert second.choices[0].message.content == "echo: one two"
    assert third.choices[0].message.content == "3 messages"


def test_requests_and_headers_are_recorded(fake: FakeOpenAI, client: Any) -> None:
    client.chat.completions.create(model="test-model", messages=USER, temperature=0)

    fake.wait_for_requests(1)
    [body] = fake.requests
    assert body == {"model": "test-model", "messages": USER, "temperature": 0}
    assert fake.headers[0]["authorization"] == "Bearer test"
    with pytest.raises(TimeoutError):
        fake.wait_for_requests(2, timeout=0.01)


def test_other_paths_are_not_found(fake: FakeOpenAI) -> None:
    with pytest.raises(urllib.error.HTTPError) as raised:
        urllib.request.urlopen(f"{fake.url}/models", timeout=5)

    assert raised.value.code == 404
    assert "error" in json.loads(raised.value.read())
    assert fake.requests == []


def test_the_async_client_streamed_and_not(fake: FakeOpenAI) -> None:
    fake.script(text("Hello there, Ada."), calls(("call_9", "lookup", {"q": "Ada"})))

    async def talk() -> tuple[Any, list[Any]]:
        async with openai.AsyncOpenAI(base_url=fake.url, api_key="test", max_retries=0) as client:
            answer = await client.chat.completions.create(model="m", messages=USER)
            stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
            return answer, [chunk async for chunk in stream]

    answer, chunks = asyncio.run(talk())

    assert answer.choices[0].message.content == "Hello there, Ada."
    assert accumulate_tool_calls(chunks) == [("call_9", "lookup", '{"q": "Ada"}')]
