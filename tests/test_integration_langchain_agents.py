"""LangChain 1.x agents: ZerdaMiddleware sends the model a Zerda memory's context (k turns, a
token budget, a summary, repaired) and keeps the thread in the memory's store, once, so that a
new agent continues it. Every run is a real ``create_agent`` run over a scripted chat model
that calls a tool, then answers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("langchain.agents", reason="the langchain-agents extra is not installed")

from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware, SummarizationMiddleware
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.checkpoint.memory import InMemorySaver
from pydantic import Field

from test_integrations import _run, opened_stores
from test_messages import json_values
from zerda import (
    ApproxCounter,
    ConfigurationError,
    ContextOverflowError,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationTokenBufferMemory,
    InvalidSessionIdError,
    Message,
)
from zerda.integrations._langchain_agents import _given_back, _stored
from zerda.integrations.langchain import ZerdaMiddleware, from_langchain_messages
from zerda.memory import BaseMemory
from zerda.memory._record import SUMMARY_KEY
from zerda.stores import AsyncSQLiteStore, InMemoryStore, SQLiteStore
from zerda.tokens import count_tools

COUNTER = ApproxCounter()
SYSTEM = "You answer in one sentence."
CITIES = ["Paris", "Oslo", "Lima", "Kyoto", "Quito"]

# -- a scripted chat model, a tool, an agent ---------------------------------------------------


class Scripted(BaseChatModel):
    """Calls ``weather`` for each new question (``calls`` calls at once, each with an id of
    its own), then answers from the results; or replies ``replies`` in order when given.
    Records what it was sent."""

    seen: list[list[BaseMessage]] = Field(default_factory=list)
    replies: list[AIMessage] = Field(default_factory=list)
    calls: int = 1

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Scripted:  # type: ignore[override]
        return self

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        self.seen.append(list(messages))
        n = len(self.seen)
        assert n <= 40, "the model was called more often than any test needs: a loop"
        if self.replies:
            reply = self.replies.pop(0)
        elif isinstance(messages[-1], ToolMessage):
            results = [m.text for m in messages if isinstance(m, ToolMessage)][-self.calls :]
            reply = AIMessage("It is " + " and ".join(results) + ". " + "x" * 30)
        else:
            question = messages[-1].text
            reply = AIMessage(
                "",
                tool_calls=[
                    {"name": "weather", "args": {"city": question}, "id": f"call_{n}_{i}"}
                    for i in range(self.calls)
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=reply)])


@tool
def weather(city: str) -> str:
    """The weather in a city, right now."""
    return f"sunny in {city} " + "y" * 30


def agent_with(
    middleware: AgentMiddleware[Any, Any, Any] | None, model: Scripted, **options: Any
) -> Any:
    return create_agent(
        model,
        tools=[weather],
        system_prompt=SYSTEM,
        middleware=[] if middleware is None else [middleware],
        **options,
    )


def config(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def ask(agent: Any, text: str, thread: str = "t1") -> list[BaseMessage]:
    result = agent.invoke({"messages": [{"role": "user", "content": text}]}, config(thread))
    return list(result["messages"])


def questions(sent: Sequence[BaseMessage]) -> list[str]:
    return [m.text for m in sent if isinstance(m, HumanMessage)]


def assert_valid(sent: Sequence[BaseMessage]) -> None:
    """What the model got: the system prompt first, then a user message, every tool result
    right after the call it answers and no call without its result."""
    assert isinstance(sent[0], SystemMessage)
    assert sent[0].text == SYSTEM
    rest = [m for m in sent[1:] if not isinstance(m, SystemMessage)]
    assert isinstance(rest[0], HumanMessage), f"the history opens on {type(rest[0]).__name__}"
    open_calls: set[str] = set()
    for m in rest:
        if isinstance(m, ToolMessage):
            assert m.tool_call_id in open_calls, f"orphan result {m.tool_call_id}"
            open_calls.discard(m.tool_call_id)
        else:
            assert not open_calls, f"calls without a result: {open_calls}"
            if isinstance(m, AIMessage):
                open_calls = {c["id"] for c in m.tool_calls if c["id"]}
    assert not open_calls, f"calls without a result: {open_calls}"


def assert_whole_turns(sent: Sequence[BaseMessage], history: Sequence[BaseMessage]) -> None:
    """The turns sent are the newest stored ones, whole: the messages after the system ones
    are the end of the thread's history, from a user message on."""
    turns = [m for m in sent if not isinstance(m, SystemMessage)]
    stored = [m for m in history if not isinstance(m, SystemMessage)]
    at = [m.id for m in stored].index(turns[0].id)
    assert isinstance(stored[at], HumanMessage)
    assert turns == stored[at : at + len(turns)]


