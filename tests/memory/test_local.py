"""The memory contract over the stores that need no server: in memory, SQLite and JSON."""

from __future__ import annotations

from typing import Any

from memory.contract import AsyncMemoryContract, MemoryContract, Recipe
from zerda.stores import AsyncSQLiteStore, InMemoryStore, JSONFileStore, SQLiteStore


class TestInMemory(MemoryContract):
    def make_store(self) -> Any:
        if not hasattr(self, "_store"):
            self._store = InMemoryStore()
        return self._store


class TestInMemoryAsync(AsyncMemoryContract):
    def make_store(self) -> Any:
        if not hasattr(self, "_store"):
            self._store = InMemoryStore()
        return self._store


class TestSQLite(MemoryContract):
    supports_processes = True

    def make_store(self) -> Any:
        return SQLiteStore(self.tmp_path / "memory.db")

    def store_recipe(self) -> Recipe:
        return "zerda.stores:SQLiteStore", {"path": str(self.tmp_path / "memory.db")}


class TestSQLiteAsync(AsyncMemoryContract):
    supports_processes = True

    def make_store(self) -> Any:
        return AsyncSQLiteStore(self.tmp_path / "memory.db")

    def store_recipe(self) -> Recipe:
        return "zerda.stores:AsyncSQLiteStore", {"path": str(self.tmp_path / "memory.db")}


class TestJSONFile(MemoryContract):
    supports_processes = True

    def make_store(self) -> Any:
        return JSONFileStore(self.tmp_path / "memory.json")

    def store_recipe(self) -> Recipe:
        return "zerda.stores:JSONFileStore", {"path": str(self.tmp_path / "memory.json")}
