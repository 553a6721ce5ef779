"""The accounting invariant (DESIGN.md section 2, issue #28), as a state machine over every
memory kind and every store.

After every step, the very next read (sync or async, by this memory or by a fresh one over
another connection to the same data) accounts for every stored turn exactly once:

- summary memories: verbatim in the context, or covered by the summary that context carries,
  or, only while the summarizer fails, pending its fold (counted in ``turns_pending``);
- the others: verbatim in the context, or evicted, the evicted ones always the oldest;
- ``turns_in_context + turns_summarized + turns_pending + turns_evicted == stored_turns``.

What a turn's fate is comes from the text, never from the memory's own bookkeeping: every
message carries a word no other text holds, and :class:`Copying`, the summarizer, copies the
words of what it folds into the summary. So a turn is in the summary when its words are there,
in the context when its messages are, and folded twice when a word shows twice.

The steps: appends (by this memory, by another memory of the same kind over another
connection, and straight to the store, which folds nothing), system messages, pops, deletes,
edits (each with and without ``rebuild=True``), forks, clears, a change of the budget, and a
summarizer that fails and recovers. Every context must also be valid for OpenAI (the repair
rules hold after edits), and no text deleted or edited away may be readable anywhere: the
history, the context, the stats, the summary in the metadata, the seed API's text.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from _validators import validate_openai_chat
from services import RUN_ID, require_postgres, require_redis
from zerda import ApproxCounter, ContextOverflowError, Message, to_openai
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
    ConversationTokenBufferMemory,
)
from zerda.memory._summary import DEFAULT_PREFIX
from zerda.stores import InMemoryStore, SQLiteStore, Store

COUNTER = ApproxCounter()
SECRET = re.compile(r"w\d{6}x")
KINDS = ["buffer", "window", "token", "summary_buffer", "summary"]
SUMMARY_KINDS = ("summary_buffer", "summary")
# (budget, k) pairs a step may switch to: the token budget of the token and summary-buffer
# memories, the window's k.
SIZES = [(70, 1), (160, 2), (600, 5)]

_words = itertools.count()
_sessions = itertools.count()


def secret() -> str:
    """A word no other text holds, so that where it shows is unambiguous."""
    return f"w{next(_words):06d}x"


class Switch:
    """Whether the summarizers fail now: one switch for every memory of a machine."""

    failing = False


class Copying:
    """A summarizer whose summary is the words of every message it folded, in order, after the
    previous summary's: any text it folded shows there, once a fold."""

    def __init__(self, switch: Switch) -> None:
        self.switch = switch

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        if self.switch.failing:
            raise RuntimeError("the summarizer is down")
        words = [w for m in messages for w in SECRET.findall(m.text)]
        return " ".join(filter(None, [previous_summary, *words]))

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


def make(kind: str, store: Store, session_id: str, size: int, switch: Switch) -> BaseMemory[Any]:
    budget, k = SIZES[size]
    where: dict[str, Any] = {"store": store, "session_id": session_id}
    if kind == "buffer":
        return ConversationBufferMemory(**where)
    if kind == "window":
        return ConversationBufferWindowMemory(k=k, **where)
    if kind == "token":
        return ConversationTokenBufferMemory(budget, token_counter=COUNTER, **where)
    if kind == "summary_buffer":
        return ConversationSummaryBufferMemory(
            budget, token_counter=COUNTER, summarizer=Copying(switch), **where
        )
    return ConversationSummaryMemory(token_counter=COUNTER, summarizer=Copying(switch), **where)


def stored_turns(history: Sequence[Message]) -> list[list[Message]]:
    """The turns as stored: a new one at each user message; pinned messages in none."""
    turns: list[list[Message]] = []
    for m in history:
        if m.role in ("system", "developer"):
            continue
        if m.role == "user" or not turns:
            turns.append([])
        turns[-1].append(m)
    return turns


def turns_of(history: Sequence[Message]) -> list[list[Message]]:
    """The stored turns, as the repair rules see them: a new one at each user message, a tool
    result in the turn of its call (a result stored after an interjection moves back to it);
    pinned messages in none."""
    turns: list[list[Message]] = []
    turn_of_call: dict[str, int] = {}
    for m in history:
        if m.role in ("system", "developer"):
            continue
        if m.role == "user" or not turns:
            turns.append([])
        if m.role == "tool" and m.tool_call_id in turn_of_call:
            turns[turn_of_call[m.tool_call_id]].append(m)
            continue
        turns[-1].append(m)
        for call in m.tool_calls:
            turn_of_call[call.id] = len(turns) - 1
    return turns


def summary_of(context: Sequence[Message], history: Sequence[Message]) -> str:
    """The text of the summary the context carries ("" when it carries none)."""
    stored = {m.id for m in history}
    return " ".join(
        m.text
        for m in context
        if m.role == "system" and m.id not in stored and m.text.startswith(DEFAULT_PREFIX)
    )


