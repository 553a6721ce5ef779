"""What the format converters share: checked reads, extras, data URLs and JSON arguments.

Conventions every converter follows (see ``docs/formats.md``):

- A provider's fields that Zerda does not model are kept verbatim: on a part or a tool call in
  its ``extra``, on a message in its ``metadata``, under the format's name (``"responses"``,
  ``"anthropic"``, ``"gemini"``), and merged back when converting to that format.
- Keys there that start with ``_`` are the converter's own bookkeeping (an order of blocks, a
  made-up id); every other key is the provider's own field.
- Reasoning is sent back only to the format that made it: a :class:`~zerda.parts.ReasoningPart`
  belongs to a format when its ``extra`` has that format's key.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NoReturn, TypeVar

from zerda._checks import check_json_value
from zerda._media import split_data_url
from zerda.errors import InvalidMessageError
from zerda.messages import Message, ToolCall
from zerda.parts import FilePart, ImagePart, Part, ReasoningPart

T = TypeVar("T")

IMAGE_TYPES = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image types both OpenAI and Anthropic take (PNG, JPEG, WEBP, non-animated GIF)."""


def invalid(where: str, what: str) -> InvalidMessageError:
    """The error for a bad ``where``: raise it."""
    return InvalidMessageError(f"{where}: {what}")


def mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise invalid(where, f"must be an object (a dict), got {type(value).__name__}")
    return value


def listing(value: object, where: str) -> Sequence[Any]:
    """``value`` as a sequence of items: a list or a tuple, not a string or a dict."""
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, (list, tuple)):
        raise invalid(where, f"must be a list, got {type(value).__name__}")
    return value


def required_text(data: Mapping[str, Any], key: str, where: str, *, empty: bool = False) -> str:
    value = data.get(key)
    if not isinstance(value, str) or (not empty and not value):
        kind = "a string" if empty else "a non-empty string"
        raise invalid(where, f"{key!r} must be {kind}, got {value!r:.80}")
    return value


def build(where: str, factory: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``factory(*args, **kwargs)``, its :class:`InvalidMessageError` told where it happened."""
    try:
        return factory(*args, **kwargs)
    except InvalidMessageError as exc:
        raise InvalidMessageError(f"{where}: {exc}") from exc


def fields(data: Mapping[str, Any], modelled: Iterable[str]) -> dict[str, Any]:
    """The keys of ``data`` a converter did not model, to keep verbatim."""
    skip = set(modelled)
    return {k: v for k, v in data.items() if k not in skip}


def json_object(value: object, where: str) -> dict[str, Any]:
    """A JSON object checked (depth, keys, text) and copied."""
    check_json_value(value, where)
    try:
        copied = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"{where} must be JSON: {exc}") from exc
    if not isinstance(copied, dict):
        raise invalid(where, f"must be a JSON object, got {type(value).__name__}")
    return copied


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON value, so that no output aliases a frozen message."""
    if isinstance(value, Mapping):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [copy_json(v) for v in value]
    return value


def provider(extra: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """The format's own entry in a part's ``extra`` or a message's ``metadata``, or None."""
    value = extra.get(name)
    return value if isinstance(value, Mapping) else None


def owned(name: str, kept: dict[str, Any]) -> dict[str, Any]:
    """An ``extra`` or ``metadata`` with ``kept`` under the format's name (empty if ``kept`` is)."""
    return {name: kept} if kept else {}


def bookkeeping(m: Message, name: str) -> Mapping[str, Any]:
    """The format's entry in a message's metadata (empty when there is none)."""
    return provider(m.metadata, name) or {}


def marked(m: Message, name: str, key: str) -> Message:
    """``m`` with the bookkeeping flag ``key`` set in the format's metadata entry."""
    metadata = dict(m.metadata)
    metadata[name] = {**bookkeeping(m, name), key: True}
    return dataclasses.replace(m, metadata=metadata)


def merge(out: dict[str, Any], kept: Mapping[str, Any] | None) -> dict[str, Any]:
    """``out`` with the provider fields in ``kept`` (its bookkeeping ``_`` keys left out)
    merged in, nested objects merged key by key."""
    if kept:
        for key, value in kept.items():
            if key.startswith("_"):
                continue
            inner = out.get(key)
            if isinstance(inner, dict) and isinstance(value, Mapping):
                merge(inner, value)
            else:
                out[key] = copy_json(value)
    return out


def owned_reasoning(part: Part, name: str) -> bool:
    """Whether ``part`` is reasoning that the format ``name`` made (and so may be sent back)."""
    return type(part) is ReasoningPart and name in part.extra


def gemini_file(part: Part) -> bool:
    """Whether ``part`` names a file in Gemini's own storage (a ``file_data`` URI), which no
    other provider can read."""
    entry = provider(part.extra, "gemini")
    return bool(entry and entry.get("_file_data")) and type(part) in (ImagePart, FilePart)


def in_order(m: Message, order: object) -> list[Part | ToolCall]:
    """``m``'s parts and calls in the order a format had its blocks: ``order`` is the layout a
    ``from_X`` kept (``"P"`` a part, ``"C"`` a call, e.g. ``"PCP"``); the parts then the calls
    when there is none, or it no longer matches the message."""
    parts, calls = list(m.parts), list(m.tool_calls)
    if (
        not isinstance(order, str)
        or order.count("P") != len(parts)
        or order.count("C") != len(calls)
        or len(order) != len(parts) + len(calls)
    ):
        return [*parts, *calls]
    next_part, next_call = iter(parts), iter(calls)
    return [next(next_part) if step == "P" else next(next_call) for step in order]


# -- data URLs ------------------------------------------------------------------------------


def decoded_text(url: str | None) -> str | None:
    """The UTF-8 text a ``text/plain`` data URL holds; None when it is not one or does not
    decode."""
    parsed = split_data_url(url)
    if parsed is None or parsed[0] != "text/plain":
        return None
    try:
        return base64.b64decode(parsed[1], validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None


def is_http(url: str | None) -> bool:
    return url is not None and url.startswith(("https://", "http://"))


# -- tool-call arguments ---------------------------------------------------------------------


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


UNPARSED = "zerda_unparsed_arguments"
"""The key under which a call's arguments that are not a JSON object travel in Anthropic's
``input`` and Gemini's ``args`` (which must be objects): the model's own text, unchanged."""


def arguments_object(arguments: str) -> dict[str, Any]:
    """A call's arguments as the JSON object Anthropic's ``input`` and Gemini's ``args`` need.

    The JSON text the model produced is parsed; empty text is ``{}``; text that is not a JSON
    object (models sometimes emit invalid JSON) travels whole as ``{UNPARSED: text}``, so that
    the next model still sees what was said and :func:`arguments_text` gives it back.
    """
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments, parse_constant=_no_constants)
    except (ValueError, RecursionError):
        return {UNPARSED: arguments}
    if isinstance(value, dict):
        return value
    return {UNPARSED: arguments}


def arguments_text(value: Mapping[str, Any]) -> str:
    """An ``input``/``args`` object as a call's arguments: JSON text, as OpenAI writes it (or
    the text :func:`arguments_object` wrapped)."""
    if len(value) == 1 and isinstance(value.get(UNPARSED), str):
        return str(value[UNPARSED])
    return json.dumps(value, ensure_ascii=False)
