"""zerda.chat.Chat through the real openai SDK against a local OpenAI-compatible server: what it
stores, what every request sends, tools, streaming, failures and retries, sync and async."""

from __future__ import annotations

import asyncio
import inspect
import json
import socket
from collections.abc import Iterator
from typing import Any

import openai
import pytest

from _fake_openai import FakeOpenAI, Reply, calls, failure, text
from _validators import validate_openai_chat
from zerda import (
    ApproxCounter,
    ChatError,
    ConfigurationError,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationTokenBufferMemory,
    ImagePart,
    Message,
    ModelError,
    TextPart,
    ToolLoopError,
    to_openai,
)
from zerda.chat import DEFAULT_CONTEXT_WINDOW, Chat, Tool, context_window, default_memory
from zerda.stores import InMemoryStore, SQLiteStore
from zerda.tokens import count_tools

COUNTER = ApproxCounter()


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


def token_memory(limit: int = 4000, **options: Any) -> ConversationTokenBufferMemory:
    return ConversationTokenBufferMemory(limit, token_counter=COUNTER, **options)


def make_chat(fake: FakeOpenAI, **options: Any) -> Chat:
    options.setdefault("memory", token_memory())
    options.setdefault("max_retries", 0)
    return Chat("test-model", base_url=fake.url, **options)


def add(a: int, b: int) -> int:
    """Add two whole numbers.

    Args:
        a: the first number
        b: the second number
    """
    return a + b


def explode(reason: str) -> str:
    """Fail on purpose."""
    raise RuntimeError(f"boom: {reason}")


def check_pairs(history: list[Message]) -> None:
    """Every stored call has exactly one stored result right after its message, and back."""
    pending: set[str] = set()
    for m in history:
        if m.role == "tool":
            assert m.tool_call_id in pending, f"result {m.tool_call_id} without its call"
            pending.discard(m.tool_call_id)
            continue
        assert not pending, f"calls {pending} have no result before {m.role}"
        pending = {c.id for c in m.tool_calls}
    assert not pending


def sent(fake: FakeOpenAI) -> list[list[dict[str, Any]]]:
    """The messages of every request, each checked as OpenAI Chat Completions takes them."""
    for body in fake.requests:
        validate_openai_chat(body["messages"])
    return [body["messages"] for body in fake.requests]


# -- one exchange ----------------------------------------------------------------------------------


def test_send_stores_the_question_and_the_answer_and_sends_the_context(fake: FakeOpenAI) -> None:
    chat = make_chat(fake, system="Be brief.")
    fake.script(text("Hello, Ada.", usage=(21, 4)))
    assert chat.send("Hi, I am Ada.") == "Hello, Ada."
    assert chat.send("Still there?") == "echo: Still there?"

    history = chat.memory.get_history()
    assert [(m.role, m.content) for m in history] == [
        ("system", "Be brief."),
        ("user", "Hi, I am Ada."),
        ("assistant", "Hello, Ada."),
        ("user", "Still there?"),
        ("assistant", "echo: Still there?"),
    ]
    first, second = sent(fake)
    assert first == to_openai(history[:2])
    assert second == to_openai(history[:4])
    assert fake.requests[0]["model"] == "test-model"
    assert "tools" not in fake.requests[0]
    assert history[2].metadata["usage"] == {
        "prompt_tokens": 21,
        "completion_tokens": 4,
        "total_tokens": 25,
    }
    assert history[2].metadata["finish_reason"] == "stop"
    stats = chat.stats()
    assert (stats["requests"], stats["prompt_tokens"], stats["completion_tokens"]) == (2, 31, 9)
    assert stats["total_tokens"] == 40
    assert stats["memory"] is not None
    assert stats["memory"]["context_tokens"] == COUNTER.count_messages(history[:4])


def test_predict_is_the_classic_alias(fake: FakeOpenAI) -> None:
    chat = make_chat(fake)
    assert chat.predict(input="Hi there") == "echo: Hi there"
    with pytest.raises(ConfigurationError, match="must be text"):
        chat.send(["Hi"])  # type: ignore[list-item]


