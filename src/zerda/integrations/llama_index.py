"""LlamaIndex integration: a chat memory over any Zerda memory, and message conversion.

``ZerdaMemory(memory=...)`` is a LlamaIndex ``BaseMemory``: ``get()`` is the Zerda memory's
context (window, token budget or summary applied), ``put`` records messages, and the async
twins are native over the memory's async methods. Chat engines and agents take it where they
take a ``ChatMemoryBuffer``::

    memory = ZerdaMemory.from_defaults(token_limit=3000, store=SQLiteStore("chat.db"),
                                       session_id="alice")
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)

:func:`to_llama_index` and :func:`from_llama_index` convert single messages, losslessly for
Zerda messages: ``from_llama_index(to_llama_index(m)) == m``. Content parts are ``TextBlock``,
``ImageBlock``, ``AudioBlock``, ``DocumentBlock`` and ``ThinkingBlock`` blocks, tool calls
``ToolCallBlock`` blocks (arguments kept as the exact JSON text), a tool result carries
``additional_kwargs["tool_call_id"]``, and what LlamaIndex has no field for (Zerda's
``metadata``, ``created_at`` and ``id``, a message ``name``, a provider's file id) travels in
``additional_kwargs["zerda"]``.
``ZerdaMemory.get()``, whose messages go to a model, leaves that key out: completion-style
LLMs print ``additional_kwargs`` into the prompt. So does ``get_all()`` unless the memory is
built with ``include_zerda_fields=True``: the messages both give back are ``==`` to those
put (what LlamaIndex's fields held is kept in ``metadata["llama_index"]``).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping, Sequence
from io import IOBase
from pathlib import Path
from typing import Any

from zerda._media import data_url, split_data_url
from zerda.errors import ConfigurationError, InvalidMessageError
from zerda.integrations._json import storable
from zerda.integrations._parts import (
    kept,
    kept_as_given,
    restored,
    round_trips,
    with_given,
    with_kept,
)
from zerda.memory import BaseMemory, ConversationBufferMemory, ConversationTokenBufferMemory
from zerda.messages import Message, Role, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart
from zerda.stores import AsyncStore, Store
from zerda.tokens import TokenCounter

try:
    from llama_index.core.base.llms.types import (
        AudioBlock,
        ChatMessage,
        DocumentBlock,
        ImageBlock,
        MessageRole,
        TextBlock,
        ThinkingBlock,
        ToolCallBlock,
    )
    from llama_index.core.bridge.pydantic import ConfigDict, Field
    from llama_index.core.memory import BaseMemory as LlamaBaseMemory
except ImportError as exc:  # pragma: no cover - exercised only without llama-index-core
    raise ImportError(
        "zerda.integrations.llama_index needs llama-index-core>=0.14: "
        "pip install 'zerda-memory[llamaindex]'"
    ) from exc

__all__ = [
    "ZERDA_KEY",
    "ZerdaMemory",
    "from_llama_index",
    "from_llama_index_messages",
    "to_llama_index",
    "to_llama_index_messages",
]

ZERDA_KEY = "zerda"
"""The ``additional_kwargs`` key under which :func:`to_llama_index` keeps what LlamaIndex's
message fields cannot hold."""

_TO_ROLE = {
    Role.USER: MessageRole.USER,
    Role.ASSISTANT: MessageRole.ASSISTANT,
    Role.SYSTEM: MessageRole.SYSTEM,
    Role.DEVELOPER: MessageRole.DEVELOPER,
    Role.TOOL: MessageRole.TOOL,
}
_FROM_ROLE = {
    MessageRole.USER: Role.USER,
    MessageRole.ASSISTANT: Role.ASSISTANT,
    MessageRole.SYSTEM: Role.SYSTEM,
    MessageRole.DEVELOPER: Role.DEVELOPER,
    MessageRole.TOOL: Role.TOOL,
    MessageRole.CHATBOT: Role.ASSISTANT,  # Cohere's name for assistant
    MessageRole.MODEL: Role.ASSISTANT,  # Gemini's name for assistant
}

# -- content parts <-> LlamaIndex content blocks ---------------------------------------------

_FORMAT = "llama_index"
"""The format name under which a part's ``extra`` keeps the block fields Zerda does not model:
an image, audio or document ``path``, a thinking block's ``num_tokens`` and other
``additional_information``."""

_TITLE = "input_document"
"""The title LlamaIndex gives a ``DocumentBlock`` that has none."""

_Block = TextBlock | ImageBlock | AudioBlock | DocumentBlock | ThinkingBlock


def _part_block(part: Part) -> _Block:
    """The LlamaIndex block for ``part``. An image or a file known only by a provider's file
    id, which LlamaIndex has no field for, is a block without a source."""
    fields = kept(part, _FORMAT)
    path = fields.get("path")
    if type(part) is TextPart:
        return TextBlock(text=part.text)
    if type(part) is ImagePart:
        image: dict[str, Any] = {"detail": part.detail, "image_mimetype": part.media_type}
        inline = split_data_url(part.url)
        if inline is not None and part.media_type is None:
            image["image_mimetype"], data = inline
            image["image"] = data.encode("ascii", "replace")
            if isinstance(fields.get("url"), str):  # the block's second source
                image["url"] = fields["url"]
        elif part.url is not None:
            image["url"] = part.url
        if isinstance(path, str) and Path(path).is_file():
            image["path"] = path
        try:
            return ImageBlock(**image)
        except ValueError:  # a URL pydantic does not take; the bookkeeping keeps it
            image.pop("url", None)
            return ImageBlock(**image)
    if type(part) is AudioPart:
        audio: dict[str, Any] = {"audio": part.data.encode("ascii", "replace")}
        if isinstance(path, str) and Path(path).is_file():
            audio["path"] = path
        return AudioBlock(format=part.format, **audio)
    if type(part) is FilePart:
        document: dict[str, Any] = {
            "url": part.url,
            "title": part.filename,
            "document_mimetype": part.media_type,
        }
        if part.data is not None:
            inline = split_data_url(part.data)
            if inline is not None:
                mime_type, data = inline
                document["document_mimetype"] = part.media_type or mime_type
                document["data"] = data.encode("ascii", "replace")
            else:  # not a data: URL; the bookkeeping keeps it exactly
                document["data"] = part.data.encode()
        if isinstance(path, str):
            document["path"] = path
        return DocumentBlock(**document)
    assert type(part) is ReasoningPart
    raw = fields.get("additional_information")
    information = dict(raw) if isinstance(raw, Mapping) else {}
    if part.signature is not None:
        information["signature"] = part.signature
    if part.encrypted is not None:
        information["encrypted_content"] = part.encrypted
    tokens = fields.get("num_tokens")
    return ThinkingBlock(
        content=part.text,
        num_tokens=tokens if isinstance(tokens, int) else None,
        additional_information=information,
    )


def _sendable(block: _Block) -> bool:
    """Whether a model can be sent ``block``: a media block needs a source."""
    if isinstance(block, ImageBlock):
        return block.image is not None or block.url is not None or block.path is not None
    if isinstance(block, DocumentBlock):
        return block.data is not None or block.url is not None or block.path is not None
    return True


def _block_part(block: object) -> Part:
    """The part for a LlamaIndex content block (media given by ``path`` is read now)."""
    if isinstance(block, TextBlock):
        return TextPart(block.text)
    fields: dict[str, Any] = {}
    if isinstance(block, (ImageBlock, AudioBlock, DocumentBlock)) and block.path is not None:
        fields["path"] = str(block.path)
    if isinstance(block, ImageBlock):
        url = None if block.url is None else str(block.url)
        media_type = block.image_mimetype
        if block.image is not None or block.path is not None:
            if media_type is None:
                raise InvalidMessageError("an ImageBlock's image needs its image_mimetype")
            if url is not None:
                fields["url"] = url  # LlamaIndex's second source, kept as it is
            url, media_type = data_url(media_type, _base64(block.image, block.path)), None
        elif url is None:
            raise InvalidMessageError("an ImageBlock needs an image, a url or a path")
        elif media_type == ImageBlock(url=url).image_mimetype:
            media_type = None  # what LlamaIndex guessed from the URL, not given
        return ImagePart(
            url, detail=block.detail, media_type=media_type, extra=with_kept(fields, _FORMAT)
        )
    if isinstance(block, AudioBlock):
        if block.audio is None and block.path is None:
            raise InvalidMessageError(
                "an AudioBlock by url; Zerda keeps audio as data (give audio= or path=)"
            )
        if block.format is None:
            raise InvalidMessageError("an AudioBlock needs its format")
        return AudioPart(
            _base64(block.audio, block.path), block.format, extra=with_kept(fields, _FORMAT)
        )
    if isinstance(block, DocumentBlock):
        media_type = block.document_mimetype
        data: str | None = None
        if block.data is not None or (block.path is not None and block.url is None):
            data = data_url(
                media_type or "application/octet-stream", _base64(block.data, block.path)
            )
            media_type = None
        elif block.url is None:
            raise InvalidMessageError("a DocumentBlock needs data, a url or a path")
        elif media_type == DocumentBlock(url=block.url).document_mimetype:
            media_type = None  # what LlamaIndex guessed from the URL, not given
        return FilePart(
            data,
            url=block.url,
            filename=None if block.title == _TITLE else block.title,
            media_type=media_type,
            extra=with_kept(fields, _FORMAT),
        )
    if isinstance(block, ThinkingBlock):
        information = dict(block.additional_information)
        signature, encrypted = (
            information.pop(key) if isinstance(information.get(key), str) else None
            for key in ("signature", "encrypted_content")
        )
        if information:
            fields["additional_information"] = information
        if block.num_tokens is not None:
            fields["num_tokens"] = block.num_tokens
        return ReasoningPart(
            block.content or "",
            signature=signature,
            encrypted=encrypted,
            extra=with_kept(fields, _FORMAT),
        )
    raise InvalidMessageError(
        f"a {type(block).__name__}; Zerda keeps text, image, audio, document, thinking and "
        "tool call blocks"
    )


def _base64(value: object, path: object) -> str:
    """Base64 text of a block's data (which LlamaIndex keeps as base64 bytes), or of the file
    at ``path``."""
    if isinstance(value, bytes):
        return value.decode("ascii")
    if isinstance(value, IOBase):
        value.seek(0)
        return base64.b64encode(value.read()).decode("ascii")
    try:
        return base64.b64encode(Path(str(path)).read_bytes()).decode("ascii")
    except OSError as exc:
        raise InvalidMessageError(f"cannot read the block's file {path}: {exc.strerror}") from exc


# -- Zerda -> LlamaIndex -------------------------------------------------------------------


def to_llama_index(message: Message, *, lossless: bool = True) -> ChatMessage:
    """A Zerda :class:`~zerda.Message` as a LlamaIndex ``ChatMessage``.

    The role maps one to one (developer to ``MessageRole.DEVELOPER``). Text content is one
    ``TextBlock`` (none when the content is ``None``); content parts are ``TextBlock``,
    ``ImageBlock``, ``AudioBlock``, ``DocumentBlock`` and ``ThinkingBlock`` blocks; each tool
    call is a ``ToolCallBlock`` whose ``tool_kwargs`` is the call's exact argument text; a
    tool result carries ``additional_kwargs["tool_call_id"]``. Zerda's ``metadata``,
    ``created_at``, ``id`` and ``name``, and the parts LlamaIndex's blocks would not give back
    exactly, go in ``additional_kwargs["zerda"]``, unless ``lossless`` is false: then they
    are left out, as for messages on their way to a model (LlamaIndex's completion-style LLMs
    print ``additional_kwargs`` into the prompt), and so are image and file blocks with
    nothing a model could be sent (a provider's file id only).

    A message :func:`from_llama_index` read is, with ``lossless=False``, the ``ChatMessage``
    it was (``==``): its ``additional_kwargs``, its role (chatbot, model) and its blocks as
    given (several text blocks, a tool call's ``tool_kwargs`` dict, a block given by
    ``path``), kept in ``metadata["llama_index"]``, are put back either way, unless the
    message was changed on Zerda's side since (then it is shown as it now is).
    """
    if not isinstance(message, Message):
        raise InvalidMessageError(
            f"to_llama_index takes a zerda.Message, got {type(message).__name__}"
        )
    extra: dict[str, Any] = {}
    blocks: list[Any] = []  # every block, and those a model can be sent
    sent: list[Any] = []
    content = message.content
    if isinstance(content, tuple):
        parts: dict[str, Any] = {}
        for i, part in enumerate(content):
            block = _part_block(part)
            if lossless and not round_trips(part, block, _block_part):
                parts[str(i)] = part.to_dict()
            blocks.append(block)
            if _sendable(block):
                sent.append(block)
        if parts:
            extra["parts"] = parts
        if all(type(p) is TextPart for p in content):
            extra["content_parts"] = True  # else from_llama_index joins the text blocks
    elif content is not None:
        blocks.append(TextBlock(text=content))
        sent.append(blocks[-1])
    calls = [
        ToolCallBlock(tool_call_id=call.id, tool_name=call.name, tool_kwargs=call.arguments)
        for call in message.tool_calls
    ]
    blocks.extend(calls)
    sent.extend(calls)
    raw = message.metadata.get("llama_index")
    saved: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    given_kwargs = saved.get("additional_kwargs")
    kwargs: dict[str, Any] = {}
    if isinstance(given_kwargs, Mapping):
        kwargs = {k: v for k, v in given_kwargs.items() if k != ZERDA_KEY}
    call_id = message.tool_call_id
    # A result given its call's id only as "call_id" (as for OpenAI's Responses) stays so.
    if call_id is not None and ("tool_call_id" in kwargs or kwargs.get("call_id") != call_id):
        kwargs["tool_call_id"] = call_id
    role = _TO_ROLE[message.role]
    given_role = saved.get("role")
    if given_role in _ROLE_NAMES and _FROM_ROLE.get(MessageRole(given_role)) is message.role:
        role = MessageRole(given_role)
    shown = _as_given(blocks if lossless else sent, sent, saved, role, kwargs, message)
    if message.metadata:
        extra["metadata"] = dict(message.metadata)
    if message.created_at is not None:
        extra["created_at"] = message.created_at
    if message.id is not None:
        extra["id"] = message.id
    if message.name is not None:
        extra["name"] = message.name
    if any(call.type != "function" or call.extra for call in message.tool_calls):
        extra["tool_calls"] = [call.to_dict() for call in message.tool_calls]
    if extra and lossless:
        kwargs[ZERDA_KEY] = extra
    return ChatMessage(role=role, blocks=shown, additional_kwargs=kwargs)


_ROLE_NAMES = frozenset(role.value for role in MessageRole)


def _dumped(blocks: Sequence[Any]) -> list[dict[str, Any]]:
    """``blocks`` as the JSON ``ChatMessage`` reads them back from."""
    return [block.model_dump(mode="json") for block in blocks]


def _as_given(
    blocks: list[Any],
    sent: list[Any],
    saved: Mapping[str, Any],
    role: MessageRole,
    kwargs: dict[str, Any],
    message: Message,
) -> list[Any]:
    """``blocks``, or the blocks :func:`from_llama_index` kept as they were given (the gaps
    filled from ``sent``) if they still say what ``message`` says (else the message was
    changed on Zerda's side, and is shown as it now is)."""
    if "blocks" not in saved:
        return blocks
    given = with_given(saved["blocks"], _dumped(sent))
    if not isinstance(given, list):
        return blocks
    try:
        candidate = ChatMessage(role=role, blocks=given, additional_kwargs=kwargs)
        content, calls = _read(candidate, {})
    except (InvalidMessageError, ValueError, TypeError):
        return blocks
    if content != message.content or calls != message.tool_calls:
        return blocks
    return list(candidate.blocks)


def to_llama_index_messages(
    messages: Iterable[Message], *, lossless: bool = True
) -> list[ChatMessage]:
    """:func:`to_llama_index` over a list (e.g. ``memory.get_context()``)."""
    return [to_llama_index(m, lossless=lossless) for m in messages]


# -- LlamaIndex -> Zerda -------------------------------------------------------------------


def _call(block: ToolCallBlock) -> ToolCall:
    if not block.tool_call_id:
        raise InvalidMessageError(
            f"a ToolCallBlock for {block.tool_name!r} has no tool_call_id; Zerda needs it to "
            "pair the call with its result"
        )
    args = block.tool_kwargs
    text = args if isinstance(args, str) else json.dumps(args)
    return ToolCall(id=block.tool_call_id, name=block.tool_name, arguments=text)


def _openai_calls(raw: Any, *, extra: bool = False) -> tuple[ToolCall, ...]:
    """Calls from ``additional_kwargs["tool_calls"]`` (OpenAI objects or dicts), as older
    LlamaIndex LLM integrations recorded them (with ``extra``: as :func:`to_llama_index`
    kept them)."""
    if not isinstance(raw, list):
        return ()
    calls = []
    for item in raw:
        data = item.model_dump() if hasattr(item, "model_dump") else item
        if not isinstance(data, Mapping):
            raise InvalidMessageError(
                f"additional_kwargs['tool_calls'] holds a {type(item).__name__}, not a tool call"
            )
        calls.append(ToolCall.from_openai(data, extra=extra))
    return tuple(calls)


def _content(message: ChatMessage, saved: Mapping[str, Any]) -> str | tuple[Part, ...] | None:
    """The message's content: its text blocks joined with newlines (``None`` without any), or,
    when it has other blocks (images, thinking, ...), its blocks as parts."""
    blocks = [b for b in message.blocks if not isinstance(b, ToolCallBlock)]
    if not saved.get("content_parts") and all(isinstance(b, TextBlock) for b in blocks):
        return "\n".join(b.text for b in blocks) if blocks else None  # type: ignore[union-attr]
    parts = []
    for i, block in enumerate(blocks):
        part = restored(saved.get("parts"), i, block, _part_block)
        if part is None:
            try:
                part = _block_part(block)
            except InvalidMessageError as exc:
                raise InvalidMessageError(
                    f"a {message.role.value} ChatMessage's block {i}: {exc}"
                ) from None
        parts.append(part)
    return tuple(parts) if parts else None


def from_llama_index(message: ChatMessage) -> Message:
    """A LlamaIndex ``ChatMessage`` as a Zerda :class:`~zerda.Message`; the inverse of
    :func:`to_llama_index`.

    user, assistant, system, developer and tool messages convert (chatbot and model, other
    providers' names, as assistant). Text blocks alone are joined with newlines, as
    ``ChatMessage.content`` joins them; with image, audio, document or thinking blocks the
    content is parts, in block order (media given by ``path`` is read into the part). Tool
    calls come from ``ToolCallBlock`` blocks, or, when there are none, from OpenAI-style
    ``additional_kwargs["tool_calls"]``. A tool result needs
    ``additional_kwargs["tool_call_id"]`` (or ``"call_id"``). Video, cache and citation
    blocks, and audio by URL, raise :class:`~zerda.errors.InvalidMessageError`.

    What Zerda's fields do not hold is kept in ``metadata["llama_index"]``, so that
    :func:`to_llama_index` gives the message back equal to ``message``: its
    ``additional_kwargs`` (those a store can keep: not Python objects), a chatbot or model
    role, and its blocks as given when Zerda's would not show them so (several text blocks,
    a ``tool_kwargs`` dict, a block given by ``path``).
    """
    if not isinstance(message, ChatMessage):
        raise InvalidMessageError(
            f"from_llama_index takes a LlamaIndex ChatMessage, got {type(message).__name__}"
        )
    role = _FROM_ROLE.get(message.role)
    if role is None:
        raise InvalidMessageError(
            f"cannot convert a LlamaIndex {message.role.value!r} message to a Zerda message; "
            "use user, assistant, system, developer or tool"
        )
    kwargs = dict(message.additional_kwargs)
    extra = kwargs.pop(ZERDA_KEY, None)
    saved: Mapping[str, Any] = extra if isinstance(extra, Mapping) else {}
    content, calls = _read(message, saved)
    tool_call_id = kwargs.get("tool_call_id") or kwargs.get("call_id")
    name = saved.get("name", kwargs.get("name") if role is Role.TOOL else None)
    if role is Role.TOOL and tool_call_id is None:
        raise InvalidMessageError(
            "a LlamaIndex tool message needs additional_kwargs['tool_call_id'] to pair it with "
            "its call"
        )
    fields: dict[str, Any] = {
        "role": role,
        "content": content,
        "name": name,
        "tool_calls": calls,
        "tool_call_id": tool_call_id if role is Role.TOOL else None,
        "created_at": saved.get("created_at"),
        "id": saved.get("id"),
    }
    if "metadata" in saved or "created_at" in saved or "id" in saved:  # a Zerda message
        return Message(**fields, metadata=saved.get("metadata") or {})
    kept: dict[str, Any] = {}
    given_kwargs = {k: v for k, v in kwargs.items() if storable(v, 3)}
    if kwargs.get("call_id") != tool_call_id and given_kwargs.get("tool_call_id") == tool_call_id:
        del given_kwargs["tool_call_id"]  # the message's own; to_llama_index writes it
    if given_kwargs:
        kept["additional_kwargs"] = given_kwargs
    converted = Message(**fields, metadata={"llama_index": kept} if kept else {})
    if saved:  # Zerda's bookkeeping gives the Zerda message back; nothing to keep as given
        return converted
    shown = to_llama_index(converted, lossless=False)
    if shown.role is not message.role:
        kept["role"] = message.role.value
    if shown.blocks != message.blocks:
        try:
            blocks = kept_as_given(_dumped(message.blocks), _dumped(shown.blocks))
        except (ValueError, TypeError):  # a block holding a file object, say
            blocks = None
        if blocks is not None and storable(blocks, 2):
            kept["blocks"] = blocks
    if "role" not in kept and "blocks" not in kept:
        return converted
    return Message(**fields, metadata={"llama_index": kept})


def _read(
    message: ChatMessage, saved: Mapping[str, Any]
) -> tuple[str | tuple[Part, ...] | None, tuple[ToolCall, ...]]:
    """The content and tool calls of ``message`` (with Zerda's bookkeeping ``saved``)."""
    content = _content(message, saved)
    calls = [_call(b) for b in message.blocks if isinstance(b, ToolCallBlock)]
    if isinstance(saved.get("tool_calls"), list):
        calls = list(_openai_calls(saved["tool_calls"], extra=True))
    elif not calls:
        calls = list(_openai_calls(message.additional_kwargs.get("tool_calls")))
    if content is None and not (_FROM_ROLE.get(message.role) is Role.ASSISTANT and calls):
        content = ""
    return content, tuple(calls)


def from_llama_index_messages(messages: Iterable[ChatMessage]) -> list[Message]:
    """:func:`from_llama_index` over a list."""
    return [from_llama_index(m) for m in messages]


# -- the memory ----------------------------------------------------------------------------


class ZerdaMemory(LlamaBaseMemory):
    """A LlamaIndex chat memory backed by a Zerda memory.

    ``get()`` (and ``aget()``) is what the model should see: the Zerda memory's context, which
    starts with the pinned system and developer messages, then a user message, converted for
    the model (``lossless=False``: no Zerda bookkeeping in ``additional_kwargs``).
    ``get_all()`` is the whole conversation. The messages of both are ``==`` to those put.
    ``put_messages`` and ``set`` write one batch; the async twins call the Zerda memory's async
    methods, so an async store is used natively.

    ``include_zerda_fields=True`` makes ``get_all()`` lossless for Zerda's messages: Zerda's
    own fields (the Zerda message ``id`` and ``created_at``, its ``metadata``, ...) in
    ``additional_kwargs["zerda"]``, so that ``set(get_all())`` changes nothing and putting a
    message again (a retry) stores nothing new; the messages are then not equal to those put.
    ``get()`` never carries them: completion-style LLMs print ``additional_kwargs`` into the
    prompt.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: BaseMemory[Any] = Field(exclude=True, description="The Zerda memory behind this one.")
    include_zerda_fields: bool = Field(
        default=False,
        description="Whether get_all() adds Zerda's own fields in additional_kwargs['zerda'].",
    )

    def __init__(self, memory: BaseMemory[Any] | None = None, **data: Any) -> None:
        if not isinstance(memory, BaseMemory):
            raise ConfigurationError(
                f"ZerdaMemory takes a Zerda memory (memory=...), got {type(memory).__name__}"
            )
        super().__init__(memory=memory, **data)  # type: ignore[call-arg]  # a pydantic field

    @classmethod
    def class_name(cls) -> str:
        return "ZerdaMemory"

    @classmethod
    def from_defaults(  # type: ignore[override]  # narrower than BaseMemory's **kwargs
        cls,
        memory: BaseMemory[Any] | None = None,
        *,
        token_limit: int | None = None,
        store: Store | AsyncStore | None = None,
        session_id: str | None = None,
        token_counter: TokenCounter | None = None,
        chat_history: Sequence[ChatMessage] | None = None,
        include_zerda_fields: bool = False,
    ) -> ZerdaMemory:
        """Wrap ``memory``, or build one the way ``ChatMemoryBuffer.from_defaults`` does.

        Without ``memory``: a :class:`~zerda.ConversationTokenBufferMemory` with
        ``max_token_limit=token_limit`` when ``token_limit`` is given, else a
        :class:`~zerda.ConversationBufferMemory`; over ``store`` (default: in memory) and
        ``session_id`` (default ``"default"``). ``chat_history`` is recorded first, as one
        batch. ``include_zerda_fields`` is passed on (see :class:`ZerdaMemory`).
        """
        if memory is not None:
            given = [
                name
                for name, value in (
                    ("token_limit", token_limit),
                    ("store", store),
                    ("session_id", session_id),
                    ("token_counter", token_counter),
                )
                if value is not None
            ]
            if given:
                raise ConfigurationError(
                    f"from_defaults takes either memory= or {', '.join(given)}, not both: "
                    "set them on the Zerda memory"
                )
        else:
            options: dict[str, Any] = {"store": store, "session_id": session_id or "default"}
            if token_limit is not None:
                memory = ConversationTokenBufferMemory(
                    max_token_limit=token_limit, token_counter=token_counter, **options
                )
            elif token_counter is not None:
                raise ConfigurationError("token_counter needs token_limit (a token budget)")
            else:
                memory = ConversationBufferMemory(**options)
        wrapped = cls(memory=memory, include_zerda_fields=include_zerda_fields)
        if chat_history:
            wrapped.put_messages(list(chat_history))
        return wrapped

    @property
    def session_id(self) -> str:
        return self.memory.session_id

    @staticmethod
    def _check(initial_token_count: int) -> None:
        if initial_token_count:
            raise ConfigurationError(
                "ZerdaMemory.get() does not take initial_token_count: set reserve_tokens on the "
                "Zerda memory, or pin the system prompt in it so that its budget counts it"
            )

    def get(
        self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any
    ) -> list[ChatMessage]:
        """The Zerda memory's context (``input`` is accepted and unused, as in
        ``ChatMemoryBuffer``)."""
        self._check(initial_token_count)
        return to_llama_index_messages(self.memory.get_context(), lossless=False)

    async def aget(
        self, input: str | None = None, initial_token_count: int = 0, **kwargs: Any
    ) -> list[ChatMessage]:
        self._check(initial_token_count)
        return to_llama_index_messages(await self.memory.aget_context(), lossless=False)

    def get_all(self) -> list[ChatMessage]:
        """The whole conversation (with Zerda's own fields when ``include_zerda_fields``)."""
        return to_llama_index_messages(
            self.memory.get_history(), lossless=self.include_zerda_fields
        )

    async def aget_all(self) -> list[ChatMessage]:
        return to_llama_index_messages(
            await self.memory.aget_history(), lossless=self.include_zerda_fields
        )

    def put(self, message: ChatMessage) -> None:
        self.memory.add_messages([from_llama_index(message)])

    async def aput(self, message: ChatMessage) -> None:
        await self.memory.aadd_messages([from_llama_index(message)])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Record ``messages`` as one batch: all of them, or none if one does not convert."""
        self.memory.add_messages(from_llama_index_messages(messages))

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        await self.memory.aadd_messages(from_llama_index_messages(messages))

    def set(self, messages: list[ChatMessage]) -> None:
        """Replace the conversation with ``messages`` (converted before anything is cleared)."""
        converted = from_llama_index_messages(messages)
        self.memory.clear()
        self.memory.add_messages(converted)

    async def aset(self, messages: list[ChatMessage]) -> None:
        converted = from_llama_index_messages(messages)
        await self.memory.aclear()
        await self.memory.aadd_messages(converted)

    def reset(self) -> None:
        self.memory.clear()

    async def areset(self) -> None:
        await self.memory.aclear()

    def __repr__(self) -> str:
        return f"ZerdaMemory({type(self.memory).__name__}, session_id={self.session_id!r})"
