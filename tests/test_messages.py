"""Messages, tool calls and turns: roles, immutability, validation, OpenAI and JSON conversion."""

from __future__ import annotations

import dataclasses
import gzip
import json
import pickle
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import zerda.messages
from zerda.errors import InvalidMessageError, ZerdaError
from zerda.messages import (
    PINNED,
    Message,
    Role,
    ToolCall,
    Turn,
    from_openai,
    group_stored_turns,
    group_turns,
    to_openai,
)

DATA = Path(__file__).parents[2] / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"

ROLE_VALUES = {
    "system": Role.SYSTEM,
    "developer": Role.DEVELOPER,
    "user": Role.USER,
    "assistant": Role.ASSISTANT,
    "tool": Role.TOOL,
}


def _call(id: str = "call_1", name: str = "get_menu_items", arguments: str = "{}") -> ToolCall:
    return ToolCall(id, name, arguments)


# -- Role ------------------------------------------------------------------------------------


class TestRole:
    @pytest.mark.parametrize(("value", "member"), ROLE_VALUES.items())
    def test_equals_its_string(self, value: str, member: Role) -> None:
        assert member == value
        assert isinstance(member, str)
        assert Role(value) is member
        assert str(member) == value
        assert f"{member}" == value

    def test_has_exactly_the_five_chat_roles(self) -> None:
        assert {r.value for r in Role} == set(ROLE_VALUES)

    @pytest.mark.parametrize(("value", "member"), ROLE_VALUES.items())
    def test_string_roles_are_coerced(self, value: str, member: Role) -> None:
        kwargs: dict[str, Any] = {"tool_call_id": "call_1"} if value == "tool" else {}
        m = Message(value, "hi", **kwargs)
        assert m.role is member


# -- Immutability ----------------------------------------------------------------------------


class TestImmutability:
    @pytest.mark.parametrize(
        ("attribute", "value"),
        [
            ("role", Role.ASSISTANT),
            ("content", "changed"),
            ("name", "mallory"),
            ("metadata", {}),
            ("created_at", 1.0),
        ],
    )
    def test_message_is_frozen(self, attribute: str, value: object) -> None:
        m = Message("user", "hi", metadata={"source": "web"})
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(m, attribute, value)
        assert m == Message("user", "hi", metadata={"source": "web"})

    def test_tool_call_is_frozen(self) -> None:
        call = _call()
        with pytest.raises(dataclasses.FrozenInstanceError):
            call.arguments = '{"x": 1}'  # type: ignore[misc]

    def test_metadata_cannot_be_mutated_through_the_message(self) -> None:
        m = Message("user", "hi", metadata={"source": "web"})
        with pytest.raises(TypeError):
            m.metadata["source"] = "api"  # type: ignore[index]
        with pytest.raises(TypeError):
            del m.metadata["source"]  # type: ignore[attr-defined]
        assert dict(m.metadata) == {"source": "web"}

    def test_metadata_does_not_alias_the_callers_dict(self) -> None:
        metadata: dict[str, Any] = {"source": "web", "tags": ["a"], "trace": {"span": 1}}
        m = Message("user", "hi", metadata=metadata)
        metadata["source"] = "api"
        metadata["tags"].append("b")
        metadata["trace"]["span"] = 2
        assert m.metadata == {"source": "web", "tags": ["a"], "trace": {"span": 1}}

    def test_tool_calls_are_copied_into_a_tuple(self) -> None:
        calls = [_call("c1"), _call("c2")]
        m = Message("assistant", None, tool_calls=calls)
        calls.append(_call("c3"))
        assert m.tool_calls == (_call("c1"), _call("c2"))
        assert isinstance(m.tool_calls, tuple)

    def test_replace_builds_a_validated_copy(self) -> None:
        m = Message("user", "hi")
        assert dataclasses.replace(m, content="hello") == Message("user", "hello")
        with pytest.raises(InvalidMessageError):
            dataclasses.replace(m, content=None)

    def test_equal_by_value_and_hashable(self) -> None:
        a = Message("assistant", "ok", tool_calls=[_call()], metadata={"k": 1}, created_at=5)
        b = Message("assistant", "ok", tool_calls=(_call(),), metadata={"k": 1}, created_at=5.0)
        assert a == b
        assert hash(a) == hash(b)
        assert a != dataclasses.replace(b, metadata={"k": 2})
        assert a != dataclasses.replace(b, created_at=6.0)

    def test_created_at_is_stored_as_float(self) -> None:
        m = Message("user", "hi", created_at=1_700_000_000)
        assert m.created_at == 1_700_000_000.0
        assert type(m.created_at) is float

    def test_text_of_a_tool_call_only_message_is_empty(self) -> None:
        assert Message("assistant", None, tool_calls=[_call()]).text == ""
        assert Message("user", "hi").text == "hi"