def test_the_system_message_is_stored_once_and_replaced_when_it_changes(
    fake: FakeOpenAI, tmp_path: Any
) -> None:
    store = SQLiteStore(tmp_path / "chat.sqlite3")
    memory = token_memory(store=store, session_id="ada")
    make_chat(fake, memory=memory, system="Be brief.").send("one")
    make_chat(fake, memory=memory, system="Be brief.").send("two")
    make_chat(fake, memory=memory, system="Answer in French.").send("three")
    systems = [m for m in memory.get_history() if m.role == "system"]
    assert [m.content for m in systems] == ["Answer in French."]
    assert fake.requests[-1]["messages"][0] == {"role": "system", "content": "Answer in French."}
    assert [m["role"] for m in fake.requests[1]["messages"]].count("system") == 1


def test_the_context_shows_the_system_message_the_next_request_sends(fake: FakeOpenAI) -> None:
    """A Chat with a new ``system`` on a session that holds another: ``context()`` already
    shows the new one, as the request sends it (issue #28: it showed the old one)."""
    memory = ConversationTokenBufferMemory(1000, token_counter=ApproxCounter())
    make_chat(fake, memory=memory, system="Be brief.").send("one")
    chat = make_chat(fake, memory=memory, system="Answer in French.")
    shown = chat.context()
    assert [m.content for m in shown if m.role == "system"] == ["Answer in French."]
    chat.send("two")
    assert fake.requests[-1]["messages"][: len(shown)] == to_openai(shown)
    later = make_chat(fake, memory=memory, system="In German.")
    assert asyncio.run(later.acontext())[0].content == "In German."


def test_a_summary_memory_keeps_one_stored_system_message(fake: FakeOpenAI) -> None:
    store = InMemoryStore()

    def memory() -> ConversationSummaryBufferMemory:
        return ConversationSummaryBufferMemory(
            120, token_counter=COUNTER, store=store, session_id="s"
        )

    chat = make_chat(fake, memory=memory())  # no system message yet
    for i in range(8):
        chat.send(f"Order {i}: a flat white with oat milk for the corner table")
    assert fake.requests[-1]["messages"][0]["role"] == "system"  # the summary, pinned
    for _ in range(2):  # a system message given later is stored once, beside the summary
        make_chat(fake, memory=memory(), system="Be brief.").send("Once more")
    history = memory().get_history()
    assert [m.content for m in history if m.role == "system"] == ["Be brief."]
    assert fake.requests[-1]["messages"][0] == {"role": "system", "content": "Be brief."}


def test_options_are_sent_but_cannot_replace_what_the_chat_sets(fake: FakeOpenAI) -> None:
    make_chat(fake, options={"temperature": 0.2, "max_tokens": 50}).send("Hi")
    assert fake.requests[0]["temperature"] == 0.2
    assert fake.requests[0]["max_tokens"] == 50
    with pytest.raises(ConfigurationError, match="messages, model"):
        make_chat(fake, options={"model": "x", "messages": []})


# -- the budget ------------------------------------------------------------------------------------


def test_every_request_fits_the_budget_with_the_tools_counted(fake: FakeOpenAI) -> None:
    memory = token_memory(300, reserve_tokens=40)
    chat = make_chat(fake, memory=memory, system="You take coffee orders.", tools=[add])
    budget = 300 - 40
    for i in range(25):
        if i % 5 == 0:
            fake.script(calls((f"c{i}", "add", {"a": i, "b": 1})), text(f"That makes {i + 1}."))
        chat.send(f"Order number {i}: two oat lattes, one without sugar, for the window table.")
    history = memory.get_history()
    check_pairs(history)
    requests = sent(fake)
    assert len(requests) == 30
    tools = fake.requests[0]["tools"]
    assert tools == chat.tool_definitions
    for messages in requests:
        context = [Message.from_openai(m) for m in messages]
        assert COUNTER.count_messages(context) + count_tools(tools, COUNTER) <= budget
        assert messages[0]["role"] == "system"
        assert messages[1]["role"] == "user"  # the context opens on a user message
    # Older turns were evicted: the last request holds far fewer messages than the store.
    assert len(requests[-1]) < len(history) / 3
    assert requests[-1][-1] == {"role": "user", "content": history[-2].content}


