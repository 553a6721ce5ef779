"""OpenAI Responses input items <-> Messages: every item and part shape round trips, other
formats' messages become items the API takes, and bad items get clear errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from _validators import validate_responses
from zerda.errors import InvalidMessageError
from zerda.formats import from_responses, to_responses
from zerda.messages import Message, Role, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart

PNG = "data:image/png;base64,iVBORw0KGgo="
PDF = "data:application/pdf;base64,JVBERi0xLjQ="

USER = {"type": "message", "role": "user", "content": "One flat white, please."}
CALL = {"type": "function_call", "call_id": "call_1", "name": "add_item", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "call_1", "output": '{"ok": true}'}

# Each documented item shape, as the API reference and openai-python's params give it.
SHAPES: dict[str, list[dict[str, Any]]] = {
    "user-string": [USER],
    "user-untyped": [{"role": "user", "content": "Hi"}],
    "system": [{"type": "message", "role": "system", "content": "Be brief."}],
    "developer": [{"role": "developer", "content": "Answer in French."}],
    "input-text-parts": [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Two parts:"},
                {"type": "input_text", "text": ""},
            ],
        }
    ],
    "input-image-url-detail": [
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "low"}
            ],
        }
    ],
    "input-image-data-url": [
        {"role": "user", "content": [{"type": "input_image", "image_url": PNG, "detail": "auto"}]}
    ],
    "input-image-file-id": [
        {
            "role": "user",
            "content": [{"type": "input_image", "file_id": "file-1", "detail": "high"}],
        }
    ],
    "input-image-original-detail-and-nulls": [
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": PNG, "file_id": None, "detail": "original"}
            ],
        }
    ],
    "input-image-no-detail": [
        {"role": "user", "content": [{"type": "input_image", "image_url": PNG}]}
    ],
    "input-file-id": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-9"}]}],
    "input-file-data": [
        {
            "role": "user",
            "content": [{"type": "input_file", "file_data": PDF, "filename": "menu.pdf"}],
        }
    ],
    "input-file-url": [
        {
            "role": "user",
            "content": [
                {"type": "input_file", "file_url": "https://x.test/menu.pdf", "detail": "low"}
            ],
        }
    ],
    "prompt-cache-breakpoint": [
        {
            "role": "user",
            "content": [
                {
                    "type": "input_text",
                    "text": "A long prefix",
                    "prompt_cache_breakpoint": {"mode": "explicit"},
                }
            ],
        }
    ],
    "assistant-string": [USER, {"role": "assistant", "content": "Anything else?"}],
    "assistant-empty-string": [USER, {"type": "message", "role": "assistant", "content": ""}],
    "assistant-output-message": [
        USER,
        {
            "type": "message",
            "id": "msg_1",
            "status": "completed",
            "role": "assistant",
            "phase": "final_answer",
            "content": [
                {"type": "output_text", "text": "Sure.", "annotations": [], "logprobs": []},
                {"type": "refusal", "refusal": "But not that."},
            ],
        },
    ],
    "assistant-output-text-plain": [
        USER,
        {"role": "assistant", "content": [{"type": "output_text", "text": "Sure."}]},
    ],
    "function-call": [USER, CALL, OUTPUT],
    "function-call-with-id-status": [
        USER,
        {**CALL, "id": "fc_1", "status": "completed"},
        {**OUTPUT, "id": "fco_1", "status": "completed"},
    ],
    "function-call-empty-arguments": [USER, {**CALL, "arguments": ""}, OUTPUT],
    "parallel-calls": [
        USER,
        CALL,
        {**CALL, "call_id": "call_2", "arguments": '{"item": "mocha"}'},
        OUTPUT,
        {**OUTPUT, "call_id": "call_2"},
    ],
    "output-parts": [
        USER,
        CALL,
        {
            **OUTPUT,
            "output": [
                {"type": "input_text", "text": "Here is the receipt"},
                {"type": "input_image", "image_url": PNG},
                {"type": "input_file", "file_id": "file-2"},
            ],
        },
    ],
    "reasoning-then-message": [
        USER,
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "They want coffee."}],
            "encrypted_content": "gAAAA",
        },
        {
            "type": "message",
            "id": "msg_2",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Coming up.", "annotations": []}],
        },
    ],
    "reasoning-empty-summary-then-calls": [
        USER,
        {"type": "reasoning", "id": "rs_2", "summary": []},
        CALL,
        {**CALL, "call_id": "call_2"},
        OUTPUT,
        {**OUTPUT, "call_id": "call_2"},
    ],
    "reasoning-many-summaries-content-status": [
        USER,
        {
            "type": "reasoning",
            "id": "rs_3",
            "summary": [
                {"type": "summary_text", "text": "First."},
                {"type": "summary_text", "text": "Second."},
            ],
            "content": [{"type": "reasoning_text", "text": "Raw thoughts."}],
            "encrypted_content": None,
            "status": "completed",
        },
        {"role": "assistant", "content": "Done."},
    ],
    "text-then-calls": [
        USER,
        {"role": "assistant", "content": [{"type": "output_text", "text": "Adding it."}]},
        CALL,
        OUTPUT,
    ],
    "string-text-then-call": [USER, {"role": "assistant", "content": "Adding it."}, CALL, OUTPUT],
    "two-assistant-messages": [
        USER,
        {"role": "assistant", "content": "Let me see."},
        {"role": "assistant", "content": "Found it."},
    ],
    "interleaved-run": [
        USER,
        {"type": "reasoning", "id": "rs_4", "summary": []},
        CALL,
        {"type": "reasoning", "id": "rs_5", "summary": []},
        {"role": "assistant", "content": "Also:"},
        {**CALL, "call_id": "call_2"},
        OUTPUT,
        {**OUTPUT, "call_id": "call_2"},
    ],
}


@pytest.mark.parametrize("items", SHAPES.values(), ids=SHAPES.keys())
def test_every_documented_shape_round_trips(items: list[dict[str, Any]]) -> None:
    given = copy.deepcopy(items)
    messages = from_responses(items)
    assert to_responses(messages) == items
    assert items == given, "from_responses changed its input"
    assert from_responses(to_responses(messages)) == messages


@pytest.mark.parametrize(
    "name", [n for n in SHAPES if n.startswith(("function", "parallel", "output", "reasoning"))]
)
def test_the_shapes_of_whole_conversations_are_valid_requests(name: str) -> None:
    validate_responses(to_responses(from_responses(SHAPES[name])))


def test_what_the_messages_hold() -> None:
    messages = from_responses(SHAPES["reasoning-then-message"] + [CALL, OUTPUT][:0])
    user, assistant = messages
    assert user == Message("user", "One flat white, please.")
    assert assistant.role is Role.ASSISTANT
    reasoning, text = assistant.content  # type: ignore[misc]
    assert reasoning == ReasoningPart(
        "They want coffee.", encrypted="gAAAA", extra={"responses": {"id": "rs_1"}}
    )
    assert text.text == "Coming up."
    assert assistant.metadata["responses"] == {"id": "msg_2", "status": "completed"}


def test_a_run_of_reasoning_and_calls_is_one_assistant_message_then_its_results() -> None:
    messages = from_responses(SHAPES["reasoning-empty-summary-then-calls"])
    assert [m.role for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c.id for c in messages[1].tool_calls] == ["call_1", "call_2"]
    assert [m.tool_call_id for m in messages[2:]] == ["call_1", "call_2"]


def test_a_call_with_its_output() -> None:
    _, assistant, tool = from_responses(SHAPES["function-call-with-id-status"])
    assert assistant.content is None
    assert assistant.tool_calls == (
        ToolCall(
            "call_1", "add_item", "{}", extra={"responses": {"id": "fc_1", "status": "completed"}}
        ),
    )
    assert tool == Message(
        "tool",
        '{"ok": true}',
        tool_call_id="call_1",
        metadata={"responses": {"id": "fco_1", "status": "completed"}},
    )


def test_parts_map_to_zerda_parts() -> None:
    (image,) = from_responses(SHAPES["input-image-url-detail"])[0].content  # type: ignore[misc]
    assert image == ImagePart("https://x.test/a.png", detail="low")
    (file,) = from_responses(SHAPES["input-file-data"])[0].content  # type: ignore[misc]
    assert file == FilePart(PDF, filename="menu.pdf")
    (linked,) = from_responses(SHAPES["input-file-url"])[0].content  # type: ignore[misc]
    assert linked == FilePart(url="https://x.test/menu.pdf", extra={"responses": {"detail": "low"}})


# -- messages from elsewhere -----------------------------------------------------------------


def test_messages_from_other_formats_become_items_the_api_takes() -> None:
    messages = [
        Message("system", "Be brief.", name="rules"),
        Message(
            "user",
            (
                TextPart("Look at these"),
                ImagePart(PNG, detail="high"),
                ImagePart("data:image/bmp;base64,Qk0="),  # a type OpenAI does not read
                ImagePart("gs://bucket/a.png", media_type="image/png"),
                ImagePart(None, file_id="file-3"),
                AudioPart("UklGRg==", "wav"),  # Responses input has no audio
                FilePart(PDF, filename="a.pdf"),
                FilePart(url="https://x.test/b.pdf"),
                FilePart(
                    url="https://generativelanguage.googleapis.com/v1beta/files/x",
                    media_type="application/pdf",
                    extra={"gemini": {"_file_data": True}},
                ),
            ),
            name="ada",
        ),
        Message(
            "assistant",
            (
                ReasoningPart("Anthropic thinking", signature="sig", extra={"anthropic": {}}),
                ReasoningPart("Gemini thought", extra={"gemini": {}}),
                TextPart("Checking."),
            ),
            tool_calls=[ToolCall("toolu_1", "look", '{"q": 1}')],
        ),
        Message("tool", (TextPart("found"), ImagePart(PNG)), tool_call_id="toolu_1"),
        Message("developer", "Stay on topic."),
    ]
    items = to_responses(messages)
    validate_responses(items)
    assert items == [
        {"type": "message", "role": "system", "content": "Be brief."},
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "Look at these"},
                {"type": "input_image", "image_url": PNG, "detail": "high"},
                {"type": "input_image", "file_id": "file-3"},
                {"type": "input_file", "file_data": PDF, "filename": "a.pdf"},
                {"type": "input_file", "file_url": "https://x.test/b.pdf"},
            ],
        },
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": "Checking."}],
        },
        {"type": "function_call", "call_id": "toolu_1", "name": "look", "arguments": '{"q": 1}'},
        {
            "type": "function_call_output",
            "call_id": "toolu_1",
            "output": [
                {"type": "input_text", "text": "found"},
                {"type": "input_image", "image_url": PNG},
            ],
        },
        {"type": "message", "role": "developer", "content": "Stay on topic."},
    ]


def test_a_message_with_nothing_the_api_takes_is_left_out() -> None:
    assert to_responses([Message("user", (AudioPart("UklGRg==", "wav"),))]) == []
    assert to_responses([Message("tool", (AudioPart("UklGRg==", "wav"),), tool_call_id="c")]) == [
        {"type": "function_call_output", "call_id": "c", "output": ""}
    ]


def test_reasoning_without_its_id_cannot_be_sent() -> None:
    lost = ReasoningPart("thought", extra={"responses": {}})
    assert to_responses([Message("assistant", (lost, TextPart("Hi")))]) == [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hi"}]}
    ]


def test_reasoning_alone_is_not_sent() -> None:
    """The API wants a reasoning item followed by the item it led to."""
    thought = ReasoningPart("hm", encrypted="gAAA", extra={"responses": {"id": "rs_1"}})
    assert to_responses([Message("assistant", (thought,))]) == []
    assert [i["type"] for i in to_responses([Message("assistant", (thought, TextPart("Hi")))])] == [
        "reasoning",
        "message",
    ]


def test_a_stale_layout_falls_back_to_the_default_one() -> None:
    messages = from_responses(SHAPES["interleaved-run"])
    assistant = messages[1]
    assert "_items" in assistant.metadata["responses"]
    edited = Message(
        "assistant",
        assistant.content,
        tool_calls=assistant.tool_calls[:1],
        metadata=assistant.metadata,
    )
    items = to_responses([edited])
    assert [i["type"] for i in items] == ["reasoning", "reasoning", "message", "function_call"]


def test_the_output_does_not_alias_the_messages() -> None:
    messages = from_responses(SHAPES["assistant-output-message"])
    items = to_responses(messages)
    items[1]["content"][0]["annotations"].append({"type": "url_citation"})
    items[1]["id"] = "changed"
    assert to_responses(messages) == SHAPES["assistant-output-message"]


def test_only_messages_are_converted() -> None:
    with pytest.raises(InvalidMessageError, match=r"messages\[0\] must be a Message, got dict"):
        to_responses([{"role": "user", "content": "hi"}])  # type: ignore[list-item]


# -- bad input -------------------------------------------------------------------------------

BAD: list[Any] = [
    pytest.param("hi", r"must be a list of items, got str", id="a-string"),
    pytest.param({"role": "user"}, r"must be a list of items, got dict", id="a-dict"),
    pytest.param([3], r"items\[0\]: must be an object", id="not-an-object"),
    pytest.param([{"content": "x"}], r"items\[0\]: has neither 'type' nor 'role'", id="no-type"),
    pytest.param(
        [{"type": "web_search_call", "id": "ws_1"}],
        r"items\[0\]: item type 'web_search_call' has no place .* the types are message",
        id="unknown-type",
    ),
    pytest.param(
        [{"role": "tool", "content": "x"}],
        r"items\[0\]: a message's role is one of user, assistant, system, developer, got 'tool'",
        id="bad-role",
    ),
    pytest.param(
        [{"role": "user", "content": []}],
        r"items\[0\]\.content: is an empty list",
        id="empty-content",
    ),
    pytest.param(
        [{"role": "user", "content": {"text": "x"}}],
        r"items\[0\]\.content: must be a list, got dict",
        id="content-dict",
    ),
    pytest.param(
        [{"role": "user", "content": [{"type": "input_video", "url": "x"}]}],
        r"items\[0\]\.content\[0\]: unknown content part type 'input_video'; the types are",
        id="unknown-part",
    ),
    pytest.param(
        [{"role": "user", "content": [{"type": "input_text", "text": 5}]}],
        r"items\[0\]\.content\[0\]: 'text' must be a string, got 5",
        id="text-not-string",
    ),
    pytest.param(
        [{"role": "user", "content": [{"type": "input_image", "detail": "low"}]}],
        r"items\[0\]\.content\[0\]: an image part needs a url",
        id="image-without-source",
    ),
    pytest.param(
        [{"type": "function_call", "name": "f", "arguments": "{}"}],
        r"items\[0\]: 'call_id' must be a non-empty string, got None",
        id="call-without-id",
    ),
    pytest.param(
        [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}],
        r"items\[0\]: 'arguments' must be a string",
        id="arguments-object",
    ),
    pytest.param(
        [{"type": "function_call_output", "call_id": "c", "output": 5}],
        r"items\[0\]: 'output' must be a string or a list of parts, got 5",
        id="output-number",
    ),
    pytest.param(
        [{"type": "reasoning", "id": "rs_1"}],
        r"items\[0\]: a reasoning item needs 'summary'",
        id="reasoning-without-summary",
    ),
    pytest.param(
        [USER, {"type": "reasoning", "id": "rs_1", "summary": [], "status": object()}],
        r"items\[1\]: .*extra must be JSON-serializable",
        id="not-json",
    ),
]


@pytest.mark.parametrize(("items", "match"), BAD)
def test_bad_items_are_refused_with_a_clear_error(items: object, match: str) -> None:
    with pytest.raises(InvalidMessageError, match=match):
        from_responses(items)  # type: ignore[arg-type]
