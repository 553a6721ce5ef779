"""The memories adapters write through (given, or a buffer memory over the store given) and
choose a model's input with."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from zerda.errors import ConfigurationError
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
)
from zerda.policies import Overflow
from zerda.stores import AsyncStore, Store
from zerda.tokens import TokenCounterLike


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


def selecting_memory(
    owner: str,
    *,
    k: int | None,
    token_limit: int | None,
    counter: TokenCounterLike | None,
    reserve_tokens: int,
    overflow: Overflow,
    strict: bool,
) -> Callable[[Store], BaseMemory[Any]]:
    """How an adapter that shapes a framework's model input builds the memory that chooses it,
    over a store of the turns given: the last ``k`` turns, the newest whole turns within
    ``token_limit`` tokens (less ``reserve_tokens``, counted by ``counter``), or neither, every
    turn; repaired alike. The arguments are checked now (``owner`` names the adapter in the
    errors), and the counter resolved once, not at every selection."""
    if k is not None and token_limit is not None:
        raise ConfigurationError(f"{owner} takes k or token_limit, not both")
    if token_limit is None and (counter is not None or reserve_tokens):
        raise ConfigurationError(
            "counter and reserve_tokens are for token_limit: give token_limit too"
        )
    if overflow not in ("raise", "truncate"):
        raise ConfigurationError(f"overflow must be 'raise' or 'truncate', got {overflow!r}")
    if token_limit is not None:
        limit = token_limit
        counted = ConversationTokenBufferMemory(
            limit, token_counter=counter, reserve_tokens=reserve_tokens, overflow=overflow
        ).token_counter
        return lambda store: ConversationTokenBufferMemory(
            limit,
            token_counter=counted,
            reserve_tokens=reserve_tokens,
            overflow=overflow,
            store=store,
            strict=strict,
        )
    if k is not None:
        window = k
        ConversationBufferWindowMemory(k=window)
        return lambda store: ConversationBufferWindowMemory(k=window, store=store, strict=strict)
    return lambda store: ConversationBufferMemory(store=store, strict=strict)
