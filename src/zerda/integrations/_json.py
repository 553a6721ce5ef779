"""What the framework adapters share."""

from __future__ import annotations

import json
from typing import Any


def json_or_none(value: Any) -> Any:
    """``value`` if it survives a JSON round trip (so a store can keep it), else ``None``."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return value
