"""Gemini API ``generateContent`` payloads (``system_instruction`` and ``contents``) <->
Messages.

The shapes are those of the Gemini API's ``Content`` and ``Part``
(https://ai.google.dev/api/caching#Content, https://ai.google.dev/api/generate-content, and the
typed models of google-genai, ``google/genai/types.py``): each content
``{"role": "user"|"model", "parts": [...]}``, each part one of ``text`` (with ``thought`` on
the model's thought summaries), ``inline_data`` (``mime_type``, base64 ``data``),
``file_data`` (``mime_type``, ``file_uri``), ``functionCall`` (``id``, ``name``, ``args``)
or ``functionResponse`` (``id``, ``name``, ``response``), any of them with the
``thoughtSignature`` the model attached. Google's REST reference spells keys in camelCase
(``inlineData``) and its examples and SDK in snake_case (``inline_data``); both are read, and
each part is written back as it was spelled (new parts as the examples spell them).

The rules a request must follow (the API's own errors): "function call turn comes immediately
after a user turn or after a function response turn"; "function response turn comes
immediately after a function call turn", holding only function responses ("the number of
function response parts is equal to the number of function call parts of the function call
turn"); and, on Gemini 3 models, function calls of the current turn carry the model's thought
signature (https://ai.google.dev/gemini-api/docs/thought-signatures).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping
from typing import Any

from zerda._media import data_url, split_data_url
from zerda.errors import InvalidMessageError
from zerda.formats._common import (
    arguments_object,
    arguments_text,
    bookkeeping,
    build,
    fields,
    in_order,
    invalid,
    is_http,
    json_object,
    listing,
    mapping,
    marked,
    merge,
    owned,
    owned_reasoning,
    provider,
    required_text,
)
from zerda.messages import PINNED, Message, Role, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart

NAME = "gemini"

# Each key Zerda reads, as the Gemini docs' examples spell it, and its other spelling.
_SPELLINGS = {
    "system_instruction": "systemInstruction",
    "inline_data": "inlineData",
    "file_data": "fileData",
    "mime_type": "mimeType",
    "file_uri": "fileUri",
    "functionCall": "function_call",
    "functionResponse": "function_response",
    "thoughtSignature": "thought_signature",
}

_TOP = frozenset({"contents", "system_instruction", "systemInstruction"})

SKIP_SIGNATURE = "skip_thought_signature_validator"
"""The thought signature Google documents for function calls Gemini did not make (a
conversation moved from another model): Gemini 3 refuses such calls in the current turn
without a signature, and takes this one."""

_AUDIO_FORMATS = {"audio/mpeg": "mp3", "audio/x-wav": "wav", "audio/wave": "wav"}
_URL_TYPES = {
    ".png": "image/png",
    ".jpg": "image/jpeg",
    ".jpeg": "image/jpeg",
    ".gif": "image/gif",
    ".webp": "image/webp",
    ".heic": "image/heic",
    ".heif": "image/heif",
    ".pdf": "application/pdf",
    ".txt": "text/plain",
}


def from_gemini(payload: Mapping[str, Any]) -> list[Message]:
    """A Gemini ``generateContent`` payload (``{"system_instruction": ..., "contents": [...]}``)
    as Messages: ``to_gemini(from_gemini(p)) == p``.

    ``system_instruction`` is a system message; a ``model`` content is one assistant message
    (text, thoughts as reasoning parts, media, ``functionCall`` as tool calls); a ``user``
    content is a user message for its text and media and a tool message for each
    ``functionResponse``. A call without an ``id`` gets one made from its content and place (the
    same payload always gives the same ids), which is not sent back to Gemini; its response,
    which must then stand in the next content, takes its call's id by position.
    """
    data = mapping(payload, "the Gemini payload")
    unknown = sorted(set(data) - _TOP)
    if unknown:
        raise invalid(
            "the Gemini payload",
            f"has keys {unknown}; from_gemini reads 'system_instruction' and 'contents' (a "
            "request's other parameters, such as 'generationConfig', are not conversation)",
        )
    out: list[Message] = []
    top = dict(data)
    spelled: list[str] = []
    system = _pop(top, "system_instruction", spelled, "the Gemini payload")
    if system is not None:
        out.append(_system_from(system, spelled))
    previous_calls: list[ToolCall] = []
    previous_kind: str | None = None
    for i, raw in enumerate(listing(data.get("contents"), "contents")):
        where = f"contents[{i}]"
        content = mapping(raw, where)
        extra_keys = sorted(set(content) - {"role", "parts"})
        if extra_keys:
            raise invalid(where, f"has keys {extra_keys}; a content has 'role' and 'parts'")
        role = content.get("role")
        if role not in (None, "user", "model"):
            raise invalid(where, f"role must be 'user' or 'model', got {role!r}")
        parts = listing(content.get("parts"), f"{where}.parts")
        if not parts:
            raise invalid(f"{where}.parts", "is empty: a content holds at least one part")
        if role == "model":
            new = [_model_from(content, parts, i, where)]
            calls = list(new[0].tool_calls)
        else:
            new = _user_from(parts, where, previous_calls)
            calls = []
        kinds = [_kind(m) for m in new]
        if previous_kind is not None and _joins(previous_kind, kinds[0]):
            new[0] = marked(new[0], NAME, "_split")
        for k in range(1, len(new)):
            if not _joins(kinds[k - 1], kinds[k]):
                new[k] = marked(new[k], NAME, "_join")
        if role is None:
            new[0] = marked(new[0], NAME, "_no_role")
        out.extend(new)
        previous_calls = calls
        previous_kind = kinds[-1]
    return out


def to_gemini(messages: Iterable[Message]) -> dict[str, Any]:
    """Messages as a Gemini ``generateContent`` request's ``system_instruction`` (left out when
    there is none) and ``contents``.

    System and developer messages become ``system_instruction``, wherever they stood;
    assistant messages are ``model`` contents (consecutive ones merged, so that a function call
    turn follows a user turn), tool results one ``user`` content of function responses after
    their calls (named after their call; their text is ``{"output": text}`` unless it came from
    Gemini as another object), user messages ``user`` contents. What Gemini cannot take is left
    out: empty text, a message's ``name``, reasoning another provider made, files known only by
    another provider's id, URLs whose media type is unknown. Assistant messages before the first
    user message are left out, with the results of their calls. Function calls Gemini did not
    make carry the thought signature Google documents for them (:data:`SKIP_SIGNATURE`).
    """
    items = list(messages)
    for i, m in enumerate(items):
        if not isinstance(m, Message):
            raise InvalidMessageError(
                f"messages[{i}] must be a Message, got {type(m).__name__} "
                "(convert OpenAI dicts with zerda.from_openai first)"
            )
    pinned = [m for m in items if m.role in PINNED]
    out: dict[str, Any] = {}
    system = _system_out(pinned)
    if system is not None:
        spelling = _spelling(pinned[0].metadata) if len(pinned) == 1 else set()
        out[_key("system_instruction", spelling)] = system
    out["contents"] = _contents_out([m for m in items if m.role not in PINNED])
    return out


# -- spelling and bookkeeping ----------------------------------------------------------------


def _pop(data: dict[str, Any], key: str, spelled: list[str], where: str) -> Any:
    """``data``'s ``key`` in either spelling, taken out of ``data`` (None when absent or null;
    a null stays in ``data``, to be kept verbatim)."""
    other = _SPELLINGS[key]
    if key in data and other in data:
        raise invalid(where, f"has both {key!r} and {other!r}")
    name = key if key in data else other if other in data else None
    if name is None or data[name] is None:
        return None
    if name == other:
        spelled.append(other)
    return data.pop(name)


def _key(key: str, spelling: set[str] | frozenset[str]) -> str:
    other = _SPELLINGS[key]
    return other if other in spelling else key


def _spelling(extra: Mapping[str, Any]) -> set[str]:
    kept = provider(extra, NAME)
    value = kept.get("_spelling") if kept else None
    return {s for s in value if isinstance(s, str)} if isinstance(value, list) else set()


def _with_spelling(kept: dict[str, Any], spelled: list[str]) -> dict[str, Any]:
    if spelled:
        kept["_spelling"] = sorted(set(spelled))
    return kept


def _kind(m: Message) -> str:
    return {Role.ASSISTANT: "model", Role.TOOL: "tool"}.get(m.role, "user")


def _joins(before: str, after: str) -> bool:
    """Whether two messages share one content by default: function responses (one content
    answers one call turn) and model messages (a call turn must follow a user turn)."""
    return before == after and after in ("tool", "model")


# -- payload -> messages ---------------------------------------------------------------------


def _system_from(value: object, spelled: list[str]) -> Message:
    where = "system_instruction"
    content = mapping(value, where)
    extra_keys = sorted(set(content) - {"role", "parts"})
    if extra_keys:
        raise invalid(where, f"has keys {extra_keys}; a content has 'role' and 'parts'")
    parts = listing(content.get("parts"), f"{where}.parts")
    if not parts:
        raise invalid(f"{where}.parts", "is empty")
    texts: list[Part] = []
    for j, raw in enumerate(parts):
        part_where = f"{where}.parts[{j}]"
        part = _part_from(dict(mapping(raw, part_where)), [], part_where)
        if type(part) is not TextPart:
            raise invalid(part_where, "the system instruction holds text parts")
        texts.append(part)
    kept = _with_spelling(fields(content, ("parts",)), spelled)
    return build(where, Message, Role.SYSTEM, _content(texts), metadata=owned(NAME, kept))


def _content(parts: list[Part]) -> str | tuple[Part, ...] | None:
    """One plain text part is the message's text; more parts are its parts."""
    if len(parts) == 1 and type(parts[0]) is TextPart and not parts[0].extra:
        return parts[0].text
    return tuple(parts) if parts else None


