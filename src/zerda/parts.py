"""Content parts: what a message holds besides plain text — images, audio, files, reasoning.

A :class:`~zerda.Message`'s content is a string, or a tuple of parts. Parts are frozen values;
each keeps, in ``extra``, what a provider's format says about it that Zerda does not model (an
Anthropic ``cache_control``, a Gemini ``thoughtSignature``), by format name, so that the
converters of :mod:`zerda.formats` give back exactly what they were given.

Their dict form (``Message.to_dict``, and what every store keeps) follows OpenAI Chat's content
parts where OpenAI has one (``text``, ``image_url``, ``input_audio``, ``file``) and adds what it
lacks: a ``reasoning`` part, an image by ``file_id``, a file by ``url``, and ``extra``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, ClassVar

from zerda._checks import check_json_value, check_text
from zerda.errors import InvalidMessageError

__all__ = [
    "AudioPart",
    "FilePart",
    "ImagePart",
    "Part",
    "ReasoningPart",
    "TextPart",
    "part_from_dict",
]

_EMPTY: Mapping[str, Any] = MappingProxyType({})
DETAILS = ("auto", "low", "high")


def _empty() -> Mapping[str, Any]:
    return _EMPTY


def _frozen_extra(extra: object, what: str) -> Mapping[str, Any]:
    """``extra`` checked (a JSON object of JSON objects, by format name) and deep-copied;
    the shared read-only empty mapping when it is empty."""
    if not isinstance(extra, Mapping):
        raise InvalidMessageError(f"{what} extra must be a mapping, got {type(extra).__name__}")
    if not extra:
        return _EMPTY
    copied = dict(extra)
    check_json_value(copied, f"{what} extra")
    for name, value in copied.items():
        if not isinstance(value, Mapping):
            raise InvalidMessageError(
                f"{what} extra holds, by format name, a mapping each; {name!r} holds "
                f"{type(value).__name__}"
            )
    try:
        return MappingProxyType(json.loads(json.dumps(copied, allow_nan=False)))
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"{what} extra must be JSON-serializable: {exc}") from exc


def _with_extra(out: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``out`` (a part's or a tool call's dict form) with a copy of ``extra``, when set."""
    if extra:
        out["extra"] = json.loads(json.dumps(dict(extra)))
    return out


