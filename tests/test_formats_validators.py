"""The request validators of ``_validators.py`` refuse what each provider refuses, saying where
and why, and accept the requests the providers' docs show."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from _validators import (
    validate_anthropic,
    validate_gemini,
    validate_openai_chat,
    validate_responses,
)


def _call(call_id: str = "call_1", name: str = "add_item") -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}


def _calls(*call_ids: str) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [_call(i) for i in call_ids]}


def _tool(call_id: str = "call_1") -> dict[str, Any]:
    return {"role": "tool", "content": "ok", "tool_call_id": call_id}


USER = {"role": "user", "content": "A latte"}
SYSTEM = {"role": "system", "content": "You take coffee orders."}

CHAT_GOOD = [
    SYSTEM,
    {"role": "developer", "content": [{"type": "text", "text": "Be brief."}], "name": "rules"},
    {
        "role": "user",
        "content": [
            {"type": "text", "text": "This one"},
            {
                "type": "image_url",
                "image_url": {"url": "data:image/png;base64,iVBO", "detail": "low"},
            },
            {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
            {"type": "file", "file": {"file_id": "file-1"}},
        ],
    },
    {"role": "assistant", "content": "", "tool_calls": [_call("call_1"), _call("call_2")]},
    _tool("call_2"),
    _tool("call_1"),
    SYSTEM,
    {"role": "assistant", "content": [{"type": "text", "text": "Added."}]},
]

CHAT_BAD: list[Any] = [
    # issue 13's example: a result after the user interjected, the call evicted
    pytest.param(
        [{"role": "user", "content": "wait, cancel"}, _tool()],
        r"messages\[1\]: a tool message must answer a call",
        id="orphan-result",
    ),
    pytest.param(
        [USER, _calls("call_1"), {"role": "user", "content": "wait"}, _tool()],
        r"messages\[2\]: the calls \['call_1'\] of an earlier assistant message",
        id="interjection",
    ),
    pytest.param(
        [USER, _calls("call_1", "call_2"), _tool("call_1")],
        r"messages: the calls \['call_2'\] have no tool message",
        id="unanswered",
    ),
    pytest.param(
        [USER, _calls("call_1"), _tool(), _tool()],
        r"messages\[3\]: a tool message must answer a call",
        id="two-results",
    ),
    pytest.param(
        [USER, _calls("call_1"), _tool(), _calls("call_1"), _tool()],
        r"messages\[3\]\.tool_calls\[0\]: the call id 'call_1' is used twice",
        id="shared-call-id",
    ),
    pytest.param(
        [SYSTEM, {"role": "assistant", "content": "Hi"}],
        r"messages\[1\]: the first non-system message must be a user message",
        id="assistant-first",
    ),
    pytest.param(
        [{"role": "function", "content": "x", "name": "f"}],
        r"messages\[0\]: role must be one of",
        id="function-role",
    ),
    pytest.param(
        [{"role": "user", "content": "x", "metadata": {}}],
        r"messages\[0\]: has fields the API does not know: \['metadata'\]",
        id="unknown-key",
    ),
    pytest.param(
        [{"role": "tool", "content": "x", "tool_call_id": "c", "name": "f"}],
        r"has fields the API does not know: \['name'\]",
        id="tool-name",
    ),
    pytest.param(
        [{"role": "user", "content": []}],
        r"messages\[0\]\.content: an array of parts must not be empty",
        id="empty-parts",
    ),
    pytest.param(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": "data:image/bmp;base64,Qk0="}}
                ],
            }
        ],
        r"an image is an http\(s\) URL or a data:image/\(png\|jpeg\|gif\|webp\)",
        id="bmp",
    ),
    pytest.param(
        [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "gs://b/a.png"}}],
            }
        ],
        r"an image is an http\(s\) URL",
        id="gs-url",
    ),
    pytest.param(
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_audio", "input_audio": {"data": "T2dn", "format": "ogg"}}
                ],
            }
        ],
        r"audio format is wav or mp3",
        id="ogg",
    ),
    pytest.param(
        [{"role": "user", "content": [{"type": "file", "file": {"filename": "a"}}]}],
        r"a file part needs file_data or file_id",
        id="file-nothing",
    ),
    pytest.param(
        [
            {
                "role": "system",
                "content": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}],
            }
        ],
        r"a system message takes parts of type \('text',\)",
        id="system-image",
    ),
    pytest.param(
        [USER, {"role": "assistant", "content": None, "tool_calls": []}],
        r"tool_calls must not be empty",
        id="no-calls",
    ),
    pytest.param(
        [USER, {"role": "assistant", "content": None}],
        r"an assistant message without tool_calls needs content",
        id="no-content",
    ),
    pytest.param([USER, _calls("c" * 41)], r"a call id has at most 40 characters", id="long-id"),
    pytest.param(
        [{"role": "user", "content": "x", "name": "Ada Lovelace"}],
        r"name must match",
        id="name-with-space",
    ),
    pytest.param(
        [
            USER,
            {"role": "assistant", "content": None, "tool_calls": [{**_call(), "type": "custom"}]},
        ],
        r"a function call's type is 'function'",
        id="call-type",
    ),
]

RESPONSES_GOOD = [
    {"role": "developer", "content": "Be brief."},
    {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "This"},
            {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "original"},
            {"type": "input_file", "file_id": "file-1"},
        ],
    },
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
    {
        "type": "function_call",
        "call_id": "c1",
        "name": "f",
        "arguments": "{}",
        "id": "fc_1",
        "status": "completed",
    },
    {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [{"type": "input_text", "text": "done"}],
    },
    {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "ok"}]},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_1",
        "status": "completed",
        "content": [
            {"type": "output_text", "text": "Done.", "annotations": []},
            {"type": "refusal", "refusal": "Not that."},
        ],
    },
]
CALL = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}
OUTPUT = {"type": "function_call_output", "call_id": "c1", "output": "ok"}
RESPONSES_BAD: list[Any] = [
    pytest.param(
        [OUTPUT, CALL],
        r"input\[0\]: no function_call before it has call_id 'c1'",
        id="output-before-call",
    ),
    pytest.param(
        [{"role": "user", "content": "x"}, CALL],
        r"input: the function calls \['c1'\] have no function_call_output",
        id="call-without-output",
    ),
    pytest.param(
        [CALL, CALL, OUTPUT], r"input\[1\]: the call_id 'c1' is used twice", id="shared-call-id"
    ),
    pytest.param(
        [CALL, OUTPUT, OUTPUT], r"input\[2\]: a second output for call 'c1'", id="two-outputs"
    ),
    pytest.param(
        [{"type": "reasoning", "id": "rs_1", "summary": []}, {"role": "user", "content": "x"}],
        r"input\[0\]: a reasoning item must be followed by the item it led to",
        id="reasoning-before-user",
    ),
    pytest.param(
        [{"type": "reasoning", "id": "rs_1", "summary": []}],
        r"a reasoning item must be followed",
        id="reasoning-last",
    ),
    pytest.param(
        [{"type": "reasoning", "id": "rs_1"}, CALL, OUTPUT],
        r"input\[0\]\.summary: must be an array",
        id="reasoning-without-summary",
    ),
    pytest.param(
        [{"role": "assistant", "content": [{"type": "input_text", "text": "x"}]}],
        r"part type must be one of \('output_text', 'refusal'\), got 'input_text'",
        id="assistant-input-text",
    ),
    pytest.param(
        [{"role": "user", "content": [{"type": "output_text", "text": "x"}]}],
        r"got 'output_text'",
        id="user-output-text",
    ),
    pytest.param([{"role": "tool", "content": "x"}], r"role is one of", id="tool-role"),
    pytest.param(
        [{"type": "item_reference", "id": "x"}], r"item type must be one of", id="unknown-item"
    ),
    pytest.param(
        [{"role": "user", "content": [{"type": "input_image", "detail": "low"}]}],
        r"an input_image needs image_url or file_id",
        id="image-nothing",
    ),
    pytest.param(
        [
            {
                "role": "user",
                "content": [{"type": "input_image", "file_id": "f", "detail": "medium"}],
            }
        ],
        r"detail is one of",
        id="bad-detail",
    ),
    pytest.param(
        [{"role": "user", "content": []}], r"an array of parts must not be empty", id="empty-parts"
    ),
    pytest.param([{**CALL, "status": "done"}, OUTPUT], r"status is one of", id="bad-status"),
    pytest.param(
        [{"role": "user", "content": "x", "name": "ada"}],
        r"has fields the API does not know: \['name'\]",
        id="name",
    ),
]

USE = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "ok"}
HI = {"role": "user", "content": "Hi"}
ANTHROPIC_GOOD = {
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "messages": [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Hi"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iV"},
                },
                {
                    "type": "document",
                    "source": {"type": "text", "media_type": "text/plain", "data": "notes"},
                    "title": "n",
                },
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hm", "signature": "sig"},
                {"type": "redacted_thinking", "data": "enc"},
                {"type": "text", "text": "Checking."},
                USE,
            ],
        },
        {"role": "user", "content": [{**RESULT, "is_error": True}, {"type": "text", "text": "?"}]},
        {"role": "assistant", "content": ""},
    ],
}
ANTHROPIC_BAD: list[Any] = [
    pytest.param(
        {"messages": [{"role": "system", "content": "x"}, HI]},
        r"messages\[0\]: role is 'user' or 'assistant', got 'system'",
        id="system-role",
    ),
    pytest.param(
        {"messages": [{"role": "assistant", "content": "Hi"}, HI]},
        r"messages\[0\]: the first message must use the user role",
        id="assistant-first",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": ""}]},
        r"messages\[0\]: a text block must hold non-whitespace text",
        id="empty-string",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": [{"type": "text", "text": " \n"}]}]},
        r"messages\[0\]\.content\[0\]: a text block must hold non-whitespace text",
        id="whitespace-block",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": []}]},
        r"messages\[0\]: content must not be empty",
        id="empty-user",
    ),
    pytest.param(
        {"messages": [HI, {"role": "assistant", "content": []}, HI]},
        r"messages\[1\]: content must not be empty",
        id="empty-assistant-not-final",
    ),
    pytest.param(
        {"messages": [HI, {"role": "assistant", "content": "Sure "}]},
        r"a final assistant message must not end with whitespace",
        id="trailing-whitespace",
    ),
    pytest.param(
        {"messages": [HI, {"role": "assistant", "content": [USE]}, HI]},
        r"messages\[2\]: the tool_use blocks \['toolu_1'\] of the previous message have "
        r"no tool_result",
        id="interjection",
    ),
    pytest.param(
        {"messages": [HI, {"role": "assistant", "content": [USE]}]},
        r"messages: the tool_use blocks \['toolu_1'\] of the last message",
        id="unanswered",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": [RESULT]}]},
        r"tool_result 'toolu_1' answers no tool_use of the previous message",
        id="orphan-result",
    ),
    pytest.param(
        {
            "messages": [
                HI,
                {"role": "assistant", "content": [USE]},
                {"role": "user", "content": [{"type": "text", "text": "x"}, RESULT]},
            ]
        },
        r"tool_result blocks must come first",
        id="text-before-result",
    ),
    pytest.param(
        {
            "messages": [
                HI,
                {"role": "assistant", "content": [{**USE, "id": "call 1"}]},
                {"role": "user", "content": [{**RESULT, "tool_use_id": "call 1"}]},
            ]
        },
        r"a tool_use id matches",
        id="id-pattern",
    ),
    pytest.param(
        {"messages": [HI, {"role": "assistant", "content": [{**USE, "input": "x"}]}]},
        r"input is an object",
        id="input-string",
    ),
    pytest.param(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/bmp", "data": "Qk0="},
                        }
                    ],
                }
            ]
        },
        r"an image's media_type is one of",
        id="bmp",
    ),
    pytest.param(
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "document",
                            "source": {
                                "type": "base64",
                                "media_type": "text/plain",
                                "data": "aGk=",
                            },
                        }
                    ],
                }
            ]
        },
        r"a base64 document is a PDF",
        id="base64-text",
    ),
    pytest.param(
        {
            "messages": [
                HI,
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]},
            ]
        },
        r"signature must be a non-empty string",
        id="thinking-without-signature",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": [USE]}]},
        r"block type must be one of \('text', 'image', 'document', 'tool_result'\)",
        id="tool-use-from-user",
    ),
    pytest.param(
        {"messages": [HI, {"role": "assistant", "content": [USE, USE]}]},
        r"tool_use id 'toolu_1' used twice",
        id="shared-id",
    ),
    pytest.param(
        {
            "messages": [
                HI,
                {"role": "assistant", "content": [USE]},
                {"role": "user", "content": [{**RESULT, "content": " "}]},
            ]
        },
        r"a tool_result's text must hold non-whitespace text",
        id="blank-result",
    ),
    pytest.param(
        {"system": "  ", "messages": [HI]},
        r"system: the system prompt must hold",
        id="blank-system",
    ),
    pytest.param(
        {"messages": [{"role": "user", "content": "x", "name": "ada"}]},
        r"has fields the API does not know: \['name'\]",
        id="name",
    ),
]

CALL_PART = {"functionCall": {"id": "c1", "name": "f", "args": {}}, "thoughtSignature": "CiQB"}
RESPONSE_PART = {"functionResponse": {"id": "c1", "name": "f", "response": {"output": "ok"}}}
GEM_HI = {"role": "user", "parts": [{"text": "Hi"}]}
GEMINI_GOOD = {
    "systemInstruction": {"parts": [{"text": "Be brief."}]},
    "contents": [
        {
            "parts": [
                {"text": "Hi"},
                {"inlineData": {"mimeType": "image/png", "data": "iV"}},
                {
                    "file_data": {"mime_type": "video/mp4", "file_uri": "gs://b/c.mp4"},
                    "video_metadata": {"fps": 1},
                },
            ]
        },
        {
            "role": "model",
            "parts": [
                {"text": "hm", "thought": True, "thoughtSignature": "c2ln"},
                CALL_PART,
                {"functionCall": {"id": "c2", "name": "g"}},
            ],
        },
        {
            "role": "user",
            "parts": [
                {"functionResponse": {"id": "c2", "name": "g", "response": {}}},
                RESPONSE_PART,
            ],
        },
        {"role": "model", "parts": [{"text": "Done."}, {"text": "", "thoughtSignature": "c2ln"}]},
        {"role": "user", "parts": [{"text": "Thanks"}]},
    ],
}
GEMINI_BAD: list[Any] = [
    pytest.param(
        {"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]},
        r"contents\[0\]: role is 'user' or 'model', got 'assistant'",
        id="assistant-role",
    ),
    pytest.param(
        {"contents": [{"role": "user", "parts": []}]},
        r"contents\[0\]\.parts: a content holds at least one part",
        id="no-parts",
    ),
    pytest.param(
        {
            "contents": [
                {"parts": [{"text": "x", "inline_data": {"mime_type": "image/png", "data": "iV"}}]}
            ]
        },
        r"a part holds exactly one kind of data",
        id="two-data-fields",
    ),
    pytest.param(
        {"contents": [{"parts": [{"text": "x", "cache_control": {}}]}]},
        r"has fields Gemini does not know: \['cache_control'\]",
        id="unknown-field",
    ),
    pytest.param(
        {"contents": [{"parts": [{"text": ""}]}]}, r"a text part must not be empty", id="empty-text"
    ),
    pytest.param(
        {"contents": [{"role": "model", "parts": [CALL_PART]}]},
        r"contents\[0\]: a function call turn must come right after a user turn",
        id="call-first",
    ),
    pytest.param(
        {
            "contents": [
                GEM_HI,
                {"role": "model", "parts": [{"text": "Let me see"}]},
                {"role": "model", "parts": [CALL_PART]},
                {"role": "user", "parts": [RESPONSE_PART]},
            ]
        },
        r"contents\[2\]: a function call turn must come right after a user turn",
        id="call-after-model",
    ),
    pytest.param(
        {"contents": [GEM_HI, {"role": "user", "parts": [RESPONSE_PART]}]},
        r"a function response turn must come right after a function call turn",
        id="orphan-response",
    ),
    pytest.param(
        {
            "contents": [
                GEM_HI,
                {"role": "model", "parts": [CALL_PART, CALL_PART]},
                {"role": "user", "parts": [RESPONSE_PART]},
            ]
        },
        r"1 function responses answer 2 function calls",
        id="count",
    ),
    pytest.param(
        {
            "contents": [
                GEM_HI,
                {"role": "model", "parts": [CALL_PART]},
                {
                    "role": "user",
                    "parts": [{"functionResponse": {"id": "c1", "name": "g", "response": {}}}],
                },
            ]
        },
        r"do not name the calls",
        id="names",
    ),
    pytest.param(
        {
            "contents": [
                GEM_HI,
                {"role": "model", "parts": [CALL_PART]},
                {
                    "role": "user",
                    "parts": [{"functionResponse": {"id": "c9", "name": "f", "response": {}}}],
                },
            ]
        },
        r"the responses' ids \['c9'\] are not the calls' ids \['c1'\]",
        id="ids",
    ),
    pytest.param(
        {
            "contents": [
                GEM_HI,
                {"role": "model", "parts": [CALL_PART]},
                {"role": "user", "parts": [RESPONSE_PART, {"text": "more"}]},
            ]
        },
        r"a function response turn holds function responses only",
        id="mixed",
    ),
    pytest.param(
        {"contents": [GEM_HI, {"role": "model", "parts": [CALL_PART]}, GEM_HI]},
        r"contents\[1\]: the function calls have no function response turn",
        id="unanswered",
    ),
    pytest.param(
        {"contents": [GEM_HI, {"role": "model", "parts": [CALL_PART]}]},
        r"contents\[1\]: the function calls have no function response turn",
        id="unanswered-last",
    ),
    pytest.param(
        {
            "contents": [
                GEM_HI,
                {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
                {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {}}}]},
            ]
        },
        r"contents\[1\]: the first function call of the current turn's step carries "
        r"a thoughtSignature",
        id="unsigned-current-turn",
    ),
    pytest.param(
        {"contents": [{"parts": [{"file_data": {"file_uri": "gs://b/c.mp4"}}]}]},
        r"mime_type must be a non-empty string",
        id="file-without-mime",
    ),
    pytest.param(
        {
            "contents": [
                GEM_HI,
                {"role": "model", "parts": [CALL_PART]},
                {
                    "role": "user",
                    "parts": [{"functionResponse": {"id": "c1", "name": "f", "response": "ok"}}],
                },
            ]
        },
        r"response is an object",
        id="response-string",
    ),
    pytest.param(
        {"contents": [{"parts": [CALL_PART]}]},
        r"a functionCall belongs to a model content",
        id="call-from-user",
    ),
    pytest.param(
        {"contents": [{"parts": [{"text": "x", "thought": True}]}]},
        r"thoughts are the model's",
        id="user-thought",
    ),
    pytest.param(
        {
            "system_instruction": {"parts": [{"text": "a"}]},
            "systemInstruction": {"parts": [{"text": "b"}]},
            "contents": [],
        },
        r"has both 'system_instruction' and 'systemInstruction'",
        id="both-spellings",
    ),
    pytest.param(
        {
            "system_instruction": {
                "parts": [{"inline_data": {"mime_type": "image/png", "data": "iV"}}]
            },
            "contents": [],
        },
        r"the system instruction holds text parts",
        id="system-image",
    ),
]

Validator = Callable[[Any], None]


@pytest.mark.parametrize(
    ("validate", "request_"),
    [
        (validate_openai_chat, CHAT_GOOD),
        (validate_responses, RESPONSES_GOOD),
        (validate_anthropic, ANTHROPIC_GOOD),
        (validate_gemini, GEMINI_GOOD),
        (validate_openai_chat, []),
        (validate_responses, []),
        (validate_anthropic, {"messages": []}),
        (validate_gemini, {"contents": []}),
    ],
    ids=[
        "chat",
        "responses",
        "anthropic",
        "gemini",
        "chat-0",
        "responses-0",
        "anthropic-0",
        "gemini-0",
    ],
)
def test_requests_the_docs_show_are_accepted(validate: Validator, request_: Any) -> None:
    validate(request_)


def _cases(validate: Validator, cases: list[Any]) -> list[Any]:
    return [
        pytest.param(validate, *case.values, id=f"{validate.__name__[9:]}-{case.id}")
        for case in cases
    ]


@pytest.mark.parametrize(
    ("validate", "request_", "match"),
    _cases(validate_openai_chat, CHAT_BAD)
    + _cases(validate_responses, RESPONSES_BAD)
    + _cases(validate_anthropic, ANTHROPIC_BAD)
    + _cases(validate_gemini, GEMINI_BAD),
)
def test_requests_a_provider_refuses_are_refused_saying_why(
    validate: Validator, request_: Any, match: str
) -> None:
    with pytest.raises(AssertionError, match=match):
        validate(request_)
