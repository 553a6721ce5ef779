"""Zerda's exceptions and warnings: one root, ``ZerdaError``, and one subclass per kind of failure.

The hierarchy::

    ZerdaError
    ├── ConfigurationError        a constructor or call got a bad option (also a ValueError)
    ├── InvalidMessageError       a message is malformed (also a ValueError)
    ├── InvalidSessionIdError     a session id is too long or has characters we do not accept
    ├── MessageNotFoundError      no message of the session has that id (also a KeyError)
    ├── SessionExistsError        a fork's new session already holds something (also a ValueError)
    ├── StoreUnavailableError     the store cannot be reached; the backend's error is chained
    ├── ContextOverflowError      a context cannot fit its token budget
    ├── SummarizerError           the summarizer failed or timed out
    ├── ChatError                 zerda.chat could not make a reply (or has none to retry)
    │   ├── ModelError            the model's endpoint failed: down, HTTP error, timeout
    │   └── ToolLoopError         the model still called tools after max_steps
    └── CorruptDataError          stored data cannot be decoded

    ZerdaWarning                  something was accepted but probably is not what you meant
    └── ApproximateCountWarning   the default token counter counts approximately here

Every message names the offending value and says what would be valid.
"""

from __future__ import annotations

import sys
import warnings

__all__ = [
    "ApproximateCountWarning",
    "ChatError",
    "ConfigurationError",
    "ContextOverflowError",
    "CorruptDataError",
    "InvalidMessageError",
    "InvalidSessionIdError",
    "MessageNotFoundError",
    "ModelError",
    "SessionExistsError",
    "StoreUnavailableError",
    "SummarizerError",
    "ToolLoopError",
    "ZerdaError",
    "ZerdaWarning",
]


class ZerdaError(Exception):
    """The root of every error Zerda raises on purpose."""


class ConfigurationError(ZerdaError, ValueError):
    """An option given to a constructor or a call is not valid."""


class InvalidMessageError(ZerdaError, ValueError):
    """A message (or an OpenAI dict meant as one) is malformed."""


class InvalidSessionIdError(ZerdaError, ValueError):
    """A session id is empty, too long, or has characters that are not accepted."""


class MessageNotFoundError(ZerdaError, KeyError):
    """No message of the session has the id given (to edit it, or to fork at it)."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class SessionExistsError(ZerdaError, ValueError):
    """A fork's new session already holds messages or metadata."""


class StoreUnavailableError(ZerdaError):
    """The store could not be reached; the backend's own exception is chained as ``__cause__``."""


class ContextOverflowError(ZerdaError):
    """A context cannot fit its token budget: the pinned messages and the summary leave no
    room, or the newest turn alone is larger than the budget (with ``overflow="truncate"``,
    even with its texts cut to markers).

    ``needed`` is the token count of what had to fit and ``limit`` the budget it had to fit in.
    """

    def __init__(self, message: str, *, needed: int, limit: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.limit = limit

    def __reduce__(self) -> tuple[object, ...]:
        # Keyword-only arguments do not survive the default pickling of exceptions.
        return (_rebuild_overflow, (str(self), self.needed, self.limit))


def _rebuild_overflow(message: str, needed: int, limit: int) -> ContextOverflowError:
    return ContextOverflowError(message, needed=needed, limit=limit)


class SummarizerError(ZerdaError):
    """The summarizer failed or timed out; nothing was lost, the turns wait for a later try."""


class ChatError(ZerdaError):
    """A :class:`zerda.chat.Chat` could not make a reply, or was asked to retry with no
    question waiting for an answer. What was stored stays stored, whole."""


class ModelError(ChatError):
    """The model's endpoint failed: unreachable, an HTTP error after the retries, a timeout,
    or a reply that is not a chat completion. The message names the endpoint and the model;
    ``endpoint`` and ``status`` (the HTTP status, ``None`` when there was no answer) say it
    too, and the SDK's exception is chained as ``__cause__``. The user's message stays stored
    once: :meth:`zerda.chat.Chat.retry` asks again."""

    def __init__(self, message: str, *, endpoint: str, status: int | None = None) -> None:
        super().__init__(message)
        self.endpoint = endpoint
        self.status = status

    def __reduce__(self) -> tuple[object, ...]:
        return (_rebuild_model_error, (str(self), self.endpoint, self.status))


def _rebuild_model_error(message: str, endpoint: str, status: int | None) -> ModelError:
    return ModelError(message, endpoint=endpoint, status=status)


class ToolLoopError(ChatError):
    """The model was still calling tools after ``max_steps`` requests. Every call made is
    stored with its result; :meth:`zerda.chat.Chat.retry` lets the model go on."""


class CorruptDataError(ZerdaError):
    """Stored data could not be decoded; the store is left untouched."""


class ZerdaWarning(UserWarning):
    """Zerda accepted something that is probably not what you meant (the text says what)."""


class ApproximateCountWarning(ZerdaWarning):
    """The default token counter could not load its tiktoken encoding (no network to fetch
    it, no local copy), so tokens are counted approximately; ``encoding`` names it and
    ``reason`` says why (the error's type, or the time it waited)."""

    def __init__(self, message: str, encoding: str, reason: str) -> None:
        super().__init__(message)
        self.encoding = encoding
        self.reason = reason


def warn(message: str | ZerdaWarning) -> None:
    """Emit a :class:`ZerdaWarning` (or the warning given) attributed to the first caller
    outside Zerda."""
    frame = sys._getframe(1)
    level = 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").startswith("zerda"):
        frame = frame.f_back
        level += 1
    if isinstance(message, ZerdaWarning):
        warnings.warn(message, stacklevel=level)
    else:
        warnings.warn(message, ZerdaWarning, stacklevel=level)