def _text(value: object, what: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        kind = "a string" if empty else "a non-empty string"
        raise InvalidMessageError(f"{what} must be {kind}, got {value!r:.80}")
    check_text(value, what)
    return value


def _optional(value: object, what: str) -> str | None:
    return None if value is None else _text(value, what, empty=False)


class _Part:
    """What every part shares: its ``kind`` and the ``extra`` of the formats it came from."""

    __slots__ = ()
    kind: ClassVar[str]
    extra: Mapping[str, Any]

    def _check_extra(self) -> None:
        object.__setattr__(self, "extra", _frozen_extra(self.extra, f"{self.kind} part"))

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def _with_extra(self, out: dict[str, Any]) -> dict[str, Any]:
        return _with_extra(out, self.extra)


@dataclass(frozen=True, slots=True)
class TextPart(_Part):
    """Text, as one part among others."""

    kind: ClassVar[str] = "text"
    text: str
    extra: Mapping[str, Any] = field(default_factory=_empty, kw_only=True, hash=False)

    def __post_init__(self) -> None:
        _text(self.text, "a text part's text")
        self._check_extra()

    def to_dict(self) -> dict[str, Any]:
        return self._with_extra({"type": "text", "text": self.text})


@dataclass(frozen=True, slots=True)
class ImagePart(_Part):
    """An image: by ``url`` (``https://…``, or a ``data:image/png;base64,…`` URL holding it) or
    by a provider's ``file_id``. ``detail`` is OpenAI's ``low``/``high``/``auto``;
    ``media_type`` the MIME type when the URL does not say it (a Gemini ``file_data``)."""

    kind: ClassVar[str] = "image"
    url: str | None = None
    file_id: str | None = field(default=None, kw_only=True)
    detail: str | None = field(default=None, kw_only=True)
    media_type: str | None = field(default=None, kw_only=True)
    extra: Mapping[str, Any] = field(default_factory=_empty, kw_only=True, hash=False)

    def __post_init__(self) -> None:
        _optional(self.url, "an image's url")
        _optional(self.file_id, "an image's file_id")
        _optional(self.media_type, "an image's media_type")
        if self.url is None and self.file_id is None:
            raise InvalidMessageError("an image part needs a url (or a data: URL) or a file_id")
        if self.detail is not None and self.detail not in DETAILS:
            raise InvalidMessageError(
                f"an image's detail is one of {', '.join(DETAILS)} or None, got {self.detail!r}"
            )
        self._check_extra()

    def openai(self) -> dict[str, Any]:
        """OpenAI Chat's ``image_url`` part (for an image with a ``url``)."""
        image: dict[str, Any] = {"url": self.url}
        if self.detail is not None:
            image["detail"] = self.detail
        return {"type": "image_url", "image_url": image}

    def to_dict(self) -> dict[str, Any]:
        if self.url is not None:
            out = self.openai()
            if self.file_id is not None:
                out["file_id"] = self.file_id
        else:
            out = {"type": "image_file", "file_id": self.file_id}
            if self.detail is not None:
                out["detail"] = self.detail
        if self.media_type is not None:
            out["media_type"] = self.media_type
        return self._with_extra(out)


@dataclass(frozen=True, slots=True)
class AudioPart(_Part):
    """Audio, as base64 ``data`` in a ``format`` (OpenAI's ``wav``, ``mp3``, …)."""

    kind: ClassVar[str] = "audio"
    data: str
    format: str
    extra: Mapping[str, Any] = field(default_factory=_empty, kw_only=True, hash=False)

    def __post_init__(self) -> None:
        _text(self.data, "audio data", empty=False)
        _text(self.format, "an audio format", empty=False)
        self._check_extra()

    def openai(self) -> dict[str, Any]:
        """OpenAI Chat's ``input_audio`` part."""
        return {"type": "input_audio", "input_audio": {"data": self.data, "format": self.format}}

    def to_dict(self) -> dict[str, Any]:
        return self._with_extra(self.openai())


@dataclass(frozen=True, slots=True)
class FilePart(_Part):
    """A file (a PDF, a text document): as a ``data:`` URL holding it (``data``), a provider's
    ``file_id``, or a ``url``; with its ``filename`` and ``media_type`` when known."""

    kind: ClassVar[str] = "file"
    data: str | None = None
    file_id: str | None = field(default=None, kw_only=True)
    url: str | None = field(default=None, kw_only=True)
    filename: str | None = field(default=None, kw_only=True)
    media_type: str | None = field(default=None, kw_only=True)
    extra: Mapping[str, Any] = field(default_factory=_empty, kw_only=True, hash=False)

    def __post_init__(self) -> None:
        _optional(self.data, "a file's data")
        _optional(self.file_id, "a file's file_id")
        _optional(self.url, "a file's url")
        _optional(self.filename, "a file's filename")
        _optional(self.media_type, "a file's media_type")
        if self.data is None and self.file_id is None and self.url is None:
            raise InvalidMessageError("a file part needs data (a data: URL), a file_id or a url")
        self._check_extra()

    def openai(self) -> dict[str, Any]:
        """OpenAI Chat's ``file`` part (its ``data`` and ``file_id``; not a ``url``)."""
        file: dict[str, Any] = {}
        if self.data is not None:
            file["file_data"] = self.data
        if self.file_id is not None:
            file["file_id"] = self.file_id
        if self.filename is not None:
            file["filename"] = self.filename
        return {"type": "file", "file": file}

    def to_dict(self) -> dict[str, Any]:
        out = self.openai()
        if self.url is not None:
            out["url"] = self.url
        if self.media_type is not None:
            out["media_type"] = self.media_type
        return self._with_extra(out)


@dataclass(frozen=True, slots=True)
class ReasoningPart(_Part):
    """A model's reasoning (thinking): its ``text`` (or summary), and what the provider needs
    back to trust it: an Anthropic or Gemini ``signature``, or ``encrypted`` content (OpenAI's
    ``encrypted_content``, Anthropic's ``redacted_thinking`` data). Sent back to the provider
    that made it; providers that take none (OpenAI Chat) are sent none."""

    kind: ClassVar[str] = "reasoning"
    text: str = ""
    signature: str | None = field(default=None, kw_only=True)
    encrypted: str | None = field(default=None, kw_only=True)
    extra: Mapping[str, Any] = field(default_factory=_empty, kw_only=True, hash=False)

    def __post_init__(self) -> None:
        _text(self.text, "reasoning text")
        _optional(self.signature, "a reasoning signature")
        _optional(self.encrypted, "encrypted reasoning")
        self._check_extra()

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "reasoning", "text": self.text}
        if self.signature is not None:
            out["signature"] = self.signature
        if self.encrypted is not None:
            out["encrypted"] = self.encrypted
        return self._with_extra(out)


