"""ConversationTokenBufferMemory over generated tool-call conversations: for every prefix, at
random budgets (small ones too, so that truncation and overflow happen), in both overflow modes,
with and without reserve_tokens, the memory shows what the reference model says and the
invariants hold."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from _conversations import scan_turns
from _token_checks import check_memory, strip_times
from zerda.errors import ContextOverflowError
from zerda.memory import ConversationTokenBufferMemory
from zerda.messages import Message, Role, ToolCall
from zerda.policies import fit_budget
from zerda.tokens import ApproxCounter, CallableCounter, TokenCounter

COUNTERS: dict[str, Callable[[], TokenCounter]] = {
    "approx": ApproxCounter,
    "approx/1.5": lambda: ApproxCounter(1.5),
    "len": lambda: CallableCounter(len),
}

TEXT = st.text(alphabet="ab cd", max_size=24)
ARGUMENTS = st.sampled_from(["{}", '{"q": "latte"}', '{"id": 12, "n": [1, 2, 3]}', "not json"])


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    """Optional leading system messages and opening greeting; whole turns (a user message, then
    replies and tool-call messages each followed by results for all their calls); system
    messages anywhere; optionally a last turn still waiting for tool results. Texts, names and
    tool-call arguments vary in length so that token counts vary."""
    ids = itertools.count()
    out: list[Message] = []

    def name() -> str | None:
        return draw(st.one_of(st.none(), st.sampled_from(["bob", "al", "assistant_2"])))

    def add(message: Message) -> None:
        out.append(message)
        if draw(st.integers(0, 9)) == 0:
            out.append(Message(Role.SYSTEM, draw(TEXT), name=name()))

    def tool_call_message() -> list[str]:
        calls = tuple(
            ToolCall(f"call-{next(ids)}", draw(st.sampled_from(["f", "lookup"])), draw(ARGUMENTS))
            for _ in range(draw(st.integers(1, 3)))
        )
        content = draw(st.one_of(st.none(), TEXT))
        add(Message(Role.ASSISTANT, content, tool_calls=calls))
        return [c.id for c in calls]

    def steps(max_steps: int) -> None:
        for _ in range(draw(st.integers(0, max_steps))):
            if draw(st.booleans()):
                add(Message(Role.ASSISTANT, draw(TEXT), name=name()))
            else:
                call_ids = tool_call_message()
                for call_id in draw(st.permutations(call_ids)):
                    add(Message(Role.TOOL, draw(TEXT), tool_call_id=call_id))

    for _ in range(draw(st.integers(0, 2))):
        out.append(Message(Role.SYSTEM, draw(TEXT)))
    if draw(st.integers(0, 4)) == 0:
        add(Message(Role.ASSISTANT, draw(TEXT)))
    for _ in range(draw(st.integers(0, 6))):
        add(Message(Role.USER, draw(TEXT), name=name()))
        steps(3)
    if draw(st.booleans()):
        add(Message(Role.USER, draw(TEXT)))
        steps(2)
        call_ids = tool_call_message()
        answered = draw(
            st.lists(st.sampled_from(call_ids), unique=True, max_size=len(call_ids) - 1)
        )
        for call_id in answered:
            add(Message(Role.TOOL, draw(TEXT), tool_call_id=call_id))
    return out


def draw_budget(
    data: st.DataObject, conversation: list[Message], counter: TokenCounter
) -> tuple[int, int]:
    """(max_token_limit, reserve_tokens), spread from far too small to more than the whole
    conversation needs, and often about the size of one turn, so that every regime occurs:
    all turns, eviction, truncation and overflow. reserve_tokens is often 0."""
    whole = counter.count_messages(conversation)
    systems = counter.count_messages(m for m in conversation if m.role is Role.SYSTEM)
    turns = scan_turns(conversation)
    biggest = max((sum(map(counter.count_message, t)) for t in turns), default=0)
    # Anchors at the sizes that matter, moved a little either way: hypothesis draws integers
    # near their bounds often, and a budget between two anchors rarely tests anything new.
    anchor = data.draw(
        st.sampled_from([systems + biggest // 2, systems + biggest, whole // 2, whole, systems]),
        label="anchor",
    )
    limit = max(1, anchor + data.draw(st.integers(-4, 12), label="offset"))
    reserve = data.draw(
        st.one_of(st.just(0), st.integers(0, 6), st.integers(0, limit - 1)), label="reserve"
    )
    reserve = min(reserve, limit - 1)
    limit += min(reserve, 8)  # a reserve often takes back what it adds
    return limit, reserve


OVERFLOWS = st.sampled_from(["truncate", "raise"])


@settings(max_examples=200, deadline=None)
@given(conversations(), OVERFLOWS, st.sampled_from(sorted(COUNTERS)), st.data())
def test_every_prefix_added_one_by_one(
    conversation: list[Message], overflow: str, counter_name: str, data: st.DataObject
) -> None:
    make = COUNTERS[counter_name]
    limit, reserve = draw_budget(data, conversation, make())
    mem = ConversationTokenBufferMemory(
        max_token_limit=limit, reserve_tokens=reserve, token_counter=make(), overflow=overflow
    )
    reference = make()
    stored: list[Message] = []
    for message in conversation:
        stored.append(mem.add_message(message))
        check_memory(mem, stored, reference, limit=limit, reserve=reserve, overflow=overflow)
    assert mem.get_history() == stored


@settings(max_examples=100, deadline=None)
@given(conversations(), OVERFLOWS, st.data())
def test_batches_and_async_twins(
    conversation: list[Message], overflow: str, data: st.DataObject
) -> None:
    """Adding in batches, sync and async, gives what the reference says after each batch."""
    limit, reserve = draw_budget(data, conversation, ApproxCounter())
    options = {"max_token_limit": limit, "reserve_tokens": reserve, "overflow": overflow}
    mem = ConversationTokenBufferMemory(token_counter=ApproxCounter(), **options)  # type: ignore[arg-type]
    twin = ConversationTokenBufferMemory(token_counter=ApproxCounter(), **options)  # type: ignore[arg-type]
    cuts = sorted(data.draw(st.sets(st.integers(0, len(conversation)), max_size=6)))
    bounds = [0, *cuts, len(conversation)]
    stored: list[Message] = []

    async def areads() -> list[object]:
        out: list[object] = []
        for read in (twin.aget_context, twin.aload_memory_variables, twin.aget_messages):
            try:
                out.append(await read())
            except ContextOverflowError as exc:
                out.append((exc.needed, exc.limit))
        out.append(await twin.aget_memory_stats())
        return out

    def reads() -> list[object]:
        out: list[object] = []
        for read in (mem.get_context, mem.load_memory_variables, mem.get_messages):
            try:
                out.append(read())
            except ContextOverflowError as exc:
                out.append((exc.needed, exc.limit))
        out.append(mem.get_memory_stats())
        return out

    for begin, end in itertools.pairwise(bounds):
        batch = conversation[begin:end]
        stored.extend(mem.add_messages(batch))
        asyncio.run(twin.aadd_messages(batch))
        check_memory(mem, stored, ApproxCounter(), limit=limit, reserve=reserve, overflow=overflow)
        assert strip_times(asyncio.run(areads())) == strip_times(reads())


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_fit_budget_matches_the_reference(data: st.DataObject) -> None:
    """The pure policy, on arbitrary counts (zeros included), agrees with the reference walk."""
    conversation = [m for m in data.draw(conversations()) if m.role is not Role.SYSTEM]
    tokens = data.draw(st.lists(st.integers(0, 30), min_size=len(conversation)))
    tokens = tokens[: len(conversation)]
    budget = data.draw(st.integers(0, 150))
    overflow = data.draw(OVERFLOWS)
    starts = [i for i, m in enumerate(conversation) if m.role is Role.USER or i == 0]
    turns = [conversation[a:b] for a, b in itertools.pairwise([*starts, len(conversation)])]
    costs = [tokens[a:b] for a, b in itertools.pairwise([*starts, len(conversation)])]

    # The reference walk: the newest whole turns that fit; else the newest turn alone, to be
    # shortened (truncate) or refused (raise).
    kept, used = 0, 0
    for cost in reversed([sum(c) for c in costs]):
        if used + cost > budget:
            break
        kept, used = kept + 1, used + cost
    if not kept and turns:
        newest = sum(costs[-1])
        if overflow == "raise":
            with pytest.raises(ContextOverflowError) as info:
                fit_budget(conversation, tokens, starts, budget, overflow)  # type: ignore[arg-type]
            assert (info.value.needed, info.value.limit) == (newest, budget)
            return
        fit = fit_budget(conversation, tokens, starts, budget, overflow)  # type: ignore[arg-type]
        assert (fit.start, fit.turns, fit.tokens) == (starts[-1], 1, newest)
        assert fit.truncated
        assert not fit.exhausted
        return
    fit = fit_budget(conversation, tokens, starts, budget, overflow)  # type: ignore[arg-type]
    assert conversation[fit.start :] == [m for t in turns[len(turns) - kept :] for m in t]
    assert fit.tokens == used == sum(tokens[fit.start :]) <= budget
    assert fit.turns == kept
    assert not fit.truncated
    assert fit.exhausted is (kept == len(turns))
