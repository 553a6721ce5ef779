"""The Strands Agents integration: ZerdaConversationManager keeps whole turns in
``agent.messages`` (the history opening on a user prompt, each toolUse with its toolResult) and
makes progress on an overflow or says why it cannot; ZerdaSessionManager keeps an agent's
messages and state in any Zerda store, read back equal. Every run is a real ``strands.Agent``
loop over a scripted model."""

from __future__ import annotations

import copy
import json
import struct
import zlib
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("strands", reason="the strands extra is not installed")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strands import Agent, tool
from strands.agent.conversation_manager import SlidingWindowConversationManager
from strands.models.model import Model
from strands.types.exceptions import ContextWindowOverflowException, SessionException
from strands.types.session import SessionMessage

from test_integrations import STORES, opened_stores
from zerda import ApproxCounter, ConfigurationError, InvalidMessageError, Role
from zerda.integrations.strands import (
    METADATA_KEY,
    ZerdaConversationManager,
    ZerdaSessionManager,
)
from zerda.memory import ConversationBufferMemory, ConversationTokenBufferMemory
from zerda.stores import AsyncSQLiteStore, InMemoryStore, SQLiteStore

COUNTER = ApproxCounter()

# -- a scripted model, a tool, and what a valid history is -----------------------------------------


class Scripted(Model):
    """A Strands model that streams scripted events, offline. For each prompt it asks for the
    weather ``rounds`` times (a ``toolUse`` each), then answers with a text. ``overflow_at``:
    it refuses, as a provider does, a request whose messages hold more characters than that.
    ``redact``: its first reply asks for the user's prompt to be redacted (a guardrail).
    ``reuse_ids``: every call is ``call_0``, as some models number them."""

    def __init__(
        self,
        *,
        rounds: int = 1,
        overflow_at: int | None = None,
        redact: str | None = None,
        reuse_ids: bool = False,
    ) -> None:
        self.rounds = rounds
        self.overflow_at = overflow_at
        self.redact = redact
        self.reuse_ids = reuse_ids
        self.seen: list[list[dict[str, Any]]] = []
        self.refused = 0
        self.prompt: Any = None
        self.asked = 0  # the calls made for the current prompt
        self.config: dict[str, Any] = {}

    def update_config(self, **model_config: Any) -> None:
        self.config.update(model_config)

    def get_config(self) -> Any:
        return self.config

    async def structured_output(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise NotImplementedError
        yield

    async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        sent = copy.deepcopy(list(messages))
        if self.overflow_at is not None and len(json.dumps(sent, default=str)) > self.overflow_at:
            self.refused += 1
            raise ContextWindowOverflowException("the request is over the context window")
        self.seen.append(sent)
        prompt_at = max(i for i, m in enumerate(sent) if is_prompt(m))
        if sent[prompt_at]["content"] != self.prompt:  # a new prompt: its rounds start
            self.prompt, self.asked = sent[prompt_at]["content"], 0
        yield {"messageStart": {"role": "assistant"}}
        if self.redact is not None and len(self.seen) == 1:
            yield {"redactContent": {"redactUserContentMessage": self.redact}}
        if self.asked < self.rounds:
            self.asked += 1
            city = sent[prompt_at]["content"][0]["text"]
            call_id = "call_0" if self.reuse_ids else f"t{len(self.seen)}"
            start = {"toolUse": {"toolUseId": call_id, "name": "weather"}}
            yield {"contentBlockStart": {"start": start}}
            delta = {"toolUse": {"input": json.dumps({"city": city})}}
            yield {"contentBlockDelta": {"delta": delta}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        else:
            said = sent[-1]["content"][0]
            answer = said["toolResult"]["content"][0]["text"] if "toolResult" in said else "ok"
            yield {"contentBlockDelta": {"delta": {"text": f"It is {answer}"}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}


@tool
def weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city} " + "~" * 40


def agent_with(model: Scripted | None = None, **options: Any) -> Agent:
    return Agent(model=model or Scripted(), tools=[weather], callback_handler=None, **options)


def is_prompt(message: dict[str, Any]) -> bool:
    return message["role"] == "user" and not any("toolResult" in b for b in message["content"])


def uses(message: dict[str, Any]) -> set[str]:
    return {b["toolUse"]["toolUseId"] for b in message["content"] if "toolUse" in b}


def results(message: dict[str, Any]) -> set[str]:
    return {b["toolResult"]["toolUseId"] for b in message["content"] if "toolResult" in b}


def assert_valid(messages: list[dict[str, Any]], *, pending: bool = False) -> None:
    """What Bedrock and Gemini accept: the history opens on a user prompt (not an assistant
    message, not a bare toolResult); each toolUse is answered in the next message; each
    toolResult answers a toolUse of the message before. ``pending``: the last message's calls
    may wait for their results."""
    assert messages, "an empty history"
    assert is_prompt(messages[0]), f"the history opens on {messages[0]}"
    for i, m in enumerate(messages):
        if results(m):
            assert i > 0, "a toolResult first"
            assert results(m) <= uses(messages[i - 1]), f"orphan results in {m}"
        if uses(m) and not (pending and i == len(messages) - 1):
            assert i + 1 < len(messages), f"calls {uses(m)} without their results"
            assert uses(m) <= results(messages[i + 1]), f"calls {uses(m)} split from results"


def prompts(messages: list[dict[str, Any]]) -> list[str]:
    return [m["content"][0]["text"] for m in messages if is_prompt(m)]


def run(agent: Agent, cities: list[str]) -> None:
    for city in cities:
        agent(city)


# -- the session manager over every store ---------------------------------------------------------


@pytest.fixture(params=STORES)
def stores(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """Stores of one kind that all reach the same data (a server store skips without its
    server)."""
    with opened_stores(request.param, tmp_path) as make:
        yield make


def test_three_turns_with_a_tool_then_a_restart_continues(stores: Callable[[], Any]) -> None:
    model = Scripted()
    agent = agent_with(model, session_manager=ZerdaSessionManager("alice", store=stores()))
    run(agent, ["Paris", "Oslo", "Lima"])
    assert len(agent.messages) == 12
    assert_valid(agent.messages)

    # A new process: a new agent and a new manager over the same store continue.
    again = Scripted()
    restored = agent_with(again, session_manager=ZerdaSessionManager("alice", store=stores()))
    assert restored.messages == agent.messages
    restored("Rome")
    assert prompts(again.seen[0]) == ["Paris", "Oslo", "Lima", "Rome"]
    assert_valid(again.seen[-1])
    # And what the store holds, read by a third, is every message in order.
    third = agent_with(session_manager=ZerdaSessionManager("alice", store=stores()))
    assert third.messages == restored.messages
    assert [m["role"] for m in third.messages[:4]] == ["user", "assistant", "user", "assistant"]


def test_the_store_holds_zerda_messages_every_memory_reads(stores: Callable[[], Any]) -> None:
    memory = ConversationTokenBufferMemory(
        10**6, token_counter=COUNTER, store=stores(), session_id="alice"
    )
    agent = agent_with(session_manager=ZerdaSessionManager("alice", memory=memory))
    run(agent, ["Paris", "Oslo"])
    history = memory.get_history()
    assert [m.role for m in history] == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT] * 2
    call = history[1].tool_calls[0]
    assert (call.name, json.loads(call.arguments)) == ("weather", {"city": "Paris"})
    assert history[2].tool_call_id == call.id
    assert history[2].text.startswith("sunny in Paris")
    assert history[3].text.startswith("It is sunny in Paris")
    assert all(m.metadata[METADATA_KEY]["index"] == i for i, m in enumerate(history))
    assert memory.get_memory_stats()["stored_turns"] == 2
    counts = stores().tail("alice", None, COUNTER.name).tokens  # counted once, as written
    assert len(counts) == 8
    assert all(isinstance(n, int) and n > 0 for n in counts)


def test_agent_state_and_the_conversation_managers_state_come_back(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    agent = agent_with(
        session_manager=ZerdaSessionManager("s", store=SQLiteStore(path)),
        conversation_manager=ZerdaConversationManager(k=1),
    )
    agent.state.set("plan", {"step": 2, "cities": ["Paris"]})
    run(agent, ["Paris", "Oslo", "Lima"])
    assert agent.conversation_manager.removed_message_count == 8
    restored = agent_with(
        session_manager=ZerdaSessionManager("s", store=SQLiteStore(path)),
        conversation_manager=ZerdaConversationManager(k=1),
    )
    assert restored.state.get("plan") == {"step": 2, "cities": ["Paris"]}
    assert restored.conversation_manager.removed_message_count == 8
    assert restored.messages == agent.messages
    assert prompts(restored.messages) == ["Lima"]


class CountingStore:
    """A store that counts what is read through it."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.read_messages = 0
        self.whole_reads = 0

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Any:
        got = self.store.tail(session_id, turns, counter)
        self.read_messages += len(got.messages)
        self.whole_reads += turns is None
        return got

    def history(self, session_id: str) -> Any:
        self.whole_reads += 1
        return self.store.history(session_id)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


def test_a_restore_reads_what_the_manager_kept_not_the_whole_log(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    agent = agent_with(
        session_manager=ZerdaSessionManager("s", store=SQLiteStore(path)),
        conversation_manager=ZerdaConversationManager(k=2),
    )
    run(agent, [f"city {i}" for i in range(40)])
    counting = CountingStore(SQLiteStore(path))
    restored = agent_with(
        session_manager=ZerdaSessionManager("s", store=counting),  # type: ignore[arg-type]
        conversation_manager=ZerdaConversationManager(k=2),
    )
    assert restored.messages == agent.messages
    assert len(restored.messages) == 8
    assert counting.whole_reads == 0
    assert counting.read_messages <= 4 * 2 * 8  # a few reads of the newest turns, not 160


def test_a_manager_that_removed_everything_does_not_number_messages_again(
    tmp_path: Path,
) -> None:
    path = tmp_path / "chat.db"

    def agent() -> Agent:
        return agent_with(
            session_manager=ZerdaSessionManager("s", store=SQLiteStore(path)),
            conversation_manager=SlidingWindowConversationManager(window_size=0),
        )

    run(agent(), ["Paris"])
    run(agent(), ["Oslo"])  # Strands restores no message; the next is numbered after the last
    manager = ZerdaSessionManager("s", store=SQLiteStore(path))
    numbers = [m.message_id for m in manager.list_messages("s", "default")]
    assert numbers == list(range(8))


def test_a_guardrails_redaction_is_stored_and_read_back(stores: Callable[[], Any]) -> None:
    model = Scripted(redact="[prompt removed]")
    agent = agent_with(model, session_manager=ZerdaSessionManager("s", store=stores()))
    agent("my card is 4111 1111 1111 1111")
    assert agent.messages[0]["content"] == [{"text": "[prompt removed]"}]

    manager = ZerdaSessionManager("s", store=stores())
    first = manager.list_messages("s", "default")[0]
    assert first.redact_message == agent.messages[0]
    assert first.message == first.redact_message  # Strands redacts the message in place
    restored = agent_with(session_manager=ZerdaSessionManager("s", store=stores()))
    assert restored.messages == agent.messages
    # What Zerda's memories read says the redaction, not the card.
    said = ConversationBufferMemory(store=stores(), session_id="s").get_history()
    assert said[0].text == "[prompt removed]"
    first_stored = [m.to_json() for m in said if m.metadata[METADATA_KEY]["index"] == 0]
    assert first_stored
    # Nor in what it keeps (seen failing once in a CI-like run, not reproduced: the messages
    # of the session say what was left).
    assert all("card is 4111" not in text for text in first_stored), [m.to_json() for m in said]


def test_an_updated_message_is_read_in_its_place(tmp_path: Path) -> None:
    manager = ZerdaSessionManager("s", store=SQLiteStore(tmp_path / "chat.db"))
    manager.create_agent("s", _session_agent("default"))

    def add(i: int) -> None:
        message = {"role": "user", "content": [{"text": f"m{i}"}]}
        manager.create_message("s", "default", SessionMessage(message=message, message_id=i))

    for i in range(10):
        add(i)
    hidden = {"role": "user", "content": [{"text": "[hidden]"}]}
    manager.update_message(
        "s", "default", SessionMessage(message=hidden, message_id=2, redact_message=hidden)
    )
    for i in range(10, 17):  # the newest turns now start with the message updated
        add(i)
    fresh = ZerdaSessionManager("s", store=SQLiteStore(tmp_path / "chat.db"))
    listed = fresh.list_messages("s", "default", offset=2)
    assert [m.message_id for m in listed] == list(range(2, 17))
    assert listed[0].redact_message == hidden
    assert fresh.read_message("s", "default", 2) == listed[0]
    texts = [
        m.text for m in ConversationBufferMemory(store=fresh.store, session_id="s").get_history()
    ]
    assert "m2" not in texts
    assert len(texts) == 17


def test_agents_of_one_session_keep_their_own_messages(stores: Callable[[], Any]) -> None:
    manager = ZerdaSessionManager("team", store=stores())
    planner = agent_with(session_manager=manager, agent_id="planner")
    writer = agent_with(session_manager=manager)
    planner("Paris")
    writer("Oslo")
    writer("Lima")
    assert manager.agent_session_id("planner") == "team+planner"
    assert manager.agent_session_id() == "team"

    again = ZerdaSessionManager("team", store=stores())
    planner2 = agent_with(session_manager=again, agent_id="planner")
    writer2 = agent_with(session_manager=again)
    assert planner2.messages == planner.messages
    assert writer2.messages == writer.messages
    assert prompts(planner2.messages) == ["Paris"]
    assert prompts(writer2.messages) == ["Oslo", "Lima"]
    with pytest.raises(SessionException, match="unique"):
        agent_with(session_manager=again, agent_id="planner")

    again.delete_session("team")
    assert again.read_session("team") is None
    assert again.list_messages("team", "planner") == []
    with pytest.raises(SessionException, match="does not exist"):
        again.delete_session("team")


# -- every content block, stored and read back equal ----------------------------------------------


def png(width: int, height: int, payload: int = 0) -> bytes:
    """A PNG's signature and header for an image of that size, then ``payload`` bytes."""
    header = struct.pack(">IIBBBBB", width, height, 8, 6, 0, 0, 0)
    chunk = b"IHDR" + header
    return (
        b"\x89PNG\r\n\x1a\n"
        + struct.pack(">I", len(header))
        + chunk
        + struct.pack(">I", zlib.crc32(chunk))
        + b"\0" * payload
    )


EVERY_BLOCK: list[dict[str, Any]] = [
    {"text": "look"},
    {"image": {"format": "png", "source": {"bytes": png(64, 64, 100)}}},
    {"image": {"format": "jpeg", "source": {"location": {"type": "s3", "uri": "s3://b/k.jpg"}}}},
    {"document": {"format": "pdf", "name": "report", "source": {"bytes": b"%PDF-1.4 ..."}}},
    {"document": {"format": "md", "name": "notes", "source": {"bytes": "# é".encode()}}},
    {"audio": {"format": "wav", "source": {"bytes": b"RIFF0000WAVE"}}},
    {"video": {"format": "mp4", "source": {"bytes": b"\0\0\0\x18ftypmp42"}}},
    {"reasoningContent": {"reasoningText": {"text": "think", "signature": "sig=="}}},
    {"reasoningContent": {"redactedContent": b"\x00secret\xff"}},
    {"cachePoint": {"type": "default", "ttl": "5m"}},
    {"guardContent": {"text": {"text": "check me", "qualifiers": ["query"]}}},
    {"citationsContent": {"citations": [{"title": "t"}], "content": [{"text": "cited"}]}},
    {"injected": {"text": "remember the budget", "source": "reminder"}},
    {"summary": {"text": "earlier we spoke", "provider": None, "signature": None}},
    {"futureBlock": {"anything": [1, 2.5, None, {"deep": True}], "raw": b"\x01\x02"}},
]


def every_message() -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": copy.deepcopy(EVERY_BLOCK), "tracking_id": "u-1"},
        {
            "role": "assistant",
            "content": [
                {"reasoningContent": {"reasoningText": {"text": "hmm", "signature": "s"}}},
                {"text": "two calls"},
                {"toolUse": {"toolUseId": "a", "name": "weather", "input": {"city": "Paris"}}},
                {
                    "toolUse": {
                        "toolUseId": "b",
                        "name": "weather",
                        "input": {"city": "Oslo", "n": [1, {"x": None}]},
                        "reasoningSignature": "rs",
                    }
                },
                {"futureBlock": {"x": 1}},
            ],
            "metadata": {"usage": {"inputTokens": 3, "outputTokens": 4, "totalTokens": 7}},
        },
        {
            "role": "user",
            "content": [
                {"injected": {"text": "before the results", "source": "x"}},
                {
                    "toolResult": {
                        "toolUseId": "a",
                        "status": "success",
                        "content": [
                            {"text": "sunny"},
                            {"json": {"temp": 21, "unit": "C"}},
                            {"image": {"format": "png", "source": {"bytes": png(8, 8)}}},
                            {"document": {"format": "txt", "name": "d", "source": {"bytes": b"x"}}},
                        ],
                    }
                },
                {"cachePoint": {"type": "default"}},
                {"toolResult": {"toolUseId": "b", "status": "error", "content": []}},
                {"text": "and a note after them"},
            ],
        },
        {"role": "assistant", "content": []},
        {
            "role": "assistant",
            "content": [{"toolUse": {"toolUseId": "c", "name": "t", "input": 3}}],
        },
    ]


def test_every_content_block_is_read_back_equal(stores: Callable[[], Any]) -> None:
    manager = ZerdaSessionManager("blocks", store=stores())
    agent = agent_with(session_manager=manager, messages=every_message())
    assert agent.messages == every_message()
    fresh = ZerdaSessionManager("blocks", store=stores())
    listed = fresh.list_messages("blocks", "default")
    assert [m.message for m in listed] == agent.messages
    assert fresh.read_message("blocks", "default", 2).message == agent.messages[2]  # type: ignore[union-attr]
    assert fresh.read_message("blocks", "default", 99) is None
    # The Zerda messages that hold them: a tool message per result, the rest beside them.
    history = ConversationBufferMemory(store=stores(), session_id="blocks").get_history()
    assert [m.role for m in history] == [
        Role.USER, Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.ASSISTANT, Role.ASSISTANT,
    ]  # fmt: skip
    assert [c.id for c in history[1].tool_calls] == ["a", "b"]
    assert [m.tool_call_id for m in history[2:4]] == ["a", "b"]
    kinds = [type(p).__name__ for p in history[0].parts]
    assert kinds[:8] == [
        "TextPart", "ImagePart", "ImagePart", "FilePart", "FilePart", "AudioPart", "FilePart",
        "ReasoningPart",
    ]  # fmt: skip
    assert "futureBlock" in history[0].parts[-1].text  # an unknown block: shown, never lost


def test_a_session_message_is_exactly_what_was_created(tmp_path: Path) -> None:
    manager = ZerdaSessionManager("s", store=SQLiteStore(tmp_path / "chat.db"))
    manager.create_agent("s", _session_agent("default"))
    created = SessionMessage(
        message=every_message()[2], message_id=0, created_at="2026-01-02T03:04:05+00:00"
    )
    manager.create_message("s", "default", created)
    assert manager.read_message("s", "default", 0) == created
    # A redaction beside a different original keeps both; a tool input nested deeper than
    # message metadata nests is kept as JSON text; both read back equal.
    deep: Any = "bottom"
    for _ in range(80):
        deep = {"down": [deep]}
    nested = {
        "role": "assistant",
        "content": [{"toolUse": {"toolUseId": "d", "name": "f", "input": deep}}],
    }
    redacted = SessionMessage(
        message=every_message()[0],
        message_id=1,
        redact_message={"role": "user", "content": [{"text": "[x]"}]},
    )
    for made in (redacted, SessionMessage(message=nested, message_id=2)):  # type: ignore[typeddict-item]
        manager.create_message("s", "default", made)
        assert manager.read_message("s", "default", made.message_id) == made
    assert [m.message_id for m in manager.list_messages("s", "default")] == [0, 1, 2]


def _session_agent(agent_id: str) -> Any:
    from strands.types.session import SessionAgent

    return SessionAgent(agent_id=agent_id, state={}, conversation_manager_state={})


json_st = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=8,
)
block_st = st.one_of(
    st.builds(lambda t: {"text": t}, st.text(max_size=20)),
    st.sampled_from(EVERY_BLOCK).map(copy.deepcopy),
    st.dictionaries(
        st.sampled_from(["x", "newBlock", "toolUse", "text", "image"]),
        json_st,
        min_size=1,
        max_size=2,
    ),
    st.builds(
        lambda i, r: {"toolResult": {"toolUseId": i, "status": "success", "content": r}},
        st.sampled_from(["a", "b", ""]),
        st.lists(st.sampled_from([{"text": "r"}, {"json": [1]}, {"other": 2}]), max_size=2),
    ),
    st.builds(
        lambda i, a: {"toolUse": {"toolUseId": i, "name": "f", "input": a}},
        st.sampled_from(["a", "b", ""]),
        json_st,
    ),
)
message_st = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant"]), "content": st.lists(block_st, max_size=5)},
    optional={"tracking_id": st.text(min_size=1, max_size=8), "metadata": json_st},
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(message_st, min_size=1, max_size=4))
def test_any_strands_message_round_trips(messages: list[dict[str, Any]]) -> None:
    manager = ZerdaSessionManager("p", store=InMemoryStore())
    manager.create_agent("p", _session_agent("default"))
    for i, message in enumerate(messages):
        manager.create_message("p", "default", SessionMessage(message=message, message_id=i))
    back = [m.message for m in manager.list_messages("p", "default")]
    assert back == messages