# -- Validation ------------------------------------------------------------------------------


INVALID: list[Any] = [
    # role
    pytest.param(lambda: Message("wizard", "hi"), r"unknown role 'wizard'", id="unknown-role"),
    pytest.param(lambda: Message("User", "hi"), r"unknown role 'User'", id="role-case"),
    pytest.param(lambda: Message(None, "hi"), r"unknown role None", id="role-none"),
    pytest.param(lambda: Message(3, "hi"), r"unknown role 3", id="role-int"),
    # content
    pytest.param(
        lambda: Message("user", 42),
        r"content must be a string or a sequence of parts, got int",
        id="int",
    ),
    pytest.param(
        lambda: Message("user", [{"type": "text", "text": "hi"}]),
        r"content part 0 must be a zerda.parts part .* got dict \(use Message.from_openai",
        id="content-dicts",
    ),
    pytest.param(
        lambda: Message("user", ()),
        r"empty sequence of parts; use '' for none",
        id="content-no-parts",
    ),
    pytest.param(
        lambda: Message("user", {"text": "hi"}),
        r"must be a string or a sequence of parts, got dict",
        id="dict",
    ),
    pytest.param(
        lambda: Message("user", None),
        r"user message content must be a string or parts; None is allowed only on an assistant",
        id="none-user",
    ),
    pytest.param(
        lambda: Message("system", None), r"system message .*None is allowed only", id="none-system"
    ),
    pytest.param(
        lambda: Message("tool", None, tool_call_id="c1"),
        r"tool message .*None is allowed only",
        id="none-tool",
    ),
    pytest.param(
        lambda: Message("assistant", None),
        r"assistant message .*None is allowed only .* makes tool calls",
        id="none-assistant-no-calls",
    ),
    # tool_call_id
    pytest.param(
        lambda: Message("tool", "42"), r"tool message needs tool_call_id", id="tool-no-id"
    ),
    pytest.param(
        lambda: Message("tool", "42", tool_call_id=""),
        r"tool message needs tool_call_id",
        id="tool-empty-id",
    ),
    pytest.param(
        lambda: Message("user", "hi", tool_call_id="c1"),
        r"only tool messages carry tool_call_id, not user",
        id="user-with-call-id",
    ),
    pytest.param(
        lambda: Message("assistant", "hi", tool_call_id="c1"),
        r"only tool messages carry tool_call_id, not assistant",
        id="assistant-with-call-id",
    ),
    # tool calls on the wrong role or of the wrong shape
    pytest.param(
        lambda: Message("user", "hi", tool_calls=[_call()]),
        r"only assistant messages make tool calls, not user",
        id="user-with-calls",
    ),
    pytest.param(
        lambda: Message("tool", "hi", tool_call_id="c1", tool_calls=[_call()]),
        r"only assistant messages make tool calls, not tool",
        id="tool-with-calls",
    ),
    pytest.param(
        lambda: Message(
            "assistant",
            None,
            tool_calls=[
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        ),
        r"tool_calls must hold ToolCall objects, got dict \(use Message.from_openai",
        id="dict-instead-of-toolcall",
    ),
    pytest.param(
        lambda: Message("assistant", None, tool_calls="call_1"),
        r"tool_calls must be a sequence of ToolCall, got str",
        id="tool-calls-str",
    ),
    pytest.param(
        lambda: Message("assistant", None, tool_calls=None),
        r"tool_calls must be a sequence of ToolCall, got NoneType",
        id="tool-calls-none",
    ),
    pytest.param(
        lambda: Message.from_openai(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{}"}}],
            }
        ),
        r"tool call id must be a non-empty string, got None",
        id="call-missing-id",
    ),
    pytest.param(
        lambda: Message.from_openai(
            {"role": "assistant", "content": None, "tool_calls": [{"id": "c7", "type": "function"}]}
        ),
        r"tool call 'c7' has no 'function' dict",
        id="call-missing-function",
    ),
    pytest.param(
        lambda: Message.from_openai(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "function": {"arguments": "{}"}}],
            }
        ),
        r"tool call name must be a non-empty string, got None",
        id="function-without-name",
    ),
    pytest.param(
        lambda: Message.from_openai(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [{"id": "c1", "function": {"name": "f", "arguments": {"a": 1}}}],
            }
        ),
        r"tool call 'f': arguments must be a JSON string, got dict \(use json.dumps\)",
        id="arguments-dict",
    ),
    pytest.param(
        lambda: Message.from_openai(
            {"role": "assistant", "content": None, "tool_calls": ["call_1"]}
        ),
        r"a tool call must be a dict",
        id="call-not-a-dict",
    ),
    pytest.param(
        lambda: Message.from_openai(
            {"role": "assistant", "content": None, "tool_calls": {"id": "c1"}}
        ),
        r"tool_calls must be a list of tool call dicts, got dict",
        id="tool-calls-a-dict",
    ),
    pytest.param(lambda: ToolCall("", "f"), r"tool call id must be a non-empty string", id="id"),
    pytest.param(lambda: ToolCall("c1", ""), r"tool call name must be a non-empty", id="name"),
    pytest.param(lambda: ToolCall("c1", "f", type=""), r"tool call type must be", id="type"),
    pytest.param(
        lambda: ToolCall("c1", "f", arguments=None),
        r"arguments must be a JSON string, got NoneType",
        id="arguments-none",
    ),
    # name
    pytest.param(lambda: Message("user", "hi", name=""), r"name must be a non-empty", id="name-e"),
    pytest.param(lambda: Message("user", "hi", name=7), r"name must be a non-empty", id="name-int"),
    # metadata
    pytest.param(
        lambda: Message("user", "hi", metadata={"at": object()}),
        r"metadata must be JSON-serializable",
        id="metadata-object",
    ),
    pytest.param(
        lambda: Message("user", "hi", metadata={"score": float("nan")}),
        r"metadata must be JSON-serializable",
        id="metadata-nan",
    ),
    pytest.param(
        lambda: Message("user", "hi", metadata={"ids": {1, 2}}),
        r"metadata must be JSON-serializable",
        id="metadata-set",
    ),
    pytest.param(
        lambda: Message("user", "hi", metadata={1: "one"}),
        r"metadata keys must be strings, got 1",
        id="metadata-int-key",
    ),
    pytest.param(
        lambda: Message("user", "hi", metadata={None: "x"}),
        r"metadata keys must be strings, got None",
        id="metadata-none-key",
    ),
    pytest.param(
        lambda: Message("user", "hi", metadata=[("k", "v")]),
        r"metadata must be a mapping, got list",
        id="metadata-list",
    ),
    # created_at
    pytest.param(
        lambda: Message("user", "hi", created_at=True),
        r"created_at must be epoch seconds .* got True",
        id="created-bool",
    ),
    pytest.param(
        lambda: Message("user", "hi", created_at="2024-05-01T10:00:00"),
        r"created_at must be epoch seconds .* got '2024-05-01T10:00:00'",
        id="created-str",
    ),
    pytest.param(
        lambda: Message("user", "hi", created_at=float("nan")),
        r"created_at must be finite, got nan",
        id="created-nan",
    ),
    pytest.param(
        lambda: Message("user", "hi", created_at=float("-inf")),
        r"created_at must be finite",
        id="created-inf",
    ),
    pytest.param(
        lambda: Message("user", "hi", created_at=10**400),
        r"created_at must be finite epoch seconds, got an int too large",
        id="created-huge-int",
    ),
    # dict forms
    pytest.param(lambda: Message.from_openai("hi"), r"a message must be a dict", id="not-dict"),
    pytest.param(
        lambda: Message.from_openai(Message("user", "hi")), r"already a Message", id="message"
    ),
    pytest.param(
        lambda: Message.from_openai({"content": "hi"}),
        r"message has no 'role'; keys present: \['content'\]",
        id="no-role",
    ),
    pytest.param(lambda: Message.from_json("{not json"), r"not a JSON message", id="bad-json"),
    pytest.param(lambda: Message.from_json("[1, 2]"), r"a message must be a dict", id="json-list"),
]


