"""Every converter, on generated conversations and on the Taskmaster data: each request passes
its provider's validator, each format reads back what it wrote, and a trip through any other
format keeps the text, the tool names, arguments and call ids, and the results."""

from __future__ import annotations

import gzip
import json
import string
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _validators import (
    validate_anthropic,
    validate_gemini,
    validate_openai_chat,
    validate_responses,
)
from zerda.formats import (
    from_anthropic,
    from_gemini,
    from_openai,
    from_responses,
    to_anthropic,
    to_gemini,
    to_openai,
    to_responses,
)
from zerda.messages import PINNED, Message, Part, Role, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart

DATA = Path(__file__).parents[2] / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"

Format = tuple[
    str,
    Callable[[list[Message]], Any],
    Callable[[Any], list[Message]],
    Callable[[Any], None],
]
FORMATS: list[Format] = [
    ("openai", to_openai, from_openai, validate_openai_chat),
    ("responses", to_responses, from_responses, validate_responses),
    ("anthropic", to_anthropic, from_anthropic, validate_anthropic),
    ("gemini", to_gemini, from_gemini, validate_gemini),
]
OURS = FORMATS[1:]

PNG = "data:image/png;base64,iVBORw0KGgo="
PDF = "data:application/pdf;base64,JVBERi0xLjQ="
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- generated conversations -----------------------------------------------------------------

# Ids and names every provider takes (OpenAI: names ^[a-zA-Z0-9_-]+$, call ids of 40
# characters at most; Anthropic: tool_use ids ^[a-zA-Z0-9_-]+$).
SAFE = string.ascii_letters + string.digits + "_-"
ids = st.text(alphabet=SAFE, min_size=1, max_size=40)
names = st.none() | st.text(alphabet=SAFE, min_size=1, max_size=12)
texts = st.text(max_size=20) | st.sampled_from(["", " ", "\n", "Hello ", "ok"])
words = st.text(alphabet=string.ascii_letters + " ", min_size=1, max_size=12).filter(str.strip)
objects = st.dictionaries(
    st.text(max_size=6), st.none() | st.booleans() | st.integers() | st.text(max_size=6), max_size=3
).map(json.dumps)
arguments = objects | st.sampled_from(["", "{}", "not json {", "[1, 2]", '{"a": NaN}'])

# Reasoning made by each provider, and by none.
reasoning = st.sampled_from(
    [
        ReasoningPart("Anthropic's thinking", signature="EqQB", extra={"anthropic": {}}),
        ReasoningPart("", encrypted="EmwK", extra={"anthropic": {}}),
        ReasoningPart("OpenAI's summary", encrypted="gAAA", extra={"responses": {"id": "rs_1"}}),
        ReasoningPart("Gemini's thought", signature="CiQB", extra={"gemini": {}}),
        ReasoningPart("made by hand"),
    ]
)
# Media OpenAI Chat takes on a user message (to_openai leaves out the rest).
openai_media = st.sampled_from(
    [
        ImagePart(PNG, detail="low"),
        ImagePart("https://x.test/a.png"),
        ImagePart(None, file_id="file-1"),
        AudioPart("UklGRg==", "wav"),
        AudioPart("SUQz", "mp3"),
        FilePart(PDF, filename="menu.pdf"),
        FilePart(None, file_id="file-2"),
        FilePart(url="https://x.test/menu.pdf"),
    ]
)
# And media some providers cannot take at all.
odd_media = st.sampled_from(
    [
        ImagePart("data:image/bmp;base64,Qk0="),
        ImagePart("https://x.test/no-extension"),
        ImagePart(
            "https://generativelanguage.googleapis.com/v1beta/files/a",
            media_type="image/png",
            extra={"gemini": {"_file_data": True}},
        ),
        AudioPart("T2dn", "ogg"),
        FilePart("data:text/plain;base64,aGk=", filename="note.txt"),
        FilePart("data:application/msword;base64,0M8R"),
        FilePart(
            url="gs://bucket/clip.mp4",
            media_type="video/mp4",
            extra={"gemini": {"_file_data": True}},
        ),
    ]
)
text_parts = st.builds(TextPart, texts) | st.builds(
    lambda t: TextPart(t, extra={"anthropic": {"cache_control": {"type": "ephemeral"}}}), words
)


def _content(parts: st.SearchStrategy[Part], text: st.SearchStrategy[str] = texts) -> Any:
    return text | st.lists(parts, min_size=1, max_size=4).map(tuple)


