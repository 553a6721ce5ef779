"""The Google ADK integration: ZerdaSessionService is ADK's SessionService over any Zerda store,
and ZerdaContext chooses what the model sees through ``before_model_callback``.

Runs are real ``google.adk.runners.Runner`` runs of an ``LlmAgent`` over a scripted ``BaseLlm``
(no network), beside ADK's own session services on the same script. The rest pins what the
service promises: events read back equal on every store, ADK's state scopes and stale-session
semantics, ``GetSessionConfig`` read from the tail (and the same events as ADK's in-memory
service chooses), appends from two processes that lose nothing, commits that survive a process
dying half way, and the model's contents chosen by a Zerda memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.adk", reason="the adk extra (google-adk) is not installed")

from google.adk.agents import LlmAgent
from google.adk.errors import StaleSessionError
from google.adk.errors.already_exists_error import AlreadyExistsError
from google.adk.errors.session_not_found_error import SessionNotFoundError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions, EventCompaction
from google.adk.models.base_llm import BaseLlm
from google.adk.models.llm_request import LlmRequest
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import BaseSessionService, InMemorySessionService, Session
from google.adk.sessions.base_session_service import GetSessionConfig
from google.adk.sessions.sqlite_session_service import SqliteSessionService
from google.genai import types
from pydantic import Field

from services import POSTGRES_DSN, REDIS_URL
from test_integrations import ASYNC_STORES, _run, opened_stores
from zerda import (
    ApproxCounter,
    ConfigurationError,
    ContextOverflowError,
    ConversationBufferMemory,
    InvalidMessageError,
    Role,
    ZerdaWarning,
)
from zerda.integrations.adk import (
    METADATA_KEY,
    SESSION_KEY,
    ZerdaContext,
    ZerdaSessionService,
    zerda_session_id,
)
from zerda.stores import InMemoryStore, SQLiteStore
from zerda.stores._base import check_session_id

# ADK logs a warning for every model response without token usage: not what these tests read.
logging.getLogger("google_adk").setLevel(logging.ERROR)

COUNTER = ApproxCounter()

# -- a scripted model, ADK's BaseLlm ----------------------------------------------------------


class ScriptedLlm(BaseLlm):
    """Answers each request with the next scripted response and records the contents sent."""

    replies: list[LlmResponse] = Field(default_factory=list)
    seen: list[list[dict[str, Any]]] = Field(default_factory=list)

    async def generate_content_async(
        self, llm_request: LlmRequest, stream: bool = False
    ) -> AsyncIterator[LlmResponse]:
        self.seen.append(
            [c.model_dump(mode="json", exclude_none=True) for c in llm_request.contents]
        )
        assert self.replies, "the model was called more often than scripted"
        yield self.replies.pop(0)


def said(text: str, role: str = "user") -> types.Content:
    return types.Content(role=role, parts=[types.Part(text=text)])


def reply(text: str) -> LlmResponse:
    return LlmResponse(content=said(text, "model"))


def calls(*cities: str) -> LlmResponse:
    parts = [
        types.Part(function_call=types.FunctionCall(name="weather", args={"city": c}))
        for c in cities
    ]
    return LlmResponse(content=types.Content(role="model", parts=parts))


def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def script() -> list[LlmResponse]:
    """Three runs with a tool: one call; two calls at once; a plain answer; then a fourth."""
    return [
        calls("Paris"),
        reply("Sunny in Paris."),
        calls("Rome", "Oslo"),
        reply("Sunny in both."),
        reply("You asked about Paris, Rome and Oslo."),
        reply("Still sunny."),
    ]


def agent(model: ScriptedLlm, **options: Any) -> LlmAgent:
    return LlmAgent(name="helper", model=model, tools=[weather], output_key="last", **options)


async def run(runner: Runner, text: str, session_id: str = "trip", **options: Any) -> None:
    async for _ in runner.run_async(
        user_id="alice", session_id=session_id, new_message=said(text), **options
    ):
        pass


def shape(event: Event) -> tuple[str, Any]:
    """What two services' runs of one script agree on: the author and the content, without
    the ids ADK draws afresh for each call."""
    content = event.content.model_dump(mode="json", exclude_none=True) if event.content else None
    return event.author, _without_ids(content)


def _without_ids(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_ids(v) for k, v in value.items() if k != "id"}
    if isinstance(value, list):
        return [_without_ids(v) for v in value]
    return value


def on_stores(
    kind: str, tmp_path: Path, test: Callable[[Callable[[], ZerdaSessionService]], Awaitable[None]]
) -> None:
    """Run ``test(service)`` in an event loop: ``service()`` makes a ZerdaSessionService over a
    new store of ``kind`` reaching the same data each time."""

    async def main() -> None:
        with opened_stores(kind, tmp_path) as stores:
            made: list[Any] = []

            def service() -> ZerdaSessionService:
                made.append(stores())
                return ZerdaSessionService(made[-1])

            try:
                await test(service)
            finally:
                if kind.startswith("async"):
                    for store in made:
                        await store.aclose()

    asyncio.run(main())


# -- runs of a real Runner ---------------------------------------------------------------------


def test_runs_with_a_tool_are_adks_and_survive_a_restart(tmp_path: Path) -> None:
    """Three runs with a tool over ZerdaSessionService send the model what ADK's own SQLite
    service sends and store the same events; a new service over the same file continues the
    conversation with every earlier event."""
    words = ["Weather in Paris?", "And Rome and Oslo?", "What did I ask?"]

    async def main() -> None:
        theirs_model, ours_model = (
            ScriptedLlm(model="s", replies=script()),
            ScriptedLlm(model="s", replies=script()),
        )
        theirs = SqliteSessionService(str(tmp_path / "adk.db"))
        store = SQLiteStore(tmp_path / "zerda.db")
        ours = ZerdaSessionService(store)
        runners = [
            Runner(app_name="app", agent=agent(m), session_service=s, auto_create_session=True)
            for m, s in ((theirs_model, theirs), (ours_model, ours))
        ]
        for text in words:
            for runner in runners:
                await run(runner, text)
        assert ours_model.seen == theirs_model.seen
        mine = await ours.get_session(app_name="app", user_id="alice", session_id="trip")
        adks = await theirs.get_session(app_name="app", user_id="alice", session_id="trip")
        assert mine is not None
        assert adks is not None
        assert [shape(e) for e in mine.events] == [shape(e) for e in adks.events]
        assert len(mine.events) == 10  # 3 questions, 2 calls, 2 responses (one of two), 3 answers
        assert mine.state == adks.state == {"last": "You asked about Paris, Rome and Oslo."}
        store.close()

        with SQLiteStore(tmp_path / "zerda.db") as again:
            resumed = ZerdaSessionService(again)
            before = await resumed.get_session(app_name="app", user_id="alice", session_id="trip")
            assert before is not None
            assert before.events == mine.events
            runner = Runner(app_name="app", agent=agent(ours_model), session_service=resumed)
            await run(runner, "Tomorrow?")
            await run(runners[0], "Tomorrow?")
            assert ours_model.seen[-1] == theirs_model.seen[-1]
            assert ours_model.seen[-1][-1] == {"parts": [{"text": "Tomorrow?"}], "role": "user"}
            assert len(ours_model.seen[-1]) == 11  # every earlier event reached the model
            after = await resumed.get_session(app_name="app", user_id="alice", session_id="trip")
            assert after is not None
            assert after.events[:10] == mine.events
            assert after.state["last"] == "Still sunny."
        await theirs.close()

    asyncio.run(main())


def test_each_event_is_zerda_messages_that_the_memories_read() -> None:
    async def main() -> None:
        store = InMemoryStore()
        runner = Runner(
            app_name="app",
            agent=agent(ScriptedLlm(model="s", replies=script())),
            session_service=ZerdaSessionService(store),
            auto_create_session=True,
        )
        await run(runner, "Weather in Paris?")
        await run(runner, "And Rome and Oslo?")
        memory = ConversationBufferMemory(
            store=store, session_id=zerda_session_id("app", "alice", "trip")
        )
        context = memory.get_context()
        assert [m.role for m in context] == [
            Role.USER,
            Role.ASSISTANT,
            Role.TOOL,
            Role.ASSISTANT,
            Role.USER,
            Role.ASSISTANT,
            Role.TOOL,
            Role.TOOL,
            Role.ASSISTANT,
        ]
        assert context[2].tool_call_id == context[1].tool_calls[0].id
        assert [m.tool_call_id for m in context[6:8]] == [c.id for c in context[5].tool_calls]
        assert context[-1].text == "Sunny in both."
        # Only the first message of an event keeps it; the second response points to it.
        assert "event" in context[6].metadata[METADATA_KEY]
        assert context[7].metadata[METADATA_KEY] == {"of": context[6].id}

    asyncio.run(main())


# -- events read back equal, on every store ------------------------------------------------------


class NotedEvent(Event):
    """An application's own event type, with a field ADK does not have."""

    note: str = ""


