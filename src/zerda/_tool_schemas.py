"""What the tool definitions of a request cost in tokens (re-exported by :mod:`zerda.tokens`).

OpenAI does not publish how function definitions are rendered for the model. The formula
here is the one OpenAI's cookbook ("How to count tokens with tiktoken", the section on
function calls) gives for the gpt-4o family, which it measured against the API:

- each function: 7 tokens, plus the text ``name:description`` (a final ``.`` dropped);
- its parameters, when it has any properties: 3 tokens, then for each property 3 tokens plus
  the text ``key:type:description`` (a final ``.`` dropped); a property with an ``enum``
  costs -3 tokens and then 3 tokens plus the item's text per item;
- 12 tokens once after the last function.

The cookbook's formula stops at the first level of properties. Here, whatever else a
property's schema holds (``items``, nested ``properties``, ``minimum``...) is counted as its
compact JSON text: an overestimate, so a budget that counts it is never too small.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from zerda.errors import ConfigurationError

__all__ = ["count_tool_definitions", "function_of"]

_FUNCTION = 7
_PROPERTIES = 3
_PROPERTY = 3
_ENUM = -3
_ENUM_ITEM = 3
_END = 12
# What a property's "key:type:description" line says; the rest of its schema is counted as JSON.
_LINE_KEYS = frozenset({"type", "description", "enum"})


def count_tool_definitions(tools: object, count_text: Callable[[str], int]) -> int:
    """Tokens of ``tools`` (OpenAI function definitions, as the ``tools`` of a request), each
    text counted by ``count_text``; 0 for no tools. Raises
    :class:`~zerda.ConfigurationError` for anything that is not a list of definitions."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Iterable):
        raise ConfigurationError(
            f"tools must be a list of tool definitions, got {type(tools).__name__}"
        )
    total = 0
    for i, tool in enumerate(tools):
        total += _function_tokens(function_of(tool, i), count_text)
    return total + _END if total else 0


def function_of(tool: object, i: int) -> Mapping[str, Any]:
    """The function definition of ``tool``: Chat Completions' ``{"type": "function",
    "function": {...}}``, or the Responses API's flat ``{"type": "function", "name": ...}``."""
    if not isinstance(tool, Mapping):
        raise ConfigurationError(
            f"tool {i}: a tool definition is a dict like {{'type': 'function', 'function': "
            f"{{'name': ..., 'description': ..., 'parameters': {{...}}}}}}, "
            f"got {type(tool).__name__}"
        )
    function = tool.get("function", tool)
    if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
        raise ConfigurationError(f"tool {i}: the function definition has no 'name' string")
    return function


def _function_tokens(function: Mapping[str, Any], count_text: Callable[[str], int]) -> int:
    description = _text(function.get("description"))
    tokens = _FUNCTION + count_text(f"{function['name']}:{description}")
    parameters = function.get("parameters")
    properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
    if not isinstance(properties, Mapping) or not properties:
        return tokens
    tokens += _PROPERTIES
    for key, schema in properties.items():
        tokens += _PROPERTY
        if not isinstance(schema, Mapping):
            tokens += count_text(f"{key}:{_compact(schema)}")
            continue
        enum = schema.get("enum")
        if isinstance(enum, list) and enum:
            items = (item if isinstance(item, str) else _compact(item) for item in enum)
            tokens += _ENUM + sum(_ENUM_ITEM + count_text(item) for item in items)
        kind = schema.get("type", "")
        line = f"{key}:{kind if isinstance(kind, str) else _compact(kind)}:"
        tokens += count_text(line + _text(schema.get("description")))
        rest = {k: v for k, v in schema.items() if k not in _LINE_KEYS}
        if rest:
            tokens += count_text(_compact(rest))
    return tokens


def _text(value: object) -> str:
    """A description or enum item as the model reads it; a final period dropped."""
    if value is None:
        return ""
    text = value if isinstance(value, str) else _compact(value)
    return text[:-1] if text.endswith(".") else text


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str)