class AccountingMachine(RuleBasedStateMachine):
    kind: str
    stores: Any  # () -> (store, another connection to the same data)

    @initialize()
    def start(self) -> None:
        self.store, self.other_store = type(self).stores()
        self.switch = Switch()
        self.size = 0
        self.session = f"a{next(_sessions)}"
        self.memory = self.fresh(self.store)
        self.model: list[Message] = []
        self.gone: set[str] = set()  # words deleted or edited away
        self.calls = itertools.count()
        self.read_async = False
        self.read_elsewhere = False  # the next read by a fresh memory over the other store

    def fresh(self, store: Store) -> BaseMemory[Any]:
        return make(self.kind, store, self.session, self.size, self.switch)

    # -- writes -------------------------------------------------------------------------------

    @rule(
        tools=st.integers(0, 2),
        interjection=st.booleans(),
        writer=st.sampled_from(["own", "other memory", "store"]),
        more=st.integers(0, 2),
    )
    def add_turns(self, tools: int, interjection: bool, writer: str, more: int) -> None:
        """A turn, maybe with one or two parallel tool calls (the user may speak between
        the call and its results: repair moves them back), and ``more`` plain turns."""
        self.add_turn(tools, interjection, writer)
        for _ in range(more):
            self.add_turn(0, False, writer)

    def add_turn(self, tools: int, interjection: bool, writer: str) -> None:
        batch: list[dict[str, Any]] = [{"role": "user", "content": f"{secret()} please"}]
        if tools:
            calls = [f"k{next(self.calls)}" for _ in range(tools)]
            batch.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": c,
                            "type": "function",
                            "function": {"name": "look", "arguments": "{}"},
                        }
                        for c in calls
                    ],
                }
            )
            if interjection:
                batch.append({"role": "user", "content": f"{secret()} wait"})
            batch += [{"role": "tool", "tool_call_id": c, "content": secret()} for c in calls]
        batch.append({"role": "assistant", "content": f"{secret()} done " + "and so on " * 4})
        if writer == "own":
            self.model += self.memory.add_messages(batch)
        elif writer == "other memory":
            self.model += self.fresh(self.other_store).add_messages(batch)
        else:  # straight to the store: nobody folds
            messages = [Message.from_dict(m).stamped(time.time()) for m in batch]
            self.other_store.append(self.session, messages)
            self.model += messages

    @rule()
    def add_system(self) -> None:
        self.model.append(self.memory.add_message({"role": "system", "content": secret()}))

    @rule(rebuild=st.booleans())
    def pop(self, rebuild: bool) -> None:
        turn = self.memory.pop_turn(rebuild=rebuild)
        turns = stored_turns(self.model)
        if not turns:
            assert turn is None
            return
        assert turn is not None
        assert list(turn.messages) == turns[-1]
        popped = {m.id for m in turns[-1]}
        self.model = [m for m in self.model if m.id not in popped]
        self.forget(turns[-1])

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data(), rebuild=st.booleans())
    def delete(self, data: st.DataObject, rebuild: bool) -> None:
        victim = data.draw(st.sampled_from(self.model))
        calls = {c.id for c in victim.tool_calls}
        removed = [
            m
            for m in self.model
            if m.id == victim.id or (m.role == "tool" and m.tool_call_id in calls)
        ]
        assert victim.id is not None
        assert self.memory.delete_messages([victim.id], rebuild=rebuild) == len(removed)
        self.model = [m for m in self.model if m not in removed]
        self.forget(removed)

    @precondition(lambda self: any(SECRET.search(m.text) for m in self.model))
    @rule(data=st.data(), rebuild=st.booleans())
    def edit(self, data: st.DataObject, rebuild: bool) -> None:
        victim = data.draw(st.sampled_from([m for m in self.model if SECRET.search(m.text)]))
        assert victim.id is not None
        new = self.memory.edit_message(victim.id, f"{secret()} edited", rebuild=rebuild)
        self.model = [new if m.id == victim.id else m for m in self.model]
        self.forget([victim])

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def fork(self, data: st.DataObject) -> None:
        at = data.draw(st.sampled_from([None, *self.model]))
        self.session = f"a{next(_sessions)}"
        branch = self.memory.fork(self.session, at=None if at is None else at.id)
        assert type(branch) is type(self.memory)
        end = len(self.model) if at is None else self.model.index(at) + 1
        # The old line is left behind: what only it holds is no longer reachable from here.
        self.forget(self.model[end:])
        self.memory, self.model = branch, self.model[:end]

    @rule()
    def clear(self) -> None:
        self.memory.clear()
        self.forget(self.model)
        self.model = []

    @rule(size=st.integers(0, len(SIZES) - 1))
    def change_size(self, size: int) -> None:
        """The application now reads the session with another budget (or k)."""
        self.size = size
        self.memory = self.fresh(self.store)

    @rule(failing=st.booleans())
    def summarizer(self, failing: bool) -> None:
        self.switch.failing = failing

    @rule(use_async=st.booleans(), elsewhere=st.booleans())
    def next_read(self, use_async: bool, elsewhere: bool) -> None:
        """How the next check reads: sync or async, this memory or a fresh one elsewhere."""
        self.read_async, self.read_elsewhere = use_async, elsewhere

    def forget(self, messages: Sequence[Message]) -> None:
        for m in messages:
            self.gone.update(SECRET.findall(m.text))

    # -- what must hold -------------------------------------------------------------------------

    def read(self) -> tuple[BaseMemory[Any], list[Message] | None, dict[str, Any]]:
        """The next read: the context (``None`` when it does not fit) and its stats."""
        reader = self.fresh(self.other_store) if self.read_elsewhere else self.memory
        try:
            if self.read_async:
                context, stats = asyncio.run(reader.aget_context_with_stats())
            else:
                context, stats = reader.get_context_with_stats()
        except ContextOverflowError:
            return reader, None, dict(reader.get_memory_stats())
        return reader, context, dict(stats)

    @invariant()
    def every_turn_is_accounted_for(self) -> None:
        reader, context, stats = self.read()
        history = reader.get_history()
        assert history == self.model
        turns = turns_of(history)
        assert stats["stored_turns"] == len(turns)
        fields = ("turns_in_context", "turns_summarized", "turns_pending", "turns_evicted")
        counted = {f: stats.get(f, 0) for f in fields}
        assert sum(counted.values()) == len(turns), f"the stats account for {counted}"
        if context is None:  # over the budget: the stats say why, and nothing is verbatim
            assert stats["overflow"]
            assert counted["turns_in_context"] == 0
            return
        validate_openai_chat(to_openai(context))
        sent = {m.id for m in context}
        summary = summary_of(context, history)
        words = Counter(SECRET.findall(summary))
        twice = [w for w, n in words.items() if n > 1]
        assert not twice, f"folded twice: {twice}"
        fates = []
        for number, turn in enumerate(turns):
            shown = [m for m in turn if m.id in sent]
            folded = [m for m in turn if any(w in words for w in SECRET.findall(m.text))]
            assert not (shown and folded), f"turn {number} is both verbatim and in the summary"
            if shown:
                fates.append("context")
            elif folded:
                fates.append("summary")
            else:
                fates.append("neither")
            if folded:  # folded whole: every word of the turn is in the summary
                missing = [w for m in turn for w in SECRET.findall(m.text) if w not in words]
                greeting = turn[0].role != "user"
                assert not missing or greeting, f"turn {number} half folded: {missing} missing"
        # A first turn that does not open on a user message (its user message deleted) is
        # dropped by the repair rules wherever it stands: its words show nowhere, and the
        # stats may count it in any one place.
        greeting = int(bool(turns) and turns[0][0].role != "user")
        checked = fates[greeting:]
        order = "".join(f[0] for f in checked)  # c, s, n

        def between(field: str, fate: str) -> None:
            low = order.count(fate)
            assert low <= counted[field] <= low + greeting, f"{field}: {counted}, fates {fates}"

        between("turns_in_context", "c")
        if self.kind in SUMMARY_KINDS:
            assert re.fullmatch("s*n*c*", order), f"fates out of order: {fates}"
            if not self.switch.failing:
                assert "n" not in order, f"turns neither verbatim nor in the summary: {fates}"
            between("turns_summarized", "s")
            between("turns_pending", "n")
            assert counted["turns_evicted"] <= greeting
        else:
            assert "s" not in order
            assert not summary
            assert re.fullmatch("n*c*", order), f"an evicted turn newer than a kept one: {fates}"
            between("turns_evicted", "n")
            if self.kind == "buffer":
                assert "n" not in order
            if self.kind == "window":
                assert order.count("c") == min(SIZES[self.size][1], len(checked))
        self.inspection_agrees(reader, context, stats, fates, greeting)
        if self.kind in ("buffer", "window", "token"):
            # No state left behind by edits: the context of the log as it is now, at once.
            twin = make(self.kind, InMemoryStore(), "twin", self.size, self.switch)
            twin.add_messages(self.model)
            assert context == twin.get_context()

    def inspection_agrees(
        self,
        reader: BaseMemory[Any],
        context: list[Message],
        stats: dict[str, Any],
        fates: list[str],
        greeting: int,
    ) -> None:
        """``inspect()`` tells the same story as the text: each turn's fate, the stats, the
        tokens, every repair."""
        inspection = (
            asyncio.run(reader.ainspect(token_counter=COUNTER))
            if self.read_async
            else reader.inspect(token_counter=COUNTER)
        )
        assert list(inspection.context) == context
        # (Each read of a failing summarizer tries again, and counts the failure.)
        assert {**inspection.stats, "summary_failures": 0} == {**stats, "summary_failures": 0}
        told = [t.fate for t in inspection.turns]
        expected = [
            {"neither": "pending" if self.kind in SUMMARY_KINDS else "evicted"}.get(f, f)
            for f in fates
        ]
        assert told[greeting:] == expected[greeting:]
        assert Counter(told) == Counter({k: n for k, n in inspection.fates().items() if n})
        assert sum(t.sent_tokens for t in inspection.turns) == inspection.tokens.turns
        if "context_tokens" in stats:
            assert inspection.tokens.total == stats["context_tokens"]
        else:
            assert inspection.tokens.total == COUNTER.count_messages(context)
        noted = Counter(
            r.kind
            for t in inspection.turns
            for m in t.messages
            for r in m.repairs
            if r.kind != "truncated"
        )
        assert noted == Counter({k: n for k, n in stats["repairs"].items() if n})
        sent = [a.sent for t in inspection.turns for a in t.messages if a.sent is not None]
        assert {m.id for m in sent} == {m.id for m in context if m.role != "system"}

    @invariant()
    def nothing_removed_is_reachable(self) -> None:
        memory = self.memory
        try:
            context = [m.to_dict() for m in memory.get_context()]
            text = str(memory.load_memory_variables({}))
        except ContextOverflowError:
            context, text = [], ""
        history = memory.get_history()
        seen = " ".join(
            [
                json.dumps([m.to_dict() for m in history]),
                json.dumps(to_openai(history)),  # what zerda export writes
                json.dumps(context),
                json.dumps(memory.get_memory_stats()),
                json.dumps(self.store.get_metadata(memory.session_id)),
                json.dumps(memory.inspect(token_counter=COUNTER).as_dict()),
                text,
            ]
        )
        found = {w for w in self.gone if w in seen}
        assert not found, f"removed text is still readable: {sorted(found)}"


