"""Anthropic Messages API payloads (``system`` and ``messages``) <-> Messages.

The shapes are those of ``POST /v1/messages``
(https://platform.claude.com/docs/en/api/messages, and the typed params of
anthropic-sdk-python, ``anthropic/types/message_param.py`` and the ``*_block_param.py`` files):
``system`` a string or a list of text blocks; each message ``{"role": "user"|"assistant",
"content": str | [blocks]}`` with the blocks ``text``, ``image`` (``base64`` or ``url``
source), ``document`` (``base64`` PDF, ``text`` or ``url`` source; ``title``, ``context``),
``tool_use``, ``tool_result`` (``is_error``; content a string or text and image blocks),
``thinking`` (with its ``signature``) and ``redacted_thinking``.

The rules a request must follow, which :func:`to_anthropic` applies to any context: there is no
system role (the system prompt is the top-level ``system``); the conversation opens on a user
message; each ``tool_use`` is answered by a ``tool_result`` in the next message, and "in the
user message containing tool results, the tool_result blocks must come first in the content
array" (https://platform.claude.com/docs/en/agents-and-tools/tool-use/implement-tool-use);
text blocks hold non-whitespace text, every message but a final assistant one has content, and
a final assistant message does not end with whitespace.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zerda._checks import check_text
from zerda._media import data_url, split_data_url
from zerda.errors import InvalidMessageError
from zerda.formats._common import (
    IMAGE_TYPES,
    arguments_object,
    arguments_text,
    bookkeeping,
    build,
    decoded_text,
    fields,
    gemini_file,
    in_order,
    invalid,
    is_http,
    json_object,
    listing,
    mapping,
    marked,
    merge,
    owned,
    provider,
    required_text,
)
from zerda.messages import PINNED, Message, Role, ToolCall
from zerda.parts import FilePart, ImagePart, Part, ReasoningPart, TextPart

NAME = "anthropic"
_BLOCK_TYPES = "text, image, document, tool_use, tool_result, thinking, redacted_thinking"
_TOOL_ID = re.compile(r"[A-Za-z0-9_-]+")


def from_anthropic(payload: Mapping[str, Any]) -> list[Message]:
    """An Anthropic Messages payload (``{"system": ..., "messages": [...]}``) as Messages:
    ``to_anthropic(from_anthropic(p)) == p``.

    ``system`` is a system message. A user message is a user message for its text, images and
    documents, and a tool message for each ``tool_result``; an assistant message is one
    assistant message (text, thinking as reasoning parts, ``tool_use`` as tool calls, whose
    ``input`` becomes the JSON text of the arguments).
    """
    data = mapping(payload, "the Anthropic payload")
    unknown = sorted(set(data) - {"system", "messages"})
    if unknown:
        raise invalid(
            "the Anthropic payload",
            f"has keys {unknown}; from_anthropic reads 'system' and 'messages' (a request's "
            "other parameters, such as 'model', are not conversation)",
        )
    out: list[Message] = []
    if "system" in data:
        out.append(_system_from(data["system"]))
    previous = None
    for i, raw in enumerate(listing(data.get("messages"), "messages")):
        where = f"messages[{i}]"
        message = mapping(raw, where)
        extra_keys = sorted(set(message) - {"role", "content"})
        if extra_keys:
            raise invalid(where, f"has keys {extra_keys}; a message has 'role' and 'content'")
        role = message.get("role")
        if role == "user":
            new = _user_from(message.get("content"), where)
        elif role == "assistant":
            new = [_assistant_from(message.get("content"), where)]
        else:
            raise invalid(
                where,
                f"role must be 'user' or 'assistant', got {role!r} (the system prompt is the "
                "payload's 'system')",
            )
        if role == previous:  # consecutive turns of one role, which the API combines
            new[0] = marked(new[0], NAME, "_split")
        previous = role
        out.extend(new)
    return out


def to_anthropic(messages: Iterable[Message]) -> dict[str, Any]:
    """Messages as an Anthropic Messages request's ``system`` (left out when there is none)
    and ``messages``.

    System and developer messages become ``system``, wherever they stood; consecutive messages
    of one role are merged into one message, tool results first in the user message after their
    calls; what Anthropic cannot take is left out: empty and whitespace-only text, a message's
    ``name``, reasoning another provider made, audio, media in assistant messages, images other
    than PNG, JPEG, GIF and WEBP, documents other than PDF and plain text, files known only by
    another provider's id. Assistant messages before the first user message are left out (with
    the results of their calls), and the final assistant message loses its trailing
    whitespace. Tool call ids that Anthropic would refuse (it takes ``[A-Za-z0-9_-]``) are
    replaced, on the call and its result alike, by a stable id made from them.
    """
    items = list(messages)
    for i, m in enumerate(items):
        if not isinstance(m, Message):
            raise InvalidMessageError(
                f"messages[{i}] must be a Message, got {type(m).__name__} "
                "(convert OpenAI dicts with zerda.from_openai first)"
            )
    out: dict[str, Any] = {}
    system = _system_out([m for m in items if m.role in PINNED])
    if system is not None:
        out["system"] = system
    body = [m for m in items if m.role not in PINNED]
    out["messages"] = _messages_out(body)
    return out


# -- payload -> messages ---------------------------------------------------------------------


def _system_from(value: object) -> Message:
    if isinstance(value, str):
        return build("system", Message, Role.SYSTEM, value)
    blocks = listing(value, "system")
    if not blocks:
        raise invalid("system", "is an empty list (leave 'system' out when there is none)")
    parts = []
    for j, raw in enumerate(blocks):
        where = f"system[{j}]"
        block = mapping(raw, where)
        if block.get("type") != "text":
            raise invalid(
                where, f"the system prompt holds text blocks, got type {block.get('type')!r}"
            )
        parts.append(_part_from(block, where))
    return build("system", Message, Role.SYSTEM, tuple(parts))


def _user_from(content: object, where: str) -> list[Message]:
    if isinstance(content, str):
        return [build(where, Message, Role.USER, content)]
    blocks = listing(content, f"{where}.content")
    if not blocks:
        raise invalid(f"{where}.content", "is an empty list")
    out: list[Message] = []
    pending: list[Part] = []
    for j, raw in enumerate(blocks):
        block_where = f"{where}.content[{j}]"
        block = mapping(raw, block_where)
        if block.get("type") == "tool_result":
            if pending:
                out.append(build(where, Message, Role.USER, tuple(pending)))
                pending = []
            out.append(_result_from(block, block_where))
        else:
            pending.append(_part_from(block, block_where))
    if pending:
        out.append(build(where, Message, Role.USER, tuple(pending)))
    return out


def _assistant_from(content: object, where: str) -> Message:
    if content == "" or (isinstance(content, (list, tuple)) and not content):
        # an empty final assistant message, which the API allows
        empty = "string" if content == "" else "list"
        return build(where, Message, Role.ASSISTANT, "", metadata={NAME: {"_empty": empty}})
    if isinstance(content, str):
        return build(where, Message, Role.ASSISTANT, content)
    blocks = listing(content, f"{where}.content")
    parts: list[Part] = []
    calls: list[ToolCall] = []
    order = []
    for j, raw in enumerate(blocks):
        block_where = f"{where}.content[{j}]"
        block = mapping(raw, block_where)
        kind = block.get("type")
        if kind == "tool_use":
            calls.append(_call_from(block, block_where))
            order.append("C")
        elif kind == "tool_result":
            raise invalid(block_where, "a tool_result block belongs in a user message")
        else:
            parts.append(_part_from(block, block_where))
            order.append("P")
    layout = "".join(order)
    metadata = {} if layout == "P" * len(parts) + "C" * len(calls) else {NAME: {"_order": layout}}
    return build(
        where,
        Message,
        Role.ASSISTANT,
        tuple(parts) if parts else None,
        tool_calls=tuple(calls),
        metadata=metadata,
    )


def _call_from(block: Mapping[str, Any], where: str) -> ToolCall:
    call_id = required_text(block, "id", where)
    name = required_text(block, "name", where)
    arguments = arguments_text(json_object(block.get("input"), f"{where}.input"))
    kept = fields(block, ("type", "id", "name", "input"))
    return build(where, ToolCall, call_id, name, arguments, extra=owned(NAME, kept))


def _result_from(block: Mapping[str, Any], where: str) -> Message:
    call_id = required_text(block, "tool_use_id", where)
    value = block.get("content")
    modelled = {"type", "tool_use_id", "content"}
    content: str | tuple[Part, ...]
    if isinstance(value, str) and value:
        content = value
    elif isinstance(value, (list, tuple)) and value:
        content = tuple(
            _part_from(mapping(b, f"{where}.content[{j}]"), f"{where}.content[{j}]")
            for j, b in enumerate(value)
        )
    else:
        content = ""  # no content, "" or []: kept as given
        modelled.discard("content")
    kept = fields(block, modelled)
    metadata = owned(NAME, kept)
    return build(where, Message, Role.TOOL, content, tool_call_id=call_id, metadata=metadata)


def _source(block: Mapping[str, Any], where: str) -> tuple[dict[str, Any], Mapping[str, Any]]:
    source = mapping(block.get("source"), f"{where}.source")
    kept = fields(block, ("type", "source"))
    return kept, source


def _part_from(block: Mapping[str, Any], where: str) -> Part:
    kind = block.get("type")
    if kind == "text":
        text = required_text(block, "text", where, empty=True)
        return build(where, TextPart, text, extra=owned(NAME, fields(block, ("type", "text"))))
    if kind == "image":
        kept, source = _source(block, where)
        _, url, rest = _source_url(source, f"{where}.source", ("base64", "url"))
        if rest:
            kept["source"] = rest
        return build(where, ImagePart, url, extra=owned(NAME, kept))
    if kind == "document":
        kept, source = _source(block, where)
        kind, url, rest = _source_url(source, f"{where}.source", ("base64", "text", "url"))
        if rest:
            kept["source"] = rest
        title = block.get("title")
        if isinstance(title, str) and title:
            del kept["title"]
        else:
            title = None
        data, link = (None, url) if kind == "url" else (url, None)
        return build(where, FilePart, data, url=link, filename=title, extra=owned(NAME, kept))
    if kind == "thinking":
        thinking = required_text(block, "thinking", where, empty=True)
        signature = block.get("signature")
        modelled = {"type", "thinking"}
        if isinstance(signature, str) and signature:
            modelled.add("signature")
        else:
            signature = None
        kept = fields(block, modelled)
        return build(where, ReasoningPart, thinking, signature=signature, extra={NAME: kept})
    if kind == "redacted_thinking":
        data = required_text(block, "data", where)
        kept = fields(block, ("type", "data"))
        return build(where, ReasoningPart, "", encrypted=data, extra={NAME: kept})
    if kind == "tool_use":
        raise invalid(where, "a tool_use block belongs in an assistant message")
    raise invalid(where, f"unknown block type {kind!r}; the types are {_BLOCK_TYPES}")


def _source_url(
    source: Mapping[str, Any], where: str, kinds: Sequence[str]
) -> tuple[str, str, dict[str, Any]]:
    """A source's type, the source as Zerda's URL (a ``data:`` URL for inline data), and its
    unmodelled keys."""
    kind = source.get("type")
    if kind not in kinds:
        raise invalid(where, f"source type {kind!r} is not one of {', '.join(kinds)}")
    if kind == "url":
        return kind, required_text(source, "url", where), fields(source, ("type", "url"))
    media_type = required_text(source, "media_type", where)
    data = required_text(source, "data", where, empty=kind == "text")
    rest = fields(source, ("type", "media_type", "data"))
    if kind == "text":
        if media_type != "text/plain":
            raise invalid(where, f"a text source's media_type is 'text/plain', got {media_type!r}")
        check_text(data, f"{where}: the document's text")
        data = base64.b64encode(data.encode("utf-8")).decode("ascii")
    elif media_type == "text/plain":  # would read back as a text source
        raise invalid(where, "a base64 source holds a PDF ('application/pdf'), not 'text/plain'")
    return str(kind), data_url(media_type, data), rest


# -- messages -> payload ---------------------------------------------------------------------


def _tool_id(call_id: str) -> str:
    """``call_id`` if Anthropic takes it, else a stable id made from it."""
    if _TOOL_ID.fullmatch(call_id):
        return call_id
    return "toolu_zerda_" + hashlib.sha256(call_id.encode("utf-8")).hexdigest()[:24]


def _text_block(part: TextPart) -> dict[str, Any] | None:
    if not part.text.strip():
        return None  # "text content blocks must contain non-whitespace text"
    return merge({"type": "text", "text": part.text}, provider(part.extra, NAME))


def _system_out(pinned: list[Message]) -> str | list[dict[str, Any]] | None:
    if len(pinned) == 1 and isinstance(pinned[0].content, str):
        text = pinned[0].content
        return text if text.strip() else None
    blocks = []
    for m in pinned:
        for part in m.parts:
            block = _text_block(part) if type(part) is TextPart else None
            if block is not None:
                blocks.append(block)
    return blocks or None


def _media_block(part: Part) -> dict[str, Any] | None:
    """A user-side block: text, an image or a document, or None when Anthropic cannot take
    the part."""
    if type(part) is TextPart:
        return _text_block(part)
    if gemini_file(part):
        return None
    kept = provider(part.extra, NAME)
    if type(part) is ImagePart:
        parsed = split_data_url(part.url)
        if parsed is not None and parsed[0] in IMAGE_TYPES:
            source: dict[str, Any] = {"type": "base64", "media_type": parsed[0], "data": parsed[1]}
        elif is_http(part.url):
            source = {"type": "url", "url": part.url}
        else:
            return None
        return merge({"type": "image", "source": source}, kept)
    if type(part) is FilePart:
        parsed = split_data_url(part.data)
        text = decoded_text(part.data)
        if parsed is not None and parsed[0] == "application/pdf":
            source = {"type": "base64", "media_type": parsed[0], "data": parsed[1]}
        elif text is not None:
            source = {"type": "text", "media_type": "text/plain", "data": text}
        elif is_http(part.url):
            source = {"type": "url", "url": part.url}
        else:
            return None
        block: dict[str, Any] = {"type": "document", "source": source}
        if part.filename is not None:
            block["title"] = part.filename
        return merge(block, kept)
    return None  # audio; reasoning is the assistant's


def _reasoning_block(part: ReasoningPart) -> dict[str, Any] | None:
    kept = provider(part.extra, NAME)
    if kept is None:
        return None  # another provider's reasoning: Anthropic could not verify it
    if part.encrypted is not None and part.signature is None:
        return merge({"type": "redacted_thinking", "data": part.encrypted}, kept)
    if part.signature is None and "signature" not in kept:
        return None  # a thinking block needs its signature
    block: dict[str, Any] = {"type": "thinking", "thinking": part.text}
    if part.signature is not None:
        block["signature"] = part.signature
    return merge(block, kept)


def _assistant_blocks(m: Message) -> list[dict[str, Any]]:
    blocks = []
    for item in in_order(m, bookkeeping(m, NAME).get("_order")):
        if isinstance(item, ToolCall):
            use = {
                "type": "tool_use",
                "id": _tool_id(item.id),
                "name": item.name,
                "input": arguments_object(item.arguments),
            }
            blocks.append(merge(use, provider(item.extra, NAME)))
            continue
        if type(item) is TextPart:
            block = _text_block(item)
        elif type(item) is ReasoningPart:
            block = _reasoning_block(item)
        else:
            block = None  # media in an assistant message
        if block is not None:
            blocks.append(block)
    return blocks


def _result_block(m: Message) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": _tool_id(m.tool_call_id or "")}
    if isinstance(m.content, str):
        if m.content.strip():
            block["content"] = m.content
    else:
        content = [b for b in (_media_block(p) for p in m.parts) if b is not None]
        if content:
            block["content"] = content
    return merge(block, bookkeeping(m, NAME))


@dataclasses.dataclass
class _Entry:
    kind: str  # user, tool or assistant
    message: Message
    blocks: list[dict[str, Any]]


def _messages_out(body: list[Message]) -> list[dict[str, Any]]:
    entries: list[_Entry] = []
    dropped: set[str] = set()
    started = False
    for i, m in enumerate(body):
        if m.role is Role.USER:
            if isinstance(m.content, str):
                blocks = [{"type": "text", "text": m.content}] if m.content.strip() else []
            else:
                blocks = [b for b in (_media_block(p) for p in m.parts) if b is not None]
            if blocks:
                entries.append(_Entry("user", m, blocks))
                started = True
        elif m.role is Role.TOOL:
            if m.tool_call_id in dropped:
                continue
            entries.append(_Entry("tool", m, [_result_block(m)]))
            started = True
        elif not started:  # Anthropic opens on a user message
            dropped.update(c.id for c in m.tool_calls)
        else:
            blocks = _assistant_blocks(m)
            if blocks or (bookkeeping(m, NAME).get("_empty") and i == len(body) - 1):
                entries.append(_Entry("assistant", m, blocks))
    groups: list[list[_Entry]] = []
    for entry in entries:
        role = "assistant" if entry.kind == "assistant" else "user"
        split = entry.kind != "tool" and bookkeeping(entry.message, NAME).get("_split")
        last = groups[-1] if groups else None
        if last and (last[0].kind == "assistant") == (role == "assistant") and not split:
            last.append(entry)
        else:
            groups.append([entry])
    out = [_message_out(group) for group in groups]
    _trim_final(out)
    return out


def _message_out(group: list[_Entry]) -> dict[str, Any]:
    role = "assistant" if group[0].kind == "assistant" else "user"
    if len(group) == 1 and group[0].kind != "tool":
        m = group[0].message
        only = group[0].blocks
        if not only:  # the empty final assistant message, as it was given
            empty = "" if bookkeeping(m, NAME)["_empty"] == "string" else []
            return {"role": role, "content": empty}
        if isinstance(m.content, str) and only == [{"type": "text", "text": m.content}]:
            return {"role": role, "content": m.content}
    results = [b for e in group if e.kind == "tool" for b in e.blocks]
    others = [b for e in group if e.kind != "tool" for b in e.blocks]
    return {"role": role, "content": results + others}


def _trim_final(out: list[dict[str, Any]]) -> None:
    """A final assistant message must not end with whitespace (the API refuses it)."""
    if not out or out[-1]["role"] != "assistant":
        return
    content = out[-1]["content"]
    if isinstance(content, str):
        if content != content.rstrip():
            out[-1]["content"] = content.rstrip()
            if not out[-1]["content"]:
                out.pop()
        return
    if content and content[-1].get("type") == "text":
        text = content[-1]["text"]
        if text != text.rstrip():
            content[-1]["text"] = text.rstrip()
            if not content[-1]["text"].strip():
                content.pop()
                if not content:
                    out.pop()
