"""Plain-text rendering for the ``zerda`` command: aligned tables, times, sizes, messages."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence

from zerda.messages import Message, Role

__all__ = ["brief", "clip", "local_time", "plural", "size", "table", "terminal_width"]


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


def brief(message: Message) -> str:
    """One line for a message: its text, its tool calls as ``-> name(arguments)``, and for a
    tool result the id of the call it answers, ``[call_1] {...}``."""
    parts = []
    if message.name is not None:
        parts.append(f"({message.name})")
    if message.role is Role.TOOL:
        parts.append(f"[{message.tool_call_id}]")
    if message.content:
        parts.append(_one_line(message.content))
    elif message.content == "" and not message.tool_calls:
        parts.append('""')
    if message.tool_calls:
        calls = ", ".join(f"{c.name}({_one_line(c.arguments)})" for c in message.tool_calls)
        parts.append(f"-> {calls}")
    return " ".join(parts)
