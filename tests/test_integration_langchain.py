"""The LangChain integration: lossless conversion and a chat message history over any memory."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "langchain_core", reason="the langchain extra (langchain-core) is not installed"
)

from hypothesis import HealthCheck, given, settings
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.utils import convert_to_openai_messages
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

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
)
from zerda.integrations.langchain import (
    ZERDA_KEY,
    ZerdaChatMessageHistory,
    from_langchain,
    from_langchain_messages,
    to_langchain,
    to_langchain_messages,
)
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart
from zerda.stores import AsyncSQLiteStore, InMemoryStore, SQLiteStore

# RunnableWithMessageHistory is deprecated in langchain-core 1.x (in favour of LangGraph) but
# still shipped and widely used; the integration supports it.
pytestmark = pytest.mark.filterwarnings("ignore:RunnableWithMessageHistory is deprecated")

CALL = ToolCall(id="call_1", name="order_status", arguments='{"order": 42}')
TOOL_TURN = [
    Message(Role.USER, "Where is order 42?"),
    Message(Role.ASSISTANT, None, tool_calls=(CALL,)),
    Message(Role.TOOL, '{"status": "shipped"}', tool_call_id="call_1"),
    Message(Role.ASSISTANT, "It shipped yesterday."),
]


# -- conversion --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "kind"),
    [
        (Message(Role.USER, "hi", name="ann"), HumanMessage),
        (Message(Role.SYSTEM, "be brief"), SystemMessage),
        (Message(Role.DEVELOPER, "answer in French"), SystemMessage),
        (Message(Role.ASSISTANT, "hello"), AIMessage),
        (Message(Role.TOOL, "42", tool_call_id="c1", name="calc"), ToolMessage),
    ],
)
def test_each_role_maps_to_its_langchain_type(message: Message, kind: type[BaseMessage]) -> None:
    converted = to_langchain(message)
    assert type(converted) is kind
    assert converted.content == message.content
    assert converted.name == message.name
    assert from_langchain(converted) == message


def test_tool_calls_become_langchain_tool_calls_with_parsed_args() -> None:
    ai = to_langchain(TOOL_TURN[1])
    assert isinstance(ai, AIMessage)
    assert ai.content == ""
    assert ai.tool_calls == [
        {"name": "order_status", "args": {"order": 42}, "id": "call_1", "type": "tool_call"}
    ]
    assert ai.invalid_tool_calls == []
    tool = to_langchain(TOOL_TURN[2])
    assert isinstance(tool, ToolMessage)
    assert tool.tool_call_id == "call_1"
    assert [from_langchain(to_langchain(m)) for m in TOOL_TURN] == TOOL_TURN


@pytest.mark.parametrize(
    "arguments",
    ['{"order":42}', '{"a": 1, "a": 2}', "{not json", "[1, 2]", "", '{"x": 1.0}', "  {}"],
)
def test_tool_call_arguments_text_is_kept_exactly(arguments: str) -> None:
    call = ToolCall(id="c", name="f", arguments=arguments)
    message = Message(Role.ASSISTANT, "", tool_calls=(call, CALL))
    back = from_langchain(to_langchain(message))
    assert back == message
    assert back.tool_calls[0].arguments == arguments


def test_arguments_that_are_not_a_json_object_are_invalid_tool_calls() -> None:
    call = ToolCall(id="c", name="f", arguments="{not json")
    ai = to_langchain(Message(Role.ASSISTANT, None, tool_calls=(call,)))
    assert isinstance(ai, AIMessage)
    assert ai.tool_calls == []
    assert [(c["id"], c["args"]) for c in ai.invalid_tool_calls] == [("c", "{not json")]


def test_metadata_and_created_at_survive_the_round_trip() -> None:
    message = Message(Role.USER, "hi", metadata={"tags": ["a"], "n": 1}, created_at=1700000000.5)
    converted = to_langchain(message)
    assert converted.additional_kwargs["zerda"] == {
        "metadata": {"tags": ["a"], "n": 1},
        "created_at": 1700000000.5,
    }
    assert from_langchain(converted) == message


def test_none_and_empty_assistant_content_stay_distinct() -> None:
    for content in (None, ""):
        message = Message(Role.ASSISTANT, content, tool_calls=(CALL,))
        assert from_langchain(to_langchain(message)).content == content


@settings(deadline=None)
@given(messages_st())
def test_any_message_round_trips(message: Message) -> None:
    assert from_langchain(to_langchain(message)) == message


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages_with_parts_st())
def test_any_message_with_parts_round_trips(message: Message) -> None:
    """Every part kind, extras (even ones that clash with LangChain's fields), every role;
    and LangChain reads every block it is given."""
    converted = to_langchain(message)
    assert from_langchain(converted) == message
    assert isinstance(converted.content_blocks, list)


# -- the developer role ------------------------------------------------------------------------


def test_a_developer_message_is_a_system_message_marked_as_langchain_openai_marks_it() -> None:
    converted = to_langchain(Message(Role.DEVELOPER, "Answer in French."))
    assert type(converted) is SystemMessage
    assert converted.additional_kwargs == {"__openai_role__": "developer"}
    # What langchain-openai reads back from a {"role": "developer"} message, and what
    # LangChain's own OpenAI conversion sends as one:
    assert convert_to_openai_messages([converted]) == [
        {"role": "developer", "content": "Answer in French."}
    ]
    marked = SystemMessage("Be brief.", additional_kwargs={"__openai_role__": "developer"})
    assert from_langchain(marked) == Message(Role.DEVELOPER, "Be brief.")
    assert from_langchain(ChatMessage(content="Be brief.", role="developer")).role is Role.DEVELOPER
    assert from_langchain(SystemMessage("Be brief.")).role is Role.SYSTEM


# -- content parts -----------------------------------------------------------------------------

PNG = "data:image/png;base64,iVBORw0KGgo="
EVERY_PART = Message(
    Role.USER,
    (
        TextPart("What is on this receipt?"),
        ImagePart(PNG, detail="high"),
        ImagePart("https://example.com/cat.jpg"),
        ImagePart(None, file_id="file-img", media_type="image/png"),
        AudioPart("UklGRg==", "wav"),
        FilePart("data:application/pdf;base64,JVBERi0=", filename="receipt.pdf"),
        FilePart(None, url="https://example.com/terms.pdf", media_type="application/pdf"),
        FilePart(None, file_id="file-doc"),
        ReasoningPart("The total is at the bottom.", signature="sig", encrypted="gAAA"),
    ),
)


def test_each_part_is_a_standard_langchain_content_block() -> None:
    converted = to_langchain(EVERY_PART)
    assert converted.content == [
        {"type": "text", "text": "What is on this receipt?"},
        {
            "type": "image",
            "base64": "iVBORw0KGgo=",
            "mime_type": "image/png",
            "extras": {"detail": "high"},
        },
        {"type": "image", "url": "https://example.com/cat.jpg"},
        {"type": "image", "file_id": "file-img", "mime_type": "image/png"},
        {"type": "audio", "base64": "UklGRg==", "mime_type": "audio/wav"},
        {
            "type": "file",
            "base64": "JVBERi0=",
            "mime_type": "application/pdf",
            "extras": {"filename": "receipt.pdf"},
        },
        {"type": "file", "url": "https://example.com/terms.pdf", "mime_type": "application/pdf"},
        {"type": "file", "file_id": "file-doc"},
        {
            "type": "reasoning",
            "reasoning": "The total is at the bottom.",
            "extras": {"signature": "sig", "encrypted_content": "gAAA"},
        },
    ]
    assert ZERDA_KEY not in converted.additional_kwargs  # every part comes back from its block
    assert converted.content_blocks == converted.content  # LangChain reads them as standard
    assert from_langchain(converted) == EVERY_PART


def test_langchain_sends_the_blocks_as_zerda_would() -> None:
    """LangChain's own OpenAI conversion of the blocks is Zerda's ``to_openai``."""
    message = Message(
        Role.USER,
        (
            TextPart("Compare these."),
            ImagePart(PNG),
            ImagePart("https://example.com/cat.jpg"),
            AudioPart("UklGRg==", "wav"),
            FilePart("data:application/pdf;base64,JVBERi0=", filename="receipt.pdf"),
        ),
    )
    assert convert_to_openai_messages([to_langchain(message)]) == [message.to_openai()]


def test_openai_content_parts_are_read_and_go_back_in_their_shape() -> None:
    """LangChain users pass OpenAI's parts; an image_url keeps its shape, so its detail still
    reaches OpenAI (LangChain's standard image block loses it: langchain-ai/langchain#36297)."""
    original = HumanMessage(
        [
            "Look:",
            {
                "type": "image_url",
                "image_url": {"url": "https://example.com/a.png", "detail": "low"},
            },
            {"type": "image_url", "image_url": PNG},
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "mp3"}},
            {
                "type": "file",
                "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"},
            },
        ]
    )
    converted = from_langchain(original)
    assert [type(p) for p in converted.parts] == [
        TextPart,
        ImagePart,
        ImagePart,
        AudioPart,
        FilePart,
    ]
    assert converted.to_openai()["content"] == [
        {"type": "text", "text": "Look:"},
        {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}},
        {"type": "image_url", "image_url": {"url": PNG}},
        {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "mp3"}},
        {
            "type": "file",
            "file": {"file_data": "data:application/pdf;base64,JVBERi0=", "filename": "a.pdf"},
        },
    ]
    again = to_langchain(converted).content
    assert again == original.content  # each block in the shape it was given
    assert again[2] == {"type": "image_url", "image_url": PNG}
    # Without what LangChain gave (a Zerda message), a URL goes in OpenAI's full shape.
    changed = dataclasses.replace(converted, metadata={})
    assert to_langchain(changed).content[2] == {"type": "image_url", "image_url": {"url": PNG}}
    assert convert_to_openai_messages([to_langchain(changed)]) == [converted.to_openai()]
    assert from_langchain(to_langchain(converted)) == converted


