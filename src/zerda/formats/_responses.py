"""OpenAI Responses API input items <-> Messages.

The item shapes are those of ``POST /v1/responses``'s ``input``
(https://platform.openai.com/docs/api-reference/responses/create, and the typed params of
openai-python, ``openai/types/responses/response_input_item_param.py``):

- ``message``: ``role`` user, assistant, system or developer; ``content`` a string or a list of
  ``input_text``, ``input_image`` (``image_url`` or ``file_id``, ``detail``) and ``input_file``
  (``file_id``, ``file_data``, ``file_url``, ``filename``) parts, or, on assistant messages,
  ``output_text`` and ``refusal`` parts. ``type`` may be left out of a message item.
- ``function_call`` (``call_id``, ``name``, ``arguments``, ``id``, ``status``).
- ``function_call_output`` (``call_id``, ``output``: a string or a list of input parts).
- ``reasoning`` (``id``, ``summary``, ``encrypted_content``, ``content``), which must be sent
  back with the item that followed it ("Item 'rs_…' of type 'reasoning' was provided without
  its required following item" otherwise).

One Zerda assistant message holds the run of items a model turn produced (reasoning, a message,
function calls), as OpenAI Chat holds text and tool calls in one message; the run's exact items
are kept in ``metadata["responses"]`` when the message alone does not say them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from zerda._media import split_data_url
from zerda.errors import InvalidMessageError
from zerda.formats._common import (
    IMAGE_TYPES,
    build,
    fields,
    gemini_file,
    invalid,
    is_http,
    listing,
    mapping,
    merge,
    owned,
    owned_reasoning,
    provider,
    required_text,
)
from zerda.messages import Message, Role, ToolCall
from zerda.parts import DETAILS, FilePart, ImagePart, Part, ReasoningPart, TextPart

NAME = "responses"
_ITEM_TYPES = "message, function_call, function_call_output, reasoning"
_PART_TYPES = "input_text, output_text, refusal, input_image, input_file"
_ROLES = ("user", "assistant", "system", "developer")


def from_responses(items: Iterable[Mapping[str, Any]]) -> list[Message]:
    """OpenAI Responses API input items as Messages: ``to_responses(from_responses(items))``
    gives the items back.

    Each ``message`` item of role user, system or developer is a message, each
    ``function_call_output`` a tool message; a run of reasoning, assistant message and
    ``function_call`` items is one assistant message (its parts, then its tool calls). Other
    item types (web search calls, item references, …) raise :class:`InvalidMessageError`.
    """
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Iterable):
        raise InvalidMessageError(
            f"the Responses input must be a list of items, got {type(items).__name__} "
            "(a plain string input is [{'role': 'user', 'content': text}])"
        )
    out: list[Message] = []
    run: list[tuple[int, Mapping[str, Any]]] = []
    for i, raw in enumerate(items):
        where = f"items[{i}]"
        item = mapping(raw, where)
        kind = _kind(item, where)
        if kind in ("reasoning", "function_call") or (
            kind == "message" and item.get("role") == "assistant"
        ):
            run.append((i, item))
            continue
        if run:
            out.append(_assistant_from(run))
            run = []
        if kind == "message":
            out.append(_message_from(item, where))
        else:
            out.append(_output_from(item, where))
    if run:
        out.append(_assistant_from(run))
    return out


def to_responses(messages: Iterable[Message]) -> list[dict[str, Any]]:
    """Messages as the ``input`` items of an OpenAI Responses API request.

    System and developer messages stay where they are (the Responses API takes them as items);
    a message's ``name`` is not sent (the API has no field for it). What the API cannot take is
    left out: reasoning another provider made, audio, media on other roles than user and tool
    results, images it cannot read (``gs://`` URLs, image types other than PNG, JPEG, GIF and
    WEBP), files stored by Gemini.
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Message):
            raise InvalidMessageError(
                f"messages[{i}] must be a Message, got {type(m).__name__} "
                "(convert OpenAI dicts with zerda.from_openai first)"
            )
        if m.role is Role.ASSISTANT:
            out.extend(_assistant_items(m))
        elif m.role is Role.TOOL:
            out.append(_output_item(m))
        else:
            item = _message_item(m)
            if item is not None:
                out.append(item)
    return out


# -- items -> messages -----------------------------------------------------------------------


