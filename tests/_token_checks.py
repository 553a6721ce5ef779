"""A reference model of ConversationTokenBufferMemory and the checks the token tests share.

The reference is written from the specification, not from the library: it groups turns with
``scan_turns``, makes each turn sendable (a call without its result goes, and a greeting
before the first user message), counts every message with the test's own counter and walks
the turns from the newest. A newest turn alone over the budget is checked by what the
specification says of it (its texts cut in the middle, every message kept) rather than
predicted to the character. The checks compare the memory with the model and verify the
invariants on their own.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from _conversations import scan_turns, sendable
from zerda.errors import ContextOverflowError
from zerda.memory import ConversationTokenBufferMemory
from zerda.messages import PINNED, Message, Role, TextPart
from zerda.policies import MARKER
from zerda.tokens import TokenCounter


class CountingCounter:
    """A TokenCounter over another one that counts how often each method is called."""

    def __init__(self, inner: TokenCounter) -> None:
        self.inner = inner
        self.message_calls = 0
        self.messages_calls = 0
        self.text_calls = 0

    @property
    def name(self) -> str:
        return self.inner.name

    def count_text(self, text: str) -> int:
        self.text_calls += 1
        return self.inner.count_text(text)

    def count_message(self, message: Message) -> int:
        self.message_calls += 1
        return self.inner.count_message(message)

    def count_messages(self, messages: Iterable[Message]) -> int:
        self.messages_calls += 1
        return self.inner.count_messages(messages)


@dataclass
class Expected:
    """What the memory must show: a context, or (``context is None``) an overflow error."""

    context: list[Message] | None
    needed: int = 0
    system_tokens: int = 0
    turn_tokens: int = 0
    turns_in_context: int = 0
    # Turns the walk took, those repair emptied (a greeting) included.
    walked: int = 0
    truncated: bool = False
    # The newest turn alone over the budget, shortened: the context is these messages, their
    # longest texts cut in the middle (``context`` is then None and ``needed`` 0).
    shortened: list[Message] = field(default_factory=list)
    turns: list[list[Message]] = field(default_factory=list)
    turn_costs: list[int] = field(default_factory=list)
    fixed: int = 0


def expect_from_turns(
    systems: Sequence[Message],
    system_tokens: int,
    turns: Sequence[Sequence[Message]],
    costs: Sequence[Sequence[int]],
    priming: int,
    budget: int,
    overflow: str,
    counter: TokenCounter,
) -> Expected:
    """The expected context, from turns and each message's count (``costs[t][i]``);
    ``counter`` tells what a shortened turn costs at the least."""
    fixed = system_tokens + priming
    turn_costs = [sum(c) for c in costs]
    base = Expected(None, system_tokens=system_tokens, turns=[list(t) for t in turns], fixed=fixed)
    base.turn_costs = turn_costs
    if fixed > budget:
        base.needed = fixed
        return base
    room = budget - fixed
    kept = 0
    used = 0
    for cost in reversed(turn_costs):
        if used + cost > room:
            break
        used += cost
        kept += 1
    if kept or not turns:
        kept_turns = turns[len(turns) - kept :]
        base.context = [*systems, *(m for t in kept_turns for m in t)]
        base.turn_tokens = used
        base.turns_in_context = sum(1 for t in kept_turns if t)
        base.walked = kept
        return base
    if overflow == "raise":
        base.needed = fixed + turn_costs[-1]
        return base
    least = fixed + sum(_least(m, counter) for m in turns[-1])
    if least > budget:  # even with every text cut to a marker
        base.needed = least
        return base
    base.shortened = list(turns[-1])
    base.turns_in_context = 1
    base.truncated = True
    return base


def sendable_turns(stored: Sequence[Message]) -> list[list[Message]]:
    """Each turn of ``stored`` as a provider takes it (an empty list for a greeting)."""
    turns = scan_turns(list(stored))
    return [[] if t[0].role is not Role.USER else sendable(t) for t in turns]


def expect(
    stored: Sequence[Message], counter: TokenCounter, budget: int, overflow: str
) -> Expected:
    systems = [m for m in stored if m.role in PINNED]
    turns = sendable_turns(stored)
    return expect_from_turns(
        systems,
        sum(counter.count_message(m) for m in systems),
        turns,
        [[counter.count_message(m) for m in t] for t in turns],
        counter.count_messages([]),
        budget,
        overflow,
        counter,
    )


def _least(m: Message, counter: TokenCounter) -> int:
    """What ``m`` costs with each of its texts of more than a marker and 4 tokens cut to that:
    the least a shortened message costs."""
    floor = counter.count_text(MARKER.format(n="999,999")) + 4
    n = counter.count_message(m)
    texts = (
        [m.content]
        if isinstance(m.content, str)
        else [p.text for p in m.content or () if isinstance(p, TextPart)]
    )
    for text in texts:
        size = counter.count_text(text) if text else 0
        n -= size - min(size, floor)
    return n


def check_structure(
    context: list[Message], stored: Sequence[Message], *, truncated: bool
) -> list[Message]:
    """Invariants that hold for any context, whatever the budget; returns its turn part."""
    systems = [m for m in stored if m.role in PINNED]
    assert context[: len(systems)] == systems, "pinned messages first, in order"
    rest = context[len(systems) :]
    assert all(m.role not in PINNED for m in rest)
    others = [m for t in sendable_turns(stored) for m in t]
    if not others:
        assert rest == []
        return rest
    # Never a silent empty context: the newest turn is always in it, opening on its user
    # message (cut short, when truncated, but whole: every message is there).
    assert rest, "empty context although there are turns"
    assert rest[0].role is Role.USER, "the context opens on a user message"
    if truncated:
        newest = sendable_turns(stored)[-1]
        assert [m.id for m in rest] == [m.id for m in newest]
        for got, full in zip(rest, newest, strict=True):
            assert got.tool_calls == full.tool_calls, "calls are never cut"
            if got.content != full.content:
                assert MARKER.split("{")[0] in got.text, "a cut text says so"
    else:
        # A contiguous run of the sendable conversation, ending with its newest message.
        assert rest == others[len(others) - len(rest) :]
    # No tool result without its call; no call without its result.
    calls: set[str] = set()
    for m in rest:
        if m.role is Role.TOOL:
            assert m.tool_call_id in calls, f"orphan tool result {m.tool_call_id}"
        calls.update(c.id for c in m.tool_calls)
    answered = {m.tool_call_id for m in rest if m.role is Role.TOOL}
    assert calls <= answered, f"calls without results: {calls - answered}"
    return rest


def check_overflow_error(exc: ContextOverflowError, expected: Expected, budget: int) -> None:
    assert exc.limit == budget
    assert exc.needed > exc.limit
    assert exc.needed == expected.needed


def check_memory(
    memory: ConversationTokenBufferMemory,
    stored: Sequence[Message],
    counter: TokenCounter,
    *,
    limit: int,
    reserve: int,
    overflow: str,
    expected: Expected | None = None,
) -> Expected:
    """Compare every read of ``memory`` with the reference and check the invariants.

    ``counter`` must count like the memory's counter (the same kind, another instance).
    """
    budget = limit - reserve
    exp = expected if expected is not None else expect(stored, counter, budget, overflow)
    stats = memory.get_memory_stats()
    n_turns = len(exp.turns)
    assert stats["token_limit"] == limit
    assert stats["stored_turns"] == n_turns
    assert stats["tokens_by_part"]["system"] == exp.system_tokens
    assert stats["tokens_by_part"]["summary"] == 0

    if exp.context is None and not exp.truncated:
        for read in (memory.get_context, memory.load_memory_variables, memory.get_messages):
            with pytest.raises(ContextOverflowError) as info:
                read()
            check_overflow_error(info.value, exp, budget)
        assert stats["context_tokens"] == 0
        assert isinstance(stats["overflow"], str)
        assert stats["overflow"]
        assert stats["turns_in_context"] == 0
        assert stats["turns_evicted"] == n_turns
        assert stats["message_count"] == 0
        return exp

    context = memory.get_context()
    if not exp.truncated:
        assert context == exp.context
    rest = check_structure(context, stored, truncated=exp.truncated)
    total = counter.count_messages(context)
    assert total <= budget, f"context of {total} tokens over the budget of {budget}"
    # Whole turns and maximality, checked apart from the equality above.
    if not exp.truncated:
        kept = exp.walked
        assert rest == [m for t in exp.turns[n_turns - kept :] for m in t]
        if kept < n_turns:
            older = exp.turn_costs[n_turns - kept - 1]
            assert total + older > budget, "the next older turn would have fitted"
    # Stats.
    turn_tokens = sum(counter.count_message(m) for m in rest)
    assert stats["context_tokens"] == total
    assert stats["tokens_by_part"]["turns"] == turn_tokens
    if exp.truncated:
        assert stats["truncated_tokens"] > 0
    else:
        assert turn_tokens == exp.turn_tokens
        assert stats["truncated_tokens"] == 0
    assert total == exp.system_tokens + 0 + turn_tokens + counter.count_messages([])
    assert stats["turns_in_context"] == exp.turns_in_context
    assert stats["message_count"] == exp.turns_in_context
    assert stats["turns_evicted"] == n_turns - exp.turns_in_context
    assert stats["budget_used"] == pytest.approx(total / budget)
    assert 0 < stats["budget_used"] <= 1
    assert stats["truncated"] is exp.truncated
    assert stats["overflow"] is None
    # The seed reads show the same turns.
    dicts = memory.get_messages()
    assert len(dicts) == exp.turns_in_context
    for d, turn in zip(dicts, scan_turns(rest), strict=True):
        assert d["input"] == (turn[0].text if turn[0].role is Role.USER else None)
        assert d["timestamp"] == turn[0].created_at
    return exp


def strip_times(value: Any) -> Any:
    """Drop timestamps, which differ between two memories fed the same messages."""
    if isinstance(value, Message):
        return value.to_openai()
    if isinstance(value, dict):
        return {k: strip_times(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, list):
        return [strip_times(v) for v in value]
    return value