Part = TextPart | ImagePart | AudioPart | FilePart | ReasoningPart
"""Any content part."""

PART_TYPES = (TextPart, ImagePart, AudioPart, FilePart, ReasoningPart)


# -- the dict form ------------------------------------------------------------------------------


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise InvalidMessageError(f"{what} must be an object, got {type(value).__name__}")
    return value


def _only(data: Mapping[str, Any], keys: frozenset[str], what: str) -> None:
    unknown = sorted(set(data) - keys)
    if unknown:
        raise InvalidMessageError(f"{what} has keys Zerda does not know: {unknown}")


def part_from_dict(data: object, *, openai: bool = False) -> Part:
    """A part from its dict form (:meth:`to_dict`); with ``openai``, from OpenAI Chat's content
    part shapes only (``text``, ``image_url``, ``input_audio``, ``file``), Zerda's additions
    refused."""
    part = _mapping(data, "a content part")
    kind = part.get("type")
    extra = part.get("extra", _EMPTY) if not openai else _EMPTY
    if kind == "text":
        _only(part, _TEXT_KEYS if openai else _TEXT_KEYS | {"extra"}, "a text part")
        return TextPart(part.get("text"), extra=extra)  # type: ignore[arg-type]
    if kind == "image_url":
        keys = _IMAGE_KEYS if openai else _IMAGE_KEYS | {"file_id", "media_type", "extra"}
        _only(part, keys, "an image_url part")
        image = _mapping(part.get("image_url"), "image_url")
        _only(image, frozenset({"url", "detail"}), "an image_url part's image_url")
        return ImagePart(
            image.get("url"),
            file_id=part.get("file_id"),
            detail=image.get("detail"),
            media_type=part.get("media_type"),
            extra=extra,
        )
    if kind == "input_audio":
        _only(part, _AUDIO_KEYS if openai else _AUDIO_KEYS | {"extra"}, "an input_audio part")
        audio = _mapping(part.get("input_audio"), "input_audio")
        _only(audio, frozenset({"data", "format"}), "an input_audio part's input_audio")
        return AudioPart(audio.get("data"), audio.get("format"), extra=extra)  # type: ignore[arg-type]
    if kind == "file":
        keys = _FILE_KEYS if openai else _FILE_KEYS | {"url", "media_type", "extra"}
        _only(part, keys, "a file part")
        file = _mapping(part.get("file"), "file")
        _only(file, frozenset({"file_data", "file_id", "filename"}), "a file part's file")
        return FilePart(
            file.get("file_data"),
            file_id=file.get("file_id"),
            url=part.get("url"),
            filename=file.get("filename"),
            media_type=part.get("media_type"),
            extra=extra,
        )
    if not openai and kind == "image_file":
        _only(part, frozenset({"type", "file_id", "detail", "media_type", "extra"}), "an image")
        return ImagePart(
            None,
            file_id=part.get("file_id"),
            detail=part.get("detail"),
            media_type=part.get("media_type"),
            extra=extra,
        )
    if not openai and kind == "reasoning":
        _only(part, frozenset({"type", "text", "signature", "encrypted", "extra"}), "reasoning")
        return ReasoningPart(
            part.get("text", ""),
            signature=part.get("signature"),
            encrypted=part.get("encrypted"),
            extra=extra,
        )
    known = "text, image_url, input_audio, file" + ("" if openai else ", image_file, reasoning")
    raise InvalidMessageError(f"unknown content part type {kind!r}; the types are {known}")


_TEXT_KEYS = frozenset({"type", "text"})
_IMAGE_KEYS = frozenset({"type", "image_url"})
_AUDIO_KEYS = frozenset({"type", "input_audio"})
_FILE_KEYS = frozenset({"type", "file"})
