"""Messages, tool calls and turns: frozen values, validation, and OpenAI / JSON conversion."""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from zerda._checks import MAX_METADATA_DEPTH, check_json_value, check_text, valid_unicode
from zerda._ids import new_message_id, new_message_ids
from zerda.errors import InvalidMessageError
from zerda.parts import (
    PART_TYPES,
    AudioPart,
    FilePart,
    ImagePart,
    Part,
    ReasoningPart,
    TextPart,
    _empty,
    _frozen_extra,
    _with_extra,
    part_from_dict,
)

__all__ = [
    "MAX_ID_LENGTH",
    "MAX_METADATA_DEPTH",
    "PINNED",
    "AudioPart",
    "FilePart",
    "ImagePart",
    "Message",
    "Part",
    "ReasoningPart",
    "Role",
    "TextPart",
    "ToolCall",
    "Turn",
    "from_openai",
    "group_turns",
    "new_message_id",
    "to_openai",
]

# Keys of an OpenAI chat message that Zerda does not model. They are accepted when empty
# (the SDK's ``model_dump()`` always emits them) and refused when set, since dropping them
# would lose data.
_UNMODELLED_OPENAI_KEYS = frozenset({"refusal", "audio", "function_call", "annotations"})
_OPENAI_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_DICT_KEYS = _OPENAI_KEYS | {"metadata", "created_at", "id"}

MAX_ID_LENGTH = 255
"""The longest message id accepted."""


def stamp_batch(messages: list[Message], now: float) -> list[Message]:
    """``messages`` with ``created_at`` (``now`` where unset) and ``id`` (new ones, in
    order, where unset) given, as :meth:`Message.stamped` does one message: for a batch,
    one clock reading and one random draw."""
    missing = sum(m.id is None for m in messages)
    fresh = iter(new_message_ids(missing)) if missing else iter(())
    return [
        m
        if m.created_at is not None and m.id is not None
        else m._stamped(
            now if m.created_at is None else m.created_at, next(fresh) if m.id is None else m.id
        )
        for m in messages
    ]


def _check_id(value: object) -> None:
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_LENGTH:
        raise InvalidMessageError(
            f"a message id must be a string of 1 to {MAX_ID_LENGTH} characters or None, "
            f"got {value!r:.80}"
        )
    if not value.isprintable():
        raise InvalidMessageError(
            f"a message id must be printable text (no control characters), got {value!r:.80}"
        )
    check_text(value, "the message id")


class Role(str, Enum):
    """Who said a message. Compares equal to its string value: ``Role.USER == "user"``."""

    SYSTEM = "system"
    DEVELOPER = "developer"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"

    def __str__(self) -> str:
        return self.value


_ROLES = ", ".join(repr(r.value) for r in Role)

PINNED = frozenset({Role.SYSTEM, Role.DEVELOPER})
"""The roles whose messages belong to no turn and lead every context: ``system`` and
``developer`` (OpenAI's newer name for the same instructions)."""


def _role(value: object) -> Role:
    if isinstance(value, Role):
        return value
    if isinstance(value, str):
        try:
            return Role(value)
        except ValueError:
            pass
    raise InvalidMessageError(f"unknown role {value!r}; a role is one of {_ROLES}")