# -- tools ---------------------------------------------------------------------------------------


def test_a_tool_call_runs_and_its_result_goes_back_paired(fake: FakeOpenAI) -> None:
    chat = make_chat(fake, tools=[add])
    fake.script(calls(("call_1", "add", {"a": 2, "b": 3})), text("2 + 3 is 5."))
    assert chat.send("What is 2 + 3?") == "2 + 3 is 5."
    history = chat.memory.get_history()
    assert [m.role for m in history] == ["user", "assistant", "tool", "assistant"]
    assert history[1].content is None
    assert history[1].tool_calls[0].name == "add"
    assert (history[2].tool_call_id, history[2].content) == ("call_1", "5")
    assert history[2].metadata == {"tool": "add", "error": False}
    second = sent(fake)[1]
    assert second[-2]["tool_calls"][0]["id"] == "call_1"
    assert second[-1] == {"role": "tool", "content": "5", "tool_call_id": "call_1"}
    assert chat.stats()["tool_calls"] == 1


def test_parallel_calls_each_get_their_result_and_failures_become_error_results(
    fake: FakeOpenAI,
) -> None:
    chat = make_chat(fake, tools=[add, explode])
    fake.script(
        calls(
            ("c1", "add", {"a": 1, "b": 2}),
            ("c2", "explode", {"reason": "testing"}),
            ("c3", "add", '{"a": 1'),  # invalid JSON
            ("c4", "add", {"a": 1}),  # a missing argument
            ("c5", "teleport", {}),  # no such tool
        ),
        text("Some of that worked."),
    )
    assert chat.send("Do it all") == "Some of that worked."
    results = {m.tool_call_id: m for m in chat.memory.get_history() if m.role == "tool"}
    assert list(results) == ["c1", "c2", "c3", "c4", "c5"]
    assert results["c1"].content == "3"
    errors = {k: json.loads(str(m.content))["error"] for k, m in results.items() if k != "c1"}
    assert errors["c2"] == "RuntimeError: boom: testing"
    assert "not valid JSON" in errors["c3"]
    assert "missing a required argument: 'b'" in errors["c4"]
    assert "no tool named 'teleport'" in errors["c5"]
    assert "add, explode" in errors["c5"]
    assert all(results[k].metadata["error"] for k in errors)
    stats = chat.stats()
    assert (stats["tool_calls"], stats["tool_errors"]) == (5, 4)
    assert [m["role"] for m in sent(fake)[1]] == ["user", "assistant"] + ["tool"] * 5


def test_max_steps_stops_the_loop_with_every_pair_whole_and_retry_goes_on(
    fake: FakeOpenAI,
) -> None:
    chat = make_chat(fake, tools=[add], max_steps=3)
    fake.responder = lambda body: calls((f"c{len(body['messages'])}", "add", {"a": 1, "b": 1}))
    with pytest.raises(ToolLoopError, match="max_steps=3"):
        chat.send("Loop forever")
    assert len(fake.requests) == 3
    history = chat.memory.get_history()
    check_pairs(history)
    assert [m.role for m in history].count("tool") == 3
    assert sum(m.role == "user" for m in history) == 1
    fake.responder = None
    assert chat.retry() == "echo: Loop forever"
    assert len(fake.requests) == 4
    check_pairs(chat.memory.get_history())


