"""Regression tests for the defects the reference pages document (DESIGN.md §3), the pinned
details of the seed API, and bad input."""

from __future__ import annotations

import asyncio
import threading
import time
import warnings
from typing import Any

import pytest

from zerda.errors import ConfigurationError, InvalidMessageError, ZerdaError, ZerdaWarning
from zerda.memory import BaseMemory, ConversationBufferMemory, ConversationBufferWindowMemory
from zerda.messages import Message, Role

MEMORY_FACTORIES = [
    pytest.param(ConversationBufferMemory, id="buffer"),
    pytest.param(lambda **kw: ConversationBufferWindowMemory(k=3, **kw), id="window"),
]


def _fill(memory: BaseMemory, n: int) -> None:
    for i in range(n):
        memory.save_context({"input": f"in {i}"}, {"output": f"out {i}"})


def _inputs(turns: list[dict[str, Any]]) -> list[Any]:
    return [t["input"] for t in turns]


# -- the six documented defects -----------------------------------------------------------


def test_defect_window_get_messages_with_limit_raised_type_error() -> None:
    mem = ConversationBufferWindowMemory(k=5)
    _fill(mem, 7)

    assert _inputs(mem.get_messages(limit=3)) == ["in 4", "in 5", "in 6"]
    # A limit larger than the window gives the window, not the whole stored log.
    assert _inputs(mem.get_messages(limit=100)) == [f"in {i}" for i in range(2, 7)]


def test_defect_window_get_messages_returned_a_deque() -> None:
    mem = ConversationBufferWindowMemory(k=3)
    _fill(mem, 5)

    messages = mem.get_messages()
    assert type(messages) is list
    assert type(mem.get_messages(limit=2)) is list
    assert _inputs(messages[-2:]) == ["in 3", "in 4"]
    assert _inputs(messages[1:]) == ["in 3", "in 4"]


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
def test_defect_return_messages_returned_internal_list_by_reference(factory: Any) -> None:
    mem = factory(return_messages=True)
    _fill(mem, 2)

    first = mem.load_memory_variables({})["history"]
    second = mem.load_memory_variables({})["history"]
    assert first == second
    assert first is not second

    first.append({"input": "injected", "output": "x", "timestamp": 0.0})
    first[0]["input"] = "changed"
    del first[1]
    second[0]["output"] = "changed too"

    again = mem.load_memory_variables({})["history"]
    assert [(t["input"], t["output"]) for t in again] == [("in 0", "out 0"), ("in 1", "out 1")]
    assert [(t["input"], t["output"]) for t in mem.get_messages()] == [
        ("in 0", "out 0"),
        ("in 1", "out 1"),
    ]


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
def test_defect_get_messages_result_is_a_copy(factory: Any) -> None:
    mem = factory()
    _fill(mem, 2)

    got = mem.get_messages()
    got.clear()
    assert _inputs(mem.get_messages()) == ["in 0", "in 1"]


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
def test_defect_limit_zero_returned_everything(factory: Any) -> None:
    mem = factory()
    _fill(mem, 3)

    assert mem.get_messages(limit=0) == []
    assert mem.get_messages(limit=None) != []


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
@pytest.mark.parametrize("limit", [-1, -5])
def test_defect_negative_limit_raises_value_error(factory: Any, limit: int) -> None:
    mem = factory()
    _fill(mem, 3)

    with pytest.raises(ValueError, match="limit"):
        mem.get_messages(limit=limit)


def test_defect_not_thread_safe() -> None:
    threads_n, per_thread = 4, 250
    mem = ConversationBufferMemory()
    barrier = threading.Barrier(threads_n)

    def work(tid: int) -> None:
        barrier.wait()
        for i in range(per_thread):
            mem.save_context({"input": f"{tid}:{i}"}, {"output": f"{tid}:{i}"})

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()

    turns = mem.get_messages()
    assert len(turns) == threads_n * per_thread
    # Writes are atomic per turn: every turn's output belongs to its own input.
    assert all(t["input"] == t["output"] for t in turns)
    history = mem.get_history()
    assert [m.role for m in history] == [Role.USER, Role.ASSISTANT] * (threads_n * per_thread)


ASYNC_SEED_METHODS = [
    "asave_context",
    "aload_memory_variables",
    "aclear",
    "aget_messages",
    "aget_memory_stats",
    "aadd_message",
    "aadd_messages",
    "aget_context",
    "aget_history",
]