def test_anthropic_thinking_blocks_keep_their_signature_and_their_shape() -> None:
    """ChatAnthropic's replies hold thinking blocks that must go back exactly as they came."""
    reply = AIMessage(
        [
            {"type": "thinking", "thinking": "Check the order first.", "signature": "EqQB"},
            {"type": "redacted_thinking", "data": "EmwKAh"},
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "order_status", "input": {"order": 42}},
        ],
        tool_calls=[{"name": "order_status", "args": {"order": 42}, "id": "toolu_1"}],
    )
    converted = from_langchain(reply)
    thinking, redacted, text = converted.parts
    assert (thinking.text, thinking.signature) == ("Check the order first.", "EqQB")  # type: ignore[union-attr]
    assert (redacted.text, redacted.encrypted) == ("", "EmwKAh")  # type: ignore[union-attr]
    assert text == TextPart("Let me look.")
    assert converted.tool_calls == (
        ToolCall(id="toolu_1", name="order_status", arguments='{"order": 42}'),
    )
    assert to_langchain(converted).content == reply.content  # the tool_use block too
    assert to_langchain(converted, include_zerda_fields=False) == reply


def test_langchain_03_data_blocks_are_read_as_standard_ones() -> None:
    converted = from_langchain(
        HumanMessage(
            [
                {"type": "image", "source_type": "url", "url": "https://example.com/a.png"},
                {
                    "type": "image",
                    "source_type": "base64",
                    "data": "iVBORw0KGgo=",
                    "mime_type": "image/png",
                },
                {"type": "file", "source_type": "id", "id": "file-1"},
            ]
        )
    )
    assert converted.parts == (
        ImagePart("https://example.com/a.png"),
        ImagePart(PNG),
        FilePart(None, file_id="file-1"),
    )


