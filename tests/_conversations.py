"""Helpers shared by the memory tests, written independently of the library's own grouping."""

from __future__ import annotations

import dataclasses

from zerda.messages import Message, Role, ToolCall


def scan_turns(messages: list[Message]) -> list[list[Message]]:
    """The turns, found by scanning: a new one at each user message; system and developer
    messages in none."""
    turns: list[list[Message]] = []
    for m in messages:
        if m.role in (Role.SYSTEM, Role.DEVELOPER):
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


def sendable(messages: list[Message]) -> list[Message]:
    """What a provider accepts of messages stored in order (results after their calls), as the
    memories' repair rules make it, written here independently: a call is kept only if a
    result for it follows; a message left with neither text nor calls goes; the first
    message after the pinned ones is a user message (what comes before it goes)."""
    answered = set()
    for m in messages:
        if m.role is Role.TOOL:
            answered.add(m.tool_call_id)
    out: list[Message] = []
    for m in messages:
        if m.tool_calls:
            calls = tuple(c for c in m.tool_calls if c.id in answered)
            if len(calls) != len(m.tool_calls):
                if not calls and not m.text:
                    continue
                m = dataclasses.replace(m, tool_calls=calls)
        out.append(m)
    pinned = [m for m in out if m.role in (Role.SYSTEM, Role.DEVELOPER)]
    rest = [m for m in out if m.role not in (Role.SYSTEM, Role.DEVELOPER)]
    while rest and rest[0].role is not Role.USER:
        rest.pop(0)
    return pinned + rest