def _optional_text(value: object, what: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise InvalidMessageError(f"{what} must be a string or None, got {type(value).__name__}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One function call requested by the assistant.

    ``arguments`` is the JSON text the model produced, kept exactly as given (models sometimes
    emit invalid JSON; Zerda stores what was said and leaves parsing to the caller).
    """

    id: str
    name: str
    arguments: str = "{}"
    type: str = "function"
    extra: Mapping[str, Any] = field(default_factory=_empty, kw_only=True, hash=False)

    def __post_init__(self) -> None:
        for attr in ("id", "name", "type"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not value:
                raise InvalidMessageError(
                    f"tool call {attr} must be a non-empty string, got {value!r}"
                )
            check_text(value, f"tool call {attr}")
        if not isinstance(self.arguments, str):
            raise InvalidMessageError(
                f"tool call {self.name!r}: arguments must be a JSON string, "
                f"got {type(self.arguments).__name__} (use json.dumps)"
            )
        check_text(self.arguments, f"the arguments of tool call {self.name!r}")
        extra = self.extra
        if extra is not _NOTHING:  # anything but the default: checked and frozen
            frozen = _frozen_extra(extra, "a tool call's") if extra else _NOTHING
            object.__setattr__(self, "extra", frozen)

    @classmethod
    def from_openai(cls, data: object, *, extra: bool = False) -> ToolCall:
        """Build from OpenAI's ``{"id", "type", "function": {"name", "arguments"}}`` (with
        ``extra``, also Zerda's ``"extra"`` key, as :meth:`to_dict` writes it)."""
        if not isinstance(data, Mapping):
            raise InvalidMessageError(
                f"a tool call must be a dict like {{'id': ..., 'type': 'function', "
                f"'function': {{'name': ..., 'arguments': ...}}}}, got {type(data).__name__}"
            )
        function = data.get("function")
        if not isinstance(function, Mapping):
            raise InvalidMessageError(
                f"tool call {data.get('id')!r} has no 'function' dict with 'name' and 'arguments'"
            )
        return cls(
            # The types are checked in __post_init__, with messages that name the bad value.
            id=data.get("id"),  # type: ignore[arg-type]
            name=function.get("name"),  # type: ignore[arg-type]
            arguments=function.get("arguments", "{}"),
            type=data.get("type", "function"),
            extra=data.get("extra", _NOTHING) if extra else _NOTHING,
        )

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }

    def to_dict(self) -> dict[str, Any]:
        """:meth:`to_openai`, and ``extra`` when set: lossless."""
        return _with_extra(self.to_openai(), self.extra)


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message. Immutable; build a changed copy with ``dataclasses.replace``.

    ``content`` is a string, or a tuple of parts (:mod:`zerda.parts`: text, images, audio,
    files, reasoning); it may be ``None`` only on an assistant message that makes tool calls
    (as in OpenAI's format). ``system`` and ``developer`` messages are pinned (:data:`PINNED`):
    they belong to no turn. A tool message must name the call it answers in
    ``tool_call_id``. ``metadata`` is any JSON-serializable mapping (nested at most
    :data:`MAX_METADATA_DEPTH` deep), kept with the message but never sent to the model.
    ``created_at`` is epoch seconds and ``id`` identifies the message in its session (see
    :func:`new_message_id`); memories stamp both when unset. Stores keep a message once per
    id, so appending it again (a retry) stores nothing. Text must be valid Unicode.
    """

    role: Role
    content: str | tuple[Part, ...] | None
    name: str | None = field(default=None, kw_only=True)
    tool_calls: tuple[ToolCall, ...] = field(default=(), kw_only=True)
    tool_call_id: str | None = field(default=None, kw_only=True)
    metadata: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), kw_only=True, hash=False
    )
    created_at: float | None = field(default=None, kw_only=True)
    id: str | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        role = _role(self.role)
        object.__setattr__(self, "role", role)
        self._check_fields(role)
        self._check_metadata()
        if self.id is not None:
            _check_id(self.id)
        created = self.created_at
        if created is not None:
            if isinstance(created, bool) or not isinstance(created, (int, float)):
                raise InvalidMessageError(
                    f"created_at must be epoch seconds (a float) or None, got {created!r}"
                )
            try:
                seconds = float(created)
            except OverflowError:  # an int beyond float range; its repr may be huge
                raise InvalidMessageError(
                    "created_at must be finite epoch seconds, got an int too large for a float"
                ) from None
            if not math.isfinite(seconds):
                raise InvalidMessageError(f"created_at must be finite, got {created!r}")
            object.__setattr__(self, "created_at", seconds)

    def _check_fields(self, role: Role) -> None:
        content = self.content
        if content is not None and not isinstance(content, str):
            content = self._check_parts(role, content)
        if not isinstance(self.tool_calls, tuple):
            if isinstance(self.tool_calls, (str, bytes, Mapping)) or not isinstance(
                self.tool_calls, Iterable
            ):
                raise InvalidMessageError(
                    "tool_calls must be a sequence of ToolCall, got "
                    f"{type(self.tool_calls).__name__}"
                )
            object.__setattr__(self, "tool_calls", tuple(self.tool_calls))
        for call in self.tool_calls:
            if not isinstance(call, ToolCall):
                raise InvalidMessageError(
                    f"tool_calls must hold ToolCall objects, got {type(call).__name__} "
                    "(use Message.from_openai for OpenAI dicts)"
                )
        if self.tool_calls and role is not Role.ASSISTANT:
            raise InvalidMessageError(f"only assistant messages make tool calls, not {role.value}")
        if content is None and not self.tool_calls:
            raise InvalidMessageError(
                f"{role.value} message content must be a string or parts; None is allowed only "
                "on an assistant message that makes tool calls"
            )
        if isinstance(content, str):
            check_text(content, f"{role.value} message content")
        if role is Role.TOOL:
            if not isinstance(self.tool_call_id, str) or not self.tool_call_id:
                raise InvalidMessageError(
                    "a tool message needs tool_call_id, the id of the call it answers, "
                    f"got {self.tool_call_id!r}"
                )
            check_text(self.tool_call_id, "tool_call_id")
        elif self.tool_call_id is not None:
            raise InvalidMessageError(
                f"only tool messages carry tool_call_id, not {role.value} messages"
            )
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise InvalidMessageError(f"name must be a non-empty string or None, got {self.name!r}")
        if self.name is not None:
            check_text(self.name, "name")

    def _check_parts(self, role: Role, content: object) -> tuple[Part, ...]:
        """``content`` as a tuple of parts (a list is accepted), each a part object."""
        if isinstance(content, (bytes, Mapping)) or not isinstance(content, (list, tuple)):
            raise InvalidMessageError(
                f"{role.value} message content must be a string or a sequence of parts, got "
                f"{type(content).__name__}"
            )
        parts = tuple(content)
        if not parts:
            raise InvalidMessageError(
                f"{role.value} message content is an empty sequence of parts; use '' for none"
            )
        for i, part in enumerate(parts):
            if not isinstance(part, PART_TYPES):
                hint = (
                    " (use Message.from_openai or from_dict for dicts)"
                    if isinstance(part, Mapping)
                    else ""
                )
                raise InvalidMessageError(
                    f"content part {i} must be a zerda.parts part (TextPart, ImagePart, "
                    f"AudioPart, FilePart, ReasoningPart), got {type(part).__name__}{hint}"
                )
        object.__setattr__(self, "content", parts)
        return parts

    def _check_metadata(self) -> None:
        metadata = self.metadata
        if not isinstance(metadata, Mapping):
            raise InvalidMessageError(f"metadata must be a mapping, got {type(metadata).__name__}")
        if isinstance(metadata, MappingProxyType) and not metadata:
            return
        copied = dict(metadata)
        check_json_value(copied, "metadata")
        try:
            dumped = json.dumps(copied, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise InvalidMessageError(f"metadata must be JSON-serializable: {exc}") from exc
        # Keep the JSON form: a deep copy the caller cannot change, and exactly what to_json
        # and from_json give back (tuples become lists).
        object.__setattr__(self, "metadata", MappingProxyType(json.loads(dumped)))

    def __reduce__(self) -> tuple[object, ...]:
        # MappingProxyType does not pickle; rebuild from the lossless dict form instead.
        return (Message.from_dict, (self.to_dict(),))

    def with_created_at(self, created_at: float) -> Message:
        """A copy with ``created_at`` set, without validating again what was validated.

        ``dataclasses.replace`` does the same but re-runs every check.
        """
        if isinstance(created_at, bool) or not isinstance(created_at, (int, float)):
            raise InvalidMessageError(f"created_at must be epoch seconds, got {created_at!r}")
        if not math.isfinite(created_at):
            raise InvalidMessageError(f"created_at must be finite, got {created_at!r}")
        return self._stamped(float(created_at), self.id)

    def stamped(self, now: float | None = None) -> Message:
        """This message with ``created_at`` (``now``, default the current time) and ``id`` (a
        :func:`new_message_id`) set where they are unset: what memories store.

        Stamp once and keep the result to retry an append safely: the retry carries the same
        id, so the store keeps the message once.
        """
        if self.created_at is not None and self.id is not None:
            return self
        created = self.created_at if self.created_at is not None else now
        if created is None:
            created = time.time()
        return self._stamped(float(created), self.id if self.id is not None else new_message_id())

    def _stamped(self, created_at: float, id: str | None) -> Message:
        # Written out field by field through the slots' own setters (no loop, no lookup by
        # name): memories stamp every message they record. tests/test_messages.py checks
        # that no field is forgotten.
        copy = object.__new__(Message)
        role, content, name, calls, call_id, metadata, created, ident = _SLOT_SETTERS
        role(copy, self.role)
        content(copy, self.content)
        name(copy, self.name)
        calls(copy, self.tool_calls)
        call_id(copy, self.tool_call_id)
        metadata(copy, self.metadata)
        created(copy, created_at)
        ident(copy, id)
        return copy

    # -- conversion --------------------------------------------------------------------------

    @classmethod
    def from_openai(cls, data: object) -> Message:
        """Build from an OpenAI Chat Completions message dict (``{"role": ..., "content":
        ...}``; content a string or an array of ``text``, ``image_url``, ``input_audio`` and
        ``file`` parts)."""
        mapping = _as_mapping(data)
        _reject_unknown_keys(mapping, _OPENAI_KEYS)
        return cls._from_mapping(mapping, openai=True)

    @classmethod
    def from_dict(cls, data: object) -> Message:
        """Inverse of :meth:`to_dict`: OpenAI's keys and parts, Zerda's parts (reasoning, an
        image by file id, extras), ``metadata``, ``created_at`` and ``id``."""
        mapping = _as_mapping(data)
        _reject_unknown_keys(mapping, _DICT_KEYS)
        return cls._from_mapping(mapping, openai=False)

    @classmethod
    def from_json(cls, text: str | bytes) -> Message:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise InvalidMessageError(f"not a JSON message: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def _from_mapping(cls, data: Mapping[str, Any], *, openai: bool) -> Message:
        if "role" not in data:
            raise InvalidMessageError(f"message has no 'role'; keys present: {sorted(data)}")
        raw_calls = data.get("tool_calls") or ()
        if isinstance(raw_calls, (str, bytes, Mapping)) or not isinstance(raw_calls, Sequence):
            raise InvalidMessageError(
                f"tool_calls must be a list of tool call dicts, got {type(raw_calls).__name__}"
            )
        content = data.get("content")
        if isinstance(content, list):
            parts = []
            for i, part in enumerate(content):
                try:
                    parts.append(part_from_dict(part, openai=openai))
                except InvalidMessageError as exc:
                    raise InvalidMessageError(f"content part {i}: {exc}") from None
            content = tuple(parts)
        metadata = data.get("metadata")
        return cls(
            role=data["role"],
            content=content,
            name=data.get("name"),
            tool_calls=tuple(ToolCall.from_openai(c, extra=not openai) for c in raw_calls),
            tool_call_id=data.get("tool_call_id"),
            metadata=MappingProxyType({}) if metadata is None else metadata,
            created_at=data.get("created_at"),
            id=data.get("id"),
        )

    def to_openai(self) -> dict[str, Any]:
        """The dict to send in an OpenAI Chat Completions ``messages`` list.

        Parts become OpenAI's content parts where the role takes them (a user message: text,
        images by URL, audio and files; other roles: text); what OpenAI Chat cannot take is
        left out: reasoning, an image known only by file id, media on other roles.
        """
        content = self.content
        out: dict[str, Any] = {
            "role": self.role.value,
            "content": _openai_content(self, content) if isinstance(content, tuple) else content,
        }
        if self.name is not None:
            out["name"] = _openai_name(self.name)
        if self.tool_calls:
            out["tool_calls"] = [_openai_call(c) for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = _openai_call_id(self.tool_call_id)
        return out

    def to_dict(self) -> dict[str, Any]:
        """A lossless, JSON-ready dict: OpenAI's keys and parts, Zerda's parts and extras,
        and metadata, created_at and id. For a message without parts, :meth:`to_openai`
        plus metadata, created_at and id."""
        content = self.content
        out: dict[str, Any] = {
            "role": self.role.value,
            "content": [p.to_dict() for p in content] if isinstance(content, tuple) else content,
        }
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.to_dict() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        if self.created_at is not None:
            out["created_at"] = self.created_at
        if self.id is not None:
            out["id"] = self.id
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @property
    def text(self) -> str:
        """The text: the content, its text parts joined by newlines, or ``""`` (an assistant
        message that only makes tool calls)."""
        content = self.content
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "\n".join(p.text for p in content if type(p) is TextPart)

    @property
    def parts(self) -> tuple[Part, ...]:
        """The content as parts: a string is one text part (none when empty or ``None``)."""
        content = self.content
        if isinstance(content, tuple):
            return content
        return (TextPart(content),) if content else ()


def _openai_content(message: Message, parts: tuple[Part, ...]) -> list[dict[str, Any]] | str | None:
    """OpenAI Chat's content for ``parts``: what the role takes, in order."""
    media = message.role is Role.USER
    out: list[dict[str, Any]] = []
    for part in parts:
        if type(part) is TextPart:
            out.append({"type": "text", "text": part.text})
        elif not media or type(part) is ReasoningPart:
            continue
        elif type(part) is ImagePart:
            if part.url is not None and _OPENAI_IMAGE.match(part.url):
                out.append(part.openai())
        elif type(part) is AudioPart:
            if part.format in _OPENAI_AUDIO:
                out.append(part.openai())
        elif type(part) is FilePart and (part.data is not None or part.file_id is not None):
            out.append(part.openai())
    if out:
        return out
    return None if message.tool_calls else ""


# What OpenAI Chat takes (its API's errors and the vision and audio guides): images by http(s)
# URL or as base64 PNG, JPEG, GIF or WebP; audio as wav or mp3; names of 1 to 64 letters,
# digits, _ and -; call ids of at most 40 characters.
_OPENAI_IMAGE = re.compile(r"https?://|data:image/(png|jpeg|gif|webp);base64,", re.IGNORECASE)
_OPENAI_AUDIO = frozenset({"wav", "mp3"})
_OPENAI_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OPENAI_CALL_ID_LENGTH = 40


def _openai_name(name: str) -> str:
    """``name`` as OpenAI takes it: other characters become ``_``, at most 64 of them."""
    if _OPENAI_NAME.fullmatch(name):
        return name
    return re.sub(r"[^A-Za-z0-9_-]", "_", name)[:64]


def _openai_call_id(call_id: str) -> str:
    """``call_id``, or, when longer than OpenAI takes, a short one made from it (the same for
    the call and its results)."""
    if len(call_id) <= _OPENAI_CALL_ID_LENGTH:
        return call_id
    return "call_" + hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:32]


