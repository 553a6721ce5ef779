"""LangChain message conversion, lossless for Zerda messages: :func:`to_langchain` and
:func:`from_langchain` (see :mod:`zerda.integrations.langchain`, which exports them)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from langchain_core.messages import (
    AIMessage,
    BaseMessage,
    ChatMessage,
    HumanMessage,
    InvalidToolCall,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages import ToolCall as LCToolCall
from langchain_core.messages.tool import invalid_tool_call, tool_call

from zerda._media import data_url, split_data_url
from zerda.errors import InvalidMessageError
from zerda.integrations._json import storable
from zerda.integrations._parts import (
    kept,
    kept_as_given,
    restored,
    round_trips,
    with_given,
    with_kept,
)
from zerda.messages import Message, Role, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart

ZERDA_KEY = "zerda"
"""The ``additional_kwargs`` key under which :func:`to_langchain` keeps what LangChain's
message fields cannot hold."""

_OPENAI_ROLE = "__openai_role__"
"""langchain-openai's mark on a ``SystemMessage`` that is a developer message, both ways."""

# -- content parts <-> LangChain content blocks ----------------------------------------------

_FORMAT = "langchain"
"""The format name under which a part's ``extra`` keeps the block fields Zerda does not model
(a block ``id``, ``annotations``, other ``extras``), and the block's type when it was not a
standard one (an Anthropic ``thinking`` block, an OpenAI ``image_url``), so that it goes back in
the shape it came in."""

_TOOL_BLOCKS = frozenset({"tool_use", "tool_call", "invalid_tool_call", "tool_call_chunk"})
_BLOCK_TYPES = (
    "text, image, audio, file, reasoning (and image_url, input_audio, OpenAI's file, thinking, "
    "redacted_thinking, and LangChain 0.3's source_type blocks)"
)


def _part_block(part: Part) -> dict[str, Any]:
    """The LangChain content block for ``part``: a standard block (``text``, ``image``,
    ``audio``, ``file``, ``reasoning``), or the shape :func:`from_langchain` read it in."""
    fields = kept(part, _FORMAT)
    shape = fields.pop("type", None)
    raw = fields.pop("extras", None)
    extras: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    block: dict[str, Any]
    if type(part) is TextPart:
        block = {"type": "text", "text": part.text}
    elif type(part) is ImagePart:
        if shape == "image_url" and part.url is not None:
            image: dict[str, Any] = {"url": part.url}
            if part.detail is not None:
                image["detail"] = part.detail
            block = {"type": "image_url", "image_url": image}
        else:
            inline = split_data_url(part.url) is not None
            block = {"type": "image"}
            _source(
                block,
                url=None if inline else part.url,
                data=part.url if inline else None,
                media_type=part.media_type,
            )
            if part.file_id is not None:
                block["file_id"] = part.file_id
            if part.detail is not None:
                extras["detail"] = part.detail
    elif type(part) is AudioPart:
        block = {"type": "audio", "base64": part.data, "mime_type": f"audio/{part.format}"}
    elif type(part) is FilePart:
        block = {"type": "file"}
        _source(block, url=part.url, data=part.data, media_type=part.media_type)
        if part.file_id is not None:
            block["file_id"] = part.file_id
        if part.filename is not None:
            extras["filename"] = part.filename
    else:
        assert type(part) is ReasoningPart
        if shape == "thinking" and part.encrypted is None:
            block = {"type": "thinking", "thinking": part.text}
            if part.signature is not None:
                block["signature"] = part.signature
        elif shape == "redacted_thinking" and part.encrypted is not None:
            block = {"type": "redacted_thinking", "data": part.encrypted}
        else:
            block = {"type": "reasoning", "reasoning": part.text}
            if part.signature is not None:
                extras["signature"] = part.signature
            if part.encrypted is not None:
                extras["encrypted_content"] = part.encrypted
    if extras:
        block["extras"] = extras
    return {**fields, **block}


def _source(
    block: dict[str, Any], *, url: str | None, data: str | None, media_type: str | None
) -> None:
    """A data block's source in ``block``: ``base64`` and ``mime_type`` for a ``data:`` URL,
    ``url`` for a URL, and the media type as ``mime_type`` when the data does not give one."""
    if data is not None:
        inline = split_data_url(data)
        # Data that is not a data: URL goes as it is; the bookkeeping keeps it exactly.
        mime_type, base64 = inline or (media_type or "application/octet-stream", data)
        block["base64"] = base64
        block["mime_type"] = mime_type
    if url is not None:
        block["url"] = url
    if media_type is not None and "mime_type" not in block:
        block["mime_type"] = media_type


