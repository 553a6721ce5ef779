"""The message-level API: tool calls and results, pinned system messages, whole-turn windows."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from _conversations import scan_turns, sendable
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
)
from zerda.messages import Message, Role, ToolCall
from zerda.stores import InMemoryStore, Store
from zerda.tokens import ApproxCounter

DATA_FILE = Path(__file__).parents[2] / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"


# -- building conversations -----------------------------------------------------------------


def user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": text}


def system(text: str) -> dict[str, Any]:
    return {"role": "system", "content": text}


def call(*ids: str, text: str | None = None) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": text,
        "tool_calls": [
            {"id": i, "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            for i in ids
        ],
    }


def result(call_id: str, text: str = "{}") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def tool_turn(n: int) -> list[dict[str, Any]]:
    """One whole turn: a question, two rounds of tool calls, and the answer."""
    return [
        user(f"question {n}"),
        call(f"c{n}a", f"c{n}b"),
        result(f"c{n}a"),
        result(f"c{n}b"),
        call(f"c{n}c", text=f"checking {n}"),
        result(f"c{n}c"),
        assistant(f"answer {n}"),
    ]


def check_tool_pairing(context: list[Message], *, in_progress_ok: bool) -> None:
    """No result without its earlier call; no call without its result, except in the newest
    turn when it is still in progress (``in_progress_ok``)."""
    seen_calls: set[str] = set()
    for m in context:
        if m.role is Role.TOOL:
            assert m.tool_call_id in seen_calls, f"orphan tool result {m.tool_call_id}"
        seen_calls.update(c.id for c in m.tool_calls)
    answered = {m.tool_call_id for m in context if m.role is Role.TOOL}
    unanswered = seen_calls - answered
    if unanswered and in_progress_ok:
        newest = scan_turns(context)[-1]
        newest_calls = {c.id for m in newest for c in m.tool_calls}
        assert unanswered <= newest_calls
    else:
        assert not unanswered, f"calls without results: {sorted(unanswered)}"


def load_dialogs(n: int) -> list[list[dict[str, Any]]]:
    if not DATA_FILE.exists():
        pytest.skip(f"shared data file not found: {DATA_FILE}")
    dialogs: list[list[dict[str, Any]]] = []
    with gzip.open(DATA_FILE, "rt", encoding="utf-8") as f:
        for line in f:
            dialogs.append(json.loads(line)["messages"])
            if len(dialogs) == n:
                break
    return dialogs


# -- window keeps whole turns -----------------------------------------------------------------


@pytest.mark.parametrize("k", [1, 2, 3])
def test_window_keeps_last_k_whole_tool_turns(k: int) -> None:
    mem = ConversationBufferWindowMemory(k=k)
    for n in range(5):
        mem.add_messages(tool_turn(n))

    context = mem.get_context()
    turns = scan_turns(mem.get_history())
    assert len(turns) == 5
    assert context == [m for t in turns[-k:] for m in t]
    assert context[0].role is Role.USER
    assert context[0].content == f"question {5 - k}"
    assert context[-1].content == "answer 4"
    assert len(context) == 7 * k
    check_tool_pairing(context, in_progress_ok=False)


def test_a_turn_in_progress_sends_only_the_calls_that_have_their_results() -> None:
    """OpenAI refuses a call without its result: until p2's result is stored, the context
    carries call p1 alone (the log keeps both calls)."""
    mem = ConversationBufferWindowMemory(k=1)
    mem.add_messages(tool_turn(0))
    mem.add_messages([user("question 1"), call("p1", "p2"), result("p1")])

    context = mem.get_context()
    assert [m.role for m in context] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert context[0].content == "question 1"
    assert [c.id for c in context[1].tool_calls] == ["p1"]
    assert [c.id for c in mem.get_history()[-2].tool_calls] == ["p1", "p2"], "the log is kept"
    assert mem.get_memory_stats()["repairs"]["dropped_unanswered_calls"] == 1
    check_tool_pairing(context, in_progress_ok=False)
    # While waiting for the answer, the turn dict has the question and no output yet.
    assert mem.get_messages() == [
        {"input": "question 1", "output": None, "timestamp": context[0].created_at}
    ]

    mem.add_message(result("p2"))
    mem.add_message(assistant("answer 1"))
    context = mem.get_context()
    assert [m.content for m in context if m.role is not Role.TOOL] == [
        "question 1",
        None,
        "answer 1",
    ]
    check_tool_pairing(context, in_progress_ok=False)


def test_window_counts_opening_assistant_greeting_as_a_turn() -> None:
    """The greeting is a turn of the log (k counts it), but a context opens on a user message,
    so the model is not sent it."""
    mem = ConversationBufferWindowMemory(k=2)
    mem.add_message(assistant("Welcome! How can I help?"))
    mem.save_context({"input": "hi"}, {"output": "hello"})
    assert [m.content for m in mem.get_context()] == ["hi", "hello"]
    assert mem.get_memory_stats()["repairs"]["dropped_before_user"] == 1
    assert mem.get_history()[0].content == "Welcome! How can I help?"
    assert [t["input"] for t in mem.get_messages()] == ["hi"], "the turns the context holds"

    mem.save_context({"input": "again"}, {"output": "sure"})
    context = mem.get_context()
    assert context[0].role is Role.USER
    assert [m.content for m in context] == ["hi", "hello", "again", "sure"]


# -- system messages --------------------------------------------------------------------------


def test_system_messages_are_pinned_first_and_not_counted_in_k() -> None:
    mem = ConversationBufferWindowMemory(k=2)
    mem.add_message(system("You are terse."))
    for n in range(3):
        mem.add_messages(tool_turn(n))
        if n == 1:
            mem.add_message(system("Answer in French."))

    context = mem.get_context()
    assert [m.content for m in context[:2]] == ["You are terse.", "Answer in French."]
    assert all(m.role is Role.SYSTEM for m in context[:2])
    rest = context[2:]
    assert all(m.role is not Role.SYSTEM for m in rest)
    assert rest == [m for t in scan_turns(mem.get_history())[-2:] for m in t]
    assert rest[0].content == "question 1"
    assert len(mem.get_messages()) == 2
    assert mem.get_window_info()["current_size"] == 2
    assert mem.get_memory_stats()["message_count"] == 2


def test_system_message_in_mid_turn_does_not_split_the_turn() -> None:
    mem = ConversationBufferWindowMemory(k=1)
    mem.add_messages([user("q"), call("c1"), system("be careful"), result("c1"), assistant("a")])

    context = mem.get_context()
    assert [m.role for m in context] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert mem.get_messages()[0]["input"] == "q"
    assert mem.get_messages()[0]["output"] == "a"


def test_buffer_context_is_systems_then_everything_else() -> None:
    mem = ConversationBufferMemory()
    msgs = [system("s1"), *tool_turn(0), system("s2"), *tool_turn(1)]
    stored = mem.add_messages(msgs)

    context = mem.get_context()
    systems = [m for m in stored if m.role is Role.SYSTEM]
    others = [m for m in stored if m.role is not Role.SYSTEM]
    assert context == systems + others
    assert mem.get_history() == stored


# -- history and timestamps -------------------------------------------------------------------


def test_get_history_returns_every_message_in_order() -> None:
    mem = ConversationBufferWindowMemory(k=1)
    msgs = [system("s"), *tool_turn(0), *tool_turn(1), system("s2"), *tool_turn(2)]
    for m in msgs:
        mem.add_message(m)

    history = mem.get_history()
    assert [m.to_openai() for m in history] == [Message.from_openai(m).to_openai() for m in msgs]
    assert len(mem.get_context()) < len(history)


def test_created_at_is_stamped_when_unset_and_kept_when_given() -> None:
    mem = ConversationBufferMemory()
    before = time.time()
    returned = mem.add_message(user("hi"))
    batch = mem.add_messages([assistant("one"), Message(Role.ASSISTANT, "two")])
    mem.save_context({"input": "x"}, {"output": "y"})
    after = time.time()
    given = mem.add_message({"role": "user", "content": "old", "created_at": 1000.5})

    history = mem.get_history()
    assert history[0] == returned
    assert history[1:3] == batch
    for m in history[:-1]:
        assert m.created_at is not None
        assert before <= m.created_at <= after
    assert history[-1] == given
    assert given.created_at == 1000.5
    assert mem.get_messages()[-1]["timestamp"] == 1000.5


def test_turn_timestamp_is_when_the_user_spoke() -> None:
    mem = ConversationBufferMemory()
    mem.add_messages(
        [
            {**user("q"), "created_at": 10.0},
            {**call("t"), "created_at": 20.0},
            {**result("t"), "created_at": 30.0},
            {**assistant("a"), "created_at": 40},
        ]
    )
    [turn] = mem.get_messages()
    assert turn["timestamp"] == 10.0
    assert type(turn["timestamp"]) is float


def test_add_message_accepts_message_objects_with_tool_calls() -> None:
    mem = ConversationBufferWindowMemory(k=1)
    mem.add_messages(
        [
            Message(Role.USER, "q"),
            Message(Role.ASSISTANT, None, tool_calls=(ToolCall("t1", "search", '{"q": 1}'),)),
            Message(Role.TOOL, "found", tool_call_id="t1"),
            Message(Role.ASSISTANT, "here"),
        ]
    )
    context = mem.get_context()
    assert context[1].tool_calls == (ToolCall("t1", "search", '{"q": 1}'),)
    assert context[2].tool_call_id == "t1"
    assert mem.get_messages()[0]["output"] == "here"


# -- the two APIs see one conversation -----------------------------------------------------


def test_seed_and_message_apis_interleaved_see_one_conversation() -> None:
    mem = ConversationBufferMemory()
    mem.save_context({"input": "hi"}, {"output": "hello"})
    mem.add_messages(tool_turn(0))
    mem.save_context({"input": "thanks"}, {"output": "you're welcome"})
    mem.add_message(user("bye"))
    mem.add_message(assistant("goodbye"))

    assert [(t["input"], t["output"]) for t in mem.get_messages()] == [
        ("hi", "hello"),
        ("question 0", "answer 0"),
        ("thanks", "you're welcome"),
        ("bye", "goodbye"),
    ]
    history = mem.get_history()
    assert [m.content for m in history[:2]] == ["hi", "hello"]
    assert [m.role for m in history[:2]] == [Role.USER, Role.ASSISTANT]
    assert [m.content for m in history[-4:]] == ["thanks", "you're welcome", "bye", "goodbye"]
    assert mem.get_context() == history
    assert mem.get_memory_stats()["message_count"] == 4
    assert mem.load_memory_variables({})["history"] == "\n".join(
        [
            "user: hi",
            "assistant: hello",
            "user: question 0",
            "assistant: answer 0",
            "user: thanks",
            "assistant: you're welcome",
            "user: bye",
            "assistant: goodbye",
        ]
    )


def test_window_counts_turns_from_both_apis() -> None:
    mem = ConversationBufferWindowMemory(k=2)
    mem.save_context({"input": "a"}, {"output": "b"})
    mem.add_messages(tool_turn(0))
    mem.save_context({"input": "c"}, {"output": "d"})

    assert [(t["input"], t["output"]) for t in mem.get_messages()] == [
        ("question 0", "answer 0"),
        ("c", "d"),
    ]
    assert mem.get_context()[0].content == "question 0"
    assert mem.get_context()[-2:] == mem.get_history()[-2:]


def test_text_format_of_a_tool_turn() -> None:
    mem = ConversationBufferWindowMemory(k=3)
    mem.add_messages(tool_turn(7))
    assert mem.load_memory_variables({}) == {"history": "user: question 7\nassistant: answer 7"}


def test_tool_turn_output_is_the_final_assistant_text() -> None:
    # The intermediate "checking" text comes with a tool call; the reply is the last text.
    mem = ConversationBufferMemory(return_messages=True)
    mem.add_messages(tool_turn(3)[:-1])
    assert mem.get_messages()[0]["output"] == "checking 3"
    mem.add_message(assistant("answer 3"))
    assert mem.load_memory_variables({})["history"][0]["output"] == "answer 3"


def test_output_is_the_last_assistant_text_so_far() -> None:
    # A text reply, then a call that is not answered yet: the reply so far is that text.
    mem = ConversationBufferMemory()
    mem.add_messages([user("q"), assistant("Sure, one moment."), call("t1")])
    assert mem.get_messages()[0]["output"] == "Sure, one moment."
    mem.add_message(result("t1"))
    assert mem.get_messages()[0]["output"] == "Sure, one moment."
    assert mem.load_memory_variables({})["history"] == "user: q\nassistant: Sure, one moment."


# -- clear --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "make",
    [ConversationBufferMemory, lambda: ConversationBufferWindowMemory(k=2)],
    ids=["buffer", "window"],
)
def test_clear_empties_everything_including_system(make: Callable[[], BaseMemory]) -> None:
    memory = make()
    memory.add_message(system("pinned"))
    memory.add_messages(tool_turn(0))
    memory.save_context({"input": "a"}, {"output": "b"})

    memory.clear()

    assert memory.get_history() == []
    assert memory.get_context() == []
    assert memory.get_messages() == []
    assert memory.load_memory_variables({}) == {"history": ""}
    assert memory.get_memory_stats()["message_count"] == 0
    assert memory.get_memory_stats()["total_messages"] == 0

    memory.save_context({"input": "fresh"}, {"output": "start"})
    assert [m.content for m in memory.get_context()] == ["fresh", "start"]


# -- async twins ----------------------------------------------------------------------------


def _script() -> list[tuple[str, Any]]:
    return [
        ("add_message", system("pinned")),
        ("add_messages", tool_turn(0)),
        ("save_context", ({"input": "a"}, {"output": "b"})),
        ("add_messages", [user("q"), call("x1")]),
        ("add_message", result("x1")),
        ("add_message", assistant("done")),
        ("add_messages", tool_turn(1)),
    ]


def _play_sync(mem: BaseMemory) -> dict[str, Any]:
    for name, arg in _script():
        if name == "save_context":
            mem.save_context(*arg)
        else:
            getattr(mem, name)(arg)
    return {
        "context": mem.get_context(),
        "history": mem.get_history(),
        "vars": mem.load_memory_variables({}),
        "messages": mem.get_messages(),
        "last": mem.get_messages(limit=1),
        "stats": mem.get_memory_stats(),
    }


async def _play_async(mem: BaseMemory) -> dict[str, Any]:
    for name, arg in _script():
        if name == "save_context":
            await mem.asave_context(*arg)
        else:
            await getattr(mem, "a" + name)(arg)
    return {
        "context": await mem.aget_context(),
        "history": await mem.aget_history(),
        "vars": await mem.aload_memory_variables({}),
        "messages": await mem.aget_messages(),
        "last": await mem.aget_messages(limit=1),
        "stats": await mem.aget_memory_stats(),
    }


def _without_times(value: Any) -> Any:
    """Drop timestamps, which differ between two runs."""
    if isinstance(value, Message):
        return value.to_openai()
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


@pytest.mark.parametrize("return_messages", [False, True])
@pytest.mark.parametrize("k", [None, 1, 2, 10])
def test_async_twins_give_the_same_results(k: int | None, return_messages: bool) -> None:
    def make() -> BaseMemory:
        if k is None:
            return ConversationBufferMemory(return_messages=return_messages)
        return ConversationBufferWindowMemory(k=k, return_messages=return_messages)

    sync_result = _play_sync(make())
    async_mem = make()
    async_result = asyncio.run(_play_async(async_mem))

    assert _without_times(async_result) == _without_times(sync_result)
    assert async_result["history"][0].created_at is not None

    asyncio.run(async_mem.aclear())
    assert async_mem.get_history() == []
    assert asyncio.run(async_mem.aget_context()) == []


def test_async_add_message_returns_stored_message() -> None:
    mem = ConversationBufferMemory()
    stored = asyncio.run(mem.aadd_message(user("hi")))
    assert stored.created_at is not None
    assert mem.get_history() == [stored]


# -- real tool-call dialogs -------------------------------------------------------------------


@pytest.fixture(scope="module")
def coffee_dialogs() -> list[list[dict[str, Any]]]:
    return load_dialogs(40)


def _messages(dialogs: list[list[dict[str, Any]]]) -> Iterator[dict[str, Any]]:
    for dialog in dialogs:
        yield from dialog


def test_dataset_dialogs_are_well_formed(coffee_dialogs: list[list[dict[str, Any]]]) -> None:
    # The guarantees below are only meaningful if the data has tool turns to keep together.
    messages = [Message.from_openai(m) for m in _messages(coffee_dialogs)]
    assert any(m.tool_calls for m in messages)
    assert any(m.role is Role.TOOL for m in messages)
    assert messages[0].role is Role.USER


@pytest.mark.parametrize("k", [1, 2, 3, 5, 8])
def test_window_over_real_dialogs_added_one_by_one(
    coffee_dialogs: list[list[dict[str, Any]]], k: int
) -> None:
    mem = ConversationBufferWindowMemory(k=k)
    stored: list[Message] = []
    for i, raw in enumerate(_messages(coffee_dialogs)):
        stored.append(mem.add_message(raw))
        if i % 7:
            continue  # check every 7th prefix: enough to hit every position in a turn
        context = mem.get_context()
        turns = scan_turns(stored)
        assert context == sendable([m for t in turns[-k:] for m in t])
        assert not context or context[0].role is Role.USER
        check_tool_pairing(context, in_progress_ok=False)

    assert mem.get_history() == stored
    context = mem.get_context()
    turns = scan_turns(stored)
    assert context == [m for t in turns[-k:] for m in t]
    check_tool_pairing(context, in_progress_ok=False)
    assert len(mem.get_messages()) == k
    assert mem.get_window_info() == {
        "current_size": k,
        "max_size": k,
        "available_slots": 0,
        "is_full": True,
    }


def test_turn_dicts_over_real_dialogs(coffee_dialogs: list[list[dict[str, Any]]]) -> None:
    mem = ConversationBufferMemory()
    dialogs = coffee_dialogs[:10]
    for dialog in dialogs:
        mem.add_messages(dialog)

    expected = []
    for turn in scan_turns([Message.from_openai(m) for m in _messages(dialogs)]):
        texts = [m.content for m in turn if m.role is Role.ASSISTANT and m.content is not None]
        expected.append((turn[0].content, texts[-1] if texts else None))
    assert [(t["input"], t["output"]) for t in mem.get_messages()] == expected
    assert mem.get_memory_stats()["total_messages"] == sum(len(d) for d in dialogs)
    assert mem.load_memory_variables({})["history"] == "\n".join(
        f"user: {i}\nassistant: {o}" for i, o in expected
    )


@pytest.mark.parametrize(
    "make",
    [
        lambda s: ConversationBufferWindowMemory(k=1, store=s),
        lambda s: ConversationTokenBufferMemory(40, token_counter=ApproxCounter(), store=s),
    ],
)
def test_context_with_stats_is_one_read_of_both(make: Callable[[Store], BaseMemory]) -> None:
    store = InMemoryStore()
    memory = make(store)
    for n in range(3):
        memory.add_messages([user(f"question {n} " * 3), assistant(f"answer {n}")])
    reads = []
    tail = store.tail
    store.tail = lambda *a, **k: reads.append(a) or tail(*a, **k)  # type: ignore[method-assign]
    context, stats = memory.get_context_with_stats()
    assert len(reads) == 1
    assert context == memory.get_context()
    assert stats == memory.get_memory_stats()
    assert stats["total_messages"] == len(context)
    assert asyncio.run(memory.aget_context_with_stats()) == (context, stats)
