"""What the adapters share for content parts: data URLs, and the parts a framework cannot hold."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from zerda.errors import InvalidMessageError
from zerda.integrations._json import json_or_none
from zerda.parts import Part, part_from_dict

__all__ = ["kept", "kept_as_given", "restored", "round_trips", "with_given", "with_kept"]

Block = TypeVar("Block")


def kept(part: Part, name: str) -> dict[str, Any]:
    """What ``part.extra`` keeps of framework ``name``'s own fields (a copy)."""
    value = part.extra.get(name)
    return dict(value) if isinstance(value, Mapping) else {}


def with_kept(fields: Mapping[str, Any], name: str) -> dict[str, Any]:
    """A part's ``extra`` for the framework fields Zerda does not model (those that are JSON;
    a framework object that is not is left out)."""
    value = json_or_none(dict(fields))
    return {name: value} if value else {}


def round_trips(part: Part, block: Block, from_block: Callable[[Block], Part | None]) -> bool:
    """Whether ``part`` comes back exactly from ``block``, its framework block."""
    try:
        return from_block(block) == part
    except (InvalidMessageError, ValueError, TypeError):
        return False


def restored(
    saved: object, index: int, block: Block, to_block: Callable[[Part], Block]
) -> Part | None:
    """The part the bookkeeping ``saved`` holds for block ``index``, if the block is still the
    one it was written as (a message changed on the framework's side is read as it is)."""
    if not isinstance(saved, Mapping):
        return None
    data = saved.get(str(index))
    if data is None:
        return None
    try:
        part = part_from_dict(data)
        return part if to_block(part) == block else None
    except (InvalidMessageError, ValueError, TypeError):
        return None


def kept_as_given(given: object, shown: object) -> object:
    """What to keep of a framework message's content ``given`` that Zerda would show as
    ``shown``: ``given``, with each item of a list that ``shown`` has at the same place left
    out (``None``), so that the bookkeeping holds only what Zerda would not give back."""
    if not isinstance(given, list) or not isinstance(shown, list):
        return given
    return [None if i < len(shown) and item == shown[i] else item for i, item in enumerate(given)]


def with_given(kept: object, shown: object) -> object | None:
    """The content :func:`kept_as_given` kept, whole again with ``shown``'s items in its
    gaps; ``None`` when ``shown`` no longer has an item for a gap."""
    if not isinstance(kept, list):
        return kept
    out = []
    for i, item in enumerate(kept):
        if item is None:
            if not isinstance(shown, list) or i >= len(shown):
                return None
            item = shown[i]
        out.append(item)
    return out