def _kind(item: Mapping[str, Any], where: str) -> str:
    kind = item.get("type")
    if kind is None:
        if "role" not in item:
            raise invalid(where, "has neither 'type' nor 'role'")
        kind = "message"
    if kind in ("message", "function_call", "function_call_output", "reasoning"):
        if kind == "message" and item.get("role") not in _ROLES:
            raise invalid(
                where, f"a message's role is one of {', '.join(_ROLES)}, got {item.get('role')!r}"
            )
        return str(kind)
    raise invalid(
        where, f"item type {kind!r} has no place in a Zerda message; the types are {_ITEM_TYPES}"
    )


def _untyped(item: Mapping[str, Any], kept: dict[str, Any]) -> dict[str, Any]:
    if "type" not in item:
        kept["_untyped"] = True
    return kept


def _message_from(item: Mapping[str, Any], where: str) -> Message:
    role = item["role"]
    content = _content_from(item.get("content"), role, where)
    kept = _untyped(item, fields(item, ("type", "role", "content")))
    return build(where, Message, role, content, metadata={NAME: kept} if kept else {})


def _content_from(content: object, role: str, where: str) -> str | tuple[Part, ...]:
    if isinstance(content, str):
        return content
    parts = listing(content, f"{where}.content")
    if not parts:
        raise invalid(f"{where}.content", "is an empty list (use '' for no content)")
    return tuple(_part_from(p, role, f"{where}.content[{j}]") for j, p in enumerate(parts))


def _text_type(role: str) -> str:
    return "output_text" if role == "assistant" else "input_text"


def _text(value: object) -> str | None:
    """A non-empty string, which Zerda models; anything else is kept verbatim."""
    return value if isinstance(value, str) and value else None


def _part_from(raw: object, role: str, where: str) -> Part:
    part = mapping(raw, where)
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        text = required_text(part, "text", where, empty=True)
        kept = fields(part, ("type", "text"))
        if kind != _text_type(role):
            kept["type"] = kind
        return build(where, TextPart, text, extra=owned(NAME, kept))
    if kind == "refusal":
        text = required_text(part, "refusal", where, empty=True)
        return build(where, TextPart, text, extra={NAME: fields(part, ("refusal",))})
    if kind == "input_image":
        url, file_id = _text(part.get("image_url")), _text(part.get("file_id"))
        detail = part.get("detail") if part.get("detail") in DETAILS else None
        modelled = {"type"}
        modelled |= {"image_url"} if url else set()
        modelled |= {"file_id"} if file_id else set()
        modelled |= {"detail"} if detail else set()
        kept = fields(part, modelled)
        return build(where, ImagePart, url, file_id=file_id, detail=detail, extra=owned(NAME, kept))
    if kind == "input_file":
        values = {k: _text(part.get(k)) for k in ("file_data", "file_id", "file_url", "filename")}
        kept = fields(part, {"type"} | {k for k, v in values.items() if v})
        return build(
            where,
            FilePart,
            values["file_data"],
            file_id=values["file_id"],
            url=values["file_url"],
            filename=values["filename"],
            extra=owned(NAME, kept),
        )
    raise invalid(where, f"unknown content part type {kind!r}; the types are {_PART_TYPES}")


def _reasoning_from(item: Mapping[str, Any], where: str) -> ReasoningPart:
    summary = item.get("summary")
    if not isinstance(summary, list):
        raise invalid(where, "a reasoning item needs 'summary', a list ([] when there is none)")
    modelled = {"type", "summary"}
    texts: list[str] = [
        s["text"]
        for s in summary
        if isinstance(s, Mapping)
        and s.get("type") == "summary_text"
        and isinstance(s.get("text"), str)
    ]
    first = summary[0] if len(summary) == 1 else None
    if not summary:
        text = ""
    elif isinstance(first, Mapping) and set(first) == {"type", "text"} and len(texts) == 1:
        text = texts[0]
        if not text:
            modelled.discard("summary")
    else:
        text = "\n\n".join(texts)
        modelled.discard("summary")
    encrypted = _text(item.get("encrypted_content"))
    if encrypted:
        modelled.add("encrypted_content")
    kept = fields(item, modelled)
    return build(where, ReasoningPart, text, encrypted=encrypted, extra={NAME: kept})