def test_a_message_edited_through_zerda_reads_back_as_edited(tmp_path: Path) -> None:
    path = tmp_path / "chat.db"
    agent = agent_with(session_manager=ZerdaSessionManager("s", store=SQLiteStore(path)))
    run(agent, ["my phone is 555-0100", "Oslo"])
    memory = ConversationBufferMemory(store=SQLiteStore(path), session_id="s")
    history = memory.get_history()
    memory.edit_message(history[0].id or "", "my phone is [removed]")
    memory.edit_message(history[2].id or "", "sunny")
    restored = agent_with(session_manager=ZerdaSessionManager("s", store=SQLiteStore(path)))
    assert restored.messages[0]["content"] == [{"text": "my phone is [removed]"}]
    assert restored.messages[2]["content"][0]["toolResult"]["content"] == [{"text": "sunny"}]
    assert restored.messages[2]["content"][0]["toolResult"]["toolUseId"] == "t1"
    assert restored.messages[4:] == agent.messages[4:]


# -- Strands' SessionRepository contract, as its FileSessionManager keeps it -------------------


def test_the_repository_contract(tmp_path: Path) -> None:
    from strands.types.session import Session, SessionType

    manager = ZerdaSessionManager("s", store=SQLiteStore(tmp_path / "chat.db"))
    assert manager.read_session("s") == manager.session
    with pytest.raises(SessionException, match="already exists"):
        manager.create_session(Session(session_id="s", session_type=SessionType.AGENT))
    assert manager.read_session("other") is None
    assert manager.read_agent("s", "nobody") is None
    with pytest.raises(SessionException, match="does not exist"):
        manager.update_agent("s", _session_agent("nobody"))
    manager.create_agent("s", _session_agent("a"))
    agent = manager.read_agent("s", "a")
    assert agent is not None
    agent.state = {"k": 1}
    manager.update_agent("s", agent)
    again = ZerdaSessionManager("s", store=SQLiteStore(tmp_path / "chat.db"))
    read = again.read_agent("s", "a")
    assert read is not None
    assert (read.state, read.created_at) == ({"k": 1}, agent.created_at)
    for i in range(5):
        message = {"role": "user", "content": [{"text": f"m{i}"}]}
        manager.create_message("s", "a", SessionMessage(message=message, message_id=i))
    texts = [m.message["content"][0]["text"] for m in again.list_messages("s", "a", 2, 1)]
    assert texts == ["m1", "m2"]
    assert [m.message_id for m in again.list_messages("s", "a", offset=3)] == [3, 4]
    assert again.list_messages("s", "a", offset=9) == []
    with pytest.raises(SessionException, match="does not exist"):
        again.update_message("s", "a", SessionMessage(message={}, message_id=7))  # type: ignore[typeddict-item]
    with pytest.raises(ConfigurationError, match="offset"):
        again.list_messages("s", "a", offset=-1)


