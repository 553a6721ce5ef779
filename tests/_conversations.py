"""Helpers shared by the memory tests, written independently of the library's own grouping."""

from __future__ import annotations

from zerda.messages import Message, Role, ToolCall


def scan_turns(messages: list[Message]) -> list[list[Message]]:
    """The turns, found by scanning: a new one at each user message; system messages in none."""
    turns: list[list[Message]] = []
    for m in messages:
        if m.role is Role.SYSTEM:
            continue
        if m.role is Role.USER or not turns:
            turns.append([])
        turns[-1].append(m)
    return turns


def conversation(turns: int, tag: str = "") -> list[Message]:
    """A system prompt, then ``turns`` turns; every third one calls a tool."""
    out = [Message(Role.SYSTEM, "You take coffee orders.")]
    for t in range(turns):
        out.append(Message(Role.USER, f"{tag}order {t}: a flat white, please"))
        if t % 3 == 1:
            call = ToolCall(f"call_{tag}{t}", "price", f'{{"item": "flat white", "n": {t}}}')
            out.append(Message(Role.ASSISTANT, None, tool_calls=(call,)))
            out.append(Message(Role.TOOL, "3.20", tool_call_id=call.id))
        out.append(Message(Role.ASSISTANT, f"{tag}order {t} is on its way."))
    return out