@pytest.mark.parametrize(("build", "match"), INVALID)
def test_invalid_messages_are_refused_with_a_clear_error(
    build: Callable[[], object], match: str
) -> None:
    with pytest.raises(InvalidMessageError, match=match) as info:
        build()
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ZerdaError)


def test_unknown_role_error_lists_the_valid_roles() -> None:
    with pytest.raises(InvalidMessageError) as info:
        Message("wizard", "hi")
    message = str(info.value)
    assert "'wizard'" in message
    for role in ROLE_VALUES:
        assert repr(role) in message


def test_non_serializable_metadata_chains_the_json_error() -> None:
    with pytest.raises(InvalidMessageError) as info:
        Message("user", "hi", metadata={"at": object()})
    assert isinstance(info.value.__cause__, TypeError)


def test_assistant_may_have_no_content_when_it_calls_tools() -> None:
    m = Message("assistant", None, tool_calls=[_call()])
    assert m.content is None
    assert m.tool_calls == (_call(),)


# -- OpenAI conversion -----------------------------------------------------------------------

CALL = {
    "id": "call_abc",
    "type": "function",
    "function": {"name": "get_menu_items", "arguments": '{"query": "flat white"}'},
}
OPENAI_DICTS = {
    "user": {"role": "user", "content": "A flat white, please."},
    "user-named": {"role": "user", "content": "Make it two.", "name": "alice"},
    "system": {"role": "system", "content": "You take coffee orders."},
    "assistant": {"role": "assistant", "content": "Anything else?"},
    "assistant-named": {"role": "assistant", "content": "Hi, I'm Bean.", "name": "barista"},
    "assistant-tool-call": {"role": "assistant", "content": None, "tool_calls": [CALL]},
    "assistant-text-and-calls": {
        "role": "assistant",
        "content": "Checking both.",
        "tool_calls": [
            CALL,
            {
                "id": "call_def",
                "type": "function",
                "function": {"name": "add_item", "arguments": "not even json {"},
            },
        ],
    },
    "tool": {"role": "tool", "content": '{"price": 4.5}', "tool_call_id": "call_abc"},
    "empty-content": {"role": "assistant", "content": ""},
}


