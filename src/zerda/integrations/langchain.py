"""LangChain integration: a chat message history over any Zerda memory, and message conversion.

``ZerdaChatMessageHistory(memory)`` is a LangChain ``BaseChatMessageHistory``: ``.messages``
is the memory's context (window, token budget or summary applied), added messages are
recorded as one batch, and the async methods are native over the memory's async twins. Use it
with ``RunnableWithMessageHistory`` through a ``get_session_history`` factory::

    def get_session_history(session_id: str) -> ZerdaChatMessageHistory:
        return ZerdaChatMessageHistory(
            ConversationBufferWindowMemory(k=5, store=store, session_id=session_id)
        )

:func:`to_langchain` and :func:`from_langchain` convert single messages, losslessly for
Zerda messages: ``from_langchain(to_langchain(m)) == m``. Zerda's ``metadata`` and
``created_at``, ``id`` (and tool-call arguments that would not survive a JSON round trip) travel in
``additional_kwargs["zerda"]``, which chat model integrations do not send to the model.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from zerda.errors import ConfigurationError, InvalidMessageError
from zerda.integrations._json import json_or_none
from zerda.memory import BaseMemory
from zerda.messages import Message, Role, ToolCall

try:
    from langchain_core.chat_history import BaseChatMessageHistory
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
except ImportError as exc:  # pragma: no cover - exercised only without langchain-core
    raise ImportError(
        "zerda.integrations.langchain needs langchain-core: pip install 'zerda-memory[langchain]'"
    ) from exc

__all__ = [
    "ZERDA_KEY",
    "ZerdaChatMessageHistory",
    "from_langchain",
    "from_langchain_messages",
    "to_langchain",
    "to_langchain_messages",
]

ZERDA_KEY = "zerda"
"""The ``additional_kwargs`` key under which :func:`to_langchain` keeps what LangChain's
message fields cannot hold."""

# -- Zerda -> LangChain --------------------------------------------------------------------


def _parsed_args(call: ToolCall) -> dict[str, Any] | None:
    """The call's arguments as a dict, or ``None`` when the text is not a JSON object."""
    try:
        parsed = json.loads(call.arguments)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) else None


def _exact(call: ToolCall, args: dict[str, Any] | None) -> bool:
    """Whether ``from_langchain`` rebuilds this call's arguments text exactly from ``args``."""
    return call.type == "function" and args is not None and json.dumps(args) == call.arguments


