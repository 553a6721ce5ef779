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

from hypothesis import given
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
from langchain_core.prompt_values import PromptValue
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.runnables import RunnableLambda
from langchain_core.runnables.history import RunnableWithMessageHistory

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
    ZerdaChatMessageHistory,
    from_langchain,
    from_langchain_messages,
    to_langchain,
    to_langchain_messages,
)
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


@given(messages_st())
def test_any_message_round_trips(message: Message) -> None:
    assert from_langchain(to_langchain(message)) == message


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


def test_text_parts_are_joined() -> None:
    message = AIMessage(
        [
            {"type": "text", "text": "Let me "},
            "check.",
            {"type": "tool_use", "id": "t1", "name": "f", "input": {}},
        ],
        tool_calls=[{"name": "f", "args": {}, "id": "t1", "type": "tool_call"}],
    )
    converted = from_langchain(message)
    assert converted.content == "Let me check."
    assert converted.tool_calls == (ToolCall(id="t1", name="f", arguments="{}"),)


def test_chat_message_with_a_known_role_converts() -> None:
    assert from_langchain(ChatMessage(content="hi", role="user")) == Message(Role.USER, "hi")


@pytest.mark.parametrize(
    ("message", "words"),
    [
        (ChatMessage(content="hi", role="critic"), "role 'critic'"),
        (FunctionMessage(content="1", name="f"), "FunctionMessage"),
        (HumanMessage([{"type": "image_url", "image_url": {"url": "x"}}]), "'image_url'"),
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
