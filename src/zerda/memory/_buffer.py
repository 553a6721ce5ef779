"""ConversationBufferMemory (every turn) and ConversationBufferWindowMemory (the last k turns)."""

from __future__ import annotations

from typing import Any, ClassVar

from zerda.errors import ConfigurationError
from zerda.memory._base import _DEFAULT_SESSION, BaseMemory, Tools, _View
from zerda.memory._stats import MemoryStats, WindowMemoryStats
from zerda.policies import window_start
from zerda.stores._base import AsyncStore, Store, Tail

__all__ = ["ConversationBufferMemory", "ConversationBufferWindowMemory"]


class ConversationBufferMemory(BaseMemory[MemoryStats]):
    """Keeps the whole conversation: every turn goes into the context.

    For short conversations or when you want the full, unabridged history; for anything
    long-running prefer :class:`ConversationBufferWindowMemory` (or a token budget).
    """

    _type_name: ClassVar[str] = "ConversationBufferMemory"

    def _fit(self, tail: Tail, tools: Tools | None = None) -> _View:
        tail, repairs = self._repaired(tail)
        return self._checked(_View(tail, 0, len(tail.turn_starts), repairs=repairs))


class ConversationBufferWindowMemory(BaseMemory[WindowMemoryStats]):
    """Keeps the last ``k`` whole turns in the context (a turn: a user message and all that
    answers it, tool calls and results included). The store keeps every turn; the window is a
    view. Pinned system messages do not count toward ``k``.
    """

    _type_name: ClassVar[str] = "ConversationBufferWindowMemory"

    def __init__(
        self,
        k: int = 5,
        *,
        return_messages: bool = False,
        input_key: str = "input",
        output_key: str = "output",
        memory_key: str = "history",
        human_prefix: str = "user",
        ai_prefix: str = "assistant",
        store: Store | AsyncStore | None = None,
        session_id: str = _DEFAULT_SESSION,
        strict: bool = False,
    ) -> None:
        if isinstance(k, bool) or not isinstance(k, int) or k <= 0:
            raise ConfigurationError(f"k must be a positive integer, got {k!r}")
        super().__init__(
            return_messages=return_messages,
            input_key=input_key,
            output_key=output_key,
            memory_key=memory_key,
            human_prefix=human_prefix,
            ai_prefix=ai_prefix,
            store=store,
            session_id=session_id,
            strict=strict,
        )
        self.k = k

    def _turns_to_read(self) -> int | None:
        return self.k

    def _fit(self, tail: Tail, tools: Tools | None = None) -> _View:
        tail, repairs = self._repaired(tail)
        start = window_start(tail.turn_starts, len(tail.messages), self.k)
        view = _View(tail, start, min(self.k, len(tail.turn_starts)), repairs=repairs)
        return self._checked(view)

    def _extra_stats(self, view: _View) -> dict[str, Any]:
        return {"window_size": self.k, "is_full": view.tail.total_turns >= self.k}

    def get_window_info(self) -> dict[str, Any]:
        """Window fill: ``current_size``, ``max_size``, ``available_slots``, ``is_full``."""
        return self._window_info(self._run(self._totals_flow()).total_turns)

    async def aget_window_info(self) -> dict[str, Any]:
        return self._window_info((await self._arun(self._totals_flow())).total_turns)

    def _window_info(self, total_turns: int) -> dict[str, Any]:
        size = min(total_turns, self.k)
        return {
            "current_size": size,
            "max_size": self.k,
            "available_slots": self.k - size,
            "is_full": size >= self.k,
        }
