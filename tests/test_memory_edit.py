"""Editing and branching through the memories: pop, delete, edit, fork (issue #16)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any

import pytest

from _validators import validate_openai_chat
from zerda import (
    ApproxCounter,
    InvalidMessageError,
    Message,
    MessageNotFoundError,
    SessionExistsError,
    to_openai,
)
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
    ConversationTokenBufferMemory,
)
from zerda.stores import InMemoryStore

COUNTER = ApproxCounter()


class Recording:
    """A summarizer whose summary is the first two words of every user text it was given
    ("secret 3"), joined: what a summary holds is then plain to see."""

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        said = [" ".join(m.text.split()[:2]) for m in messages if m.role == "user"]
        return " | ".join(filter(None, [previous_summary, *said]))

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


def make(kind: str, store: InMemoryStore | None = None, session_id: str = "s") -> BaseMemory[Any]:
    where: dict[str, Any] = {"store": store or InMemoryStore(), "session_id": session_id}
    if kind == "buffer":
        return ConversationBufferMemory(**where)
    if kind == "window":
        return ConversationBufferWindowMemory(k=2, **where)
    if kind == "token":
        return ConversationTokenBufferMemory(200, token_counter=COUNTER, **where)
    if kind == "summary_buffer":
        return ConversationSummaryBufferMemory(
            150, token_counter=COUNTER, summarizer=Recording(), **where
        )
    return ConversationSummaryMemory(token_counter=COUNTER, summarizer=Recording(), **where)


KINDS = ["buffer", "window", "token", "summary_buffer", "summary"]


def call_turn(i: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"secret {i} " + "x" * 40, "id": f"u{i}"},
        {
            "role": "assistant",
            "content": None,
            "id": f"c{i}",
            "tool_calls": [
                {"id": f"k{i}", "type": "function", "function": {"name": "look", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": f"k{i}", "content": f"found {i}", "id": f"t{i}"},
        {"role": "assistant", "content": f"answer {i}", "id": f"a{i}"},
    ]


def fill(memory: BaseMemory[Any], turns: int) -> None:
    memory.add_message({"role": "system", "content": "be brief", "id": "sys"})
    for i in range(turns):
        memory.add_messages(call_turn(i))


def everything_readable(memory: BaseMemory[Any]) -> str:
    """Every read a user has, as one text: history, context, stats, stored metadata."""
    store = memory.store
    assert isinstance(store, InMemoryStore)
    parts = [
        json.dumps([m.to_dict() for m in memory.get_history()]),
        json.dumps([m.to_dict() for m in memory.get_context()]),
        json.dumps(memory.get_memory_stats()),
        json.dumps(store.get_metadata(memory.session_id)),
        str(memory.load_memory_variables({})),
    ]
    return "\n".join(parts)


@pytest.mark.parametrize("kind", KINDS)
def test_pop_turn_removes_and_returns_the_newest_turn(kind: str) -> None:
    memory = make(kind)
    fill(memory, 3)
    turn = memory.pop_turn()
    assert turn is not None
    assert [m.id for m in turn.messages] == ["u2", "c2", "t2", "a2"]
    assert [m.id for m in memory.get_history()] == ["sys"] + [
        f"{p}{i}" for i in range(2) for p in "ucta"
    ]
    assert "secret 2" not in everything_readable(memory)
    validate_openai_chat(to_openai(memory.get_context()))
    # Regenerate: the next answer takes the popped one's place.
    memory.add_messages([turn.messages[0].to_dict(), {"role": "assistant", "content": "again"}])
    assert memory.get_history()[-1].text == "again"


def test_pop_turn_of_an_empty_session_is_none() -> None:
    memory = make("buffer")
    assert memory.pop_turn() is None
    memory.add_message({"role": "system", "content": "only me"})
    assert memory.pop_turn() is None
    assert [m.text for m in memory.get_history()] == ["only me"]


@pytest.mark.parametrize("kind", KINDS)
def test_deleting_a_call_deletes_its_results_and_keeps_the_context_valid(kind: str) -> None:
    memory = make(kind)
    fill(memory, 3)
    assert memory.delete_messages(["c1"]) == 2  # the call and its result
    ids = [m.id for m in memory.get_history()]
    assert ("c1" in ids, "t1" in ids, "u1" in ids, "a1" in ids) == (False, False, True, True)
    validate_openai_chat(to_openai(memory.get_context()))
    # Deleting a result deletes nothing else: the call is then left unanswered, and repair
    # keeps it out of the context.
    assert memory.delete_messages(["t2"]) == 1
    assert "c2" in [m.id for m in memory.get_history()]
    context = memory.get_context()
    validate_openai_chat(to_openai(context))
    assert all(not m.tool_calls or m.id != "c2" for m in context)


def test_delete_messages_says_what_it_takes() -> None:
    memory = make("buffer")
    fill(memory, 1)
    with pytest.raises(ValueError, match="list of message ids"):
        memory.delete_messages("u0")  # type: ignore[arg-type]
    assert memory.delete_messages([]) == 0
    assert memory.delete_messages(["nope"]) == 0
    assert len(memory.get_history()) == 5


@pytest.mark.parametrize("kind", KINDS)
def test_edit_message_keeps_its_place_and_the_old_text_is_gone(kind: str) -> None:
    memory = make(kind)
    fill(memory, 4)
    edited = memory.edit_message("u0", "a new question")
    assert edited.id == "u0"
    assert isinstance(edited.metadata["edited_at"], float)
    assert [m.id for m in memory.get_history()][1] == "u0"
    assert memory.get_history()[1].text == "a new question"
    assert "secret 0" not in everything_readable(memory)
    with pytest.raises(MessageNotFoundError):
        memory.edit_message("nope", "x")
    with pytest.raises(InvalidMessageError):
        memory.edit_message("u1", None)


@pytest.mark.parametrize("kind", ["summary_buffer", "summary"])
@pytest.mark.parametrize("how", ["delete", "edit", "delete_call"])
def test_a_summary_that_covered_a_removed_text_is_dropped_and_made_again(
    kind: str, how: str
) -> None:
    memory = make(kind)
    fill(memory, 8)
    stats = memory.get_memory_stats()
    assert stats["turns_summarized"] > 1, "the first turns are in the summary"
    assert "secret 0" in json.dumps(memory.store.get_metadata("s"))  # type: ignore[union-attr]
    if how == "delete":
        memory.delete_messages(["u0"])
    elif how == "edit":
        memory.edit_message("u0", "nothing to see")
    else:
        memory.delete_messages(["c0"])
        memory.delete_messages(["u0"])
    assert "secret 0" not in everything_readable(memory)
    # The very next read made the summary again, from the log as it is now: every turn is in
    # the context or in the summary (issue #28: it used to wait for the next write).
    stats = memory.get_memory_stats()
    assert stats["turns_summarized"] > 1
    assert stats["turns_summarized"] + stats["turns_in_context"] == stats["stored_turns"]
    assert "secret 1" in json.dumps(memory.store.get_metadata("s"))  # type: ignore[union-attr]
    validate_openai_chat(to_openai(memory.get_context()))
    memory.add_messages(call_turn(9))
    assert "secret 0" not in everything_readable(memory)


def test_rebuild_makes_the_summary_again_at_once() -> None:
    memory = make("summary_buffer")
    fill(memory, 8)
    memory.delete_messages(["u0"], rebuild=True)
    stats = memory.get_memory_stats()
    assert stats["turns_summarized"] > 1
    assert "secret 0" not in everything_readable(memory)


def test_an_edit_after_the_summary_keeps_it() -> None:
    memory = make("summary_buffer")
    fill(memory, 8)
    before = memory.get_memory_stats()["turns_summarized"]
    memory.edit_message("a7", "a better answer")  # the newest turn: in no summary
    assert memory.get_memory_stats()["turns_summarized"] == before


@pytest.mark.parametrize("kind", KINDS)
def test_fork_is_the_same_kind_of_memory_on_a_copy_of_the_log(kind: str) -> None:
    store = InMemoryStore()
    memory = make(kind, store)
    fill(memory, 3)
    branch = memory.fork("s-branch", at="u1")
    assert type(branch) is type(memory)
    assert branch.session_id == "s-branch"
    assert [m.id for m in branch.get_history()] == ["sys", "u0", "c0", "t0", "a0", "u1"]
    assert len(memory.get_history()) == 13, "the source is unchanged"
    # Edit and branch: the branch gets another answer; the source keeps its own.
    branch.add_message({"role": "assistant", "content": "another answer"})
    assert memory.get_history()[-1].id == "a2"
    if isinstance(memory, ConversationTokenBufferMemory):
        assert branch.max_token_limit == memory.max_token_limit  # type: ignore[attr-defined]
    with pytest.raises(SessionExistsError):
        memory.fork("s-branch")
    with pytest.raises(MessageNotFoundError):
        memory.fork("s-other", at="nope")


def test_a_fork_keeps_the_summary_only_when_it_covers_nothing_past_at() -> None:
    store = InMemoryStore()
    memory = make("summary_buffer", store)
    fill(memory, 8)
    covered = memory.get_memory_stats()["turns_summarized"]
    assert covered >= 2
    whole = memory.fork("whole")
    assert whole.get_memory_stats()["turns_summarized"] == covered
    late = memory.fork("late", at="a7")
    assert late.get_memory_stats()["turns_summarized"] == covered
    early = memory.fork("early", at="u1")  # inside the summary's turns
    assert early.get_memory_stats()["turns_summarized"] == 0
    assert "secret 2" not in json.dumps(store.get_metadata("early"))


def test_the_async_twins() -> None:
    memory = make("summary_buffer")
    fill(memory, 8)

    async def edit() -> None:
        turn = await memory.apop_turn()
        assert turn is not None
        assert turn.messages[0].id == "u7"
        assert await memory.adelete_messages(["c6"]) == 2
        assert (await memory.aedit_message("u0", "hidden")).text == "hidden"
        branch = await memory.afork("b", at="u3")
        assert [m.id for m in await branch.aget_history()][-1] == "u3"

    asyncio.run(edit())
    assert "secret 0" not in everything_readable(memory)


def test_another_workers_delete_is_seen_by_a_memory_that_read_before() -> None:
    """A memory remembers which part of the log it found valid; a deletion by another
    memory before that part must not be served from that memory's knowledge."""
    store = InMemoryStore()
    reader = make("token", store)
    fill(reader, 3)
    validate_openai_chat(to_openai(reader.get_context()))  # reader remembers the log as valid
    make("token", store).delete_messages(["t2"])  # the result goes; its call stays behind
    context = reader.get_context()
    validate_openai_chat(to_openai(context))
    assert "c2" not in [m.id for m in context]


def test_any_memory_that_edits_forgets_the_summary_another_made() -> None:
    """Erasure does not depend on the kind of memory that erases: a buffer memory deleting a
    message drops the summary a summary memory made of it."""
    store = InMemoryStore()
    summarizing = make("summary_buffer", store)
    fill(summarizing, 8)
    assert "secret 0" in json.dumps(store.get_metadata("s"))
    plain = make("buffer", store)
    branch = plain.fork("early", at="u1")  # a fork through any memory drops what is past at
    assert type(branch) is ConversationBufferMemory
    assert "secret" not in json.dumps(store.get_metadata("early"))
    plain.delete_messages(["u0"])
    assert "secret 0" not in json.dumps(store.get_metadata("s"))
    assert "secret 0" not in everything_readable(summarizing)