def every_kind_of_event() -> list[Event]:
    """Events with every field Zerda models and many it does not, in one session's order."""
    png = b"\x89PNG\r\n\x1a\n-not-really"
    return [
        Event(invocation_id="i1", author="user", content=said("Weather in Paris?")),
        Event(
            invocation_id="i1",
            author="helper",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(text="check the tool", thought=True, thought_signature=b"\x00\xff"),
                    types.Part(
                        function_call=types.FunctionCall(
                            id="adk-1", name="weather", args={"city": "Paris"}
                        ),
                        thought_signature=b"sig",
                    ),
                ],
            ),
            long_running_tool_ids={"adk-1", "adk-0"},
            usage_metadata=types.GenerateContentResponseUsageMetadata(prompt_token_count=7),
            model_version="scripted-1",
            custom_metadata={"trace": [1, {"a": None}]},
        ),
        Event(
            invocation_id="i1",
            author="helper",
            content=types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            id="adk-1", name="weather", response={"result": "sunny"}
                        )
                    )
                ],
            ),
            actions=EventActions(
                state_delta={"city": "Paris", "app:calls": 1, "user:home": "Oslo"},
                artifact_delta={"map.png": 2},
                skip_summarization=True,
            ),
        ),
        Event(
            invocation_id="i1",
            author="helper",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(text="Here is a map:"),
                    types.Part(inline_data=types.Blob(mime_type="image/png", data=png)),
                    types.Part(
                        file_data=types.FileData(
                            file_uri="gs://bucket/report.pdf", mime_type="application/pdf"
                        )
                    ),
                ],
            ),
            grounding_metadata=types.GroundingMetadata(web_search_queries=["paris weather"]),
            branch="helper.sub",
            output={"answer": [1, 2.5, "x"]},
        ),
        # Parts Gemini's format does not have: stored as a message showing the event.
        Event(
            invocation_id="i2",
            author="coder",
            content=types.Content(
                role="model",
                parts=[
                    types.Part(
                        executable_code=types.ExecutableCode(code="print(1)", language="PYTHON")
                    ),
                    types.Part(
                        code_execution_result=types.CodeExecutionResult(
                            outcome="OUTCOME_OK", output="1\n"
                        )
                    ),
                ],
            ),
        ),
        # No content: actions only.
        Event(
            invocation_id="i2",
            author="coder",
            actions=EventActions(transfer_to_agent="helper", escalate=True, end_of_agent=True),
        ),
        Event(
            invocation_id="i3",
            author="user",
            actions=EventActions(state_delta={"mood": "curious"}),
        ),
        # ADK's own compaction of the events so far.
        Event(
            invocation_id="i3",
            author="user",
            actions=EventActions(
                compaction=EventCompaction(
                    start_timestamp=1.0,
                    end_timestamp=2.0,
                    compacted_content=said("The user asked about Paris.", "model"),
                )
            ),
        ),
        NotedEvent(invocation_id="i4", author="user", content=said("a noted one"), note="kept"),
    ]


@pytest.mark.parametrize("kind", ASYNC_STORES)
def test_every_kind_of_event_reads_back_equal_in_order(kind: str, tmp_path: Path) -> None:
    async def test(service: Callable[[], ZerdaSessionService]) -> None:
        writer = service()
        session = await writer.create_session(app_name="app", user_id="u", session_id="s")
        events = every_kind_of_event()
        for event in events:
            await writer.append_event(session, event)
        assert session.events == events
        got = await service().get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert got.events == events
        assert [type(e) for e in got.events] == [type(e) for e in events]
        assert got.events[-1].note == "kept"  # type: ignore[attr-defined]
        assert got.events[1].content.parts[0].thought_signature == b"\x00\xff"  # type: ignore[union-attr]
        assert got.state == {
            "city": "Paris",
            "mood": "curious",
            "app:calls": 1,
            "user:home": "Oslo",
        }
        assert got.last_update_time == events[-1].timestamp

    on_stores(kind, tmp_path, test)