def _call_from(item: Mapping[str, Any], where: str) -> ToolCall:
    call_id = required_text(item, "call_id", where)
    name = required_text(item, "name", where)
    arguments = required_text(item, "arguments", where, empty=True)
    kept = fields(item, ("type", "call_id", "name", "arguments"))
    return build(where, ToolCall, call_id, name, arguments, extra=owned(NAME, kept))


def _output_from(item: Mapping[str, Any], where: str) -> Message:
    call_id = required_text(item, "call_id", where)
    output = item.get("output")
    if isinstance(output, str):
        content: str | tuple[Part, ...] = output
    else:
        if not isinstance(output, (list, tuple)):
            raise invalid(
                where, f"'output' must be a string or a list of parts, got {output!r:.80}"
            )
        content = _content_from(output, "tool", f"{where}.output")
    kept = fields(item, ("type", "call_id", "output"))
    metadata = owned(NAME, kept)
    return build(where, Message, Role.TOOL, content, tool_call_id=call_id, metadata=metadata)


def _assistant_from(run: list[tuple[int, Mapping[str, Any]]]) -> Message:
    parts: list[Part] = []
    calls: list[ToolCall] = []
    layout: list[dict[str, Any]] = []
    for i, item in run:
        where = f"items[{i}]"
        kind = _kind(item, where)
        if kind == "reasoning":
            parts.append(_reasoning_from(item, where))
            layout.append({"type": "reasoning"})
        elif kind == "function_call":
            calls.append(_call_from(item, where))
            layout.append({"type": "function_call"})
        else:
            given = _content_from(item.get("content"), "assistant", where)
            new = [build(where, TextPart, given)] if isinstance(given, str) else list(given)
            parts.extend(new)
            entry: dict[str, Any] = {
                "type": "message",
                "parts": len(new),
                "string": isinstance(given, str),
            }
            kept = _untyped(item, fields(item, ("type", "role", "content")))
            if kept:
                entry["fields"] = kept
            layout.append(entry)
    texts = [e for e in layout if e["type"] == "message"]
    content: str | tuple[Part, ...] | None
    first = parts[0] if parts else None
    if len(layout) == 1 and texts and texts[0]["string"] and isinstance(first, TextPart):
        content = first.text
    else:
        content = tuple(parts) if parts else None
    where = f"items[{run[0][0]}]" if len(run) == 1 else f"items[{run[0][0]}:{run[-1][0] + 1}]"
    single = texts[0].get("fields", {}) if len(texts) == 1 else {}
    message = build(
        where,
        Message,
        Role.ASSISTANT,
        content,
        tool_calls=tuple(calls),
        metadata=owned(NAME, single),
    )
    if _assistant_items(message) == [dict(item) for _, item in run]:
        return message
    return build(
        where,
        Message,
        Role.ASSISTANT,
        content,
        tool_calls=tuple(calls),
        metadata={NAME: {"_items": layout}},
    )


# -- messages -> items -----------------------------------------------------------------------


def _message_item(m: Message) -> dict[str, Any] | None:
    role = m.role.value
    content: str | list[dict[str, Any]]
    if isinstance(m.content, str):
        content = m.content
    else:
        content = _parts_out(m.parts, role)
        if not content:
            return None
    return _with_type(role, content, provider(m.metadata, NAME))