@pytest.mark.parametrize("cls", [ConversationBufferMemory, ConversationBufferWindowMemory])
@pytest.mark.parametrize("name", ASYNC_SEED_METHODS)
def test_defect_async_wrappers_duplicated_in_each_class(cls: type[BaseMemory], name: str) -> None:
    assert name in vars(BaseMemory)
    assert name not in vars(cls)
    assert getattr(cls, name) is getattr(BaseMemory, name)


# -- pinned details -------------------------------------------------------------------------


@pytest.mark.parametrize("k", [0, -1, 1.5, "3", True, False, None])
def test_window_k_must_be_a_positive_int(k: Any) -> None:
    with pytest.raises(ValueError, match="k must be a positive integer") as excinfo:
        ConversationBufferWindowMemory(k=k)
    assert str(excinfo.value).startswith("k must be a positive integer")
    assert isinstance(excinfo.value, ConfigurationError)


@pytest.mark.parametrize("k", [1, 2, 7])
def test_window_k_accepts_positive_ints(k: int) -> None:
    mem = ConversationBufferWindowMemory(k=k)
    assert mem.k == k
    assert mem.get_window_info()["max_size"] == k


def test_missing_input_key_stores_none_and_warns() -> None:
    mem = ConversationBufferMemory(input_key="question")
    with pytest.warns(ZerdaWarning) as record:
        mem.save_context({"q": "typo'd key"}, {"output": "answer"})

    assert len(record) == 1
    text = str(record[0].message)
    assert "'question'" in text
    assert "'q'" in text  # the keys that were there
    [turn] = mem.get_messages()
    assert turn["input"] is None
    assert turn["output"] == "answer"


def test_missing_key_warning_points_at_the_caller() -> None:
    mem = ConversationBufferWindowMemory(k=2)
    with pytest.warns(ZerdaWarning) as record:
        mem.save_context({}, {"output": "x"})
    assert record[0].filename == __file__


def test_missing_output_key_stores_none_and_warns() -> None:
    mem = ConversationBufferMemory()
    with pytest.warns(ZerdaWarning, match="'output'"):
        mem.save_context({"input": "hi"}, {"text": "hello"})

    [turn] = mem.get_messages()
    assert turn == {"input": "hi", "output": None, "timestamp": turn["timestamp"]}
    assert mem.load_memory_variables({})["history"] == "user: hi"  # no "assistant: None"


def test_both_keys_missing_warns_twice() -> None:
    mem = ConversationBufferWindowMemory(k=2)
    with pytest.warns(ZerdaWarning) as record:
        mem.save_context({}, {})

    texts = [str(r.message) for r in record]
    assert len(texts) == 2
    assert any("'input'" in t for t in texts)
    assert any("'output'" in t for t in texts)
    assert mem.get_messages()[0]["input"] is None
    assert mem.get_messages()[0]["output"] is None


def test_missing_key_warning_in_async_save_context() -> None:
    mem = ConversationBufferMemory()
    with pytest.warns(ZerdaWarning, match="'input'"):
        asyncio.run(mem.asave_context({}, {"output": "x"}))
    assert mem.get_messages()[0]["input"] is None


def test_key_present_with_none_value_stores_none_without_warning() -> None:
    mem = ConversationBufferMemory()
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mem.save_context({"input": None}, {"output": "x"})
    assert [r for r in record if issubclass(r.category, ZerdaWarning)] == []
    assert mem.get_messages()[0]["input"] is None


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
def test_turn_dicts_shape(factory: Any) -> None:
    mem = factory(return_messages=True)
    before = time.time()
    mem.save_context({"input": "a"}, {"output": "b"})
    after = time.time()

    for turns in (mem.get_messages(), mem.load_memory_variables({})["history"]):
        [turn] = turns
        assert set(turn) == {"input", "output", "timestamp"}
        assert (turn["input"], turn["output"]) == ("a", "b")
        assert type(turn["timestamp"]) is float
        assert before <= turn["timestamp"] <= after