def test_events_read_are_copies() -> None:
    async def main() -> None:
        service = ZerdaSessionService()
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        event = Event(invocation_id="i", author="user", content=said("hi"))
        await service.append_event(session, event)
        for _ in range(2):
            got = await service.get_session(app_name="app", user_id="u", session_id="s")
            assert got is not None
            assert got.events == [event]
            assert got.events[0] is not event
            got.events[0].content.parts[0].text = "changed"  # type: ignore[union-attr, index]
            got.events[0].actions.state_delta["k"] = 1

    asyncio.run(main())


def test_an_event_zerda_cannot_read_is_a_message_showing_it() -> None:
    async def main() -> None:
        store = InMemoryStore()
        service = ZerdaSessionService(store)
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        for event in every_kind_of_event():
            await service.append_event(session, event)
        history = store.history(zerda_session_id("app", "u", "s"))
        shown = [m for m in history if m.text.startswith("{") and m.role is not Role.TOOL]
        assert [json.loads(m.text)["author"] for m in shown] == ["coder", "coder", "user", "user"]
        assert '"executable_code"' in shown[0].text
        assert '"print(1)"' in shown[0].text
        assert json.loads(shown[1].text)["actions"] == {
            "transfer_to_agent": "helper",
            "escalate": True,
            "end_of_agent": True,
        }
        assert shown[2].role is Role.USER  # the user's state change stays in its turn
        image = next(m for m in history if "Here is a map" in m.text)
        assert image.role is Role.ASSISTANT
        assert len(image.parts) == 3

    asyncio.run(main())


def test_fields_of_a_newer_adk_are_kept_in_the_store_as_written() -> None:
    """An event read back holds the fields this ADK knows; what a newer ADK wrote beside them
    stays in the store, untouched by reads and appends."""

    async def main() -> None:
        store = InMemoryStore()
        service = ZerdaSessionService(store)
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        event = Event(invocation_id="i", author="user", content=said("hi"))
        await service.append_event(session, event)
        zid = zerda_session_id("app", "u", "s")
        [message] = store.history(zid)
        newer = json.loads(message.metadata[METADATA_KEY]["event"])
        newer["sentiment"] = {"score": 0.9}
        kept = {**message.metadata[METADATA_KEY], "event": json.dumps(newer)}
        store.delete_messages(zid, [message.id])
        store.append(zid, [dataclasses.replace(message, metadata={METADATA_KEY: kept})])
        again = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert again is not None
        assert again.events == [event]
        await service.append_event(
            again, Event(invocation_id="j", author="user", content=said("x"))
        )
        assert json.loads(store.history(zid)[0].metadata[METADATA_KEY]["event"])["sentiment"] == {
            "score": 0.9
        }

    asyncio.run(main())


def test_a_partial_event_is_not_stored_and_bad_input_is_refused() -> None:
    async def main() -> None:
        service = ZerdaSessionService()
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        partial = Event(invocation_id="i", author="m", content=said("hal", "model"), partial=True)
        assert await service.append_event(session, partial) is partial
        assert session.events == []
        with pytest.raises(InvalidMessageError, match="takes an Event, got dict"):
            await service.append_event(session, {"author": "user"})  # type: ignore[arg-type]
        with pytest.raises(ConfigurationError, match="takes a Session, got str"):
            await service.append_event("s", partial)  # type: ignore[arg-type]
        unserializable = Event(invocation_id="i", author="m", output=object())
        with pytest.raises(InvalidMessageError, match="cannot be stored"):
            await service.append_event(session, unserializable)
        with pytest.raises(ConfigurationError, match="state is a dict with string keys"):
            await service.create_session(app_name="app", user_id="u", state={1: "x"})  # type: ignore[dict-item]
        with pytest.raises(ConfigurationError, match="takes a Zerda store"):
            ZerdaSessionService("chat.db")  # type: ignore[arg-type]
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert got.events == []

    asyncio.run(main())


# -- sessions and their names ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis", "postgres"])
def test_create_get_list_and_delete(kind: str, tmp_path: Path) -> None:
    async def test(service: Callable[[], ZerdaSessionService]) -> None:
        one = service()
        made = await one.create_session(app_name="app", user_id="u1", state={"k": 1})
        assert made.id
        assert made.state == {"k": 1}
        assert made.events == []
        with pytest.raises(AlreadyExistsError):
            await service().create_session(app_name="app", user_id="u1", session_id=made.id)
        second = await one.create_session(app_name="app", user_id="u2", session_id=" s2 ")
        assert second.id == "s2"
        await one.create_session(app_name="other", user_id="u1", session_id="s3")
        await one.append_event(made, Event(invocation_id="i", author="user", content=said("hi")))

        listed = (await service().list_sessions(app_name="app")).sessions
        assert [(s.user_id, s.id) for s in listed] == [("u2", "s2"), ("u1", made.id)]
        assert all(s.events == [] for s in listed)
        assert listed[1].last_update_time == made.last_update_time
        mine = (await service().list_sessions(app_name="app", user_id="u1")).sessions
        assert [s.id for s in mine] == [made.id]
        assert (await service().list_sessions(app_name="none")).sessions == []

        assert await one.get_session(app_name="app", user_id="u2", session_id="missing") is None
        assert await one.get_session(app_name="app", user_id="u9", session_id="s2") is None
        await service().delete_session(app_name="app", user_id="u1", session_id=made.id)
        assert await one.get_session(app_name="app", user_id="u1", session_id=made.id) is None
        with pytest.raises(SessionNotFoundError):
            await one.append_event(made, Event(invocation_id="i", author="user"))
        await one.delete_session(app_name="app", user_id="u1", session_id="never-was")
        assert [s.id for s in (await one.list_sessions(app_name="app")).sessions] == ["s2"]

    on_stores(kind, tmp_path, test)


