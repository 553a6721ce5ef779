"""The LangChain integration: lossless conversion and a chat message history over any memory."""

from __future__ import annotations

import asyncio
import json
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

from test_integrations import messages_with_parts_st
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
    assert again[1] == original.content[1]
    assert again[2] == {"type": "image_url", "image_url": {"url": PNG}}
    assert convert_to_openai_messages([to_langchain(converted)]) == [converted.to_openai()]
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
    assert to_langchain(converted).content == reply.content[:3]


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
    assert from_langchain(ChatMessage(content="hi", role="user")) == Message(Role.USER, "hi")


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
    assert shown == to_langchain_messages(memory.get_context())
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
    history = ZerdaChatMessageHistory(memory)
    history.add_messages(to_langchain_messages(TOOL_TURN))
    assert from_langchain_messages(history.messages) == memory.get_context()
    assert [dataclasses_free(m) for m in memory.get_history()] == TOOL_TURN


def dataclasses_free(m: Message) -> Message:
    """``m`` without the time and id the memory stamped on it."""
    import dataclasses

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