@st.composite
def conversations(draw: st.DrawFn, *, odd: bool = False, clean: bool = False) -> list[Message]:
    """A conversation OpenAI Chat takes, in its shape: pinned messages anywhere but between a
    call and its results, the first other message the user's, every call answered right after
    it (in any order). ``odd`` adds media some providers cannot take; ``clean`` keeps to what
    survives every trip (words in every user message, arguments that are JSON objects)."""
    media = (openai_media | odd_media) if odd else openai_media
    user_text = words if clean else texts
    user_parts = text_parts | media
    prefix = draw(st.text(alphabet=SAFE, max_size=36))
    pool = (f"{prefix}{n}" for n in range(1000))

    def pinned() -> Message:
        role = draw(st.sampled_from([Role.SYSTEM, Role.DEVELOPER]))
        return Message(role, draw(_content(text_parts)), name=draw(names))

    def user() -> Message:
        content = draw(_content(user_parts, user_text))
        if clean and isinstance(content, tuple):
            content = (TextPart(draw(words)), *content)
        return Message("user", content, name=draw(names))

    def assistant(calls: list[ToolCall]) -> Message:
        parts = text_parts | reasoning | (media if odd else text_parts)
        content = draw((st.none() if calls else st.nothing()) | _content(parts))
        return Message("assistant", content, tool_calls=calls, name=draw(names))

    messages = [pinned() for _ in range(draw(st.integers(0, 2)))]
    for _ in range(draw(st.integers(1, 3))):
        messages.append(user())
        for _ in range(draw(st.integers(0, 3))):
            step = draw(st.sampled_from(["reply", "calls", "calls", "pinned", "user"]))
            if step == "reply":
                messages.append(assistant([]))
            elif step == "pinned":
                messages.append(pinned())
            elif step == "user":
                messages.append(user())
            else:
                calls = [
                    ToolCall(
                        next(pool),
                        draw(st.sampled_from(["add_item", "get_menu"])),
                        draw(objects if clean else arguments),
                    )
                    for _ in range(draw(st.integers(1, 3)))
                ]
                messages.append(assistant(calls))
                for call in draw(st.permutations(calls)):
                    result = draw(_content(text_parts | st.just(ImagePart(PNG))))
                    messages.append(Message("tool", result, tool_call_id=call.id))
    return messages


@SETTINGS
@given(conversations())
def test_every_format_takes_any_context_openai_chat_takes(messages: list[Message]) -> None:
    validate_openai_chat(to_openai(messages))
    validate_responses(to_responses(messages))
    validate_anthropic(to_anthropic(messages))
    validate_gemini(to_gemini(messages))


@SETTINGS
@given(conversations(odd=True))
def test_media_a_provider_cannot_take_never_reaches_it(messages: list[Message]) -> None:
    validate_responses(to_responses(messages))
    validate_anthropic(to_anthropic(messages))
    validate_gemini(to_gemini(messages))


@SETTINGS
@given(conversations(odd=True), st.sampled_from(OURS), st.sampled_from(OURS))
def test_each_format_reads_back_what_it_wrote(
    messages: list[Message], first: Format, second: Format
) -> None:
    """``to_X(from_X(p)) == p`` for every request ``p`` a converter makes, including from
    messages that went through another format first."""
    _, to_first, from_first, _ = first
    _, to_x, from_x, validate = second
    through = from_first(to_first(messages))
    request = to_x(through)
    assert to_x(from_x(request)) == request
    validate(request)


# -- what a trip keeps -----------------------------------------------------------------------


def _words(pieces: Iterable[str]) -> str:
    """Text with its whitespace normalized: providers drop empty and whitespace-only text and
    trailing whitespace, and some join what others keep apart."""
    return " ".join(" ".join(pieces).split())


def _texts(m: Message) -> list[str]:
    if isinstance(m.content, str):
        return [m.content]
    return [p.text for p in m.parts if type(p) is TextPart]


def _arguments(text: str) -> object:
    if not text.strip():
        return {}  # no arguments: Anthropic's and Gemini's objects say it as {}
    try:
        return json.loads(text)
    except ValueError:
        return text