@pytest.mark.parametrize(
    "names",
    [
        ("app", "alice@example.com", "3f2a-1"),
        ("my app", "user/1", "séance 42: ok?"),
        ("a:b", "c", "d"),
        ("a", "b:c", "d"),
        ("x" * 150, "y" * 150, "z" * 150),
        ("x" * 60, "y" * 80, "z" * 150),
        ("", "", "=3A"),
    ],
)
def test_any_adk_ids_name_one_valid_zerda_session(names: tuple[str, str, str]) -> None:
    zid = zerda_session_id(*names)
    assert check_session_id(zid) == zid
    assert zid == zerda_session_id(*names)

    async def main() -> None:
        service = ZerdaSessionService()
        app, user, sid = names
        await service.create_session(app_name=app, user_id=user, session_id=sid or "x", state={})
        got = await service.get_session(app_name=app, user_id=user, session_id=sid or "x")
        assert got is not None
        assert (got.app_name, got.user_id, got.id) == (app, user, sid or "x")
        listed = (await service.list_sessions(app_name=app, user_id=user)).sessions
        assert [s.id for s in listed] == [sid or "x"]

    asyncio.run(main())


def test_ids_that_look_alike_name_different_sessions() -> None:
    ids = {
        zerda_session_id(*names)
        for names in [
            ("a:b", "c", "d"),
            ("a", "b:c", "d"),
            ("a", "b", "c:d"),
            ("a=3Ab", "c", "d"),
            ("a", "b"),
            ("a",),
            ("x" * 300, "y", "z"),
            ("x" * 300, "y", "z2"),
        ]
    }
    assert len(ids) == 8
    with pytest.raises(ConfigurationError, match="got 4 names"):
        zerda_session_id("a", "b", "c", "d")


# -- state: app, user, session, temp ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_state_scopes_are_adks(kind: str, tmp_path: Path) -> None:
    """``app:`` state is the app's, ``user:`` state the user's, both shared by their sessions;
    ``temp:`` state reaches the session object only; the rest is the session's."""

    async def test(service: Callable[[], ZerdaSessionService]) -> None:
        ours, adks = service(), InMemorySessionService()
        for svc in (ours, adks):
            one = await svc.create_session(
                app_name="app",
                user_id="u",
                session_id="one",
                state={"app:theme": "dark", "user:lang": "fr", "step": 1, "temp:scratch": 9},
            )
            assert "temp:scratch" not in one.state
            delta = {"step": 2, "app:theme": "light", "user:name": "Al", "temp:t": 1}
            event = Event(invocation_id="i", author="m", actions=EventActions(state_delta=delta))
            await svc.append_event(one, event)
            assert one.state["temp:t"] == 1  # the running invocation sees it
            assert "temp:t" not in event.actions.state_delta  # the stored event does not
            await svc.create_session(app_name="app", user_id="u", session_id="two")
            await svc.create_session(app_name="app", user_id="v", session_id="three")
        for sid, user in (("one", "u"), ("two", "u"), ("three", "v")):
            mine = await service().get_session(app_name="app", user_id=user, session_id=sid)
            theirs = await adks.get_session(app_name="app", user_id=user, session_id=sid)
            assert mine is not None
            assert theirs is not None
            assert mine.state == theirs.state, sid
        mine_one = await ours.get_session(app_name="app", user_id="u", session_id="one")
        assert mine_one is not None
        assert mine_one.state == {
            "step": 2,
            "app:theme": "light",
            "user:lang": "fr",
            "user:name": "Al",
        }
        assert await ours.get_user_state(app_name="app", user_id="u") == {
            "lang": "fr",
            "name": "Al",
        }
        assert await ours.get_user_state(app_name="app", user_id="v") == {}
        listed = (await ours.list_sessions(app_name="app")).sessions
        assert {s.id: s.state for s in listed} == {
            "one": mine_one.state,
            "two": {"app:theme": "light", "user:lang": "fr", "user:name": "Al"},
            "three": {"app:theme": "light"},
        }

    on_stores(kind, tmp_path, test)


def test_state_that_is_not_json_is_stored_as_adks_services_store_it() -> None:
    async def main() -> None:
        service = ZerdaSessionService()
        with pytest.warns(ZerdaWarning, match="not JSON"):
            made = await service.create_session(
                app_name="app", user_id="u", session_id="s", state={"f": print}
            )
        assert isinstance(made.state["f"], str)

    asyncio.run(main())


# -- GetSessionConfig, from the tail --------------------------------------------------------------


class CountingStore(InMemoryStore):
    """An in-memory store that records the tails read and, while ``strict``, refuses to read
    a whole session."""

    strict = True

    def __init__(self) -> None:
        super().__init__()
        self.tails: list[int | None] = []
        self.read: list[int] = []

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Any:
        self.tails.append(turns)
        assert turns is not None or not self.strict, "a whole session was read"
        got = super().tail(session_id, turns, counter)
        self.read.append(len(got.messages))
        return got

    def history(self, session_id: str) -> Any:
        assert not self.strict, "a whole session was read"
        return super().history(session_id)


async def _fill(service: BaseSessionService, turns: int, start: float = 1000.0) -> Session:
    """A session of ``turns`` turns of three events each (the user, a call, its response),
    the events one second apart."""
    session = await service.create_session(app_name="app", user_id="u", session_id="long")
    stamp = start
    for t in range(turns):
        for event in (
            Event(invocation_id=f"i{t}", author="user", content=said(f"question {t}")),
            Event(invocation_id=f"i{t}", author="m", content=calls(f"city {t}").content),
            Event(
                invocation_id=f"i{t}",
                author="m",
                content=types.Content(
                    role="user",
                    parts=[
                        types.Part(
                            function_response=types.FunctionResponse(
                                name="weather", response={"t": t}
                            )
                        )
                    ],
                ),
            ),
        ):
            event.timestamp = stamp
            stamp += 1.0
            await service.append_event(session, event)
    return session


CONFIGS = [
    GetSessionConfig(),
    GetSessionConfig(num_recent_events=0),
    GetSessionConfig(num_recent_events=1),
    GetSessionConfig(num_recent_events=5),
    GetSessionConfig(num_recent_events=31),
    GetSessionConfig(num_recent_events=500),
    GetSessionConfig(after_timestamp=1040.0),
    GetSessionConfig(after_timestamp=1040.5),
    GetSessionConfig(after_timestamp=0.0),
    GetSessionConfig(after_timestamp=5000.0),
    GetSessionConfig(num_recent_events=10, after_timestamp=1085.0),
    GetSessionConfig(num_recent_events=3, after_timestamp=1000.0),
]