def test_block_fields_zerda_does_not_model_are_kept_in_the_part() -> None:
    block = {
        "type": "text",
        "text": "J'adore la programmation.",
        "id": "lc_1",
        "extras": {"signature": "EpoWCpc"},  # Gemini's thought signature on a text block
    }
    converted = from_langchain(AIMessage([block]))
    assert converted.parts == (
        TextPart(
            "J'adore la programmation.",
            extra={"langchain": {"id": "lc_1", "extras": {"signature": "EpoWCpc"}}},
        ),
    )
    assert to_langchain(converted).content == [block]


def test_what_a_block_cannot_hold_travels_in_the_bookkeeping() -> None:
    image = ImagePart(
        PNG, media_type="image/png", extra={"anthropic": {"cache_control": {"type": "ephemeral"}}}
    )
    message = Message(Role.USER, (TextPart("hi"), image))
    converted = to_langchain(message)
    assert converted.additional_kwargs[ZERDA_KEY] == {"parts": {"1": image.to_dict()}}
    assert from_langchain(converted) == message
    # Changed on LangChain's side, the block is read as it now is.
    converted.content[1] = {"type": "image", "url": "https://example.com/b.png"}  # type: ignore[index]
    assert from_langchain(converted).parts[1] == ImagePart("https://example.com/b.png")


@pytest.mark.parametrize(
    ("block", "words"),
    [
        (
            {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "x"}},
            "Anthropic-style image block",
        ),
        ({"type": "video", "url": "https://example.com/a.mp4"}, "'video' content block"),
        ({"type": "audio", "url": "https://example.com/a.wav"}, "Zerda keeps audio as data"),
        ({"type": "image", "base64": "iVBORw0KGgo="}, "needs its mime_type"),
        ({"type": "tool_use", "id": "t", "name": "f", "input": {}}, "'tool_use' content block"),
    ],
)
def test_blocks_zerda_cannot_keep_are_refused(block: Any, words: str) -> None:
    with pytest.raises(InvalidMessageError, match=words) as caught:
        from_langchain(HumanMessage(["ok", block]))
    assert "HumanMessage content block 1" in str(caught.value)


