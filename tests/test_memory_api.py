"""One consistent memory API: constructors, prefixes, typed stats, tools in the budget, logs."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import typing
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from zerda import (
    ConfigurationError,
    ContextOverflowError,
    Message,
    SummarizerError,
    ZerdaWarning,
)
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
    ConversationTokenBufferMemory,
    MemoryStats,
    SummaryMemoryStats,
    TokenMemoryStats,
    WindowMemoryStats,
)
from zerda.stores import InMemoryStore, SessionInfo
from zerda.tokens import ApproxCounter, CallableCounter, count_tools

MEMORIES: list[type[BaseMemory[Any]]] = [
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
]
# The one positional parameter each may take.
POSITIONAL = {
    ConversationBufferMemory: [],
    ConversationBufferWindowMemory: ["k"],
    ConversationTokenBufferMemory: ["max_token_limit"],
    ConversationSummaryBufferMemory: ["max_token_limit"],
    ConversationSummaryMemory: [],
}
WORDS = CallableCounter(lambda text: len(text.split()), name="words")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the weather.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city."},
                "unit": {"type": "string", "enum": ["c", "f"]},
            },
            "required": ["city"],
        },
    },
}


# -- constructors ---------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", MEMORIES)
def test_every_constructor_takes_at_most_one_positional_and_no_catch_all(cls: type) -> None:
    parameters = list(inspect.signature(cls).parameters.values())
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert positional == POSITIONAL[cls]
    assert not [p for p in parameters if p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    names = {p.name for p in parameters}
    assert {"store", "session_id", "strict", "human_prefix", "ai_prefix"} <= names
    if issubclass(cls, ConversationTokenBufferMemory):
        assert {"token_counter", "reserve_tokens", "overflow", "tools"} <= names


@pytest.mark.parametrize(
    ("build", "attribute", "value"),
    [
        (lambda: ConversationBufferMemory(True), "return_messages", True),  # type: ignore[misc]
        (lambda: ConversationBufferMemory(False, "q"), "input_key", "q"),  # type: ignore[misc]
        (lambda: ConversationTokenBufferMemory(300, len), "max_token_limit", 300),  # type: ignore[misc]
        (lambda: ConversationTokenBufferMemory(300, len, 20), "reserve_tokens", 20),  # type: ignore[misc]
        (
            lambda: ConversationSummaryMemory(SUMMARIZER, token_counter=WORDS),  # type: ignore[misc]
            "summarizer",
            "SUMMARIZER",
        ),
    ],
)
def test_old_positional_calls_still_work_for_a_release_with_a_warning(
    build: Any, attribute: str, value: object
) -> None:
    with pytest.warns(ZerdaWarning, match=r"by position is deprecated.*write \w+=\.\.\."):
        memory = build()
    expected = SUMMARIZER if value == "SUMMARIZER" else value
    assert getattr(memory, attribute) == expected


def test_the_old_positional_token_counter_is_the_counter() -> None:
    with pytest.warns(ZerdaWarning, match="token_counter=..."):
        memory = ConversationTokenBufferMemory(300, len)  # type: ignore[misc]
    assert memory.token_counter.count_text("abcd") == 4


def test_a_store_by_position_says_to_name_it() -> None:
    with pytest.raises(ConfigurationError, match=r"store=\.\.\."):
        ConversationBufferMemory(InMemoryStore())  # type: ignore[misc]
    with pytest.raises(ConfigurationError, match=r"ConversationTokenBufferMemory\(store=\.\.\.\)"):
        ConversationTokenBufferMemory(100, InMemoryStore())  # type: ignore[misc]


def test_too_many_positionals_and_a_name_given_twice_are_type_errors() -> None:
    with pytest.raises(TypeError, match="at most 1 positional"):
        ConversationSummaryBufferMemory(100, None, None)  # type: ignore[misc]
    with pytest.raises(TypeError, match="multiple values for argument 'token_counter'"):
        ConversationTokenBufferMemory(100, len, token_counter=len)  # type: ignore[misc]


@pytest.mark.parametrize("cls", MEMORIES)
def test_token_counter_and_keywords_are_spelled_the_same_everywhere(cls: type) -> None:
    options: dict[str, Any] = {"session_id": "s", "human_prefix": "Human", "ai_prefix": "AI"}
    if issubclass(cls, ConversationTokenBufferMemory):
        options["token_counter"] = "approx"
    memory = cls(**options)
    assert (memory.session_id, memory.human_prefix, memory.ai_prefix) == ("s", "Human", "AI")
    if issubclass(cls, ConversationTokenBufferMemory):
        assert isinstance(memory.token_counter, ApproxCounter)


# -- the seed API: prefixes --------------------------------------------------------------------


@pytest.mark.parametrize("cls", MEMORIES[:3])
def test_human_and_ai_prefixes_name_the_speakers_of_the_text(cls: type) -> None:
    counted = {"token_counter": WORDS} if issubclass(cls, ConversationTokenBufferMemory) else {}
    memory = cls(human_prefix="Human", ai_prefix="AI", **counted)
    memory.add_message(Message("system", "Be brief."))
    memory.save_context({"input": "2+2?"}, {"output": "4"})
    assert memory.load_memory_variables({}) == {"history": "system: Be brief.\nHuman: 2+2?\nAI: 4"}
    default = cls(**counted)
    default.save_context({"input": "2+2?"}, {"output": "4"})
    assert default.load_memory_variables({})["history"] == "user: 2+2?\nassistant: 4"


@pytest.mark.parametrize("cls", MEMORIES[:3])
def test_the_text_shows_no_none(cls: type) -> None:
    """A turn whose answer is a tool call still waiting, or a missing input key: no line says
    ``assistant: None`` or ``user: None`` (issue #28); the turn dicts keep ``None``."""
    counted = {"token_counter": WORDS} if issubclass(cls, ConversationTokenBufferMemory) else {}
    memory = cls(**counted)
    with pytest.warns(ZerdaWarning, match="'input' is missing"):
        memory.save_context({"question": "x"}, {"output": "first"})
    memory.add_messages(
        [
            {"role": "user", "content": "the price?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "p", "arguments": "{}"}}
                ],
            },
        ]
    )
    assert memory.load_memory_variables({})["history"] == "assistant: first\nuser: the price?"
    assert [(d["input"], d["output"]) for d in memory.get_messages()] == [
        (None, "first"),
        ("the price?", None),
    ]


