"""The OpenAI Agents SDK integration: ZerdaSession is the SDK's Session over any Zerda store.

The first part ports the SDK's own session tests (openai-agents-python, tests/memory/
test_session.py and test_session_limit.py) to ZerdaSession over every kind of store; the rest
pins what Zerda adds: items read back exactly, pops that never give an item twice, runs that
survive a restart, the compaction hooks, and the model's input chosen by a Zerda memory.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("agents", reason="the openai-agents extra (openai-agents) is not installed")

from agents import (
    Agent,
    RunConfig,
    Runner,
    Session,
    SessionSettings,
    SQLiteSession,
    Usage,
    function_tool,
)
from agents.items import ModelResponse, TResponseInputItem
from agents.memory import OpenAIResponsesCompactionSession
from agents.models.interface import Model
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputItem,
    ResponseOutputMessage,
    ResponseOutputText,
    ResponseReasoningItem,
)
from openai.types.responses.response_reasoning_item import Summary

from _processes import run_processes
from test_integrations import ASYNC_STORES, _run, opened_stores
from zerda import (
    ApproxCounter,
    ConfigurationError,
    ContextOverflowError,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationTokenBufferMemory,
    InvalidMessageError,
    InvalidSessionIdError,
    Message,
    ReasoningPart,
    Role,
    StoreUnavailableError,
    ToolCall,
)
from zerda.formats import from_responses
from zerda.integrations.openai_agents import METADATA_KEY, ZerdaSession
from zerda.memory._record import SUMMARY_KEY
from zerda.stores import AsyncSQLiteStore, InMemoryStore, SQLiteStore

COUNTER = ApproxCounter()
NO_TRACING = RunConfig(tracing_disabled=True)

# -- a scripted model, the SDK's Model interface ----------------------------------------------


class ScriptedModel(Model):
    """Answers each call with the next scripted output and records what it was sent."""

    def __init__(self, *replies: list[ResponseOutputItem]) -> None:
        self.replies = list(replies)
        self.inputs: list[list[Any]] = []

    def enqueue(self, *replies: list[ResponseOutputItem]) -> None:
        self.replies.extend(replies)

    async def get_response(
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: Any,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        self.inputs.append(copy.deepcopy(list(input)))
        assert self.replies, "the model was called more often than scripted"
        n = len(self.inputs)
        return ModelResponse(output=self.replies.pop(0), usage=Usage(), response_id=f"resp_{n}")

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError("the tests run the agent without streaming")


def text(content: str, id: str = "msg_1") -> ResponseOutputMessage:
    return ResponseOutputMessage(
        id=id,
        type="message",
        role="assistant",
        status="completed",
        content=[ResponseOutputText(text=content, type="output_text", annotations=[], logprobs=[])],
    )


def call(call_id: str, city: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(
        id=f"fc_{call_id}",
        call_id=call_id,
        type="function_call",
        name="weather",
        arguments=json.dumps({"city": city}),
    )


def thought(id: str) -> ResponseReasoningItem:
    return ResponseReasoningItem(
        id=id,
        type="reasoning",
        summary=[Summary(text=f"{id}: look it up", type="summary_text")],
        encrypted_content=f"opaque-{id}",
    )


@function_tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


async def run(agent: Agent[Any], text_or_items: Any, session: Session, **config: Any) -> str:
    result = await Runner.run(
        agent, text_or_items, session=session, run_config=RunConfig(tracing_disabled=True, **config)
    )
    return str(result.final_output)


def user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: str) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


# -- sessions over every kind of store --------------------------------------------------------

KINDS = ["memory", "sqlite", "async-sqlite", "json", "redis", "postgres"]


def on_stores(
    kind: str, tmp_path: Path, test: Callable[[Callable[..., ZerdaSession]], Awaitable[None]]
) -> None:
    """Run ``test(session)`` in an event loop: ``session(session_id="s", **options)`` makes a
    ZerdaSession over a new store of ``kind`` reaching the same data each time."""

    async def main() -> None:
        with opened_stores(kind, tmp_path) as stores:
            made: list[Any] = []

            def session(session_id: str = "s", **options: Any) -> ZerdaSession:
                made.append(stores())
                return ZerdaSession(session_id, store=made[-1], **options)

            try:
                await test(session)
            finally:
                if kind.startswith("async"):
                    for store in made:
                        await store.aclose()

    asyncio.run(main())


# -- the SDK's session tests, ported ----------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_add_get_and_clear(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        s = session("direct_test")
        items = [user("Hello"), assistant("Hi there!")]
        await s.add_items(items)
        assert await s.get_items() == items
        assert await session("direct_test").get_items() == items  # from the store itself
        await s.clear_session()
        assert await s.get_items() == []
        await s.add_items([])
        assert await s.get_items() == []

    on_stores(kind, tmp_path, test)


@pytest.mark.parametrize("kind", KINDS)
def test_pop_item_takes_the_newest_until_none(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        s = session("pop_test")
        assert await s.pop_item() is None
        items = [user("Hello"), assistant("Hi there!"), user("How are you?")]
        await s.add_items(items)
        assert await s.pop_item() == items[2]
        assert await s.get_items() == items[:2]
        assert await s.pop_item() == items[1]
        assert await s.pop_item() == items[0]
        assert await s.pop_item() is None
        assert await s.get_items() == []

    on_stores(kind, tmp_path, test)


@pytest.mark.parametrize("kind", KINDS)
def test_pop_and_items_stay_in_their_session(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        one, two = session("session_1"), session("session_2")
        await one.add_items([user("Session 1 message")])
        await two.add_items([user("Session 2 message 1"), user("Session 2 message 2")])
        assert await two.pop_item() == user("Session 2 message 2")
        assert await one.get_items() == [user("Session 1 message")]
        assert await two.get_items() == [user("Session 2 message 1")]

    on_stores(kind, tmp_path, test)


@pytest.mark.parametrize("kind", KINDS)
def test_get_items_with_limit(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        s = session("count_test")
        items = [m(f"{who} {i}") for i in (1, 2, 3) for who, m in (("M", user), ("R", assistant))]
        await s.add_items(items)
        assert await s.get_items() == items
        assert await s.get_items(limit=2) == items[-2:]
        assert await s.get_items(limit=4) == items[-4:]
        assert await s.get_items(limit=1) == items[-1:]
        assert await s.get_items(limit=10) == items
        assert await s.get_items(limit=0) == []
        assert await s.get_items(limit=-3) == []

    on_stores(kind, tmp_path, test)


@pytest.mark.parametrize("kind", KINDS)
def test_content_is_kept_exactly(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        s = session("special_chars_test")
        items = [
            user("こんにちは"),
            assistant("😊👍"),
            user("Привет"),
            user("O'Reilly"),
            assistant("DROP TABLE sessions;"),
            user('"SELECT * FROM users WHERE name = "admin";"'),
            assistant("Robert'); DROP TABLE students;--"),
        ]
        await s.add_items(items)
        assert await session("special_chars_test").get_items() == items

    on_stores(kind, tmp_path, test)


def test_session_settings_default_to_the_sdks() -> None:
    assert isinstance(ZerdaSession("s").session_settings, SessionSettings)
    assert ZerdaSession("s").session_settings == SessionSettings()
    given = ZerdaSession("s", session_settings=SessionSettings(limit=5))
    assert given.session_settings == SessionSettings(limit=5)
    from_dict = ZerdaSession("s", session_settings={"limit": 0})
    assert from_dict.session_settings == SessionSettings(limit=0)
    assert from_dict.session_settings.resolve({"limit": 4}).limit == 4
    with pytest.raises(TypeError, match="Unknown session settings: limitt"):
        ZerdaSession("s", session_settings={"limitt": 1})


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_session_settings_limit_is_the_default_and_a_limit_overrides_it(
    kind: str, tmp_path: Path
) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        items = [user(f"Message {i}") for i in range(10)]
        s = session("settings", session_settings=SessionSettings(limit=3))
        await s.add_items(items)
        assert await s.get_items() == items[-3:]
        assert await s.get_items(limit=2) == items[-2:]
        s.session_settings = None
        assert await s.get_items() == items

    on_stores(kind, tmp_path, test)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis", "postgres"])
def test_items_added_from_many_threads_are_all_kept(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        items = [user(f"Message {i}") for i in range(40)]
        barrier = threading.Barrier(5)
        sessions = [session("concurrent_test") for _ in range(5)]

        def add(w: int) -> None:
            barrier.wait(30)
            for item in items[w::5]:
                asyncio.run(sessions[w].add_items([item]))

        threads = [threading.Thread(target=add, args=(w,)) for w in range(5)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        stored = await session("concurrent_test").get_items()
        assert sorted(i["content"] for i in stored) == sorted(i["content"] for i in items)
        for w in range(5):  # each writer's items in the order it wrote them
            assert [i for i in stored if i in items[w::5]] == items[w::5]

    on_stores(kind, tmp_path, test)


@pytest.mark.parametrize("runner", ["run", "run_sync"])
def test_a_run_sees_the_history_of_its_session_only(runner: str) -> None:
    async def go(agent: Agent[Any], said: str, session: Session) -> str:
        if runner == "run":
            return await run(agent, said, session)
        result = await asyncio.to_thread(
            Runner.run_sync, agent, said, session=session, run_config=NO_TRACING
        )
        return str(result.final_output)

    async def main() -> None:
        store = InMemoryStore()
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        cats, dogs = ZerdaSession("cats", store=store), ZerdaSession("dogs", store=store)
        model.enqueue([text("I like cats")], [text("I like dogs")], [text("You said cats")])
        assert await go(agent, "I like cats", cats) == "I like cats"
        assert await go(agent, "I like dogs", dogs) == "I like dogs"
        assert await go(agent, "What did I say I like?", cats) == "You said cats"
        assert model.inputs[-1] == [
            user("I like cats"),
            (await cats.get_items())[1],
            user("What did I say I like?"),
        ]
        assert len(await dogs.get_items()) == 2
        model.enqueue([text("I don't remember")])
        result = await Runner.run(agent, "Do you remember?", run_config=NO_TRACING)
        assert result.final_output == "I don't remember"
        assert model.inputs[-1] == [user("Do you remember?")]

    asyncio.run(main())


def test_a_list_input_is_appended_to_the_history() -> None:
    async def main() -> None:
        session = ZerdaSession("list_input")
        history = [user("Earlier message"), assistant("Saved reply")]
        await session.add_items(history)
        model = ScriptedModel([text("This should run")])
        await run(Agent(name="test", model=model), [user("Test message")], session)
        assert model.inputs[-1] == [*history, user("Test message")]

    asyncio.run(main())


def test_a_callback_prepares_the_input_and_only_new_input_is_stored() -> None:
    async def main() -> None:
        session = ZerdaSession("callback")
        history = [user("Hello there."), assistant("Hi, I'm here to assist you.")]
        await session.add_items(history)

        def users_only(old: list[Any], new: list[Any]) -> list[Any]:
            return [item for item in old if item["role"] == "user"] + new

        model = ScriptedModel([text("I'm gpt-4o")])
        agent = Agent(name="test", model=model)
        await run(agent, [user("What your name?")], session, session_input_callback=users_only)
        assert model.inputs[-1] == [history[0], user("What your name?")]

        def repeat_first(old: list[Any], new: list[Any]) -> list[Any]:
            return [*old, old[0], *new] if old else new

        repeated = ZerdaSession("repeat")
        for turn in range(3):
            model.enqueue([text(f"assistant {turn}")])
            await run(agent, f"user {turn}", repeated, session_input_callback=repeat_first)
        stored = await repeated.get_items()
        assert [i["content"] for i in stored if i.get("role") == "user"] == [
            "user 0",
            "user 1",
            "user 2",
        ]
        assert len(stored) == 6

    asyncio.run(main())


def test_run_config_session_limit() -> None:
    async def main() -> None:
        session = ZerdaSession("limit_test")
        model = ScriptedModel()
        agent = Agent(name="test", model=model)
        for i in (1, 2, 3):
            model.enqueue([text(f"Reply {i}")])
            await run(agent, f"Message {i}", session)
        assert len(await session.get_items()) == 6
        model.enqueue([text("Reply 4")], [text("Reply 5")], [text("Reply 6")])
        await run(agent, "Message 4", session, session_settings=SessionSettings(limit=2))
        got = model.inputs[-1]
        assert [got[0]["content"], got[1]["content"][0]["text"], got[2]["content"]] == [
            "Message 3",
            "Reply 3",
            "Message 4",
        ]
        await run(agent, "Message 5", session, session_settings=SessionSettings(limit=0))
        assert model.inputs[-1] == [user("Message 5")]
        await run(agent, "Message 6", session, session_settings=SessionSettings(limit=100))
        assert len(model.inputs[-1]) == 11

    asyncio.run(main())


def test_a_limit_drops_an_output_whose_call_it_cut() -> None:
    async def main() -> None:
        session = ZerdaSession("limit_tool_pair")
        history = [
            user("What is the weather?"),
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "get_weather",
                "arguments": "{}",
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "It is sunny.", "annotations": []}],
            },
        ]
        await session.add_items(history)
        assert await session.get_items(limit=2) == history[-2:]
        model = ScriptedModel([text("Tomorrow is sunny too.")])
        settings = SessionSettings(limit=2)
        await run(
            Agent(name="test", model=model), "And tomorrow?", session, session_settings=settings
        )
        assert model.inputs[-1] == [history[-1], user("And tomorrow?")]

    asyncio.run(main())


# -- every kind of item reads back as it was written ---------------------------------------------

ITEMS: list[dict[str, Any]] = [
    user("Hello"),
    {
        "type": "message",
        "role": "user",
        "id": "msg_u1",
        "content": [
            {"type": "input_text", "text": "What is in these?"},
            {
                "type": "input_image",
                "image_url": "data:image/png;base64,iVBORw0KGgo=",
                "detail": "low",
            },
            {"type": "input_image", "file_id": "file-img", "detail": "auto"},
            {"type": "input_file", "file_id": "file-abc", "filename": "report.pdf"},
            {
                "type": "input_file",
                "file_data": "data:application/pdf;base64,JVBERi0=",
                "filename": "a.pdf",
            },
            {"type": "input_file", "file_url": "https://example.com/a.pdf"},
        ],
    },
    {"type": "message", "role": "system", "content": "Be brief."},
    {
        "type": "message",
        "role": "developer",
        "content": [{"type": "input_text", "text": "French."}],
    },
    {
        "id": "rs_1",
        "type": "reasoning",
        "summary": [{"type": "summary_text", "text": "Look it up."}],
        "encrypted_content": "gAAAAB-opaque",
    },
    {
        "id": "rs_2",
        "type": "reasoning",
        "summary": [],
        "encrypted_content": "enc",
        "content": [{"type": "reasoning_text", "text": "raw"}],
        "status": "completed",
    },
    {
        "arguments": '{"city": "Paris"}',
        "call_id": "call_1",
        "name": "weather",
        "type": "function_call",
        "id": "fc_1",
        "status": "completed",
    },
    {"call_id": "call_1", "output": "sunny", "type": "function_call_output"},
    {
        "type": "function_call_output",
        "call_id": "call_2",
        "id": "fco_2",
        "status": "completed",
        "output": [
            {"type": "input_text", "text": "the chart:"},
            {"type": "input_image", "image_url": "https://example.com/c.png"},
        ],
    },
    {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [
            {
                "type": "output_text",
                "text": "It is sunny.",
                "annotations": [
                    {
                        "type": "url_citation",
                        "url": "https://w.example",
                        "title": "W",
                        "start_index": 0,
                        "end_index": 5,
                    }
                ],
                "logprobs": [],
            },
            {"type": "refusal", "refusal": "No more."},
        ],
    },
    assistant("Plain reply."),
    assistant(""),
    # Items Zerda does not model: stored as given.
    {"type": "item_reference", "id": "msg_0"},
    {
        "id": "ws_1",
        "type": "web_search_call",
        "status": "completed",
        "action": {"type": "search", "query": "weather"},
    },
    {
        "id": "cu_1",
        "type": "computer_call",
        "call_id": "cc_1",
        "action": {"type": "click", "x": 1, "y": 2, "button": "left"},
        "pending_safety_checks": [],
        "status": "completed",
    },
    {
        "type": "computer_call_output",
        "call_id": "cc_1",
        "output": {
            "type": "computer_screenshot",
            "image_url": "data:image/png;base64," + "A" * 4000,
        },
    },
    {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "docs", "tools": [{"name": "q"}]},
    {"type": "compaction", "id": "cmp_1", "encrypted_content": "SUMMARY"},
    {"type": "custom_tool_call", "call_id": "ct_1", "name": "grammar", "input": "x+y"},
    {"type": "custom_tool_call_output", "call_id": "ct_1", "output": "ok"},
    {
        "type": "message",
        "role": "user",
        "content": [{"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}],
    },
    {"type": "function_call", "call_id": 7, "name": "bad"},  # not one Zerda reads
    {"type": "future_item", "nested": {"deep": [1, 2.5, None, True, {"k": "v"}]}, "u": "é 😊"},
]


@pytest.mark.parametrize("kind", ASYNC_STORES)
def test_every_kind_of_item_reads_back_equal_in_order(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        s = session("items")
        await s.add_items(copy.deepcopy(ITEMS))
        assert await session("items").get_items() == ITEMS
        for n in (1, 5, len(ITEMS)):
            assert await s.get_items(limit=n) == ITEMS[-n:]
        popped = [await s.pop_item() for _ in ITEMS]
        assert popped == ITEMS[::-1]

    on_stores(kind, tmp_path, test)


@pytest.mark.parametrize("kind", ["memory", "sqlite", "json", "redis"])
def test_items_keep_their_key_order(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        await session("order").add_items(ITEMS)
        got = await session("order").get_items()
        assert [json.dumps(i) for i in got] == [json.dumps(i) for i in ITEMS]

    on_stores(kind, tmp_path, test)


def test_each_item_is_a_zerda_message_that_the_memories_read() -> None:
    async def main() -> None:
        store = InMemoryStore()
        await ZerdaSession("s", store=store).add_items(ITEMS)
        history = store.history("s")
        assert len(history) == len(ITEMS)  # one message an item, in order
        for item, m in zip(ITEMS, history, strict=True):
            assert m.metadata[METADATA_KEY] == {"item": item}
        roles = [m.role for m in history]
        assert roles[:4] == [Role.USER, Role.USER, Role.SYSTEM, Role.DEVELOPER]
        reasoning = history[4].content
        assert isinstance(reasoning, tuple)
        assert isinstance(reasoning[0], ReasoningPart)
        assert reasoning[0].encrypted == "gAAAAB-opaque"
        assert history[6].tool_calls == (
            ToolCall(
                "call_1",
                "weather",
                '{"city": "Paris"}',
                extra={"responses": {"id": "fc_1", "status": "completed"}},
            ),
        )
        assert (history[7].role, history[7].tool_call_id, history[7].content) == (
            Role.TOOL,
            "call_1",
            "sunny",
        )
        # What Zerda does not model: shown as its JSON (its inline data left out), a user
        # message when the item is the user's, so that it still opens a turn.
        screenshot = history[[i.get("type") for i in ITEMS].index("computer_call_output")]
        assert screenshot.role is Role.ASSISTANT
        assert "<4000 characters>" in screenshot.text
        assert "AAAA" not in screenshot.text
        audio = history[-3]
        assert audio.role is Role.USER
        assert "input_audio" in audio.text
        assert all(m.role is not Role.TOOL for m in history[12:])
        # Zerda's memories read the session: whole turns, the pinned messages first.
        context = ConversationBufferWindowMemory(k=1, store=store, session_id="s").get_context()
        assert [m.role for m in context[:2]] == [Role.SYSTEM, Role.DEVELOPER]
        assert context[2].role is Role.USER

    asyncio.run(main())


def test_an_item_no_store_can_hold_is_refused_and_nothing_of_its_batch_is_kept() -> None:
    async def main() -> None:
        session = ZerdaSession("s")
        await session.add_items([user("kept")])
        for bad in (
            {"type": "message", "role": "user", "content": float("nan")},
            {"role": "user", "content": "\ud800"},
            {"role": "user", "content": object()},
            "just text",
        ):
            with pytest.raises(InvalidMessageError, match=r"add_items: items\[1\]"):
                await session.add_items([user("lost"), bad])  # type: ignore[list-item]
        assert await session.get_items() == [user("kept")]

    asyncio.run(main())


def test_items_read_are_copies() -> None:
    async def main() -> None:
        session = ZerdaSession("s")
        item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]}
        await session.add_items([item])
        item["content"][0]["text"] = "changed by the caller"
        got = await session.get_items()
        got[0]["content"][0]["text"] = "changed again"
        assert await session.get_items() == [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"}]}
        ]

    asyncio.run(main())


def test_a_message_edited_on_zerdas_side_reads_as_it_now_is() -> None:
    async def main() -> None:
        memory = ConversationBufferMemory(session_id="s")
        session = ZerdaSession("s", memory=memory)
        await session.add_items([user("my card is 4111"), assistant("Noted.")])
        first = memory.get_history()[0]
        assert first.id is not None
        memory.edit_message(first.id, "my card is [removed]")
        assert await session.get_items() == [user("my card is [removed]"), assistant("Noted.")]
        assert "card is 4111" not in json.dumps(await session.get_items())

    asyncio.run(main())


def test_messages_written_by_other_code_read_as_their_items() -> None:
    async def main() -> None:
        memory = ConversationBufferMemory(session_id="s")
        memory.add_messages(
            [
                Message(Role.SYSTEM, "Be brief."),
                Message(Role.USER, "weather?"),
                Message(Role.ASSISTANT, "Checking.", tool_calls=(ToolCall("c1", "weather", "{}"),)),
                Message(Role.TOOL, "sunny", tool_call_id="c1"),
            ]
        )
        session = ZerdaSession("s", memory=memory)
        items = await session.get_items()
        assert [i.get("type") for i in items] == [
            "message",
            "message",
            "message",
            "function_call",
            "function_call_output",
        ]
        assert items[3] == {
            "type": "function_call",
            "call_id": "c1",
            "name": "weather",
            "arguments": "{}",
        }
        assert await session.get_items(limit=3) == items[-3:]
        assert await session.pop_item() == items[4]
        # The assistant message reads as two items: popping the call leaves its text.
        assert await session.pop_item() == items[3]
        assert await session.get_items() == items[:3]
        assert await session.pop_item() == items[2]
        assert [m.text for m in memory.get_history()] == ["Be brief.", "weather?"]

    asyncio.run(main())


def test_system_items_keep_their_place() -> None:
    async def main() -> None:
        session = ZerdaSession("s")
        items = [
            user("a"),
            {"role": "developer", "content": "new rule"},
            assistant("b"),
            {"role": "system", "content": "late system"},
        ]
        await session.add_items(items)
        assert await session.get_items() == items
        assert await session.get_items(limit=2) == items[-2:]
        assert await session.pop_item() == items[3]
        assert await session.pop_item() == items[2]
        assert await session.get_items() == items[:2]

    asyncio.run(main())


def test_popping_a_reused_call_id_leaves_older_results() -> None:
    """A model that numbers its calls call_0 each turn: the newest call goes alone."""

    async def main() -> None:
        session = ZerdaSession("s")
        first = [
            user("a"),
            {"type": "function_call", "call_id": "call_0", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "call_0", "output": "1"},
        ]
        second = [
            user("b"),
            {"type": "function_call", "call_id": "call_0", "name": "f", "arguments": "{}"},
        ]
        await session.add_items([*first, *second])
        assert await session.pop_item() == second[1]
        assert await session.get_items() == [*first, second[0]]

    asyncio.run(main())


def test_a_pop_forgets_a_summary_made_of_the_item() -> None:
    async def main() -> None:
        store = InMemoryStore()
        session = ZerdaSession("s", store=store)
        await session.add_items([user("one"), assistant("1"), user("two"), assistant("2")])
        summary = {"text": "one, 1, two, 2", "turns": 2, "updated_at": 1.0}
        assert store.compare_and_set("s", SUMMARY_KEY, None, summary)
        await session.pop_item()
        assert store.get_metadata("s")[SUMMARY_KEY]["turns"] == 0
        assert "2" not in store.get_metadata("s")[SUMMARY_KEY]["text"]

    asyncio.run(main())


# -- pops never give an item twice -------------------------------------------------------------

N_POPPED = 60


def _items(n: int) -> list[dict[str, Any]]:
    return [user(f"item {i}") if i % 2 else assistant(f"item {i}") for i in range(n)]


class RacingStore(InMemoryStore):
    """Holds the next ``n`` tail reads until all ``n`` are made (``race(n)``): that many pops
    read the same newest item before any of them deletes it."""

    def __init__(self) -> None:
        super().__init__()
        self.held = 0
        self.arrived = 0
        self.all_read = threading.Event()
        self.lock = threading.Lock()

    def race(self, n: int) -> None:
        self.held, self.arrived = n, 0
        self.all_read.clear()

    def _arrive(self) -> bool:
        with self.lock:
            if self.arrived >= self.held:
                return False
            self.arrived += 1
            if self.arrived == self.held:
                self.all_read.set()
            return True

    def tail(self, *args: Any, **kwargs: Any) -> Any:
        read = super().tail(*args, **kwargs)
        if self._arrive():
            assert self.all_read.wait(30)
        return read

    async def atail(self, *args: Any, **kwargs: Any) -> Any:
        read = super().tail(*args, **kwargs)
        if self._arrive():  # wait in a thread, so that the other tasks run
            assert await asyncio.to_thread(self.all_read.wait, 30)
        return read


def test_two_pops_that_read_the_same_newest_item_take_two_items() -> None:
    async def main() -> None:
        store = RacingStore()
        await ZerdaSession("s", store=store).add_items([user("one"), user("two"), user("three")])
        # From two threads, each with its own session and event loop ...
        store.race(2)
        got: list[Any] = [None, None]

        def pop(w: int) -> None:
            got[w] = asyncio.run(ZerdaSession("s", store=store).pop_item())

        threads = [threading.Thread(target=pop, args=(w,)) for w in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(i["content"] for i in got) == ["three", "two"]
        # ... and from two tasks of one loop.
        await ZerdaSession("s", store=store).add_items([user("two"), user("three")])
        store.race(2)
        session = ZerdaSession("s", store=store)
        both = await asyncio.gather(session.pop_item(), session.pop_item())
        assert sorted(i["content"] for i in both) == ["three", "two"]
        assert await session.get_items() == [user("one")]

    asyncio.run(main())


@pytest.mark.parametrize("kind", ["sqlite", "redis", "postgres"])
def test_pops_from_many_threads_take_each_item_once(kind: str, tmp_path: Path) -> None:
    async def test(session: Callable[..., ZerdaSession]) -> None:
        items = _items(N_POPPED)
        await session().add_items(items)
        sessions = [session() for _ in range(6)]
        barrier = threading.Barrier(len(sessions))
        popped: list[list[Any]] = [[] for _ in sessions]

        def pop_all(w: int) -> None:
            async def pops() -> None:
                while (item := await sessions[w].pop_item()) is not None:
                    popped[w].append(item)

            barrier.wait(30)
            asyncio.run(pops())

        threads = [threading.Thread(target=pop_all, args=(w,)) for w in range(len(sessions))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        everything = [item for each in popped for item in each]
        assert sorted(i["content"] for i in everything) == sorted(i["content"] for i in items)
        for each in popped:  # each popper took the newest left each time: newest first
            assert [items.index(i) for i in each] == sorted(
                (items.index(i) for i in each), reverse=True
            )
        assert await session().get_items() == []

    on_stores(kind, tmp_path, test)


def test_pops_from_many_tasks_take_each_item_once(tmp_path: Path) -> None:
    async def main() -> None:
        store = AsyncSQLiteStore(tmp_path / "z.db")
        session = ZerdaSession("s", store=store)
        items = _items(N_POPPED)
        await session.add_items(items)

        async def pop_all() -> list[Any]:
            got = []
            while (item := await session.pop_item()) is not None:
                got.append(item)
            return got

        popped = await asyncio.gather(*(pop_all() for _ in range(8)))
        everything = [item for each in popped for item in each]
        assert sorted(i["content"] for i in everything) == sorted(i["content"] for i in items)
        await store.aclose()

    asyncio.run(main())


def pop_in_a_process(path: str, out: str, barrier: Any) -> None:
    """A spawned process: pop from the shared file until it is empty; write what it got."""
    store = SQLiteStore(path)
    session = ZerdaSession("s", store=store)
    barrier.wait(60)

    async def pops() -> list[Any]:
        got = []
        while (item := await session.pop_item()) is not None:
            got.append(item)
        return got

    Path(out).write_text(json.dumps(asyncio.run(pops())), encoding="utf-8")
    store.close()


def test_pops_from_two_processes_over_one_sqlite_file_take_each_item_once(tmp_path: Path) -> None:
    path = tmp_path / "shared.db"
    items = _items(4 * N_POPPED)
    with SQLiteStore(path) as store:
        asyncio.run(ZerdaSession("s", store=store).add_items(items))
    outs = [tmp_path / f"popped-{w}.json" for w in range(2)]
    run_processes(pop_in_a_process, [(str(path), str(out)) for out in outs], timeout=240)
    popped = [json.loads(out.read_text(encoding="utf-8")) for out in outs]
    everything = [item for each in popped for item in each]
    assert sorted(i["content"] for i in everything) == sorted(i["content"] for i in items)
    with SQLiteStore(path) as store:
        assert store.history("s") == []


# -- runs: the same as over the SDK's own SQLiteSession, and after a restart ---------------------


def _script() -> list[list[ResponseOutputItem]]:
    """Three runs with a tool: a reasoned call; two calls at once; a plain answer."""
    return [
        [thought("rs_1"), call("call_a", "Paris")],
        [text("Sunny in Paris.", "msg_1")],
        [call("call_b", "Rome"), call("call_c", "Oslo")],
        [text("Sunny in both.", "msg_2")],
        [text("You asked about Paris, Rome and Oslo.", "msg_3")],
        [text("Still sunny.", "msg_4")],
    ]


def test_runs_with_a_tool_store_what_sqlite_session_stores_and_survive_a_restart(
    tmp_path: Path,
) -> None:
    said = ["Weather in Paris?", "And Rome and Oslo?", "What did I ask?"]

    async def main() -> None:
        theirs_model, ours_model = ScriptedModel(*_script()), ScriptedModel(*_script())
        theirs = SQLiteSession("trip", tmp_path / "sdk.db")
        store = SQLiteStore(tmp_path / "zerda.db")
        ours = ZerdaSession("trip", store=store)
        for words in said:
            for model, session in ((theirs_model, theirs), (ours_model, ours)):
                await run(Agent(name="a", model=model, tools=[weather]), words, session)
        assert ours_model.inputs == theirs_model.inputs
        assert await ours.get_items() == await theirs.get_items()
        kinds = [i.get("type") for i in await ours.get_items()]
        assert kinds.count("function_call") == 3
        assert kinds.count("function_call_output") == 3
        store.close()

        # A restart: a new store and session over the same file continue the conversation.
        with SQLiteStore(tmp_path / "zerda.db") as again:
            resumed = ZerdaSession("trip", store=again)
            before = await resumed.get_items()
            assert before == await theirs.get_items()
            for model, session in ((theirs_model, theirs), (ours_model, resumed)):
                await run(Agent(name="a", model=model, tools=[weather]), "Tomorrow?", session)
            assert ours_model.inputs[-1] == [*before, user("Tomorrow?")]
            assert ours_model.inputs == theirs_model.inputs
            assert await resumed.get_items() == await theirs.get_items()
        theirs.close()

    asyncio.run(main())


# -- the model's input, chosen by a Zerda memory ---------------------------------------------------


def _tokens(items: list[Any]) -> int:
    return COUNTER.count_messages([m for i in items for m in from_responses([i])])


def _turn_starts(items: list[Any]) -> list[int]:
    return [i for i, item in enumerate(items) if item.get("role") == "user"]


def test_the_callback_keeps_the_newest_whole_turns_that_fit() -> None:
    budget = 220

    async def main() -> None:
        session = ZerdaSession("s")
        callback = session.input_callback(token_limit=budget, counter=COUNTER)
        model = ScriptedModel()
        agent = Agent(name="a", model=model, tools=[weather])
        cities = ["Paris", "Rome", "Oslo", "Lima", "Cairo", "Quito"]
        for n, city in enumerate(cities):
            model.enqueue(
                [thought(f"rs_{n}"), call(f"call_{n}", city)],
                [text(f"It is sunny in {city}. " + "Enjoy the day! " * 3, f"msg_{n}")],
            )
            history = await session.get_items()
            await run(agent, f"Weather in {city}?", session, session_input_callback=callback)
            sent = model.inputs[-2]  # the first call of the run: history and the new input
            assert sent[-1] == user(f"Weather in {city}?")
            kept = sent[:-1]
            # The newest whole turns of the history, as stored, and within the budget ...
            assert kept == history[len(history) - len(kept) :]
            assert not kept or kept[0].get("role") == "user"
            assert _tokens(sent) <= budget
            # ... and as many as fit: one more turn would not.
            starts = _turn_starts(history)
            earlier = [s for s in starts if s < len(history) - len(kept)]
            if earlier:
                assert _tokens([*history[earlier[-1] :], sent[-1]]) > budget
            calls = {i["call_id"] for i in kept if i.get("type") == "function_call"}
            outputs = {i["call_id"] for i in kept if i.get("type") == "function_call_output"}
            assert calls == outputs
        assert len(await session.get_items()) == 5 * len(cities)  # the log keeps everything
        assert len(model.inputs[-2]) < len(await session.get_items())  # the budget bit

    asyncio.run(main())


def test_the_callback_is_the_view_a_token_memory_has_over_the_session() -> None:
    async def main() -> None:
        store = InMemoryStore()
        session = ZerdaSession("s", store=store)
        for n in range(6):
            await session.add_items(
                [
                    user(f"question {n} " + "words " * n),
                    {"type": "function_call", "call_id": f"c{n}", "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": f"c{n}", "output": "x" * 40},
                    assistant(f"answer {n}"),
                ]
            )
        for budget in (60, 150, 400, 10_000):
            memory = ConversationTokenBufferMemory(
                budget, token_counter=COUNTER, store=store, session_id="s"
            )
            expected = [m.metadata[METADATA_KEY]["item"] for m in memory.get_context()]
            callback = session.input_callback(token_limit=budget, counter=COUNTER)
            assert callback(await session.get_items(), []) == expected

    asyncio.run(main())


def test_the_callback_repairs_the_history_it_is_given() -> None:
    rs = {"id": "rs_9", "type": "reasoning", "summary": [], "encrypted_content": "e"}
    pending = {"type": "function_call", "call_id": "waiting", "name": "f", "arguments": "{}"}
    history: list[dict[str, Any]] = [
        {"type": "function_call_output", "call_id": "cut", "output": "an orphan"},
        assistant("a greeting the limit cut off"),
        user("q1"),
        {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "a", "output": "A"},
        {"type": "function_call_output", "call_id": "b", "output": "B"},
        {"type": "function_call_output", "call_id": "b", "output": "B again"},
        assistant("both"),
        user("q2"),
        rs,
        pending,
    ]
    new = [user("q3")]
    callback = ZerdaSession("s").input_callback()
    sent = callback(copy.deepcopy(history), copy.deepcopy(new))
    # The orphan, the greeting, the second result, the unanswered call and the reasoning
    # that led to it are left out; parallel calls stay before their outputs, as made.
    assert sent == [*history[2:7], history[8], history[9], *new]


def test_the_callback_drops_reasoning_left_without_what_followed_it() -> None:
    crashed = [user("q"), {"id": "rs_1", "type": "reasoning", "summary": []}]
    callback = ZerdaSession("s").input_callback()
    assert callback(crashed, [user("again")]) == [user("q"), user("again")]
    answered = [*crashed, assistant("a")]
    assert callback(answered, [user("again")]) == [*answered, user("again")]


def test_the_callback_keeps_the_last_k_turns_and_the_pinned_items() -> None:
    history = [
        {"role": "developer", "content": "be brief"},
        user("1"),
        assistant("one"),
        user("2"),
        assistant("two"),
        user("3"),
        assistant("three"),
    ]
    callback = ZerdaSession("s").input_callback(k=2)
    assert callback(history, [user("4")]) == [history[0], *history[5:], user("4")]


def test_the_callback_follows_the_history_and_starts_again_when_it_changes() -> None:
    callback = ZerdaSession("s").input_callback(token_limit=10_000, counter=COUNTER)
    history = [user("a"), assistant("b")]
    assert callback(history, [user("c")]) == [*history, user("c")]
    grown = [*history, user("c"), assistant("d")]
    assert callback(grown, [user("e")]) == [*grown, user("e")]
    other = [user("x"), assistant("y")]  # another session's history
    assert callback(other, [user("z")]) == [*other, user("z")]
    assert callback(history[:1], []) == history[:1]


def _log(turns: int) -> list[dict[str, Any]]:
    """A session's items: a system item, then turns of a question, a call, its output and a
    reply of growing length."""
    items: list[dict[str, Any]] = [{"role": "system", "content": "Be brief."}]
    for n in range(turns):
        items += [
            user(f"question {n}"),
            call(f"call_{n}", f"city {n}").model_dump(exclude_none=True),
            {"type": "function_call_output", "call_id": f"call_{n}", "output": f"out {n}"},
            assistant("words " * (n % 7)),
        ]
    return items


@pytest.mark.parametrize(
    ("limit", "options"),
    [
        (9, {"token_limit": 60}),  # the budget keeps less than the window holds
        (9, {"token_limit": 10_000}),  # the budget reaches past the window's start
        (14, {"k": 2}),
        (7, {"k": 5}),
        (1_000, {"token_limit": 90}),  # no window: the history only grows
    ],
)
def test_a_callback_over_a_moving_window_sends_what_a_new_one_would(
    limit: int, options: dict[str, Any]
) -> None:
    """A session_settings.limit window moves on at its start each run; the callback keeps
    what it holds and appends, and must choose exactly what one seeing the window for the
    first time chooses."""
    log = _log(12)
    if "token_limit" in options:
        options = {**options, "counter": COUNTER}
    kept = ZerdaSession("s").input_callback(**options)
    for end in range(2, len(log)):
        history, new = log[max(0, end - limit) : end], [log[end]]
        fresh = ZerdaSession("s").input_callback(**options)
        assert kept(copy.deepcopy(history), new) == fresh(copy.deepcopy(history), new), end


def test_the_callbacks_new_input_over_the_budget_raises() -> None:
    callback = ZerdaSession("s").input_callback(token_limit=30, counter=COUNTER)
    with pytest.raises(ContextOverflowError):
        callback([user("short")], [user("far too long " * 40)])


def test_a_session_memory_gives_the_callback_its_budget_and_stores_counts() -> None:
    async def main() -> None:
        store = InMemoryStore()
        memory = ConversationTokenBufferMemory(
            60, token_counter=COUNTER, store=store, session_id="s"
        )
        session = ZerdaSession("s", memory=memory)
        items = [user(f"question {n}: " + "words " * 10) for n in range(5)]
        await session.add_items(items)
        assert all(n is not None for n in store.tail("s", None, COUNTER.name).tokens)
        sent = session.input_callback()(await session.get_items(), [user("last")])
        assert sent == [*items[-2:], user("last")]  # 21 tokens each, 7 for "last" and priming
        assert ZerdaSession("s", store=store).input_callback()(items, []) == items
        window = ZerdaSession("w", memory=ConversationBufferWindowMemory(k=2, session_id="w"))
        assert window.input_callback()(items, []) == items[-2:]

    asyncio.run(main())


def test_the_callbacks_configuration_is_checked() -> None:
    session = ZerdaSession("s")
    with pytest.raises(ConfigurationError, match="token_limit or k"):
        session.input_callback(token_limit=100, k=2)
    with pytest.raises(ConfigurationError, match="counter"):
        session.input_callback(counter=COUNTER)
    with pytest.raises(ConfigurationError, match="positive"):
        session.input_callback(token_limit=0)
    with pytest.raises(ValueError, match="k must be a positive integer"):
        session.input_callback(k=0)
    summary = ConversationSummaryBufferMemory(token_counter=COUNTER, session_id="s")
    with pytest.raises(ConfigurationError, match="summary"):
        ZerdaSession("s", memory=summary).input_callback()


# -- the SDK's compaction hooks ----------------------------------------------------------------


class _Compactor:
    """The ``client.responses.compact`` of OpenAIResponsesCompactionSession, scripted."""

    def __init__(self, output: list[dict[str, Any]]) -> None:
        self.output = output
        self.calls: list[dict[str, Any]] = []
        self.responses = self

    async def compact(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        return SimpleNamespace(output=copy.deepcopy(self.output), usage=None)


COMPACTED = [{"type": "compaction", "id": "cmp_1", "encrypted_content": "SUMMARY"}]


def test_a_manual_compaction_replaces_the_history_through_the_hook() -> None:
    async def main() -> None:
        store = InMemoryStore()
        session = ZerdaSession("s", store=store)
        await session.add_items([user("a"), assistant("b"), user("c"), assistant("d")])
        store.update_metadata("s", {"kept": True})  # clear_session would drop it
        client = _Compactor(COMPACTED)
        compacting = OpenAIResponsesCompactionSession("s", session, client=client)  # type: ignore[arg-type]
        await compacting.run_compaction({"force": True, "compaction_mode": "input"})
        assert len(client.calls) == 1
        assert await session.get_items() == COMPACTED
        assert store.get_metadata("s") == {"kept": True}

    asyncio.run(main())


class FailingDeletes(InMemoryStore):
    """A store whose deletes fail while ``failing`` is set: a process that dies between a
    replacement's append and its delete."""

    failing = True

    def delete_messages(self, session_id: str, ids: Any) -> int:
        if self.failing:
            raise StoreUnavailableError("the store went away")
        return super().delete_messages(session_id, ids)


