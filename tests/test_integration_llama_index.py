"""The LlamaIndex integration: lossless conversion and a chat memory over any Zerda memory."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "llama_index.core", reason="the llamaindex extra (llama-index-core) is not installed"
)

from hypothesis import HealthCheck, given, settings
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import (
    AudioBlock,
    CacheControl,
    CachePoint,
    ChatMessage,
    ChatResponse,
    DocumentBlock,
    ImageBlock,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
    VideoBlock,
)
from llama_index.core.chat_engine import SimpleChatEngine
from llama_index.core.llms import MockFunctionCallingLLM, MockLLM
from llama_index.core.memory import BaseMemory as LlamaBaseMemory
from llama_index.core.tools import FunctionTool

from test_integrations import ASYNC_STORES, STORES, messages_with_parts_st, opened_stores
from test_messages import messages_st
from zerda import (
    ApproxCounter,
    ConfigurationError,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
    InvalidMessageError,
    Message,
    Role,
    ToolCall,
    ZerdaError,
    to_openai,
)
from zerda.integrations.llama_index import (
    ZERDA_KEY,
    ZerdaMemory,
    from_llama_index,
    from_llama_index_messages,
    to_llama_index,
    to_llama_index_messages,
)
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart
from zerda.stores import AsyncSQLiteStore, InMemoryStore, SQLiteStore

CALL = ToolCall(id="call_1", name="order_status", arguments='{"order": 42}')
TOOL_TURN = [
    Message(Role.USER, "Where is order 42?"),
    Message(Role.ASSISTANT, None, tool_calls=(CALL,)),
    Message(Role.TOOL, '{"status": "shipped"}', tool_call_id="call_1"),
    Message(Role.ASSISTANT, "It shipped yesterday."),
]


def unstamped(messages: Sequence[Message]) -> list[Message]:
    """``messages`` without the times and ids the memory stamped on them."""
    return [dataclasses.replace(m, created_at=None, id=None) for m in messages]


class SpyLLM(MockLLM):
    """LlamaIndex's MockLLM, recording the messages of every chat call and replying in turn."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__()
        self._replies = iter(replies)
        self._seen: list[list[ChatMessage]] = []

    @property
    def seen(self) -> list[list[ChatMessage]]:
        return self._seen

    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        self._seen.append(list(messages))
        return ChatResponse(message=ChatMessage(role="assistant", content=next(self._replies)))

    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        return self.chat(messages, **kwargs)


# -- conversion --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "role"),
    [
        (Message(Role.USER, "hi"), MessageRole.USER),
        (Message(Role.SYSTEM, "be brief"), MessageRole.SYSTEM),
        (Message(Role.DEVELOPER, "answer in French"), MessageRole.DEVELOPER),
        (Message(Role.ASSISTANT, "hello"), MessageRole.ASSISTANT),
        (Message(Role.TOOL, "42", tool_call_id="c1", name="calc"), MessageRole.TOOL),
    ],
)
def test_each_role_maps_to_its_llama_index_role(message: Message, role: MessageRole) -> None:
    converted = to_llama_index(message)
    assert converted.role is role
    assert converted.content == message.content
    assert from_llama_index(converted) == message


def test_tool_calls_become_tool_call_blocks_with_the_exact_arguments() -> None:
    call = ToolCall(id="c9", name="search", arguments='{"q":  "tea", "n": 2}')
    converted = to_llama_index(Message(Role.ASSISTANT, "Let me look.", tool_calls=(call,)))
    text, block = converted.blocks
    assert isinstance(text, TextBlock)
    assert text.text == "Let me look."
    assert isinstance(block, ToolCallBlock)
    assert (block.tool_call_id, block.tool_name, block.tool_kwargs) == (
        "c9",
        "search",
        '{"q":  "tea", "n": 2}',
    )
    assert ZERDA_KEY not in converted.additional_kwargs


def test_tool_results_carry_their_call_id() -> None:
    converted = to_llama_index(TOOL_TURN[2])
    assert converted.role is MessageRole.TOOL
    assert converted.additional_kwargs["tool_call_id"] == "call_1"


def test_tool_turn_round_trips_and_reaches_openai_format_intact() -> None:
    back = from_llama_index_messages(to_llama_index_messages(TOOL_TURN))
    assert back == TOOL_TURN
    sent = to_openai(back)
    assert sent[1]["tool_calls"][0]["function"] == {
        "name": "order_status",
        "arguments": '{"order": 42}',
    }
    assert sent[2]["tool_call_id"] == "call_1"


