"""Helpers shared by the memory tests, written independently of the library's own grouping."""

from __future__ import annotations

from zerda.messages import Message, Role


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
