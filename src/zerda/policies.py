"""Pure selection policies: which turns of a conversation go into the context. No I/O here."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

__all__ = ["last_turns"]

T = TypeVar("T")


def last_turns(turns: Sequence[T], k: int | None) -> Sequence[T]:
    """The newest ``k`` turns, oldest first (all of them when ``k`` is ``None``)."""
    if k is None or k >= len(turns):
        return turns
    return turns[len(turns) - k :] if k > 0 else turns[:0]