def test_metadata_created_at_and_name_survive_the_round_trip() -> None:
    message = Message(
        Role.USER, "hi", name="ann", metadata={"lang": "en", "n": [1, 2]}, created_at=12.5
    )
    converted = to_llama_index(message)
    assert converted.additional_kwargs[ZERDA_KEY]["created_at"] == 12.5
    assert from_llama_index(converted) == message


def test_none_and_empty_assistant_content_stay_distinct() -> None:
    none = Message(Role.ASSISTANT, None, tool_calls=(CALL,))
    empty = Message(Role.ASSISTANT, "", tool_calls=(CALL,))
    assert from_llama_index(to_llama_index(none)).content is None
    assert from_llama_index(to_llama_index(empty)).content == ""


@settings(deadline=None)
@given(messages_st())
def test_any_message_round_trips(message: Message) -> None:
    assert from_llama_index(to_llama_index(message)) == message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages_with_parts_st())
def test_any_message_with_parts_round_trips(message: Message) -> None:
    """Every part kind, extras (even ones that clash with LlamaIndex's fields), every role;
    and what ``get()`` sends a model reads back."""
    assert from_llama_index(to_llama_index(message)) == message
    sent = from_llama_index(to_llama_index(message, lossless=False))
    assert (sent.role, sent.tool_call_id) == (message.role, message.tool_call_id)


# -- content parts -----------------------------------------------------------------------------

PNG = "data:image/png;base64,iVBORw0KGgo="
EVERY_PART = Message(
    Role.USER,
    (
        TextPart("What is on this receipt?"),
        ImagePart(PNG, detail="high"),
        ImagePart("https://example.com/cat.jpg", detail="low"),
        AudioPart("UklGRg==", "wav"),
        FilePart("data:application/pdf;base64,JVBERi0=", filename="receipt.pdf"),
        FilePart(None, url="https://example.com/terms.pdf"),
        ReasoningPart("The total is at the bottom.", signature="sig", encrypted="gAAA"),
    ),
)


def test_each_part_is_its_llama_index_block() -> None:
    converted = to_llama_index(EVERY_PART)
    assert converted.blocks == [
        TextBlock(text="What is on this receipt?"),
        ImageBlock(image=b"iVBORw0KGgo=", image_mimetype="image/png", detail="high"),
        ImageBlock(url="https://example.com/cat.jpg", detail="low"),
        AudioBlock(audio=b"UklGRg==", format="wav"),
        DocumentBlock(data=b"JVBERi0=", document_mimetype="application/pdf", title="receipt.pdf"),
        DocumentBlock(url="https://example.com/terms.pdf"),
        ThinkingBlock(
            content="The total is at the bottom.",
            additional_information={"signature": "sig", "encrypted_content": "gAAA"},
        ),
    ]
    assert ZERDA_KEY not in converted.additional_kwargs  # every part comes back from its block
    assert from_llama_index(converted) == EVERY_PART
    image = converted.blocks[1]
    assert isinstance(image, ImageBlock)
    assert image.inline_url() == PNG  # what LlamaIndex's LLMs send


def test_blocks_from_llama_index_become_parts(tmp_path: Path) -> None:
    picture = tmp_path / "receipt.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n")
    message = ChatMessage(
        role="user",
        blocks=[
            TextBlock(text="Read these."),
            ImageBlock(image=b"\x89PNG\r\n\x1a\n"),  # raw bytes: LlamaIndex keeps them as base64
            ImageBlock(path=picture, detail="auto"),
            DocumentBlock(url="https://example.com/terms.pdf", title="terms.pdf"),
            ThinkingBlock(
                content="Two receipts.", num_tokens=3, additional_information={"signature": "s1"}
            ),
        ],
    )
    converted = from_llama_index(message)
    assert converted.parts == (
        TextPart("Read these."),
        ImagePart(PNG),
        ImagePart(PNG, detail="auto", extra={"llama_index": {"path": str(picture)}}),
        FilePart(None, url="https://example.com/terms.pdf", filename="terms.pdf"),
        ReasoningPart("Two receipts.", signature="s1", extra={"llama_index": {"num_tokens": 3}}),
    )
    assert to_llama_index(converted, lossless=False) == message  # the blocks as given
    again = to_llama_index(dataclasses.replace(converted, metadata={}), lossless=False)
    assert again.blocks[2] == ImageBlock(
        image=b"iVBORw0KGgo=", path=picture, image_mimetype="image/png", detail="auto"
    )
    assert again.blocks[4] == message.blocks[4]