def _with_type(role: str, content: object, kept: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {} if kept and kept.get("_untyped") else {"type": "message"}
    out["role"] = role
    out["content"] = content
    return merge(out, kept)


def _parts_out(parts: Iterable[Part], role: str) -> list[dict[str, Any]]:
    out = []
    for part in parts:
        item = _part_out(part, role)
        if item is not None:
            out.append(item)
    return out


def _part_out(part: Part, role: str) -> dict[str, Any] | None:
    kept = provider(part.extra, NAME)
    if isinstance(part, TextPart):
        if kept and kept.get("type") == "refusal":
            return merge({"refusal": part.text}, kept)
        return merge({"type": _text_type(role), "text": part.text}, kept)
    if role not in ("user", "tool") or gemini_file(part):
        return None  # text only on the other roles; Gemini's files are Gemini's alone
    if isinstance(part, ImagePart):
        url = part.url if _readable_image(part.url) else None
        if url is None and part.file_id is None:
            return None
        out: dict[str, Any] = {"type": "input_image"}
        if url is not None:
            out["image_url"] = url
        if part.file_id is not None:
            out["file_id"] = part.file_id
        if part.detail is not None:
            out["detail"] = part.detail
        return merge(out, kept)
    if isinstance(part, FilePart):
        file_url = part.url if is_http(part.url) else None
        if part.data is None and part.file_id is None and file_url is None:
            return None
        out = {"type": "input_file"}
        for key, value in (
            ("file_data", part.data),
            ("file_id", part.file_id),
            ("file_url", file_url),
            ("filename", part.filename),
        ):
            if value is not None:
                out[key] = value
        return merge(out, kept)
    return None  # audio (Responses input content has none), reasoning (items of its own)


def _readable_image(url: str | None) -> bool:
    if is_http(url):
        return True
    parsed = split_data_url(url)
    return parsed is not None and parsed[0] in IMAGE_TYPES


def _output_item(m: Message) -> dict[str, Any]:
    content = m.content
    output = content if isinstance(content, str) else _parts_out(m.parts, "tool") or ""
    out = {"type": "function_call_output", "call_id": m.tool_call_id, "output": output}
    return merge(out, provider(m.metadata, NAME))


def _call_item(call: ToolCall) -> dict[str, Any]:
    out = {
        "type": "function_call",
        "call_id": call.id,
        "name": call.name,
        "arguments": call.arguments,
    }
    return merge(out, provider(call.extra, NAME))


def _reasoning_item(part: ReasoningPart) -> dict[str, Any] | None:
    kept = provider(part.extra, NAME) or {}
    if not isinstance(kept.get("id"), str):
        return None  # the API finds reasoning by its id; without one it cannot be sent
    out: dict[str, Any] = {"type": "reasoning"}
    if "summary" not in kept:
        out["summary"] = [{"type": "summary_text", "text": part.text}] if part.text else []
    if part.encrypted is not None:
        out["encrypted_content"] = part.encrypted
    return merge(out, kept)


def _assistant_items(m: Message) -> list[dict[str, Any]]:
    kept = provider(m.metadata, NAME)
    layout = kept.get("_items") if kept else None
    if layout is not None:
        laid_out = _laid_out(m, layout)
        if laid_out is not None:
            return laid_out
    said: list[dict[str, Any]] = []
    if isinstance(m.content, str):
        if m.content or not m.tool_calls:
            said.append(_with_type("assistant", m.content, kept))
    else:
        texts = [p for p in m.parts if type(p) is not ReasoningPart]
        content = _parts_out(texts, "assistant")
        if content:
            said.append(_with_type("assistant", content, kept))
    said.extend(_call_item(c) for c in m.tool_calls)
    if not said:
        return []  # reasoning alone: the API wants it followed by what it led to
    out: list[dict[str, Any]] = []
    for part in m.parts:
        if isinstance(part, ReasoningPart) and owned_reasoning(part, NAME):
            item = _reasoning_item(part)
            if item is not None:
                out.append(item)
    return out + said


def _laid_out(m: Message, layout: object) -> list[dict[str, Any]] | None:
    """The items ``layout`` (from :func:`from_responses`) says, or None when the message no
    longer matches it (then the default layout is used)."""
    if not isinstance(layout, list) or isinstance(m.content, str):
        return None
    parts = list(m.parts)
    calls = list(m.tool_calls)
    p = c = 0
    out: list[dict[str, Any]] = []
    for entry in layout:
        if not isinstance(entry, Mapping):
            return None
        kind = entry.get("type")
        if kind == "reasoning":
            thought = parts[p] if p < len(parts) else None
            if not isinstance(thought, ReasoningPart):
                return None
            item = _reasoning_item(thought)
            p += 1
            if item is not None:
                out.append(item)
        elif kind == "function_call":
            if c >= len(calls):
                return None
            out.append(_call_item(calls[c]))
            c += 1
        elif kind == "message":
            n = entry.get("parts")
            if not isinstance(n, int) or isinstance(n, bool) or n < 0 or p + n > len(parts):
                return None
            chunk = [x for x in parts[p : p + n] if isinstance(x, TextPart)]
            p += n
            if len(chunk) != n:
                return None
            content: str | list[dict[str, Any]]
            if entry.get("string"):
                if n != 1:
                    return None
                content = chunk[0].text
            else:
                content = _parts_out(chunk, "assistant")
            kept = entry.get("fields")
            out.append(
                _with_type("assistant", content, kept if isinstance(kept, Mapping) else None)
            )
        else:
            return None
    if p != len(parts) or c != len(calls):
        return None
    return out