@pytest.mark.parametrize("return_messages", [False, True])
def test_tool_turn_dict_gives_user_text_and_final_assistant_text(return_messages: bool) -> None:
    mem = ConversationBufferMemory(return_messages=return_messages)
    mem.add_messages(
        [
            {"role": "user", "content": "weather in Oslo?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "weather", "arguments": '{"city": "Oslo"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 3}'},
            {"role": "assistant", "content": "3 degrees."},
        ]
    )

    [turn] = mem.get_messages()
    assert (turn["input"], turn["output"]) == ("weather in Oslo?", "3 degrees.")
    history = mem.load_memory_variables({})["history"]
    if return_messages:
        assert [(t["input"], t["output"]) for t in history] == [("weather in Oslo?", "3 degrees.")]
    else:
        assert history == "user: weather in Oslo?\nassistant: 3 degrees."


def test_buffer_stats_pinned() -> None:
    mem = ConversationBufferMemory()
    pairs = [("Hello there", "Hi!"), ("x" * 37, "y" * 101), ("", "z")]
    for i, o in pairs:
        mem.save_context({"input": i}, {"output": o})
    mem.save_context({"input": 12345}, {"output": None})
    # Documented formula: len(str(input)) + len(str(output)) per turn.
    chars = sum(len(str(i)) + len(str(o)) for i, o in pairs) + len("12345") + len(str(None))

    stats = mem.get_memory_stats()
    assert stats["type"] == "ConversationBufferMemory"
    assert stats["message_count"] == 4
    assert stats["total_messages"] == 8
    assert stats["total_characters"] == chars
    assert stats["estimated_tokens"] == chars // 4
    assert "window_size" not in stats
    assert "is_full" not in stats


def test_stats_count_turns_and_messages_separately() -> None:
    mem = ConversationBufferMemory()
    mem.add_messages(
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}],
            },
            {"role": "tool", "tool_call_id": "c", "content": "r"},
            {"role": "assistant", "content": "a"},
        ]
    )
    mem.save_context({"input": "q2"}, {"output": "a2"})

    stats = mem.get_memory_stats()
    assert stats["message_count"] == 2
    assert stats["total_messages"] == 6


@pytest.mark.parametrize("k", [1, 3, 4])
def test_window_stats_pinned(k: int) -> None:
    mem = ConversationBufferWindowMemory(k=k)
    pairs = [(f"input number {i}", "o" * i) for i in range(4)]
    for n, (i, o) in enumerate(pairs, start=1):
        mem.save_context({"input": i}, {"output": o})
        kept = pairs[max(0, n - k) : n]
        chars = sum(len(a) + len(b) for a, b in kept)
        stats = mem.get_memory_stats()
        assert stats["type"] == "ConversationBufferWindowMemory"
        assert stats["message_count"] == len(kept)
        assert stats["total_messages"] == 2 * len(kept)
        assert stats["total_characters"] == chars
        assert stats["estimated_tokens"] == chars // 4
        assert stats["window_size"] == k
        assert stats["is_full"] is (n >= k)
        assert mem.get_window_info() == {
            "current_size": len(kept),
            "max_size": k,
            "available_slots": k - len(kept),
            "is_full": n >= k,
        }


def test_window_info_and_stats_async_twins() -> None:
    mem = ConversationBufferWindowMemory(k=2)
    _fill(mem, 3)

    async def run() -> tuple[Any, ...]:
        return (
            await mem.aget_window_info(),
            await mem.aget_memory_stats(),
            await mem.aget_messages(limit=1),
        )

    info, stats, last = asyncio.run(run())
    assert info == mem.get_window_info()
    assert stats == mem.get_memory_stats()
    assert last == mem.get_messages(limit=1)
    assert _inputs(last) == ["in 2"]


def test_async_limit_checks_match_sync() -> None:
    mem = ConversationBufferWindowMemory(k=2)
    _fill(mem, 3)
    assert asyncio.run(mem.aget_messages(limit=0)) == []
    with pytest.raises(ValueError, match="limit"):
        asyncio.run(mem.aget_messages(limit=-1))


# -- bad input ------------------------------------------------------------------------------


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
@pytest.mark.parametrize(
    ("inputs", "outputs"),
    [
        ("hi", {"output": "x"}),
        (["input", "hi"], {"output": "x"}),
        (None, {"output": "x"}),
        ({"input": "hi"}, "x"),
        ({"input": "hi"}, None),
        ({"input": "hi"}, [("output", "x")]),
        # Missing input key and bad outputs: an error, and no "stored None" warning.
        ({}, "x"),
        ({"question": "hi"}, None),
    ],
)
def test_save_context_rejects_non_dicts(factory: Any, inputs: Any, outputs: Any) -> None:
    mem = factory()
    mem.save_context({"input": "before"}, {"output": "kept"})

    with pytest.raises(ConfigurationError, match="must be a dict"):
        mem.save_context(inputs, outputs)

    # Bad input never corrupts the store: the earlier turn is there, and nothing else.
    assert [(t["input"], t["output"]) for t in mem.get_messages()] == [("before", "kept")]
    assert len(mem.get_history()) == 2


def test_async_save_context_rejects_non_dicts() -> None:
    mem = ConversationBufferMemory()
    with pytest.raises(ConfigurationError):
        asyncio.run(mem.asave_context({"input": "hi"}, "x"))  # type: ignore[arg-type]
    assert mem.get_history() == []