class TestOpenAI:
    @pytest.mark.parametrize("data", OPENAI_DICTS.values(), ids=OPENAI_DICTS.keys())
    def test_round_trip(self, data: dict[str, Any]) -> None:
        assert Message.from_openai(data).to_openai() == data

    def test_fields_are_read(self) -> None:
        m = Message.from_openai(OPENAI_DICTS["assistant-text-and-calls"])
        assert m.role is Role.ASSISTANT
        assert m.content == "Checking both."
        assert m.tool_calls == (
            ToolCall("call_abc", "get_menu_items", '{"query": "flat white"}'),
            ToolCall("call_def", "add_item", "not even json {"),
        )
        tool = Message.from_openai(OPENAI_DICTS["tool"])
        assert (tool.role, tool.tool_call_id, tool.content) == (
            Role.TOOL,
            "call_abc",
            '{"price": 4.5}',
        )
        assert Message.from_openai(OPENAI_DICTS["user-named"]).name == "alice"

    def test_list_functions_round_trip(self) -> None:
        dicts = list(OPENAI_DICTS.values())
        messages = from_openai(dicts)
        assert all(isinstance(m, Message) for m in messages)
        assert len(messages) == len(dicts)
        assert to_openai(messages) == dicts
        assert to_openai(iter(messages)) == dicts
        assert from_openai(iter(dicts)) == messages

    def test_list_conversion_validates_each_message(self) -> None:
        with pytest.raises(InvalidMessageError, match="unknown role 'robot'"):
            from_openai([{"role": "user", "content": "hi"}, {"role": "robot", "content": "hi"}])

    def test_metadata_and_created_at_are_never_sent(self) -> None:
        m = Message("user", "hi", metadata={"trace": "t1"}, created_at=1.5)
        assert m.to_openai() == {"role": "user", "content": "hi"}

    def test_output_does_not_alias_the_message(self) -> None:
        m = Message.from_openai(OPENAI_DICTS["assistant-tool-call"])
        out = m.to_openai()
        out["content"] = "changed"
        out["tool_calls"][0]["function"]["name"] = "changed"
        out["tool_calls"].append({})
        assert m.to_openai() == OPENAI_DICTS["assistant-tool-call"]

    def test_sdk_model_dump_shape_is_accepted(self) -> None:
        """The OpenAI SDK's ``model_dump()`` of a reply carries empty extra keys."""
        dumped = {
            "content": None,
            "refusal": None,
            "role": "assistant",
            "annotations": [],
            "audio": None,
            "function_call": None,
            "tool_calls": [CALL],
        }
        assert Message.from_openai(dumped).to_openai() == OPENAI_DICTS["assistant-tool-call"]

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("refusal", None),
            ("refusal", ""),
            ("audio", None),
            ("function_call", None),
            ("annotations", []),
            ("annotations", None),
        ],
    )
    def test_unmodelled_keys_are_accepted_when_empty(self, key: str, value: object) -> None:
        data = {"role": "assistant", "content": "Sure.", key: value}
        assert Message.from_openai(data).to_openai() == {"role": "assistant", "content": "Sure."}

    @pytest.mark.parametrize(
        ("key", "value"),
        [
            ("refusal", "I can't help with that."),
            ("audio", {"id": "audio_1"}),
            ("function_call", {"name": "f", "arguments": "{}"}),
            ("annotations", [{"type": "url_citation"}]),
        ],
    )
    def test_unmodelled_keys_are_refused_when_set(self, key: str, value: object) -> None:
        """Dropping them silently would lose what the model said."""
        data = {"role": "assistant", "content": "Sure.", key: value}
        with pytest.raises(InvalidMessageError, match=f"unsupported message key '{key}'"):
            Message.from_openai(data)

    @pytest.mark.parametrize("value", [None, "x", {"a": 1}])
    def test_unknown_keys_are_refused(self, value: object) -> None:
        with pytest.raises(InvalidMessageError, match="unsupported message key 'mood'"):
            Message.from_openai({"role": "user", "content": "hi", "mood": value})

    def test_metadata_is_not_an_openai_key(self) -> None:
        data = {"role": "user", "content": "hi", "metadata": {"k": 1}}
        with pytest.raises(InvalidMessageError, match="unsupported message key 'metadata'"):
            Message.from_openai(data)
        assert Message.from_dict(data).metadata == {"k": 1}