def _digest(index: int, content: Mapping[str, Any]) -> str:
    text = json.dumps(content, sort_keys=True, default=repr)
    return hashlib.sha256(f"{index}:{text}".encode()).hexdigest()[:16]


def _model_from(content: Mapping[str, Any], parts: Any, index: int, where: str) -> Message:
    zerda_parts: list[Part] = []
    calls: list[ToolCall] = []
    order = []
    digest: str | None = None
    for j, raw in enumerate(parts):
        part_where = f"{where}.parts[{j}]"
        part = dict(mapping(raw, part_where))
        spelled: list[str] = []
        call = _pop(part, "functionCall", spelled, part_where)
        if call is None:
            if _pop(part, "functionResponse", [], part_where) is not None:
                raise invalid(part_where, "a functionResponse belongs in a user content")
            zerda_parts.append(_part_from(part, spelled, part_where))
            order.append("P")
            continue
        if digest is None:
            digest = _digest(index, content)
        made_up = f"gemini-{digest}-{len(calls)}"
        calls.append(_call_from(call, part, spelled, part_where, made_up))
        order.append("C")
    layout = "".join(order)
    canonical = "P" * len(zerda_parts) + "C" * len(calls)
    metadata = {} if layout == canonical else {NAME: {"_order": layout}}
    return build(
        where,
        Message,
        Role.ASSISTANT,
        _content(zerda_parts),
        tool_calls=tuple(calls),
        metadata=metadata,
    )


