"""Reading JSONL conversations (or a JSON array of them) for ``zerda import`` and ``replay``:
every line checked first."""

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
ARRAY_FORM_NAMES: dict[Form, str] = {
    "messages": "a JSON array of messages",
    "conversations": "a JSON array of conversations",
}

# Enough bad lines to see the pattern; a file that is wrong everywhere would only flood.
MAX_PROBLEMS = 10


@dataclass(slots=True)
class Parsed:
    """What a file holds: its messages in order, or the problems that stop the import.

    ``lines`` gives the line each message came from; ``starts`` the index in ``messages`` where
    each conversation begins, ``records`` each conversation's other keys (its ``id`` and the
    like) and ``conversation_lines`` the line it is on (conversations only). ``array`` says
    the file was a JSON array rather than JSON Lines.
    """

    form: Form | None = None
    messages: list[Message] = field(default_factory=list)
    conversations: int = 0
    problems: list[str] = field(default_factory=list)
    bad_lines: int = 0
    lines: list[int] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    conversation_lines: list[int] = field(default_factory=list)
    array: bool = False

    @property
    def form_name(self) -> str:
        """What the file holds, for people: ``one conversation a line`` and the like."""
        assert self.form is not None
        return (ARRAY_FORM_NAMES if self.array else FORM_NAMES)[self.form]

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

    A file that starts with ``[`` is one JSON array instead, as a ``.json`` file holds: its
    items are what lines are, and a problem names the line its item starts on and the
    item's number.
    """
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a byte order mark, as some Windows editors write
    if data.lstrip().startswith(b"["):
        return _parse_array(data, name)
    reader = _Reader(name)
    parsed = reader.parsed
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            value = _decode(raw)
        except InvalidMessageError as exc:
            reader.problem(number, str(exc))
            continue
        reader.add(value, number, number)
    if parsed.bad_lines and data.lstrip().startswith(b"{") and _one_object(data):
        # Pretty-printed JSON: every line of it is a bad line, and saying so would not help.
        return Parsed(
            problems=[
                f"{name}:1: one JSON object over several lines; Zerda reads JSON Lines (a "
                "message or a conversation on each line) or a JSON array of them: put the "
                "object on one line, or inside [ ]"
            ],
            bad_lines=1,
        )
    return parsed


@dataclass(slots=True)
class _Reader:
    """Adds the values of a file to ``parsed``, one line (or array item) at a time."""

    name: str
    parsed: Parsed = field(default_factory=Parsed)
    first_line: int = 0
    seen: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (item, line)

    def problem(self, line: int, reason: str) -> None:
        self.parsed.bad_lines += 1
        if len(self.parsed.problems) < MAX_PROBLEMS:
            self.parsed.problems.append(f"{self.name}:{line}: {reason}")

    def add(self, value: object, item: int, line: int, where: str = "") -> None:
        """``value``, read from ``line``; ``item`` tells values apart (the line, or the index
        in an array, where several items can share a line)."""
        parsed = self.parsed
        try:
            if parsed.form is None:
                parsed.form = "conversations" if _is_conversation(value) else "messages"
                self.first_line = line
            if parsed.form == "conversations":
                messages = _conversation(value, self.first_line)
            else:
                messages = [_message(value, self.first_line)]
            for m in messages:
                if m.id is None:
                    continue
                if self.seen.setdefault(m.id, (item, line))[0] != item:
                    raise InvalidMessageError(
                        f"message id {m.id!r} is on line {self.seen[m.id][1]} already; an id "
                        "names one message"
                    )
        except InvalidMessageError as exc:
            self.problem(line, f"{where}{exc}")
            return
        if parsed.form == "conversations":
            assert isinstance(value, Mapping)  # _conversation checked it
            parsed.starts.append(len(parsed.messages))
            parsed.conversations += 1
            parsed.records.append({k: v for k, v in value.items() if k != "messages"})
            parsed.conversation_lines.append(line)
        parsed.messages.extend(messages)
        parsed.lines.extend([line] * len(messages))


def _one_object(data: bytes) -> bool:
    """Whether ``data`` is a single JSON object over several lines (as JSON Lines it is not;
    an object on one line is a line of JSON Lines, whose problem is its own)."""
    if sum(1 for line in data.split(b"\n") if line.strip()) < 2:
        return False
    try:
        return isinstance(json.loads(data.decode("utf-8")), Mapping)
    except (UnicodeDecodeError, RecursionError, ValueError):  # JSONDecodeError is a ValueError
        return False


def _parse_array(data: bytes, name: str) -> Parsed:
    """A JSON array of messages or of conversations, each item read as a line is."""
    reader = _Reader(name)
    reader.parsed.array = True
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        reader.problem(line, f"not UTF-8 text (byte {exc.start + 1})")
        return reader.parsed
    decoder = json.JSONDecoder()
    at, line = 0, 1  # a place in the text, and its line: counted forwards only, once
    position = text.index("[") + 1
    item = 0

    def line_of(i: int) -> int:
        nonlocal at, line
        line += text.count("\n", at, i)
        at = i
        return line

    while True:
        position = _skip_space(text, position)
        if position == len(text):
            reader.problem(line_of(position), "not JSON: the array has no closing ]")
            break
        if text[position] == "]":
            rest = _skip_space(text, position + 1)
            if rest < len(text):
                reader.problem(line_of(rest), "not JSON: text after the array's closing ]")
            break
        if item:
            if text[position] != ",":
                reader.problem(line_of(position), f"not JSON: expected , or ] after item {item}")
                break
            position = _skip_space(text, position + 1)
        try:
            value, end = decoder.raw_decode(text, position)
        except json.JSONDecodeError as exc:
            reader.problem(exc.lineno, f"item {item + 1}: not JSON: {exc.msg} (column {exc.colno})")
            break
        except (RecursionError, ValueError) as exc:
            reason = _unreadable(exc)
            reader.problem(line_of(position), f"item {item + 1}: {reason}")
            break
        item += 1
        reader.add(value, item, line_of(position), f"item {item}: ")
        position = end
    return reader.parsed


def _skip_space(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


def _decode(raw: bytes) -> Any:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidMessageError(f"not UTF-8 text (byte {exc.start + 1})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidMessageError(f"not JSON: {exc.msg} (column {exc.colno})") from None
    except (RecursionError, ValueError) as exc:
        raise InvalidMessageError(_unreadable(exc)) from None


def _unreadable(exc: RecursionError | ValueError) -> str:
    """Why JSON that parses could not be read: too deep, or a number too long."""
    if isinstance(exc, RecursionError):
        return (
            f"nested too deeply to read (Zerda's limit is {MAX_METADATA_DEPTH} levels of metadata)"
        )
    reason = str(exc).split(";")[0]  # not Python's advice on raising its limit
    return f"not a JSON value Zerda can read: {reason}"


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