def _block_part(block: object, *, ai: bool = False) -> Part | None:
    """The part for a LangChain content block; ``None`` for an ``AIMessage``'s tool-call
    blocks (the calls are in its ``tool_calls``)."""
    if isinstance(block, str):
        return TextPart(block)
    if not isinstance(block, Mapping):
        raise InvalidMessageError(
            f"a content block must be a string or a dict, got {type(block).__name__}"
        )
    kind = block.get("type")
    if ai and kind in _TOOL_BLOCKS:
        return None
    fields = dict(_from_v0(block) if "source_type" in block else block)
    fields.pop("type", None)
    raw = fields.pop("extras", None)
    extras: dict[str, Any] = dict(raw) if isinstance(raw, Mapping) else {}
    if raw is not None and not isinstance(raw, Mapping):
        fields["extras"] = raw
    take = fields.pop

    def extra(shape: str | None = None) -> dict[str, Any]:
        """What is left of the block, kept in the part's extra."""
        if extras:
            fields["extras"] = extras
        if shape is not None:
            fields["type"] = shape
        return with_kept(fields, _FORMAT)

    if kind in ("image", "file", "document") and "source" in fields:
        raise InvalidMessageError(
            f"an Anthropic-style {kind} block (with 'source'); give LangChain's standard "
            "image or file block (url, base64 with mime_type, or file_id)"
        )
    if kind == "text":
        return TextPart(take("text", None), extra=extra())
    if kind == "image_url":
        url, detail = _image_url(take("image_url", None))
        return ImagePart(url, detail=detail, extra=extra("image_url"))
    if kind == "input_audio":
        audio = take("input_audio", None)
        if not isinstance(audio, Mapping):
            raise InvalidMessageError("an input_audio block needs an input_audio dict")
        return AudioPart(audio.get("data"), audio.get("format"), extra=extra())  # type: ignore[arg-type]
    if kind == "file" and "file" in fields:  # OpenAI's file part
        file = take("file")
        if not isinstance(file, Mapping):
            raise InvalidMessageError("a file block's file must be a dict")
        return FilePart(
            file.get("file_data"),
            file_id=file.get("file_id"),
            filename=file.get("filename"),
            extra=extra(),
        )
    if kind in ("image", "file"):
        url, mime_type = take("url", None), take("mime_type", None)
        data = take("base64", None)
        if data is not None:
            if not isinstance(mime_type, str) or not isinstance(data, str):
                raise InvalidMessageError(f"a base64 {kind} block needs its mime_type")
            data, mime_type = data_url(mime_type, data), None
        if kind == "image":
            if data is not None and url is not None:
                fields["url"] = url  # LangChain's own second source, kept as it is
            return ImagePart(
                data if data is not None else url,
                file_id=take("file_id", None),
                detail=extras.pop("detail", None),
                media_type=mime_type,
                extra=extra(),
            )
        return FilePart(
            data,
            file_id=take("file_id", None),
            url=url,
            filename=extras.pop("filename", None) or take("filename", None),
            media_type=mime_type,
            extra=extra(),
        )
    if kind == "audio":
        data, mime_type = take("base64", None), take("mime_type", None)
        if not isinstance(data, str) or not isinstance(mime_type, str):
            raise InvalidMessageError(
                "an audio block needs base64 data and its mime_type (Zerda keeps audio as "
                "data, not by url or file id)"
            )
        return AudioPart(data, mime_type.split("/")[-1], extra=extra())
    if kind == "reasoning":
        return ReasoningPart(
            take("reasoning", None) or "",
            signature=extras.pop("signature", None),
            encrypted=extras.pop("encrypted_content", None),
            extra=extra(),
        )
    if kind == "thinking":
        return ReasoningPart(
            take("thinking", None) or "",
            signature=take("signature", None),
            extra=extra("thinking"),
        )
    if kind == "redacted_thinking":
        return ReasoningPart("", encrypted=take("data", None), extra=extra("redacted_thinking"))
    raise InvalidMessageError(f"a {kind!r} content block; Zerda keeps {_BLOCK_TYPES}")