def test_async_tools_run_at_the_same_time(fake: FakeOpenAI) -> None:
    both = asyncio.Barrier(2) if hasattr(asyncio, "Barrier") else None
    arrived: list[str] = []

    async def wait_for_the_other(name: str) -> str:
        """Wait until the other call has started too."""
        arrived.append(name)
        if both is not None:
            await asyncio.wait_for(both.wait(), timeout=5)
        else:  # Python 3.10: no Barrier
            while len(arrived) < 2:
                await asyncio.sleep(0.01)
        return f"{name} done"

    chat = make_chat(fake, tools=[wait_for_the_other])
    fake.script(
        calls(
            ("a", "wait_for_the_other", {"name": "a"}), ("b", "wait_for_the_other", {"name": "b"})
        ),
        text("Both done."),
    )
    assert asyncio.run(chat.asend("Run both")) == "Both done."
    results = [m.content for m in chat.memory.get_history() if m.role == "tool"]
    assert results == ["a done", "b done"]


def test_a_coroutine_tool_runs_in_the_sync_path_and_results_are_json(fake: FakeOpenAI) -> None:
    async def lookup(order_id: str) -> dict[str, Any]:
        """Find an order."""
        return {"id": order_id, "items": ["latte"], "paid": True}

    chat = make_chat(fake, tools=[lookup])
    fake.script(calls(("c1", "lookup", {"order_id": "A-1"})), text("Found it."))
    chat.send("Where is A-1?")
    result = next(m for m in chat.memory.get_history() if m.role == "tool")
    assert json.loads(str(result.content)) == {"id": "A-1", "items": ["latte"], "paid": True}


# -- streaming ------------------------------------------------------------------------------------


def test_stream_yields_pieces_as_they_arrive_and_stores_the_whole_answer(
    fake: FakeOpenAI,
) -> None:
    chat = make_chat(fake)
    fake.script(text("Two oat lattes coming up.", usage=(30, 6)))
    pieces = list(chat.stream("Two oat lattes, please"))
    assert len(pieces) > 3
    assert "".join(pieces) == "Two oat lattes coming up."
    answer = chat.memory.get_history()[-1]
    assert answer.content == "Two oat lattes coming up."
    assert answer.metadata["usage"]["prompt_tokens"] == 30
    assert fake.requests[0]["stream"] is True
    assert fake.requests[0]["stream_options"] == {"include_usage": True}
    assert chat.stats()["last_usage"] == {
        "prompt_tokens": 30,
        "completion_tokens": 6,
        "total_tokens": 36,
    }


def test_stream_runs_streamed_tool_calls(fake: FakeOpenAI) -> None:
    chat = make_chat(fake, tools=[add])
    fake.script(
        calls(("c1", "add", {"a": 20, "b": 22}), ("c2", "add", {"a": 1, "b": 1})),
        text("42 and 2."),
    )
    assert "".join(chat.stream("Add them")) == "42 and 2."
    history = chat.memory.get_history()
    check_pairs(history)
    assert [c.arguments for c in history[1].tool_calls] == [
        json.dumps({"a": 20, "b": 22}),
        json.dumps({"a": 1, "b": 1}),
    ]
    assert [m.content for m in history if m.role == "tool"] == ["42", "2"]


def test_a_stream_left_unfinished_stores_no_answer_and_retry_asks_again(
    fake: FakeOpenAI,
) -> None:
    chat = make_chat(fake)
    fake.script(text("A long answer in many pieces"))
    stream = chat.stream("Tell me")
    assert next(stream) == "A "
    stream.close()
    assert [m.role for m in chat.memory.get_history()] == ["user"]
    assert "".join(chat.retry_stream()) == "echo: Tell me"
    assert [m.role for m in chat.memory.get_history()] == ["user", "assistant"]


