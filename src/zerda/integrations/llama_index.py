"""LlamaIndex integration: a chat memory over any Zerda memory, and message conversion.

``ZerdaMemory(memory=...)`` is a LlamaIndex ``BaseMemory``: ``get()`` is the Zerda memory's
context (window, token budget or summary applied), ``put`` records messages, and the async
twins are native over the memory's async methods. Chat engines and agents take it where they
take a ``ChatMemoryBuffer``::

    memory = ZerdaMemory.from_defaults(token_limit=3000, store=SQLiteStore("chat.db"),
                                       session_id="alice")
    engine = SimpleChatEngine.from_defaults(llm=llm, memory=memory)

:func:`to_llama_index` and :func:`from_llama_index` convert single messages, losslessly for
Zerda messages: ``from_llama_index(to_llama_index(m)) == m``. Tool calls are
``ToolCallBlock`` blocks (arguments kept as the exact JSON text), a tool result carries
``additional_kwargs["tool_call_id"]``, and what LlamaIndex has no field for (Zerda's
``metadata``, ``created_at`` and ``id``, a message ``name``) travels in
``additional_kwargs["zerda"]``.
``ZerdaMemory.get()``, whose messages go to a model, leaves that key out: completion-style
LLMs print ``additional_kwargs`` into the prompt.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zerda.errors import ConfigurationError, InvalidMessageError
from zerda.integrations._json import json_or_none
from zerda.memory import BaseMemory, ConversationBufferMemory, ConversationTokenBufferMemory
from zerda.messages import Message, Role, ToolCall
from zerda.stores import AsyncStore, Store
from zerda.tokens import TokenCounter

try:
    from llama_index.core.base.llms.types import (
        ChatMessage,
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
    Role.TOOL: MessageRole.TOOL,
}
_FROM_ROLE = {
    MessageRole.USER: Role.USER,
    MessageRole.ASSISTANT: Role.ASSISTANT,
    MessageRole.SYSTEM: Role.SYSTEM,
    MessageRole.TOOL: Role.TOOL,
    MessageRole.DEVELOPER: Role.SYSTEM,  # OpenAI's newer name for system
    MessageRole.CHATBOT: Role.ASSISTANT,  # Cohere's name for assistant
    MessageRole.MODEL: Role.ASSISTANT,  # Gemini's name for assistant
}

# -- Zerda -> LlamaIndex -------------------------------------------------------------------


def to_llama_index(message: Message, *, lossless: bool = True) -> ChatMessage:
    """A Zerda :class:`~zerda.Message` as a LlamaIndex ``ChatMessage``.

    The role maps one to one. Text content is one ``TextBlock`` (none when the content is
    ``None``); each tool call is a ``ToolCallBlock`` whose ``tool_kwargs`` is the call's
    exact argument text; a tool result carries ``additional_kwargs["tool_call_id"]``. Zerda's
    ``metadata``, ``created_at``, ``id`` and ``name`` go in ``additional_kwargs["zerda"]``, unless
    ``lossless`` is false: then they are left out, as for messages on their way to a model
    (LlamaIndex's completion-style LLMs print ``additional_kwargs`` into the prompt). What
    :func:`from_llama_index` kept of a LlamaIndex message in ``metadata["llama_index"]`` is
    put back either way.
    """
    if not isinstance(message, Message):
        raise InvalidMessageError(
            f"to_llama_index takes a zerda.Message, got {type(message).__name__}"
        )
    saved = message.metadata.get("llama_index")
    saved = saved if isinstance(saved, Mapping) else {}
    blocks: list[Any] = [ThinkingBlock.model_validate(b) for b in saved.get("thinking", ())]
    if message.content is not None:
        blocks.append(TextBlock(text=message.content))
    blocks.extend(
        ToolCallBlock(tool_call_id=call.id, tool_name=call.name, tool_kwargs=call.arguments)
        for call in message.tool_calls
    )
    kwargs: dict[str, Any] = dict(saved.get("additional_kwargs") or {})
    if message.tool_call_id is not None:
        kwargs["tool_call_id"] = message.tool_call_id
    extra: dict[str, Any] = {}
    if message.metadata:
        extra["metadata"] = dict(message.metadata)
    if message.created_at is not None:
        extra["created_at"] = message.created_at
    if message.id is not None:
        extra["id"] = message.id
    if message.name is not None:
        extra["name"] = message.name
    if any(call.type != "function" for call in message.tool_calls):
        extra["tool_calls"] = [call.to_openai() for call in message.tool_calls]
    if extra and lossless:
        kwargs[ZERDA_KEY] = extra
    role = MessageRole(saved["role"]) if saved.get("role") == "developer" else None
    return ChatMessage(role=role or _TO_ROLE[message.role], blocks=blocks, additional_kwargs=kwargs)


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


def _openai_calls(raw: Any) -> tuple[ToolCall, ...]:
    """Calls from ``additional_kwargs["tool_calls"]`` (OpenAI objects or dicts), as older
    LlamaIndex LLM integrations recorded them."""
    if not isinstance(raw, list):
        return ()
    calls = []
    for item in raw:
        data = item.model_dump() if hasattr(item, "model_dump") else item
        if not isinstance(data, Mapping):
            raise InvalidMessageError(
                f"additional_kwargs['tool_calls'] holds a {type(item).__name__}, not a tool call"
            )
        calls.append(ToolCall.from_openai(data))
    return tuple(calls)


def _parts(message: ChatMessage) -> tuple[str | None, list[ToolCall], list[dict[str, Any]]]:
    """The message's text (``None`` without a text block), tool calls and thinking blocks."""
    texts: list[str] = []
    calls: list[ToolCall] = []
    thinking: list[dict[str, Any]] = []
    for block in message.blocks:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolCallBlock):
            calls.append(_call(block))
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.model_dump(mode="json"))
        else:
            raise InvalidMessageError(
                f"a {message.role.value} ChatMessage has a {type(block).__name__}; Zerda keeps "
                "text, tool calls and thinking only"
            )
    return ("\n".join(texts) if texts else None), calls, thinking