def _image_url(value: object) -> tuple[Any, Any]:
    """The url and detail of an OpenAI ``image_url`` (a dict, or a bare URL string)."""
    if isinstance(value, str):
        return value, None
    if not isinstance(value, Mapping) or set(value) - {"url", "detail"}:
        raise InvalidMessageError(
            f"an image_url block's image_url must be a URL or {{'url': ..., 'detail': ...}}, "
            f"got {value!r:.80}"
        )
    return value.get("url"), value.get("detail")


def _from_v0(block: Mapping[str, Any]) -> dict[str, Any]:
    """A LangChain 0.3 data block (``source_type`` url, base64 or id) as a standard one."""
    out = {k: v for k, v in block.items() if k not in ("source_type", "data", "id")}
    source = block.get("source_type")
    if source == "base64":
        out["base64"] = block.get("data")
    elif source == "id":
        out["file_id"] = block.get("id")
    elif source != "url":
        raise InvalidMessageError(
            f"a {block.get('type')!r} block with source_type {source!r}; Zerda reads url, "
            "base64 and id"
        )
    return out


def _content_blocks(parts: tuple[Part, ...], extra: dict[str, Any]) -> list[dict[str, Any]]:
    """The blocks for ``parts``; each part that would not come back exactly from its block is
    kept whole in ``extra["parts"]``, by index."""
    blocks = []
    saved: dict[str, Any] = {}
    for i, part in enumerate(parts):
        block = _part_block(part)
        if not round_trips(part, block, _block_part):
            saved[str(i)] = part.to_dict()
        blocks.append(block)
    if saved:
        extra["parts"] = saved
    return blocks


def _content(message: BaseMessage, saved: Mapping[str, Any]) -> str | tuple[Part, ...]:
    """The message's content: its text, or its content blocks as parts (an ``AIMessage``'s
    tool-call blocks left out: the calls are in its ``tool_calls``)."""
    content = message.content
    if isinstance(content, str):
        return content
    ai = isinstance(message, AIMessage)
    parts: list[Part] = []
    for i, block in enumerate(content):
        part = restored(saved.get("parts"), i, block, _part_block)
        if part is None:
            try:
                part = _block_part(block, ai=ai)
            except InvalidMessageError as exc:
                raise InvalidMessageError(
                    f"{type(message).__name__} content block {i}: {exc}"
                ) from None
        if part is not None:
            parts.append(part)
    return tuple(parts) if parts else ""


# -- Zerda -> LangChain --------------------------------------------------------------------


def _parsed_args(call: ToolCall) -> dict[str, Any] | None:
    """The call's arguments as a dict, or ``None`` when the text is not a JSON object."""
    try:
        parsed = json.loads(call.arguments)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _exact(call: ToolCall, args: dict[str, Any] | None) -> bool:
    """Whether ``from_langchain`` rebuilds this call exactly from ``args``."""
    return (
        call.type == "function"
        and not call.extra
        and args is not None
        and json.dumps(args) == call.arguments
    )