def test_a_replacement_is_seen_whole_even_when_its_delete_never_happens() -> None:
    async def main() -> None:
        store = FailingDeletes()
        session = ZerdaSession("s", store=store)
        old = [user("a"), assistant("b")]
        await session.add_items(old)
        with pytest.raises(StoreUnavailableError):
            await session._atomic_replace_items(COMPACTED)  # type: ignore[arg-type]
        # Between the two steps: the store holds both, the session reads the new items only.
        assert len(store.history("s")) == 3
        assert await session.get_items() == COMPACTED
        assert await session.get_items(limit=2) == COMPACTED
        # Nothing was lost: the old messages are still stored; the next replacement deletes
        # them, and so does a pop of the item that hides them.
        await session.add_items(old)
        store.failing = False
        assert await session._atomic_replace_items(COMPACTED)  # type: ignore[arg-type]
        assert await session.get_items() == COMPACTED
        assert len(store.history("s")) == 1
        store.failing = True
        await session.add_items(old)
        with pytest.raises(StoreUnavailableError):
            await session._atomic_replace_items(COMPACTED)  # type: ignore[arg-type]
        store.failing = False
        assert await session.pop_item() == COMPACTED[0]
        assert await session.get_items() == []
        assert store.history("s") == []

    asyncio.run(main())