def _openai_call(call: ToolCall) -> dict[str, Any]:
    out = call.to_openai()
    if len(call.id) > _OPENAI_CALL_ID_LENGTH:
        out["id"] = _openai_call_id(call.id)
    return out


# The slots' setters, in field order: what Message._stamped copies a message with.
_SLOT_SETTERS = tuple(
    Message.__dict__[f].__set__
    for f in (
        "role",
        "content",
        "name",
        "tool_calls",
        "tool_call_id",
        "metadata",
        "created_at",
        "id",
    )
)


def _as_mapping(data: object) -> Mapping[str, Any]:
    if isinstance(data, Message):
        raise InvalidMessageError("already a Message; pass it as it is")
    if not isinstance(data, Mapping):
        raise InvalidMessageError(
            f"a message must be a dict like {{'role': 'user', 'content': 'hi'}}, "
            f"got {type(data).__name__}"
        )
    return data


def _reject_unknown_keys(data: Mapping[str, Any], known: frozenset[str]) -> None:
    for key, value in data.items():
        if key in known:
            continue
        if key in _UNMODELLED_OPENAI_KEYS and not value:
            continue
        raise InvalidMessageError(
            f"unsupported message key {key!r} (value {value!r}); Zerda keeps "
            f"{sorted(known)}; put anything else in 'metadata'"
        )