def to_langchain(message: Message, *, include_zerda_fields: bool = True) -> BaseMessage:
    """A Zerda :class:`~zerda.Message` as the matching LangChain message.

    user -> ``HumanMessage``, assistant -> ``AIMessage`` (tool calls as ``tool_calls``, with
    ``args`` parsed from the JSON text; a call whose text is not a JSON object goes to
    ``invalid_tool_calls``), tool -> ``ToolMessage``, system -> ``SystemMessage``, developer
    -> ``SystemMessage`` marked ``additional_kwargs["__openai_role__"] = "developer"`` (as
    ``langchain-openai`` marks it, and sends it as a developer message). Content parts
    become LangChain's standard content blocks (``text``, ``image``, ``audio``, ``file``,
    ``reasoning``). ``name`` is kept; ``metadata``, ``created_at``, ``id`` and anything else
    needed to rebuild the message exactly go in ``additional_kwargs["zerda"]``.

    A message :func:`from_langchain` read is the LangChain message it was (``==``): what
    LangChain's fields held that Zerda's do not (``id``, ``additional_kwargs``,
    ``response_metadata``, ``usage_metadata``, a tool message's ``status`` and ``artifact``,
    a ``ChatMessage``'s role, content and tool calls in the shape they were given) is in
    ``metadata["langchain"]`` and put back, unless the message was changed on Zerda's side
    since (then it is shown as it now is).

    ``include_zerda_fields=False`` leaves ``additional_kwargs["zerda"]`` out: Zerda's own
    bookkeeping, which LangChain code does not expect on a message it reads back (the message
    then is not equal to the one it added), but without which :func:`from_langchain` cannot
    rebuild the Zerda message exactly.
    """
    if not isinstance(message, Message):
        raise InvalidMessageError(
            f"to_langchain takes a zerda.Message, got {type(message).__name__}"
        )
    extra: dict[str, Any] = {}
    if message.metadata:
        extra["metadata"] = dict(message.metadata)
    if message.created_at is not None:
        extra["created_at"] = message.created_at
    if message.id is not None:
        extra["id"] = message.id
    content = message.content
    fields: dict[str, Any] = {"content": ""}
    if isinstance(content, tuple):
        fields["content"] = _content_blocks(content, extra)
    elif content is not None:
        fields["content"] = content
    else:
        extra["content_none"] = True
    if message.name is not None:
        fields["name"] = message.name
    raw = message.metadata.get("langchain")
    saved: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    if isinstance(saved.get("id"), str):
        fields["id"] = saved["id"]
    if isinstance(saved.get("response_metadata"), Mapping):
        fields["response_metadata"] = dict(saved["response_metadata"])
    chat_role = saved.get("role")  # given as a ChatMessage, which holds no tool calls
    if not (
        isinstance(chat_role, str)
        and _CHAT_ROLES.get(chat_role) is message.role
        and not message.tool_calls
    ):
        chat_role = None
    if message.role is Role.TOOL:
        fields["tool_call_id"] = message.tool_call_id
        if saved.get("status") in ("success", "error"):
            fields["status"] = saved["status"]
        if "artifact" in saved:
            fields["artifact"] = saved["artifact"]
    elif message.role is Role.ASSISTANT and chat_role is None:
        fields.update(_langchain_calls(message, extra))
        if _is_usage(saved.get("usage_metadata")):
            fields["usage_metadata"] = dict(saved["usage_metadata"])
    given_kwargs = saved.get("additional_kwargs")
    kwargs: dict[str, Any] = {}
    if isinstance(given_kwargs, Mapping):
        kwargs = {k: v for k, v in given_kwargs.items() if k != ZERDA_KEY}
    if message.role is Role.DEVELOPER and chat_role is None:
        kwargs[_OPENAI_ROLE] = "developer"
    if include_zerda_fields and extra:
        kwargs[ZERDA_KEY] = extra
    if kwargs:
        fields["additional_kwargs"] = kwargs
    return _as_given(_built(message.role, chat_role, fields), saved, message)


def _langchain_calls(message: Message, extra: dict[str, Any]) -> dict[str, Any]:
    """An ``AIMessage``'s ``tool_calls`` and ``invalid_tool_calls`` for the message's calls;
    when they would not give the calls back exactly, the calls go in ``extra`` too."""
    tool_calls: list[LCToolCall] = []
    invalid: list[InvalidToolCall] = []
    all_exact = True
    for call in message.tool_calls:
        args = _parsed_args(call)
        all_exact = all_exact and _exact(call, args)
        if args is None:
            invalid.append(
                invalid_tool_call(
                    name=call.name,
                    args=call.arguments,
                    id=call.id,
                    error="arguments are not a JSON object",
                )
            )
        else:
            tool_calls.append(tool_call(name=call.name, args=args, id=call.id))
    if not all_exact:  # keep the calls as said, in order, so from_langchain restores them
        extra["tool_calls"] = [call.to_dict() for call in message.tool_calls]
    return {"tool_calls": tool_calls, "invalid_tool_calls": invalid}


def _is_usage(value: object) -> bool:
    """Whether ``value`` is a LangChain ``UsageMetadata`` (its three counts given)."""
    return isinstance(value, Mapping) and all(
        isinstance(value.get(key), int) for key in ("input_tokens", "output_tokens", "total_tokens")
    )


def _built(role: Role, chat_role: str | None, fields: dict[str, Any]) -> BaseMessage:
    """The LangChain message of ``role`` (a ``ChatMessage`` of ``chat_role`` when given)."""
    if chat_role is not None:
        return ChatMessage(role=chat_role, **fields)
    if role is Role.USER:
        return HumanMessage(**fields)
    if role in (Role.SYSTEM, Role.DEVELOPER):
        return SystemMessage(**fields)
    if role is Role.TOOL:
        return ToolMessage(**fields)
    return AIMessage(**fields)


