"""The Pydantic AI integration: ZerdaHistory chooses what the model sees (whole turns, the
system prompt pinned, pairs whole, repaired), ZerdaMessageHistory keeps ``list[ModelMessage]``
in any Zerda store, equal when read back, and ZerdaConversationStore is Pydantic AI's
ConversationStore over a Zerda store. Every run is a real ``Agent`` run over a FunctionModel."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pydantic_ai", reason="the pydantic-ai extra is not installed")

from pydantic_ai import Agent
from pydantic_ai.capabilities import ProcessHistory
from pydantic_ai.conversation import Conversation
from pydantic_ai.conversation_store import ConversationConflict
from pydantic_ai.messages import (
    BinaryContent,
    ModelMessage,
    ModelMessagesTypeAdapter,
    ModelRequest,
    ModelResponse,
    NativeToolCallPart,
    NativeToolReturnPart,
    RetryFeedbackPart,
    RetryInfo,
    SystemPromptPart,
    TextPart,
    ThinkingPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from test_integrations import ASYNC_STORES, STORES, opened_stores
from zerda import ApproxCounter, ConfigurationError, ContextOverflowError, InvalidMessageError
from zerda.integrations.pydantic_ai import (
    METADATA_KEY,
    ZerdaConversationStore,
    ZerdaHistory,
    ZerdaMessageHistory,
)
from zerda.memory import ConversationTokenBufferMemory
from zerda.stores import InMemoryStore, SQLiteStore

COUNTER = ApproxCounter()
SYSTEM = "You are terse."

# -- a scripted model that calls a tool on each new prompt ------------------------------------


class Scripted:
    """A FunctionModel function: on a new user prompt, text and a call of ``lookup`` (the same
    call id every turn, as some models do), then a text answer; records what it was sent."""

    def __init__(self) -> None:
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(list(messages))
        last = messages[-1]
        if any(isinstance(p, UserPromptPart) for p in last.parts):
            prompt = next(p for p in last.parts if isinstance(p, UserPromptPart))
            return ModelResponse(
                parts=[
                    TextPart("let me look"),
                    ToolCallPart("lookup", {"q": str(prompt.content)}, tool_call_id="call_0"),
                ]
            )
        return ModelResponse(parts=[TextPart("done " + "x" * 40)])


def agent_with(processor: Any, model: Scripted) -> Agent[None, str]:
    capabilities = [] if processor is None else [ProcessHistory(processor)]
    agent = Agent(FunctionModel(model), system_prompt=SYSTEM, capabilities=capabilities)

    @agent.tool_plain
    def lookup(q: str) -> str:
        return f"found {q} " + "y" * 40

    return agent


def parts(messages: Sequence[ModelMessage]) -> list[Any]:
    return [p for m in messages for p in m.parts]


def assert_valid(sent: Sequence[ModelMessage]) -> None:
    """What the model got: the system prompt first, every call with its return and every
    return after its call."""
    flat = parts(sent)
    assert isinstance(flat[0], SystemPromptPart)
    assert flat[0].content == SYSTEM
    open_calls: set[str] = set()
    for message in sent:
        for p in message.parts:
            if isinstance(p, ToolCallPart):
                open_calls.add(p.tool_call_id)
            elif isinstance(p, ToolReturnPart):
                assert p.tool_call_id in open_calls, f"orphan return {p.tool_call_id}"
                open_calls.discard(p.tool_call_id)
    assert not open_calls, f"calls without a return: {open_calls}"


def run_turns(
    agent: Agent[None, str], history: ZerdaMessageHistory, n: int, start: int = 0
) -> None:
    for i in range(start, start + n):
        result = agent.run_sync(f"question {i}", message_history=history.load())
        history.save(result.new_messages())


# -- the processor ----------------------------------------------------------------------------


def test_a_window_sends_whole_turns_and_the_system_prompt() -> None:
    model = Scripted()
    agent = agent_with(ZerdaHistory(k=2), model)
    history = ZerdaMessageHistory("s")
    run_turns(agent, history, 5)
    assert len(model.seen) == 10
    for sent in model.seen:
        assert_valid(sent)
    prompts = [p.content for p in parts(model.seen[-1]) if isinstance(p, UserPromptPart)]
    assert prompts == ["question 3", "question 4"]
    # The store keeps every turn: the window is a view.
    stored = [p.content for p in parts(history.load()) if isinstance(p, UserPromptPart)]
    assert stored == [f"question {i}" for i in range(5)]


def test_the_messages_sent_are_the_objects_given() -> None:
    history = ZerdaMessageHistory("s")
    run_turns(agent_with(None, Scripted()), history, 3)
    given = history.load()
    chosen = ZerdaHistory(k=1).select(given)
    # The first request held the system prompt and the first prompt: a copy with the first.
    assert isinstance(chosen[0], ModelRequest)
    assert [type(p) for p in chosen[0].parts] == [SystemPromptPart]
    assert chosen[0].run_id == given[0].run_id
    assert chosen[0].parts[0] is given[0].parts[0]
    assert all(any(c is g for g in given) for c in chosen[1:])
    assert chosen[1:] == given[-4:]


def test_a_token_budget_is_held() -> None:
    model = Scripted()
    limit = 150
    agent = agent_with(ZerdaHistory(token_limit=limit, counter=COUNTER), model)
    history = ZerdaMessageHistory("s")
    run_turns(agent, history, 6)
    for sent in model.seen:
        assert_valid(sent)
        # Counted as Zerda counts the history: the same pieces, the same counter.
        memory = ConversationTokenBufferMemory(10**9, token_counter=COUNTER, session_id="x")
        ZerdaMessageHistory("x", memory=memory).save(sent)
        assert memory.get_memory_stats()["context_tokens"] <= limit
    prompts = [p for p in parts(model.seen[-1]) if isinstance(p, UserPromptPart)]
    assert 1 <= len(prompts) < 6


def test_a_newest_turn_over_the_budget_raises() -> None:
    agent = agent_with(ZerdaHistory(token_limit=20, counter=COUNTER), Scripted())
    with pytest.raises(ContextOverflowError):
        agent.run_sync("question " + "z" * 400)


@pytest.mark.parametrize("where", ["prompt", "return", "answer"])
def test_a_newest_turn_over_the_budget_is_sent_cut_with_truncate(where: str) -> None:
    """``overflow="truncate"`` keeps the newest turn within the budget by cutting its texts:
    what the model is sent is cut as the memory cut it, not the whole text."""
    long = "z" * 4000
    history: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart(SYSTEM), UserPromptPart("question")]),
        ModelResponse(parts=[TextPart("ok"), ToolCallPart("lookup", {"q": "a"}, "call_1")]),
        ModelRequest(parts=[ToolReturnPart("lookup", "found", tool_call_id="call_1")]),
        ModelResponse(parts=[TextPart("the answer")]),
    ]
    if where == "prompt":
        history[0] = ModelRequest(parts=[SystemPromptPart(SYSTEM), UserPromptPart(long)])
    elif where == "return":
        history[2] = ModelRequest(parts=[ToolReturnPart("lookup", long, tool_call_id="call_1")])
    else:
        history[3] = ModelResponse(parts=[TextPart(long)])
    limit = 200
    sent = ZerdaHistory(token_limit=limit, counter=COUNTER, overflow="truncate").select(history)
    memory = ConversationTokenBufferMemory(10**9, token_counter=COUNTER, session_id="x")
    ZerdaMessageHistory("x", memory=memory).save(sent)
    assert memory.get_memory_stats()["context_tokens"] <= limit
    assert_valid(sent)
    assert history[3] is not sent[-1] or where != "answer"
    # Only the long text was cut; the parts around it are the objects given.
    assert [type(p) for p in parts(sent)] == [type(p) for p in parts(history)]


def test_an_orphan_return_in_a_stored_history_is_left_out() -> None:
    history = ZerdaMessageHistory("s")
    model = Scripted()
    agent = agent_with(ZerdaHistory(k=3), model)
    run_turns(agent, history, 1)
    orphan = ModelRequest(parts=[ToolReturnPart("lookup", "stale", tool_call_id="gone")])
    history.save([orphan])  # a return whose call was lost, stored for good
    run_turns(agent, history, 2, start=1)
    for sent in model.seen:
        assert_valid(sent)
        assert all(getattr(p, "tool_call_id", None) != "gone" for p in parts(sent))
    assert orphan in history.load()  # the log keeps what was written


def test_a_call_without_its_return_is_taken_out_of_its_response() -> None:
    answered = ToolCallPart("lookup", {"q": "a"}, tool_call_id="a")
    dangling = ToolCallPart("lookup", {"q": "b"}, tool_call_id="b")
    messages: list[ModelMessage] = [
        ModelRequest(parts=[SystemPromptPart(SYSTEM), UserPromptPart("hi")]),
        ModelResponse(parts=[TextPart("two calls"), answered, dangling]),
        ModelRequest(parts=[ToolReturnPart("lookup", "ok", tool_call_id="a")]),
        ModelResponse(parts=[TextPart("ok")]),
        ModelRequest(parts=[UserPromptPart("next")]),
    ]
    chosen = ZerdaHistory().select(messages)
    assert chosen[1].parts == [TextPart("two calls"), answered]
    assert chosen[0] is messages[0]
    assert chosen[2:] == messages[2:]


def test_sync_and_async_processors_choose_alike() -> None:
    sync_model, async_model = Scripted(), Scripted()
    history = ZerdaMessageHistory("a")
    run_turns(agent_with(ZerdaHistory(k=1), sync_model), history, 3)
    again = ZerdaMessageHistory("b")
    processor = ZerdaHistory(k=1)
    run_turns(agent_with(processor.aselect, async_model), again, 3)
    strip = [[type(p).__name__ for p in parts(sent)] for sent in sync_model.seen]
    assert strip == [[type(p).__name__ for p in parts(sent)] for sent in async_model.seen]


def test_plain_slicing_loses_the_system_prompt() -> None:
    """What ZerdaHistory fixes: the processor the docs suggest drops the system prompt."""
    model = Scripted()
    agent = agent_with(lambda messages: messages[-3:], model)
    history = ZerdaMessageHistory("s")
    run_turns(agent, history, 3)
    assert not any(isinstance(p, SystemPromptPart) for p in parts(model.seen[-1]))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        ZerdaHistory(k=2, token_limit=100)
    with pytest.raises(ConfigurationError, match="token_limit"):
        ZerdaHistory(counter=COUNTER)
    with pytest.raises(ConfigurationError):
        ZerdaHistory(k=0)
    with pytest.raises(InvalidMessageError):
        ZerdaHistory().select("hello")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="messages\\[0\\]"):
        ZerdaMessageHistory("s").save([{"kind": "request"}])  # type: ignore[list-item]


# -- persistence ------------------------------------------------------------------------------


def rich_history() -> list[ModelMessage]:
    """Messages with every kind of part, a request of several parts, media and metadata."""
    return [
        ModelRequest(
            parts=[
                SystemPromptPart(SYSTEM),
                UserPromptPart(["look", BinaryContent(b"\x89PNG", media_type="image/png")]),
            ],
            instructions="be brief",
            metadata={"k": [1, 2]},
        ),
        ModelResponse(
            parts=[
                ThinkingPart("hmm", signature="sig"),
                TextPart("calling"),
                ToolCallPart("lookup", '{"q": 1}', tool_call_id="c1"),
                ToolCallPart("lookup", {"q": 2}, tool_call_id="c2"),
            ],
            model_name="m",
            provider_details={"x": 1},
        ),
        ModelRequest(
            parts=[
                ToolReturnPart("lookup", {"v": 1}, tool_call_id="c1"),
                ToolReturnPart("lookup", "bad q", tool_call_id="c2", outcome="retried"),
            ]
        ),
        ModelResponse(
            parts=[
                NativeToolCallPart("web_search", {"q": "x"}, tool_call_id="n1", provider_name="p"),
                NativeToolReturnPart("web_search", {"hits": [1]}, tool_call_id="n1"),
                TextPart("done"),
            ]
        ),
        ModelRequest(parts=[RetryFeedbackPart("try again", retry=RetryInfo("model_retry"))]),
        ModelRequest(
            parts=[ToolReturnPart("t", b"\x00raw", tool_call_id="x"), UserPromptPart("q")]
        ),
    ]


def round_tripped(messages: list[ModelMessage]) -> list[ModelMessage]:
    return ModelMessagesTypeAdapter.validate_json(ModelMessagesTypeAdapter.dump_json(messages))


@pytest.mark.parametrize("kind", STORES)
def test_messages_read_back_equal(kind: str, tmp_path: Path) -> None:
    with opened_stores(kind, tmp_path) as open_store:
        history = ZerdaMessageHistory("s", store=open_store())
        given = round_tripped(rich_history())
        history.save(given[:2])
        history.save(given[2:])
        again = ZerdaMessageHistory("s", store=open_store()).load()
        assert again == given
        assert round_tripped(again) == again


@pytest.mark.parametrize("kind", ASYNC_STORES)
def test_async_messages_read_back_equal(kind: str, tmp_path: Path) -> None:
    async def main() -> list[ModelMessage]:
        store = open_store()
        history = ZerdaMessageHistory("s", store=store)
        await history.asave(given)
        try:
            return await ZerdaMessageHistory("s", store=store).aload()
        finally:
            if kind.startswith("async"):
                await store.aclose()

    given = round_tripped(rich_history())
    with opened_stores(kind, tmp_path) as open_store:
        assert asyncio.run(main()) == given


def test_each_part_is_a_zerda_message() -> None:
    store = InMemoryStore()
    ZerdaMessageHistory("s", store=store).save(rich_history())
    stored = store.history("s")
    assert [m.role.value for m in stored] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
        "assistant",
        "tool",
        "user",
    ]
    assert [c.id for c in stored[2].tool_calls] == ["c1", "c2"]
    assert stored[1].metadata[METADATA_KEY]["group"] == stored[0].id
    assert "hits" in stored[5].text  # a native search's return, counted as its text
    assert "try again" in stored[6].text  # retry feedback, as sent: inside its turn


def test_parts_zerda_does_not_model_go_with_their_message() -> None:
    given = rich_history()
    chosen = ZerdaHistory().select(given)
    assert chosen[3] is given[3]  # the native call and return, whole
    assert chosen[4] is given[4]  # the retry feedback
    assert chosen[-1].parts == [given[-1].parts[1]]  # the orphan return "x" left out
    assert chosen[-1].timestamp == given[-1].timestamp
    assert chosen[:-1] == given[:-1]


def test_a_run_continues_after_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    first = ZerdaMessageHistory("alice", store=SQLiteStore(path))
    run_turns(agent_with(ZerdaHistory(k=2), Scripted()), first, 2)
    before = first.load()
    model = Scripted()
    later = ZerdaMessageHistory("alice", store=SQLiteStore(path))
    assert later.load() == before
    run_turns(agent_with(ZerdaHistory(k=2), model), later, 2, start=2)
    after = ZerdaMessageHistory("alice", store=SQLiteStore(path)).load()
    assert after[: len(before)] == before
    prompts = [p.content for p in parts(after) if isinstance(p, UserPromptPart)]
    assert prompts == [f"question {i}" for i in range(4)]
    assert [p.content for p in parts(model.seen[0]) if isinstance(p, UserPromptPart)] == [
        "question 1",
        "question 2",
    ]


def test_load_reads_the_newest_turns() -> None:
    history = ZerdaMessageHistory("s")
    run_turns(agent_with(None, Scripted()), history, 4)
    newest = history.load(turns=1)
    assert isinstance(newest[0].parts[0], SystemPromptPart)
    assert len(newest[0].parts) == 1
    assert newest[1:] == history.load()[-4:]
    with pytest.raises(ConfigurationError):
        history.load(turns=-1)


def test_a_message_edited_through_zerda_reads_as_edited() -> None:
    store = InMemoryStore()
    history = ZerdaMessageHistory("s", store=store)
    history.save([ModelRequest(parts=[UserPromptPart("my card is 4111")])])
    message_id = store.history("s")[0].id
    assert message_id is not None
    store.edit_message("s", message_id, "my card is [removed]")
    (request,) = history.load()
    assert isinstance(request, ModelRequest)
    assert request.parts[0].content == "my card is [removed]"  # type: ignore[union-attr]


def test_binary_tool_output_survives() -> None:
    history = ZerdaMessageHistory("s")
    raw = ModelRequest(parts=[ToolReturnPart("t", b"\x00\xff", tool_call_id="x")])
    history.save([raw])
    assert history.load() == round_tripped([raw])
    assert base64.b64decode(str(history.load()[0].parts[0].content)) == b"\x00\xff"  # type: ignore[union-attr]


# -- the ConversationStore --------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_conversations_are_saved_loaded_and_forked(kind: str, tmp_path: Path) -> None:
    async def main() -> None:
        with opened_stores(kind, tmp_path) as open_store:
            store = ZerdaConversationStore(open_store())
            agent = agent_with(ZerdaHistory(k=1), Scripted())
            conversation = Conversation(conversation_id="c1")
            for i in range(3):
                result = await agent.run(f"hi {i}", conversation=conversation)
                await store.save(result)
                loaded = await ZerdaConversationStore(open_store()).load("c1")
                assert loaded is not None
                conversation = loaded
            assert len(conversation.messages) == 12  # kept whole although the processor trims
            prompts = [
                p.content for p in parts(conversation.messages) if isinstance(p, UserPromptPart)
            ]
            assert prompts == ["hi 0", "hi 1", "hi 2"]
            fork = await store.fork("c1", at=4, new_conversation_id="f1")
            result = await agent.run("forked", conversation=fork)
            await store.save(result)
            forked = await store.load("f1")
            assert forked is not None
            assert forked.messages[:4] == conversation.messages[:4]
            assert len(forked.messages) == 8
            listed = [r.conversation_id for r in await store.list_conversations()]
            assert sorted(listed) == ["c1", "f1"]
            await store.update("c1", title="Greetings", expected_title=None)
            record = await store.read_record("c1")
            assert record is not None
            assert record.title == "Greetings"
            await store.delete("f1")
            assert await store.load("f1") is None
            assert await store.load("c1") is not None

    asyncio.run(main())


def test_two_saves_from_one_revision_conflict() -> None:
    async def main() -> None:
        store = ZerdaConversationStore(InMemoryStore())
        agent = agent_with(None, Scripted())
        await store.save(await agent.run("hi", conversation=Conversation(conversation_id="c")))
        loaded = await store.load("c")
        assert loaded is not None
        copy = Conversation(
            conversation_id="c", messages=list(loaded.messages), revision=loaded.revision
        )
        await store.save(await agent.run("one", conversation=loaded))
        with pytest.raises(ConversationConflict):
            await store.save(await agent.run("two", conversation=copy))
        again = await store.load("c")
        assert again is not None
        texts = [p.content for p in parts(again.messages) if isinstance(p, UserPromptPart)]
        assert texts == ["hi", "one"]

    asyncio.run(main())