# -- Lossless dict / JSON round trips --------------------------------------------------------

EXAMPLES = {
    "plain": Message("user", "hi"),
    "metadata-and-time": Message(
        "user",
        "A cortado",
        metadata={"source": "web", "score": 0.5, "tags": ["a", "b"], "nested": {"x": None}},
        created_at=1_714_557_600.25,
    ),
    "unicode": Message("user", 'Un café crème ☕ — 谢谢 \U0001f600 \x00 \u2028 "quoted" \\'),
    "tool-calls": Message(
        "assistant",
        None,
        name="barista",
        tool_calls=[_call("c1", "get_menu_items", '{"q": "ü"}'), _call("c2", "f", "")],
        created_at=0.0,
    ),
    "tool-result": Message("tool", "[]", tool_call_id="c1", metadata={"ms": 12}),
    "zero-time": Message("system", "Be brief.", created_at=0),
}


class TestSerialization:
    @pytest.mark.parametrize("m", EXAMPLES.values(), ids=EXAMPLES.keys())
    def test_json_round_trip(self, m: Message) -> None:
        assert Message.from_json(m.to_json()) == m
        assert Message.from_json(m.to_json().encode()) == m

    @pytest.mark.parametrize("m", EXAMPLES.values(), ids=EXAMPLES.keys())
    def test_dict_round_trip(self, m: Message) -> None:
        assert Message.from_dict(m.to_dict()) == m

    def test_to_dict_is_json_ready_and_complete(self) -> None:
        m = EXAMPLES["metadata-and-time"]
        d = m.to_dict()
        assert json.loads(json.dumps(d)) == d
        assert d == {
            "role": "user",
            "content": "A cortado",
            "metadata": {"source": "web", "score": 0.5, "tags": ["a", "b"], "nested": {"x": None}},
            "created_at": 1_714_557_600.25,
        }

    def test_to_dict_does_not_alias_metadata(self) -> None:
        m = EXAMPLES["metadata-and-time"]
        m.to_dict()["metadata"]["source"] = "changed"
        assert m.metadata["source"] == "web"

    def test_tuples_in_metadata_round_trip(self) -> None:
        """JSON has no tuples; what the message keeps must be what comes back."""
        m = Message("user", "hi", metadata={"span": (0, 5), "deep": [{"pair": (1, 2)}]})
        assert Message.from_json(m.to_json()) == m
        assert pickle.loads(pickle.dumps(m)) == m

    def test_from_dict_accepts_null_metadata(self) -> None:
        assert Message.from_dict({"role": "user", "content": "hi", "metadata": None}) == Message(
            "user", "hi"
        )

    @pytest.mark.parametrize("m", EXAMPLES.values(), ids=EXAMPLES.keys())
    def test_pickle_round_trip(self, m: Message) -> None:
        assert pickle.loads(pickle.dumps(m)) == m