def from_llama_index(message: ChatMessage) -> Message:
    """A LlamaIndex ``ChatMessage`` as a Zerda :class:`~zerda.Message`; the inverse of
    :func:`to_llama_index`.

    user, assistant, system and tool messages convert (developer reads as system; chatbot and
    model, other providers' names, as assistant). Text blocks are joined with newlines, as
    ``ChatMessage.content`` joins them. Tool calls come from ``ToolCallBlock`` blocks, or,
    when there are none, from OpenAI-style ``additional_kwargs["tool_calls"]``. A tool result
    needs ``additional_kwargs["tool_call_id"]`` (or ``"call_id"``). Image, audio, video and
    document blocks raise :class:`~zerda.errors.InvalidMessageError`. Thinking blocks, other
    JSON-able ``additional_kwargs`` and a developer role are kept in
    ``metadata["llama_index"]`` and restored by :func:`to_llama_index`.
    """
    if not isinstance(message, ChatMessage):
        raise InvalidMessageError(
            f"from_llama_index takes a LlamaIndex ChatMessage, got {type(message).__name__}"
        )
    role = _FROM_ROLE.get(message.role)
    if role is None:
        raise InvalidMessageError(
            f"cannot convert a LlamaIndex {message.role.value!r} message to a Zerda message; "
            "use user, assistant, system or tool"
        )
    content, calls, thinking = _parts(message)
    kwargs = dict(message.additional_kwargs)
    extra = kwargs.pop(ZERDA_KEY, None)
    saved: Mapping[str, Any] = extra if isinstance(extra, Mapping) else {}
    tool_call_id = kwargs.pop("tool_call_id", None) or kwargs.pop("call_id", None)
    raw_calls = kwargs.pop("tool_calls", None)
    if isinstance(saved.get("tool_calls"), list):
        calls = list(_openai_calls(saved["tool_calls"]))
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
        kept: dict[str, Any] = {}
        if thinking:
            kept["thinking"] = thinking
        rest = json_or_none(kwargs)
        if rest:
            kept["additional_kwargs"] = rest
        if message.role is MessageRole.DEVELOPER:
            kept["role"] = "developer"
        metadata = {"llama_index": kept} if kept else {}
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
    starts with the pinned system messages, then a user message, converted for the model
    (``lossless=False``: no Zerda bookkeeping in ``additional_kwargs``). ``get_all()`` is the
    whole conversation, converted losslessly, so ``set(get_all())`` changes nothing.
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