def test_get_sends_only_what_a_model_can_take_and_no_bookkeeping() -> None:
    message = Message(
        Role.USER,
        (
            TextPart("Compare"),
            ImagePart(None, file_id="file-img"),  # a provider's file id: no LlamaIndex field
            FilePart(None, file_id="file-doc"),
            ImagePart("https://example.com/a.png"),
        ),
    )
    kept = to_llama_index(message)
    assert len(kept.blocks) == 4
    assert set(kept.additional_kwargs[ZERDA_KEY]["parts"]) == {"1", "2"}
    assert from_llama_index(kept) == message
    sent = to_llama_index(message, lossless=False)
    assert sent.blocks == [TextBlock(text="Compare"), ImageBlock(url="https://example.com/a.png")]
    assert sent.additional_kwargs == {}


def test_text_parts_stay_parts() -> None:
    message = Message(Role.USER, (TextPart("one"), TextPart("two")))
    converted = to_llama_index(message)
    assert converted.content == "one\ntwo"
    assert from_llama_index(converted) == message
    # Without the bookkeeping (a model's message), text blocks are text, as they always were.
    assert from_llama_index(to_llama_index(message, lossless=False)).content == "one\ntwo"


@pytest.mark.parametrize(
    ("block", "words"),
    [
        (VideoBlock(url="https://example.com/a.mp4"), "VideoBlock"),
        (CachePoint(cache_control=CacheControl(type="ephemeral")), "CachePoint"),
        (AudioBlock(url="https://example.com/a.wav"), "Zerda keeps audio as data"),
        (ImageBlock(), "needs an image, a url or a path"),
    ],
)
def test_blocks_zerda_cannot_keep_are_refused(block: Any, words: str) -> None:
    with pytest.raises(InvalidMessageError, match=words) as caught:
        from_llama_index(ChatMessage(role="user", blocks=[TextBlock(text="ok"), block]))
    assert "block 1" in str(caught.value)


def test_a_memory_keeps_parts_in_a_store(tmp_path: Path) -> None:
    memory = ZerdaMemory(
        memory=ConversationBufferMemory(store=SQLiteStore(tmp_path / "chat.db"), session_id="s")
    )
    asked = ChatMessage(
        role="user",
        blocks=[TextBlock(text="What is this?"), ImageBlock(image=b"iVBORw0KGgo=", detail="low")],
    )
    answered = ChatMessage(
        role="assistant",
        blocks=[
            ThinkingBlock(content="A tiny PNG.", additional_information={"signature": "EqQB"}),
            TextBlock(text="A one-pixel image."),
        ],
    )
    memory.put_messages([asked, answered])
    reopened = ConversationBufferMemory(store=SQLiteStore(tmp_path / "chat.db"), session_id="s")
    shown = ZerdaMemory(memory=reopened).get()
    assert [m.blocks for m in shown] == [asked.blocks, answered.blocks]


def test_messages_as_llama_index_agents_write_them_convert() -> None:
    """Tool calls as ToolCallBlocks with dict kwargs, results keyed by tool_call_id."""
    call = ChatMessage(
        role="assistant",
        blocks=[ToolCallBlock(tool_call_id="t1", tool_name="add", tool_kwargs={"a": 1, "b": 2})],
    )
    result = ChatMessage(
        role="tool",
        blocks=[TextBlock(text="3")],
        additional_kwargs={"tool_call_id": "t1", "name": "add"},
    )
    made, answered = from_llama_index_messages([call, result])
    assert made.content is None
    assert made.tool_calls == (ToolCall(id="t1", name="add", arguments='{"a": 1, "b": 2}'),)
    assert (answered.role, answered.content, answered.tool_call_id, answered.name) == (
        Role.TOOL,
        "3",
        "t1",
        "add",
    )


