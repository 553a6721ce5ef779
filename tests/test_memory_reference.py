"""The examples of the ConversationBufferMemory and ConversationBufferWindowMemory pages, as tests.

Where a page documents a defect (DESIGN.md §3), the test pins Zerda's fixed behaviour instead.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from zerda.errors import ZerdaWarning
from zerda.memory import ConversationBufferMemory, ConversationBufferWindowMemory

# -- ConversationBufferMemory page ------------------------------------------------------------


def test_buffer_example_1_basic() -> None:
    mem = ConversationBufferMemory()
    mem.save_context({"input": "Hi"}, {"output": "Hello!"})

    assert mem.load_memory_variables({})["history"] == "user: Hi\nassistant: Hello!"


def test_buffer_text_joins_turns_with_newlines() -> None:
    mem = ConversationBufferMemory()
    mem.save_context({"input": "Hi"}, {"output": "Hello!"})
    mem.save_context({"input": "How are you?"}, {"output": "Fine."})

    assert mem.load_memory_variables({}) == {
        "history": "user: Hi\nassistant: Hello!\nuser: How are you?\nassistant: Fine."
    }


def test_buffer_example_2_return_messages() -> None:
    mem2 = ConversationBufferMemory(return_messages=True)
    before = time.time()
    mem2.save_context({"input": "2+2?"}, {"output": "4"})
    after = time.time()

    history = mem2.load_memory_variables({})["history"]

    assert isinstance(history, list)
    assert len(history) == 1
    turn = history[0]
    assert set(turn) == {"input", "output", "timestamp"}
    assert turn["input"] == "2+2?"
    assert turn["output"] == "4"
    assert isinstance(turn["timestamp"], float)
    assert before <= turn["timestamp"] <= after


def test_buffer_example_3_custom_keys() -> None:
    mem3 = ConversationBufferMemory(input_key="question", output_key="answer")
    mem3.save_context({"question": "Capital of Italy?"}, {"answer": "Rome"})

    [turn] = mem3.get_messages()
    assert (turn["input"], turn["output"]) == ("Capital of Italy?", "Rome")
    assert mem3.load_memory_variables({}) == {"history": "user: Capital of Italy?\nassistant: Rome"}


def test_buffer_custom_memory_key() -> None:
    mem = ConversationBufferMemory(memory_key="chat_history")
    mem.save_context({"input": "Hi"}, {"output": "Hello!"})

    assert mem.load_memory_variables({}) == {"chat_history": "user: Hi\nassistant: Hello!"}
    assert mem.memory_variables == ["chat_history"]


def test_buffer_example_4_missing_key_stores_none() -> None:
    mem4 = ConversationBufferMemory()
    # Documented: no exception. Zerda also warns, naming the missing key.
    with pytest.warns(ZerdaWarning, match="'input'"):
        mem4.save_context({}, {"output": "..."})

    assert mem4.get_messages()[0]["input"] is None
    assert mem4.get_messages()[0]["output"] == "..."


def test_buffer_example_5_production_stats() -> None:
    mem = ConversationBufferMemory()
    mem.save_context({"input": "Hi"}, {"output": "Hello!"})

    stats = mem.get_memory_stats()
    assert stats["type"] == "ConversationBufferMemory"
    assert stats["message_count"] == 1
    assert stats["total_characters"] == len("Hi") + len("Hello!")
    assert stats["estimated_tokens"] == (len("Hi") + len("Hello!")) // 4
    assert not stats["estimated_tokens"] > 3000

    # Enough text to cross the documented 3,000-token threshold.
    long_input, long_output = "q" * 6000, "a" * 6001
    mem.save_context({"input": long_input}, {"output": long_output})
    stats = mem.get_memory_stats()
    expected_chars = len("Hi") + len("Hello!") + 6000 + 6001
    assert stats["total_characters"] == expected_chars
    assert stats["estimated_tokens"] == expected_chars // 4
    assert stats["estimated_tokens"] > 3000


def test_buffer_load_memory_variables_ignores_inputs() -> None:
    mem = ConversationBufferMemory()
    mem.save_context({"input": "Hi"}, {"output": "Hello!"})

    expected = {"history": "user: Hi\nassistant: Hello!"}
    assert mem.load_memory_variables({}) == expected
    assert mem.load_memory_variables({"input": "something else", "history": "x"}) == expected


def test_buffer_clear() -> None:
    mem = ConversationBufferMemory()
    mem.save_context({"input": "Hi"}, {"output": "Hello!"})
    mem.clear()

    assert mem.get_messages() == []
    assert mem.load_memory_variables({}) == {"history": ""}


def test_buffer_async_wrappers() -> None:
    mem = ConversationBufferMemory()

    async def run() -> dict[str, object]:
        await mem.asave_context({"input": "Hi"}, {"output": "Hello!"})
        return await mem.aload_memory_variables({})

    assert asyncio.run(run()) == {"history": "user: Hi\nassistant: Hello!"}


# -- ConversationBufferWindowMemory page ------------------------------------------------------


def _window_after_five() -> ConversationBufferWindowMemory:
    mem = ConversationBufferWindowMemory(k=3)
    for i in range(5):
        mem.save_context({"input": f"msg {i}"}, {"output": f"reply {i}"})
    return mem


def test_window_example_1_basic() -> None:
    mem = _window_after_five()

    messages = mem.get_messages()
    assert len(messages) == 3
    assert [(m["input"], m["output"]) for m in messages] == [
        ("msg 2", "reply 2"),
        ("msg 3", "reply 3"),
        ("msg 4", "reply 4"),
    ]


def test_window_example_2_window_info() -> None:
    mem = _window_after_five()

    assert mem.get_window_info() == {
        "current_size": 3,
        "max_size": 3,
        "available_slots": 0,
        "is_full": True,
    }


def test_window_info_before_full() -> None:
    mem = ConversationBufferWindowMemory(k=3)
    assert mem.get_window_info() == {
        "current_size": 0,
        "max_size": 3,
        "available_slots": 3,
        "is_full": False,
    }
    mem.save_context({"input": "a"}, {"output": "b"})
    assert mem.get_window_info() == {
        "current_size": 1,
        "max_size": 3,
        "available_slots": 2,
        "is_full": False,
    }


def test_window_example_3_custom_keys_forwarded() -> None:
    mem2 = ConversationBufferWindowMemory(k=10, input_key="q", output_key="a")
    mem2.save_context({"q": "2+2?"}, {"a": "4"})

    [turn] = mem2.get_messages()
    assert (turn["input"], turn["output"]) == ("2+2?", "4")
    assert mem2.load_memory_variables({}) == {"history": "user: 2+2?\nassistant: 4"}


def test_window_return_messages_forwarded() -> None:
    mem = ConversationBufferWindowMemory(k=2, return_messages=True, memory_key="chat")
    for i in range(3):
        mem.save_context({"input": f"msg {i}"}, {"output": f"reply {i}"})

    history = mem.load_memory_variables({})["chat"]
    assert [(t["input"], t["output"]) for t in history] == [
        ("msg 1", "reply 1"),
        ("msg 2", "reply 2"),
    ]


def test_window_example_4_invalid_k() -> None:
    with pytest.raises(ValueError, match="k must be a positive integer") as excinfo:
        ConversationBufferWindowMemory(k=0)
    assert str(excinfo.value).startswith("k must be a positive integer")


def test_window_example_5_production_recent_turns() -> None:
    # The page says this crashes (TypeError on deque slicing); in Zerda both ways work.
    mem = _window_after_five()

    by_limit = mem.get_messages(limit=2)
    recent_2 = mem.get_messages()[-2:]

    assert isinstance(by_limit, list)
    assert isinstance(recent_2, list)
    assert [t["input"] for t in by_limit] == ["msg 3", "msg 4"]
    assert [t["output"] for t in by_limit] == ["reply 3", "reply 4"]
    assert by_limit == recent_2


def test_window_page_crash_snippet_now_works() -> None:
    mem = ConversationBufferWindowMemory(k=5)
    mem.save_context({"input": "hi"}, {"output": "hello"})

    [turn] = mem.get_messages(limit=3)
    assert (turn["input"], turn["output"]) == ("hi", "hello")


def test_window_stats_extend_buffer_stats() -> None:
    mem = _window_after_five()

    stats = mem.get_memory_stats()
    kept = [(f"msg {i}", f"reply {i}") for i in (2, 3, 4)]
    chars = sum(len(i) + len(o) for i, o in kept)
    assert stats["type"] == "ConversationBufferWindowMemory"
    assert stats["message_count"] == 3
    assert stats["total_characters"] == chars
    assert stats["estimated_tokens"] == chars // 4
    assert stats["window_size"] == 3
    assert stats["is_full"] is True