def test_migrating_names_the_prefixes_zerda_has() -> None:
    page = (Path(__file__).resolve().parents[1] / "docs" / "migrating.md").read_text("utf-8")
    row = next(line for line in page.splitlines() if line.startswith("| `human_prefix="))
    assert "no equivalent" not in row
    memory = ConversationBufferMemory(human_prefix="Human", ai_prefix="AI")
    memory.save_context({"input": "hi"}, {"output": "hello"})
    assert memory.load_memory_variables({})["history"] == "Human: hi\nAI: hello"


@pytest.mark.parametrize("bad", ["", None, 3])
def test_a_bad_prefix_is_refused(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="human_prefix"):
        ConversationBufferMemory(human_prefix=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="ai_prefix"):
        ConversationBufferMemory(ai_prefix=bad)  # type: ignore[arg-type]


# -- errors that describe the case at hand --------------------------------------------------------


def test_a_tiny_budget_without_tool_calls_says_what_is_there() -> None:
    # A word counter: each message costs 3 overhead tokens, the reply priming 3 more.
    memory = ConversationTokenBufferMemory(6, token_counter=WORDS)
    memory.save_context({"input": "hello there"}, {"output": "hi"})
    with pytest.raises(ContextOverflowError) as info:
        memory.get_context()
    text = str(info.value)
    assert "tool" not in text, text  # no tool call anywhere: no word of them
    assert "media" not in text
    assert "overhead every message costs (2 messages)" in text
    assert "taken by the reply priming (3 tokens by this counter)" in text


def test_an_overflow_names_only_the_parts_that_take_the_room() -> None:
    memory = ConversationTokenBufferMemory(8, token_counter=WORDS, overflow="raise")
    memory.add_message(Message("system", "one two three four five"))
    with pytest.raises(ContextOverflowError, match="the system messages and the reply priming"):
        memory.get_context()


