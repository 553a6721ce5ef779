"""Anthropic Messages payloads <-> Messages: every block shape round trips, any context becomes
a request Anthropic takes, and bad payloads get clear errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from _validators import validate_anthropic
from zerda.errors import InvalidMessageError
from zerda.formats import from_anthropic, to_anthropic
from zerda.messages import Message, Role, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart

PNG = "iVBORw0KGgo="
PDF = "JVBERi0xLjQ="
HI = {"role": "user", "content": "Hi"}
USE = {"type": "tool_use", "id": "toolu_01", "name": "add_item", "input": {"item": "latte"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_01", "content": "added"}


def _user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def _assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


# Each documented block shape (the Messages API reference; anthropic-sdk-python's params).
SHAPES: dict[str, dict[str, Any]] = {
    "user-string": {"messages": [HI]},
    "system-string": {"system": "You take coffee orders.", "messages": [HI]},
    "system-blocks": {
        "system": [
            {"type": "text", "text": "You take coffee orders."},
            {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [HI],
    },
    "text-blocks": {
        "messages": [
            _user(
                {"type": "text", "text": "A latte"},
                {"type": "text", "text": "please", "cache_control": {"type": "ephemeral"}},
            )
        ]
    },
    "image-base64": {
        "messages": [
            _user(
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                },
                {"type": "text", "text": "What is this?"},
            )
        ]
    },
    "image-url": {
        "messages": [
            _user(
                {
                    "type": "image",
                    "source": {"type": "url", "url": "https://x.test/a.jpg"},
                    "cache_control": {"type": "ephemeral", "ttl": "1h"},
                }
            )
        ]
    },
    "document-pdf": {
        "messages": [
            _user(
                {
                    "type": "document",
                    "source": {"type": "base64", "media_type": "application/pdf", "data": PDF},
                    "title": "Menu",
                    "context": "Today's menu",
                    "citations": {"enabled": True},
                }
            )
        ]
    },
    "document-text": {
        "messages": [
            _user(
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "Café ☕\n"},
                }
            )
        ]
    },
    "document-url": {
        "messages": [
            _user({"type": "document", "source": {"type": "url", "url": "https://x.test/m.pdf"}})
        ]
    },
    "assistant-string": {"messages": [HI, {"role": "assistant", "content": "Hello!"}]},
    "assistant-blocks": {"messages": [HI, _assistant({"type": "text", "text": "Hello!"})]},
    "thinking": {
        "messages": [
            HI,
            _assistant(
                {"type": "thinking", "thinking": "A greeting.", "signature": "EqQBCkYIBxgCKkA="},
                {"type": "text", "text": "Hello!"},
            ),
        ]
    },
    "redacted-thinking-and-tool-use": {
        "messages": [
            HI,
            _assistant({"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}, USE),
            _user(RESULT),
        ]
    },
    "tool-use-and-result": {
        "messages": [HI, _assistant({"type": "text", "text": "Adding."}, USE), _user(RESULT)]
    },
    "tool-use-extras": {
        "messages": [
            HI,
            _assistant(
                {**USE, "cache_control": {"type": "ephemeral"}, "input": {"a": [1, {"b": None}]}}
            ),
            _user({**RESULT, "cache_control": {"type": "ephemeral"}}),
        ]
    },
    "parallel-results-then-text": {
        "messages": [
            HI,
            _assistant(USE, {**USE, "id": "toolu_02", "input": {}}),
            _user(
                RESULT,
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_02",
                    "is_error": True,
                    "content": [
                        {"type": "text", "text": "out of milk"},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": PNG},
                        },
                    ],
                },
                {"type": "text", "text": "Any news?"},
            ),
        ]
    },
    "result-without-content": {
        "messages": [HI, _assistant(USE), _user({"type": "tool_result", "tool_use_id": "toolu_01"})]
    },
    "result-empty-content": {"messages": [HI, _assistant(USE), _user({**RESULT, "content": ""})]},
    "result-empty-list": {"messages": [HI, _assistant(USE), _user({**RESULT, "content": []})]},
    "interleaved-text-and-tools": {
        "messages": [
            HI,
            _assistant(
                {"type": "text", "text": "First"},
                USE,
                {"type": "text", "text": "then"},
                {**USE, "id": "toolu_02"},
            ),
            _user(RESULT, {**RESULT, "tool_use_id": "toolu_02"}),
        ]
    },
    "consecutive-users": {"messages": [HI, {"role": "user", "content": "Are you there?"}]},
    "consecutive-assistants": {
        "messages": [
            HI,
            {"role": "assistant", "content": "One."},
            {"role": "assistant", "content": [{"type": "text", "text": "Two."}]},
        ]
    },
    "results-then-user-message": {
        "messages": [HI, _assistant(USE), _user(RESULT), {"role": "user", "content": "And?"}]
    },
    "final-empty-assistant-string": {"messages": [HI, {"role": "assistant", "content": ""}]},
    "final-empty-assistant-list": {"messages": [HI, {"role": "assistant", "content": []}]},
}


@pytest.mark.parametrize("payload", SHAPES.values(), ids=SHAPES.keys())
def test_every_documented_shape_round_trips(payload: dict[str, Any]) -> None:
    given = copy.deepcopy(payload)
    messages = from_anthropic(payload)
    assert to_anthropic(messages) == payload
    assert payload == given, "from_anthropic changed its input"
    assert from_anthropic(to_anthropic(messages)) == messages


@pytest.mark.parametrize(
    "name",
    # The validators are strict: consecutive turns (which the API combines) and a tool_result
    # holding "" (which it may refuse as an empty text) are not what to_anthropic makes.
    [
        n
        for n in SHAPES
        if n not in ("consecutive-users", "consecutive-assistants", "result-empty-content")
    ],
)
def test_the_documented_shapes_are_valid_requests(name: str) -> None:
    validate_anthropic(SHAPES[name])


def test_what_the_messages_hold() -> None:
    messages = from_anthropic(SHAPES["parallel-results-then-text"])
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool", "user"]
    assistant = messages[1]
    assert assistant.content is None
    assert assistant.tool_calls == (
        ToolCall("toolu_01", "add_item", '{"item": "latte"}'),
        ToolCall("toolu_02", "add_item", "{}"),
    )
    failed = messages[3]
    assert failed.tool_call_id == "toolu_02"
    assert failed.metadata == {"anthropic": {"is_error": True}}
    assert failed.content == (
        TextPart("out of milk"),
        ImagePart(f"data:image/png;base64,{PNG}"),
    )
    assert messages[4] == Message("user", (TextPart("Any news?"),))


def test_thinking_is_reasoning_that_anthropic_made() -> None:
    (_, assistant) = from_anthropic(SHAPES["thinking"])
    thinking, text = assistant.content  # type: ignore[misc]
    assert thinking == ReasoningPart(
        "A greeting.", signature="EqQBCkYIBxgCKkA=", extra={"anthropic": {}}
    )
    assert text == TextPart("Hello!")


def test_documents_are_file_parts() -> None:
    ((pdf,),) = [m.content for m in from_anthropic(SHAPES["document-pdf"])]  # type: ignore[misc]
    assert pdf == FilePart(
        f"data:application/pdf;base64,{PDF}",
        filename="Menu",
        extra={"anthropic": {"context": "Today's menu", "citations": {"enabled": True}}},
    )
    ((text,),) = [m.content for m in from_anthropic(SHAPES["document-text"])]  # type: ignore[misc]
    assert text == FilePart("data:text/plain;base64,Q2Fmw6kg4piVCg==")


# -- any context -----------------------------------------------------------------------------


def test_a_context_from_openai_becomes_a_request_anthropic_takes() -> None:
    messages = [
        Message("system", "You take coffee orders."),
        Message("user", "A latte", name="ada"),
        Message("assistant", "", tool_calls=[ToolCall("call 1", "add_item", "not json {")]),
        Message("tool", "   ", tool_call_id="call 1"),
        Message("developer", "Be brief."),
        Message("user", "  "),
        Message("user", "Thanks"),
        Message("assistant", "You're welcome!  \n"),
    ]
    payload = to_anthropic(messages)
    validate_anthropic(payload)
    safe_id = payload["messages"][1]["content"][0]["id"]
    assert safe_id.startswith("toolu_zerda_")
    assert payload == {
        "system": [
            {"type": "text", "text": "You take coffee orders."},
            {"type": "text", "text": "Be brief."},
        ],
        "messages": [
            {"role": "user", "content": "A latte"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": safe_id,
                        "name": "add_item",
                        "input": {"zerda_unparsed_arguments": "not json {"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": safe_id},
                    {"type": "text", "text": "Thanks"},
                ],
            },
            {"role": "assistant", "content": "You're welcome!"},
        ],
    }


def test_assistant_messages_before_the_first_user_message_are_left_out() -> None:
    messages = [
        Message("user", ""),
        Message("assistant", None, tool_calls=[ToolCall("c1", "greet")]),
        Message("tool", "hello", tool_call_id="c1"),
        Message("assistant", "Welcome!"),
        Message("user", "Hi"),
    ]
    assert to_anthropic(messages) == {"messages": [{"role": "user", "content": "Hi"}]}


def test_what_anthropic_cannot_take_is_left_out() -> None:
    messages = [
        Message(
            "user",
            (
                TextPart(""),
                ImagePart("data:image/bmp;base64,Qk0="),
                ImagePart("gs://bucket/a.png", extra={"gemini": {"_file_data": True}}),
                ImagePart(None, file_id="file-1"),
                ImagePart("https://x.test/a.png", detail="high"),
                AudioPart("UklGRg==", "wav"),
                FilePart("data:application/msword;base64,0M8R"),
                FilePart("data:text/plain;base64,aGk=", filename="note.txt"),
                FilePart(None, file_id="file-2"),
                ReasoningPart("not the assistant's to give"),
            ),
        ),
        Message(
            "assistant",
            (
                ReasoningPart("OpenAI's", encrypted="gAAA", extra={"responses": {"id": "rs_1"}}),
                ReasoningPart("Gemini's", signature="c2ln", extra={"gemini": {}}),
                ReasoningPart("no signature", extra={"anthropic": {}}),
                ImagePart("https://x.test/drawn.png"),
                TextPart("Here."),
            ),
        ),
    ]
    payload = to_anthropic(messages)
    validate_anthropic(payload)
    assert payload["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "url", "url": "https://x.test/a.png"}},
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "hi"},
                    "title": "note.txt",
                },
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "Here."}]},
    ]


def test_results_go_first_in_the_next_user_message() -> None:
    messages = [
        Message("user", "Two things"),
        Message("assistant", None, tool_calls=[ToolCall("a", "f"), ToolCall("b", "g")]),
        Message("tool", "B", tool_call_id="b"),
        Message("tool", "A", tool_call_id="a"),
        Message("user", (TextPart("and"), TextPart("more"))),
    ]
    payload = to_anthropic(messages)
    validate_anthropic(payload)
    assert [b["type"] for b in payload["messages"][2]["content"]] == [
        "tool_result",
        "tool_result",
        "text",
        "text",
    ]


def test_the_output_does_not_alias_the_messages() -> None:
    messages = from_anthropic(SHAPES["tool-use-extras"])
    payload = to_anthropic(messages)
    payload["messages"][1]["content"][0]["input"]["a"].append(2)
    payload["messages"][1]["content"][0]["cache_control"]["type"] = "changed"
    assert to_anthropic(messages) == SHAPES["tool-use-extras"]


def test_only_messages_are_converted() -> None:
    with pytest.raises(InvalidMessageError, match=r"messages\[1\] must be a Message, got dict"):
        to_anthropic([Message(Role.USER, "hi"), {"role": "user"}])  # type: ignore[list-item]


# -- bad input -------------------------------------------------------------------------------

BAD: list[Any] = [
    pytest.param([HI], r"the Anthropic payload: must be an object", id="a-list"),
    pytest.param(
        {"model": "claude", "messages": [HI]},
        r"has keys \['model'\]; from_anthropic reads 'system' and 'messages'",
        id="request-parameters",
    ),
    pytest.param({}, r"messages: must be a list, got NoneType", id="no-messages"),
    pytest.param(
        {"messages": [{"role": "user", "content": "x", "name": "ada"}]},
        r"messages\[0\]: has keys \['name'\]",
        id="message-extra-key",
    ),
    pytest.param(
        {"messages": [{"role": "system", "content": "x"}]},
        r"messages\[0\]: role must be 'user' or 'assistant', got 'system' \(the system prompt",
        id="system-role",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": []}]},
        r"messages\[0\]\.content: is an empty list",
        id="empty-user",
    ),
    pytest.param(
        {"messages": [_user({"type": "server_tool_use", "id": "x"})]},
        r"messages\[0\]\.content\[0\]: unknown block type 'server_tool_use'; the types are text",
        id="unknown-block",
    ),
    pytest.param(
        {"messages": [_user(USE)]},
        r"messages\[0\]\.content\[0\]: a tool_use block belongs in an assistant message",
        id="tool-use-from-user",
    ),
    pytest.param(
        {"messages": [HI, _assistant(RESULT)]},
        r"messages\[1\]\.content\[0\]: a tool_result block belongs in a user message",
        id="tool-result-from-assistant",
    ),
    pytest.param(
        {"messages": [HI, _assistant({**USE, "input": "latte"})]},
        r"messages\[1\]\.content\[0\]\.input: must be a JSON object, got str",
        id="input-not-object",
    ),
    pytest.param(
        {"messages": [HI, _assistant({**USE, "id": ""})]},
        r"messages\[1\]\.content\[0\]: 'id' must be a non-empty string",
        id="tool-use-without-id",
    ),
    pytest.param(
        {"messages": [_user({"type": "image", "source": {"type": "file", "file_id": "f"}})]},
        r"messages\[0\]\.content\[0\]\.source: source type 'file' is not one of base64, url",
        id="image-file-source",
    ),
    pytest.param(
        {"messages": [_user({"type": "image"})]},
        r"messages\[0\]\.content\[0\]\.source: must be an object \(a dict\), got NoneType",
        id="image-without-source",
    ),
    pytest.param(
        {
            "messages": [
                _user(
                    {
                        "type": "document",
                        "source": {"type": "text", "media_type": "text/csv", "data": "a,b"},
                    }
                )
            ]
        },
        r"a text source's media_type is 'text/plain', got 'text/csv'",
        id="text-source-type",
    ),
    pytest.param(
        {"system": [{"type": "image"}], "messages": []},
        r"system\[0\]: the system prompt holds text blocks, got type 'image'",
        id="system-image",
    ),
    pytest.param(
        {"messages": [HI, _assistant({"type": "redacted_thinking"})]},
        r"messages\[1\]\.content\[0\]: 'data' must be a non-empty string",
        id="redacted-without-data",
    ),
    pytest.param(
        {"messages": [_user({"type": "text", "text": "\ud800"})]},
        r"messages\[0\]\.content\[0\]: a text part's text holds a lone surrogate",
        id="lone-surrogate",
    ),
]


@pytest.mark.parametrize(("payload", "match"), BAD)
def test_bad_payloads_are_refused_with_a_clear_error(payload: object, match: str) -> None:
    with pytest.raises(InvalidMessageError, match=match):
        from_anthropic(payload)  # type: ignore[arg-type]