def to_langchain(message: Message) -> BaseMessage:
    """A Zerda :class:`~zerda.Message` as the matching LangChain message.

    user -> ``HumanMessage``, assistant -> ``AIMessage`` (tool calls as ``tool_calls``, with
    ``args`` parsed from the JSON text; a call whose text is not a JSON object goes to
    ``invalid_tool_calls``), tool -> ``ToolMessage``, system -> ``SystemMessage``. ``name`` is
    kept; ``metadata``, ``created_at``, ``id`` and anything else needed to rebuild the message
    exactly go in ``additional_kwargs["zerda"]``.
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
    fields: dict[str, Any] = {"content": "" if message.content is None else message.content}
    if message.content is None:
        extra["content_none"] = True
    if message.name is not None:
        fields["name"] = message.name
    saved = message.metadata.get("langchain")
    if isinstance(saved, Mapping):  # what from_langchain kept of a LangChain message
        if isinstance(saved.get("id"), str):
            fields["id"] = saved["id"]
        if isinstance(saved.get("response_metadata"), dict):
            fields["response_metadata"] = dict(saved["response_metadata"])
        if message.role is Role.TOOL and saved.get("status") in ("success", "error"):
            fields["status"] = saved["status"]
    if extra:
        fields["additional_kwargs"] = {ZERDA_KEY: extra}

    if message.role is Role.USER:
        return HumanMessage(**fields)
    if message.role is Role.SYSTEM:
        return SystemMessage(**fields)
    if message.role is Role.TOOL:
        return ToolMessage(tool_call_id=message.tool_call_id, **fields)
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
        extra["tool_calls"] = [call.to_openai() for call in message.tool_calls]
        fields["additional_kwargs"] = {ZERDA_KEY: extra}
    return AIMessage(tool_calls=tool_calls, invalid_tool_calls=invalid, **fields)


def to_langchain_messages(messages: Iterable[Message]) -> list[BaseMessage]:
    """:func:`to_langchain` over a list (e.g. ``memory.get_context()``)."""
    return [to_langchain(m) for m in messages]


# -- LangChain -> Zerda --------------------------------------------------------------------


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        return content
    parts: list[str] = []
    for part in content:
        if isinstance(part, str):
            parts.append(part)
        elif isinstance(part, Mapping) and part.get("type") == "text":
            parts.append(str(part.get("text", "")))
        elif (
            isinstance(message, AIMessage)
            and isinstance(part, Mapping)
            and part.get("type") in ("tool_use", "tool_call")
        ):
            continue  # the call itself is in message.tool_calls
        else:
            kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
            raise InvalidMessageError(
                f"{type(message).__name__} has a {kind!r} content part; Zerda keeps text only "
                "(text parts are joined)"
            )
    return "".join(parts)


_CHAT_ROLES = {
    "user": Role.USER,
    "human": Role.USER,
    "assistant": Role.ASSISTANT,
    "ai": Role.ASSISTANT,
    "system": Role.SYSTEM,
}


def _role_of(message: BaseMessage) -> Role:
    if isinstance(message, HumanMessage):
        return Role.USER
    if isinstance(message, AIMessage):
        return Role.ASSISTANT
    if isinstance(message, SystemMessage):
        return Role.SYSTEM
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
    """LangChain fields Zerda has no place for, kept in ``metadata["langchain"]``."""
    kept: dict[str, Any] = {}
    if message.id is not None:
        kept["id"] = message.id
    if message.response_metadata:
        kept["response_metadata"] = json_or_none(message.response_metadata)
    usage = getattr(message, "usage_metadata", None)
    if usage:
        kept["usage_metadata"] = json_or_none(dict(usage))
    if isinstance(message, ToolMessage) and message.status != "success":
        kept["status"] = message.status
    return {k: v for k, v in kept.items() if v is not None}


def _calls(message: AIMessage, saved: Any) -> tuple[ToolCall, ...]:
    ids = [c.get("id") for c in message.tool_calls] + [
        c.get("id") for c in message.invalid_tool_calls
    ]
    if isinstance(saved, list):
        calls = tuple(ToolCall.from_openai(c) for c in saved)
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
    and ``SystemMessage`` convert, as does a ``ChatMessage`` whose role is user, assistant or
    system. A content list is joined from its text parts (an ``AIMessage``'s ``tool_use``
    parts are skipped: the calls are in ``tool_calls``); any other part, and any other message
    type, raises :class:`~zerda.errors.InvalidMessageError`. LangChain's ``id``,
    ``response_metadata``, ``usage_metadata`` and a tool message's error ``status`` are kept in
    ``metadata["langchain"]`` (:func:`to_langchain` puts back all but ``usage_metadata``).
    """
    if not isinstance(message, BaseMessage):
        raise InvalidMessageError(
            f"from_langchain takes a LangChain BaseMessage, got {type(message).__name__}"
        )
    role = _role_of(message)
    extra = message.additional_kwargs.get(ZERDA_KEY)
    saved: Mapping[str, Any] = extra if isinstance(extra, Mapping) else {}
    if "metadata" in saved or "created_at" in saved or "id" in saved:
        metadata: Mapping[str, Any] = saved.get("metadata") or {}
    else:
        lc = _langchain_metadata(message)
        metadata = {"langchain": lc} if lc else {}
    content: str | None = _text(message)
    tool_calls: tuple[ToolCall, ...] = ()
    if isinstance(message, AIMessage):
        tool_calls = _calls(message, saved.get("tool_calls"))
        if saved.get("content_none") and tool_calls and content == "":
            content = None
    return Message(
        role=role,
        content=content,
        name=message.name,
        tool_calls=tool_calls,
        tool_call_id=message.tool_call_id if isinstance(message, ToolMessage) else None,
        metadata=metadata,
        created_at=saved.get("created_at"),
        id=saved.get("id"),
    )


def from_langchain_messages(messages: Iterable[BaseMessage]) -> list[Message]:
    """:func:`from_langchain` over a list."""
    return [from_langchain(m) for m in messages]


# -- the chat message history --------------------------------------------------------------


class ZerdaChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat message history backed by a Zerda memory.

    ``messages`` (and ``aget_messages()``) is what the model should see: the memory's
    context, not the whole history (``memory.get_history()`` has that). ``add_messages``
    records a batch atomically. The async methods call the memory's async twins, so an async
    store is used natively.
    """

    def __init__(self, memory: BaseMemory) -> None:
        if not isinstance(memory, BaseMemory):
            raise ConfigurationError(
                f"ZerdaChatMessageHistory takes a Zerda memory, got {type(memory).__name__}"
            )
        self.memory = memory

    @property
    def session_id(self) -> str:
        return self.memory.session_id

    @property
    def messages(self) -> list[BaseMessage]:  # the context, converted on every read
        return to_langchain_messages(self.memory.get_context())

    @messages.setter
    def messages(self, value: list[BaseMessage]) -> None:
        raise AttributeError(
            "ZerdaChatMessageHistory.messages is the memory's context and cannot be set; "
            "use add_messages() or clear()"
        )

    async def aget_messages(self) -> list[BaseMessage]:
        return to_langchain_messages(await self.memory.aget_context())

    def add_message(self, message: BaseMessage) -> None:
        self.add_messages([message])

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.memory.add_messages(from_langchain_messages(messages))

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await self.memory.aadd_messages(from_langchain_messages(messages))

    def clear(self) -> None:
        self.memory.clear()

    async def aclear(self) -> None:
        await self.memory.aclear()

    def __repr__(self) -> str:
        return (
            f"ZerdaChatMessageHistory({type(self.memory).__name__}, session_id={self.session_id!r})"
        )