def test_an_automatic_compaction_is_seen_whole_even_when_its_delete_never_happens() -> None:
    async def main() -> None:
        store = FailingDeletes()
        session = ZerdaSession("s", store=store)
        await session.add_items([user("a"), assistant("b"), user("c"), assistant("d")])
        snapshot = await session._get_compaction_snapshot(2)
        with pytest.raises(StoreUnavailableError):
            await snapshot.replace_suffix(0, COMPACTED)
        assert await session.get_items() == [user("a"), assistant("b"), *COMPACTED]

    asyncio.run(main())


def test_an_automatic_compaction_replaces_the_suffix_the_model_saw() -> None:
    async def main() -> None:
        session = ZerdaSession("s")
        early = [user("old question"), assistant("old answer")]
        await session.add_items(early)
        client = _Compactor(COMPACTED)
        compacting = OpenAIResponsesCompactionSession(
            "s",
            session,
            client=client,  # type: ignore[arg-type]
            should_trigger_compaction=lambda context: True,
        )
        model = ScriptedModel([text("new answer", "msg_9")])
        # The model sees only the newest turn (k=1): the compaction takes what it saw.
        callback = session.input_callback(k=1)
        await run(
            Agent(name="a", model=model),
            "new question",
            compacting,
            session_input_callback=callback,
        )
        assert len(client.calls) == 1
        assert "input" in client.calls[0]  # a suffix: sent as input, not by response id
        assert await session.get_items() == [*early, *COMPACTED]

    asyncio.run(main())