def _call_from(
    value: object, part: dict[str, Any], spelled: list[str], where: str, made_up: str
) -> ToolCall:
    call = mapping(value, f"{where}.functionCall")
    name = required_text(call, "name", f"{where}.functionCall")
    modelled = {"name"}
    kept = dict(part)  # the part's other keys: a thoughtSignature, …
    args = call.get("args")
    if isinstance(args, Mapping):
        arguments = arguments_text(json_object(args, f"{where}.functionCall.args"))
        modelled.add("args")
    elif args is None:
        arguments = "{}"
        kept["_no_args"] = True
    else:
        raise invalid(
            f"{where}.functionCall", f"'args' must be an object, got {type(args).__name__}"
        )
    call_id = call.get("id")
    if isinstance(call_id, str) and call_id:
        modelled.add("id")
    else:
        call_id = made_up
        kept["_made_up_id"] = True
    rest = fields(call, modelled)
    if rest:
        kept[_key("functionCall", set(spelled))] = rest
    _with_spelling(kept, spelled)
    # Always under Gemini's name, even when empty: it says Gemini made the call.
    return build(where, ToolCall, call_id, name, arguments, extra={NAME: kept})


def _user_from(parts: Any, where: str, previous_calls: list[ToolCall]) -> list[Message]:
    out: list[Message] = []
    pending: list[Part] = []
    answered = 0
    for j, raw in enumerate(parts):
        part_where = f"{where}.parts[{j}]"
        part = dict(mapping(raw, part_where))
        spelled: list[str] = []
        response = _pop(part, "functionResponse", spelled, part_where)
        if response is None:
            if _pop(part, "functionCall", [], part_where) is not None:
                raise invalid(part_where, "a functionCall belongs in a model content")
            pending.append(_part_from(part, spelled, part_where))
            continue
        if pending:
            out.append(build(where, Message, Role.USER, _content(pending)))
            pending = []
        call = previous_calls[answered] if answered < len(previous_calls) else None
        out.append(_response_from(response, part, spelled, part_where, call))
        answered += 1
    if pending:
        out.append(build(where, Message, Role.USER, _content(pending)))
    return out


