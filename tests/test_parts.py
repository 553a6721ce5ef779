"""Content parts: OpenAI Chat content arrays in and out unchanged, Zerda's dict form lossless,
and clear errors for parts a careless caller sends."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerda import InvalidMessageError, Message, Role, ToolCall
from zerda.messages import to_openai
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart, part_from_dict

PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJ"
PDF = "data:application/pdf;base64,JVBERi0xLjQK"

# Every content part shape of OpenAI Chat's user messages, as its API reference gives them.
OPENAI_PARTS: dict[str, dict[str, Any]] = {
    "text": {"type": "text", "text": "What is on this receipt?"},
    "image-url": {"type": "image_url", "image_url": {"url": "https://example.com/r.png"}},
    "image-detail": {"type": "image_url", "image_url": {"url": PNG, "detail": "low"}},
    "image-auto": {"type": "image_url", "image_url": {"url": PNG, "detail": "auto"}},
    "audio-wav": {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
    "audio-mp3": {"type": "input_audio", "input_audio": {"data": "SUQz", "format": "mp3"}},
    "file-data": {"type": "file", "file": {"file_data": PDF, "filename": "receipt.pdf"}},
    "file-id": {"type": "file", "file": {"file_id": "file-abc123"}},
}


@pytest.mark.parametrize("name", sorted(OPENAI_PARTS))
def test_each_openai_part_comes_back_unchanged(name: str) -> None:
    d = {"role": "user", "content": [OPENAI_PARTS[name]]}
    message = Message.from_openai(d)
    assert isinstance(message.content, tuple)
    assert message.to_openai() == d
    assert Message.from_dict(message.to_dict()) == message


def test_a_content_array_of_every_part_comes_back_unchanged() -> None:
    d = {"role": "user", "content": list(OPENAI_PARTS.values()), "name": "ana"}
    message = Message.from_openai(d)
    assert [type(p) for p in message.parts] == [
        TextPart,
        ImagePart,
        ImagePart,
        ImagePart,
        AudioPart,
        AudioPart,
        FilePart,
        FilePart,
    ]
    assert message.parts[2] == ImagePart(PNG, detail="low")
    assert message.parts[6] == FilePart(PDF, filename="receipt.pdf")
    assert message.to_openai() == d
    assert to_openai([message]) == [d]


@settings(max_examples=150, deadline=None)
@given(st.lists(st.sampled_from(sorted(OPENAI_PARTS)), min_size=1, max_size=6))
def test_any_openai_content_array_round_trips(names: list[str]) -> None:
    d = {"role": "user", "content": [OPENAI_PARTS[n] for n in names]}
    assert Message.from_openai(d).to_openai() == d


@pytest.mark.parametrize("role", ["system", "developer", "assistant", "tool"])
def test_text_part_arrays_round_trip_on_every_role(role: str) -> None:
    d: dict[str, Any] = {
        "role": role,
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
    }
    if role == "tool":
        d["tool_call_id"] = "c1"
    message = Message.from_openai(d)
    assert message.text == "a\nb"
    assert message.to_openai() == d


ZERDA_PARTS = [
    TextPart("hi", extra={"anthropic": {"cache_control": {"type": "ephemeral"}}}),
    ImagePart(PNG, detail="high", media_type="image/png"),
    ImagePart(None, file_id="file-9"),
    ImagePart(None, file_id="file-9", detail="low", extra={"responses": {"x": 1}}),
    ImagePart("https://example.com/a.png", file_id="file-1"),
    AudioPart("UklGRg==", "wav", extra={"gemini": {"a": [1]}}),
    FilePart(PDF, filename="r.pdf", media_type="application/pdf"),
    FilePart(None, url="https://example.com/r.pdf"),
    FilePart(None, file_id="file-2", filename="notes.txt"),
    ReasoningPart("thinking", signature="sig"),
    ReasoningPart("", encrypted="gAAAA"),
    ReasoningPart("summary", extra={"responses": {"id": "rs_1"}}),
]


@pytest.mark.parametrize("part", ZERDA_PARTS, ids=lambda p: f"{type(p).__name__}")
def test_zerda_dict_form_is_lossless(part: Any) -> None:
    assert part_from_dict(part.to_dict()) == part
    message = Message(Role.ASSISTANT, (part,))
    assert Message.from_dict(message.to_dict()) == message
    assert Message.from_json(message.to_json()) == message


def test_to_openai_sends_each_role_only_what_openai_takes() -> None:
    user = Message(Role.USER, tuple(ZERDA_PARTS))
    sent = user.to_openai()["content"]
    # Reasoning, an image known only by file id and a file by URL are not OpenAI Chat content
    # parts: left out.
    assert [p["type"] for p in sent] == [
        "text",
        "image_url",  # the data URL
        "image_url",  # the URL (its file id is Zerda's, not OpenAI Chat's)
        "input_audio",
        "file",  # the data
        "file",  # the file id
    ]
    assert all("extra" not in p and "media_type" not in p for p in sent)
    assistant = Message(Role.ASSISTANT, (ReasoningPart("x", signature="s"), TextPart("done")))
    assert assistant.to_openai()["content"] == [{"type": "text", "text": "done"}]
    only_reasoning = Message(Role.ASSISTANT, (ReasoningPart("x"),))
    assert only_reasoning.to_openai()["content"] == ""


def test_text_and_parts_views() -> None:
    message = Message(Role.USER, (TextPart("a"), ImagePart(PNG), TextPart("b")))
    assert message.text == "a\nb"
    assert message.parts == message.content
    assert Message(Role.USER, "plain").parts == (TextPart("plain"),)
    assert Message(Role.ASSISTANT, "").parts == ()


@pytest.mark.parametrize(
    ("content", "mentions"),
    [
        ([{"type": "video", "url": "x"}], "unknown content part type 'video'"),
        ([{"type": "text"}], "text part's text must be a string"),
        ([{"type": "text", "text": 5}], "text part's text must be a string"),
        ([{"type": "text", "text": "a", "cache": 1}], "keys Zerda does not know"),
        ([{"type": "image_url", "image_url": {}}], "needs a url"),
        ([{"type": "image_url", "image_url": "https://x"}], "image_url must be an object"),
        ([{"type": "image_url", "image_url": {"url": PNG, "detail": "max"}}], "detail"),
        ([{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}], "audio data"),
        ([{"type": "input_audio", "input_audio": {"data": "x"}}], "audio format"),
        ([{"type": "file", "file": {}}], "needs data"),
        (["just a string"], "content part must be an object"),
        ([{"type": "reasoning", "text": "x"}], "unknown content part type 'reasoning'"),
        ([{"type": "text", "text": "\ud800"}], "surrogate"),
    ],
)
def test_bad_openai_parts_are_refused_with_their_position(content: Any, mentions: str) -> None:
    with pytest.raises(InvalidMessageError, match="content part 0") as info:
        Message.from_openai({"role": "user", "content": content})
    assert mentions in str(info.value)


@pytest.mark.parametrize(
    ("make", "mentions"),
    [
        (lambda: TextPart("a", extra={"x": 1}), "by format name, a mapping each"),
        (lambda: TextPart("a", extra=[1]), "extra must be a mapping"),
        (lambda: TextPart("a", extra={"x": {"f": float("nan")}}), "JSON"),
        (lambda: ImagePart(None), "needs a url"),
        (lambda: FilePart(None, filename="a.pdf"), "needs data"),
        (lambda: ReasoningPart(signature=""), "non-empty string"),
    ],
)
def test_bad_parts_built_in_python_are_refused(make: Any, mentions: str) -> None:
    with pytest.raises(InvalidMessageError, match=mentions):
        make()


def test_extras_are_frozen_copies() -> None:
    inner = {"cache_control": {"type": "ephemeral"}}
    part = TextPart("a", extra={"anthropic": inner})
    inner["cache_control"]["type"] = "changed"
    assert part.to_dict()["extra"] == {"anthropic": {"cache_control": {"type": "ephemeral"}}}
    with pytest.raises(TypeError):
        part.extra["other"] = {}  # type: ignore[index]


def test_parts_in_a_message_must_be_parts() -> None:
    with pytest.raises(InvalidMessageError, match=r"content part 0 must be a zerda\.parts part"):
        Message(Role.USER, ("text",))  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError, match="content part 1 must be"):
        Message(Role.USER, [TextPart("a"), {"type": "text", "text": "b"}])  # type: ignore[list-item]
    # A list of parts is taken, and kept as a tuple (messages are immutable).
    assert Message(Role.USER, [TextPart("a")]).content == (TextPart("a"),)  # type: ignore[arg-type]


def test_to_openai_leaves_out_media_openai_chat_refuses() -> None:
    message = Message(
        Role.USER,
        (
            TextPart("listen"),
            AudioPart("T2dnUw==", "ogg"),  # Gemini takes ogg; OpenAI Chat wav and mp3 only
            ImagePart("data:image/heic;base64,AAAA"),
            ImagePart("gs://bucket/cat.png", media_type="image/png"),
            ImagePart("data:image/webp;base64,UklGRg==", detail="low"),
        ),
    )
    assert message.to_openai()["content"] == [
        {"type": "text", "text": "listen"},
        {
            "type": "image_url",
            "image_url": {"url": "data:image/webp;base64,UklGRg==", "detail": "low"},
        },
    ]
    assert Message.from_dict(message.to_dict()) == message  # the message keeps all of it


def test_to_openai_makes_names_and_long_call_ids_acceptable() -> None:
    long_id = "toolu_" + "x" * 60  # Anthropic-style ids may exceed OpenAI's 40 characters
    call = Message(Role.ASSISTANT, None, tool_calls=(ToolCall(long_id, "f"),))
    result = Message(Role.TOOL, "ok", tool_call_id=long_id)
    sent_call, sent_result = to_openai([call, result])
    short = sent_call["tool_calls"][0]["id"]
    assert len(short) <= 40
    assert sent_result["tool_call_id"] == short  # the call and its result still match
    assert to_openai([call]) == [sent_call]  # the same id every time
    named = Message(Role.USER, "hi", name="Ada Lovelace (guest)")
    assert named.to_openai()["name"] == "Ada_Lovelace__guest_"
    assert Message(Role.USER, "hi", name="ada_1").to_openai()["name"] == "ada_1"
