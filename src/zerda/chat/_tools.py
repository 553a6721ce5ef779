"""Tools for :class:`~zerda.chat.Chat`: a Python function and the OpenAI definition the model
sees, the schema read from the function's signature, type hints and docstring.

Nothing here calls a model or a store; :meth:`Tool.call` runs the function on the arguments a
model wrote and always returns the text of a tool result (an error the function raised, or
arguments that do not fit its signature, become a result that says so).
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import inspect
import json
import re
import types
import typing
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Union, get_args, get_origin, overload

from zerda._tool_schemas import function_of
from zerda.errors import ConfigurationError

__all__ = ["Tool", "ToolLike", "as_tools", "error_text", "schema_of", "tool"]

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
# Docstring sections that end the description and hold the parameters.
_SECTION = re.compile(
    r"^\s*(Args|Arguments|Parameters|Params|Returns?|Raises|Yields|Examples?|Notes?)\s*:?\s*$"
    r"|^\s*:(param|type|return|returns|rtype|raises)\b",
    re.MULTILINE,
)
_JSON_TYPES: dict[type, str] = {str: "string", int: "integer", float: "number", bool: "boolean"}


@dataclass(frozen=True)
class Tool:
    """A function the model may call, with its OpenAI definition.

    ``parameters`` is the JSON Schema of the arguments (an ``object`` schema). Build one from a
    function with :func:`tool` (or just pass the function to ``Chat(tools=...)``); give
    ``name``, ``description`` or ``parameters`` to say it yourself. Calling the tool calls the
    function.
    """

    function: Callable[..., Any]
    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )

    def __post_init__(self) -> None:
        if not callable(self.function):
            raise ConfigurationError(
                f"tool {self.name!r}: function must be callable, got {type(self.function).__name__}"
            )
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ConfigurationError(
                f"tool name must be 1 to 64 letters, digits, '_' or '-' (as OpenAI requires), "
                f"got {self.name!r}"
            )
        if not isinstance(self.description, str):
            raise ConfigurationError(f"tool {self.name!r}: description must be a str")
        if not isinstance(self.parameters, Mapping) or self.parameters.get("type") != "object":
            raise ConfigurationError(
                f"tool {self.name!r}: parameters must be a JSON Schema of type 'object', "
                f"got {self.parameters!r:.200}"
            )

    @classmethod
    def from_definition(cls, definition: Mapping[str, Any], function: Callable[..., Any]) -> Tool:
        """The tool an OpenAI definition describes, run by ``function``: Chat Completions'
        ``{"type": "function", "function": {"name", "description", "parameters"}}``, or the
        Responses API's flat ``{"type": "function", "name", ...}``."""
        spec = function_of(definition, 0)
        parameters = spec.get("parameters")
        return cls(
            function,
            spec["name"],
            spec.get("description") or "",
            {"type": "object", "properties": {}} if parameters is None else parameters,
        )

    @property
    def definition(self) -> dict[str, Any]:
        """The tool as a Chat Completions request lists it in ``tools``."""
        function: dict[str, Any] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    # -- running a call the model made ----------------------------------------------------------

    def bind(self, arguments: str) -> tuple[dict[str, Any], str | None]:
        """The keyword arguments for the function from the model's JSON ``arguments``, or an
        error text saying why they do not fit (invalid JSON, missing or unknown names)."""
        try:
            values = json.loads(arguments) if arguments.strip() else {}
        except ValueError as exc:
            return {}, f"the arguments are not valid JSON ({exc})"
        if not isinstance(values, dict):
            return {}, f"the arguments must be a JSON object, got {type(values).__name__}"
        try:
            signature = inspect.signature(self.function)
        except (TypeError, ValueError):  # a builtin without a signature: pass as given
            return values, None
        try:
            signature.bind(**values)
        except TypeError as exc:
            return {}, f"the arguments do not fit {self.name}: {exc}"
        return _converted(self.function, values), None

    def call(self, arguments: str) -> tuple[str, bool]:
        """Run the function on the model's ``arguments``: the result's text and whether it
        is an error. A coroutine function runs to completion in a new event loop."""
        kwargs, problem = self.bind(arguments)
        if problem is not None:
            return error_text(problem), True
        try:
            result = self.function(**kwargs)
            if inspect.isawaitable(result):
                result = asyncio.run(_awaited(result))
        except Exception as exc:
            return error_text(f"{type(exc).__name__}: {exc}"), True
        return _result_text(result), False

    async def acall(self, arguments: str) -> tuple[str, bool]:
        """:meth:`call` in an event loop: a coroutine function is awaited, a plain function
        runs in a worker thread so that it blocks nothing."""
        kwargs, problem = self.bind(arguments)
        if problem is not None:
            return error_text(problem), True
        try:
            if inspect.iscoroutinefunction(self.function):
                result = await self.function(**kwargs)
            else:
                result = await asyncio.to_thread(self.function, **kwargs)
                if inspect.isawaitable(result):
                    result = await result
        except Exception as exc:
            return error_text(f"{type(exc).__name__}: {exc}"), True
        return _result_text(result), False