@pytest.fixture(params=["memory", "sqlite", "redis", "postgres"])
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """New store objects of one kind that reach the same data (a new process's)."""
    with opened_stores(request.param, tmp_path) as open_store:
        yield open_store


# -- what the model sees ----------------------------------------------------------------------


def test_a_window_sends_k_whole_turns_and_keeps_the_thread(stores: Callable[[], Any]) -> None:
    model = Scripted()
    middleware = ZerdaMiddleware(ConversationBufferWindowMemory(k=2, store=stores()))
    agent = agent_with(middleware, model, checkpointer=InMemorySaver())
    for city in CITIES[:3]:
        state = ask(agent, city)
    assert len(model.seen) == 6  # a tool call and an answer per question
    history = middleware.get_history("t1")
    for sent in model.seen:
        assert_valid(sent)
        assert_whole_turns(sent, history)
    assert questions(model.seen[-1]) == ["Oslo", "Lima"]
    assert questions(model.seen[0]) == ["Paris"]
    # The store holds the thread once, as the agent's state holds it: equal, in order, though
    # the checkpointer handed the whole state back at every model call.
    assert history == state
    assert len(history) == 12
    assert len(middleware.memory_for("t1").get_history()) == 12


def test_a_token_budget_is_held_with_the_tools_counted(stores: Callable[[], Any]) -> None:
    limit = 260
    model = Scripted()
    memory = ConversationTokenBufferMemory(limit, token_counter=COUNTER, store=stores())
    middleware = ZerdaMiddleware(memory)
    agent = agent_with(middleware, model)
    for city in CITIES:
        ask(agent, city)
    tools = count_tools([convert_to_openai_tool(weather)], COUNTER)
    assert tools > 0
    history = middleware.get_history("t1")
    for sent in model.seen:
        assert_valid(sent)
        assert_whole_turns(sent, history)
        assert COUNTER.count_messages(from_langchain_messages(sent[1:])) + tools <= limit
    assert 1 <= len(questions(model.seen[-1])) < len(CITIES)


def test_parallel_calls_stay_with_their_results() -> None:
    model = Scripted(calls=3)
    memory = ConversationTokenBufferMemory(400, token_counter=COUNTER)
    middleware = ZerdaMiddleware(memory)
    agent = agent_with(middleware, model)
    for city in CITIES:
        ask(agent, city)
    for sent in model.seen:
        assert_valid(sent)
        assert sum(isinstance(m, ToolMessage) for m in sent) % 3 == 0
    assert len(questions(model.seen[-1])) < len(CITIES)  # the budget cut turns, whole


def test_an_orphan_result_in_the_thread_is_never_sent() -> None:
    model = Scripted()
    middleware = ZerdaMiddleware(ConversationBufferWindowMemory(k=3))
    agent = agent_with(middleware, model)
    orphan = ToolMessage("stale", tool_call_id="gone", id="orphan-1")
    agent.invoke({"messages": [orphan, HumanMessage("Paris")]}, config("t1"))
    ask(agent, "Oslo")
    for sent in model.seen:
        assert_valid(sent)
        assert all(getattr(m, "tool_call_id", None) != "gone" for m in sent)
    assert orphan in middleware.get_history("t1")  # the log keeps what the agent added


def test_the_summary_is_sent_after_the_system_prompt() -> None:
    model = Scripted()
    memory = ConversationSummaryBufferMemory(200, token_counter=COUNTER)
    middleware = ZerdaMiddleware(memory)
    agent = agent_with(middleware, model)
    for city in CITIES:
        ask(agent, city)
    sent = model.seen[-1]
    assert_valid(sent)
    assert isinstance(sent[1], SystemMessage)
    assert sent[1].text.startswith("Summary of the earlier conversation")
    assert "Paris" in sent[1].text
    assert "Paris" not in questions(sent)
    stats = middleware.memory_for("t1").get_memory_stats()
    assert stats["turns_summarized"] >= 1
    assert stats["turns_summarized"] + stats["turns_in_context"] == len(CITIES)
    assert len(middleware.get_history("t1")) == 4 * len(CITIES)  # the log keeps every turn


class Flaky:
    """A summarizer that fails while ``down``."""

    def __init__(self) -> None:
        self.down = True

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        if self.down:
            raise RuntimeError("summary provider down: HTTP 503")
        asked = [m.text for m in messages if m.role.value == "user"]
        return " ".join([previous_summary, *asked]).strip()

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


