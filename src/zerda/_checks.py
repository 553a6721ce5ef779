"""Checks every layer shares: text that is valid Unicode, JSON values no store chokes on."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from zerda.errors import InvalidMessageError, ZerdaError

__all__ = ["MAX_METADATA_DEPTH", "check_json_value", "check_text", "valid_unicode"]

MAX_METADATA_DEPTH = 64
"""How deeply metadata may nest (a mapping or a list inside another counts one level). Deeper
metadata is refused with :class:`~zerda.InvalidMessageError`: no store could take it back
without running out of stack, and nobody means it."""


def valid_unicode(value: str) -> bool:
    """Whether ``value`` is valid Unicode: a lone surrogate (``"\\ud800"``) has no UTF-8
    form, so no store, file or wire could hold it."""
    if value.isascii():
        return True
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_text(value: str, what: str, error: type[ZerdaError] = InvalidMessageError) -> None:
    """Refuse a string that is not valid Unicode (see :func:`valid_unicode`)."""
    if valid_unicode(value):
        return
    at = next(i for i, ch in enumerate(value) if "\ud800" <= ch <= "\udfff")
    raise error(
        f"{what} holds a lone surrogate {value[at]!r} at position {at}: "
        "text must be valid Unicode (decode bytes with errors='replace', or drop it)"
    )


def check_json_value(
    value: object,
    what: str,
    error: type[ZerdaError] = InvalidMessageError,
    max_depth: int = MAX_METADATA_DEPTH,
) -> None:
    """Refuse what no store could round-trip: nesting deeper than ``max_depth``, keys that are
    not strings, and text that is not valid Unicode. Walks without recursion, so that the
    check itself never runs out of stack; ``json.dumps`` checks the rest (types, NaN)."""
    stack: list[tuple[object, int, tuple[object, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            check_text(item, _at(what, path), error)
            continue
        if isinstance(item, Mapping):
            children: Iterable[tuple[object, object]] = item.items()
        elif isinstance(item, (list, tuple)):
            children = enumerate(item)
        else:
            continue
        if depth >= max_depth:
            raise error(
                f"{_at(what, path)} nests deeper than {max_depth} levels "
                "(zerda.messages.MAX_METADATA_DEPTH)"
            )
        for key, child in children:
            if isinstance(item, Mapping):
                if not isinstance(key, str):
                    raise error(f"{_at(what, path)} keys must be strings, got {key!r}")
                check_text(key, f"a key of {_at(what, path)}", error)
            stack.append((child, depth + 1, (*path, key)))


def _at(what: str, path: tuple[object, ...]) -> str:
    if len(path) > 6:  # a deep path: its ends say enough
        return _at(what, path[:3]) + "[...]" + "".join(f"[{key!r}]" for key in path[-2:])
    return what + "".join(f"[{key!r}]" for key in path)