def test_a_suffix_replacement_checks_the_suffix_is_still_the_newest() -> None:
    async def main() -> None:
        session = ZerdaSession("s")
        await session.add_items([user("a"), assistant("b"), user("c"), assistant("d")])
        snapshot = await session._get_compaction_snapshot(3)
        assert snapshot.items == [assistant("b"), user("c"), assistant("d")]
        assert not snapshot.complete
        assert (await session._get_compaction_snapshot(10)).complete
        await session.add_items([user("e")])  # the suffix is no longer the newest
        assert not await snapshot.replace_suffix(1, COMPACTED)
        assert len(await session.get_items()) == 5
        fresh = await session._get_compaction_snapshot(2)
        assert await fresh.replace_suffix(0, COMPACTED)
        assert await session.get_items() == [user("a"), assistant("b"), user("c"), *COMPACTED]
        assert not await fresh.replace_suffix(0, COMPACTED)  # its suffix is gone

    asyncio.run(main())


class SneakingStore(InMemoryStore):
    """Another writer's item gets in just before the first batch holding a compaction item,
    between a replacement's check and its append."""

    sneaked = False

    def append(self, session_id: str, messages: Any, tokens: Any = None) -> int:
        kinds = [m.metadata.get(METADATA_KEY, {}).get("item", {}).get("type") for m in messages]
        if "compaction" in kinds and not self.sneaked:
            self.sneaked = True
            super().append(session_id, [Message(Role.USER, "sneaked in").stamped()])
        return super().append(session_id, messages, tokens)