def test_get_session_config_chooses_the_events_adks_in_memory_service_does() -> None:
    async def main() -> None:
        ours, adks = ZerdaSessionService(), InMemorySessionService()
        for service in (ours, adks):
            await _fill(service, 30)
        for config in CONFIGS:
            mine = await ours.get_session(
                app_name="app", user_id="u", session_id="long", config=config
            )
            theirs = await adks.get_session(
                app_name="app", user_id="u", session_id="long", config=config
            )
            assert mine is not None
            assert theirs is not None
            assert [e.timestamp for e in mine.events] == [e.timestamp for e in theirs.events], (
                config
            )
            assert [shape(e) for e in mine.events] == [shape(e) for e in theirs.events]

    asyncio.run(main())


def test_recent_events_are_read_from_the_tail_without_reading_the_session() -> None:
    async def main() -> None:
        store = CountingStore()
        service = ZerdaSessionService(store)
        await _fill(service, 300)  # 900 events
        zid = zerda_session_id("app", "u", "long")
        store.strict = False
        assert len(store.history(zid)) == 900
        store.strict = True
        for config, expected in (
            (GetSessionConfig(num_recent_events=7), 7),
            (GetSessionConfig(after_timestamp=1000.0 + 900 - 10), 10),
            (GetSessionConfig(num_recent_events=0), 0),
        ):
            store.tails.clear()
            store.read.clear()
            got = await service.get_session(
                app_name="app", user_id="u", session_id="long", config=config
            )
            assert got is not None
            assert len(got.events) == expected
            assert sum(store.read) <= 30, (config, store.tails, store.read)
        store.tails.clear()
        listed = await service.list_sessions(app_name="app", user_id="u")
        assert [s.id for s in listed.sessions] == ["long"]
        assert store.tails == []  # listing reads no event

    asyncio.run(main())


def test_a_runner_can_read_only_the_recent_events() -> None:
    """``RunConfig(get_session_config=...)``: the runner loads the newest events only, and
    every run still stores all of its events."""
    from google.adk.agents.run_config import RunConfig

    async def main() -> None:
        store = CountingStore()
        service = ZerdaSessionService(store)
        model = ScriptedLlm(model="s", replies=script())
        runner = Runner(
            app_name="app", agent=agent(model), session_service=service, auto_create_session=True
        )
        recent = RunConfig(get_session_config=GetSessionConfig(num_recent_events=4))
        for text in ["Weather in Paris?", "And Rome and Oslo?", "What did I ask?"]:
            await run(runner, text, run_config=recent)
        assert all(t is not None for t in store.tails)
        assert model.seen[-1][0] == {"parts": [{"text": "And Rome and Oslo?"}], "role": "user"}
        store.strict = False
        everything = await service.get_session(app_name="app", user_id="alice", session_id="trip")
        assert everything is not None
        assert len(everything.events) == 10

    asyncio.run(main())


# -- stale sessions and concurrent runners --------------------------------------------------------


@pytest.mark.parametrize("kind", ["memory", "sqlite", "redis"])
def test_a_session_changed_since_it_was_loaded_is_stale(kind: str, tmp_path: Path) -> None:
    async def test(service: Callable[[], ZerdaSessionService]) -> None:
        one, two = service(), service()
        await one.create_session(app_name="app", user_id="u", session_id="s")
        first = await one.get_session(app_name="app", user_id="u", session_id="s")
        second = await two.get_session(app_name="app", user_id="u", session_id="s")
        assert first is not None
        assert second is not None
        await one.append_event(first, Event(invocation_id="a", author="user", content=said("a")))
        lost = Event(
            invocation_id="b",
            author="user",
            content=said("b"),
            actions=EventActions(state_delta={"b": 1, "app:b": 1}),
        )
        with pytest.raises(StaleSessionError):
            await two.append_event(second, lost)
        stored = await two.get_session(app_name="app", user_id="u", session_id="s")
        assert stored is not None
        assert [e.invocation_id for e in stored.events] == ["a"]
        assert stored.state == {}  # nothing of the stale append is stored
        await two.append_event(stored, lost)  # reloaded, it goes in
        with pytest.raises(StaleSessionError):  # and the first is now behind
            await one.append_event(first, Event(invocation_id="c", author="user"))
        final = await one.get_session(app_name="app", user_id="u", session_id="s")
        assert final is not None
        assert [e.invocation_id for e in final.events] == ["a", "b"]
        assert final.state == {"b": 1, "app:b": 1}

    on_stores(kind, tmp_path, test)


class LaggingStore(InMemoryStore):
    """An in-memory store whose next tail, when ``replay`` is set, is that older one: a writer
    that read the session just before another one appended."""

    replay: Any = None

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Any:
        if self.replay is not None:
            replay, self.replay = self.replay, None
            return replay
        return super().tail(session_id, turns, counter)


def test_of_two_appends_from_one_revision_one_is_stored_and_the_other_is_stale() -> None:
    """Both appends pass the revision check; the store keeps one message per id, so only the
    first is stored; the second stores none of its messages and raises."""

    async def main() -> None:
        store = LaggingStore()
        service = ZerdaSessionService(store)
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        zid = zerda_session_id("app", "u", "s")
        before = store.tail(zid, 1)
        late = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert late is not None
        won = Event(invocation_id="a", author="user", content=said("a"))
        await service.append_event(session, won)
        three_responses = types.Content(
            role="user",
            parts=[
                types.Part(
                    function_response=types.FunctionResponse(
                        id=f"c{n}", name="w", response={"n": n}
                    )
                )
                for n in range(3)
            ],
        )
        lost = Event(
            invocation_id="b",
            author="m",
            content=three_responses,
            actions=EventActions(state_delta={"b": 1, "app:b": 1}),
        )
        store.replay = before
        with pytest.raises(StaleSessionError):
            await service.append_event(late, lost)
        assert [m.text for m in store.history(zid)] == ["a"]  # none of its three messages
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert got.events == [won]
        assert got.state == {}
        await service.append_event(got, lost)  # reloaded: its three messages go in
        assert [m.role for m in store.history(zid)] == [Role.USER, *[Role.TOOL] * 3]

    asyncio.run(main())


def test_stale_checks_without_a_revision_are_adks_by_time_and_newest_event() -> None:
    """A Session this service did not return (built by hand) is checked as ADK's database
    service checks one: stale if storage was updated after it, unless its newest event is the
    newest stored."""

    async def main() -> None:
        service = ZerdaSessionService()
        made = await service.create_session(app_name="app", user_id="u", session_id="s")
        first = Event(invocation_id="a", author="user", content=said("a"))
        await service.append_event(made, first)
        behind = Session(app_name="app", user_id="u", id="s", last_update_time=0.0)
        with pytest.raises(StaleSessionError):
            await service.append_event(behind, Event(invocation_id="b", author="user"))
        level = Session(app_name="app", user_id="u", id="s", events=[first], last_update_time=0.0)
        await service.append_event(level, Event(invocation_id="c", author="user"))
        ahead = Session(app_name="app", user_id="u", id="s", last_update_time=10.0**12)
        await service.append_event(ahead, Event(invocation_id="d", author="user"))
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert [e.invocation_id for e in got.events] == ["a", "c", "d"]

    asyncio.run(main())