# -- Property tests: any valid message survives every round trip -----------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=8,
)
metadata_st = st.dictionaries(st.text(max_size=10), json_values, max_size=4)
created_at_st = st.none() | st.floats(allow_nan=False, allow_infinity=False) | st.integers(0, 2**40)
names_st = st.none() | st.text(min_size=1, max_size=12)
ids_st = st.text(min_size=1, max_size=16)
tool_calls_st = st.builds(
    ToolCall,
    id=ids_st,
    name=st.text(min_size=1, max_size=20),
    arguments=st.text(),
    type=st.just("function") | st.text(min_size=1, max_size=10),
)


@st.composite
def messages_st(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(Role))
    common: dict[str, Any] = {
        "name": draw(names_st),
        "metadata": draw(metadata_st),
        "created_at": draw(created_at_st),
    }
    given_role: Role | str = draw(st.sampled_from([role, role.value]))
    if role is Role.ASSISTANT:
        calls = draw(st.lists(tool_calls_st, max_size=3))
        content = draw(st.none() | st.text()) if calls else draw(st.text())
        return Message(given_role, content, tool_calls=calls, **common)
    if role is Role.TOOL:
        return Message(given_role, draw(st.text()), tool_call_id=draw(ids_st), **common)
    return Message(given_role, draw(st.text()), **common)


@given(messages_st())
def test_any_message_round_trips_through_json(m: Message) -> None:
    assert Message.from_json(m.to_json()) == m
    assert Message.from_dict(json.loads(m.to_json())) == m


@given(messages_st())
def test_any_message_round_trips_through_dict(m: Message) -> None:
    assert Message.from_dict(m.to_dict()) == m


@given(messages_st())
def test_any_message_round_trips_through_pickle(m: Message) -> None:
    assert pickle.loads(pickle.dumps(m)) == m


@given(messages_st())
def test_openai_form_keeps_everything_but_metadata_and_time(m: Message) -> None:
    back = Message.from_openai(m.to_openai())
    # A name OpenAI would refuse goes as one it takes: other characters as "_", at most 64.
    name = None if m.name is None else re.sub(r"[^A-Za-z0-9_-]", "_", m.name)[:64]
    assert back == dataclasses.replace(m, metadata={}, created_at=None, name=name)


# -- The real data set -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dialogs() -> list[dict[str, Any]]:
    if not DATA.exists():
        pytest.skip(f"shared data set not found at {DATA}; clone the repo beside 'shared/'")
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return [json.loads(line) for line in f]


class TestRealDialogs:
    def test_every_dialog_round_trips_through_openai(self, dialogs: list[dict[str, Any]]) -> None:
        assert dialogs
        for dialog in dialogs:
            assert to_openai(from_openai(dialog["messages"])) == dialog["messages"], dialog["id"]

    def test_every_message_round_trips_through_json(self, dialogs: list[dict[str, Any]]) -> None:
        for dialog in dialogs:
            for m in from_openai(dialog["messages"]):
                assert Message.from_json(m.to_json()) == m, dialog["id"]

    def test_every_tool_call_is_answered_in_its_turn(self, dialogs: list[dict[str, Any]]) -> None:
        """In this data set each call is followed by its result, before the next user message."""
        for dialog in dialogs:
            messages = from_openai(dialog["messages"])
            turns = group_turns(messages)
            assert [m for t in turns for m in t.messages] == messages, dialog["id"]
            calls = [c for m in messages for c in m.tool_calls]
            assert sum(len(t.tool_calls) for t in turns) == len(calls), dialog["id"]
            assert all(t.pending_tool_calls == () for t in turns), dialog["id"]