def test_a_history_keeps_parts_in_a_store(tmp_path: Path) -> None:
    memory = ConversationBufferMemory(store=SQLiteStore(tmp_path / "chat.db"), session_id="s")
    history = ZerdaChatMessageHistory(memory)
    asked = HumanMessage(
        [
            {"type": "text", "text": "What is this?"},
            {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
        ]
    )
    answered = AIMessage(
        [
            {"type": "thinking", "thinking": "A tiny PNG.", "signature": "EqQB"},
            {"type": "text", "text": "A one-pixel image."},
        ]
    )
    history.add_messages([asked, answered])
    reopened = ConversationBufferMemory(store=SQLiteStore(tmp_path / "chat.db"), session_id="s")
    shown = ZerdaChatMessageHistory(reopened).messages
    assert [m.content for m in shown] == [asked.content, answered.content]


def test_langchain_messages_convert_and_keep_their_fields() -> None:
    original: list[BaseMessage] = [
        SystemMessage("be brief"),
        HumanMessage("add 2 and 3", id="h1"),
        AIMessage(
            "",
            tool_calls=[{"name": "add", "args": {"a": 2, "b": 3}, "id": "t1", "type": "tool_call"}],
            response_metadata={"model_name": "fake"},
            id="a1",
        ),
        ToolMessage("boom", tool_call_id="t1", status="error"),
        AIMessage("5"),
    ]
    zerda_messages = from_langchain_messages(original)
    assert [m.role for m in zerda_messages] == ["system", "user", "assistant", "tool", "assistant"]
    assert zerda_messages[2].tool_calls == (
        ToolCall(id="t1", name="add", arguments='{"a": 2, "b": 3}'),
    )
    assert zerda_messages[2].metadata["langchain"] == {
        "id": "a1",
        "response_metadata": {"model_name": "fake"},
    }
    assert zerda_messages[3].metadata["langchain"] == {"status": "error"}
    again = to_langchain_messages(zerda_messages)
    for before, after in zip(original, again, strict=True):
        assert type(after) is type(before)
        assert (after.content, after.name, after.id) == (before.content, before.name, before.id)
        assert after.response_metadata == before.response_metadata
    assert again[2].tool_calls == original[2].tool_calls  # type: ignore[attr-defined]
    assert again[3].status == "error"  # type: ignore[attr-defined]


def test_content_lists_are_parts_and_tool_call_blocks_are_the_calls() -> None:
    message = AIMessage(
        [
            {"type": "text", "text": "Let me "},
            "check.",
            {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
        ],
        tool_calls=[{"name": "f", "args": {}, "id": "t1", "type": "tool_call"}],
    )
    converted = from_langchain(message)
    assert converted.content == (TextPart("Let me "), TextPart("check."))
    assert converted.text == "Let me \ncheck."
    assert converted.tool_calls == (ToolCall(id="t1", name="f", arguments="{}"),)
    only_calls = AIMessage(
        [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}],
        tool_calls=[{"name": "f", "args": {}, "id": "t1", "type": "tool_call"}],
    )
    assert from_langchain(only_calls).content == ""


def test_chat_message_with_a_known_role_converts() -> None:
    given = ChatMessage(content="hi", role="user")
    converted = from_langchain(given)
    assert (converted.role, converted.content) == (Role.USER, "hi")
    assert converted.metadata == {"langchain": {"role": "user"}}
    assert to_langchain(converted, include_zerda_fields=False) == given


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (ChatMessage(content="hi", role="critic"), "role 'critic'"),
        (FunctionMessage(content="1", name="f"), "FunctionMessage"),
        (HumanMessage([{"type": "video", "url": "x"}]), "'video' content block"),
    ],
)
def test_unsupported_messages_are_refused(message: BaseMessage, words: str) -> None:
    with pytest.raises(InvalidMessageError, match=words):
        from_langchain(message)


def test_wrong_argument_types_are_refused() -> None:
    with pytest.raises(InvalidMessageError):
        to_langchain({"role": "user", "content": "hi"})  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError):
        from_langchain(Message(Role.USER, "hi"))  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        ZerdaChatMessageHistory(InMemoryStore())  # type: ignore[arg-type]


# -- the history -------------------------------------------------------------------------------


