"""Plain-text rendering for the ``zerda`` command: aligned tables, times, sizes, messages."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence

from zerda._media import audio_length, decoded_size, image_size, split_data_url
from zerda.messages import Message, Role
from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart

__all__ = [
    "SHORT_ID",
    "brief",
    "clip",
    "describe",
    "local_time",
    "plural",
    "short_id",
    "size",
    "table",
    "terminal_width",
]

SHORT_ID = 8
"""How many of an id's last characters ``zerda show`` prints (``--ids``: all of them)."""


def table(rows: Sequence[Sequence[object]], align: str, indent: str = "") -> list[str]:
    """Rows as lines of aligned columns; ``align`` holds ``l`` or ``r`` for each column."""
    cells = [[str(c) for c in row] for row in rows]
    if not cells:
        return []
    widths = [max(len(row[i]) for row in cells) for i in range(len(align))]
    lines = []
    for row in cells:
        padded = [
            cell.rjust(w) if a == "r" else cell.ljust(w)
            for cell, w, a in zip(row, widths, align, strict=True)
        ]
        lines.append((indent + "  ".join(padded)).rstrip())
    return lines


def plural(count: int, noun: str) -> str:
    """``1 turn``, ``2 turns``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def local_time(epoch: float | None) -> str:
    """``2026-11-29 21:03`` in local time, ``-`` for no time."""
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(epoch))


def size(n: int) -> str:
    """A byte count for people: ``48.0 KiB (49,152 bytes)``."""
    if n < 1024:
        return f"{n:,} bytes"
    value = n / 1024
    unit = "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value /= 1024
        unit = bigger
    return f"{value:.1f} {unit} ({n:,} bytes)"


def terminal_width() -> int:
    """Columns to fit output in: the terminal's, or 100 when output goes to a pipe or file."""
    return shutil.get_terminal_size((100, 24)).columns


def _one_line(text: str) -> str:
    return " ".join(text.split())


def clip(text: str, width: int) -> str:
    """``text`` cut to ``width`` characters, marked with ``...`` where it was cut."""
    if len(text) <= width:
        return text
    return text[: max(width - 3, 0)] + "..."


def short_id(message_id: str | None) -> str:
    """A message id as ``zerda show`` prints it: its last :data:`SHORT_ID` characters, the
    random end of the UUIDs memories stamp (ids stamped together share their start), or the
    whole id when it is no longer; ``-`` for a message without one."""
    return "-" if message_id is None else message_id[-SHORT_ID:]


def brief(message: Message) -> str:
    """One line for a message: its text and parts (media described, never their data), its
    tool calls as ``-> name(arguments)``, and for a tool result the id of the call it answers,
    ``[call_1] {...}``."""
    parts = []
    if message.name is not None:
        parts.append(f"({message.name})")
    if message.role is Role.TOOL:
        parts.append(f"[{message.tool_call_id}]")
    content = message.content
    shown = (
        " ".join(filter(None, map(describe, content)))
        if isinstance(content, tuple)
        else _one_line(content or "")
    )
    if shown:
        parts.append(shown)
    elif content is not None and not message.tool_calls:
        parts.append('""')
    if message.tool_calls:
        calls = ", ".join(f"{c.name}({_one_line(c.arguments)})" for c in message.tool_calls)
        parts.append(f"-> {calls}")
    return " ".join(parts)


def describe(part: Part) -> str:
    """A part on one line: its text, or a short bracketed description for the others:
    ``[image png 1024x768 high]``, ``[audio wav 3.2 s]``, ``[file report.pdf 120 KiB]``,
    ``[reasoning: first, ...]``."""
    if type(part) is TextPart:
        return _one_line(part.text)
    words: list[str]
    if type(part) is ImagePart:
        words = ["image", *_source(part.url, part.file_id, image=True)]
        if part.detail is not None:
            words.append(part.detail)
    elif type(part) is AudioPart:
        seconds, size = audio_length(part)
        length = _short_size(size) if seconds is None else _seconds(seconds)
        words = ["audio", _one_line(part.format), length]
    elif type(part) is FilePart:
        if part.filename is not None:
            words = ["file", clip(_one_line(part.filename), _NAME_WIDTH)]
            if part.data is not None:
                words.append(_data(part.data, image=False)[-1])
        elif part.data is not None:
            words = ["file", *_data(part.data, image=False)]
        else:
            words = ["file", *_source(part.url, part.file_id, image=False)]
    else:
        assert type(part) is ReasoningPart
        text = _one_line(part.text)
        if text:
            return f"[reasoning: {clip(text, _NAME_WIDTH)}]"
        return "[reasoning: encrypted]" if part.encrypted is not None else "[reasoning]"
    return f"[{' '.join(words)}]"


_NAME_WIDTH = 40


def _source(url: str | None, file_id: str | None, *, image: bool) -> list[str]:
    """Where a medium is: its type and size for inline data, else its URL, else its file id."""
    if url is not None and url.startswith("data:"):
        return _data(url, image=image)
    if url is not None:
        return [clip(_one_line(url), _NAME_WIDTH)]
    return [clip(_one_line(file_id or ""), _NAME_WIDTH)]


def _data(data: str, *, image: bool) -> list[str]:
    """Inline data as its type and its size (an image's in pixels when its header says)."""
    inline = split_data_url(data)
    if inline is None:  # another data: URL (or not one): its type if it says one, its size
        header, _, payload = data.partition(",") if data.startswith("data:") else ("", "", data)
        n = decoded_size(payload) if header.endswith(";base64") else len(payload)
        return [header[5:].split(";")[0] or "data", _short_size(n)]
    media_type, encoded = inline
    pixels = image_size(data) if image else None
    return [
        media_type.split("/")[-1] if image else media_type,
        f"{pixels[0]}x{pixels[1]}" if pixels else _short_size(decoded_size(encoded)),
    ]


def _short_size(n: int) -> str:
    """``812 B``, ``48 KiB``, ``1.2 MiB``."""
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}" if value < 10 else f"{value:.0f} {unit}"


def _seconds(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