def _response_from(
    value: object, part: dict[str, Any], spelled: list[str], where: str, call: ToolCall | None
) -> Message:
    inner_where = f"{where}.functionResponse"
    response = mapping(value, inner_where)
    name = required_text(response, "name", inner_where)
    body = json_object(response.get("response"), f"{inner_where}.response")
    modelled = {"response"}
    kept = dict(part)
    call_id = response.get("id")
    paired = call if call is not None and call.name == name else None
    made_up = paired is not None and bool((provider(paired.extra, NAME) or {}).get("_made_up_id"))
    if isinstance(call_id, str) and call_id and not made_up:
        modelled.add("id")
    elif paired is not None and isinstance(call_id, str) and call_id:
        # An id, where its call had none: the call's made-up id pairs them; this one is kept.
        call_id = paired.id
    elif paired is not None:
        call_id = paired.id
        kept["_no_id"] = True
    else:
        raise invalid(
            inner_where,
            f"a response to {name!r} without an id must stand, in the content right after its "
            "call's, at its call's place (calls and responses pair in order); give it its "
            "call's id, or convert it with its call",
        )
    if set(body) == {"output"} and isinstance(body["output"], str):
        content = body["output"]
    else:
        content = json.dumps(body, ensure_ascii=False)
        kept["_json"] = True
    kept[_key("functionResponse", set(spelled))] = fields(response, modelled)
    _with_spelling(kept, spelled)
    return build(where, Message, Role.TOOL, content, tool_call_id=call_id, metadata={NAME: kept})


def _audio_format(mime: str) -> str:
    return _AUDIO_FORMATS.get(mime, mime.partition("/")[2] or mime)