def _turns(n: int) -> list[BaseMessage]:
    out: list[BaseMessage] = []
    for i in range(n):
        out += [HumanMessage(f"question {i}"), AIMessage(f"answer {i}")]
    return out


def test_history_is_a_base_chat_message_history_showing_the_window() -> None:
    memory = ConversationBufferWindowMemory(k=2)
    history = ZerdaChatMessageHistory(memory)
    assert isinstance(history, BaseChatMessageHistory)
    history.add_message(SystemMessage("be brief"))
    history.add_messages(_turns(4))
    shown = history.messages
    assert shown == to_langchain_messages(memory.get_context(), include_zerda_fields=False)
    assert [m.content for m in shown] == [
        "be brief",
        "question 2",
        "answer 2",
        "question 3",
        "answer 3",
    ]
    assert isinstance(shown[0], SystemMessage)
    assert isinstance(shown[1], HumanMessage)
    assert len(memory.get_history()) == 9
    with pytest.raises(AttributeError):
        history.messages = []
    history.clear()
    assert history.messages == []
    assert memory.get_history() == []


def test_tool_call_turns_survive_the_history() -> None:
    memory = ConversationBufferMemory()
    history = ZerdaChatMessageHistory(memory, include_zerda_fields=True)
    history.add_messages(to_langchain_messages(TOOL_TURN))
    assert from_langchain_messages(history.messages) == memory.get_context()
    assert [dataclasses_free(m) for m in memory.get_history()] == TOOL_TURN


def dataclasses_free(m: Message) -> Message:
    """``m`` without the time and id the memory stamped on it."""
    return dataclasses.replace(m, created_at=None, id=None)


def test_add_messages_is_one_batch() -> None:
    memory = ConversationBufferMemory()
    history = ZerdaChatMessageHistory(memory)
    with pytest.raises(InvalidMessageError):
        history.add_messages([HumanMessage("ok"), FunctionMessage(content="1", name="f")])
    assert memory.get_history() == []


def test_history_context_respects_a_token_budget() -> None:
    counter = ApproxCounter()
    memory = ConversationTokenBufferMemory(max_token_limit=120, token_counter=counter)
    history = ZerdaChatMessageHistory(memory)
    for i in range(20):
        history.add_messages([HumanMessage(f"question {i} " * 8), AIMessage(f"answer {i} " * 8)])
    shown = from_langchain_messages(history.messages)
    assert 0 < len(shown) < 40
    assert counter.count_messages(shown) <= 120
    assert shown[0].role is Role.USER
    assert shown[-1].content == "answer 19 " * 8
    assert len(memory.get_history()) == 40


# -- RunnableWithMessageHistory ----------------------------------------------------------------


def _chain(seen: list[list[BaseMessage]], replies: list[str]) -> Any:
    prompt = ChatPromptTemplate.from_messages(
        [("system", "You are terse."), MessagesPlaceholder("history"), ("human", "{input}")]
    )

    def spy(value: PromptValue) -> PromptValue:
        seen.append(value.to_messages())
        return value

    model = GenericFakeChatModel(messages=iter([AIMessage(r) for r in replies]))
    return prompt | RunnableLambda(spy) | model


