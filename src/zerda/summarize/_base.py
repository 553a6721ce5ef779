"""The Summarizer protocol, its result value, and how messages read as ``new_lines`` text."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from zerda.errors import ConfigurationError, InvalidMessageError, SummarizerError
from zerda.messages import Message, Role

__all__ = [
    "Summarizer",
    "SummaryResult",
    "arun_summarizer",
    "check_inputs",
    "compact_json",
    "render_messages",
    "run_summarizer",
]


@runtime_checkable
class Summarizer(Protocol):
    """Folds new messages into a running summary.

    ``previous_summary`` is ``""`` when there is none yet. ``summarize`` returns the new summary,
    which replaces the previous one (it carries the previous one's facts forward). A failure of
    any kind surfaces as :class:`~zerda.SummarizerError` with the cause chained.
    """

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str: ...

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str: ...


@dataclass(frozen=True, slots=True)
class SummaryResult:
    """One summarizer call: the new summary and what it cost.

    ``prompt_tokens`` and ``completion_tokens`` are the figures the API reported
    (``usage.prompt_tokens`` / ``usage.completion_tokens``); ``None`` when there was no API or it
    reported none. ``model`` is the model the API said answered, ``None`` for a summarizer
    without one. ``seconds`` is the wall time of the call.
    """

    text: str
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    model: str | None = None
    seconds: float = 0.0


@runtime_checkable
class _ReportsStats(Protocol):
    """What the built-in summarizers offer beside the protocol: the call's figures."""

    def summarize_with_stats(
        self, previous_summary: str, messages: Sequence[Message]
    ) -> SummaryResult: ...

    async def asummarize_with_stats(
        self, previous_summary: str, messages: Sequence[Message]
    ) -> SummaryResult: ...


def check_inputs(previous_summary: object, messages: object) -> list[Message]:
    """The arguments of a summarize call, validated; ``messages`` as a new list."""
    if not isinstance(previous_summary, str):
        raise ConfigurationError(
            "previous_summary must be a string ('' for none), got "
            f"{type(previous_summary).__name__}"
        )
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence):
        raise ConfigurationError(
            f"messages must be a sequence of Message, got {type(messages).__name__}"
        )
    for m in messages:
        if not isinstance(m, Message):
            raise InvalidMessageError(
                f"a summarizer takes Message objects, got {type(m).__name__} "
                "(use zerda.from_openai for OpenAI dicts)"
            )
    return list(messages)


def _checked_text(text: object, summarizer: object) -> str:
    if not isinstance(text, str):
        raise SummarizerError(
            f"{summarizer!r} returned {type(text).__name__}, expected the summary as a str"
        )
    return text


def run_summarizer(
    summarizer: Summarizer, previous_summary: str, messages: Sequence[Message]
) -> SummaryResult:
    """Call any summarizer and return a :class:`SummaryResult`; what memories use.

    The built-in summarizers report their figures; for any other object that fits the
    protocol, the result has the text and the time taken. Whatever the summarizer raises
    arrives as :class:`~zerda.SummarizerError` with the cause chained.
    """
    batch = check_inputs(previous_summary, messages)
    if isinstance(summarizer, _ReportsStats):
        return summarizer.summarize_with_stats(previous_summary, batch)
    start = time.perf_counter()
    try:
        text = summarizer.summarize(previous_summary, batch)
    except SummarizerError:
        raise
    except Exception as exc:
        raise SummarizerError(f"{summarizer!r} failed: {type(exc).__name__}: {exc}") from exc
    return SummaryResult(_checked_text(text, summarizer), seconds=time.perf_counter() - start)


async def arun_summarizer(
    summarizer: Summarizer, previous_summary: str, messages: Sequence[Message]
) -> SummaryResult:
    """The async twin of :func:`run_summarizer`."""
    batch = check_inputs(previous_summary, messages)
    if isinstance(summarizer, _ReportsStats):
        return await summarizer.asummarize_with_stats(previous_summary, batch)
    start = time.perf_counter()
    try:
        text = await summarizer.asummarize(previous_summary, batch)
    except SummarizerError:
        raise
    except Exception as exc:
        raise SummarizerError(f"{summarizer!r} failed: {type(exc).__name__}: {exc}") from exc
    return SummaryResult(_checked_text(text, summarizer), seconds=time.perf_counter() - start)


def render_messages(messages: Sequence[Message]) -> str:
    """Messages as ``new_lines`` text: one line a message, one line a tool call.

    ::

        user: one latte please
        assistant -> add_item({"item":"latte","quantity":1})
        tool add_item: {"order_id":"28740"}
        assistant: Your order 28740 is in.

    A name shows as ``user (Ada): ...``; a tool result is labelled with the name of the call it
    answers when that call is among ``messages``. JSON arguments and results lose the
    whitespace outside their strings and nothing else (numbers stay as written).
    """
    call_names: dict[str, str] = {}
    lines: list[str] = []
    for m in messages:
        label = m.role.value if m.name is None else f"{m.role.value} ({m.name})"
        if m.role is Role.TOOL:
            call = m.name or call_names.get(m.tool_call_id or "")
            label = f"tool {call}" if call else "tool"
            lines.append(f"{label}: {compact_json(m.text)}")
            continue
        if m.content or not m.tool_calls:
            lines.append(f"{label}: {m.text}")
        for c in m.tool_calls:
            call_names[c.id] = c.name
            lines.append(f"{label} -> {c.name}({compact_json(c.arguments)})")
    return "\n".join(lines)


def compact_json(text: str) -> str:
    """``text`` without the whitespace outside strings when it is JSON, else unchanged."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return text
    try:
        json.loads(stripped)
    except ValueError:
        return text
    out: list[str] = []
    in_string = escaped = False
    for ch in stripped:
        if in_string:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
            out.append(ch)
        elif not ch.isspace():
            out.append(ch)
    return "".join(out)
