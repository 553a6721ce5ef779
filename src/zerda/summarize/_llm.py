"""LLMSummarizer: a summary written by a model behind any OpenAI-compatible endpoint."""

from __future__ import annotations

import asyncio
import math
import os
import string
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from zerda.errors import ConfigurationError, SummarizerError
from zerda.messages import Message
from zerda.summarize._base import SummaryResult, check_inputs, render_messages

if TYPE_CHECKING:
    import openai

__all__ = [
    "DEFAULT_MAX_RETRIES",
    "DEFAULT_PROMPT",
    "DEFAULT_TIMEOUT",
    "LLMSummarizer",
    "check_max_retries",
    "check_timeout",
]

DEFAULT_PROMPT = """\
Progressively summarize a conversation: fold the new lines into the current summary and \
reply with the new summary only.

Keep exactly as written: names of people, places, products and tools; numbers, ids, \
amounts, dates and times; the decisions made; the questions, requests and tasks still open. \
Leave out greetings, small talk and repetition. Write plain, short sentences in the third \
person. If the current summary is empty, start one.

Current summary:
{summary}

New lines of conversation:
{new_lines}

New summary:"""

# Seconds for one request and retries after the first try. The SDK's own defaults (600 s, 2)
# would let one summary hold a memory's caller for up to half an hour.
DEFAULT_TIMEOUT = 60.0
DEFAULT_MAX_RETRIES = 2

_VARIABLES = ("summary", "new_lines")
_INSTALL_HINT = "pip install 'zerda-memory[openai]'"