def test_tasks_appending_through_one_session_object_all_commit() -> None:
    """Parallel agents share one session object: their appends all go in, none stale."""

    async def main() -> None:
        service = ZerdaSessionService(SlowStore())
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        events = [Event(invocation_id=f"i{n}", author=f"a{n}") for n in range(8)]
        await asyncio.gather(*(service.append_event(session, e) for e in events))
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert sorted(e.id for e in got.events) == sorted(e.id for e in events)
        assert [e.id for e in got.events] == [e.id for e in session.events]

    asyncio.run(main())


class SlowStore(InMemoryStore):
    """An in-memory store that lets other threads run inside each call."""

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        import time

        time.sleep(0.001)
        return super().compare_and_set(session_id, key, expected, value)


APPENDER = """
import asyncio, json, logging, sys
from google.adk.errors import StaleSessionError
from google.adk.events.event import Event
from google.adk.events.event_actions import EventActions
from google.adk.sessions.base_session_service import GetSessionConfig
from google.genai import types
from zerda.integrations.adk import ZerdaSessionService
from zerda.stores import PostgresStore, RedisStore, SQLiteStore

logging.getLogger("google_adk").setLevel(logging.ERROR)
specs, worker, count = json.loads(sys.argv[1])
recent = GetSessionConfig(num_recent_events=1)


def store_of(kind, where, name):
    if kind == "sqlite":
        return SQLiteStore(where)
    if kind == "redis":
        return RedisStore(where, prefix=name)
    return PostgresStore(where, schema=name, max_size=2)


async def appends(service):
    session = await service.get_session(app_name="app", user_id="u", session_id="shared")
    for n in range(count):
        event = Event(
            invocation_id=f"w{worker}",
            author="user",
            content=types.Content(role="user", parts=[types.Part(text=f"{worker}:{n}")]),
            actions=EventActions(state_delta={f"w{worker}": n, f"app:w{worker}.{n}": True}),
        )
        while True:  # ADK's semantics: reload a stale session, then append again
            try:
                await service.append_event(session, event)
                break
            except StaleSessionError:
                session = await service.get_session(
                    app_name="app", user_id="u", session_id="shared", config=recent
                )


stores = [store_of(*spec) for spec in specs]
print("ready", flush=True)
sys.stdin.readline()  # every worker starts appending at once
for store in stores:
    asyncio.run(appends(ZerdaSessionService(store)))
    store.close()
"""
"""A worker process: in each store it is given, append ``count`` events to one session,
reloading it when it is stale and appending the same event again; each event sets the
worker's session key and an app key of its own. Only ADK and Zerda are imported, so that the
processes start fast."""


def run_appenders(specs: list[list[str]], workers: int, count: int) -> None:
    """Run ``workers`` appenders at once over the stores ``specs`` name; each must exit with
    status 0."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", APPENDER, json.dumps([specs, w, count])],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    try:
        for p in procs:
            assert p.stdout is not None
            assert p.stdout.readline() == "ready\n", p.communicate(timeout=60)[1]
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            _, err = p.communicate(timeout=120)
            assert p.returncode == 0, err
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.mark.parametrize("kinds", [["sqlite"], ["redis", "postgres"]], ids=["sqlite", "servers"])
def test_two_processes_appending_to_one_session_lose_nothing(
    kinds: list[str], tmp_path: Path
) -> None:
    """Two processes append to one session at once, over one SQLite file (and over Redis and
    Postgres, in one pair of processes, so that they start once): every event is stored once,
    each process's in its order, and no state delta is lost."""
    count = 20

    async def prepare(service: ZerdaSessionService) -> None:
        await service.create_session(app_name="app", user_id="u", session_id="shared")

    async def check(service: ZerdaSessionService) -> None:
        got = await service.get_session(app_name="app", user_id="u", session_id="shared")
        assert got is not None
        texts = [e.content.parts[0].text for e in got.events if e.content and e.content.parts]
        assert sorted(texts) == sorted(f"{w}:{n}" for w in range(2) for n in range(count))
        for w in range(2):  # each worker's own events keep their order
            assert [t for t in texts if t.startswith(f"{w}:")] == [f"{w}:{n}" for n in range(count)]
        assert got.state["w0"] == got.state["w1"] == count - 1
        assert sum(1 for k in got.state if k.startswith("app:")) == 2 * count

    with contextlib.ExitStack() as stack:
        stores = [stack.enter_context(opened_stores(kind, tmp_path))() for kind in kinds]
        specs = []
        for kind, store in zip(kinds, stores, strict=True):
            asyncio.run(prepare(ZerdaSessionService(store)))
            specs.append(_spec(kind, store, tmp_path))
        run_appenders(specs, 2, count)
        for store in stores:
            asyncio.run(check(ZerdaSessionService(store)))


def _spec(kind: str, store: Any, tmp_path: Path) -> list[str]:
    """How a worker process opens ``store``: its kind, where it is, its prefix or schema."""
    if kind == "sqlite":
        return [kind, str(tmp_path / "chat.db"), ""]
    if kind == "redis":
        return [kind, REDIS_URL, store.prefix]
    return [kind, POSTGRES_DSN, store.schema]


# -- commits that a process did not finish --------------------------------------------------------


class DyingStore(InMemoryStore):
    """An in-memory store whose compare-and-sets fail while ``dead``: a process that dies
    right after committing an event (its messages appended), before its state is in the
    session's record and the app's."""

    dead = False

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        if self.dead:
            raise ConnectionError("the process died")
        return super().compare_and_set(session_id, key, expected, value)


