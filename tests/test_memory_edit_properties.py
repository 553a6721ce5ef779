"""A state machine of appends, pops, deletes, edits, forks and reads, per memory kind and store,
against a model of the log (issue #16).

The model is the list of messages the session should hold. After every step:

- the stored history equals the model;
- for the memories without a summary, the context equals what the same memory computes from
  the model's log alone, appended to a fresh store at once (edits leave no state behind);
- every context is valid for OpenAI Chat Completions (the repair rules hold after edits);
- no text that was deleted or edited away is reachable by any read: history, context, stats,
  the stored metadata (the summary), the seed API's text.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from _validators import validate_openai_chat
from services import RUN_ID, require_postgres, require_redis
from zerda import ApproxCounter, Message, to_openai
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
    ConversationTokenBufferMemory,
)
from zerda.stores import InMemoryStore, SQLiteStore, Store

COUNTER = ApproxCounter()


class Recording:
    """Its summary: the secret word of every user text it was given (what it holds shows)."""

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        said = [m.text.split()[0] for m in messages if m.role == "user" and m.text]
        return " ".join(filter(None, [previous_summary, *said]))[-300:]

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


def make(kind: str, store: Store, session_id: str) -> BaseMemory[Any]:
    where: dict[str, Any] = {"store": store, "session_id": session_id}
    if kind == "buffer":
        return ConversationBufferMemory(**where)
    if kind == "window":
        return ConversationBufferWindowMemory(k=2, **where)
    if kind == "token":
        return ConversationTokenBufferMemory(300, token_counter=COUNTER, **where)
    if kind == "summary_buffer":
        return ConversationSummaryBufferMemory(
            300, token_counter=COUNTER, summarizer=Recording(), **where
        )
    return ConversationSummaryMemory(token_counter=COUNTER, summarizer=Recording(), **where)


_words = itertools.count()
_sessions = itertools.count()
SECRET = re.compile(r"w\d{6}x")


def secret() -> str:
    """A word no other text holds, so that its presence anywhere is unambiguous."""
    return f"w{next(_words):06d}x"


class EditMachine(RuleBasedStateMachine):
    kind: str
    store_factory: Any

    @initialize()
    def start(self) -> None:
        self.store = type(self).store_factory()  # shared by the examples: a session each
        self.memory = make(self.kind, self.store, f"s{next(_sessions)}")
        self.model: list[Message] = []
        self.gone: set[str] = set()  # words deleted or edited away
        self.calls = itertools.count()

    # -- writes -------------------------------------------------------------------------------

    @rule(tool=st.booleans(), interjection=st.booleans())
    def add_turn(self, tool: bool, interjection: bool) -> None:
        batch: list[dict[str, Any]] = [{"role": "user", "content": f"{secret()} please"}]
        if tool:
            call = f"k{next(self.calls)}"
            batch.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call,
                            "type": "function",
                            "function": {"name": "look", "arguments": "{}"},
                        }
                    ],
                }
            )
            if interjection:  # the user speaks before the result: repair moves it back
                batch.append({"role": "user", "content": f"{secret()} wait"})
            batch.append({"role": "tool", "tool_call_id": call, "content": secret()})
        batch.append({"role": "assistant", "content": f"{secret()} done"})
        self.model += self.memory.add_messages(batch)

    @rule()
    def add_system(self) -> None:
        self.model.append(self.memory.add_message({"role": "system", "content": secret()}))

    @rule()
    def pop(self) -> None:
        turn = self.memory.pop_turn()
        start = _newest_turn_start(self.model)
        if start is None:
            assert turn is None
            return
        expected = [m for m in self.model[start:] if m.role not in ("system", "developer")]
        assert turn is not None
        assert list(turn.messages) == expected
        self.model = self.model[:start] + [
            m for m in self.model[start:] if m.role in ("system", "developer")
        ]
        self._forget(expected)

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        victim = data.draw(st.sampled_from(self.model))
        calls = {c.id for c in victim.tool_calls}
        removed = [
            m
            for m in self.model
            if m.id == victim.id or (m.role == "tool" and m.tool_call_id in calls)
        ]
        assert self.memory.delete_messages([victim.id]) == len(removed)  # type: ignore[list-item]
        self.model = [m for m in self.model if m not in removed]
        self._forget(removed)

    @precondition(lambda self: any(m.role == "user" for m in self.model))
    @rule(data=st.data())
    def edit(self, data: st.DataObject) -> None:
        victim = data.draw(st.sampled_from([m for m in self.model if m.role == "user"]))
        new = self.memory.edit_message(victim.id, f"{secret()} edited")  # type: ignore[arg-type]
        self.model = [new if m.id == victim.id else m for m in self.model]
        self._forget([victim])

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def fork_and_switch(self, data: st.DataObject) -> None:
        at = data.draw(st.sampled_from([None, *self.model]))
        new_id = f"s{next(_sessions)}"
        branch = self.memory.fork(new_id, at=None if at is None else at.id)
        assert type(branch) is type(self.memory)
        end = len(self.model) if at is None else self.model.index(at) + 1
        # The old line is left behind: what only it holds is no longer reachable from here.
        self._forget(self.model[end:])
        self.memory, self.model = branch, self.model[:end]

    def _forget(self, messages: Sequence[Message]) -> None:
        for m in messages:
            self.gone.update(SECRET.findall(m.text))

    # -- what must hold -------------------------------------------------------------------------

    @invariant()
    def the_log_is_the_model(self) -> None:
        assert self.memory.get_history() == self.model

    @invariant()
    def the_context_is_valid_and_as_predicted(self) -> None:
        context = self.memory.get_context()
        validate_openai_chat(to_openai(context))
        if self.kind in ("buffer", "window", "token"):
            fresh = make(self.kind, InMemoryStore(), "fresh")
            fresh.add_messages(self.model)
            assert context == fresh.get_context()

    @invariant()
    def nothing_removed_is_reachable(self) -> None:
        seen = " ".join(
            [
                json.dumps([m.to_dict() for m in self.memory.get_history()]),
                json.dumps([m.to_dict() for m in self.memory.get_context()]),
                json.dumps(self.memory.get_memory_stats()),
                json.dumps(self.store.get_metadata(self.memory.session_id)),
                str(self.memory.load_memory_variables({})),
            ]
        )
        found = {w for w in self.gone if w in seen}
        assert not found, f"removed text is still readable: {sorted(found)}"


def _newest_turn_start(model: Sequence[Message]) -> int | None:
    first = None
    for i in range(len(model) - 1, -1, -1):
        if model[i].role == "user":
            return i
        if model[i].role not in ("system", "developer"):
            first = i
    return first


KINDS = ["buffer", "window", "token", "summary_buffer", "summary"]


@contextlib.contextmanager
def opened(backend: str, tmp_path: Path) -> Iterator[Store]:
    """One store of ``backend`` for a test (the examples keep to sessions of their own), and
    what it left removed after."""
    if backend == "memory":
        yield InMemoryStore()
    elif backend == "sqlite":
        store = SQLiteStore(tmp_path / "edits.sqlite3")
        yield store
        store.close()
    elif backend == "redis":
        from zerda.stores import RedisStore

        redis_store = RedisStore(require_redis(), prefix=f"{RUN_ID}ed{next(_sessions)}")
        yield redis_store
        redis_store.clear()
        redis_store.close()
    else:
        import psycopg

        from zerda.stores import PostgresStore

        dsn, schema = require_postgres(), f"{RUN_ID}ed{next(_sessions)}"
        pg_store = PostgresStore(dsn, schema=schema)
        yield pg_store
        pg_store.close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# The servers cost a round trip a call: fewer examples there, on every kind all the same.
EXAMPLES = {"memory": 25, "sqlite": 20, "redis": 10, "postgres": 8}


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", list(EXAMPLES))
def test_edits_against_the_model(kind: str, backend: str, tmp_path: Path) -> None:
    with opened(backend, tmp_path) as store:
        machine = type(
            f"Edits_{kind}_{backend}",
            (EditMachine,),
            {"kind": kind, "store_factory": staticmethod(lambda: store)},
        )
        machine.TestCase.settings = settings(
            max_examples=EXAMPLES[backend],
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        )
        machine.TestCase().runTest()