# -- Turns -----------------------------------------------------------------------------------

SYSTEM = Message("system", "You take coffee orders.")
U1 = Message("user", "A latte, please.")
A_CALL = Message("assistant", None, tool_calls=[_call("c1", "add_item", '{"item": "latte"}')])
T1 = Message("tool", '{"ok": true}', tool_call_id="c1")
A1 = Message("assistant", "Added a latte.")
U2 = Message("user", "Thanks!")
A2 = Message("assistant", "Enjoy.")
GREETING = Message("assistant", "Hi, what can I get you?")


class TestGroupTurns:
    def test_a_turn_runs_from_a_user_message_to_the_next(self) -> None:
        turns = group_turns([SYSTEM, U1, A_CALL, T1, A1, U2, A2])
        assert [t.messages for t in turns] == [(U1, A_CALL, T1, A1), (U2, A2)]

    def test_system_messages_are_in_no_turn(self) -> None:
        turns = group_turns([SYSTEM, U1, A1, SYSTEM, U2, SYSTEM, A2])
        assert [t.messages for t in turns] == [(U1, A1), (U2, A2)]

    def test_an_opening_assistant_message_is_a_turn_without_user(self) -> None:
        turns = group_turns([SYSTEM, GREETING, U1, A1])
        assert [t.messages for t in turns] == [(GREETING,), (U1, A1)]
        assert turns[0].user is None
        assert turns[1].user is U1

    def test_nothing_gives_no_turns(self) -> None:
        assert group_turns([]) == []
        assert group_turns([SYSTEM]) == []

    def test_accepts_any_iterable(self) -> None:
        turns = group_turns(iter([U1, A1, U2]))
        assert [t.messages for t in turns] == [(U1, A1), (U2,)]

    @pytest.mark.parametrize(
        "messages",
        [
            [SYSTEM, U1, A_CALL, T1, A1, U2, A2],
            [SYSTEM, GREETING, U1, A1, SYSTEM, U2],
            [GREETING, GREETING],
            [],
        ],
    )
    def test_stored_turns_are_the_same_turns_built_without_checks(
        self, messages: list[Message]
    ) -> None:
        stored = group_stored_turns(messages)
        assert stored == group_turns(messages)
        assert [(t.user, t.reply) for t in stored] == [
            (t.user, t.reply) for t in group_turns(messages)
        ]
        assert all(type(t) is Turn and isinstance(t.messages, tuple) for t in stored)

    def test_consecutive_user_messages_are_separate_turns(self) -> None:
        assert [t.messages for t in group_turns([U1, U2, A2])] == [(U1,), (U2, A2)]


