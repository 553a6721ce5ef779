"""The memory classes users construct: the public API of Zerda."""

from __future__ import annotations

from zerda.memory._base import BaseMemory, MessageLike, Tools
from zerda.memory._buffer import ConversationBufferMemory, ConversationBufferWindowMemory
from zerda.memory._inspect import (
    Fate,
    Inspection,
    MessageAccount,
    PartTokens,
    Repair,
    TurnAccount,
)
from zerda.memory._stats import (
    MemoryStats,
    RepairCounts,
    SummaryMemoryStats,
    TokenMemoryStats,
    TokensByPart,
    WindowMemoryStats,
)
from zerda.memory._summary import ConversationSummaryBufferMemory, ConversationSummaryMemory
from zerda.memory._token import ConversationTokenBufferMemory

__all__ = [
    "BaseMemory",
    "ConversationBufferMemory",
    "ConversationBufferWindowMemory",
    "ConversationSummaryBufferMemory",
    "ConversationSummaryMemory",
    "ConversationTokenBufferMemory",
    "Fate",
    "Inspection",
    "MemoryStats",
    "MessageAccount",
    "MessageLike",
    "PartTokens",
    "Repair",
    "RepairCounts",
    "SummaryMemoryStats",
    "TokenMemoryStats",
    "TokensByPart",
    "Tools",
    "TurnAccount",
    "WindowMemoryStats",
]
