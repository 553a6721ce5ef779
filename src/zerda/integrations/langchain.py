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
Zerda messages: ``from_langchain(to_langchain(m)) == m``. Content parts are LangChain's
standard content blocks; a developer message is a ``SystemMessage`` marked as langchain-openai
marks one. Zerda's ``metadata``, ``created_at`` and ``id`` (and tool calls, and parts, that
LangChain's fields would not give back exactly) travel in ``additional_kwargs["zerda"]``, which
chat model integrations do not send to the model. The history leaves that key out unless built
with ``include_zerda_fields=True``: the messages it gives back are ``==`` to those added (what
LangChain's fields held is kept in ``metadata["langchain"]``).

``ZerdaMiddleware(memory)`` is LangChain 1.x agent middleware for ``create_agent(...,
middleware=[...])``: the model is sent the memory's context, and the thread is kept in the
memory's store. It needs ``langchain`` 1.x (``pip install 'zerda-memory[langchain-agents]'``),
which this module imports only when the name is first used.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from zerda.errors import ConfigurationError
from zerda.memory import BaseMemory

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import BaseMessage
except ImportError as exc:  # pragma: no cover - exercised only without langchain-core
    raise ImportError(
        "zerda.integrations.langchain needs langchain-core: pip install 'zerda-memory[langchain]'"
    ) from exc

from zerda.integrations._langchain_messages import (
    ZERDA_KEY,
    from_langchain,
    from_langchain_messages,
    to_langchain,
    to_langchain_messages,
)

if TYPE_CHECKING:
    from zerda.integrations._langchain_agents import ZerdaMiddleware

__all__ = [
    "ZERDA_KEY",
    "ZerdaChatMessageHistory",
    "ZerdaMiddleware",
    "from_langchain",
    "from_langchain_messages",
    "to_langchain",
    "to_langchain_messages",
]


def __getattr__(name: str) -> Any:
    """``ZerdaMiddleware``, imported on first use: it needs ``langchain`` 1.x, which the rest
    of this module does not."""
    if name != "ZerdaMiddleware":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from zerda.integrations._langchain_agents import ZerdaMiddleware

    globals()[name] = ZerdaMiddleware
    return ZerdaMiddleware


# -- the chat message history --------------------------------------------------------------


class ZerdaChatMessageHistory(BaseChatMessageHistory):
    """A LangChain chat message history backed by a Zerda memory.

    ``messages`` (and ``aget_messages()``) is what the model should see: the memory's
    context, not the whole history (``memory.get_history()`` has that). A message read back
    is ``==`` to the one added, as LangChain code expects. ``add_messages`` records a batch
    atomically. The async methods call the memory's async twins, so an async store is used
    natively.

    ``include_zerda_fields=True`` adds Zerda's own fields to the messages read
    (``additional_kwargs["zerda"]``: the Zerda message ``id`` and ``created_at``, its
    ``metadata``, ...), as :func:`to_langchain` does; they are then no longer equal to the
    ones added, but adding them again (a retry) stores nothing new, since the Zerda ``id``
    comes with them.
    """

    def __init__(self, memory: BaseMemory[Any], *, include_zerda_fields: bool = False) -> None:
        if not isinstance(memory, BaseMemory):
            raise ConfigurationError(
                f"ZerdaChatMessageHistory takes a Zerda memory, got {type(memory).__name__}"
            )
        self.memory = memory
        self.include_zerda_fields = include_zerda_fields

    @property
    def session_id(self) -> str:
        return self.memory.session_id

    @property
    def messages(self) -> list[BaseMessage]:  # the context, converted on every read
        return to_langchain_messages(
            self.memory.get_context(), include_zerda_fields=self.include_zerda_fields
        )

    @messages.setter
    def messages(self, value: list[BaseMessage]) -> None:
        raise AttributeError(
            "ZerdaChatMessageHistory.messages is the memory's context and cannot be set; "
            "use add_messages() or clear()"
        )

    async def aget_messages(self) -> list[BaseMessage]:
        return to_langchain_messages(
            await self.memory.aget_context(), include_zerda_fields=self.include_zerda_fields
        )

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