def test_a_failing_summarizer_loses_nothing(tmp_path: Path) -> None:
    model = Scripted()
    summarizer = Flaky()
    store = SQLiteStore(tmp_path / "chat.db")
    memory = ConversationSummaryBufferMemory(
        200, summarizer=summarizer, token_counter=COUNTER, store=store
    )
    middleware = ZerdaMiddleware(memory)
    agent = agent_with(middleware, model)
    for city in CITIES[:4]:
        ask(agent, city)  # the runs go on: the model is sent what fits
    for sent in model.seen:
        assert_valid(sent)
        assert COUNTER.count_messages(from_langchain_messages(sent[1:])) <= 200
        assert not any("503" in m.text or "Summary" in m.text for m in sent)
    thread = middleware.memory_for("t1")
    stats = thread.get_memory_stats()
    assert stats["turns_pending"] >= 1
    assert stats["summary_error"] is not None
    assert SUMMARY_KEY not in store.get_metadata("t1")  # no error stored as a summary
    assert len(middleware.get_history("t1")) == 16  # every message kept
    summarizer.down = False
    ask(agent, CITIES[4])
    stats = thread.get_memory_stats()
    assert stats["turns_pending"] == 0
    assert stats["turns_summarized"] + stats["turns_in_context"] == 5
    summary = model.seen[-1][1]
    assert isinstance(summary, SystemMessage)
    assert "Paris" in summary.text
    assert "503" not in summary.text


def test_langchains_summarization_fails_the_run_when_its_summary_fails() -> None:
    """What Zerda's summary memories avoid: with SummarizationMiddleware (langchain 1.5) a
    summary call that fails fails the user's run (before 1.5 it replaced the history with
    the error text, langchain-ai/langchain#38867)."""

    def broken(messages: list[BaseMessage]) -> str:
        raise RuntimeError("summary provider down: HTTP 503")

    summarizing = SummarizationMiddleware(
        Scripted(), trigger=("messages", 6), keep=("messages", 2), summarizer=broken
    )
    agent = agent_with(summarizing, Scripted())
    ask(agent, "Paris")
    with pytest.raises(RuntimeError, match="503"):
        agent.invoke({"messages": [HumanMessage(c) for c in CITIES]}, config("t1"))


def test_a_newest_turn_over_the_budget_raises_after_it_is_stored() -> None:
    memory = ConversationTokenBufferMemory(60, token_counter=COUNTER, overflow="raise")
    middleware = ZerdaMiddleware(memory)
    agent = agent_with(middleware, Scripted())
    with pytest.raises(ContextOverflowError):
        ask(agent, "Paris " + "z" * 600)
    assert [m.text[:5] for m in middleware.get_history("t1")] == ["Paris"]


def test_a_message_edited_in_the_store_is_what_the_model_sees() -> None:
    model = Scripted()
    middleware = ZerdaMiddleware(ConversationBufferMemory())
    agent = agent_with(middleware, model, checkpointer=InMemorySaver())
    ask(agent, "my card is 4111 and I am in Paris")
    first = middleware.get_history("t1")[0]
    assert first.id is not None
    middleware.memory_for("t1").edit_message(first.id, "my card is [removed] and I am in Paris")
    ask(agent, "Oslo")
    assert questions(model.seen[-1]) == ["my card is [removed] and I am in Paris", "Oslo"]


# -- threads, restarts, checkpointers ---------------------------------------------------------


