"""Gemini contents <-> Messages: every part shape round trips in either spelling, calls without
ids get stable made-up ids that are never sent back, any context becomes a request Gemini
takes, and bad payloads get clear errors."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from _validators import validate_gemini
from zerda.errors import InvalidMessageError
from zerda.formats import from_gemini, to_gemini
from zerda.messages import Message, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart

JPEG = "/9j/4AAQSkZJRg=="
HI = {"role": "user", "parts": [{"text": "Hi"}]}
CALL = {"functionCall": {"id": "fc_1", "name": "get_weather", "args": {"city": "Paris"}}}
RESPONSE = {"functionResponse": {"id": "fc_1", "name": "get_weather", "response": {"temp": 21}}}


def _model(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "model", "parts": list(parts)}


def _user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "parts": list(parts)}


# Each documented part shape (the Gemini API reference; google-genai's types).
SHAPES: dict[str, dict[str, Any]] = {
    "text": {"contents": [HI]},
    "system-instruction": {
        "system_instruction": {"parts": [{"text": "You are a barista."}]},
        "contents": [HI],
    },
    "system-instruction-camel-case-parts-role": {
        "systemInstruction": {"role": "system", "parts": [{"text": "One."}, {"text": "Two."}]},
        "contents": [HI],
    },
    "no-role": {"contents": [{"parts": [{"text": "Hi"}]}]},
    "image-inline": {
        "contents": [
            _user(
                {"text": "What is this?"},
                {"inline_data": {"mime_type": "image/jpeg", "data": JPEG}},
            )
        ]
    },
    "image-inline-camel-case": {
        "contents": [_user({"inlineData": {"mimeType": "image/jpeg", "data": JPEG}})]
    },
    "audio-inline": {
        "contents": [
            _user(
                {"inline_data": {"mime_type": "audio/wav", "data": "UklGRg=="}},
                {"inline_data": {"mime_type": "audio/mpeg", "data": "SUQz"}},
            )
        ]
    },
    "pdf-inline-display-name": {
        "contents": [
            _user(
                {
                    "inline_data": {
                        "mime_type": "application/pdf",
                        "data": "JVBERi0=",
                        "display_name": "menu.pdf",
                    }
                }
            )
        ]
    },
    "file-data": {
        "contents": [
            _user(
                {
                    "file_data": {
                        "mime_type": "image/png",
                        "file_uri": "https://generativelanguage.googleapis.com/v1beta/files/a",
                    }
                },
                {"fileData": {"mimeType": "video/mp4", "fileUri": "gs://bucket/clip.mp4"}},
                {"file_data": {"file_uri": "https://www.youtube.com/watch?v=9hE5-98ZeCg"}},
            )
        ]
    },
    "video-metadata": {
        "contents": [
            _user(
                {
                    "file_data": {"mime_type": "video/mp4", "file_uri": "gs://b/c.mp4"},
                    "video_metadata": {"start_offset": "10s"},
                }
            )
        ]
    },
    "model-text": {"contents": [HI, _model({"text": "Hello!"})]},
    "model-texts": {"contents": [HI, _model({"text": "Hello!"}, {"text": "How can I help?"})]},
    "thought": {
        "contents": [
            HI,
            _model(
                {"text": "A greeting.", "thought": True, "thoughtSignature": "CiQB"},
                {"text": "Hello!"},
            ),
        ]
    },
    "thought-without-signature": {
        "contents": [HI, _model({"text": "Hmm.", "thought": True}, {"text": "Hello!"})]
    },
    "signature-on-empty-text": {
        "contents": [HI, _model({"text": "Hello!"}, {"text": "", "thoughtSignature": "CiQB"})]
    },
    "call-with-id": {
        "contents": [HI, _model({**CALL, "thoughtSignature": "CiQB"}), _user(RESPONSE)]
    },
    "calls-without-ids": {
        "contents": [
            HI,
            _model(
                {
                    "functionCall": {"name": "get_weather", "args": {"city": "Paris"}},
                    "thoughtSignature": "CiQB",
                },
                {"functionCall": {"name": "get_weather", "args": {"city": "Rome"}}},
            ),
            _user(
                {"functionResponse": {"name": "get_weather", "response": {"output": "sunny"}}},
                {"functionResponse": {"name": "get_weather", "response": {"output": 5}}},
            ),
        ]
    },
    "snake-case-calls": {
        "contents": [
            HI,
            _model(
                {
                    "function_call": {"id": "c", "name": "now", "args": {}},
                    "thought_signature": "CiQB",
                }
            ),
            _user({"function_response": {"id": "c", "name": "now", "response": {"t": "noon"}}}),
        ]
    },
    "call-without-args": {
        "contents": [
            HI,
            _model({"functionCall": {"id": "c", "name": "now"}, "thoughtSignature": "CiQB"}),
            _user({"functionResponse": {"id": "c", "name": "now", "response": {"output": "noon"}}}),
        ]
    },
    "response-id-where-the-call-had-none": {
        "contents": [
            HI,
            _model({"functionCall": {"name": "now"}, "thoughtSignature": "CiQB"}),
            _user({"functionResponse": {"id": "r1", "name": "now", "response": {}}}),
        ]
    },
    "response-extras": {
        "contents": [
            HI,
            _model({**CALL, "thoughtSignature": "CiQB"}),
            _user(
                {
                    "functionResponse": {
                        **RESPONSE["functionResponse"],
                        "will_continue": False,
                        "scheduling": "SILENT",
                    }
                }
            ),
        ]
    },
    "text-and-call-interleaved": {
        "contents": [
            HI,
            _model({"text": "Checking."}, {**CALL, "thoughtSignature": "CiQB"}, {"text": "…"}),
            _user(RESPONSE),
        ]
    },
    "text-then-call": {
        "contents": [
            HI,
            _model({"text": "Checking."}, {**CALL, "thoughtSignature": "CiQB"}),
            _user(RESPONSE),
        ]
    },
    "model-image": {
        "contents": [HI, _model({"inline_data": {"mime_type": "image/png", "data": "iVBO"}})]
    },
    "consecutive-model-contents": {
        "contents": [HI, _model({"text": "One."}), _model({"text": "Two."})]
    },
    "consecutive-user-contents": {"contents": [HI, _user({"text": "Still there?"})]},
    "response-then-user-content": {
        "contents": [
            HI,
            _model({**CALL, "thoughtSignature": "CiQB"}),
            _user(RESPONSE),
            _user({"text": "And tomorrow?"}),
        ]
    },
    "response-and-text-in-one-content": {
        "contents": [
            HI,
            _model({**CALL, "thoughtSignature": "CiQB"}),
            _user(RESPONSE, {"text": "And tomorrow?"}),
        ]
    },
}

# Shapes Gemini refuses (kept losslessly all the same).
NOT_REQUESTS = {"consecutive-model-contents", "response-and-text-in-one-content", "file-data"}


@pytest.mark.parametrize("payload", SHAPES.values(), ids=SHAPES.keys())
def test_every_documented_shape_round_trips(payload: dict[str, Any]) -> None:
    given = copy.deepcopy(payload)
    messages = from_gemini(payload)
    assert to_gemini(messages) == payload
    assert payload == given, "from_gemini changed its input"
    assert from_gemini(to_gemini(messages)) == messages


@pytest.mark.parametrize("name", [n for n in SHAPES if n not in NOT_REQUESTS])
def test_the_documented_shapes_are_valid_requests(name: str) -> None:
    validate_gemini(SHAPES[name])
    validate_gemini(to_gemini(from_gemini(SHAPES[name])))


def test_what_the_messages_hold() -> None:
    user, assistant, tool = from_gemini(SHAPES["call-with-id"])
    assert user == Message("user", "Hi")
    assert assistant.tool_calls == (
        ToolCall(
            "fc_1",
            "get_weather",
            '{"city": "Paris"}',
            extra={"gemini": {"thoughtSignature": "CiQB"}},
        ),
    )
    assert tool.tool_call_id == "fc_1"
    assert tool.content == '{"temp": 21}'
    (thought, text) = from_gemini(SHAPES["thought"])[1].content  # type: ignore[misc]
    assert thought == ReasoningPart("A greeting.", signature="CiQB", extra={"gemini": {}})
    assert text == TextPart("Hello!")


def test_media_parts() -> None:
    (image,) = from_gemini(SHAPES["image-inline-camel-case"])[0].content  # type: ignore[misc]
    assert image.url == f"data:image/jpeg;base64,{JPEG}"  # type: ignore[union-attr]
    wav, mp3 = from_gemini(SHAPES["audio-inline"])[0].content  # type: ignore[misc]
    assert (wav.data, wav.format) == ("UklGRg==", "wav")  # type: ignore[union-attr]
    assert type(mp3) is AudioPart
    assert mp3.format == "mp3"
    stored, video, youtube = from_gemini(SHAPES["file-data"])[0].content  # type: ignore[misc]
    assert type(stored) is ImagePart
    assert stored.media_type == "image/png"
    assert type(video) is FilePart
    assert video.url == "gs://bucket/clip.mp4"
    assert youtube.media_type is None  # type: ignore[union-attr]


def test_calls_without_ids_get_stable_ids_their_responses_share() -> None:
    payload = SHAPES["calls-without-ids"]
    _, assistant, sunny, five = from_gemini(payload)
    first, second = (c.id for c in assistant.tool_calls)
    assert first != second
    assert first.startswith("gemini-")
    assert (sunny.tool_call_id, five.tool_call_id) == (first, second)
    assert (sunny.content, five.content) == ("sunny", '{"output": 5}')
    again = from_gemini(copy.deepcopy(payload))
    assert [c.id for c in again[1].tool_calls] == [first, second], "the same payload, the same ids"
    # Nor does a longer history change the ids of the calls it already had.
    longer = {"contents": [*payload["contents"], _model({"text": "Sunny."})]}
    assert [c.id for c in from_gemini(longer)[1].tool_calls] == [first, second]
    # Made-up ids are not sent back to Gemini, but other providers get them.
    out = to_gemini(from_gemini(payload))
    assert "id" not in out["contents"][1]["parts"][0]["functionCall"]


def test_a_response_without_id_needs_its_call_before_it() -> None:
    lone = {"contents": [_user({"functionResponse": {"name": "f", "response": {}}})]}
    with pytest.raises(
        InvalidMessageError,
        match=r"contents\[0\]\.parts\[0\]\.functionResponse: a "
        r"response to 'f' without an id must stand",
    ):
        from_gemini(lone)
    misnamed = {
        "contents": [
            HI,
            _model({"functionCall": {"name": "f", "args": {}}}),
            _user({"functionResponse": {"name": "g", "response": {}}}),
        ]
    }
    with pytest.raises(InvalidMessageError, match=r"a response to 'g' without an id"):
        from_gemini(misnamed)


def test_a_response_with_an_id_its_call_lacked_pairs_with_its_call() -> None:
    _, call, result = from_gemini(SHAPES["response-id-where-the-call-had-none"])
    assert result.tool_call_id == call.tool_calls[0].id


def test_a_response_with_an_id_stands_alone() -> None:
    lone = {"contents": [_user(RESPONSE)]}
    assert to_gemini(from_gemini(lone)) == lone


# -- any context -----------------------------------------------------------------------------


def test_a_context_from_openai_becomes_a_request_gemini_takes() -> None:
    messages = [
        Message("system", "You take coffee orders."),
        Message("user", "Weather in Paris and Rome?", name="ada"),
        Message("assistant", "Let me look."),
        Message(
            "assistant",
            None,
            tool_calls=[
                ToolCall("call_1", "get_weather", '{"city": "Paris"}'),
                ToolCall("call_2", "get_weather", "oops"),
            ],
        ),
        Message("tool", '{"temp": 21}', tool_call_id="call_2"),
        Message(
            "tool", (TextPart("sunny"), ImagePart("https://x.test/sun.png")), tool_call_id="call_1"
        ),
        Message("developer", "Be brief."),
        Message("user", ""),
        Message("user", "Thanks"),
    ]
    payload = to_gemini(messages)
    validate_gemini(payload)
    assert payload == {
        "system_instruction": {
            "parts": [{"text": "You take coffee orders."}, {"text": "Be brief."}]
        },
        "contents": [
            {"role": "user", "parts": [{"text": "Weather in Paris and Rome?"}]},
            {
                "role": "model",
                "parts": [
                    {"text": "Let me look."},
                    {
                        "functionCall": {
                            "name": "get_weather",
                            "args": {"city": "Paris"},
                            "id": "call_1",
                        },
                        "thoughtSignature": "skip_thought_signature_validator",
                    },
                    {
                        "functionCall": {
                            "name": "get_weather",
                            "args": {"zerda_unparsed_arguments": "oops"},
                            "id": "call_2",
                        }
                    },
                ],
            },
            {
                "role": "user",
                "parts": [
                    {
                        "functionResponse": {
                            "name": "get_weather",
                            "response": {"output": '{"temp": 21}'},
                            "id": "call_2",
                        }
                    },
                    {
                        "functionResponse": {
                            "name": "get_weather",
                            "response": {"output": "sunny"},
                            "id": "call_1",
                        }
                    },
                ],
            },
            {"role": "user", "parts": [{"text": "Thanks"}]},
        ],
    }


def test_media_gemini_cannot_take_is_left_out() -> None:
    messages = [
        Message(
            "user",
            (
                TextPart(""),
                ImagePart("https://x.test/photo.JPG?size=2"),
                ImagePart("https://x.test/photo"),  # no media type to give
                ImagePart(None, file_id="file-1"),
                AudioPart("UklGRg==", "mp3"),
                FilePart("data:application/pdf;base64,JVBERi0="),
                FilePart(url="https://x.test/menu.pdf"),
                FilePart(None, file_id="file-2"),
                ReasoningPart("Anthropic's", signature="s", extra={"anthropic": {}}),
            ),
        ),
    ]
    payload = to_gemini(messages)
    validate_gemini(payload)
    assert payload["contents"] == [
        {
            "role": "user",
            "parts": [
                {
                    "file_data": {
                        "mime_type": "image/jpeg",
                        "file_uri": "https://x.test/photo.JPG?size=2",
                    }
                },
                {"inline_data": {"mime_type": "audio/mp3", "data": "UklGRg=="}},
                {"inline_data": {"mime_type": "application/pdf", "data": "JVBERi0="}},
                {
                    "file_data": {
                        "mime_type": "application/pdf",
                        "file_uri": "https://x.test/menu.pdf",
                    }
                },
            ],
        }
    ]


def test_assistant_messages_before_the_first_user_message_are_left_out() -> None:
    messages = [
        Message("assistant", None, tool_calls=[ToolCall("c1", "greet")]),
        Message("tool", "hello", tool_call_id="c1"),
        Message("user", "Hi"),
    ]
    assert to_gemini(messages) == {"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}


def test_the_output_does_not_alias_the_messages() -> None:
    messages = from_gemini(SHAPES["response-extras"])
    payload = to_gemini(messages)
    payload["contents"][2]["parts"][0]["functionResponse"]["response"]["temp"] = 0
    payload["contents"][1]["parts"][0]["functionCall"]["args"]["city"] = "Lyon"
    assert to_gemini(messages) == SHAPES["response-extras"]


def test_only_messages_are_converted() -> None:
    with pytest.raises(InvalidMessageError, match=r"messages\[0\] must be a Message, got str"):
        to_gemini(["hi"])  # type: ignore[list-item]


# -- bad input -------------------------------------------------------------------------------

BAD: list[Any] = [
    pytest.param([HI], r"the Gemini payload: must be an object", id="a-list"),
    pytest.param(
        {"contents": [HI], "generationConfig": {}},
        r"has keys \['generationConfig'\]; from_gemini reads",
        id="request-parameters",
    ),
    pytest.param({}, r"contents: must be a list, got NoneType", id="no-contents"),
    pytest.param(
        {"system_instruction": "Be kind.", "contents": []},
        r"system_instruction: must be an object",
        id="system-string",
    ),
    pytest.param(
        {"system_instruction": {"parts": []}, "systemInstruction": {"parts": []}, "contents": []},
        r"has both 'system_instruction' and 'systemInstruction'",
        id="both-spellings",
    ),
    pytest.param(
        {"contents": [{"role": "user", "parts": [{"text": "x"}], "id": 1}]},
        r"contents\[0\]: has keys \['id'\]",
        id="content-extra-key",
    ),
    pytest.param(
        {"contents": [{"role": "function", "parts": [{"text": "x"}]}]},
        r"contents\[0\]: role must be 'user' or 'model', got 'function'",
        id="bad-role",
    ),
    pytest.param({"contents": [_user()]}, r"contents\[0\]\.parts: is empty", id="no-parts"),
    pytest.param(
        {"contents": [_user({"executable_code": {"code": "1"}})]},
        r"contents\[0\]\.parts\[0\]: is not a part Zerda reads",
        id="unknown-part",
    ),
    pytest.param(
        {"contents": [HI, _model(RESPONSE)]},
        r"contents\[1\]\.parts\[0\]: a functionResponse belongs in a user content",
        id="response-from-model",
    ),
    pytest.param(
        {"contents": [_user(CALL)]},
        r"contents\[0\]\.parts\[0\]: a functionCall belongs in a model content",
        id="call-from-user",
    ),
    pytest.param(
        {"contents": [HI, _model({"functionCall": {"name": "f", "args": [1]}})]},
        r"contents\[1\]\.parts\[0\]\.functionCall: 'args' must be an object, got list",
        id="args-list",
    ),
    pytest.param(
        {"contents": [_user({"functionResponse": {"id": "c", "name": "f", "response": "x"}})]},
        r"functionResponse\.response: must be a JSON object, got str",
        id="response-string",
    ),
    pytest.param(
        {"contents": [_user({"inline_data": {"data": JPEG}})]},
        r"contents\[0\]\.parts\[0\]\.inline_data: needs 'mime_type'",
        id="inline-without-mime",
    ),
    pytest.param(
        {"contents": [_user({"file_data": {"mime_type": "image/png"}})]},
        r"contents\[0\]\.parts\[0\]\.file_data: needs 'file_uri'",
        id="file-without-uri",
    ),
    pytest.param(
        {"contents": [_user({"text": ["a"]})]},
        r"contents\[0\]\.parts\[0\]: 'text' must be a string, got list",
        id="text-list",
    ),
]


@pytest.mark.parametrize(("payload", "match"), BAD)
def test_bad_payloads_are_refused_with_a_clear_error(payload: object, match: str) -> None:
    with pytest.raises(InvalidMessageError, match=match):
        from_gemini(payload)  # type: ignore[arg-type]