_GIVEN_CALLS = ("tool_calls", "invalid_tool_calls")
"""The ``AIMessage`` fields :func:`from_langchain` keeps as given when Zerda's calls would
not give them back (an invalid call's error, a call given as invalid whose arguments parse)."""


def _as_given(built: BaseMessage, saved: Mapping[str, Any], message: Message) -> BaseMessage:
    """``built`` with the content and tool calls :func:`from_langchain` kept as they were
    given, if they still say what ``message`` says; else ``built`` (the message was changed
    on Zerda's side, and is shown as it now is)."""
    update: dict[str, Any] = {}
    if "content" in saved:
        content = with_given(saved["content"], built.content)
        if isinstance(content, (str, list)):
            update["content"] = content
    if isinstance(built, AIMessage):
        for key in _GIVEN_CALLS:
            if isinstance(saved.get(key), list):
                update[key] = saved[key]
    if not update:
        return built
    try:
        given = type(built)(**{**dict(built), **update})
        same = _content(given, {}) == ("" if message.content is None else message.content)
        if isinstance(given, AIMessage):
            same = same and _calls(given, None) == message.tool_calls
    except (InvalidMessageError, ValueError, TypeError, KeyError):
        return built
    return given if same else built


def to_langchain_messages(
    messages: Iterable[Message], *, include_zerda_fields: bool = True
) -> list[BaseMessage]:
    """:func:`to_langchain` over a list (e.g. ``memory.get_context()``)."""
    return [to_langchain(m, include_zerda_fields=include_zerda_fields) for m in messages]


# -- LangChain -> Zerda --------------------------------------------------------------------


_CHAT_ROLES = {
    "user": Role.USER,
    "human": Role.USER,
    "assistant": Role.ASSISTANT,
    "ai": Role.ASSISTANT,
    "system": Role.SYSTEM,
    "developer": Role.DEVELOPER,
}


def _role_of(message: BaseMessage) -> Role:
    if isinstance(message, HumanMessage):
        return Role.USER
    if isinstance(message, AIMessage):
        return Role.ASSISTANT
    if isinstance(message, SystemMessage):
        developer = message.additional_kwargs.get(_OPENAI_ROLE) == "developer"
        return Role.DEVELOPER if developer else Role.SYSTEM
    if isinstance(message, ToolMessage):
        return Role.TOOL
    if isinstance(message, ChatMessage) and message.role in _CHAT_ROLES:
        return _CHAT_ROLES[message.role]
    what = type(message).__name__
    if isinstance(message, ChatMessage):
        what += f" with role {message.role!r}"
    raise InvalidMessageError(
        f"cannot convert a LangChain {what} to a Zerda message; use HumanMessage, AIMessage, "
        "ToolMessage or SystemMessage"
    )


def _langchain_metadata(message: BaseMessage) -> dict[str, Any]:
    """LangChain fields Zerda has no place for, kept in ``metadata["langchain"]`` (those a
    store could not keep, as a Python object in ``additional_kwargs``, are left out)."""
    kept: dict[str, Any] = {}
    if message.id is not None:
        kept["id"] = message.id
    if message.response_metadata:
        kept["response_metadata"] = message.response_metadata
    usage = getattr(message, "usage_metadata", None)
    if usage:
        kept["usage_metadata"] = dict(usage)
    if isinstance(message, ToolMessage):
        if message.status != "success":
            kept["status"] = message.status
        if message.artifact is not None:
            kept["artifact"] = message.artifact
    if isinstance(message, ChatMessage):
        kept["role"] = message.role
    developer = isinstance(message, SystemMessage) and _role_of(message) is Role.DEVELOPER
    kwargs = {
        key: value
        for key, value in message.additional_kwargs.items()
        if key != ZERDA_KEY and not (developer and key == _OPENAI_ROLE) and storable(value, 3)
    }
    if kwargs:
        kept["additional_kwargs"] = kwargs
    return {k: v for k, v in kept.items() if storable(v, 2)}


def _given(message: BaseMessage, shown: BaseMessage) -> dict[str, Any]:
    """What of ``message`` Zerda would show otherwise (``shown``): its content and tool calls
    in the shape they were given (a string in a content list, an ``AIMessage``'s tool-call
    blocks, a LangChain 0.3 block, an invalid call's error, ...), to keep in
    ``metadata["langchain"]``. Content blocks Zerda shows as given are not kept twice."""
    given: dict[str, Any] = {}
    if shown.content != message.content:
        given["content"] = kept_as_given(message.content, shown.content)
    if isinstance(message, AIMessage) and isinstance(shown, AIMessage):
        for key in _GIVEN_CALLS:
            if getattr(shown, key) != getattr(message, key):
                given[key] = [dict(call) for call in getattr(message, key)]
    return {k: v for k, v in given.items() if storable(v, 2)}