def test_openai_style_tool_calls_in_additional_kwargs_convert() -> None:
    raw = {"id": "c2", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    message = ChatMessage(role="assistant", content="", additional_kwargs={"tool_calls": [raw]})
    converted = from_llama_index(message)
    assert converted.tool_calls == (ToolCall(id="c2", name="f", arguments="{}"),)
    assert converted.content == ""


def test_llama_index_fields_zerda_has_no_place_for_are_kept() -> None:
    thinking = ThinkingBlock(content="first, check the order")
    message = ChatMessage(
        role="developer",
        blocks=[thinking, TextBlock(text="one"), TextBlock(text="two")],
        additional_kwargs={"trace": "abc"},
    )
    converted = from_llama_index(message)
    assert converted.role is Role.DEVELOPER
    assert converted.parts == (
        ReasoningPart("first, check the order"),
        TextPart("one"),
        TextPart("two"),
    )
    assert converted.metadata["llama_index"] == {"additional_kwargs": {"trace": "abc"}}
    back = to_llama_index(converted)
    assert back.role is MessageRole.DEVELOPER
    assert back.additional_kwargs["trace"] == "abc"
    assert back.blocks == message.blocks
    assert back.content == "one\ntwo"


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (ChatMessage(role="function", content="1"), "'function' message"),
        (ChatMessage(role="tool", content="1"), "tool_call_id"),
        (
            ChatMessage(role="assistant", blocks=[ToolCallBlock(tool_name="f", tool_kwargs={})]),
            "no tool_call_id",
        ),
        (ChatMessage(role="user", blocks=[VideoBlock(url="https://x.invalid/a.mp4")]), "Video"),
    ],
)
def test_unsupported_messages_are_refused(message: ChatMessage, words: str) -> None:
    with pytest.raises(InvalidMessageError, match=words):
        from_llama_index(message)


def test_wrong_argument_types_are_refused() -> None:
    with pytest.raises(InvalidMessageError, match=r"takes a zerda\.Message"):
        to_llama_index({"role": "user", "content": "hi"})  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="takes a LlamaIndex ChatMessage"):
        from_llama_index(Message(Role.USER, "hi"))  # type: ignore[arg-type]


# -- ZerdaMemory -------------------------------------------------------------------------------


def _turns(n: int) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    for i in range(n):
        out += [
            ChatMessage(role="user", content=f"question {i}"),
            ChatMessage(role="assistant", content=f"answer {i}"),
        ]
    return out


def test_memory_is_a_llama_index_memory_showing_the_window() -> None:
    zerda_memory = ConversationBufferWindowMemory(k=2)
    memory = ZerdaMemory(memory=zerda_memory)
    assert isinstance(memory, LlamaBaseMemory)
    memory.put(ChatMessage(role="system", content="be brief"))
    memory.put_messages(_turns(4))
    shown = memory.get()
    assert shown == to_llama_index_messages(zerda_memory.get_context(), lossless=False)
    assert [m.content for m in shown] == [
        "be brief",
        "question 2",
        "answer 2",
        "question 3",
        "answer 3",
    ]
    assert [m.role for m in shown[:2]] == [MessageRole.SYSTEM, MessageRole.USER]
    assert [m.content for m in memory.get_all()][1:3] == ["question 0", "answer 0"]
    assert len(memory.get_all()) == 9
    memory.reset()
    assert memory.get() == []
    assert memory.get_all() == []


def test_get_leaves_zerda_bookkeeping_out_and_get_all_keeps_it_on_request() -> None:
    zerda_memory = ConversationBufferMemory()
    memory = ZerdaMemory(memory=zerda_memory, include_zerda_fields=True)
    memory.put_messages(to_llama_index_messages(TOOL_TURN))
    zerda_memory.add_message(Message(Role.USER, "hi", name="ann", metadata={"lang": "en"}))
    shown = memory.get()
    assert all(ZERDA_KEY not in m.additional_kwargs for m in shown)
    assert shown[2].additional_kwargs == {"tool_call_id": "call_1"}
    assert from_llama_index_messages(shown) == unstamped(
        [dataclasses.replace(m, name=None, metadata={}) for m in zerda_memory.get_context()]
    )
    everything = memory.get_all()
    assert from_llama_index_messages(everything) == zerda_memory.get_history()
    memory.set(everything)
    assert zerda_memory.get_history() == from_llama_index_messages(everything)


def test_completion_style_llms_get_no_bookkeeping_in_the_prompt() -> None:
    llm = MockLLM()  # a completion LLM: chat messages become one prompt, additional_kwargs too
    memory = ZerdaMemory(memory=ConversationBufferMemory())
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    engine.chat("hello there")
    engine.chat("and again")
    prompts = [m.content or "" for m in memory.get() if m.role is MessageRole.ASSISTANT]
    assert prompts  # MockLLM echoes its prompt
    assert all("created_at" not in p and ZERDA_KEY not in p for p in prompts)


