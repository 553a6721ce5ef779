"""Messages, tool calls and turns: frozen values, validation, and OpenAI / JSON conversion."""

from __future__ import annotations

import json
import math
import random
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any

from zerda.errors import InvalidMessageError, ZerdaError

__all__ = [
    "MAX_ID_LENGTH",
    "MAX_METADATA_DEPTH",
    "Message",
    "Role",
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

MAX_METADATA_DEPTH = 64
"""How deeply metadata may nest (a mapping or a list inside another counts one level). Deeper
metadata is refused with :class:`~zerda.InvalidMessageError`: no store could take it back
without running out of stack, and nobody means it."""

MAX_ID_LENGTH = 255
"""The longest message id accepted."""


# -- text that every store can hold ---------------------------------------------------------


def check_text(value: str, what: str, error: type[ZerdaError] = InvalidMessageError) -> None:
    """Refuse a string that is not valid Unicode: a lone surrogate (``"\\ud800"``) has no
    UTF-8 form, so no store, file or wire could hold it."""
    if value.isascii():
        return
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{what} holds a lone surrogate {value[exc.start]!r} at position {exc.start}: "
            "text must be valid Unicode (decode bytes with errors='replace', or drop it)"
        ) from None


def check_json_value(
    value: object,
    what: str,
    error: type[ZerdaError] = InvalidMessageError,
    max_depth: int = MAX_METADATA_DEPTH,
) -> None:
    """Refuse what no store could round-trip: nesting deeper than ``max_depth``, keys that are
    not strings, and text that is not valid Unicode. Walks without recursion, so that the
    check itself never runs out of stack; ``json.dumps`` checks the rest (types, NaN)."""
    stack: list[tuple[object, int, tuple[object, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            check_text(item, _at(what, path), error)
            continue
        if isinstance(item, Mapping):
            children: Iterable[tuple[object, object]] = item.items()
        elif isinstance(item, (list, tuple)):
            children = enumerate(item)
        else:
            continue
        if depth >= max_depth:
            raise error(
                f"{_at(what, path)} nests deeper than {max_depth} levels "
                "(zerda.messages.MAX_METADATA_DEPTH)"
            )
        for key, child in children:
            if isinstance(item, Mapping):
                if not isinstance(key, str):
                    raise error(f"{_at(what, path)} keys must be strings, got {key!r}")
                check_text(key, f"a key of {_at(what, path)}", error)
            stack.append((child, depth + 1, (*path, key)))


def _at(what: str, path: tuple[object, ...]) -> str:
    if len(path) > 6:  # a deep path: its ends say enough
        return _at(what, path[:3]) + "[...]" + "".join(f"[{key!r}]" for key in path[-2:])
    return what + "".join(f"[{key!r}]" for key in path)


# -- message ids ----------------------------------------------------------------------------

_id_lock = threading.Lock()
_last_id = 0
_LOW_62 = (1 << 62) - 1


def new_message_id() -> str:
    """A new message id: a UUID version 7 (RFC 9562), as text.

    Ids sort by creation time as strings, and within one process each is greater than the
    one before, even within a millisecond. 74 random bits keep ids from different processes
    and machines apart.
    """
    return _uuid7(_id_block(1))


def new_message_ids(count: int) -> list[str]:
    """``count`` new message ids, in increasing order (one clock reading and random draw)."""
    first = _id_block(count)
    low = first & _LOW_62
    if low + count > _LOW_62:  # the block carries into the high bits (once in 2**62 / count)
        return [_uuid7(first + i) for i in range(count)]
    # One head for the block: only the low 62 bits differ, so only they are formatted again.
    head = _uuid7(first)[:19]
    return [
        head + "%04x-%012x" % (0x8000 | n >> 48, n & 0xFFFFFFFFFFFF)  # noqa: UP031 - hot path
        for n in range(low, low + count)
    ]


def _id_block(count: int) -> int:
    """The first of ``count`` fresh 122-bit values: milliseconds, then 74 random bits; each
    greater than every value given before in this process."""
    global _last_id
    # Mersenne Twister bits: unique enough beside the time, reseeded in forked children, and
    # several times faster than os.urandom on this path (every message a memory stores).
    value = (time.time_ns() // 1_000_000) << 74 | random.getrandbits(74)
    with _id_lock:
        if value <= _last_id:
            value = _last_id + 1
        _last_id = value + count - 1
    return value


def _uuid7(value: int) -> str:
    """The UUID text of a 122-bit value: 48 bits of milliseconds, the version (7), 12 bits,
    the variant (0b10), 62 bits."""
    ms, low = value >> 74, value & _LOW_62
    return "%08x-%04x-7%03x-%04x-%012x" % (  # noqa: UP031 - the fastest way, on a hot path
        ms >> 16,
        ms & 0xFFFF,
        value >> 62 & 0xFFF,
        0x8000 | low >> 48,
        low & 0xFFFFFFFFFFFF,
    )


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
            check_text(value, f"tool call {attr}")
        if not isinstance(self.arguments, str):
            raise InvalidMessageError(
                f"tool call {self.name!r}: arguments must be a JSON string, "
                f"got {type(self.arguments).__name__} (use json.dumps)"
            )
        check_text(self.arguments, f"the arguments of tool call {self.name!r}")

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
    ``tool_call_id``. ``metadata`` is any JSON-serializable mapping (nested at most
    :data:`MAX_METADATA_DEPTH` deep), kept with the message but never sent to the model.
    ``created_at`` is epoch seconds and ``id`` identifies the message in its session (see
    :func:`new_message_id`); memories stamp both when unset. Stores keep a message once per
    id, so appending it again (a retry) stores nothing. Text must be valid Unicode.
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
        if content is not None:
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
        """Build from an OpenAI chat message dict (``{"role": ..., "content": ...}``)."""
        mapping = _as_mapping(data)
        _reject_unknown_keys(mapping, _OPENAI_KEYS)
        return cls._from_mapping(mapping)

    @classmethod
    def from_dict(cls, data: object) -> Message:
        """Inverse of :meth:`to_dict`: OpenAI keys plus ``metadata``, ``created_at`` and ``id``."""
        mapping = _as_mapping(data)
        _reject_unknown_keys(mapping, _DICT_KEYS)
        return cls._from_mapping(mapping)

    @classmethod
    def from_json(cls, text: str | bytes) -> Message:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError) as exc:  # RecursionError: nested too deep
            raise InvalidMessageError(f"not a JSON message: {exc}") from None
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
            id=data.get("id"),
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
        """A lossless, JSON-ready dict: :meth:`to_openai` plus metadata, created_at and id."""
        out = self.to_openai()
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
        """The content, or ``""`` for an assistant message that only makes tool calls."""
        return self.content if self.content is not None else ""


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