def test_a_commit_left_half_done_is_read_whole_and_finished_once() -> None:
    async def main() -> None:
        store = DyingStore()
        service = ZerdaSessionService(store)
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        first = Event(invocation_id="a", author="user", content=said("a"))
        await service.append_event(session, first)
        dying = Event(
            invocation_id="b",
            author="m",
            content=said("b", "model"),
            actions=EventActions(state_delta={"app:count": 1, "user:seen": True, "x": 1}),
        )
        store.dead = True
        with pytest.raises(ConnectionError):
            await service.append_event(session, dying)
        store.dead = False
        zid = zerda_session_id("app", "u", "s")
        assert store.get_metadata(zid)[SESSION_KEY]["state"] == {}  # not in the record
        assert store.get_metadata(zerda_session_id("app")) == {}  # nor in the app's

        # Readers see the commit whole: the event, its state, its app and user state.
        other = ZerdaSessionService(store)
        seen = await other.get_session(app_name="app", user_id="u", session_id="s")
        assert seen is not None
        assert seen.events == [first, dying]
        assert seen.state == {"x": 1, "app:count": 1, "user:seen": True}
        for config in (
            GetSessionConfig(num_recent_events=1),
            GetSessionConfig(num_recent_events=0),
        ):
            recent = await other.get_session(
                app_name="app", user_id="u", session_id="s", config=config
            )
            assert recent is not None
            assert recent.events == [dying][: config.num_recent_events]
            assert recent.state == seen.state

        # The next append finishes it, then commits its own; the app delta is applied once.
        third = Event(invocation_id="c", author="user", content=said("c"))
        await other.append_event(seen, third)
        assert [m.text for m in store.history(zid)] == ["a", "b", "c"]
        assert store.get_metadata(zid)[SESSION_KEY]["state"] == {"x": 1}
        final = await other.get_session(app_name="app", user_id="u", session_id="s")
        assert final is not None
        assert final.events == [first, dying, third]
        assert final.state == seen.state
        assert store.get_metadata(zerda_session_id("app"))["adk.state"]["state"] == {"count": 1}
        with pytest.raises(StaleSessionError):  # the first process is behind now
            await service.append_event(session, Event(invocation_id="e", author="user"))

        # A process that appends the event again after the error finishes it, stored once.
        delta = EventActions(state_delta={"app:n": 2})
        fourth = Event(invocation_id="d", author="m", actions=delta)
        store.dead = True
        with pytest.raises(ConnectionError):
            await other.append_event(final, fourth)
        store.dead = False
        await other.append_event(final, fourth)
        assert final.events == [first, dying, third, fourth]
        again = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert again is not None
        assert again.events == final.events
        assert again.state["app:n"] == 2
        assert len(store.history(zid)) == 4
        assert store.get_metadata(zid)[SESSION_KEY]["rev"] == 4

    asyncio.run(main())


def test_an_event_appended_again_after_it_was_stored_is_stored_once() -> None:
    async def main() -> None:
        service = ZerdaSessionService()
        session = await service.create_session(app_name="app", user_id="u", session_id="s")
        event = Event(invocation_id="a", author="user", content=said("a"))
        await service.append_event(session, event)
        await service.append_event(session, event)
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert got.events == [event]
        assert session.events == [event]
        twin = Event(invocation_id="a", author="user", content=said("other"), id=event.id)
        await service.append_event(session, twin)  # another event with the same id is kept
        got = await service.get_session(app_name="app", user_id="u", session_id="s")
        assert got is not None
        assert got.events == [event, twin]

    asyncio.run(main())


# -- removing events -----------------------------------------------------------------------------


def test_delete_events_removes_them_for_good() -> None:
    async def main() -> None:
        store = InMemoryStore()
        service = ZerdaSessionService(store)
        session = await _fill(service, 3)
        two = types.Content(
            role="user",
            parts=[
                types.Part(function_response=types.FunctionResponse(id=i, name="w", response={}))
                for i in ("c1", "c2")
            ],
        )
        await service.append_event(session, Event(invocation_id="i3", author="m", content=two))
        zid = zerda_session_id("app", "u", "long")
        assert len(store.history(zid)) == 11  # 9 events of a message, one of two
        loaded = await service.get_session(app_name="app", user_id="u", session_id="long")
        assert loaded is not None
        # A call and its response, and the event of two messages.
        doomed = [loaded.events[1].id, loaded.events[2].id, loaded.events[-1].id]
        removed = await service.delete_events(
            app_name="app", user_id="u", session_id="long", event_ids=[*doomed, "nope"]
        )
        assert removed == 3
        got = await service.get_session(app_name="app", user_id="u", session_id="long")
        assert got is not None
        assert got.events == [loaded.events[0], *loaded.events[3:-1]]
        assert len(store.history(zid)) == 7
        # The newest event too, and the session goes on without it: nothing brings it back.
        await service.delete_events(
            app_name="app", user_id="u", session_id="long", event_ids=[got.events[-1].id]
        )
        later = Event(invocation_id="x", author="user", content=said("later"))
        await service.append_event(session, later)  # loaded before: deletions do not stale it
        after = await service.get_session(app_name="app", user_id="u", session_id="long")
        assert after is not None
        assert after.events == [*got.events[:-1], later]
        # Deleting through Zerda's own tools is the same.
        ConversationBufferMemory(store=store, session_id=zid).pop_turn()
        gone = await service.get_session(app_name="app", user_id="u", session_id="long")
        assert gone is not None
        assert gone.events == after.events[:-1]
        await service.append_event(gone, Event(invocation_id="y", author="user"))
        final = await service.get_session(app_name="app", user_id="u", session_id="long")
        assert final is not None
        assert [e.invocation_id for e in final.events][-2:] == ["i2", "y"]
        none = await service.delete_events(
            app_name="app", user_id="u", session_id="long", event_ids=["nope"]
        )
        assert none == 0
        with pytest.raises(ConfigurationError, match="list of event ids"):
            await service.delete_events(
                app_name="app", user_id="u", session_id="long", event_ids="nope"
            )
        with pytest.raises(SessionNotFoundError):
            await service.delete_events(app_name="app", user_id="u", session_id="x", event_ids=[])

    asyncio.run(main())


# -- what the model sees --------------------------------------------------------------------------


def test_the_callback_sends_the_last_k_turns_whole() -> None:
    async def main() -> None:
        model = ScriptedLlm(model="s", replies=script())
        runner = Runner(
            app_name="app",
            agent=agent(model, before_model_callback=ZerdaContext(k=1)),
            session_service=ZerdaSessionService(),
            auto_create_session=True,
        )
        for text in ["Weather in Paris?", "And Rome and Oslo?", "What did I ask?"]:
            await run(runner, text)
        # The second run's follow-up request: its whole turn, both calls with both responses.
        assert [c["role"] for c in model.seen[3]] == ["user", "model", "user"]
        assert model.seen[3][0] == {"parts": [{"text": "And Rome and Oslo?"}], "role": "user"}
        assert len(model.seen[3][1]["parts"]) == len(model.seen[3][2]["parts"]) == 2
        assert model.seen[4] == [{"parts": [{"text": "What did I ask?"}], "role": "user"}]
        session = await runner.session_service.get_session(
            app_name="app", user_id="alice", session_id="trip"
        )
        assert session is not None
        assert len(session.events) == 10  # the log is whole

    asyncio.run(main())