def test_set_replaces_the_conversation_and_converts_first() -> None:
    memory = ZerdaMemory(memory=ConversationBufferMemory())
    memory.put_messages(_turns(2))
    with pytest.raises(InvalidMessageError):
        memory.set([ChatMessage(role="user", content="new"), ChatMessage(role="function")])
    assert len(memory.get_all()) == 4  # nothing cleared: the bad message was found first
    memory.set(_turns(1))
    assert [m.content for m in memory.get_all()] == ["question 0", "answer 0"]


def test_put_messages_is_one_batch() -> None:
    memory = ZerdaMemory(memory=ConversationBufferMemory())
    with pytest.raises(InvalidMessageError):
        memory.put_messages([ChatMessage(role="user", content="ok"), ChatMessage(role="tool")])
    assert memory.get_all() == []


def test_tool_call_turns_survive_the_memory() -> None:
    zerda_memory = ConversationBufferMemory()
    memory = ZerdaMemory(memory=zerda_memory)
    memory.put_messages(to_llama_index_messages(TOOL_TURN))
    assert unstamped(from_llama_index_messages(memory.get())) == TOOL_TURN
    assert unstamped(zerda_memory.get_history()) == TOOL_TURN


def test_get_refuses_an_initial_token_count_it_would_ignore() -> None:
    memory = ZerdaMemory(memory=ConversationBufferMemory())
    assert memory.get(initial_token_count=0) == []
    with pytest.raises(ConfigurationError, match="reserve_tokens"):
        memory.get(initial_token_count=50)


def test_from_defaults_builds_a_token_memory_or_a_buffer(tmp_path: Path) -> None:
    counter = ApproxCounter()
    store = SQLiteStore(tmp_path / "chat.db")
    memory = ZerdaMemory.from_defaults(
        token_limit=300,
        store=store,
        session_id="dora",
        token_counter=counter,
        chat_history=_turns(2),
    )
    inner = memory.memory
    assert isinstance(inner, ConversationTokenBufferMemory)
    assert (inner.max_token_limit, inner.store, inner.session_id) == (300, store, "dora")
    assert memory.session_id == "dora"
    assert len(memory.get_all()) == 4
    plain = ZerdaMemory.from_defaults()
    assert type(plain.memory) is ConversationBufferMemory
    wrapped = ConversationBufferWindowMemory(k=3)
    assert ZerdaMemory.from_defaults(memory=wrapped).memory is wrapped
    assert "dora" in repr(memory)


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"memory": ConversationBufferMemory(), "token_limit": 10}, "not both"),
        ({"memory": ConversationBufferMemory(), "session_id": "x"}, "not both"),
        ({"token_counter": ApproxCounter()}, "needs token_limit"),
    ],
)
def test_from_defaults_refuses_mixed_arguments(kwargs: dict[str, Any], words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        ZerdaMemory.from_defaults(**kwargs)


def test_memory_needs_a_zerda_memory() -> None:
    with pytest.raises(ConfigurationError, match="takes a Zerda memory"):
        ZerdaMemory(memory="not a memory")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        ZerdaMemory()


# -- SimpleChatEngine --------------------------------------------------------------------------


def test_simple_chat_engine_over_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    counter = ApproxCounter()
    budget = 90
    zerda_memory = ConversationTokenBufferMemory(
        max_token_limit=budget, token_counter=counter, store=SQLiteStore(db), session_id="eve"
    )
    zerda_memory.add_message({"role": "system", "content": "You are terse."})
    llm = SpyLLM([f"reply {i} " * 6 for i in range(8)])
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=ZerdaMemory(memory=zerda_memory))
    for i in range(8):
        response = engine.chat(f"message {i} " * 6)
        assert response.response == f"reply {i} " * 6

    for i, sent in enumerate(llm.seen):
        context = from_llama_index_messages(sent)
        assert counter.count_messages(context) <= budget
        assert context[0].role is Role.SYSTEM
        assert context[1].role is Role.USER  # after the pinned prompt, a user turn
        assert context[-1].content == f"message {i} " * 6  # the new message, last
    assert len(llm.seen[-1]) < 1 + 2 * 8  # older turns were evicted

    reopened = ConversationBufferMemory(store=SQLiteStore(db), session_id="eve")
    history = reopened.get_history()
    assert len(history) == 1 + 16
    assert [m.content for m in history[-2:]] == ["message 7 " * 6, "reply 7 " * 6]
    assert all(m.created_at is not None for m in history)