def test_a_restart_continues_the_thread(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    first = ZerdaMiddleware(ConversationBufferWindowMemory(k=3, store=SQLiteStore(path)))
    agent = agent_with(first, Scripted(), checkpointer=InMemorySaver())
    ask(agent, "Paris", "alice")
    ask(agent, "Oslo", "alice")
    before = first.get_history("alice")

    # A new process: new store object, middleware, agent and (empty) checkpointer.
    model = Scripted()
    later = ZerdaMiddleware(ConversationBufferWindowMemory(k=3, store=SQLiteStore(path)))
    agent = agent_with(later, model, checkpointer=InMemorySaver())
    state = ask(agent, "Lima", "alice")
    assert questions(state) == ["Lima"]  # LangGraph's state: this run only
    assert questions(model.seen[0]) == ["Paris", "Oslo", "Lima"]  # the model: the thread
    after = later.get_history("alice")
    assert after[: len(before)] == before
    assert after[len(before) :] == state
    ask(agent, "Kyoto", "bob")
    assert questions(model.seen[-1]) == ["Kyoto"]  # another thread is another session
    assert questions(ZerdaMiddleware(later.memory).get_history("bob")) == ["Kyoto"]


def test_a_persistent_checkpointer_and_a_restart_store_nothing_twice() -> None:
    store = InMemoryStore()
    saver = InMemorySaver()  # stands for a saver that survives the restart
    first = ZerdaMiddleware(ConversationBufferWindowMemory(k=2, store=store))
    ask(agent_with(first, Scripted(), checkpointer=saver), "Paris")
    later = ZerdaMiddleware(ConversationBufferWindowMemory(k=2, store=store))
    model = Scripted()
    state = ask(agent_with(later, model, checkpointer=saver), "Oslo")
    assert len(state) == 8  # the state holds both turns
    assert later.get_history("t1") == state  # so does the store: once each
    assert questions(model.seen[0]) == ["Paris", "Oslo"]


def test_without_a_thread_id_the_memory_session_is_the_thread() -> None:
    store = InMemoryStore()
    middleware = ZerdaMiddleware(ConversationBufferMemory(store=store, session_id="alice"))
    agent = agent_with(middleware, Scripted())
    agent.invoke({"messages": [HumanMessage("Paris")]})
    assert [s.session_id for s in store.list_sessions()] == ["alice"]
    assert middleware.memory_for() is middleware.memory
    assert middleware.memory_for("alice") is middleware.memory
    assert len(middleware.get_history()) == 4
    ask(agent, "Oslo", "bob")
    thread = middleware.memory_for("bob")
    assert type(thread) is ConversationBufferMemory
    assert thread.session_id == "bob"
    assert thread.store is store


# -- async --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "async-sqlite"])
def test_ainvoke_sends_what_invoke_sends(kind: str, tmp_path: Path) -> None:
    async def main(store: Any) -> list[BaseMessage]:
        try:
            agent = agent_with(ZerdaMiddleware(memory_on(store)), async_model)
            for city in CITIES[:3]:
                await agent.ainvoke({"messages": [HumanMessage(city)]}, config("t1"))
            return await ZerdaMiddleware(memory_on(store)).aget_history("t1")
        finally:
            if isinstance(store, AsyncSQLiteStore):
                await store.aclose()

    def memory_on(store: Any) -> BaseMemory[Any]:
        return ConversationTokenBufferMemory(220, token_counter=COUNTER, store=store)

    sync_model, async_model = Scripted(), Scripted()
    agent = agent_with(ZerdaMiddleware(memory_on(InMemoryStore())), sync_model)
    for city in CITIES[:3]:
        ask(agent, city)
    store = AsyncSQLiteStore(tmp_path / "chat.db") if kind == "async-sqlite" else InMemoryStore()
    history = asyncio.run(main(store))
    assert len(history) == 12
    for sent in async_model.seen:
        assert_valid(sent)
        assert_whole_turns(sent, history)
    shape = [[(type(m).__name__, m.text) for m in sent] for sent in sync_model.seen]
    assert shape == [[(type(m).__name__, m.text) for m in sent] for sent in async_model.seen]


def test_a_sync_run_over_an_async_store_says_to_use_ainvoke(tmp_path: Path) -> None:
    store = AsyncSQLiteStore(tmp_path / "chat.db")
    agent = agent_with(ZerdaMiddleware(ConversationBufferMemory(store=store)), Scripted())
    with pytest.raises(ConfigurationError, match="ainvoke"):
        ask(agent, "Paris")
    asyncio.run(store.aclose())


# -- what Zerda does not model is kept --------------------------------------------------------

VIDEO = {"type": "video", "base64": "AAAA" * 200, "mime_type": "video/mp4"}
SERVER_CALL = {"type": "server_tool_call", "id": "srv_1", "name": "web_search", "args": {"q": "x"}}
SERVER_RESULT = {"type": "server_tool_result", "tool_call_id": "srv_1", "status": "success"}


def test_unknown_content_blocks_are_stored_and_given_back(tmp_path: Path) -> None:
    question = HumanMessage(content=[{"type": "text", "text": "Paris?"}, VIDEO], id="q-1")
    searched = AIMessage(
        content=[SERVER_CALL, SERVER_RESULT, {"type": "text", "text": "Searched."}],
        tool_calls=[{"name": "weather", "args": {"city": "Paris"}, "id": "call_x"}],
        response_metadata={"model_provider": "anthropic"},
        id="a-1",
    )
    model = Scripted(replies=[searched])
    path = tmp_path / "chat.db"
    middleware = ZerdaMiddleware(ConversationBufferMemory(store=SQLiteStore(path)))
    agent = agent_with(middleware, model)
    agent.invoke({"messages": [question]}, config("t1"))
    assert model.seen[1][1] == question  # the next call gets both back, unchanged
    assert model.seen[1][2] == searched
    again = ZerdaMiddleware(ConversationBufferMemory(store=SQLiteStore(path)))
    history = again.get_history("t1")
    assert history[:2] == [question, searched]
    stored = again.memory_for("t1").get_history()
    assert stored[0].text.startswith("Paris?")
    assert '"video"' in stored[0].text  # shown as its JSON,
    assert "AAAA" not in stored[0].text  # its data left out
    assert [c.id for c in stored[1].tool_calls] == ["call_x"]  # the call pairs as any call
    assert "server_tool_call" in stored[1].text
    # Edited on Zerda's side, it reads as edited: the kept original is not given back.
    again.memory_for("t1").edit_message("q-1", "Paris? (video removed)")
    assert again.get_history("t1")[0] == HumanMessage("Paris? (video removed)", id="q-1")


unknown_blocks_st = st.builds(
    lambda kind, fields: {**fields, "type": kind},
    st.sampled_from(["video", "server_tool_call", "server_tool_result", "non_standard", "x-y"]),
    st.dictionaries(st.sampled_from(["id", "value", "base64", "url", "args"]), json_values),
)
content_st = st.text(max_size=12) | st.lists(
    st.text(max_size=8)
    | st.builds(lambda t: {"type": "text", "text": t}, st.text(max_size=8))
    | unknown_blocks_st,
    min_size=1,
    max_size=4,
)
calls_st = st.lists(
    st.builds(
        lambda n, i: {"name": n, "args": {"q": i}, "id": f"c{i}", "type": "tool_call"},
        st.sampled_from(["weather", "search"]),
        st.integers(0, 9),
    ),
    max_size=2,
    unique_by=lambda c: c["id"],
)
state_messages_st = st.one_of(
    st.builds(lambda c, i: HumanMessage(content=c, id=i), content_st, st.uuids().map(str)),
    st.builds(
        lambda c, calls, i: AIMessage(content=c, tool_calls=calls, id=i),
        content_st,
        calls_st,
        st.uuids().map(str),
    ),
    st.builds(
        lambda c, i: ToolMessage(content=c, tool_call_id="c1", id=i),
        content_st,
        st.text(min_size=1),
    ),
    st.builds(lambda c: SystemMessage(content=c, id="s"), content_st),
)


@settings(max_examples=60, deadline=None)
@given(state_messages_st)
def test_any_state_message_is_given_back_equal(message: BaseMessage) -> None:
    """What the middleware stores of a state message, read back from its JSON, is the
    message: blocks Zerda does not model included, any id (a long one is stored digested)."""
    stored = _stored(message, "message")
    assert _given_back(Message.from_json(stored.to_json())) == message


def test_a_message_type_zerda_has_no_role_for_is_kept() -> None:
    kept = [FunctionMessage(name="lookup", content="42", id="f-1")]
    kept.append(ChatMessage(role="critic", content="be brief", id="c-1"))
    model = Scripted()
    middleware = ZerdaMiddleware(ConversationBufferMemory())
    agent = agent_with(middleware, model)
    agent.invoke({"messages": [HumanMessage("Paris", id="h-1"), *kept]}, config("t1"))
    assert model.seen[0][2:4] == kept  # inside the turn, given back as they were
    assert middleware.get_history("t1")[1:3] == kept
    assert [m.role.value for m in middleware.memory_for("t1").get_history()[1:3]] == [
        "assistant",
        "assistant",
    ]


# -- bad input, the import ----------------------------------------------------------------------


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ConfigurationError, match="Zerda memory"):
        ZerdaMiddleware("history")  # type: ignore[arg-type]
    middleware = ZerdaMiddleware(ConversationBufferMemory())
    with pytest.raises(InvalidSessionIdError):
        middleware.memory_for("no spaces please")
    agent = agent_with(middleware, Scripted())
    with pytest.raises(InvalidSessionIdError):
        ask(agent, "Paris", "a thread/with a slash")


def test_the_middleware_is_imported_only_when_used() -> None:
    run = _run(
        "import sys\n"
        "import zerda.integrations.langchain as lc\n"
        "assert 'langchain' not in sys.modules, 'langchain was imported'\n"
        "assert lc.ZerdaMiddleware.__name__ == 'ZerdaMiddleware'\n"
        "assert 'langchain' in sys.modules\n"
    )
    assert run.returncode == 0, run.stderr
    run = _run(
        "import sys\n"
        "sys.modules['langchain'] = None\n"
        "from zerda.integrations.langchain import to_langchain\n"
        "try:\n"
        "    from zerda.integrations.langchain import ZerdaMiddleware\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert run.returncode == 0, run.stderr
    assert "pip install 'zerda-memory[langchain-agents]'" in run.stdout