def test_async_send_stream_and_retry(fake: FakeOpenAI) -> None:
    chat = make_chat(fake, tools=[add])

    async def talk() -> tuple[str, str, str]:
        fake.script(calls(("c1", "add", {"a": 1, "b": 2})), text("Three."))
        first = await chat.asend("1 + 2?")
        second = "".join([piece async for piece in chat.astream("Again, streamed")])
        fake.script(failure(503))
        with pytest.raises(ModelError, match="HTTP 503"):
            await chat.asend("Fails once")
        third = await chat.aretry()
        return first, second, third

    assert asyncio.run(talk()) == ("Three.", "echo: Again, streamed", "echo: Fails once")
    history = chat.memory.get_history()
    check_pairs(history)
    assert [m.content for m in history if m.role == "user"] == [
        "1 + 2?",
        "Again, streamed",
        "Fails once",
    ]
    sent(fake)


# -- failures -------------------------------------------------------------------------------------


def test_an_http_error_names_the_endpoint_keeps_the_message_once_and_retry_answers(
    fake: FakeOpenAI,
) -> None:
    chat = make_chat(fake)
    fake.script(failure(500, "the model is overloaded"))
    with pytest.raises(ModelError) as caught:
        chat.send("Hello?")
    error = caught.value
    assert error.endpoint == fake.url
    assert error.status == 500
    assert fake.url in str(error)
    assert "the model is overloaded" in str(error)
    assert isinstance(error.__cause__, openai.InternalServerError)
    assert [m.role for m in chat.memory.get_history()] == ["user"]
    assert chat.retry() == "echo: Hello?"
    assert [m.content for m in chat.memory.get_history()] == ["Hello?", "echo: Hello?"]
    with pytest.raises(ChatError, match="nothing to retry"):
        chat.retry()


def test_a_4xx_is_a_model_error_with_its_status(fake: FakeOpenAI) -> None:
    chat = make_chat(fake)
    fake.script(failure(400, "messages: too long"))
    with pytest.raises(ModelError, match="HTTP 400: messages: too long") as caught:
        chat.send("Hi")
    assert caught.value.status == 400


def test_the_sdk_retries_server_errors_within_one_send(fake: FakeOpenAI) -> None:
    chat = make_chat(fake, max_retries=2)
    fake.script(failure(500), failure(502))
    assert chat.send("Hi") == "echo: Hi"
    assert len(fake.requests) == 3
    assert [m.role for m in chat.memory.get_history()] == ["user", "assistant"]


def test_a_timeout_is_a_model_error_that_says_so(fake: FakeOpenAI) -> None:
    chat = make_chat(fake, timeout=0.3)
    fake.script(Reply(content="late", stall=3))
    with pytest.raises(ModelError, match=r"timed out \(timeout=0.3s a request, max_retries=0\)"):
        chat.send("Quick?")
    assert [m.role for m in chat.memory.get_history()] == ["user"]


def test_an_endpoint_that_is_down_is_a_model_error_naming_it() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    chat = Chat("m", base_url=url, memory=token_memory(), max_retries=0)
    with pytest.raises(ModelError, match=f"cannot reach model 'm' at {url}") as caught:
        chat.send("Anyone?")
    assert caught.value.status is None
    with pytest.raises(ModelError):
        chat.retry()
    assert [m.content for m in chat.memory.get_history()] == ["Anyone?"]


def test_a_reply_that_is_not_a_completion_is_a_model_error(fake: FakeOpenAI) -> None:
    fake.script(Reply(content=None))  # a reply with neither text nor calls is still an answer
    chat = make_chat(fake)
    assert chat.send("Say nothing") == ""
    assert chat.memory.get_history()[-1].content == ""


# -- construction ---------------------------------------------------------------------------------