def test_multi_agent_state_is_kept(tmp_path: Path) -> None:
    class Team:
        id = "team"

        def __init__(self, state: dict[str, Any]) -> None:
            self.state = state

        def serialize_state(self) -> dict[str, Any]:
            return self.state

    manager = ZerdaSessionManager("s", store=SQLiteStore(tmp_path / "chat.db"))
    assert manager.read_multi_agent("s", "team") is None
    with pytest.raises(SessionException):
        manager.update_multi_agent("s", Team({}))  # type: ignore[arg-type]
    manager.create_multi_agent("s", Team({"node": "a"}))  # type: ignore[arg-type]
    manager.update_multi_agent("s", Team({"node": "b"}))  # type: ignore[arg-type]
    assert manager.read_multi_agent("s", "team") == {"node": "b"}


def test_bad_input_gets_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="sync store"):
        ZerdaSessionManager("s", store=AsyncSQLiteStore(tmp_path / "a.db"))
    with pytest.raises(ConfigurationError, match="not both"):
        ZerdaSessionManager("s", store=InMemoryStore(), memory=ConversationBufferMemory())
    with pytest.raises(ConfigurationError, match="session"):
        ZerdaSessionManager("s", memory=ConversationBufferMemory(session_id="t"))
    manager = ZerdaSessionManager("s")
    manager.create_agent("s", _session_agent("default"))
    not_json = {"role": "user", "content": [{"toolUse": {"toolUseId": "a", "input": {1, 2}}}]}
    with pytest.raises(InvalidMessageError, match="not JSON"):
        manager.create_message("s", "default", SessionMessage(message=not_json, message_id=0))  # type: ignore[typeddict-item]
    for bad, said in (("text", "must be a Strands message"), ({"role": "user"}, "content")):
        with pytest.raises(InvalidMessageError, match=said):
            manager.create_message("s", "default", SessionMessage(message=bad, message_id=0))  # type: ignore[arg-type]
    assert manager.list_messages("s", "default") == []  # nothing of a refused message is kept