# -- typed stats --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("memory", "stats_type"),
    [
        (ConversationBufferMemory(), MemoryStats),
        (ConversationBufferWindowMemory(k=2), WindowMemoryStats),
        (ConversationTokenBufferMemory(200, token_counter=WORDS), TokenMemoryStats),
        (ConversationSummaryBufferMemory(200, token_counter=WORDS), SummaryMemoryStats),
        (ConversationSummaryMemory(token_counter=WORDS), SummaryMemoryStats),
    ],
)
def test_the_stats_have_exactly_the_keys_their_typed_dict_declares(
    memory: BaseMemory[Any], stats_type: type
) -> None:
    memory.save_context({"input": "hi"}, {"output": "hello"})
    stats = memory.get_memory_stats()
    hints = typing.get_type_hints(stats_type)
    assert set(stats) == set(hints)
    for key, hint in hints.items():
        if isinstance(hint, type) and not typing.is_typeddict(hint):  # not the Optional ones
            assert isinstance(stats[key], hint), key
    _, with_context = memory.get_context_with_stats()
    assert with_context == stats


def test_session_info_fields_say_what_they_count_and_the_old_names_warn() -> None:
    store = InMemoryStore()
    memory = ConversationBufferMemory(store=store, session_id="a")
    memory.add_message(Message("system", "s"))
    memory.save_context({"input": "hi"}, {"output": "hello"})
    (info,) = store.list_sessions()
    assert isinstance(info, SessionInfo)
    assert (info.messages, info.turns) == (3, 1)
    with pytest.warns(ZerdaWarning, match="use SessionInfo.messages"):
        assert info.message_count == 3
    with pytest.warns(ZerdaWarning, match="use SessionInfo.turns"):
        assert info.turn_count == 1


# -- tools in the budget ---------------------------------------------------------------------------


def test_count_tools_follows_the_documented_formula() -> None:
    counter = CallableCounter(len, name="chars")
    name_line = len("get_weather:Get the weather")  # the final period dropped
    city = 3 + len("city:string:The city")
    unit = 3 + (-3 + (3 + 1) + (3 + 1)) + len("unit:string:")
    expected = 7 + name_line + 3 + city + unit + 12
    assert count_tools([WEATHER], counter) == expected
    assert count_tools([], counter) == 0
    # The Responses API's flat form costs the same.
    flat = {"type": "function", **WEATHER["function"]}  # type: ignore[dict-item]
    assert count_tools([flat], counter) == expected
    # Two tools: the closing 12 once.
    assert count_tools([WEATHER, WEATHER], counter) == 2 * expected - 12


def test_nested_schemas_count_as_their_json() -> None:
    counter = CallableCounter(len, name="chars")
    nested = {"type": "array", "items": {"type": "string"}, "description": "Tags."}
    tool = {
        "type": "function",
        "function": {"name": "t", "parameters": {"properties": {"tags": nested}}},
    }
    rest = json.dumps({"items": {"type": "string"}}, separators=(",", ":"), sort_keys=True)
    expected = 7 + len("t:") + 3 + 3 + len("tags:array:Tags") + len(rest) + 12
    assert count_tools([tool], counter) == expected


@pytest.mark.parametrize(
    "bad",
    [{"type": "function"}, "get_weather", [42], [{"type": "function", "function": {}}]],
)
def test_bad_tools_are_refused_when_the_memory_is_built(bad: object) -> None:
    with pytest.raises(ConfigurationError, match="tool"):
        ConversationTokenBufferMemory(100, token_counter=WORDS, tools=bad)  # type: ignore[arg-type]


def _turns(memory: BaseMemory[Any], n: int) -> None:
    for i in range(n):
        memory.save_context({"input": f"question {i} " + "x " * 20}, {"output": f"answer {i}"})


def test_the_tools_come_out_of_the_budget_and_are_reported() -> None:
    counter = ApproxCounter()
    tools_tokens = count_tools([WEATHER], counter)
    plain = ConversationTokenBufferMemory(200, token_counter=counter)
    with_tools = ConversationTokenBufferMemory(200, token_counter=counter, tools=[WEATHER])
    for memory in (plain, with_tools):
        _turns(memory, 12)
    context, stats = with_tools.get_context_with_stats()
    assert stats["tokens_by_part"]["tools"] == tools_tokens > 0
    assert counter.count_messages(context) + tools_tokens <= 200
    assert stats["context_tokens"] == counter.count_messages(context) + tools_tokens
    assert len(context) < len(plain.get_context()), "the tools took the room of a turn"
    assert plain.get_memory_stats()["tokens_by_part"]["tools"] == 0