def test_bad_arguments_are_configuration_errors(fake: FakeOpenAI, monkeypatch: Any) -> None:
    with pytest.raises(ConfigurationError, match="model must be"):
        Chat("", base_url=fake.url)
    with pytest.raises(ConfigurationError, match="max_steps"):
        make_chat(fake, max_steps=0)
    with pytest.raises(ConfigurationError, match="memory must be a Zerda memory"):
        make_chat(fake, memory=[])
    with pytest.raises(ConfigurationError, match="definition with no function"):
        make_chat(fake, tools=[{"type": "function", "function": {"name": "x"}}])
    with pytest.raises(ConfigurationError, match="share the name add"):
        make_chat(fake, tools=[add, add])
    with pytest.raises(ConfigurationError, match="timeout"):
        make_chat(fake, timeout=-1)
    with pytest.raises(ConfigurationError, match="with client= they are"):
        Chat("m", client=openai.OpenAI(api_key="k", base_url=fake.url), base_url=fake.url)
    with pytest.raises(ConfigurationError, match="client must be"):
        Chat("m", client=object())
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ConfigurationError, match="no API key for OpenAI"):
        Chat("gpt-4o", memory=token_memory())


def test_the_key_and_a_given_client_reach_the_server(fake: FakeOpenAI) -> None:
    Chat("m", base_url=fake.url, api_key="sk-test-1", memory=token_memory()).send("a")
    assert fake.headers[0]["authorization"] == "Bearer sk-test-1"
    Chat("m", base_url=fake.url, memory=token_memory()).send("b")
    assert fake.headers[1]["authorization"].startswith("Bearer ")  # a placeholder for local servers
    client = openai.OpenAI(api_key="sk-mine", base_url=fake.url, max_retries=0)
    chat = Chat("m", client=client, memory=token_memory())
    chat.send("c")
    assert asyncio.run(chat.asend("d")) == "echo: d"  # an async client made from its settings
    assert [h["authorization"] for h in fake.headers[2:]] == ["Bearer sk-mine"] * 2
    assert chat.endpoint == fake.url + "/"


def test_any_memory_works_and_a_window_memory_keeps_its_k(fake: FakeOpenAI) -> None:
    memory = ConversationBufferWindowMemory(k=2)
    chat = make_chat(fake, memory=memory)
    for i in range(5):
        chat.send(f"message {i}")
    last = sent(fake)[-1]
    assert [m["content"] for m in last] == ["message 3", "echo: message 3", "message 4"]


def test_the_default_memory_is_sized_for_the_model(fake: FakeOpenAI) -> None:
    chat = Chat("gpt-4", base_url=fake.url, max_retries=0)
    memory = chat.memory
    assert isinstance(memory, ConversationTokenBufferMemory)
    assert (memory.max_token_limit, memory.reserve_tokens) == (8192, 1024)
    assert "cl100k_base" in memory.token_counter.name
    chat.send("Hi")
    stats = chat.stats()["memory"]
    assert stats is not None
    assert stats["token_limit"] == 8192


def test_context_windows_by_model_name() -> None:
    assert context_window("gpt-4o-mini-2024-07-18") == 128_000
    assert context_window("gpt-4") == 8_192
    assert context_window("gpt-4-0613") == 8_192
    assert context_window("gpt-4.1-nano") == 1_047_576
    assert context_window("openai/gpt-4o") == 128_000
    assert context_window("llama3.1:8b") is None
    assert context_window("gpt-40") is None
    memory = default_memory("llama3.1:8b", token_counter=COUNTER)
    assert memory.max_token_limit == DEFAULT_CONTEXT_WINDOW
    assert default_memory("m", token_limit=1000, token_counter=COUNTER).reserve_tokens == 125
    with pytest.raises(ConfigurationError, match="token_limit"):
        default_memory("m", token_limit=1, token_counter=COUNTER)


def test_every_call_that_talks_to_the_model_or_the_store_has_an_async_twin() -> None:
    pairs = {"send": "asend", "predict": "apredict", "retry": "aretry", "context": "acontext"}
    for name, twin in pairs.items():
        assert inspect.iscoroutinefunction(getattr(Chat, twin)), twin
        assert inspect.signature(getattr(Chat, twin)) == inspect.signature(getattr(Chat, name))
    for name in ("stream", "retry_stream"):
        twin_parameters = inspect.signature(getattr(Chat, "a" + name)).parameters
        assert twin_parameters == inspect.signature(getattr(Chat, name)).parameters
    public = {n for n in vars(Chat) if not n.startswith("_")}
    assert public - {"endpoint", "tool_definitions", "stats"} == (
        set(pairs) | set(pairs.values()) | {"stream", "astream", "retry_stream", "aretry_stream"}
    )