# -- the conversation manager in the agent loop ---------------------------------------------------


def test_a_window_keeps_whole_turns_opening_on_a_prompt() -> None:
    model = Scripted()
    agent = agent_with(model, conversation_manager=ZerdaConversationManager(k=2))
    run(agent, ["Paris", "Oslo", "Lima", "Rome", "Kyoto"])
    assert prompts(agent.messages) == ["Rome", "Kyoto"]
    assert len(agent.messages) == 8
    assert agent.conversation_manager.removed_message_count == 12
    for sent in model.seen:
        assert_valid(sent)


def stored_tokens(messages: list[dict[str, Any]]) -> int:
    """The tokens Zerda counts for ``messages``, stored as the session manager stores them."""
    memory = ConversationTokenBufferMemory(10**9, token_counter=COUNTER, session_id="x")
    manager = ZerdaSessionManager("x", memory=memory)
    manager.create_agent("x", _session_agent("default"))
    for i, message in enumerate(messages):
        manager.create_message("x", "default", SessionMessage(message=message, message_id=i))
    return int(memory.get_memory_stats()["context_tokens"])


def test_a_token_budget_is_held_after_every_invocation() -> None:
    limit = 300
    manager = ZerdaConversationManager(token_limit=limit, counter=COUNTER)
    agent = agent_with(conversation_manager=manager)
    for city in ["Paris", "Oslo", "Lima", "Rome", "Kyoto", "Quito"]:
        agent(city)
        assert stored_tokens(agent.messages) <= limit
        assert_valid(agent.messages)
    assert 1 < len(prompts(agent.messages)) < 6


