"""Reading JSONL conversations for ``zerda import`` and ``replay``: every line checked first."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from zerda.errors import InvalidMessageError
from zerda.messages import MAX_METADATA_DEPTH, Message

__all__ = ["FORM_NAMES", "Parsed", "parse_jsonl"]

Form = Literal["messages", "conversations"]

FORM_NAMES: dict[Form, str] = {
    "messages": "one message a line",
    "conversations": "one conversation a line",
}

# Enough bad lines to see the pattern; a file that is wrong everywhere would only flood.
MAX_PROBLEMS = 10


@dataclass(slots=True)
class Parsed:
    """What a file holds: its messages in order, or the problems that stop the import.

    ``lines`` gives the line each message came from; ``starts`` the index in ``messages`` where
    each conversation begins (one conversation a line only).
    """

    form: Form | None = None
    messages: list[Message] = field(default_factory=list)
    conversations: int = 0
    problems: list[str] = field(default_factory=list)
    bad_lines: int = 0
    lines: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)

    def spans(self) -> list[tuple[int, int]]:
        """Each conversation as ``(start, end)`` in ``messages``; a file of one message a line
        is one conversation."""
        if self.form != "conversations":
            return [(0, len(self.messages))] if self.messages else []
        return list(zip(self.starts, [*self.starts[1:], len(self.messages)], strict=True))


def parse_jsonl(data: bytes, name: str) -> Parsed:
    """Parse ``data``, a JSONL file called ``name`` in problems (``FILE:LINE: reason``).

    The first non-blank line decides the form: an object with a ``messages`` list is a
    conversation, anything else a message; every other line must have the same form.
    Blank lines are skipped.
    """
    parsed = Parsed()
    first_line = 0
    seen: dict[str, int] = {}  # message id -> the line it is on
    for number, raw in enumerate(data.split(b"\n"), 1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]  # a byte order mark, as some Windows editors write
        if not raw.strip():
            continue
        try:
            value = _decode(raw)
            if parsed.form is None:
                parsed.form = "conversations" if _is_conversation(value) else "messages"
                first_line = number
            if parsed.form == "conversations":
                messages = _conversation(value, first_line)
                parsed.starts.append(len(parsed.messages))
                parsed.conversations += 1
            else:
                messages = [_message(value, first_line)]
            for m in messages:
                if m.id is not None and seen.setdefault(m.id, number) != number:
                    raise InvalidMessageError(
                        f"message id {m.id!r} is on line {seen[m.id]} already; an id names "
                        "one message"
                    )
            parsed.messages.extend(messages)
            parsed.lines.extend([number] * len(messages))
        except InvalidMessageError as exc:
            parsed.bad_lines += 1
            if len(parsed.problems) < MAX_PROBLEMS:
                parsed.problems.append(f"{name}:{number}: {exc}")
    return parsed


def _decode(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessageError(f"not UTF-8 text (byte {exc.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidMessageError(f"not JSON: {exc.msg} (column {exc.colno})") from None
    except RecursionError:
        raise InvalidMessageError(
            f"nested too deeply to read (Zerda's limit is {MAX_METADATA_DEPTH} levels of metadata)"
        ) from None
    except ValueError as exc:  # a number too long to convert, and the like
        reason = str(exc).split(";")[0]  # not Python's advice on raising its limit
        raise InvalidMessageError(f"not a JSON value Zerda can read: {reason}") from None


def _is_conversation(value: object) -> bool:
    return isinstance(value, Mapping) and "messages" in value and "role" not in value


def _message(value: object, first_line: int) -> Message:
    if _is_conversation(value):
        raise InvalidMessageError(
            f'a conversation ({{"messages": [...]}}) in a file of one message a line '
            f"(line {first_line} is a message)"
        )
    return Message.from_dict(value)


def _conversation(value: object, first_line: int) -> list[Message]:
    if not _is_conversation(value):
        raise InvalidMessageError(
            f'expected a conversation ({{"messages": [...]}}) like line {first_line}, '
            f"got {_kind(value)}"
        )
    assert isinstance(value, Mapping)  # _is_conversation checked it
    items = value["messages"]
    if not isinstance(items, list):
        raise InvalidMessageError(f"'messages' must be a list, got {type(items).__name__}")
    messages = []
    for i, item in enumerate(items, 1):
        try:
            messages.append(Message.from_dict(item))
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"message {i}: {exc}") from None
    return messages


def _kind(value: object) -> str:
    if isinstance(value, Mapping):
        return "a message" if "role" in value else f"an object with keys {sorted(value)[:8]}"
    return f"a JSON {type(value).__name__}"