def _calls(message: AIMessage, saved: Any) -> tuple[ToolCall, ...]:
    ids = [c.get("id") for c in message.tool_calls] + [
        c.get("id") for c in message.invalid_tool_calls
    ]
    if isinstance(saved, list):
        calls = tuple(ToolCall.from_openai(c, extra=True) for c in saved)
        if sorted(map(str, ids)) == sorted(c.id for c in calls):
            return calls  # the calls exactly as the model made them
    out = [
        ToolCall(id=c.get("id"), name=c["name"], arguments=json.dumps(c["args"]))  # type: ignore[arg-type]
        for c in message.tool_calls
    ]
    for c in message.invalid_tool_calls:
        args = c.get("args")
        out.append(
            ToolCall(id=c.get("id"), name=c.get("name"), arguments="{}" if args is None else args)  # type: ignore[arg-type]
        )
    return tuple(out)


def from_langchain(message: BaseMessage) -> Message:
    """A LangChain message as a Zerda :class:`~zerda.Message`; the inverse of
    :func:`to_langchain`.

    ``HumanMessage``, ``AIMessage`` (``tool_calls`` and ``invalid_tool_calls``), ``ToolMessage``
    and ``SystemMessage`` (a developer message when marked ``__openai_role__``) convert, as
    does a ``ChatMessage`` whose role is user, assistant, system or developer. A content list
    becomes content parts: LangChain's standard ``text``, ``image``, ``audio``, ``file`` and
    ``reasoning`` blocks, OpenAI's ``image_url``, ``input_audio`` and ``file`` parts,
    Anthropic's ``thinking`` and ``redacted_thinking``, and LangChain 0.3's ``source_type``
    blocks (an ``AIMessage``'s tool-call blocks are skipped: the calls are in ``tool_calls``);
    any other block, and any other message type, raises
    :class:`~zerda.errors.InvalidMessageError`. What LangChain's fields hold that Zerda's do
    not is kept in ``metadata["langchain"]``, so that :func:`to_langchain` gives the message
    back equal to ``message``: its ``id``, ``additional_kwargs``, ``response_metadata``,
    ``usage_metadata``, a tool message's ``status`` and ``artifact``, a ``ChatMessage``'s role,
    and its content and tool calls as given when Zerda's would not show them so (values a
    store cannot keep, such as Python objects, are left out).
    """
    if not isinstance(message, BaseMessage):
        raise InvalidMessageError(
            f"from_langchain takes a LangChain BaseMessage, got {type(message).__name__}"
        )
    role = _role_of(message)
    extra = message.additional_kwargs.get(ZERDA_KEY)
    saved: Mapping[str, Any] = extra if isinstance(extra, Mapping) else {}
    content: str | tuple[Part, ...] | None = _content(message, saved)
    tool_calls: tuple[ToolCall, ...] = ()
    if isinstance(message, AIMessage):
        tool_calls = _calls(message, saved.get("tool_calls"))
        if saved.get("content_none") and tool_calls and content == "":
            content = None
    fields: dict[str, Any] = {
        "role": role,
        "content": content,
        "name": message.name,
        "tool_calls": tool_calls,
        "tool_call_id": message.tool_call_id if isinstance(message, ToolMessage) else None,
        "created_at": saved.get("created_at"),
        "id": saved.get("id"),
    }
    if "metadata" in saved or "created_at" in saved or "id" in saved:  # a Zerda message
        return Message(**fields, metadata=saved.get("metadata") or {})
    lc = _langchain_metadata(message)
    converted = Message(**fields, metadata={"langchain": lc} if lc else {})
    if saved:  # Zerda's bookkeeping gives the Zerda message back; nothing to keep as given
        return converted
    given = _given(message, to_langchain(converted, include_zerda_fields=False))
    if not given:
        return converted
    return Message(**fields, metadata={"langchain": {**lc, **given}})


def from_langchain_messages(messages: Iterable[BaseMessage]) -> list[Message]:
    """:func:`from_langchain` over a list."""
    return [from_langchain(m) for m in messages]