def test_runnable_with_message_history_over_sqlite(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    store = SQLiteStore(db)

    def get_session_history(session_id: str) -> ZerdaChatMessageHistory:
        return ZerdaChatMessageHistory(
            ConversationBufferWindowMemory(k=2, store=store, session_id=session_id)
        )

    seen: list[list[BaseMessage]] = []
    chain = RunnableWithMessageHistory(
        _chain(seen, [f"reply {i}" for i in range(5)]),
        get_session_history,
        input_messages_key="input",
        history_messages_key="history",
    )
    config: Any = {"configurable": {"session_id": "alice"}}
    for i in range(5):
        out = chain.invoke({"input": f"message {i}"}, config=config)
        assert out.content == f"reply {i}"
    store.close()

    # The model saw the system prompt, the last two turns and the new message.
    assert [m.content for m in seen[0]] == ["You are terse.", "message 0"]
    assert [m.content for m in seen[4]] == [
        "You are terse.",
        "message 2",
        "reply 2",
        "message 3",
        "reply 3",
        "message 4",
    ]
    assert all(len(s) <= 6 for s in seen)
    # The store, opened afresh, holds every message.
    reopened = ConversationBufferWindowMemory(k=2, store=SQLiteStore(db), session_id="alice")
    history = reopened.get_history()
    assert [(m.role.value, m.content) for m in history] == [
        pair for i in range(5) for pair in (("user", f"message {i}"), ("assistant", f"reply {i}"))
    ]
    assert all(m.created_at is not None for m in history)
    assert reopened.get_context() == history[-4:]


def test_runnable_with_message_history_async_is_native(tmp_path: Path) -> None:
    async def run() -> tuple[list[list[BaseMessage]], list[Message]]:
        store = AsyncSQLiteStore(tmp_path / "chat.db")

        def get_session_history(session_id: str) -> ZerdaChatMessageHistory:
            memory = ConversationBufferWindowMemory(k=1, store=store, session_id=session_id)
            return ZerdaChatMessageHistory(memory)

        seen: list[list[BaseMessage]] = []
        chain = RunnableWithMessageHistory(
            _chain(seen, ["one", "two", "three"]),
            get_session_history,
            input_messages_key="input",
            history_messages_key="history",
        )
        config: Any = {"configurable": {"session_id": "bob"}}
        for word in ("a", "b", "c"):
            await chain.ainvoke({"input": word}, config=config)
        # An async store has no sync path: the history must have used the async methods.
        with pytest.raises(ZerdaError):
            _ = get_session_history("bob").messages
        history = get_session_history("bob")
        everything = await history.memory.aget_history()
        assert [m.content for m in await history.aget_messages()] == ["c", "three"]
        await history.aclear()
        assert await history.aget_messages() == []
        await store.aclose()
        return seen, everything

    seen, everything = asyncio.run(run())
    assert [m.content for m in seen[2]] == ["You are terse.", "b", "two", "c"]
    assert [m.content for m in everything] == ["a", "one", "b", "two", "c", "three"]


def test_token_budget_through_the_chain() -> None:
    counter = ApproxCounter()
    store = InMemoryStore()

    def get_session_history(session_id: str) -> ZerdaChatMessageHistory:
        memory = ConversationTokenBufferMemory(
            max_token_limit=60, token_counter=counter, store=store, session_id=session_id
        )
        return ZerdaChatMessageHistory(memory)

    seen: list[list[BaseMessage]] = []
    chain = RunnableWithMessageHistory(
        _chain(seen, ["long reply " * 10] * 6),
        get_session_history,
        input_messages_key="input",
        history_messages_key="history",
    )
    config: Any = {"configurable": {"session_id": "carol"}}
    for i in range(6):
        chain.invoke({"input": f"long question {i} " * 5}, config=config)
    for received in seen:
        past = from_langchain_messages(received[1:-1])  # between the system prompt and the input
        assert counter.count_messages(past) <= 60
    assert len(seen[-1]) < 2 + 10
    assert len(get_session_history("carol").memory.get_history()) == 12


def test_history_repr_and_session_id() -> None:
    history = ZerdaChatMessageHistory(ConversationBufferMemory(session_id="s1"))
    assert history.session_id == "s1"
    assert "s1" in repr(history)
    assert json.loads(json.dumps(history.messages)) == []


# -- a message read back is the message added --------------------------------------------------

ORDER_CALL = {"name": "order_status", "args": {"order": 42}, "id": "call_1", "type": "tool_call"}
USAGE = {"input_tokens": 12, "output_tokens": 3, "total_tokens": 15}
ASK = HumanMessage("Where is order 42?")

# Each case is a conversation whose context (a buffer memory's) is all of it, in order.
CONVERSATIONS: dict[str, list[BaseMessage]] = {
    "human": [ASK],
    "human-name-id-kwargs": [
        HumanMessage("hi", name="ann", id="msg-1", additional_kwargs={"trace": "t1", "x": None})
    ],
    "human-content-list": [
        HumanMessage(
            [
                "Look:",  # a bare string in a content list
                {"type": "text", "text": "what is on this receipt?", "id": "b1"},
                {"type": "image_url", "image_url": PNG},  # OpenAI's, with a bare URL
                {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
                {"type": "image", "url": "https://example.com/cat.jpg"},
                {
                    "type": "image",
                    "source_type": "base64",
                    "data": "iVBORw0KGgo=",
                    "mime_type": "image/png",
                },
                {
                    "type": "file",
                    "base64": "JVBERi0=",
                    "mime_type": "application/pdf",
                    "extras": {"filename": "receipt.pdf"},
                },
            ]
        )
    ],
    "human-empty-content-list": [HumanMessage([])],
    "ai": [
        ASK,
        AIMessage(
            "It shipped yesterday.",
            id="run-1",
            response_metadata={"model_name": "fake-1", "finish_reason": "stop"},
            usage_metadata=USAGE,  # type: ignore[arg-type]
        ),
    ],
    "ai-tool-calls": [
        ASK,
        AIMessage(
            "",
            tool_calls=[ORDER_CALL, {"name": "eta", "args": {}, "id": "call_2"}],  # type: ignore[list-item]
            id="run-2",
            usage_metadata=USAGE,  # type: ignore[arg-type]
        ),
        ToolMessage('{"status": "shipped"}', tool_call_id="call_1", name="order_status"),
        ToolMessage(
            "no eta", tool_call_id="call_2", status="error", artifact={"trace": ["eta", 1]}
        ),
        AIMessage("It shipped yesterday."),
    ],
    "ai-tool-call-blocks": [  # as ChatAnthropic answers: thinking, text and tool_use blocks
        ASK,
        AIMessage(
            [
                {"type": "thinking", "thinking": "Look it up.", "signature": "EqQB"},
                {"type": "text", "text": "Let me check."},
                {
                    "type": "tool_use",
                    "id": "call_1",
                    "name": "order_status",
                    "input": {"order": 42},
                },
            ],
            tool_calls=[ORDER_CALL],  # type: ignore[list-item]
        ),
        ToolMessage([{"type": "text", "text": "shipped"}], tool_call_id="call_1"),
        AIMessage([{"type": "text", "text": "It shipped."}]),
    ],
    "ai-invalid-tool-calls": [
        ASK,
        AIMessage(
            "",
            invalid_tool_calls=[
                {
                    "name": "order_status",
                    "args": '{"order": 4',
                    "id": "call_1",
                    "error": "Unterminated string",
                    "type": "invalid_tool_call",
                }
            ],
        ),
        ToolMessage("could not parse the arguments", tool_call_id="call_1", status="error"),
        AIMessage("Which order?"),
    ],
    "ai-openai-tool-calls-in-additional-kwargs": [
        ASK,
        AIMessage(
            "",
            additional_kwargs={
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "order_status", "arguments": '{"order": 42}'},
                    }
                ],
                "refusal": None,
            },
        ),
        ToolMessage("shipped", tool_call_id="call_1"),
        AIMessage("It shipped."),
    ],
    "system-and-developer": [
        SystemMessage("Be terse.", id="sys-1"),
        SystemMessage("Answer in French.", additional_kwargs={"__openai_role__": "developer"}),
        ASK,
    ],
    "chat-messages": [
        ChatMessage(role="user", content="hi"),
        ChatMessage(role="assistant", content="hello", name="bot"),
    ],
}