def test_simple_chat_engine_keeps_tool_turns_whole_in_its_context() -> None:
    zerda_memory = ConversationBufferWindowMemory(k=2)
    memory = ZerdaMemory(memory=zerda_memory)
    memory.put_messages(to_llama_index_messages(TOOL_TURN))
    llm = SpyLLM(["Anything else?", "Bye."])
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
    engine.chat("Thanks")
    sent = from_llama_index_messages(llm.seen[0])
    assert unstamped(sent) == [*TOOL_TURN, Message(Role.USER, "Thanks")]
    engine.chat("Goodbye")  # the tool turn leaves the window as a whole
    assert [m.content for m in llm.seen[1]] == ["Thanks", "Anything else?", "Goodbye"]
    engine.reset()
    assert zerda_memory.get_history() == []


def test_simple_chat_engine_async_is_native(tmp_path: Path) -> None:
    async def run() -> tuple[SpyLLM, list[Message]]:
        store = AsyncSQLiteStore(tmp_path / "chat.db")
        zerda_memory = ConversationBufferWindowMemory(k=2, store=store, session_id="fay")
        memory = ZerdaMemory(memory=zerda_memory)
        llm = SpyLLM(["one", "two", "three"])
        engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)
        for word in ("a", "b", "c"):
            await engine.achat(word)
        with pytest.raises(ZerdaError):  # an async store has no sync path
            memory.get()
        everything = from_llama_index_messages(await memory.aget_all())
        assert [m.content for m in await memory.aget()] == ["b", "two", "c", "three"]
        await memory.aset(_turns(1))
        assert len(await memory.aget_all()) == 2
        await memory.aput(ChatMessage(role="user", content="more"))
        await memory.aput_messages([ChatMessage(role="assistant", content="ok")])
        assert len(await memory.aget_all()) == 4
        await memory.areset()
        assert await memory.aget() == []
        await store.aclose()
        return llm, everything

    llm, everything = asyncio.run(run())
    # k=2 counts the turn being answered: the previous turn and the new message.
    assert [m.content for m in llm.seen[2]] == ["b", "two", "c"]
    assert [m.content for m in everything] == ["a", "one", "b", "two", "c", "three"]


# -- FunctionAgent -----------------------------------------------------------------------------


# FunctionTool inspects pydantic models, which warns of pydantic's own deprecations.
@pytest.mark.filterwarnings("ignore::DeprecationWarning:inspect")
def test_function_agent_stores_its_tool_calls_whole_and_sees_them_next_run(
    tmp_path: Path,
) -> None:
    seen: list[list[ChatMessage]] = []

    def model(messages: Sequence[ChatMessage], **kwargs: Any) -> ChatMessage:
        """Calls the tool for each new question, then answers with its result."""
        seen.append(list(messages))
        if messages[-1].role is MessageRole.USER:
            order = int(str(messages[-1].content).split()[-1].rstrip("?"))
            call = ToolCallBlock(
                tool_call_id=f"call_{order}", tool_name="order_status", tool_kwargs={"order": order}
            )
            return ChatMessage(role="assistant", blocks=[call])
        return ChatMessage(role="assistant", content=f"Result: {messages[-1].content}")

    def order_status(order: int) -> str:
        """The status of an order."""
        return f'{{"order": {order}, "status": "shipped"}}'

    agent = FunctionAgent(
        tools=[FunctionTool.from_defaults(order_status)],
        llm=MockFunctionCallingLLM(response_generator=model, is_chat_model=True),
    )
    db = tmp_path / "agent.db"
    zerda_memory = ConversationBufferWindowMemory(k=2, store=SQLiteStore(db), session_id="gus")
    memory = ZerdaMemory(memory=zerda_memory)

    async def run() -> list[str]:
        return [
            str(await agent.run(user_msg=f"Where is order {n}?", memory=memory)) for n in (42, 43)
        ]

    answers = asyncio.run(run())
    assert answers == [
        'Result: {"order": 42, "status": "shipped"}',
        'Result: {"order": 43, "status": "shipped"}',
    ]
    stored = ConversationBufferMemory(store=SQLiteStore(db), session_id="gus").get_history()
    assert [m.role.value for m in stored] == ["user", "assistant", "tool", "assistant"] * 2
    assert stored[1].tool_calls == (
        ToolCall(id="call_42", name="order_status", arguments='{"order": 42}'),
    )
    assert stored[2].tool_call_id == "call_42"
    # The second run's first model call got the first turn, tool call and result, from memory.
    second = [from_llama_index(m) for m in seen[2]]
    assert [m.role.value for m in second] == ["user", "assistant", "tool", "assistant", "user"]
    assert second[2].tool_call_id == second[1].tool_calls[0].id == "call_42"


