"""Messages, tool calls and turns: frozen values, validation, and OpenAI / JSON conversion."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from zerda.errors import InvalidMessageError

__all__ = [
    "Message",
    "Role",
    "ToolCall",
    "Turn",
    "from_openai",
    "group_turns",
    "to_openai",
]

# Keys of an OpenAI chat message that Zerda does not model. They are accepted when empty
# (the SDK's ``model_dump()`` always emits them) and refused when set, since dropping them
# would lose data.
_UNMODELLED_OPENAI_KEYS = frozenset({"refusal", "audio", "function_call", "annotations"})
_OPENAI_KEYS = frozenset({"role", "content", "name", "tool_calls", "tool_call_id"})
_DICT_KEYS = _OPENAI_KEYS | {"metadata", "created_at"}


class Role(str, Enum):
    """Who said a message. Compares equal to its string value: ``Role.USER == "user"``."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"

    def __str__(self) -> str:
        return self.value


_ROLES = ", ".join(repr(r.value) for r in Role)


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

    def __post_init__(self) -> None:
        for attr in ("id", "name", "type"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not value:
                raise InvalidMessageError(
                    f"tool call {attr} must be a non-empty string, got {value!r}"
                )
        if not isinstance(self.arguments, str):
            raise InvalidMessageError(
                f"tool call {self.name!r}: arguments must be a JSON string, "
                f"got {type(self.arguments).__name__} (use json.dumps)"
            )

    @classmethod
    def from_openai(cls, data: object) -> ToolCall:
        """Build from OpenAI's ``{"id", "type", "function": {"name", "arguments"}}``."""
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
        )

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": self.type,
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message. Immutable; build a changed copy with ``dataclasses.replace``.

    ``content`` is a string; it may be ``None`` only on an assistant message that makes tool
    calls (as in OpenAI's format). A tool message must name the call it answers in
    ``tool_call_id``. ``metadata`` is any JSON-serializable mapping, kept with the message but
    never sent to the model. ``created_at`` is epoch seconds; memories stamp it when unset.
    """

    role: Role
    content: str | None
    name: str | None = field(default=None, kw_only=True)
    tool_calls: tuple[ToolCall, ...] = field(default=(), kw_only=True)
    tool_call_id: str | None = field(default=None, kw_only=True)
    metadata: Mapping[str, Any] = field(
        default_factory=lambda: MappingProxyType({}), kw_only=True, hash=False
    )
    created_at: float | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        role = _role(self.role)
        object.__setattr__(self, "role", role)
        self._check_fields(role)
        self._check_metadata()
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
            raise InvalidMessageError(
                f"{role.value} message content must be a string, got {type(content).__name__}"
                + (" (join the text parts first)" if isinstance(content, list) else "")
            )
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
                f"{role.value} message content must be a string; None is allowed only on an "
                "assistant message that makes tool calls"
            )
        if role is Role.TOOL:
            if not isinstance(self.tool_call_id, str) or not self.tool_call_id:
                raise InvalidMessageError(
                    "a tool message needs tool_call_id, the id of the call it answers, "
                    f"got {self.tool_call_id!r}"
                )
        elif self.tool_call_id is not None:
            raise InvalidMessageError(
                f"only tool messages carry tool_call_id, not {role.value} messages"
            )
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise InvalidMessageError(f"name must be a non-empty string or None, got {self.name!r}")

    def _check_metadata(self) -> None:
        metadata = self.metadata
        if not isinstance(metadata, Mapping):
            raise InvalidMessageError(f"metadata must be a mapping, got {type(metadata).__name__}")
        if isinstance(metadata, MappingProxyType) and not metadata:
            return
        copied = dict(metadata)
        for key in copied:
            if not isinstance(key, str):
                raise InvalidMessageError(f"metadata keys must be strings, got {key!r}")
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

        ``dataclasses.replace`` does the same but re-runs every check; memories stamp every
        message they record, so this is on the hot path.
        """
        if isinstance(created_at, bool) or not isinstance(created_at, (int, float)):
            raise InvalidMessageError(f"created_at must be epoch seconds, got {created_at!r}")
        if not math.isfinite(created_at):
            raise InvalidMessageError(f"created_at must be finite, got {created_at!r}")
        # Written out field by field (no loop, no getattr): this runs for every message a
        # memory records. tests/test_messages.py checks that no field is forgotten.
        copy = object.__new__(Message)
        _set = object.__setattr__
        _set(copy, "role", self.role)
        _set(copy, "content", self.content)
        _set(copy, "name", self.name)
        _set(copy, "tool_calls", self.tool_calls)
        _set(copy, "tool_call_id", self.tool_call_id)
        _set(copy, "metadata", self.metadata)
        _set(copy, "created_at", float(created_at))
        return copy

    # -- conversion --------------------------------------------------------------------------

    @classmethod
    def from_openai(cls, data: object) -> Message:
        """Build from an OpenAI chat message dict (``{"role": ..., "content": ...}``)."""
        mapping = _as_mapping(data)
        _reject_unknown_keys(mapping, _OPENAI_KEYS)
        return cls._from_mapping(mapping)

    @classmethod
    def from_dict(cls, data: object) -> Message:
        """Inverse of :meth:`to_dict`: OpenAI keys plus ``metadata`` and ``created_at``."""
        mapping = _as_mapping(data)
        _reject_unknown_keys(mapping, _DICT_KEYS)
        return cls._from_mapping(mapping)

    @classmethod
    def from_json(cls, text: str | bytes) -> Message:
        try:
            data = json.loads(text)
        except ValueError as exc:
            raise InvalidMessageError(f"not a JSON message: {exc}") from exc
        return cls.from_dict(data)

    @classmethod
    def _from_mapping(cls, data: Mapping[str, Any]) -> Message:
        if "role" not in data:
            raise InvalidMessageError(f"message has no 'role'; keys present: {sorted(data)}")
        raw_calls = data.get("tool_calls") or ()
        if isinstance(raw_calls, (str, bytes, Mapping)) or not isinstance(raw_calls, Sequence):
            raise InvalidMessageError(
                f"tool_calls must be a list of tool call dicts, got {type(raw_calls).__name__}"
            )
        metadata = data.get("metadata")
        return cls(
            role=data["role"],
            content=data.get("content"),
            name=data.get("name"),
            tool_calls=tuple(ToolCall.from_openai(c) for c in raw_calls),
            tool_call_id=data.get("tool_call_id"),
            metadata=MappingProxyType({}) if metadata is None else metadata,
            created_at=data.get("created_at"),
        )

    def to_openai(self) -> dict[str, Any]:
        """The dict to send in an OpenAI Chat Completions ``messages`` list."""
        out: dict[str, Any] = {"role": self.role.value, "content": self.content}
        if self.name is not None:
            out["name"] = self.name
        if self.tool_calls:
            out["tool_calls"] = [c.to_openai() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out

    def to_dict(self) -> dict[str, Any]:
        """A lossless, JSON-ready dict: :meth:`to_openai` plus metadata and created_at."""
        out = self.to_openai()
        if self.metadata:
            out["metadata"] = dict(self.metadata)
        if self.created_at is not None:
            out["created_at"] = self.created_at
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    @property
    def text(self) -> str:
        """The content, or ``""`` for an assistant message that only makes tool calls."""
        return self.content if self.content is not None else ""


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
            if m.role is Role.SYSTEM:
                raise InvalidMessageError("system messages are pinned, never part of a turn")
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
    turns: list[Turn] = []
    current: list[Message] = []
    for m in messages:
        if m.role is Role.SYSTEM:
            continue
        if m.role is Role.USER and current:
            turns.append(Turn(tuple(current)))
            current = []
        current.append(m)
    if current:
        turns.append(Turn(tuple(current)))
    return turns