ToolLike = Union[Tool, Callable[..., Any]]  # noqa: UP007 - a runtime alias (Python 3.10)


async def _awaited(result: Awaitable[Any]) -> Any:
    return await result


def error_text(problem: str) -> str:
    """A tool result that tells the model what went wrong."""
    return json.dumps({"error": problem[:2000]}, ensure_ascii=False)


def _result_text(result: object) -> str:
    """What the model reads: a string as it is, anything else as JSON."""
    if isinstance(result, str):
        return result
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        result = dataclasses.asdict(result)
    return json.dumps(result, ensure_ascii=False, default=str)


# -- building tools ----------------------------------------------------------------------------


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    function: None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


@overload
def tool(
    function: Callable[..., Any],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Tool: ...


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parameters: Mapping[str, Any] | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """A :class:`Tool` for ``function``; usable as ``@tool`` or ``@tool(name=...)``.

    By default the name is the function's, the description its docstring up to the first
    section (``Args:``, ``:param``...), and the parameters' schema comes from the signature:
    type hints give the types (``str``, ``int``, ``float``, ``bool``, lists, dicts,
    ``Literal`` and ``Enum`` choices, ``X | None``, dataclasses and TypedDicts), the
    docstring's ``Args:`` / ``:param x:`` / NumPy ``Parameters`` entries the descriptions
    (or ``Annotated[int, "description"]``), and a parameter without a default is required.
    ``parameters`` replaces the whole schema (an OpenAI ``parameters`` object).
    """

    def build(fn: Callable[..., Any]) -> Tool:
        if isinstance(fn, Tool):
            fn = fn.function
        if not callable(fn):
            raise ConfigurationError(f"a tool must be a function, got {type(fn).__name__}")
        return Tool(
            fn,
            name if name is not None else getattr(fn, "__name__", type(fn).__name__),
            description if description is not None else _description(fn),
            parameters if parameters is not None else schema_of(fn),
        )

    return build if function is None else build(function)


def as_tools(tools: object) -> tuple[Tool, ...]:
    """``tools`` (functions and :class:`Tool` values) as Tools with distinct names."""
    if tools is None:
        return ()
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ConfigurationError(
            f"tools must be a list of functions or zerda.chat.Tool values, got "
            f"{type(tools).__name__}"
        )
    built: list[Tool] = []
    for i, item in enumerate(tools):
        if isinstance(item, Mapping):
            raise ConfigurationError(
                f"tool {i} is a definition with no function to run; pair it with one: "
                "zerda.chat.Tool.from_definition(definition, function)"
            )
        built.append(item if isinstance(item, Tool) else tool(item))
    names = [t.name for t in built]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigurationError(f"two tools share the name {', '.join(twice)}; names must differ")
    return tuple(built)


def _description(fn: Callable[..., Any]) -> str:
    doc = inspect.getdoc(fn) or ""
    match = _SECTION.search(doc)
    return (doc[: match.start()] if match else doc).strip()


def schema_of(fn: Callable[..., Any]) -> dict[str, Any]:
    """The JSON Schema of ``fn``'s keyword arguments (see :func:`tool`)."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"{fn!r} has no signature to read; pass parameters= to zerda.chat.tool"
        ) from exc
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # an annotation that does not resolve: read it as untyped
        hints = {}
    docs = _parameter_docs(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    extra = False
    for name, parameter in signature.parameters.items():
        if parameter.kind is parameter.VAR_KEYWORD:
            extra = True
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.POSITIONAL_ONLY):
            continue
        schema = _schema(hints.get(name, Any))
        if name in docs and "description" not in schema:
            schema = {**schema, "description": docs[name]}
        if parameter.default is not parameter.empty:
            default = _jsonable(parameter.default)
            if default is not _NOT_JSON:
                schema = {**schema, "default": default}
        else:
            required.append(name)
        properties[name] = schema
    result: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        result["required"] = required
    if not extra:
        result["additionalProperties"] = False
    return result


_NOT_JSON = object()


def _jsonable(value: object) -> object:
    if isinstance(value, enum.Enum):
        value = value.value
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return _NOT_JSON
    return value


def _schema(hint: Any) -> dict[str, Any]:
    """The JSON Schema of one type hint; ``{}`` (any JSON value) for what has none."""
    origin, args = get_origin(hint), get_args(hint)
    if origin is typing.Annotated:
        schema = _schema(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        return {**schema, "description": notes[0]} if notes else schema
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    if hint is None or hint is type(None):
        return {"type": "null"}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _choices([member.value for member in hint])
    if isinstance(hint, type) and hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin is Literal:
        return _choices(list(args))
    if origin is Union or origin is types.UnionType:
        options = [a for a in args if a is not type(None)]
        if len(options) == 1:  # X | None: the value may be left out or null
            return _schema(options[0])
        return {"anyOf": [_schema(a) for a in args]}
    if origin in (list, set, frozenset, Sequence) or hint in (list, set, frozenset):
        return {"type": "array", **({"items": _schema(args[0])} if args else {})}
    if origin is tuple or hint is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return {"type": "array", "items": _schema(args[0])}
        if args:
            return {"type": "array", "prefixItems": [_schema(a) for a in args]}
        return {"type": "array"}
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        if len(args) == 2:
            return {"type": "object", "additionalProperties": _schema(args[1])}
        return {"type": "object"}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _object_of(hint)
    if isinstance(hint, type) and typing.is_typeddict(hint):
        return _object_of(hint)
    return {}


def _object_of(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls, include_extras=True)
    if dataclasses.is_dataclass(cls):
        fields = [f.name for f in dataclasses.fields(cls)]
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
    else:
        fields = list(hints)
        required = sorted(getattr(cls, "__required_keys__", hints))
    schema: dict[str, Any] = {
        "type": "object",
        "properties": {name: _schema(hints.get(name, Any)) for name in fields},
    }
    if required:
        schema["required"] = required
    return schema


def _choices(values: list[Any]) -> dict[str, Any]:
    kinds = {_JSON_TYPES.get(type(v)) for v in values}
    schema: dict[str, Any] = {"enum": values}
    if len(kinds) == 1 and None not in kinds:
        schema = {"type": kinds.pop(), **schema}
    return schema


def _parameter_docs(doc: str) -> dict[str, str]:
    """Parameter descriptions from a Google (``Args:``), Sphinx (``:param x:``) or NumPy
    (``Parameters`` / ``----------``) docstring."""
    found: dict[str, str] = {}
    for name, text in re.findall(r"^\s*:param\s+(?:[^:\s]+\s+)?(\w+)\s*:\s*(.+)$", doc, re.M):
        found[name] = text.strip()
    lines = doc.splitlines()
    for i, line in enumerate(lines):
        heading = line.strip().rstrip(":")
        numpy = i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}
        if heading not in ("Args", "Arguments", "Parameters", "Params"):
            continue
        start = i + (2 if numpy else 1)
        found.update(_numpy_entries(lines[start:]) if numpy else _google_entries(lines[start:]))
    return found


def _google_entries(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    indent: int | None = None
    current: str | None = None
    for line in lines:
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        if indent is None:
            indent = depth
        if depth < indent or (depth == indent and _SECTION.match(line)):
            break
        entry = re.match(r"\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if depth == indent and entry:
            current = entry.group(1)
            found[current] = entry.group(2).strip()
        elif current is not None:
            found[current] = f"{found[current]} {line.strip()}".strip()
    return found


def _numpy_entries(lines: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    current: str | None = None
    for i, line in enumerate(lines):
        if i + 1 < len(lines) and set(lines[i + 1].strip()) == {"-"}:
            break  # the next section's heading
        if not line.strip():
            continue
        if not line[:1].isspace():
            current = line.split(":", 1)[0].strip()
            found[current] = ""
        elif current is not None:
            found[current] = f"{found[current]} {line.strip()}".strip()
    return found


def _converted(fn: Callable[..., Any], values: dict[str, Any]) -> dict[str, Any]:
    """``values`` with each argument typed as an ``Enum`` turned into its member."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:
        return values
    converted = dict(values)
    for name, value in values.items():
        hint = hints.get(name)
        options = [a for a in get_args(hint) if a is not type(None)] if get_args(hint) else [hint]
        for option in options:
            if isinstance(option, type) and issubclass(option, enum.Enum):
                try:
                    converted[name] = option(value)
                except ValueError:
                    continue
                break
    return converted