# -- a message read back is the message put ----------------------------------------------------

ASK = ChatMessage(role="user", content="Where is order 42?")


def _call_block(kwargs: dict[str, Any] | str, call_id: str = "call_1") -> ToolCallBlock:
    return ToolCallBlock(tool_call_id=call_id, tool_name="order_status", tool_kwargs=kwargs)


def _conversations(picture: Path) -> dict[str, list[ChatMessage]]:
    """Each case (one of :data:`CASES`) is a conversation whose context (a buffer memory's) is
    all of it, in order."""
    return {
        "user": [ASK],
        "user-additional-kwargs": [
            ChatMessage(role="user", content="hi", additional_kwargs={"trace": "t1", "x": None})
        ],
        "user-blocks": [
            ChatMessage(
                role="user",
                blocks=[
                    TextBlock(text="What is on this receipt?"),
                    ImageBlock(image=b"iVBORw0KGgo=", image_mimetype="image/png", detail="low"),
                    ImageBlock(url="https://example.com/cat.jpg"),
                    ImageBlock(path=picture),  # read into the store, and given back by path
                    AudioBlock(audio=b"UklGRg==", format="wav"),
                    DocumentBlock(url="https://example.com/terms.pdf", title="terms.pdf"),
                ],
            )
        ],
        "user-text-blocks": [
            ChatMessage(role="user", blocks=[TextBlock(text="one"), TextBlock(text="two")])
        ],
        "assistant": [ASK, ChatMessage(role="assistant", content="It shipped yesterday.")],
        "assistant-tool-calls": [  # as FunctionAgent writes them: tool_kwargs a dict
            ASK,
            ChatMessage(
                role="assistant",
                blocks=[
                    _call_block({"order": 42}),
                    _call_block('{"order":  43}', call_id="call_2"),  # the exact text
                ],
            ),
            ChatMessage(
                role="tool",
                content='{"status": "shipped"}',
                additional_kwargs={"tool_call_id": "call_1", "name": "order_status"},
            ),
            ChatMessage(
                role="tool", content="not found", additional_kwargs={"tool_call_id": "call_2"}
            ),
            ChatMessage(role="assistant", content="42 shipped; 43 is unknown."),
        ],
        "assistant-thinking-text-and-tool-call": [
            ASK,
            ChatMessage(
                role="assistant",
                blocks=[
                    ThinkingBlock(
                        content="Look it up.", additional_information={"signature": "EqQB"}
                    ),
                    TextBlock(text="Let me check."),
                    _call_block({"order": 42}),
                ],
            ),
            ChatMessage(
                role="tool", content="shipped", additional_kwargs={"tool_call_id": "call_1"}
            ),
            ChatMessage(role="assistant", content="It shipped."),
        ],
        "assistant-openai-tool-calls": [  # as older LLM integrations wrote them
            ASK,
            ChatMessage(
                role="assistant",
                content="",
                additional_kwargs={
                    "tool_calls": [
                        {
                            "id": "call_1",
                            "type": "function",
                            "function": {"name": "order_status", "arguments": '{"order": 42}'},
                        }
                    ]
                },
            ),
            ChatMessage(role="tool", content="shipped", additional_kwargs={"call_id": "call_1"}),
            ChatMessage(role="chatbot", content="It shipped."),
        ],
        "system-and-developer": [
            ChatMessage(role="system", content="Be terse."),
            ChatMessage(role="developer", content="Answer in French."),
            ASK,
        ],
    }


CASES = [
    "user",
    "user-additional-kwargs",
    "user-blocks",
    "user-text-blocks",
    "assistant",
    "assistant-tool-calls",
    "assistant-thinking-text-and-tool-call",
    "assistant-openai-tool-calls",
    "system-and-developer",
]


@pytest.fixture
def picture(tmp_path: Path) -> Path:
    path = tmp_path / "receipt.png"
    path.write_bytes(b"\x89PNG\r\n\x1a\n")
    return path


@pytest.fixture(params=STORES)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    with opened_stores(request.param, tmp_path) as make:
        yield make


@pytest.fixture(params=ASYNC_STORES)
def make_async_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    with opened_stores(request.param, tmp_path) as make:
        yield make


def _memory(store: Any, **options: Any) -> ZerdaMemory:
    return ZerdaMemory(memory=ConversationBufferMemory(store=store, session_id="ann"), **options)