@pytest.mark.parametrize("cls", [ConversationBufferMemory, ConversationBufferWindowMemory])
@pytest.mark.parametrize(
    "kwargs",
    [
        {"return_messages": "yes"},
        {"return_messages": 1},
        {"return_messages": None},
        {"input_key": 1},
        {"input_key": ""},
        {"output_key": None},
        {"output_key": b"output"},
        {"memory_key": ""},
        {"memory_key": ["history"]},
    ],
)
def test_bad_constructor_options_raise_configuration_error(
    cls: type[BaseMemory], kwargs: dict[str, Any]
) -> None:
    [(name, value)] = kwargs.items()
    with pytest.raises(ConfigurationError, match=name) as excinfo:
        cls(**kwargs)
    assert isinstance(excinfo.value, ZerdaError)
    assert repr(value) in str(excinfo.value)


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
@pytest.mark.parametrize("limit", ["2", 1.5, True, False, [1]])
def test_limit_of_wrong_type_raises(factory: Any, limit: Any) -> None:
    mem = factory()
    _fill(mem, 3)
    with pytest.raises(ConfigurationError, match="limit"):
        mem.get_messages(limit=limit)


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
@pytest.mark.parametrize(
    "single",
    [
        {"role": "user", "content": "hi"},
        Message(Role.USER, "hi"),
        "hi",
        b"hi",
        42,
        None,
    ],
    ids=["dict", "Message", "str", "bytes", "int", "None"],
)
def test_add_messages_given_a_single_message_raises(factory: Any, single: Any) -> None:
    mem = factory()
    with pytest.raises(InvalidMessageError, match="add_message"):
        mem.add_messages(single)
    assert mem.get_history() == []


INVALID_OPENAI_DICTS = [
    pytest.param({"content": "no role"}, id="no-role"),
    pytest.param({"role": "robot", "content": "x"}, id="unknown-role"),
    pytest.param({"role": "user", "content": None}, id="user-content-none"),
    pytest.param({"role": "user", "content": [{"type": "txt", "text": "x"}]}, id="bad-part"),
    pytest.param({"role": "user", "content": 42}, id="content-int"),
    pytest.param({"role": "tool", "content": "result"}, id="tool-without-call-id"),
    pytest.param({"role": "user", "content": "x", "tool_call_id": "c1"}, id="call-id-on-user"),
    pytest.param(
        {
            "role": "user",
            "content": "x",
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f"}}],
        },
        id="tool-calls-on-user",
    ),
    pytest.param(
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c", "type": "function"}]},
        id="tool-call-without-function",
    ),
    pytest.param(
        {"role": "assistant", "content": None, "tool_calls": {"id": "c"}},
        id="tool-calls-not-a-list",
    ),
    pytest.param({"role": "user", "content": "x", "color": "red"}, id="unknown-key"),
    pytest.param({"role": "user", "content": "x", "created_at": "now"}, id="bad-created-at"),
    pytest.param("user: hi", id="string"),
    pytest.param(None, id="none"),
]


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
@pytest.mark.parametrize("bad", INVALID_OPENAI_DICTS)
def test_invalid_openai_dict_is_rejected(factory: Any, bad: Any) -> None:
    mem = factory()
    mem.save_context({"input": "before"}, {"output": "kept"})
    stored = mem.get_history()

    with pytest.raises(InvalidMessageError) as raised:
        mem.add_message(bad)
    assert not str(raised.value).startswith("message 0"), "a single message has no index"
    with pytest.raises(InvalidMessageError):
        asyncio.run(mem.aadd_message(bad))

    assert mem.get_history() == stored


@pytest.mark.parametrize("factory", MEMORY_FACTORIES)
@pytest.mark.parametrize("bad_index", [0, 2, 4])
def test_add_messages_batch_is_atomic_and_names_the_bad_index(factory: Any, bad_index: int) -> None:
    mem = factory()
    mem.save_context({"input": "before"}, {"output": "kept"})
    stored = mem.get_history()
    batch: list[Any] = [
        {"role": "user", "content": "one"},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
        {"role": "assistant", "content": "four"},
        {"role": "user", "content": "five"},
    ]
    batch[bad_index] = {"role": "wizard", "content": "bad"}

    with pytest.raises(InvalidMessageError, match=rf"\b{bad_index}\b") as excinfo:
        mem.add_messages(batch)
    assert "wizard" in str(excinfo.value)
    assert mem.get_history() == stored

    with pytest.raises(InvalidMessageError, match=rf"\b{bad_index}\b"):
        asyncio.run(mem.aadd_messages(batch))
    assert mem.get_history() == stored