def test_per_turn_holds_the_budget_inside_a_tool_heavy_turn() -> None:
    model = Scripted(rounds=6)
    manager = ZerdaConversationManager(token_limit=150, counter=COUNTER, per_turn=True)
    agent = agent_with(model, conversation_manager=manager)
    agent("Paris")
    for sent in model.seen[1:]:
        assert_valid(sent)
        assert stored_tokens(sent) <= 150
        assert prompts(sent) == ["Paris"]
    assert len(model.seen[-1]) < 13  # older exchanges of the turn went; its prompt stayed


def test_an_overflow_in_the_loop_is_recovered_by_dropping_the_oldest_turns() -> None:
    model = Scripted(overflow_at=4000)
    agent = agent_with(model, conversation_manager=ZerdaConversationManager())
    run(agent, [f"city {i} " + "x" * 200 for i in range(12)])
    assert model.refused >= 1
    for sent in model.seen:
        assert_valid(sent)
    assert prompts(agent.messages)[-1].startswith("city 11")
    assert agent.conversation_manager.removed_message_count > 0


def test_an_overflow_in_a_tool_heavy_turn_drops_its_oldest_exchanges() -> None:
    model = Scripted(rounds=12, overflow_at=2500)
    agent = agent_with(model, conversation_manager=ZerdaConversationManager())
    agent("Paris")
    assert model.refused >= 1
    for sent in model.seen:
        assert_valid(sent)
        assert prompts(sent) == ["Paris"]  # the prompt stays: never an assistant message first
    assert agent.conversation_manager.removed_message_count == 0  # nothing older was there