@pytest.mark.parametrize("case", CASES)
def test_messages_read_back_equal_those_put(
    case: str, make_store: Callable[[], Any], picture: Path
) -> None:
    put = _conversations(picture)[case]
    _memory(make_store()).put_messages(put)
    memory = _memory(make_store())  # another store object: read back from the store
    assert memory.get_all() == put
    assert memory.get() == put
    assert all(ZERDA_KEY not in m.additional_kwargs for m in memory.get_all())
    # Zerda stamped its own ids (a retry sends them again), which the messages do not show.
    assert all(m.id is not None for m in memory.memory.get_history())


@pytest.mark.parametrize("case", CASES)
def test_messages_read_back_equal_those_put_async(
    case: str, make_async_store: Callable[[], Any], picture: Path
) -> None:
    put = _conversations(picture)[case]

    async def run() -> tuple[list[ChatMessage], list[ChatMessage]]:
        writer, reader = make_async_store(), make_async_store()
        await _memory(writer).aput_messages(put)
        memory = _memory(reader)
        shown = await memory.aget_all(), await memory.aget()
        for store in {id(writer): writer, id(reader): reader}.values():
            if hasattr(store, "aclose"):
                await store.aclose()
        return shown

    assert asyncio.run(run()) == (put, put)


def test_messages_put_one_at_a_time_read_back_equal(picture: Path) -> None:
    memory = _memory(InMemoryStore())
    put = _conversations(picture)["assistant-tool-calls"]
    for message in put:
        memory.put(message)
    assert memory.get_all() == put


def test_include_zerda_fields_shows_the_bookkeeping_in_get_all(
    make_store: Callable[[], Any], picture: Path
) -> None:
    put = _conversations(picture)["assistant-tool-calls"]
    _memory(make_store()).put_messages(put)
    memory = _memory(make_store(), include_zerda_fields=True)
    everything = memory.get_all()
    stored = memory.memory.get_history()
    assert [m.additional_kwargs[ZERDA_KEY]["id"] for m in everything] == [m.id for m in stored]
    assert [m.additional_kwargs[ZERDA_KEY]["created_at"] for m in everything] == [
        m.created_at for m in stored
    ]
    assert everything != put
    assert [_without_zerda(m) for m in everything] == put
    assert memory.get() == put  # what a model is sent never carries it
    # Put again (a retry), they are the messages stored: nothing is stored twice.
    memory.put_messages(everything)
    assert memory.memory.get_history() == stored
    memory.set(everything)
    assert memory.memory.get_history() == stored


def _without_zerda(message: ChatMessage) -> ChatMessage:
    kwargs = {k: v for k, v in message.additional_kwargs.items() if k != ZERDA_KEY}
    return message.model_copy(update={"additional_kwargs": kwargs})


def test_from_defaults_passes_include_zerda_fields_on() -> None:
    memory = ZerdaMemory.from_defaults(chat_history=[ASK], include_zerda_fields=True)
    assert memory.include_zerda_fields
    [shown] = memory.get_all()
    assert set(shown.additional_kwargs[ZERDA_KEY]) >= {"id", "created_at"}
    assert ZerdaMemory.from_defaults(chat_history=[ASK]).get_all() == [ASK]


def test_a_message_changed_in_zerda_is_shown_as_it_now_is() -> None:
    """What LlamaIndex gave is kept only while the Zerda message still says the same."""
    given = ChatMessage(
        role="user",
        blocks=[TextBlock(text="one"), TextBlock(text="two")],
        additional_kwargs={"trace": "t1"},
    )
    converted = from_llama_index(given)
    assert to_llama_index(converted, lossless=False) == given
    changed = dataclasses.replace(converted, content="three")
    shown = to_llama_index(changed, lossless=False)
    assert shown.blocks == [TextBlock(text="three")]
    assert shown.additional_kwargs == {"trace": "t1"}  # what does not depend on the content
    call = ChatMessage(role="assistant", blocks=[_call_block({"order": 42})])
    fewer = dataclasses.replace(from_llama_index(call), tool_calls=(), content="done")
    assert to_llama_index(fewer, lossless=False) == ChatMessage(role="assistant", content="done")


def test_what_a_store_cannot_keep_is_left_out_and_the_rest_kept() -> None:
    given = ChatMessage(role="user", content="hi", additional_kwargs={"c": object(), "t": "t1"})
    assert to_llama_index(from_llama_index(given), lossless=False).additional_kwargs == {"t": "t1"}


def test_the_cases_name_every_conversation(picture: Path) -> None:
    assert sorted(CASES) == sorted(_conversations(picture))