def what_was_said(messages: Iterable[Message]) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The instructions, and in order the texts, calls (id, name, arguments) and results
    (call id, text) of a conversation: what every trip must keep."""
    instructions: list[str] = []
    events: list[tuple[Any, ...]] = []
    for m in messages:
        if m.role in PINNED:
            instructions += [t for t in _texts(m) if t.strip()]
        elif m.role is Role.TOOL:
            events.append(("result", m.tool_call_id, _words(_texts(m))))
        else:
            events += [(m.role.value, _words([t])) for t in _texts(m) if t.strip()]
            events += [("call", c.id, c.name, _arguments(c.arguments)) for c in m.tool_calls]
    return [_words([t]) for t in instructions], events


@SETTINGS
@given(conversations(clean=True), st.sampled_from(FORMATS), st.sampled_from(FORMATS))
def test_a_trip_through_any_two_formats_keeps_what_was_said(
    messages: list[Message], first: Format, second: Format
) -> None:
    _, to_first, from_first, validate_first = first
    _, to_second, from_second, validate_second = second
    request = to_first(messages)
    validate_first(request)
    middle = from_first(request)
    again = to_second(middle)
    validate_second(again)
    assert what_was_said(from_second(again)) == what_was_said(messages)


def test_made_up_gemini_call_ids_survive_a_trip_through_every_format() -> None:
    payload = {
        "contents": [
            {"role": "user", "parts": [{"text": "Weather?"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "weather", "args": {}}, "thoughtSignature": "CiQB"}
                ],
            },
            {
                "role": "user",
                "parts": [{"functionResponse": {"name": "weather", "response": {"output": "sun"}}}],
            },
        ]
    }
    messages = from_gemini(payload)
    made_up = messages[1].tool_calls[0].id
    for _, to_x, from_x, validate in FORMATS:
        request = to_x(messages)
        validate(request)
        back = from_x(request)
        assert what_was_said(back) == what_was_said(messages)
        assert [c.id for c in back[1].tool_calls] == [made_up]
        assert back[2].tool_call_id == made_up


@pytest.mark.parametrize("fmt", OURS, ids=[f[0] for f in OURS])
def test_what_a_format_keeps_survives_a_store(fmt: Format) -> None:
    payloads = {
        "responses": [
            {"role": "user", "content": "Hi"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "gAAA"},
            {"type": "message", "role": "assistant", "id": "msg_1", "content": "Hello"},
        ],
        "anthropic": {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Hi", "cache_control": {"type": "ephemeral"}}
                    ],
                },
            ]
        },
        "gemini": {
            "contents": [
                {
                    "role": "user",
                    "parts": [{"inlineData": {"mimeType": "image/png", "data": "iVBO"}}],
                }
            ]
        },
    }
    name, to_x, from_x, _ = fmt
    messages = from_x(payloads[name])
    stored = [Message.from_json(m.to_json()) for m in messages]
    assert stored == messages
    assert to_x(stored) == payloads[name]


# -- the real data set -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def dialogs() -> list[list[Message]]:
    if not DATA.exists():
        pytest.skip(f"shared data set not found at {DATA}; clone the repo beside 'shared/'")
    with gzip.open(DATA, "rt", encoding="utf-8") as f:
        return [from_openai(json.loads(line)["messages"]) for line in f]


@pytest.mark.parametrize("fmt", FORMATS, ids=[f[0] for f in FORMATS])
def test_every_dialog_is_a_valid_request_that_reads_back(
    dialogs: list[list[Message]], fmt: Format
) -> None:
    assert dialogs
    _, to_x, from_x, validate = fmt
    for messages in dialogs:
        request = to_x(messages)
        validate(request)
        back = from_x(request)
        assert to_x(back) == request
        assert what_was_said(back) == what_was_said(messages)


@pytest.mark.parametrize("first", FORMATS, ids=[f[0] for f in FORMATS])
def test_every_dialog_survives_every_pair_of_formats(
    dialogs: list[list[Message]], first: Format
) -> None:
    _, to_first, from_first, _ = first
    for messages in dialogs:
        said = what_was_said(messages)
        middle = from_first(to_first(messages))
        for _, to_second, from_second, validate_second in FORMATS:
            request = to_second(middle)
            validate_second(request)
            assert what_was_said(from_second(request)) == said


def test_the_data_set_keeps_its_call_ids_and_arguments_exactly_through_responses(
    dialogs: list[list[Message]],
) -> None:
    """OpenAI's two formats hold arguments as the same JSON text: nothing is re-encoded."""
    for messages in dialogs:
        assert from_responses(to_responses(messages)) == messages