# -- the batch builder memories record with ------------------------------------------------------

_ROLE_OF = {r.value: r for r in Role}
_TOOL, _ASSISTANT = Role.TOOL, Role.ASSISTANT  # module globals: Role.TOOL is a slow lookup
_NOTHING = _empty()  # the read-only empty mapping of zerda.parts: nothing else holds its dict


class _Draft:
    """A Message being built: the same slots, set by plain assignment. A frozen dataclass's
    slots are set only through ``object.__setattr__`` or the slots' descriptors, three times
    slower; once every slot is set, ``__class__ = Message`` makes the draft that Message
    (CPython allows it between classes of the same slots)."""

    __slots__ = Message.__slots__

    role: Role
    content: str | None
    name: str | None
    tool_calls: tuple[ToolCall, ...]
    tool_call_id: str | None
    metadata: Mapping[str, Any]
    created_at: float
    id: str | None


class _CallDraft:
    """A ToolCall being built, as :class:`_Draft` builds a Message."""

    __slots__ = ToolCall.__slots__

    id: str
    name: str
    arguments: str
    type: str
    extra: Mapping[str, Any]


def stamped_batch(items: Iterable[object], now: float) -> list[Message]:
    """``items`` (Messages, or dicts as :meth:`Message.from_dict` takes them) validated and
    stamped, exactly as ``stamp_batch([... Message.from_dict(d) ...], now)`` would give them;
    an :class:`InvalidMessageError` says which item: ``"message 2: ..."``.

    A plain OpenAI dict (what :func:`_plain` takes) is built straight into its slots, already
    stamped: memories record every message through here.
    """
    batch: list[Any] = []  # Messages, and drafts (see _plain) until the end
    append = batch.append
    only_drafts = True
    for item in items:
        if type(item) is dict:
            draft = _plain(item, now)
            if draft is not None:
                append(draft)
                continue
        elif type(item) is Message:
            append(item)
            only_drafts = False
            continue
        try:
            append(item if isinstance(item, Message) else Message.from_dict(item))
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"message {len(batch)}: {exc}") from None
        only_drafts = False
    if only_drafts:  # the common case: every id is new
        for draft, ident in zip(batch, new_message_ids(len(batch)) if batch else (), strict=True):
            draft.id = ident
            draft.__class__ = Message
        return batch
    for draft in batch:
        if type(draft) is _Draft:
            draft.id = None
            draft.__class__ = Message  # type: ignore[assignment]  # see _Draft
    # Given messages, and those from from_dict, lack an id or not: stamp_batch gives the ids
    # in order (copying the drafts again, in such a mixed batch).
    return stamp_batch(batch, now)


