"""Whatever was stored, every memory sends a context every provider accepts, and the log stays
as it was appended.

Logs are generated with what real traffic holds: results stored after a user interjected, or
before their call; results whose call never existed; two results for one call; calls never
answered; parallel calls; one call id reused turn after turn (``call_0``) and twice in one
message; greetings before the first user message; system and developer messages anywhere;
reasoning and media parts. Each context goes through the four converters of
:mod:`zerda.formats` and must pass the validators of ``tests/_validators.py``, written from the
providers' documentation.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from _validators import (
    validate_anthropic,
    validate_gemini,
    validate_openai_chat,
    validate_responses,
)
from zerda import ContextOverflowError, InvalidMessageError
from zerda.formats import to_anthropic, to_gemini, to_openai, to_responses
from zerda.memory import (
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
    ConversationTokenBufferMemory,
)
from zerda.memory._base import BaseMemory
from zerda.messages import PINNED, Message, Role, ToolCall
from zerda.parts import ImagePart, ReasoningPart, TextPart
from zerda.policies import REPAIRS, count_repairs, repair
from zerda.tokens import ApproxCounter

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"
WORDS = st.sampled_from(["latte", "two", "oat milk", "to go", "wait", "thanks", "large", "ok"])
TEXT = st.lists(WORDS, min_size=1, max_size=8).map(" ".join)
LONG = st.integers(1, 60).map(lambda n: " ".join(f"word{i}" for i in range(n)))


@st.composite
def messy_logs(draw: st.DrawFn) -> list[Message]:
    """A log as real traffic leaves it (see the module docstring)."""
    fresh = itertools.count()
    log: list[Message] = []
    # Calls made so far and not yet answered in the log (their results may come late).
    waiting: list[str] = []
    answered: list[str] = []

    def text() -> str:
        return draw(st.one_of(TEXT, LONG))

    def maybe_pinned() -> None:
        if draw(st.integers(0, 7)) == 0:
            role = draw(st.sampled_from([Role.SYSTEM, Role.DEVELOPER]))
            log.append(Message(role, draw(TEXT)))

    def result(call_id: str) -> None:
        log.append(Message(Role.TOOL, text(), tool_call_id=call_id))

    def call_id() -> str:
        # Models reuse ids: "call_0" each turn (Gemini-style); or fresh ones.
        return draw(st.sampled_from(["call_0", "call_1", f"call_{next(fresh) + 2}"]))

    def assistant_step() -> None:
        kind = draw(st.integers(0, 9))
        if kind < 4:  # a plain reply, sometimes with its reasoning
            content: Any = text()
            if draw(st.integers(0, 3)) == 0:
                content = (ReasoningPart(draw(TEXT), signature="c2ln"), TextPart(content))
            log.append(Message(Role.ASSISTANT, content))
            return
        ids = [call_id() for _ in range(draw(st.integers(1, 3)))]  # parallel, maybe repeated
        calls = tuple(ToolCall(i, draw(st.sampled_from(["f", "lookup"])), "{}") for i in ids)
        words = draw(st.one_of(st.none(), TEXT))
        log.append(Message(Role.ASSISTANT, words, tool_calls=calls))
        for i in draw(st.permutations(ids)):
            fate = draw(st.integers(0, 9))
            if fate < 6:  # answered, in place
                result(i)
                answered.append(i)
            elif fate < 8:  # answered later, after someone interjected
                waiting.append(i)
            elif fate == 8:  # answered twice
                result(i)
                result(i)
            # else: never answered
        maybe_pinned()

    def defects() -> None:
        fate = draw(st.integers(0, 11))
        if fate == 0:  # a result whose call never existed
            result(f"ghost_{next(fresh)}")
        elif fate == 1 and waiting:  # a late result, after the interjection
            result(waiting.pop(draw(st.integers(0, len(waiting) - 1))))
        elif fate == 2:  # a result stored before its call
            early = f"early_{next(fresh)}"
            result(early)
            log.append(Message(Role.ASSISTANT, None, tool_calls=(ToolCall(early, "f"),)))
        elif fate == 3 and answered:  # one more result for a call answered already
            result(draw(st.sampled_from(answered)))

    for _ in range(draw(st.integers(0, 2))):
        log.append(Message(draw(st.sampled_from([Role.SYSTEM, Role.DEVELOPER])), draw(TEXT)))
    if draw(st.integers(0, 3)) == 0:  # a greeting before the first user message
        log.append(Message(Role.ASSISTANT, "Welcome! What can I get you?"))
        defects()
    for _ in range(draw(st.integers(0, 6))):
        if draw(st.integers(0, 4)) == 0:
            content: Any = (TextPart(text()), ImagePart(PNG, detail="low"))
        else:
            content = text()
        log.append(Message(Role.USER, content))
        maybe_pinned()
        defects()
        for _ in range(draw(st.integers(0, 3))):
            assistant_step()
            defects()
    return log


class Summarizer:
    """A stand-in for a model: the summary is the start of each message, kept short."""

    def summarize(self, previous: str, messages: Any) -> str:
        return (previous + " " + " ".join(m.text[:20] for m in messages)).strip()[-200:]

    async def asummarize(self, previous: str, messages: Any) -> str:
        return self.summarize(previous, messages)


_summarize = Summarizer()


MEMORIES: dict[str, Callable[[int], BaseMemory]] = {
    "buffer": lambda n: ConversationBufferMemory(),
    "window": lambda n: ConversationBufferWindowMemory(k=1 + n % 4),
    "token-truncate": lambda n: ConversationTokenBufferMemory(
        (40, 80, 150, 400, 2000)[n % 5], token_counter=ApproxCounter()
    ),
    "token-raise": lambda n: ConversationTokenBufferMemory(
        (40, 80, 150, 400, 2000)[n % 5], token_counter=ApproxCounter(), overflow="raise"
    ),
    "summary-buffer": lambda n: ConversationSummaryBufferMemory(
        (120, 300, 2000)[n % 3], token_counter=ApproxCounter(), summarizer=_summarize
    ),
    "summary": lambda n: ConversationSummaryMemory(
        summarizer=_summarize, token_counter=ApproxCounter()
    ),
}

VALIDATORS: list[tuple[str, Callable[[list[Message]], Any], Callable[[Any], None]]] = [
    ("openai", to_openai, validate_openai_chat),
    ("responses", to_responses, validate_responses),
    ("anthropic", to_anthropic, validate_anthropic),
    ("gemini", to_gemini, validate_gemini),
]


def check_context(memory: BaseMemory, stored: list[Message]) -> None:
    try:
        context = memory.get_context()
    except ContextOverflowError:
        return  # a token memory whose newest turn cannot fit: nothing is sent
    for name, convert, validate in VALIDATORS:
        try:
            validate(convert(context))
        except AssertionError as exc:
            raise AssertionError(f"{name} refuses the context: {exc}") from None
    # OpenAI Chat's own rules, stated plainly: the first message after the pinned ones is a
    # user message; every call is answered right after it, and nothing else follows it.
    rest = [m for m in context if m.role not in PINNED]
    pinned = context[: len(context) - len(rest)]
    assert all(m.role in PINNED for m in pinned)
    if rest and not any(m.role is Role.SYSTEM and m not in stored for m in pinned):
        assert rest[0].role is Role.USER
    i = 0
    while i < len(rest):
        calls = [c.id for c in rest[i].tool_calls]
        i += 1
        results = []
        while i < len(rest) and rest[i].role is Role.TOOL:
            results.append(rest[i].tool_call_id)
            i += 1
        assert sorted(results) == sorted(calls), (calls, results)
    stats = memory.get_memory_stats()
    assert set(stats["repairs"]) == set(REPAIRS)
    assert all(n >= 0 for n in stats["repairs"].values())


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(messy_logs(), st.sampled_from(sorted(MEMORIES)), st.integers(0, 59), st.data())
def test_every_context_is_accepted_by_every_provider(
    log: list[Message], kind: str, n: int, data: st.DataObject
) -> None:
    memory = MEMORIES[kind](n)
    stored: list[Message] = []
    # Added in batches of random sizes, with a read after each: turns in progress included.
    bounds = sorted(data.draw(st.sets(st.integers(1, max(len(log), 1)), max_size=6)))
    for begin, end in itertools.pairwise([0, *bounds, len(log)]):
        if begin < end:
            stored.extend(memory.add_messages(log[begin:end]))
            check_context(memory, stored)
    # The log keeps exactly what was appended, in order.
    assert memory.get_history() == stored
    assert [m.to_dict() for m in stored] == [
        {**m.to_dict(), "created_at": s.created_at, "id": s.id}
        for m, s in zip(log, stored, strict=True)
    ]


def _turn_starts(messages: list[Message]) -> list[int]:
    starts = [i for i, m in enumerate(messages) if m.role is Role.USER]
    return starts if starts[:1] == [0] else [0, *starts]


@st.composite
def tangled_logs(draw: st.DrawFn) -> list[Message]:
    """Turns of calls, results, replies and greetings over two call ids only, in any order:
    every way a result may find (or miss) its call across turns."""
    ids = st.sampled_from(["a", "b"])
    step = st.one_of(
        ids.map(lambda c: Message(Role.ASSISTANT, None, tool_calls=(ToolCall(c, "f"),))),
        st.tuples(ids, ids).map(
            lambda p: Message(
                Role.ASSISTANT, "x", tool_calls=(ToolCall(p[0], "f"), ToolCall(p[1], "g"))
            )
        ),
        st.tuples(ids, TEXT).map(lambda p: Message(Role.TOOL, p[1], tool_call_id=p[0])),
        st.just(Message(Role.ASSISTANT, "ok")),
    )
    log = draw(st.lists(step, max_size=3))  # a greeting, maybe
    for _ in range(draw(st.integers(1, 6))):
        log += [Message(Role.USER, draw(TEXT)), *draw(st.lists(step, max_size=5))]
    return log


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(messy_logs(), tangled_logs()), st.data())
def test_a_repaired_turn_does_not_depend_on_how_far_back_the_tail_reaches(
    log: list[Message], data: st.DataObject
) -> None:
    """Repairing the turns from ``first`` on gives the same messages and the same counts from
    any tail that holds them: a memory reads as far back as its budget asks, and the same log
    must give the same context and stats however far that was."""
    messages = [m for m in log if m.role not in PINNED]
    assume(messages)
    starts = _turn_starts(messages)
    first = data.draw(st.integers(0, len(starts) - 1))
    tail_from = data.draw(st.integers(0, first))
    outcomes = []
    for begin_turn in (0, tail_from):
        begin = starts[begin_turn]
        tail = messages[begin:]
        tail_starts = [s - begin for s in starts[begin_turn:]]
        fixed = repair(tail, [], tail_starts)
        if fixed is None:
            outcomes.append((tail[tail_starts[first - begin_turn] :], {}))
            continue
        at = fixed.turn_starts[first - begin_turn]
        counts = count_repairs(fixed.events, first - begin_turn)
        outcomes.append((fixed.messages[at:], {k: n for k, n in counts.items() if n}))
    assert outcomes[0] == outcomes[1]


def test_the_generator_makes_every_defect() -> None:
    """The strategy above reaches every repair rule (else the property proves less)."""
    seen: dict[str, int] = dict.fromkeys(REPAIRS, 0)

    @settings(max_examples=200, deadline=None, database=None)
    @given(messy_logs())
    def collect(log: list[Message]) -> None:
        memory = ConversationBufferMemory()
        memory.add_messages(log)
        for kind, count in memory.get_memory_stats()["repairs"].items():
            seen[kind] += count

    collect()
    assert all(seen.values()), seen


INTERJECTED = [
    Message(Role.USER, "one latte"),
    Message(Role.ASSISTANT, None, tool_calls=(ToolCall("c1", "order"),)),
    Message(Role.USER, "wait, oat milk"),
    Message(Role.TOOL, "ordered", tool_call_id="c1"),
    Message(Role.ASSISTANT, "Done."),
]


@pytest.mark.parametrize(
    "make",
    [
        ConversationBufferMemory,
        lambda **kw: ConversationBufferWindowMemory(k=2, **kw),
        lambda **kw: ConversationTokenBufferMemory(400, token_counter=ApproxCounter(), **kw),
        lambda **kw: ConversationSummaryBufferMemory(
            2000, token_counter=ApproxCounter(), summarizer=_summarize, **kw
        ),
    ],
    ids=["buffer", "window", "token", "summary-buffer"],
)
def test_strict_memories_refuse_what_others_repair(make: Callable[..., BaseMemory]) -> None:
    strict = make(strict=True)
    strict.add_messages(INTERJECTED)
    with pytest.raises(InvalidMessageError, match="strict=True refuses to repair") as info:
        strict.get_context()
    assert "1 moved results" in str(info.value)
    assert strict.get_history()[2].content == "wait, oat milk"  # the log is as appended

    lenient = make()
    lenient.add_messages(INTERJECTED)
    context = [m for m in lenient.get_context() if m.role not in PINNED]
    # The result moved to right after its call; the interjection after it.
    assert [m.text or m.tool_calls[0].id for m in context] == [
        "one latte",
        "c1",
        "ordered",
        "wait, oat milk",
        "Done.",
    ]
    assert lenient.get_memory_stats()["repairs"]["moved_results"] == 1
