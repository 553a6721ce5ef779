"""The repair rules, one hand case each (docs/memory.md shows the same examples), as the pure
``zerda.policies.repair`` applies them and as every memory reports them."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from zerda import InvalidMessageError, Message, Role, ToolCall
from zerda.memory import (
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
)
from zerda.policies import REPAIRS, RepairEvent, count_repairs, rename_reused_ids, repair
from zerda.tokens import CallableCounter


def user(text: str) -> Message:
    return Message(Role.USER, text)


def reply(text: str) -> Message:
    return Message(Role.ASSISTANT, text)


def calls(*ids: str, text: str | None = None) -> Message:
    return Message(Role.ASSISTANT, text, tool_calls=tuple(ToolCall(i, "lookup") for i in ids))


def result(call_id: str, text: str = "found") -> Message:
    return Message(Role.TOOL, text, tool_call_id=call_id)


def starts(messages: list[Message]) -> list[int]:
    return [i for i, m in enumerate(messages) if m.role is Role.USER or i == 0]


def show(messages: list[Message]) -> list[str]:
    """A message as one short string: its text, its calls (``>id``), the call it answers."""
    out = []
    for m in messages:
        if m.role is Role.TOOL:
            out.append(f"{m.tool_call_id}:{m.text}")
        elif m.tool_calls:
            out.append(" ".join([m.text, *(f">{c.id}" for c in m.tool_calls)]).strip())
        else:
            out.append(m.text)
    return out


def events(fixed: Any) -> dict[str, int]:
    counts = dict.fromkeys(REPAIRS, 0)
    for kind, *_ in fixed.events:
        counts[REPAIRS[kind]] += 1
    return {k: n for k, n in counts.items() if n}


def test_a_valid_tail_is_left_as_it_is() -> None:
    tail = [user("q"), calls("c1", "c2"), result("c2"), result("c1"), reply("a"), user("next")]
    assert repair(tail, [], starts(tail)) is None


def test_a_result_stored_after_an_interjection_moves_after_its_call() -> None:
    tail = [
        user("latte"),
        calls("c1"),
        user("wait, oat milk"),
        result("c1", "ordered"),
        reply("ok"),
    ]
    fixed = repair(tail, [4, 9, 8, 6, 5], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["latte", ">c1", "c1:ordered", "wait, oat milk", "ok"]
    assert fixed.turn_starts == [0, 3]  # the result belongs to its call's turn
    assert fixed.tokens == [4, 9, 6, 8, 5]  # and its count goes with it
    assert events(fixed) == {"moved_results": 1}
    # It belongs to its call's turn (0), was stored in the next (1), as message 3, after 1.
    assert fixed.events == [RepairEvent(0, 0, 1, message=3, other=1)]
    assert fixed.sources == [0, 1, 3, 2, 4]  # where each message sent was stored


def test_a_result_stored_before_its_call_moves_after_it() -> None:
    tail = [user("q"), result("c1"), calls("c1"), reply("a")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["q", ">c1", "c1:found", "a"]
    assert events(fixed) == {"moved_results": 1}


def test_a_result_whose_call_is_not_there_is_dropped() -> None:
    tail = [user("q"), result("ghost"), reply("a")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["q", "a"]
    assert events(fixed) == {"dropped_orphan_results": 1}


def test_of_two_results_for_one_call_the_first_is_kept() -> None:
    tail = [user("q"), calls("c1"), result("c1", "first"), result("c1", "second"), reply("a")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["q", ">c1", "c1:first", "a"]
    assert events(fixed) == {"dropped_duplicate_results": 1}


def test_a_call_without_its_result_is_removed_and_an_empty_message_dropped() -> None:
    tail = [user("q"), calls("c1", "c2", text="checking"), result("c1"), user("q2"), calls("c3")]
    fixed = repair(tail, [4, 20, 6, 5, 9], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["q", "checking >c1", "c1:found", "q2"]
    assert fixed.tokens == [4, None, 6, 5]  # a changed message is counted again
    assert events(fixed) == {"dropped_unanswered_calls": 2}


def test_one_id_twice_in_a_message_keeps_the_first_call() -> None:
    tail = [user("q"), calls("c1", "c1"), result("c1"), reply("a")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["q", ">c1", "c1:found", "a"]
    assert events(fixed) == {"dropped_unanswered_calls": 1}


def test_a_greeting_before_the_first_user_message_is_dropped() -> None:
    tail = [reply("Welcome!"), user("hi"), reply("hello")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["hi", "hello"]
    assert fixed.turn_starts == [0, 0]  # the greeting's turn is kept, empty
    assert events(fixed) == {"dropped_before_user": 1}


def test_a_result_pairs_with_a_call_of_its_own_turn_first() -> None:
    """A result stored before its call in the same turn answers that call, not an older one
    with the same id: so the turn gets the same result from a tail that starts with it."""
    older = [user("a"), calls("c1")]
    turn = [user("b"), result("c1", "early"), calls("c1"), result("c1", "late"), reply("ok")]
    whole = repair(older + turn, [], starts(older + turn))
    alone = repair(turn, [], starts(turn))
    assert whole is not None
    assert alone is not None
    assert show(whole.messages) == ["a", "b", ">c1", "c1:early", "ok"]  # the old call: removed
    assert show(alone.messages) == show(whole.messages)[1:]
    assert count_repairs(whole.events, 1) == count_repairs(alone.events, 0)


def test_a_result_answers_only_the_latest_call_with_its_id() -> None:
    """An older call with the same id, still waiting, is not answered by a result that comes
    after a newer one is answered: the extra result is a duplicate."""
    tail = [user("a"), calls("c1"), user("b"), calls("c1"), result("c1", "1"), result("c1", "2")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["a", "b", ">c1", "c1:1"]
    assert events(fixed) == {"dropped_duplicate_results": 1, "dropped_unanswered_calls": 1}


def test_seen_from_the_context_a_result_moved_out_of_it_is_an_orphan() -> None:
    """A result stored in a turn of the context whose call is in an older turn leaves the
    context with its call: counted as an orphan there, as a tail without that turn sees it."""
    tail = [user("a"), calls("c1"), user("wait"), result("c1"), reply("done")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert count_repairs(fixed.events, 0)["moved_results"] == 1
    only_second = count_repairs(fixed.events, 1)
    assert (only_second["moved_results"], only_second["dropped_orphan_results"]) == (0, 1)
    alone = repair(tail[2:], [], [0])
    assert alone is not None
    assert count_repairs(alone.events, 0) == only_second


def test_the_results_of_a_greetings_calls_go_with_it() -> None:
    tail = [calls("c1"), user("hi"), result("c1"), reply("hello")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert show(fixed.messages) == ["hi", "hello"]
    assert events(fixed) == {"dropped_before_user": 1, "dropped_orphan_results": 1}
    # ...counted in the turn that stored the result, as a tail without the greeting counts it
    alone = repair(tail[1:], [], [0])
    assert alone is not None
    assert count_repairs(fixed.events, 1) == count_repairs(alone.events, 0)


def renamed(messages: list[Message]) -> list[Message]:
    """``messages`` with rule 6 applied, as a memory applies it to its context."""
    done = rename_reused_ids(messages, starts(messages))
    return messages if done is None else done[0]


def test_an_id_reused_turn_after_turn_pairs_each_result_with_its_own_call() -> None:
    # Some models number their calls call_0 each turn; the result answers the newest call.
    tail = [user("a"), calls("call_0"), result("call_0", "r1"), user("b"), calls("call_0")]
    tail += [user("interjection"), result("call_0", "r2")]
    fixed = repair(tail, [], starts(tail))
    assert fixed is not None
    assert events(fixed) == {"moved_results": 1}
    # The second call keeps its result (moved), under a new id: providers refuse one id twice.
    context = list(fixed.messages)
    done = rename_reused_ids(context, starts(context))
    assert done is not None
    want = ["a", ">call_0", "call_0:r1", "b", ">call_0_2", "call_0_2:r2", "interjection"]
    assert show(done[0]) == want
    assert [REPAIRS[e.kind] for e in done[1]] == ["renamed_call_ids"]
    assert [e.turn for e in done[1]] == [1]


def test_a_new_id_never_takes_one_in_use_and_stays_within_40_characters() -> None:
    long = "x" * 40
    tail = [user("a"), calls("c", "c_2"), result("c"), result("c_2"), user("b"), calls("c")]
    tail += [result("c"), user("c"), calls(long), result(long), user("d"), calls(long)]
    tail += [result(long)]
    assert repair(tail, [], starts(tail)) is None  # valid as stored: each call has its result
    out = renamed(tail)
    ids = [c.id for m in out for c in m.tool_calls]
    assert ids == ["c", "c_2", "c_3", long, "x" * 38 + "_2"]
    assert all(len(i) <= 40 for i in ids)
    results = [m.tool_call_id for m in out if m.role is Role.TOOL]
    assert results == ids


def test_an_id_is_renamed_only_when_the_context_uses_it_twice() -> None:
    """Whether an id is used twice is a question about one request: a call whose id only an
    evicted turn used keeps it, however far back the memory read, so that the same log
    always gives the same context."""
    first = [user("a"), calls("call_0"), result("call_0", "old"), reply("x" * 400)]
    second = [user("b"), calls("call_0"), result("call_0", "new"), reply("done")]
    counter = CallableCounter(len, name="len")
    memory = ConversationTokenBufferMemory(120, token_counter=counter)
    memory.add_messages(first + second)
    for _ in range(3):
        context = memory.get_context()
        assert show(context) == ["b", ">call_0", "call_0:new", "done"]
        assert memory.get_memory_stats()["repairs"]["renamed_call_ids"] == 0
    assert renamed(second) == second
    assert rename_reused_ids(second, starts(second)) is None


def test_valid_upto_checks_only_what_came_after() -> None:
    head = [user("q"), calls("c1"), result("c1"), reply("a")]
    # What follows the valid part is checked: a stray result there is found...
    tail = [*head, result("c9")]
    assert repair(tail, [], starts(tail), valid_upto=len(head)) is not None
    # ...while a call reusing an id of the valid part is left for the context to rename.
    tail = [*head, user("b"), calls("c1"), result("c1")]
    assert repair(tail, [], starts(tail), valid_upto=len(head)) is None
    tail = [*head, user("b"), calls("c2")]
    assert repair(tail, [], starts(tail), valid_upto=len(head)) is not None


# -- in the memories ----------------------------------------------------------------------------

INTERJECTED = [user("latte"), calls("c1"), user("wait, cancel"), result("c1"), reply("ok")]


def test_the_window_of_the_issue_sends_the_call_before_its_result() -> None:
    """k=1 used to send [user "wait, cancel", tool c1]: OpenAI answers 400 to that."""
    memory = ConversationBufferWindowMemory(k=1)
    memory.add_messages(INTERJECTED)
    assert show(memory.get_context()) == ["wait, cancel", "ok"]  # c1 went with its turn
    window2 = ConversationBufferWindowMemory(k=2)
    window2.add_messages(INTERJECTED)
    assert show(window2.get_context()) == ["latte", ">c1", "c1:found", "wait, cancel", "ok"]
    assert window2.get_memory_stats()["repairs"]["moved_results"] == 1
    # The window of k=1 holds the turn of the interjection; the move was in the older turn.
    assert memory.get_memory_stats()["repairs"]["moved_results"] == 0
    assert show(memory.get_history()) == show(INTERJECTED)


def test_a_moved_result_counts_in_its_call_s_turn_budget() -> None:
    # len counter: user "latte" 8 | call c1 3+6+2+3 = 14 | result "found" 8: turn 0 = 30;
    # "wait, cancel" 15 | "ok" 5: turn 1 = 20; and 3 of reply priming.
    counter = CallableCounter(len)
    memory = ConversationTokenBufferMemory(3 + 30 + 20, token_counter=counter)
    memory.add_messages(INTERJECTED)
    context = memory.get_context()
    assert show(context) == ["latte", ">c1", "c1:found", "wait, cancel", "ok"]
    assert memory.get_memory_stats()["context_tokens"] == counter.count_messages(context) == 53
    tight = ConversationTokenBufferMemory(3 + 30 + 20 - 1, token_counter=counter)
    tight.add_messages(INTERJECTED)
    assert show(tight.get_context()) == ["wait, cancel", "ok"]  # turn 0 whole, or not at all


def test_repairs_are_logged_once_per_session(caplog: pytest.LogCaptureFixture) -> None:
    memory = ConversationBufferMemory(session_id="logged-once")
    memory.add_messages(INTERJECTED)
    with caplog.at_level(logging.WARNING, logger="zerda.memory"):
        memory.get_context()
        memory.get_context()
        memory.load_memory_variables({})
    lines = [r.getMessage() for r in caplog.records if r.name == "zerda.memory"]
    assert lines == [
        "session 'logged-once': the context was repaired for the model (the log is "
        "unchanged): moved_results=1"
    ]


def test_a_defect_appended_after_a_valid_read_is_still_repaired() -> None:
    """Reads check only what came since the last valid read; a new defect is found."""
    memory = ConversationBufferMemory()
    memory.add_messages([user("q"), calls("c1"), result("c1"), reply("a")])
    assert memory.get_memory_stats()["repairs"] == dict.fromkeys(REPAIRS, 0)
    memory.add_messages([result("c1", "again"), user("q2"), calls("c1"), result("c1")])
    context = memory.get_context()
    assert show(context) == ["q", ">c1", "c1:found", "a", "q2", ">c1_2", "c1_2:found"]
    assert memory.get_memory_stats()["repairs"]["dropped_duplicate_results"] == 1
    memory.clear()
    memory.add_messages([user("q"), result("c1")])
    assert show(memory.get_context()) == ["q"]


def test_strict_refuses_and_names_what_it_would_repair() -> None:
    memory = ConversationBufferMemory(strict=True)
    memory.add_messages([*INTERJECTED, result("ghost")])
    with pytest.raises(InvalidMessageError) as info:
        memory.get_context()
    assert "1 moved results, 1 dropped orphan results" in str(info.value)
    assert "strict=True refuses to repair" in str(info.value)
    assert memory.get_memory_stats()["repairs"]["moved_results"] == 1  # stats never raise
    assert len(memory.get_history()) == 6
