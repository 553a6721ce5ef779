"""Where messages live. The in-memory store backs every memory for now; persistent backends
(SQLite, JSON file, Redis, Postgres) and the public store contract come next."""

from __future__ import annotations

__all__: list[str] = []