def test_context_shows_what_the_next_request_sends(fake: FakeOpenAI) -> None:
    chat = make_chat(fake, system="Be brief.", tools=[add])
    chat.send("Hi")
    before = chat.context()
    assert asyncio.run(chat.acontext()) == before
    chat.send("Again")
    assert fake.requests[-1]["messages"][:-1] == to_openai(before)


def test_content_parts_reach_the_model_as_openai_parts(fake: FakeOpenAI) -> None:
    chat = make_chat(fake)
    image = "data:image/png;base64,iVBORw0KGgo="
    chat.send(
        [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": image}},
        ]
    )
    chat.send((TextPart("And this?"), ImagePart(image)))
    first, second = sent(fake)
    assert first[-1]["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": image}},
    ]
    assert second[-1]["content"][1]["image_url"]["url"] == image
    stored = chat.memory.get_history()[0]
    assert isinstance(stored.content, tuple)
    assert isinstance(stored.content[1], ImagePart)
    for bad in ([], [TextPart("a"), {"type": "text", "text": "b"}], 42):
        with pytest.raises(ConfigurationError, match="content parts"):
            chat.send(bad)  # type: ignore[arg-type]


def test_an_explicit_openai_definition_pairs_with_its_function(fake: FakeOpenAI) -> None:
    definition = {
        "type": "function",
        "function": {
            "name": "lookup_order",
            "description": "Find an order by id.",
            "parameters": {
                "type": "object",
                "properties": {"order_id": {"type": "string"}},
                "required": ["order_id"],
            },
        },
    }
    looked_up: list[str] = []

    def lookup(order_id: str) -> str:
        looked_up.append(order_id)
        return "ready"

    chat = make_chat(fake, tools=[Tool.from_definition(definition, lookup)])
    fake.script(calls(("c1", "lookup_order", {"order_id": "A-7"})), text("It is ready."))
    assert chat.send("Is A-7 ready?") == "It is ready."
    assert fake.requests[0]["tools"] == [definition]
    assert looked_up == ["A-7"]
    flat = {"type": "function", "name": "ping"}  # the Responses API's form
    assert Tool.from_definition(flat, lambda: "pong").definition == {
        "type": "function",
        "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}},
    }


def test_streams_go_on_without_usage_where_the_endpoint_refuses_stream_options(
    fake: FakeOpenAI,
) -> None:
    def strict(body: dict[str, Any]) -> Reply:
        # As Mistral answers: 422, "stream_options ... Extra inputs are not permitted".
        if "stream_options" in body:
            return failure(422, "stream_options.include_usage: Extra inputs are not permitted")
        return text(f"Plain stream {len(fake.requests)}")

    fake.responder = strict
    chat = make_chat(fake)
    assert "".join(chat.stream("Hi")) == "Plain stream 2"
    assert "".join(chat.stream("Again")) == "Plain stream 3"
    assert ["stream_options" in body for body in fake.requests] == [True, False, False]
    assert chat.memory.get_history()[-1].metadata.get("usage") is None
    fake.responder = lambda body: failure(400, "model not found")
    with pytest.raises(ModelError, match="HTTP 400: model not found"):
        list(chat.stream("A real error stays an error"))


def test_async_streams_also_drop_stream_options_when_refused(fake: FakeOpenAI) -> None:
    fake.responder = lambda body: (
        failure(400, "property 'stream_options' is unsupported, did you mean 'stream'?")
        if "stream_options" in body
        else text("ok")
    )
    chat = make_chat(fake)

    async def talk() -> str:
        return "".join([piece async for piece in chat.astream("Hi")])

    assert asyncio.run(talk()) == "ok"
    assert len(fake.requests) == 2
