"""InMemoryStore passes the store contract, through its sync and its async protocol."""

from __future__ import annotations

from collections.abc import Callable

from stores.contract import AsyncStoreContract, StoreContract
from zerda.stores import InMemoryStore


class TestInMemoryStore(StoreContract):
    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> InMemoryStore:
        return InMemoryStore(ttl=ttl, max_messages=max_messages, clock=clock)


class TestInMemoryStoreAsync(AsyncStoreContract):
    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> InMemoryStore:
        return InMemoryStore(ttl=ttl, max_messages=max_messages, clock=clock)