def test_an_overflow_with_nothing_left_to_drop_says_so() -> None:
    model = Scripted(overflow_at=50)
    agent = agent_with(model, conversation_manager=ZerdaConversationManager())
    with pytest.raises(ContextWindowOverflowException, match="cannot reduce the context"):
        agent("Paris " + "x" * 100)


# -- reduce_context and apply_management on given histories -------------------------------------


class Holder:
    """What a conversation manager uses of an agent: its messages."""

    def __init__(self, messages: list[dict[str, Any]]) -> None:
        self.messages = messages


def prompt(text: str) -> dict[str, Any]:
    return {"role": "user", "content": [{"text": text}]}


def answer(text: str) -> dict[str, Any]:
    return {"role": "assistant", "content": [{"text": text}]}


def call(call_id: str, size: int = 10) -> dict[str, Any]:
    use = {"toolUseId": call_id, "name": "f", "input": {"q": "x" * size}}
    return {"role": "assistant", "content": [{"toolUse": use}]}


def result(call_id: str, size: int = 10) -> dict[str, Any]:
    said = {"toolUseId": call_id, "status": "success", "content": [{"text": "r" * size}]}
    return {"role": "user", "content": [{"toolResult": said}]}


def tool_heavy(exchanges: int, size: int = 200) -> list[dict[str, Any]]:
    """The history of strands #2173: one prompt, then only toolUse/toolResult pairs."""
    out = [prompt("Review this PR")]
    for i in range(exchanges):
        out += [call(str(i), size), result(str(i), size)]
    return out