@pytest.fixture(params=STORES)
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    with opened_stores(request.param, tmp_path) as make:
        yield make


@pytest.fixture(params=ASYNC_STORES)
def make_async_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    with opened_stores(request.param, tmp_path) as make:
        yield make


def _history(store: Any, **options: Any) -> ZerdaChatMessageHistory:
    return ZerdaChatMessageHistory(
        ConversationBufferMemory(store=store, session_id="ann"), **options
    )


@pytest.mark.parametrize("case", CONVERSATIONS)
def test_messages_read_back_equal_those_added(case: str, make_store: Callable[[], Any]) -> None:
    added = CONVERSATIONS[case]
    _history(make_store()).add_messages(added)
    history = _history(make_store())  # another store object: read back from the store
    assert history.messages == added
    assert all(ZERDA_KEY not in m.additional_kwargs for m in history.messages)
    # Zerda stamped its own ids (a retry sends them again), which the messages do not show.
    assert all(m.id is not None for m in history.memory.get_history())


@pytest.mark.parametrize("case", CONVERSATIONS)
def test_messages_read_back_equal_those_added_async(
    case: str, make_async_store: Callable[[], Any]
) -> None:
    added = CONVERSATIONS[case]

    async def run() -> list[BaseMessage]:
        writer, reader = make_async_store(), make_async_store()
        await _history(writer).aadd_messages(added)
        shown = await _history(reader).aget_messages()
        for store in {id(writer): writer, id(reader): reader}.values():
            if hasattr(store, "aclose"):
                await store.aclose()
        return shown

    assert asyncio.run(run()) == added


def test_messages_added_one_at_a_time_read_back_equal() -> None:
    history = _history(InMemoryStore())
    added = CONVERSATIONS["ai-tool-calls"]
    for message in added:
        history.add_message(message)
    assert history.messages == added