def _part_from(part: dict[str, Any], spelled: list[str], where: str) -> Part:
    """A text, thought or media part (a call or a response is read by the caller)."""
    text = part.get("text")
    if text is not None:
        if not isinstance(text, str):
            raise invalid(where, f"'text' must be a string, got {type(text).__name__}")
        del part["text"]
        if part.get("thought") is True:
            del part["thought"]
            signature = _pop(part, "thoughtSignature", spelled, where)
            if not (isinstance(signature, str) and signature):
                if signature is not None:  # an empty one, kept as given
                    part[_key("thoughtSignature", set(spelled))] = signature
                signature = None
            kept = _with_spelling(part, spelled)
            return build(where, ReasoningPart, text, signature=signature, extra={NAME: kept})
        return build(where, TextPart, text, extra=owned(NAME, _with_spelling(part, spelled)))
    inline = _pop(part, "inline_data", spelled, where)
    if inline is not None:
        blob = dict(mapping(inline, f"{where}.inline_data"))
        mime = _pop(blob, "mime_type", spelled, f"{where}.inline_data")
        if not (isinstance(mime, str) and mime):
            raise invalid(f"{where}.inline_data", "needs 'mime_type', a non-empty string")
        data = required_text(blob, "data", f"{where}.inline_data")
        del blob["data"]
        kept = dict(part)
        if blob:
            kept[_key("inline_data", set(spelled))] = blob
        if mime.startswith("image/"):
            _with_spelling(kept, spelled)
            return build(where, ImagePart, data_url(mime, data), extra=owned(NAME, kept))
        if mime.startswith("audio/"):
            audio_format = _audio_format(mime)
            if mime != f"audio/{audio_format}":
                kept["_mime"] = mime
            _with_spelling(kept, spelled)
            return build(where, AudioPart, data, audio_format, extra=owned(NAME, kept))
        _with_spelling(kept, spelled)
        return build(where, FilePart, data_url(mime, data), extra=owned(NAME, kept))
    file = _pop(part, "file_data", spelled, where)
    if file is not None:
        file_data = dict(mapping(file, f"{where}.file_data"))
        uri = _pop(file_data, "file_uri", spelled, f"{where}.file_data")
        if not (isinstance(uri, str) and uri):
            raise invalid(f"{where}.file_data", "needs 'file_uri', a non-empty string")
        mime = _pop(file_data, "mime_type", spelled, f"{where}.file_data")
        if not (isinstance(mime, str) and mime):
            if mime is not None:
                file_data[_key("mime_type", set(spelled))] = mime
            mime = None
        kept = dict(part)
        if file_data:
            kept[_key("file_data", set(spelled))] = file_data
        kept["_file_data"] = True
        _with_spelling(kept, spelled)
        if mime is not None and mime.startswith("image/"):
            return build(where, ImagePart, uri, media_type=mime, extra=owned(NAME, kept))
        return build(where, FilePart, url=uri, media_type=mime, extra=owned(NAME, kept))
    raise invalid(
        where,
        "is not a part Zerda reads: text (with thought), inline_data, file_data, functionCall, "
        f"functionResponse; its keys are {sorted(part)}",
    )


# -- messages -> payload ---------------------------------------------------------------------


def _system_out(pinned: list[Message]) -> dict[str, Any] | None:
    parts = []
    for m in pinned:
        for part in m.parts:
            if type(part) is TextPart:
                out = _text_out(part)
                if out is not None:
                    parts.append(out)
    if not parts:
        return None
    content: dict[str, Any] = {"parts": parts}
    return merge(content, bookkeeping(pinned[0], NAME)) if len(pinned) == 1 else content


def _text_out(part: TextPart) -> dict[str, Any] | None:
    kept = provider(part.extra, NAME)
    if not part.text and not any(not k.startswith("_") for k in kept or ()):
        return None  # Gemini refuses empty text (but sends some back with a signature)
    return merge({"text": part.text}, kept)


def _media_type(part: ImagePart | FilePart, url: str) -> str | None:
    if part.media_type is not None:
        return part.media_type
    path = url.split("?", 1)[0].split("#", 1)[0].lower()
    for suffix, media_type in _URL_TYPES.items():
        if path.endswith(suffix):
            return media_type
    return None


def _part_out(part: Part) -> dict[str, Any] | None:
    if isinstance(part, TextPart):
        return _text_out(part)
    kept = provider(part.extra, NAME)
    spelling = _spelling(part.extra)
    if isinstance(part, ReasoningPart):
        if not owned_reasoning(part, NAME):
            return None  # another provider's reasoning: Gemini could not verify it
        out: dict[str, Any] = {"text": part.text, "thought": True}
        if part.signature is not None:
            out[_key("thoughtSignature", spelling)] = part.signature
        return merge(out, kept)
    if isinstance(part, AudioPart):
        mime = kept.get("_mime") if kept else None
        blob = {_key("mime_type", spelling): mime or f"audio/{part.format}", "data": part.data}
        return merge({_key("inline_data", spelling): blob}, kept)
    parsed = split_data_url(part.url if isinstance(part, ImagePart) else (part.data or part.url))
    if parsed is not None:
        blob = {_key("mime_type", spelling): parsed[0], "data": parsed[1]}
        return merge({_key("inline_data", spelling): blob}, kept)
    url = part.url
    if url is None:
        return None  # known only by another provider's file id
    ours = bool(kept and kept.get("_file_data"))
    media_type = part.media_type if ours else _media_type(part, url)
    if not ours and (media_type is None or not is_http(url)):
        return None
    file: dict[str, Any] = {}
    if media_type is not None:
        file[_key("mime_type", spelling)] = media_type
    file[_key("file_uri", spelling)] = url
    return merge({_key("file_data", spelling): file}, kept)


