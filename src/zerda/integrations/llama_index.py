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
LLMs print ``additional_kwargs`` into the prompt.
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
from zerda.integrations._json import json_or_none
from zerda.integrations._parts import (
    kept,
    restored,
    round_trips,
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
    nothing a model could be sent (a provider's file id only). Other ``additional_kwargs``
    that :func:`from_llama_index` kept in ``metadata["llama_index"]`` are put back either way.
    """
    if not isinstance(message, Message):
        raise InvalidMessageError(
            f"to_llama_index takes a zerda.Message, got {type(message).__name__}"
        )
    extra: dict[str, Any] = {}
    blocks: list[Any] = []
    content = message.content
    if isinstance(content, tuple):
        saved: dict[str, Any] = {}
        for i, part in enumerate(content):
            block = _part_block(part)
            if lossless and not round_trips(part, block, _block_part):
                saved[str(i)] = part.to_dict()
            if lossless or _sendable(block):
                blocks.append(block)
        if saved:
            extra["parts"] = saved
        if all(type(p) is TextPart for p in content):
            extra["content_parts"] = True  # else from_llama_index joins the text blocks
    elif content is not None:
        blocks.append(TextBlock(text=content))
    blocks.extend(
        ToolCallBlock(tool_call_id=call.id, tool_name=call.name, tool_kwargs=call.arguments)
        for call in message.tool_calls
    )
    saved_kwargs = message.metadata.get("llama_index")
    saved_kwargs = (
        saved_kwargs.get("additional_kwargs") if isinstance(saved_kwargs, Mapping) else None
    )
    kwargs: dict[str, Any] = dict(saved_kwargs) if isinstance(saved_kwargs, Mapping) else {}
    if message.tool_call_id is not None:
        kwargs["tool_call_id"] = message.tool_call_id
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
    return ChatMessage(role=_TO_ROLE[message.role], blocks=blocks, additional_kwargs=kwargs)


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
    blocks, and audio by URL, raise :class:`~zerda.errors.InvalidMessageError`. Other
    JSON-able ``additional_kwargs`` are kept in ``metadata["llama_index"]`` and restored by
    :func:`to_llama_index`.
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
    content = _content(message, saved)
    calls = [_call(b) for b in message.blocks if isinstance(b, ToolCallBlock)]
    tool_call_id = kwargs.pop("tool_call_id", None) or kwargs.pop("call_id", None)
    raw_calls = kwargs.pop("tool_calls", None)
    if isinstance(saved.get("tool_calls"), list):
        calls = list(_openai_calls(saved["tool_calls"], extra=True))
    elif not calls:
        calls = list(_openai_calls(raw_calls))
    name = saved.get("name", kwargs.pop("name", None) if role is Role.TOOL else None)
    if role is Role.TOOL and tool_call_id is None:
        raise InvalidMessageError(
            "a LlamaIndex tool message needs additional_kwargs['tool_call_id'] to pair it with "
            "its call"
        )
    if "metadata" in saved or "created_at" in saved or "id" in saved:
        metadata: Mapping[str, Any] = saved.get("metadata") or {}
    else:
        rest = json_or_none(kwargs)
        metadata = {"llama_index": {"additional_kwargs": rest}} if rest else {}
    if content is None and not (role is Role.ASSISTANT and calls):
        content = ""
    return Message(
        role=role,
        content=content,
        name=name,
        tool_calls=tuple(calls),
        tool_call_id=tool_call_id if role is Role.TOOL else None,
        metadata=metadata,
        created_at=saved.get("created_at"),
        id=saved.get("id"),
    )


def from_llama_index_messages(messages: Iterable[ChatMessage]) -> list[Message]:
    """:func:`from_llama_index` over a list."""
    return [from_llama_index(m) for m in messages]


# -- the memory ----------------------------------------------------------------------------


class ZerdaMemory(LlamaBaseMemory):
    """A LlamaIndex chat memory backed by a Zerda memory.

    ``get()`` (and ``aget()``) is what the model should see: the Zerda memory's context, which
    starts with the pinned system and developer messages, then a user message, converted for
    the model (``lossless=False``: no Zerda bookkeeping in ``additional_kwargs``).
    ``get_all()`` is the whole conversation, converted losslessly, so ``set(get_all())``
    changes nothing.
    ``put_messages`` and ``set`` write one batch; the async twins call the Zerda memory's async
    methods, so an async store is used natively.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: BaseMemory = Field(exclude=True, description="The Zerda memory behind this one.")

    def __init__(self, memory: BaseMemory | None = None, **data: Any) -> None:
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
        memory: BaseMemory | None = None,
        *,
        token_limit: int | None = None,
        store: Store | AsyncStore | None = None,
        session_id: str | None = None,
        token_counter: TokenCounter | None = None,
        chat_history: Sequence[ChatMessage] | None = None,
    ) -> ZerdaMemory:
        """Wrap ``memory``, or build one the way ``ChatMemoryBuffer.from_defaults`` does.

        Without ``memory``: a :class:`~zerda.ConversationTokenBufferMemory` with
        ``max_token_limit=token_limit`` when ``token_limit`` is given, else a
        :class:`~zerda.ConversationBufferMemory`; over ``store`` (default: in memory) and
        ``session_id`` (default ``"default"``). ``chat_history`` is recorded first, as one
        batch.
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
        wrapped = cls(memory=memory)
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
        return to_llama_index_messages(self.memory.get_history())

    async def aget_all(self) -> list[ChatMessage]:
        return to_llama_index_messages(await self.memory.aget_history())

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