# -- the stores -------------------------------------------------------------------------------


@contextlib.contextmanager
def stores(backend: str, tmp_path: Path) -> Iterator[Any]:
    """A function giving (store, another connection to the same data) for ``backend``; the
    examples keep to sessions of their own, and what they left is removed after."""
    if backend == "memory":
        store = InMemoryStore()
        yield lambda: (store, store)
    elif backend == "sqlite":
        path = tmp_path / "accounting.sqlite3"
        pair = (SQLiteStore(path), SQLiteStore(path))
        yield lambda: pair
        for s in pair:
            s.close()
    elif backend == "redis":
        from zerda.stores import RedisStore

        url, prefix = require_redis(), f"{RUN_ID}ac{next(_sessions)}"
        redis_pair = (RedisStore(url, prefix=prefix), RedisStore(url, prefix=prefix))
        yield lambda: redis_pair
        redis_pair[0].clear()
        for s in redis_pair:
            s.close()
    elif backend == "postgres":
        import psycopg

        from zerda.stores import PostgresStore

        dsn, schema = require_postgres(), f"{RUN_ID}ac{next(_sessions)}"
        pg_pair = (PostgresStore(dsn, schema=schema), PostgresStore(dsn, schema=schema))
        yield lambda: pg_pair
        for s in pg_pair:
            s.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    else:
        pytest.importorskip("uvicorn", reason="the server extra is not installed")
        from test_serve import Live
        from zerda.stores import HTTPStore

        live = Live(SQLiteStore(tmp_path / "served.sqlite3"), auth=False)
        http_pair = (HTTPStore(live.url), HTTPStore(live.url))
        yield lambda: http_pair
        for s in http_pair:
            s.close()
        live.close()


# Every kind on every store; the servers cost a round trip a call, so fewer examples there.
# ZERDA_TEST_SOAK=N runs N times as many (a soak: not for make test's five minutes).
SOAK = int(os.environ.get("ZERDA_TEST_SOAK", "1"))
EXAMPLES = {"memory": 60, "sqlite": 15, "redis": 8, "postgres": 6, "http": 6}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", list(EXAMPLES))
def test_every_turn_is_accounted_for(kind: str, backend: str, tmp_path: Path) -> None:
    with stores(backend, tmp_path) as pair:
        machine = type(
            f"Accounting_{kind}_{backend}",
            (AccountingMachine,),
            {"kind": kind, "stores": staticmethod(pair)},
        )
        machine.TestCase.settings = settings(
            max_examples=EXAMPLES[backend] * SOAK,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        machine.TestCase().runTest()
