"""Zerda: conversation memory for LLM applications.

Record what was said (user, assistant, tool calls and results, system prompts) and hand the
model exactly the context it should see::

    from zerda.memory import ConversationBufferWindowMemory

    memory = ConversationBufferWindowMemory(k=5)
    memory.add_message({"role": "user", "content": "Hi"})
    memory.add_message({"role": "assistant", "content": "Hello!"})
    messages = zerda.to_openai(memory.get_context())
"""

from __future__ import annotations

from zerda.errors import (
    ChatError,
    ConfigurationError,
    ContextOverflowError,
    CorruptDataError,
    InvalidMessageError,
    InvalidSessionIdError,
    MessageNotFoundError,
    ModelError,
    SessionExistsError,
    StoreUnavailableError,
    SummarizerError,
    ToolLoopError,
    ZerdaError,
    ZerdaWarning,
)
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationSummaryMemory,
    ConversationTokenBufferMemory,
)
from zerda.messages import Message, Role, ToolCall, Turn, from_openai, group_turns, to_openai
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart
from zerda.tokens import ApproxCounter, TiktokenCounter, TokenCounter

__version__ = "0.1.0"

__all__ = [
    "ApproxCounter",
    "AudioPart",
    "BaseMemory",
    "ChatError",
    "ConfigurationError",
    "ContextOverflowError",
    "ConversationBufferMemory",
    "ConversationBufferWindowMemory",
    "ConversationSummaryBufferMemory",
    "ConversationSummaryMemory",
    "ConversationTokenBufferMemory",
    "CorruptDataError",
    "FilePart",
    "ImagePart",
    "InvalidMessageError",
    "InvalidSessionIdError",
    "Message",
    "MessageNotFoundError",
    "ModelError",
    "ReasoningPart",
    "Role",
    "SessionExistsError",
    "StoreUnavailableError",
    "SummarizerError",
    "TextPart",
    "TiktokenCounter",
    "TokenCounter",
    "ToolCall",
    "ToolLoopError",
    "Turn",
    "ZerdaError",
    "ZerdaWarning",
    "__version__",
    "from_openai",
    "group_turns",
    "to_openai",
]
