"""The memory an adapter writes through: given, or a buffer memory over the store given."""

from __future__ import annotations

from typing import Any

from zerda.errors import ConfigurationError
from zerda.memory import BaseMemory, ConversationBufferMemory
from zerda.stores import AsyncStore, Store


def memory_on(
    owner: str,
    session_id: str,
    store: Store | AsyncStore | None,
    memory: BaseMemory[Any] | None,
) -> BaseMemory[Any]:
    """``memory``, checked to be a Zerda memory on ``session_id`` given without ``store``; or,
    without it, a :class:`~zerda.memory.ConversationBufferMemory` on ``session_id`` over
    ``store`` (a new in-memory store when ``None``). ``owner`` names the adapter in errors."""
    if memory is None:
        return ConversationBufferMemory(store=store, session_id=session_id)
    if not isinstance(memory, BaseMemory):
        raise ConfigurationError(
            f"{owner} takes a Zerda memory (memory=...), got {type(memory).__name__}"
        )
    if store is not None:
        raise ConfigurationError(
            f"{owner} takes store= or memory=, not both: the memory's store holds the session"
        )
    if memory.session_id != session_id:
        raise ConfigurationError(
            f"the memory is on session {memory.session_id!r}, not {session_id!r}: build it "
            f"with session_id={session_id!r}"
        )
    return memory
