"""What the framework adapters share."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from zerda._checks import MAX_METADATA_DEPTH, check_json_value
from zerda.errors import InvalidMessageError


def json_or_none(value: Any) -> Any:
    """``value`` if it survives a JSON round trip (so a store can keep it), else ``None``."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return value


def storable(value: Any, depth: int) -> bool:
    """Whether a message's ``metadata`` can hold ``value`` ``depth`` levels down (JSON, string
    keys, valid Unicode, not nested too deeply): what an adapter keeps of a framework's
    message is kept if it can be, and never makes the message fail."""
    try:
        check_json_value(value, "value", max_depth=MAX_METADATA_DEPTH - depth)
    except InvalidMessageError:
        return False
    return value is None or json_or_none(value) is not None


def shown(value: object) -> str:
    """``value`` (a framework's item or content block Zerda does not model) as the compact
    JSON text a stand-in message holds, to count it and to read it in the CLI: inline data
    (``data:`` URLs, bytes, long ``base64`` / ``data`` strings) shown by its size, since a
    model is billed for what it reads, not for the base64 of an attachment; a value JSON has
    no form for as its ``repr``."""
    return json.dumps(_without_data(value), ensure_ascii=False, separators=(",", ":"))


def _without_data(value: object) -> object:
    if isinstance(value, str):
        head, comma, data = value.partition(",")
        if comma and value.startswith("data:") and head.endswith(";base64"):
            return f"{head},<{len(data)} characters>"
        return value
    if isinstance(value, (bytes, bytearray)):
        return f"<{len(value)} bytes>"
    if isinstance(value, Mapping):
        return {
            str(key): f"<{len(v)} characters>"
            if key in ("base64", "data") and isinstance(v, str) and len(v) > 64
            else _without_data(v)
            for key, v in value.items()
        }
    if isinstance(value, (list, tuple)):
        return [_without_data(v) for v in value]
    return value if value is None or isinstance(value, (bool, int, float)) else repr(value)
