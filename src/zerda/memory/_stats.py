"""What ``get_memory_stats()`` returns, typed per memory kind (docs/memory.md explains each key).

Plain dicts at run time (``TypedDict``): ``stats["context_tokens"]`` as before, and mypy and
editors know every key and its type.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = [
    "MemoryStats",
    "RepairCounts",
    "SummaryMemoryStats",
    "TokenMemoryStats",
    "TokensByPart",
    "WindowMemoryStats",
]


class RepairCounts(TypedDict):
    """What repair did to the turns of the last context (:func:`zerda.policies.repair`)."""

    moved_results: int
    dropped_orphan_results: int
    dropped_duplicate_results: int
    dropped_unanswered_calls: int


class MemoryStats(TypedDict):
    """Every memory's stats: :class:`~zerda.memory.ConversationBufferMemory` gives these."""

    type: str
    repairs: RepairCounts
    message_count: int  # turns kept (one per save_context): the seed API's name
    total_messages: int
    total_characters: int
    estimated_tokens: int
    stored_turns: int
    stored_messages: int
    # Where each stored turn is: turns_in_context + turns_evicted (+ turns_summarized +
    # turns_pending, summary memories) == stored_turns.
    turns_in_context: int
    turns_evicted: int


class WindowMemoryStats(MemoryStats):
    """:class:`~zerda.memory.ConversationBufferWindowMemory`: also the window's size and fill."""

    window_size: int
    is_full: bool


class TokensByPart(TypedDict):
    """Where the context's tokens go; with the reply priming they add up to ``context_tokens``."""

    system: int
    summary: int
    tools: int
    turns: int


class TokenMemoryStats(MemoryStats):
    """:class:`~zerda.memory.ConversationTokenBufferMemory`: the budget and how it is spent."""

    token_limit: int
    reserve_tokens: int
    context_tokens: int
    tokens_by_part: TokensByPart
    budget_used: float
    truncated: bool
    truncated_tokens: int
    overflow: str | None


class SummaryMemoryStats(TokenMemoryStats):
    """The summary memories: also the summary's size, reach and health."""

    summary_tokens: int
    turns_summarized: int
    turns_pending: int
    last_summarized_at: float | None
    summary_prompt_tokens: int | None
    summary_completion_tokens: int | None
    summary_failures: int
    summary_error: str | None