def test_include_zerda_fields_shows_the_bookkeeping(make_store: Callable[[], Any]) -> None:
    added = CONVERSATIONS["ai-tool-calls"]
    _history(make_store()).add_messages(added)
    history = _history(make_store(), include_zerda_fields=True)
    shown = history.messages
    stored = history.memory.get_history()
    assert [m.additional_kwargs[ZERDA_KEY]["id"] for m in shown] == [m.id for m in stored]
    assert [m.additional_kwargs[ZERDA_KEY]["created_at"] for m in shown] == [
        m.created_at for m in stored
    ]
    assert shown != added
    # Without the bookkeeping, each is the message added.
    assert [_without_zerda(m) for m in shown] == added
    # Sent again (a retry), they are the messages stored: nothing is stored twice.
    history.add_messages(shown)
    assert history.memory.get_history() == stored
    assert from_langchain_messages(shown) == stored


def _without_zerda(message: BaseMessage) -> BaseMessage:
    kwargs = {k: v for k, v in message.additional_kwargs.items() if k != ZERDA_KEY}
    return message.model_copy(update={"additional_kwargs": kwargs})


def test_a_message_changed_in_zerda_is_shown_as_it_now_is() -> None:
    """What LangChain gave is kept only while the Zerda message still says the same."""
    given = HumanMessage(["Look:", {"type": "text", "text": "the receipt"}], id="h1")
    converted = from_langchain(given)
    assert to_langchain(converted, include_zerda_fields=False) == given
    changed = dataclasses.replace(converted, content=(TextPart("Look again"),))
    shown = to_langchain(changed, include_zerda_fields=False)
    assert shown.content == [{"type": "text", "text": "Look again"}]
    assert shown.id == "h1"  # the fields that do not depend on the content stay
    call = AIMessage("", invalid_tool_calls=[{"name": "f", "args": "{", "id": "c", "error": "x"}])
    fewer = dataclasses.replace(from_langchain(call), tool_calls=(), content="done")
    assert to_langchain(fewer, include_zerda_fields=False) == AIMessage("done")


def test_what_a_store_cannot_keep_is_left_out_and_the_rest_kept() -> None:
    given = HumanMessage("hi", additional_kwargs={"client": object(), "trace": "t1"})
    shown = to_langchain(from_langchain(given), include_zerda_fields=False)
    assert shown.additional_kwargs == {"trace": "t1"}


# -- RunnableWithMessageHistory: what it reads back is what it added ---------------------------


class RecordingHistory(ZerdaChatMessageHistory):
    """A history that records every message LangChain adds to it, in order."""

    added: list[BaseMessage]

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.added.extend(messages)
        super().add_messages(messages)

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.added.extend(messages)
        await super().aadd_messages(messages)


def _tool_chain(store: Any, added: list[BaseMessage]) -> Any:
    """A chat model that calls a tool, then answers, behind RunnableWithMessageHistory."""

    def get_session_history(session_id: str) -> RecordingHistory:
        history = RecordingHistory(ConversationBufferMemory(store=store, session_id=session_id))
        history.added = added
        return history

    model = GenericFakeChatModel(
        messages=iter(
            [
                AIMessage("", tool_calls=[ORDER_CALL]),  # type: ignore[list-item]
                AIMessage("It shipped yesterday.", response_metadata={"finish_reason": "stop"}),
            ]
        )
    )
    return RunnableWithMessageHistory(model, get_session_history)


def test_runnable_with_message_history_reads_back_what_it_added(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "chat.db")
    added: list[BaseMessage] = []
    chain = _tool_chain(store, added)
    config: Any = {"configurable": {"session_id": "ann"}}
    chain.invoke([HumanMessage("Where is order 42?")], config=config)
    chain.invoke([ToolMessage('{"status": "shipped"}', tool_call_id="call_1")], config=config)
    assert [type(m) for m in added] == [HumanMessage, AIMessage, ToolMessage, AIMessage]
    assert added[1].id is not None  # LangChain's run id, kept
    assert _history(SQLiteStore(tmp_path / "chat.db")).messages == added
    store.close()


def test_runnable_with_message_history_async_reads_back_what_it_added(tmp_path: Path) -> None:
    async def run() -> tuple[list[BaseMessage], list[BaseMessage]]:
        store = AsyncSQLiteStore(tmp_path / "chat.db")
        added: list[BaseMessage] = []
        chain = _tool_chain(store, added)
        config: Any = {"configurable": {"session_id": "ann"}}
        await chain.ainvoke([HumanMessage("Where is order 42?")], config=config)
        await chain.ainvoke(
            [ToolMessage('{"status": "shipped"}', tool_call_id="call_1")], config=config
        )
        shown = await _history(store).aget_messages()
        await store.aclose()
        return added, shown

    added, shown = asyncio.run(run())
    assert len(added) == 4
    assert shown == added