def _plain(d: dict[str, Any], now: float) -> _Draft | None:
    """``Message.from_dict(d)`` with ``created_at`` ``now``, as a draft without its id, when
    ``d`` is a plain OpenAI message (its keys among role, content, name, tool_calls and
    tool_call_id, string content, tool calls as plain dicts) that passes every check;
    ``None`` for any other dict, valid or not: ``from_dict`` then builds it, or says what is
    wrong.

    The checks are those of ``_from_mapping``, ``ToolCall`` and ``Message.__post_init__``
    for that shape; tests/test_fast_paths.py compares the two on random dicts.
    """
    if not _OPENAI_KEYS.issuperset(d):
        return None
    role = d.get("role")
    role = _ROLE_OF.get(role) if type(role) is str else None
    if role is None:
        return None
    content = d.get("content")
    if type(content) is str:
        if not (content.isascii() or valid_unicode(content)):
            return None
    elif content is not None:
        return None
    name = d.get("name")
    if name is not None and (
        type(name) is not str or not name or not (name.isascii() or valid_unicode(name))
    ):
        return None
    call_id = d.get("tool_call_id")
    if role is _TOOL:
        if type(call_id) is not str or not call_id:
            return None
        if not (call_id.isascii() or valid_unicode(call_id)):
            return None
    elif call_id is not None:
        return None
    raw = d.get("tool_calls")
    calls: tuple[ToolCall, ...] = ()
    if raw is not None:
        if type(raw) is not list:
            return None
        if raw:
            if role is not _ASSISTANT:
                return None
            built = []
            for c in raw:
                if type(c) is not dict:
                    return None
                function = c.get("function")
                if type(function) is not dict:
                    return None
                ident = c.get("id")
                fname = function.get("name")
                arguments = function.get("arguments", "{}")
                kind = c.get("type", "function")
                if not (
                    type(ident) is str
                    and ident
                    and type(fname) is str
                    and fname
                    and type(arguments) is str
                    and type(kind) is str
                    and kind
                ):
                    return None
                if not (ident.isascii() and fname.isascii() and arguments.isascii()) and not (
                    valid_unicode(ident) and valid_unicode(fname) and valid_unicode(arguments)
                ):
                    return None
                if kind != "function" and not valid_unicode(kind):
                    return None
                call = _CallDraft()
                call.id = ident
                call.name = fname
                call.arguments = arguments
                call.type = kind
                call.extra = _NOTHING
                call.__class__ = ToolCall  # type: ignore[assignment]
                built.append(call)
            calls = tuple(built)  # type: ignore[arg-type]  # ToolCalls now
    if content is None and not calls:
        return None
    m = _Draft()
    m.role = role
    m.content = content
    m.name = name
    m.tool_calls = calls
    m.tool_call_id = call_id
    m.metadata = _NOTHING
    m.created_at = now
    return m