class TestTurn:
    def test_user_and_reply(self) -> None:
        turn = Turn((U1, A_CALL, T1, A1))
        assert turn.user is U1
        assert turn.reply is A1

    def test_reply_is_the_last_assistant_message_with_text(self) -> None:
        checking = Message("assistant", "Let me check.", tool_calls=[_call("c1", "get_menu_items")])
        turn = Turn((U1, checking, Message("tool", "[]", tool_call_id="c1")))
        assert turn.reply is checking
        assert Turn((U1, A1, A_CALL, T1)).reply is A1

    def test_a_tool_call_with_empty_text_is_not_the_reply(self) -> None:
        """Some APIs send ``""`` instead of ``None`` beside tool calls."""
        empty_call = Message("assistant", "", tool_calls=[_call("c9")])
        assert Turn((U1, A1, empty_call)).reply is A1
        assert Turn((U1, empty_call)).reply is None

    def test_no_reply_yet(self) -> None:
        assert Turn((U1,)).reply is None
        assert Turn((U1, A_CALL, T1)).reply is None

    def test_tool_calls_in_order(self) -> None:
        second = Message("assistant", None, tool_calls=[_call("c2"), _call("c3")])
        turn = Turn((U1, A_CALL, T1, second))
        assert [c.id for c in turn.tool_calls] == ["c1", "c2", "c3"]

    def test_pending_tool_calls(self) -> None:
        calls = Message("assistant", None, tool_calls=[_call("c1"), _call("c2"), _call("c3")])
        answer_c2 = Message("tool", "done", tool_call_id="c2")
        assert Turn((U1, calls)).pending_tool_calls == calls.tool_calls
        assert Turn((U1, calls, answer_c2)).pending_tool_calls == (_call("c1"), _call("c3"))
        answered = (Message("tool", "done", tool_call_id=i) for i in ("c3", "c1", "c2"))
        assert Turn((U1, calls, *answered)).pending_tool_calls == ()

    def test_a_turn_is_frozen(self) -> None:
        turn = Turn((U1, A1))
        with pytest.raises(dataclasses.FrozenInstanceError):
            turn.messages = (U2,)  # type: ignore[misc]

    def test_a_list_of_messages_is_copied_into_a_tuple(self) -> None:
        messages = [U1, A1]
        turn = Turn(messages)  # type: ignore[arg-type]
        messages.append(SYSTEM)
        assert turn.messages == (U1, A1)

    @pytest.mark.parametrize(
        ("messages", "match"),
        [
            pytest.param((), "at least one message", id="empty"),
            pytest.param((SYSTEM,), "system messages are pinned", id="only-system"),
            pytest.param((U1, SYSTEM, A1), "system messages are pinned", id="system-inside"),
            pytest.param((U1, A1, U2), "one user message, at its start", id="second-user"),
            pytest.param((A1, U1), "one user message, at its start", id="user-not-first"),
            pytest.param((U1, {"role": "assistant"}), "Message", id="not-a-message"),
        ],
    )
    def test_validation(self, messages: tuple[Any, ...], match: str) -> None:
        with pytest.raises(InvalidMessageError, match=match):
            Turn(messages)


@given(st.lists(messages_st(), max_size=25))
def test_group_turns_partitions_the_non_pinned_messages(messages: list[Message]) -> None:
    turns = group_turns(messages)
    non_system = [m for m in messages if m.role not in PINNED]
    flat = [m for t in turns for m in t.messages]
    assert [id(m) for m in flat] == [id(m) for m in non_system]
    for i, turn in enumerate(turns):
        if i > 0:
            assert turn.messages[0].role is Role.USER
        assert all(m.role is not Role.USER for m in turn.messages[1:])
    users = sum(m.role is Role.USER for m in non_system)
    opens_without_user = bool(non_system) and non_system[0].role is not Role.USER
    assert len(turns) == users + opens_without_user


def test_stamping_copies_every_field() -> None:
    """``stamped`` and ``with_created_at`` copy a message field by field, for speed: a field
    added to Message and forgotten there would be lost on every message a memory stores."""
    full = Message(
        "assistant",
        "text",
        name="bot",
        tool_calls=(ToolCall("c1", "f", '{"a": 1}'),),
        metadata={"k": [1, 2]},
    )
    names = {f.name for f in dataclasses.fields(Message)}
    assert len(names) == len(zerda.messages._SLOT_SETTERS)
    stamped = full.stamped(5.0)
    assert stamped == dataclasses.replace(full, created_at=5.0, id=stamped.id)
    assert stamped.id is not None
    again = stamped.with_created_at(6.0)
    assert again == dataclasses.replace(stamped, created_at=6.0)
    assert {n for n in names if getattr(again, n) != getattr(stamped, n)} == {"created_at"}


def test_new_message_ids_are_unique_increasing_uuid7() -> None:
    ids = [zerda.messages.new_message_id() for _ in range(50)]
    ids += zerda.messages.new_message_ids(50)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    parsed = [uuid.UUID(i) for i in ids]
    assert {u.version for u in parsed} == {7}
    assert {u.variant for u in parsed} == {uuid.RFC_4122}
    assert [str(u) for u in parsed] == ids
    now_ms = time.time_ns() // 1_000_000
    assert all(abs((u.int >> 80) - now_ms) < 60_000 for u in parsed), "the time in the id"