def test_a_tool_heavy_turn_is_trimmed_without_an_assistant_first() -> None:
    messages = tool_heavy(8)
    given_objects = list(messages)
    holder = Holder(messages)
    manager = ZerdaConversationManager(token_limit=400, counter=COUNTER)
    manager.apply_management(holder)  # type: ignore[arg-type]
    assert_valid(holder.messages)
    assert holder.messages[0] is given_objects[0]
    assert holder.messages[-2:] == given_objects[-2:]
    assert all(any(m is g for g in given_objects) for m in holder.messages)
    assert stored_tokens(holder.messages) <= 400
    assert manager.removed_message_count == 0
    # Strands' own manager, on the same history, starts on an assistant message (#2087).
    sliding = Holder(tool_heavy(8))
    SlidingWindowConversationManager(window_size=4).apply_management(sliding)  # type: ignore[arg-type]
    assert sliding.messages[0]["role"] == "assistant"


def test_reduce_context_halves_the_turns_then_the_exchanges_then_raises() -> None:
    messages: list[dict[str, Any]] = []
    for t in range(8):
        messages += [prompt(f"q{t}"), call(f"c{t}"), result(f"c{t}"), answer(f"a{t}")]
    messages += [prompt("last"), *tool_heavy(4)[1:]]
    holder = Holder(messages)
    manager = ZerdaConversationManager()
    error = ContextWindowOverflowException("too long")
    held = [len(prompts(holder.messages))]
    sizes = [len(holder.messages)]
    for _ in range(10):
        before = list(holder.messages)
        try:
            manager.reduce_context(holder, e=error)  # type: ignore[arg-type]
        except ContextWindowOverflowException:
            assert holder.messages == before
            break
        assert_valid(holder.messages)
        assert len(holder.messages) < sizes[-1]  # progress, every time
        held.append(len(prompts(holder.messages)))
        sizes.append(len(holder.messages))
    with pytest.raises(ContextWindowOverflowException, match="only the newest turn") as raised:
        manager.reduce_context(holder, e=error)  # type: ignore[arg-type]
    assert raised.value.__cause__ is error
    assert held[:5] == [9, 4, 2, 1, 1]
    assert holder.messages == [prompt("last"), *tool_heavy(4)[-2:]]
    assert manager.removed_message_count == 32
    # Without an error (proactive compression) nothing is raised.
    manager.reduce_context(holder)  # type: ignore[arg-type]
    assert len(holder.messages) == 3


def test_the_pending_calls_of_the_last_message_are_left_for_strands() -> None:
    pending = call("waiting")
    messages = [prompt("a"), answer("b"), prompt("c"), pending]
    holder = Holder(list(messages))
    ZerdaConversationManager(k=1).apply_management(holder)  # type: ignore[arg-type]
    assert holder.messages == [messages[2], pending]
    assert holder.messages[1] is pending


def test_a_history_is_repaired_to_what_providers_accept() -> None:
    greeting = answer("Hello! How can I help?")
    two = {
        "role": "assistant",
        "content": [
            {"text": "two calls"},
            {"toolUse": {"toolUseId": "x", "name": "f", "input": {}}},
            {"toolUse": {"toolUseId": "lost", "name": "f", "input": {}}},
        ],
    }
    messages = [
        greeting,
        prompt("hi"),
        two,
        result("x"),
        result("nobody"),  # a result of no call
        answer("done"),
        prompt("next"),
        answer("ok"),
    ]
    holder = Holder(list(messages))
    manager = ZerdaConversationManager()
    manager.apply_management(holder)  # type: ignore[arg-type]
    assert_valid(holder.messages)
    assert holder.messages[0] is messages[1]  # the greeting went: the history opens on a prompt
    assert holder.messages[1]["content"] == two["content"][:2]  # the unanswered call went
    assert holder.messages[1] is not two
    assert holder.messages[2] is messages[3]
    assert all(m is not messages[4] for m in holder.messages)
    assert manager.removed_message_count == 1
    assert messages[2]["content"] == two["content"]  # the given message is not changed


def test_results_split_over_two_messages_are_sent_in_one() -> None:
    both = {
        "role": "assistant",
        "content": [
            {"toolUse": {"toolUseId": "x", "name": "f", "input": {}}},
            {"toolUse": {"toolUseId": "y", "name": "f", "input": {}}},
        ],
    }
    first = {**result("x"), "tracking_id": "r1"}
    messages = [prompt("hi"), both, first, result("y"), answer("ok")]
    holder = Holder(list(messages))
    ZerdaConversationManager().apply_management(holder)  # type: ignore[arg-type]
    assert_valid(holder.messages)
    assert len(holder.messages) == 4
    merged = holder.messages[2]
    assert merged["tracking_id"] == "r1"
    assert merged["content"] == first["content"] + result("y")["content"]


def test_a_reused_call_id_pairs_each_result_with_its_own_call() -> None:
    model = Scripted(reuse_ids=True)
    agent = agent_with(model, conversation_manager=ZerdaConversationManager(k=2))
    run(agent, ["Paris", "Oslo", "Lima"])
    assert prompts(agent.messages) == ["Oslo", "Lima"]
    assert_valid(agent.messages)
    assert len(agent.messages) == 8


