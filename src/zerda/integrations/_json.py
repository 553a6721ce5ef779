"""What the framework adapters share."""

from __future__ import annotations

import json
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