def _contents(turns: int) -> list[types.Content]:
    out = []
    for t in range(turns):
        out.append(said(f"question {t} " + "x" * 40))
        out.append(calls(f"city {t}").content)  # type: ignore[arg-type]
        out.append(
            types.Content(
                role="user",
                parts=[
                    types.Part(
                        function_response=types.FunctionResponse(
                            name="weather", response={"result": "sunny " + "y" * 40}
                        )
                    )
                ],
            )
        )
        out.append(said(f"answer {t}", "model"))
    return out


def test_the_callback_keeps_the_newest_whole_turns_within_the_budget() -> None:
    contents = _contents(6)
    every = ZerdaContext().select(contents)
    assert every == contents
    assert all(a is b for a, b in zip(every, contents, strict=True))
    budget = ZerdaContext(token_limit=120, counter=COUNTER)
    kept = budget.select(contents)
    assert kept == contents[-len(kept) :]
    assert len(kept) % 4 == 0
    assert 0 < len(kept) < 24
    assert all(a is b for a, b in zip(kept, contents[-len(kept) :], strict=True))
    assert ZerdaContext(token_limit=10**6, counter=COUNTER).select(contents) == contents
    with pytest.raises(ContextOverflowError):
        ZerdaContext(token_limit=5, counter=COUNTER).select(contents)
    # Over the budget, the newest turn alone, its texts cut in the middle to fit.
    long = [*contents[:-4], said("question " + "z" * 2000), *contents[-3:]]
    cut = ZerdaContext(token_limit=200, counter=COUNTER, overflow="truncate").select(long)
    assert len(cut) == 4
    assert cut[1:] == long[-3:]
    question = cut[0].parts[0].text  # type: ignore[index]
    assert question is not None
    assert question.startswith("question zzz")
    assert len(question) < 800
    assert sum(COUNTER.count_text(json.dumps(c.model_dump(exclude_none=True))) for c in cut) < 300


def test_the_callback_repairs_the_contents_it_is_given() -> None:
    contents = _contents(2)
    # A response whose call is gone, and a call without its response, beside one with its own.
    orphan = contents[2]
    both = types.Content(
        role="model",
        parts=[
            types.Part(text="two lookups"),
            types.Part(function_call=types.FunctionCall(id="c1", name="weather", args={})),
            types.Part(function_call=types.FunctionCall(id="c2", name="weather", args={})),
        ],
    )
    answered = types.Content(
        role="user",
        parts=[
            types.Part(
                function_response=types.FunctionResponse(id="c2", name="weather", response={})
            )
        ],
    )
    given = [contents[0], orphan, contents[3], said("next"), both, answered, said("done", "model")]
    sent = ZerdaContext().select(given)
    assert orphan not in sent
    repaired = sent[3]
    assert repaired is not both
    assert [p.text for p in repaired.parts or []] == ["two lookups", None]
    assert repaired.parts[1].function_call.id == "c2"  # type: ignore[index, union-attr]
    assert sent[4] is answered
    assert both.parts is not None
    assert len(both.parts) == 3


def test_the_callback_counts_parts_it_cannot_read_as_their_text() -> None:
    code = types.Content(
        role="model",
        parts=[
            types.Part(executable_code=types.ExecutableCode(code="print(1)", language="PYTHON"))
        ],
    )
    empty = types.Content(role="user", parts=[])
    contents = [said("run it"), code, empty, said("ok", "model")]
    assert ZerdaContext().select(contents) == contents
    request = LlmRequest(contents=contents)
    assert ZerdaContext(k=1)(None, request) is None  # type: ignore[arg-type, func-returns-value]
    assert request.contents == contents


def test_contents_zerda_cannot_read_are_sent_whole_with_a_warning() -> None:
    misplaced = types.Content(
        role="model",
        parts=[types.Part(function_response=types.FunctionResponse(name="w", response={}))],
    )
    contents = [said("hi"), misplaced, said("ok", "model")]
    with pytest.warns(ZerdaWarning, match="sent whole"):
        assert ZerdaContext(k=1).select(contents) == contents


def test_the_callbacks_configuration_is_checked() -> None:
    with pytest.raises(ConfigurationError, match="not both"):
        ZerdaContext(k=2, token_limit=100)
    with pytest.raises(ConfigurationError, match="give token_limit too"):
        ZerdaContext(counter=COUNTER)
    with pytest.raises(ConfigurationError, match="overflow"):
        ZerdaContext(token_limit=100, overflow="drop")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="k must be a positive integer"):
        ZerdaContext(k=0)
    with pytest.raises(InvalidMessageError, match="list of Content"):
        ZerdaContext().select("hi")  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match=r"contents\[0\]"):
        ZerdaContext().select([{"role": "user"}])  # type: ignore[list-item]
    assert repr(ZerdaContext(k=3)) == "ZerdaContext(k=3)"
    assert repr(ZerdaContext(token_limit=9, counter=COUNTER)) == "ZerdaContext(token_limit=9)"


# -- the service itself ---------------------------------------------------------------------------


def test_it_is_adks_session_service() -> None:
    service = ZerdaSessionService()
    assert isinstance(service, BaseSessionService)
    assert isinstance(service.store, InMemoryStore)
    assert repr(service) == "ZerdaSessionService(InMemoryStore)"


def test_import_zerda_does_not_import_adk() -> None:
    done = _run(
        "import sys, zerda, zerda.integrations, zerda.memory, zerda.stores\n"
        "assert 'google.adk' not in sys.modules, 'google.adk was imported'\n"
    )
    assert done.returncode == 0, done.stderr


def test_without_adk_the_import_names_the_extra() -> None:
    done = _run(
        "import sys\n"
        "sys.modules['google.adk'] = None\n"
        "try:\n"
        "    import zerda.integrations.adk\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert done.returncode == 0, done.stderr
    assert "pip install 'zerda-memory[adk]'" in done.stdout