def test_a_suffix_replacement_that_something_got_before_is_taken_back() -> None:
    async def main() -> None:
        store = SneakingStore()
        session = ZerdaSession("s", store=store)
        await session.add_items([user("a"), assistant("b")])
        snapshot = await session._get_compaction_snapshot(2)
        assert not await snapshot.replace_suffix(0, COMPACTED)
        sneaked = {"type": "message", "role": "user", "content": "sneaked in"}
        assert await session.get_items() == [user("a"), assistant("b"), sneaked]
        # A whole replacement keeps what others added meanwhile (here: before the new items).
        store.sneaked = False
        assert await session._atomic_replace_items(COMPACTED)  # type: ignore[arg-type]
        assert await session.get_items() == [sneaked, *COMPACTED]

    asyncio.run(main())


def test_a_suffix_replacement_prunes_the_expired_prefix() -> None:
    async def main() -> None:
        session = ZerdaSession("s")
        items = [user("expired 1"), assistant("expired 2"), user("live"), user("c"), assistant("d")]
        await session.add_items(items)
        snapshot = await session._get_compaction_snapshot(
            2, prune_prefix=lambda item: "expired" in str(item.get("content"))
        )
        assert await snapshot.replace_suffix(0, COMPACTED)
        assert await session.get_items() == [user("live"), *COMPACTED]

    asyncio.run(main())