def _check_prompt(prompt: object) -> str:
    if not isinstance(prompt, str):
        raise ConfigurationError(f"prompt must be a str template, got {type(prompt).__name__}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(prompt) if f is not None]
    except ValueError as exc:  # a lone "{" or "}"
        raise ConfigurationError(
            f"prompt is not a valid template ({exc}); write a literal brace as {{{{ or }}}}"
        ) from exc
    unknown = sorted({f for f in fields if f not in _VARIABLES})
    if unknown:
        raise ConfigurationError(
            f"prompt uses unknown variables {unknown}; the variables are {{summary}} and "
            "{new_lines} (write a literal brace as {{ or }})"
        )
    missing = [v for v in _VARIABLES if v not in fields]
    if missing:
        raise ConfigurationError(
            "prompt must use {summary} and {new_lines}; it lacks "
            + " and ".join("{" + v + "}" for v in missing)
        )
    return prompt


def check_timeout(timeout: object) -> float:
    """Seconds a request may take (``None``: :data:`DEFAULT_TIMEOUT`), checked."""
    if timeout is None:
        return DEFAULT_TIMEOUT
    if (
        isinstance(timeout, bool)
        or not isinstance(timeout, (int, float))
        or not 0 < timeout < math.inf
    ):
        raise ConfigurationError(f"timeout must be seconds > 0, got {timeout!r}")
    return float(timeout)


def check_max_retries(max_retries: object) -> int:
    """Retries after a request's first try (``None``: :data:`DEFAULT_MAX_RETRIES`), checked."""
    if max_retries is None:
        return DEFAULT_MAX_RETRIES
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise ConfigurationError(f"max_retries must be an integer >= 0, got {max_retries!r}")
    return max_retries


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ConfigurationError(
            f"LLMSummarizer needs the openai package ({_INSTALL_HINT}), or pass client=, "
            "a function str -> str that calls your model"
        ) from exc
    return openai


class LLMSummarizer:
    """Summaries written by a model through the Chat Completions API.

    The filled ``prompt`` goes to the model as one user message and the reply's text is the new
    summary. ``prompt`` is a template with the variables ``{summary}`` (the previous summary,
    ``""`` at first) and ``{new_lines}`` (the messages to fold in, as :func:`render_messages`
    writes them); a literal brace is written ``{{`` or ``}}``.

    With no ``client``, the official ``openai`` SDK talks to ``base_url`` (default: the SDK's,
    ``OPENAI_BASE_URL`` or OpenAI's) with ``api_key`` (default: ``OPENAI_API_KEY``); each request
    may take ``timeout`` seconds and failed ones (timeouts, connection errors, 408, 409, 429,
    5xx) are retried up to ``max_retries`` times by the SDK, with its backoff. A missing key is
    a :class:`~zerda.ConfigurationError` here, at construction, not a summarizer failure later.

    ``client`` may instead be any function ``str -> str``: it gets the filled prompt and returns
    the summary. It owns its timeouts and retries, so ``base_url``, ``api_key``, ``timeout`` and
    ``max_retries`` cannot be given with it; ``model`` is then only the name that stats report.

    Any failure (HTTP error after the retries, timeout, a reply with no text, an exception from
    ``client``) raises :class:`~zerda.SummarizerError` with the cause chained.
    """

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        client: Callable[[str], str] | None = None,
        prompt: str = DEFAULT_PROMPT,
        timeout: float | None = None,
        max_retries: int | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"model must be a non-empty string, got {model!r}")
        self.model = model
        self.prompt = _check_prompt(prompt)
        self.base_url = base_url
        self.timeout: float | None = None  # None with a client function
        self.max_retries: int | None = None
        self._function: Callable[[str], str] | None = None
        self._sync: openai.OpenAI | None = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI]
        self._async = weakref.WeakKeyDictionary()
        self._lock = threading.Lock()
        if client is not None:
            if not callable(client):
                raise ConfigurationError(
                    f"client must be a function str -> str, got {type(client).__name__}"
                )
            given = [
                name
                for name, value in (
                    ("base_url", base_url),
                    ("api_key", api_key),
                    ("timeout", timeout),
                    ("max_retries", max_retries),
                )
                if value is not None
            ]
            if given:
                raise ConfigurationError(
                    f"{', '.join(given)} configure the openai SDK and cannot be given with "
                    "client=; the client function handles its own endpoint, timeouts and retries"
                )
            self._function = client
            return
        self.timeout = check_timeout(timeout)
        self.max_retries = check_max_retries(max_retries)
        if base_url is not None and (not isinstance(base_url, str) or not base_url):
            raise ConfigurationError(f"base_url must be a non-empty string, got {base_url!r}")
        key = api_key if api_key is not None else os.environ.get("OPENAI_API_KEY")
        if not key:
            raise ConfigurationError(
                "LLMSummarizer has no API key: pass api_key=... or set OPENAI_API_KEY (a local "
                "server that checks no key still needs one: any non-empty string), or pass "
                "client=, a function str -> str; ExtractiveSummarizer needs no key at all"
            )
        self._key = key
        self._openai = _import_openai()
        self._sync = self._openai.OpenAI(**self._client_options())

    def _client_options(self) -> dict[str, Any]:
        return {
            "api_key": self._key,
            "base_url": self.base_url,
            "timeout": self.timeout,
            "max_retries": self.max_retries,
        }

    def __repr__(self) -> str:
        where = "client=" + getattr(self._function, "__qualname__", "function")
        if self._function is None:
            where = f"base_url={self.base_url!r}"
        return f"LLMSummarizer(model={self.model!r}, {where})"

    # -- the shared, I/O-free part ---------------------------------------------------------------

    def format_prompt(self, previous_summary: str, messages: Sequence[Message]) -> str:
        """The prompt sent for these inputs: the template with both variables filled in."""
        batch = check_inputs(previous_summary, messages)
        return self.prompt.format(summary=previous_summary, new_lines=render_messages(batch))

    def _request(self, prompt: str) -> dict[str, Any]:
        return {"model": self.model, "messages": [{"role": "user", "content": prompt}]}

    def _failure(self, exc: Exception) -> SummarizerError:
        if self._function is not None:
            return SummarizerError(
                f"summarizer model {self.model!r}: the client function failed: "
                f"{type(exc).__name__}: {str(exc)[:300]}"
            )
        what = f"{type(exc).__name__}: {str(exc)[:300]}"
        if isinstance(exc, self._openai.APITimeoutError):
            what = (
                f"timed out (timeout={self.timeout:g}s a request, max_retries={self.max_retries})"
            )
        where = self.base_url or "the default endpoint"
        return SummarizerError(f"summarizer model {self.model!r} at {where} failed: {what}")

    def _from_function(self, text: object, started: float) -> SummaryResult:
        if not isinstance(text, str):
            raise SummarizerError(
                f"the client function returned {type(text).__name__}, expected the summary as a str"
            )
        return SummaryResult(
            self._nonempty(text.strip()), model=self.model, seconds=time.perf_counter() - started
        )

    def _from_completion(self, completion: Any, started: float) -> SummaryResult:
        """The summary in a Chat Completions reply, or SummarizerError saying what is wrong."""
        choices = getattr(completion, "choices", None)
        if not choices:
            raise SummarizerError(
                f"summarizer model {self.model!r}: the reply has no choices ({completion!r:.200})"
            )
        content = getattr(getattr(choices[0], "message", None), "content", None)
        if not isinstance(content, str):
            raise SummarizerError(
                f"summarizer model {self.model!r}: the reply's first choice has no text content"
            )
        usage = getattr(completion, "usage", None)
        model = getattr(completion, "model", None)
        return SummaryResult(
            self._nonempty(content.strip()),
            prompt_tokens=_count(getattr(usage, "prompt_tokens", None)),
            completion_tokens=_count(getattr(usage, "completion_tokens", None)),
            model=model if isinstance(model, str) and model else self.model,
            seconds=time.perf_counter() - started,
        )

    def _nonempty(self, text: str) -> str:
        if not text:
            raise SummarizerError(f"summarizer model {self.model!r} returned an empty summary")
        return text

    # -- I/O -------------------------------------------------------------------------------------

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize_with_stats(previous_summary, messages).text

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return (await self.asummarize_with_stats(previous_summary, messages)).text

    def summarize_with_stats(
        self, previous_summary: str, messages: Sequence[Message]
    ) -> SummaryResult:
        """Like :meth:`summarize`, with the tokens the API reported, the model and the time.

        With no messages there is nothing to fold in: the previous summary comes back and no
        request is made.
        """
        prompt = self.format_prompt(previous_summary, messages)
        if not messages:
            return SummaryResult(previous_summary, 0, 0, self.model)
        started = time.perf_counter()
        if self._function is not None:
            try:
                text = self._function(prompt)
            except Exception as exc:
                raise self._failure(exc) from exc
            return self._from_function(text, started)
        assert self._sync is not None
        try:
            completion = self._sync.chat.completions.create(**self._request(prompt))
        except Exception as exc:
            raise self._failure(exc) from exc
        return self._from_completion(completion, started)

    async def asummarize_with_stats(
        self, previous_summary: str, messages: Sequence[Message]
    ) -> SummaryResult:
        """The async twin of :meth:`summarize_with_stats`, on ``openai.AsyncOpenAI``.

        A ``client`` function is blocking, so it runs in a worker thread.
        """
        prompt = self.format_prompt(previous_summary, messages)
        if not messages:
            return SummaryResult(previous_summary, 0, 0, self.model)
        started = time.perf_counter()
        if self._function is not None:
            try:
                text = await asyncio.to_thread(self._function, prompt)
            except Exception as exc:
                raise self._failure(exc) from exc
            return self._from_function(text, started)
        client = self._async_client()
        try:
            completion = await client.chat.completions.create(**self._request(prompt))
        except Exception as exc:
            raise self._failure(exc) from exc
        return self._from_completion(completion, started)

    def _async_client(self) -> openai.AsyncOpenAI:
        # One client per event loop: an async HTTP connection pool belongs to the loop that
        # opened its connections, and callers may run several loops (asyncio.run per request).
        loop = asyncio.get_running_loop()
        with self._lock:
            client = self._async.get(loop)
            if client is None:
                client = self._openai.AsyncOpenAI(**self._client_options())
                self._async[loop] = client
            return client


def _count(value: object) -> int | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return None
    return value