def to_openai(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Messages as the ``messages`` list of an OpenAI Chat Completions request."""
    return [m.to_openai() for m in messages]


def from_openai(messages: Iterable[object]) -> list[Message]:
    """A list of OpenAI chat message dicts as Messages (each validated)."""
    return [Message.from_openai(m) for m in messages]


@dataclass(frozen=True, slots=True)
class Turn:
    """One user message and everything after it up to the next user message.

    A conversation that opens with an assistant message (a greeting) has a first turn with no
    user message. System messages are never part of a turn: memories pin them.
    """

    messages: tuple[Message, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.messages, tuple):
            object.__setattr__(self, "messages", tuple(self.messages))
        if not self.messages:
            raise InvalidMessageError("a turn holds at least one message")
        for i, m in enumerate(self.messages):
            if not isinstance(m, Message):
                raise InvalidMessageError(f"a turn holds Message objects, got {type(m).__name__}")
            if m.role in PINNED:
                raise InvalidMessageError(
                    f"{m.role.value} messages are pinned, never part of a turn"
                )
            if i and m.role is Role.USER:
                raise InvalidMessageError("a turn holds one user message, at its start")

    @property
    def user(self) -> Message | None:
        """The user message that opened the turn (``None`` for an opening assistant turn)."""
        first = self.messages[0]
        return first if first.role is Role.USER else None

    @property
    def reply(self) -> Message | None:
        """The last assistant message with text: the answer the user saw.

        A tool-call message with empty text (some APIs send ``""`` rather than ``None``) is
        not a reply.
        """
        for m in reversed(self.messages):
            is_text = m.content is not None and (m.content or not m.tool_calls)
            if m.role is Role.ASSISTANT and is_text:
                return m
        return None

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        return tuple(c for m in self.messages for c in m.tool_calls)

    @property
    def pending_tool_calls(self) -> tuple[ToolCall, ...]:
        """Calls made in this turn that no tool message has answered yet."""
        answered = {m.tool_call_id for m in self.messages if m.role is Role.TOOL}
        return tuple(c for c in self.tool_calls if c.id not in answered)


def group_turns(messages: Iterable[Message]) -> list[Turn]:
    """Group messages into turns; system messages are skipped (they belong to no turn)."""
    return [Turn(span) for span in _turn_spans(messages)]


def group_stored_turns(messages: Iterable[Message]) -> list[Turn]:
    """:func:`group_turns` for messages already checked (a store's): the grouping makes
    every turn valid, so each is built without checking its messages again."""
    turns = []
    for span in _turn_spans(messages):
        turn = object.__new__(Turn)
        object.__setattr__(turn, "messages", span)
        turns.append(turn)
    return turns


def _turn_spans(messages: Iterable[Message]) -> list[tuple[Message, ...]]:
    """The messages of each turn: a new one at each user message, system messages left out."""
    spans: list[tuple[Message, ...]] = []
    current: list[Message] = []
    for m in messages:
        if m.role in PINNED:
            continue
        if m.role is Role.USER and current:
            spans.append(tuple(current))
            current = []
        current.append(m)
    if current:
        spans.append(tuple(current))
    return spans