def test_an_image_counts_by_its_size_not_its_bytes() -> None:
    image = {"image": {"format": "png", "source": {"bytes": png(64, 64, 200_000)}}}
    messages = [
        {"role": "user", "content": [{"text": "what is this?"}, image]},
        answer("a cat"),
        prompt("thanks"),
        answer("you are welcome"),
    ]
    holder = Holder(list(messages))
    ZerdaConversationManager(token_limit=600, counter=COUNTER).apply_management(holder)  # type: ignore[arg-type]
    assert holder.messages == messages  # 255 tokens for a 64x64 image, not 200 KB of text


def test_the_state_round_trips_and_a_bad_configuration_is_refused() -> None:
    manager = ZerdaConversationManager(k=3, per_turn=2)
    manager.removed_message_count = 7
    state = manager.get_state()
    assert state["__name__"] == "ZerdaConversationManager"
    other = ZerdaConversationManager(k=3, per_turn=2)
    assert other.restore_from_session(state) is None
    assert other.removed_message_count == 7
    assert repr(other) == "ZerdaConversationManager(k=3)"
    for options, said in (
        ({"k": 2, "token_limit": 10}, "not both"),
        ({"counter": COUNTER}, "token_limit"),
        ({"per_turn": 0}, "per_turn"),
        ({"k": 0}, "k must be a positive integer"),
        ({"token_limit": 10, "reserve_tokens": 10, "counter": COUNTER}, "reserve_tokens"),
    ):
        with pytest.raises(ValueError, match=said):
            ZerdaConversationManager(**options)
    with pytest.raises(InvalidMessageError, match=r"agent.messages\[1\]"):
        ZerdaConversationManager().apply_management(Holder([prompt("a"), "b"]))  # type: ignore[arg-type, list-item]


# -- any history: what is kept is valid, whole and the objects given ------------------------------


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Tool-heavy conversations, some of them broken as stored histories get broken: a greeting
    first, a result lost, a result of no call, an interjected prompt, results split in two."""
    out: list[dict[str, Any]] = []
    if draw(st.booleans()):
        out.append(answer("hello"))
    n = 0
    for t in range(draw(st.integers(1, 6))):
        out.append(prompt(f"q{t}"))
        for _ in range(draw(st.integers(0, 4))):
            n += 1
            ids = [f"c{n}"] + ([f"d{n}"] if draw(st.booleans()) else [])
            size = draw(st.integers(0, 120))
            out.append(
                {
                    "role": "assistant",
                    "content": [
                        {"toolUse": {"toolUseId": i, "name": "f", "input": {"q": "x" * size}}}
                        for i in ids
                    ],
                }
            )
            fate = draw(st.sampled_from(["ok", "ok", "ok", "lost", "orphan", "split", "late"]))
            answers = [result(i, size)["content"][0] for i in ids]
            if fate == "lost":
                answers = answers[:-1]
            if fate == "orphan":
                answers.append(result("nobody")["content"][0])
            if fate == "split" and len(answers) > 1:
                out += [{"role": "user", "content": [a]} for a in answers]
            elif fate == "late":
                out += [prompt("wait"), {"role": "user", "content": answers}]
            elif answers:
                out.append({"role": "user", "content": answers})
        if draw(st.booleans()):
            out.append(answer(f"a{t}"))
    return out


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    histories(),
    st.sampled_from([{}, {"k": 1}, {"k": 3}, {"token_limit": 150}, {"token_limit": 600}]),
    st.booleans(),
)
def test_any_history_is_kept_valid(
    messages: list[dict[str, Any]], options: dict[str, Any], reduce: bool
) -> None:
    if "token_limit" in options:
        options = {**options, "counter": COUNTER}
    manager = ZerdaConversationManager(**options)
    snapshot = copy.deepcopy(messages)
    holder = Holder(list(messages))
    try:
        if reduce:
            manager.reduce_context(holder, e=ContextWindowOverflowException())  # type: ignore[arg-type]
        else:
            manager.apply_management(holder)  # type: ignore[arg-type]
    except ContextWindowOverflowException:
        assert reduce
        assert all(a is b for a, b in zip(holder.messages, messages, strict=True))  # unchanged
        return
    kept = holder.messages
    assert messages == snapshot  # no given message was changed
    pending = messages[-1]["role"] == "assistant" and bool(uses(messages[-1]))
    if any(is_prompt(m) for m in messages):
        assert_valid(kept, pending=pending)
    # Each kept message is one given, or a copy holding blocks of given ones (the objects).
    sources = set()
    for m in kept:
        found = {
            i
            for i, g in enumerate(messages)
            if m is g or any(b is gb for b in m["content"] for gb in g["content"])
        }
        assert found, f"{m} is none of the messages given"
        sources |= found
    newest = [g for g in messages if is_prompt(g)][-1]
    assert any(m is newest for m in kept), "the newest prompt went"
    # removed_message_count: the oldest messages none of which is kept, where Strands' session
    # managers start reading again on restore.
    assert manager.removed_message_count == min(sources, default=len(messages))
    if reduce:  # progress
        assert len(kept) != len(messages) or any(
            a is not b for a, b in zip(kept, messages, strict=False)
        )
    if "token_limit" in options and not pending and len(prompts(kept)) > 1:
        assert stored_tokens(kept) <= options["token_limit"]
