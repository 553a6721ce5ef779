"""Chat with a model over any OpenAI-compatible endpoint, remembered by a Zerda memory.

::

    from zerda.chat import Chat

    chat = Chat("gpt-4o-mini", system="You are terse.")
    print(chat.send("What is the capital of France?"))
    for piece in chat.stream("And of Italy?"):
        print(piece, end="")

``zerda.chat`` is a front door (DESIGN.md §11): it imports the memories, the messages and the
summarizer's client settings below it, and the ``openai`` SDK (``pip install
'zerda-memory[openai]'``) when a :class:`Chat` is made.
"""

from __future__ import annotations

from zerda.chat._chat import Chat, ChatStats
from zerda.chat._models import DEFAULT_CONTEXT_WINDOW, context_window, default_memory
from zerda.chat._tools import Tool, schema_of, tool

__all__ = [
    "DEFAULT_CONTEXT_WINDOW",
    "Chat",
    "ChatStats",
    "Tool",
    "context_window",
    "default_memory",
    "schema_of",
    "tool",
]
