"""What Zerda knows of models by name: how many tokens a request may hold, and how to count
them. Used to size a :class:`~zerda.chat.Chat`'s default memory."""

from __future__ import annotations

from zerda.errors import ConfigurationError
from zerda.memory import ConversationTokenBufferMemory
from zerda.stores import AsyncStore, Store
from zerda.tokens import TokenCounter, TokenCounterLike, counter_by_name, default_token_counter

__all__ = ["DEFAULT_CONTEXT_WINDOW", "context_window", "default_memory", "reply_reserve"]

# Input tokens a request may hold, from the providers' model pages, by name prefix (the
# longest matching prefix wins, so "gpt-4o-mini-2024-07-18" is a "gpt-4o-mini").
_WINDOWS = {
    "gpt-5": 272_000,
    "gpt-4.1": 1_047_576,
    "gpt-4o": 128_000,
    "gpt-4-turbo": 128_000,
    "gpt-4-32k": 32_768,
    "gpt-4": 8_192,
    "gpt-3.5-turbo": 16_385,
    "chatgpt-4o": 128_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
}
DEFAULT_CONTEXT_WINDOW = 4_096
"""The budget for a model Zerda does not know: small enough for a local server's default
(Ollama and llama.cpp often run with 4,096 tokens and silently cut a longer prompt)."""


def context_window(model: str) -> int | None:
    """The input tokens ``model`` takes, when Zerda knows the model; ``None`` otherwise."""
    name = model.rsplit("/", 1)[-1]  # "openai/gpt-4o" as a router names it
    matches = [p for p in _WINDOWS if name == p or name.startswith(p + "-")]
    return _WINDOWS[max(matches, key=len)] if matches else None


def reply_reserve(window: int) -> int:
    """Tokens of the window left for the model's reply: an eighth, at most 4,096."""
    return min(4_096, window // 8)


def _counter_for(model: str) -> TokenCounter:
    """tiktoken's encoding for an OpenAI model (exact), else the default counter."""
    try:
        return counter_by_name(model)
    except ConfigurationError:
        return default_token_counter()


def default_memory(
    model: str,
    *,
    token_limit: int | None = None,
    token_counter: TokenCounterLike | None = None,
    store: Store | AsyncStore | None = None,
    session_id: str = "default",
) -> ConversationTokenBufferMemory:
    """A token buffer sized for ``model``: ``token_limit`` tokens a request (default: the
    model's window, or :data:`DEFAULT_CONTEXT_WINDOW`), of which :func:`reply_reserve` is left
    for the reply; counted by ``token_counter`` (default: the model's tiktoken encoding when
    tiktoken knows the model, else :func:`~zerda.tokens.default_token_counter`)."""
    window = token_limit if token_limit is not None else context_window(model)
    window = window or DEFAULT_CONTEXT_WINDOW
    if isinstance(window, bool) or not isinstance(window, int) or window < 2:
        raise ConfigurationError(f"token_limit must be an integer >= 2, got {token_limit!r}")
    return ConversationTokenBufferMemory(
        window,
        reserve_tokens=reply_reserve(window),
        token_counter=_counter_for(model) if token_counter is None else token_counter,
        store=store,
        session_id=session_id,
    )