def test_tools_given_to_one_call_replace_the_memorys_own() -> None:
    counter = ApproxCounter()
    memory = ConversationTokenBufferMemory(200, token_counter=counter, tools=[WEATHER])
    _turns(memory, 12)
    without = memory.get_memory_stats(tools=[])
    assert without["tokens_by_part"]["tools"] == 0
    assert len(memory.get_context(tools=[])) > len(memory.get_context())
    twice = memory.get_memory_stats(tools=[WEATHER, WEATHER])
    assert twice["tokens_by_part"]["tools"] == count_tools([WEATHER, WEATHER], counter)


def test_the_async_twins_take_tools_too() -> None:
    counter = ApproxCounter()
    memory = ConversationSummaryBufferMemory(200, token_counter=counter)
    _turns(memory, 12)

    async def read() -> None:
        context, stats = await memory.aget_context_with_stats(tools=[WEATHER])
        assert stats["tokens_by_part"]["tools"] == count_tools([WEATHER], counter)
        assert counter.count_messages(context) + stats["tokens_by_part"]["tools"] <= 200
        assert (await memory.aget_memory_stats(tools=[WEATHER])) == stats
        assert await memory.aget_context(tools=[WEATHER]) == context

    asyncio.run(read())


def test_tools_that_leave_no_room_name_themselves() -> None:
    memory = ConversationTokenBufferMemory(40, token_counter=ApproxCounter(), tools=[WEATHER])
    memory.save_context({"input": "hi"}, {"output": "hello"})
    with pytest.raises(ContextOverflowError, match="the tool definitions and the reply priming"):
        memory.get_context()


# -- logging ------------------------------------------------------------------------------------


class _Failing:
    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        raise SummarizerError("the model is down; it was asked about SECRET-ORDER")

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


SUMMARIZER = _Failing()


def test_each_context_built_is_one_debug_record_with_its_fields(
    caplog: pytest.LogCaptureFixture,
) -> None:
    memory = ConversationTokenBufferMemory(60, token_counter=WORDS, session_id="ada")
    _turns(memory, 5)
    with caplog.at_level(logging.DEBUG, logger="zerda.memory"):
        context = memory.get_context()
    (record,) = [r for r in caplog.records if r.message.startswith("context built")]
    assert record.levelno == logging.DEBUG
    fields = record.zerda  # type: ignore[attr-defined]
    assert fields["session"] == "ada"
    assert fields["memory"] == "ConversationTokenBufferMemory"
    assert fields["context_tokens"] == WORDS.count_messages(context)
    assert fields["turns_kept"] + fields["turns_evicted"] == 5
    assert fields["turns_kept"] == len(context) // 2
    assert "question" not in record.getMessage(), "counts, never the conversation's text"


def test_folds_log_at_info_failures_at_warning_and_never_any_content(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="zerda.memory"):
        folding = ConversationSummaryBufferMemory(60, token_counter=WORDS, session_id="f")
        _turns(folding, 6)
        failing = ConversationSummaryBufferMemory(
            60, token_counter=WORDS, summarizer=SUMMARIZER, session_id="g"
        )
        _turns(failing, 6)
    folds = [r for r in caplog.records if r.getMessage().startswith("summary folded")]
    assert folds
    assert all(r.levelno == logging.INFO for r in folds)
    assert "session='f'" in folds[0].getMessage()
    failures = [r for r in caplog.records if r.getMessage().startswith("summarizer failed")]
    assert failures
    assert all(r.levelno == logging.WARNING for r in failures)
    for r in caplog.records:
        text = r.getMessage()
        for said in ("question", "answer", "SECRET"):
            assert said not in text, text


def test_nothing_is_logged_at_info_by_plain_reads_and_writes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.INFO, logger="zerda"), warnings.catch_warnings():
        memory = ConversationBufferWindowMemory(k=2)
        _turns(memory, 4)
        memory.get_context()
    assert [r for r in caplog.records if r.name.startswith("zerda")] == []