def _call_out(call: ToolCall) -> dict[str, Any]:
    kept = provider(call.extra, NAME)
    spelling = _spelling(call.extra)
    inner: dict[str, Any] = {"name": call.name}
    if not (kept and kept.get("_no_args")):
        inner["args"] = arguments_object(call.arguments)
    if not (kept and kept.get("_made_up_id")):
        inner["id"] = call.id
    return merge({_key("functionCall", spelling): inner}, kept)


def _model_parts(m: Message) -> list[dict[str, Any]]:
    out = []
    first_call: dict[str, Any] | None = None
    for item in in_order(m, bookkeeping(m, NAME).get("_order")):
        if isinstance(item, ToolCall):
            call = _call_out(item)
            first_call = first_call or call
            out.append(call)
        else:
            part = _part_out(item)
            if part is not None:
                out.append(part)
    if first_call is not None and not any(NAME in call.extra for call in m.tool_calls):
        # Calls another provider made: Gemini 3 wants a signature on the first of a turn's
        # calls, and takes this documented one for calls it did not make.
        first_call["thoughtSignature"] = SKIP_SIGNATURE
    return out


def _response_out(m: Message, calls: dict[str, ToolCall]) -> dict[str, Any] | None:
    kept = provider(m.metadata, NAME)
    spelling = _spelling(m.metadata)
    key = _key("functionResponse", spelling)
    call = calls.get(m.tool_call_id or "")
    inner_kept = kept.get(key) if kept else None
    name = inner_kept.get("name") if isinstance(inner_kept, Mapping) else None
    if not isinstance(name, str):
        if call is None:
            return None  # a result whose call is not here cannot be named
        name = call.name
    text = m.content if isinstance(m.content, str) else m.text
    response: object = {"output": text}
    if kept and kept.get("_json"):
        try:
            parsed = json.loads(text)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict):
            response = parsed
    inner: dict[str, Any] = {"name": name, "response": response}
    made_up = call is not None and bool((provider(call.extra, NAME) or {}).get("_made_up_id"))
    if not (kept and kept.get("_no_id")) and not (kept is None and made_up):
        inner["id"] = m.tool_call_id
    return merge({key: inner}, kept)


@dataclasses.dataclass
class _Entry:
    kind: str  # user, tool or model
    message: Message
    parts: list[dict[str, Any]]


def _contents_out(body: list[Message]) -> list[dict[str, Any]]:
    calls: dict[str, ToolCall] = {}
    dropped: set[str] = set()
    entries: list[_Entry] = []
    started = False
    for m in body:
        if m.role is Role.USER:
            if isinstance(m.content, str):
                parts = [{"text": m.content}] if m.content else []
            else:
                parts = [p for p in (_part_out(x) for x in m.parts) if p is not None]
            if parts:
                entries.append(_Entry("user", m, parts))
                started = True
        elif m.role is Role.TOOL:
            if m.tool_call_id in dropped:
                continue
            response = _response_out(m, calls)
            if response is not None:
                entries.append(_Entry("tool", m, [response]))
                started = True
        elif not started:  # a function call turn must follow a user turn
            dropped.update(c.id for c in m.tool_calls)
        else:
            for call in m.tool_calls:
                calls.setdefault(call.id, call)
            parts = _model_parts(m)
            if parts:
                entries.append(_Entry("model", m, parts))
    out: list[dict[str, Any]] = []
    previous: _Entry | None = None
    for entry in entries:
        marks = bookkeeping(entry.message, NAME)
        same_role = previous is not None and (previous.kind == "model") == (entry.kind == "model")
        if marks.get("_join"):
            join = same_role
        elif marks.get("_split"):
            join = False
        else:
            join = previous is not None and _joins(previous.kind, entry.kind)
        if join:
            out[-1]["parts"].extend(entry.parts)
        else:
            content: dict[str, Any] = (
                {}
                if marks.get("_no_role")
                else {"role": "model" if entry.kind == "model" else "user"}
            )
            content["parts"] = list(entry.parts)
            out.append(content)
        previous = entry
    return out