def test_a_subclass_gets_no_compaction_shortcuts() -> None:
    class Mine(ZerdaSession):
        pass

    async def main() -> None:
        session = Mine("s")
        await session.add_items([user("a")])
        assert await session._atomic_replace_items(COMPACTED) is False  # type: ignore[arg-type]
        assert await session._get_compaction_snapshot(3) is None
        assert await session.get_items() == [user("a")]

    asyncio.run(main())


# -- the session itself ----------------------------------------------------------------------------


def test_it_is_the_sdks_session() -> None:
    session = ZerdaSession("alice")
    assert isinstance(session, Session)
    assert session.session_id == "alice"
    assert isinstance(session.store, InMemoryStore)
    assert repr(session) == "ZerdaSession('alice', store=InMemoryStore)"
    with pytest.raises(AttributeError, match="cannot be changed"):
        session.session_id = "bob"


def test_its_configuration_is_checked() -> None:
    memory = ConversationBufferMemory(session_id="alice")
    with pytest.raises(ConfigurationError, match="not both"):
        ZerdaSession("alice", store=InMemoryStore(), memory=memory)
    with pytest.raises(ConfigurationError, match="session_id='bob'"):
        ZerdaSession("bob", memory=memory)
    with pytest.raises(ConfigurationError, match="Zerda memory"):
        ZerdaSession("alice", memory=InMemoryStore())  # type: ignore[arg-type]
    with pytest.raises(InvalidSessionIdError):
        ZerdaSession("has a space")
    with pytest.raises(InvalidMessageError, match="list of items"):
        asyncio.run(ZerdaSession("s").add_items(user("not a list")))  # type: ignore[arg-type]


def test_import_zerda_does_not_import_the_sdk() -> None:
    done = _run(
        "import sys, zerda, zerda.integrations, zerda.memory, zerda.stores\n"
        "assert 'agents' not in sys.modules, 'agents was imported'\n"
    )
    assert done.returncode == 0, done.stderr


def test_without_the_sdk_the_import_names_the_extra() -> None:
    done = _run(
        "import sys\n"
        "sys.modules['agents'] = None\n"
        "try:\n"
        "    import zerda.integrations.openai_agents\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'zerda-memory[openai-agents]'" in done.stdout
