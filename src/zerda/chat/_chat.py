"""Chat: a model behind any OpenAI-compatible endpoint, its tools, and a Zerda memory.

One exchange is written once, as a generator flow (:meth:`Chat._exchange`) that yields what
it needs done (read the context, ask the model, run tools, store messages) and gets the
answers back; four small drivers do those things for :meth:`Chat.send`, :meth:`Chat.stream`
and their async twins. The flow decides what is stored, so every way in stores the same:
the user's message first, then each model step whole (an assistant message with its tool
calls goes in with all their results, in one atomic write), so a failure anywhere leaves no
half of a pair in the store.
"""

from __future__ import annotations

import asyncio
import os
import threading
import weakref
from collections.abc import AsyncIterator, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar, Union

from zerda._ids import new_message_id
from zerda.chat._models import default_memory
from zerda.chat._tools import Tool, ToolLike, as_tools, error_text
from zerda.errors import ChatError, ConfigurationError, ModelError, ToolLoopError
from zerda.memory import BaseMemory
from zerda.messages import PINNED, Message, Role, ToolCall, to_openai
from zerda.parts import Part
from zerda.summarize._llm import check_max_retries, check_timeout

if TYPE_CHECKING:
    import openai

__all__ = ["Chat", "ChatStats"]

_INSTALL_HINT = "pip install 'zerda-memory[openai]'"
# The key sent to a base_url given without one: local servers (Ollama, vLLM, llama.cpp) check
# none, but the SDK refuses to send a request with no key at all.
_NO_KEY = "zerda-no-key"


class ChatStats(TypedDict):
    """What :meth:`Chat.stats` returns: totals since the Chat was made, and the last request.

    ``prompt_tokens`` / ``completion_tokens`` / ``total_tokens`` add up what the endpoint
    reported (a server that reports no usage adds nothing); ``requests`` counts the requests
    answered, ``tool_calls`` the calls run and ``tool_errors`` those whose result is an error;
    ``last_usage`` is the usage of the last answer (``None`` before one, or when it reported
    none); ``memory`` the memory's stats for the context of the last request."""

    requests: int
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    tool_calls: int
    tool_errors: int
    last_usage: dict[str, int] | None
    memory: Mapping[str, Any] | None


# -- what the flow asks for --------------------------------------------------------------------


@dataclass(slots=True)
class _ReadContext:
    """The memory's context and its stats -> ``(list[Message], stats)``."""


@dataclass(slots=True)
class _Ask:
    """One Chat Completions request -> :class:`_Answer`."""

    request: dict[str, Any]


@dataclass(slots=True)
class _RunTools:
    """Run the calls -> their tool result messages, in the calls' order."""

    calls: tuple[ToolCall, ...]


@dataclass(slots=True)
class _Store:
    """Append the messages as one atomic batch -> ``None``."""

    messages: list[Message]


@dataclass(slots=True)
class _Edit:
    """Replace a stored message's content -> ``None``."""

    message_id: str
    content: str


_Effect = Union[_ReadContext, _Ask, _RunTools, _Store, _Edit]  # noqa: UP007 - a runtime alias
_Flow = Generator[_Effect, Any, str]
_T = TypeVar("_T")


@dataclass(slots=True)
class _Answer:
    """One model reply, from a completion or from the chunks of a stream."""

    content: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    usage: dict[str, int] | None = None
    model: str | None = None
    finish_reason: str | None = None

    def message(self) -> Message:
        """The reply as the assistant message to store, usage and model in its metadata."""
        metadata: dict[str, Any] = {}
        if self.usage is not None:
            metadata["usage"] = self.usage
        if self.model:
            metadata["model"] = self.model
        if self.finish_reason:
            metadata["finish_reason"] = self.finish_reason
        # An answer with calls may have no text (None, as OpenAI sends it); one without may not.
        content = (self.content or None) if self.tool_calls else (self.content or "")
        return Message(
            Role.ASSISTANT, content, tool_calls=tuple(self.tool_calls), metadata=metadata
        )


class _Chunks:
    """Collects a streamed reply: text pieces as they come, tool calls by index."""

    def __init__(self) -> None:
        self.answer = _Answer()
        self._text: list[str] = []
        self._calls: dict[int, list[str]] = {}  # index -> [id, name, arguments]

    def add(self, chunk: Any) -> str:
        """Take one chunk; the text it adds (``""`` for none)."""
        usage = getattr(chunk, "usage", None)
        if usage is not None:
            self.answer.usage = _usage(usage)
        if getattr(chunk, "model", None):
            self.answer.model = chunk.model
        choices = getattr(chunk, "choices", None) or ()
        if not choices:
            return ""
        choice = choices[0]
        if getattr(choice, "finish_reason", None):
            self.answer.finish_reason = choice.finish_reason
        delta = getattr(choice, "delta", None)
        for call in getattr(delta, "tool_calls", None) or ():
            slot = self._calls.setdefault(call.index or 0, ["", "", ""])
            function = getattr(call, "function", None)
            slot[0] = slot[0] or (call.id or "")
            slot[1] = slot[1] or (getattr(function, "name", None) or "")
            slot[2] += getattr(function, "arguments", None) or ""
        piece = getattr(delta, "content", None) or ""
        if piece:
            self._text.append(piece)
        return piece

    def finish(self) -> _Answer:
        self.answer.content = "".join(self._text) or None
        self.answer.tool_calls = [
            _tool_call(id_, name, arguments)
            for _, (id_, name, arguments) in sorted(self._calls.items())
        ]
        return self.answer


def _tool_call(id_: str | None, name: str | None, arguments: str | None) -> ToolCall:
    # Some local servers send calls without an id; the result must still name its call.
    return ToolCall(id_ or f"call_{new_message_id()}", name or "unnamed", arguments or "{}")


def _usage(usage: Any) -> dict[str, int] | None:
    counts = {
        key: value
        for key in ("prompt_tokens", "completion_tokens", "total_tokens")
        if isinstance(value := getattr(usage, key, None), int) and not isinstance(value, bool)
    }
    return counts or None


def _answer_of(completion: Any) -> _Answer:
    """The reply in a Chat Completions response; ``ValueError`` when it holds none."""
    choices = getattr(completion, "choices", None)
    if not choices:
        raise ValueError(f"the reply has no choices ({completion!r:.200})")
    message = getattr(choices[0], "message", None)
    if message is None:
        raise ValueError("the reply's first choice has no message")
    content = getattr(message, "content", None)
    calls = [
        _tool_call(call.id, call.function.name, call.function.arguments)
        for call in getattr(message, "tool_calls", None) or ()
        if getattr(call, "function", None) is not None
    ]
    return _Answer(
        content if isinstance(content, str) else None,
        calls,
        _usage(getattr(completion, "usage", None)),
        getattr(completion, "model", None) or None,
        getattr(choices[0], "finish_reason", None) or None,
    )


def _awaiting_reply(context: Sequence[Message]) -> bool:
    """Whether the conversation ends with something the model has not answered yet."""
    last = next((m for m in reversed(context) if m.role not in PINNED), None)
    return last is not None and last.role in (Role.USER, Role.TOOL)


class Chat:
    """A conversation with a model over the Chat Completions API, remembered by a Zerda memory.

    ``model`` is sent as is to the endpoint: OpenAI's (default), or ``base_url`` of any
    compatible server (vLLM, Ollama, llama.cpp, LM Studio...). ``memory`` holds the
    conversation (default: a :class:`~zerda.ConversationTokenBufferMemory` sized for the
    model, see :func:`zerda.chat.default_memory`); every request sends its context, repaired
    and within budget with the tool definitions counted, ending with the new user message.

    ``system`` is kept as the session's system message: stored once, replaced when it
    changes. ``tools`` are functions (or :class:`~zerda.chat.Tool` values) the model may
    call; their calls run, the results are stored with their call, and the model is asked
    again until it answers in text, at most ``max_steps`` requests a message
    (:class:`~zerda.ToolLoopError` after that). A tool that raises gives the model an error
    result. ``options`` are more request fields (``temperature``, ``max_tokens``...).

    ``client`` is an ``openai.OpenAI`` or ``openai.AsyncOpenAI`` to use (the other kind is
    made from its settings when needed); without one the SDK is set up from ``base_url``,
    ``api_key`` (default ``OPENAI_API_KEY``; a ``base_url`` needs none), ``timeout`` seconds
    a request and ``max_retries``. A failed request raises :class:`~zerda.ModelError` naming
    the endpoint; the user's message stays stored once and :meth:`retry` asks again.

    One Chat holds one conversation at a time: do not call it from two threads at once.
    """

    def __init__(
        self,
        model: str,
        *,
        memory: BaseMemory[Any] | None = None,
        client: Any = None,
        base_url: str | None = None,
        api_key: str | None = None,
        system: str | None = None,
        tools: Sequence[ToolLike] | None = None,
        max_steps: int = 8,
        timeout: float | None = None,
        max_retries: int | None = None,
        options: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, str) or not model:
            raise ConfigurationError(f"model must be a non-empty string, got {model!r}")
        if memory is not None and not isinstance(memory, BaseMemory):
            raise ConfigurationError(
                f"memory must be a Zerda memory (zerda.memory), got {type(memory).__name__}"
            )
        if system is not None and not isinstance(system, str):
            raise ConfigurationError(f"system must be a str, got {type(system).__name__}")
        if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
            raise ConfigurationError(f"max_steps must be an integer >= 1, got {max_steps!r}")
        self.model = model
        self.system = system
        self.tools: tuple[Tool, ...] = as_tools(tools)
        self.max_steps = max_steps
        self.options = self._check_options(options)
        self._by_name = {t.name: t for t in self.tools}
        self._clients = _Clients(client, base_url, api_key, timeout, max_retries)
        # Last: the default memory may load a tokenizer, worth doing only for a valid Chat.
        self.memory: BaseMemory[Any] = default_memory(model) if memory is None else memory
        self._system_checked = system is None
        self._usage_in_streams = True  # until the endpoint refuses stream_options
        self._stats = ChatStats(
            requests=0,
            prompt_tokens=0,
            completion_tokens=0,
            total_tokens=0,
            tool_calls=0,
            tool_errors=0,
            last_usage=None,
            memory=None,
        )

    @staticmethod
    def _check_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
        if options is None:
            return {}
        if not isinstance(options, Mapping):
            raise ConfigurationError(f"options must be a dict, got {type(options).__name__}")
        owned = sorted({"model", "messages", "tools", "stream", "stream_options"} & set(options))
        if owned:
            raise ConfigurationError(
                f"options cannot set {', '.join(owned)}: the Chat sets them (model=, memory, "
                "tools=, stream())"
            )
        return dict(options)

    def __repr__(self) -> str:
        return (
            f"Chat(model={self.model!r}, endpoint={self.endpoint!r}, "
            f"session_id={self.memory.session_id!r}, tools={[t.name for t in self.tools]})"
        )

    @property
    def endpoint(self) -> str:
        """The base URL requests go to."""
        return self._clients.endpoint

    @property
    def tool_definitions(self) -> list[dict[str, Any]]:
        """The ``tools`` of every request (empty without tools)."""
        return [t.definition for t in self.tools]

    # -- the public calls ------------------------------------------------------------------------

    def send(self, content: Content) -> str:
        """Store ``content`` as the user's message, get the model's answer (running the tools
        it calls), store it and return its text. ``content`` is text, or a list of content
        parts (:mod:`zerda.parts`, or OpenAI's ``text`` / ``image_url`` / ``input_audio`` /
        ``file`` dicts) to send an image, audio or a file."""
        return self._drive(self._exchange(_user_message(content)))

    def predict(self, *, input: str) -> str:
        """:meth:`send`, under the name and keyword of LangChain's ``ConversationChain``."""
        return self.send(input)

    def stream(self, content: Content) -> Iterator[str]:
        """:meth:`send`, yielding the answer's text as it arrives. The answer is stored when
        the stream ends; a stream left unfinished stores no answer (:meth:`retry` asks
        again)."""
        return self._drive_stream(self._exchange(_user_message(content)))

    def retry(self) -> str:
        """Ask again for the answer the last message waits for (after a
        :class:`~zerda.ModelError` or :class:`~zerda.ToolLoopError`), storing nothing twice.
        :class:`~zerda.ChatError` when the conversation already ends with an answer."""
        return self._drive(self._exchange(None))

    def retry_stream(self) -> Iterator[str]:
        """:meth:`retry`, streamed as :meth:`stream` streams."""
        return self._drive_stream(self._exchange(None))

    async def asend(self, content: Content) -> str:
        return await self._adrive(self._exchange(_user_message(content)))

    async def apredict(self, *, input: str) -> str:
        return await self.asend(input)

    def astream(self, content: Content) -> AsyncIterator[str]:
        return self._adrive_stream(self._exchange(_user_message(content)))

    async def aretry(self) -> str:
        return await self._adrive(self._exchange(None))

    def aretry_stream(self) -> AsyncIterator[str]:
        return self._adrive_stream(self._exchange(None))

    def context(self) -> list[Message]:
        """What the next request would send before a new message: the memory's context, with
        the tool definitions counted in its budget, and this Chat's ``system`` in it (stored
        now, as the next send would store it, when the session held another)."""
        return self._drive(self._context_flow())

    async def acontext(self) -> list[Message]:
        return await self._adrive(self._context_flow())

    def _context_flow(self) -> Generator[_Effect, Any, list[Message]]:
        context, _ = yield _ReadContext()
        if not self._system_checked and (yield from self._keep_system(context)):
            context, _ = yield _ReadContext()
        return list(context)

    def stats(self) -> ChatStats:
        """Token usage and counts since this Chat was made (see :class:`ChatStats`)."""
        stats = self._stats.copy()
        if stats["last_usage"] is not None:
            stats["last_usage"] = dict(stats["last_usage"])
        return stats

    # -- one exchange, written once --------------------------------------------------------------

    def _exchange(self, question: Message | None) -> _Flow:
        """Store the user's ``question`` (``None``: a retry) and talk with the model until it
        answers in text; the answer's text."""
        if question is None or not self._system_checked:
            context, _ = yield _ReadContext()
            if question is None and not _awaiting_reply(context):
                raise ChatError(
                    "nothing to retry: the conversation ends with the model's answer "
                    "(send a new message, or pop_turn the memory to ask that one again)"
                )
            yield from self._keep_system(context)
        if question is not None:
            yield _Store([question])
        for _ in range(self.max_steps):
            context, stats = yield _ReadContext()
            self._stats["memory"] = stats
            answer: _Answer = yield _Ask(self._request(context))
            self._count(answer)
            reply = answer.message()
            if not reply.tool_calls:
                yield _Store([reply])
                return reply.content if isinstance(reply.content, str) else ""
            results: list[Message] = yield _RunTools(reply.tool_calls)
            yield _Store([reply, *results])
        raise ToolLoopError(
            f"model {self.model!r} still called tools after max_steps={self.max_steps} "
            "requests; every call is stored with its result: chat.retry() lets it go on, or "
            "raise max_steps"
        )

    def _keep_system(self, context: Sequence[Message]) -> Generator[_Effect, Any, bool]:
        """The session's first system message says :attr:`system`: stored if missing,
        replaced if it differs; whether it changed."""
        self._system_checked = True
        if self.system is None:
            return False
        # A stored message has an id; a summary memory's summary, pinned too, has none.
        pinned = next((m for m in context if m.role in PINNED and m.id is not None), None)
        if pinned is None:
            yield _Store([Message(Role.SYSTEM, self.system)])
        elif pinned.content != self.system:
            yield _Edit(pinned.id, self.system)  # type: ignore[arg-type]  # not None: above
        else:
            return False
        return True

    def _request(self, context: Sequence[Message]) -> dict[str, Any]:
        request: dict[str, Any] = {"model": self.model, "messages": to_openai(context)}
        if self.tools:
            request["tools"] = self.tool_definitions
        request.update(self.options)
        return request

    def _count(self, answer: _Answer) -> None:
        stats = self._stats
        stats["requests"] += 1
        stats["last_usage"] = answer.usage
        for key in ("prompt_tokens", "completion_tokens", "total_tokens"):
            stats[key] += (answer.usage or {}).get(key, 0)

    def _result(self, call: ToolCall, outcome: tuple[str, bool]) -> Message:
        text, failed = outcome
        self._stats["tool_calls"] += 1
        self._stats["tool_errors"] += failed
        return Message(
            Role.TOOL, text, tool_call_id=call.id, metadata={"tool": call.name, "error": failed}
        )

    def _unknown(self, call: ToolCall) -> tuple[str, bool] | None:
        if call.name in self._by_name:
            return None
        names = ", ".join(self._by_name) or "none"
        return error_text(f"there is no tool named {call.name!r}; the tools are: {names}"), True

    # -- the drivers ------------------------------------------------------------------------------

    def _do(self, effect: _Effect) -> Any:
        """Do what the flow asked, except a request to the model (the driver's part)."""
        memory = self.memory
        if isinstance(effect, _ReadContext):
            return memory.get_context_with_stats(tools=self.tool_definitions or None)
        if isinstance(effect, _Store):
            return memory.add_messages(effect.messages)
        if isinstance(effect, _Edit):
            return memory.edit_message(effect.message_id, effect.content)
        assert isinstance(effect, _RunTools)
        return [
            self._result(c, self._unknown(c) or self._by_name[c.name].call(c.arguments))
            for c in effect.calls
        ]

    async def _ado(self, effect: _Effect) -> Any:
        memory = self.memory
        if isinstance(effect, _ReadContext):
            return await memory.aget_context_with_stats(tools=self.tool_definitions or None)
        if isinstance(effect, _Store):
            return await memory.aadd_messages(effect.messages)
        if isinstance(effect, _Edit):
            return await memory.aedit_message(effect.message_id, effect.content)
        assert isinstance(effect, _RunTools)

        async def run(call: ToolCall) -> tuple[str, bool]:
            return self._unknown(call) or await self._by_name[call.name].acall(call.arguments)

        outcomes = await asyncio.gather(*(run(c) for c in effect.calls))
        return [self._result(c, o) for c, o in zip(effect.calls, outcomes, strict=True)]

    def _drive(self, flow: Generator[_Effect, Any, _T]) -> _T:
        try:
            effect = next(flow)
            while True:
                if isinstance(effect, _Ask):
                    result: Any = self._ask(effect.request)
                else:
                    result = self._do(effect)
                effect = flow.send(result)
        except StopIteration as done:
            value: _T = done.value
            return value

    def _drive_stream(self, flow: _Flow) -> Iterator[str]:
        try:
            effect = next(flow)
            while True:
                if isinstance(effect, _Ask):
                    result: Any = yield from self._ask_stream(effect.request)
                else:
                    result = self._do(effect)
                effect = flow.send(result)
        except StopIteration:
            return

    async def _adrive(self, flow: Generator[_Effect, Any, _T]) -> _T:
        try:
            effect = next(flow)
            while True:
                if isinstance(effect, _Ask):
                    result: Any = await self._aask(effect.request)
                else:
                    result = await self._ado(effect)
                effect = flow.send(result)
        except StopIteration as done:
            value: _T = done.value
            return value

    async def _adrive_stream(self, flow: _Flow) -> AsyncIterator[str]:
        try:
            effect = next(flow)
            while True:
                if not isinstance(effect, _Ask):
                    effect = flow.send(await self._ado(effect))
                    continue
                chunks = _Chunks()
                create = self._clients.asynchronous().chat.completions.create
                try:
                    try:
                        stream = await create(**self._streamed(effect.request))
                    except self._clients.errors() as exc:
                        if not self._refuses_usage(exc):
                            raise
                        stream = await create(**self._streamed(effect.request))
                    async for chunk in stream:
                        piece = chunks.add(chunk)
                        if piece:
                            yield piece
                except self._clients.errors() as exc:
                    raise self._failure(exc) from exc
                effect = flow.send(chunks.finish())
        except StopIteration:
            return

    # -- the model --------------------------------------------------------------------------------

    def _ask(self, request: dict[str, Any]) -> _Answer:
        try:
            return _answer_of(self._clients.synchronous().chat.completions.create(**request))
        except self._clients.errors(ValueError) as exc:
            raise self._failure(exc) from exc

    async def _aask(self, request: dict[str, Any]) -> _Answer:
        client = self._clients.asynchronous()
        try:
            return _answer_of(await client.chat.completions.create(**request))
        except self._clients.errors(ValueError) as exc:
            raise self._failure(exc) from exc

    def _ask_stream(self, request: dict[str, Any]) -> Generator[str, None, _Answer]:
        chunks = _Chunks()
        create = self._clients.synchronous().chat.completions.create
        try:
            try:
                stream = create(**self._streamed(request))
            except self._clients.errors() as exc:
                if not self._refuses_usage(exc):
                    raise
                stream = create(**self._streamed(request))
            for chunk in stream:
                piece = chunks.add(chunk)
                if piece:
                    yield piece
        except self._clients.errors() as exc:
            raise self._failure(exc) from exc
        return chunks.finish()

    def _streamed(self, request: dict[str, Any]) -> dict[str, Any]:
        """``request``, streamed: with the usage asked for, unless the endpoint refused it."""
        if not self._usage_in_streams:
            return {**request, "stream": True}
        return {**request, "stream": True, "stream_options": {"include_usage": True}}

    def _refuses_usage(self, exc: Exception) -> bool:
        """Whether ``exc`` is the endpoint refusing ``stream_options`` (Mistral, Groq, Azure
        and others answer 400 or 422): then streams go on without it, and without usage."""
        status = getattr(exc, "status_code", None)
        said = str(exc)
        if not self._usage_in_streams or status not in (400, 422):
            return False
        if "stream_options" not in said and "include_usage" not in said:
            return False
        self._usage_in_streams = False
        return True

    def _failure(self, exc: BaseException) -> ModelError:
        return self._clients.failure(exc, self.model)


Content = Union[str, Sequence[Union[Part, Mapping[str, Any]]]]  # noqa: UP007 - a runtime alias
"""What :meth:`Chat.send` takes: text, or content parts."""


def _user_message(content: object) -> Message:
    """The user's message for :meth:`Chat.send`'s ``content``."""
    if isinstance(content, str):
        return Message(Role.USER, content)
    if isinstance(content, (list, tuple)) and content:
        if all(isinstance(p, Part) for p in content):
            return Message(Role.USER, tuple(content))
        if all(isinstance(p, Mapping) for p in content):
            return Message.from_openai({"role": "user", "content": list(content)})
    raise ConfigurationError(
        "the message must be text, or a non-empty list of content parts (zerda.parts, or "
        f"OpenAI content dicts), got {type(content).__name__}"
    )


class _Clients:
    """The openai SDK clients of a Chat: one sync client, one async client per event loop (an
    async connection pool belongs to the loop that opened it), made when first needed."""

    def __init__(
        self,
        client: Any,
        base_url: str | None,
        api_key: str | None,
        timeout: float | None,
        max_retries: int | None,
    ) -> None:
        self._sync: openai.OpenAI | None = None
        self._async: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, openai.AsyncOpenAI]
        self._async = weakref.WeakKeyDictionary()
        self._given_async: openai.AsyncOpenAI | None = None
        self._lock = threading.Lock()
        self._openai = _import_openai()
        if client is not None:
            if any(v is not None for v in (base_url, api_key, timeout, max_retries)):
                raise ConfigurationError(
                    "base_url, api_key, timeout and max_retries set up the SDK client; with "
                    "client= they are the client's own settings and cannot be given too"
                )
            if isinstance(client, self._openai.OpenAI):
                self._sync = client
            elif isinstance(client, self._openai.AsyncOpenAI):
                self._given_async = client
            else:
                raise ConfigurationError(
                    f"client must be an openai.OpenAI or openai.AsyncOpenAI, got "
                    f"{type(client).__name__}"
                )
            self.options = {
                "api_key": client.api_key,
                "base_url": str(client.base_url),
                "timeout": client.timeout,
                "max_retries": client.max_retries,
            }
        else:
            self.options = {
                "api_key": self._key(api_key, base_url),
                "base_url": _check_url(base_url),
                "timeout": check_timeout(timeout),
                "max_retries": check_max_retries(max_retries),
            }
        self.endpoint = str(
            self.options["base_url"] or os.environ.get("OPENAI_BASE_URL") or _OPENAI_URL
        )

    @staticmethod
    def _key(api_key: str | None, base_url: str | None) -> str:
        if api_key is not None and (not isinstance(api_key, str) or not api_key):
            raise ConfigurationError("api_key must be a non-empty string")
        key = api_key or os.environ.get("OPENAI_API_KEY")
        if key:
            return key
        if base_url is not None or os.environ.get("OPENAI_BASE_URL"):
            return _NO_KEY
        raise ConfigurationError(
            "Chat has no API key for OpenAI: pass api_key=... or set OPENAI_API_KEY, or give "
            "base_url= of a compatible server (a local one needs no key)"
        )

    def errors(self, *more: type[Exception]) -> tuple[type[Exception], ...]:
        """The SDK's exceptions (and ``more``): what a request may raise that is no bug."""
        return (self._openai.OpenAIError, *more)

    def synchronous(self) -> openai.OpenAI:
        with self._lock:
            if self._sync is None:
                self._sync = self._openai.OpenAI(**self.options)
            return self._sync

    def asynchronous(self) -> openai.AsyncOpenAI:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._given_async is not None:
                return self._given_async
            client = self._async.get(loop)
            if client is None:
                client = self._async[loop] = self._openai.AsyncOpenAI(**self.options)
            return client

    def failure(self, exc: BaseException, model: str) -> ModelError:
        """A ModelError naming the endpoint and saying what went wrong, in a few words."""
        where = f"model {model!r} at {self.endpoint}"
        status = getattr(exc, "status_code", None)
        if isinstance(exc, self._openai.APITimeoutError):
            what = (
                f"{where} timed out (timeout={self.options['timeout']}s a request, "
                f"max_retries={self.options['max_retries']})"
            )
        elif isinstance(exc, self._openai.APIConnectionError):
            cause = exc.__cause__ or exc
            what = f"cannot reach {where}: {type(cause).__name__}: {str(cause)[:200]}"
        elif isinstance(exc, self._openai.APIStatusError):
            what = f"{where} answered HTTP {status}: {_detail(exc)}"
        else:
            what = f"{where} failed: {type(exc).__name__}: {str(exc)[:300]}"
        return ModelError(
            f"{what}; what was sent is stored: chat.retry() asks again",
            endpoint=self.endpoint,
            status=status if isinstance(status, int) else None,
        )


_OPENAI_URL = "https://api.openai.com/v1"


def _detail(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, Mapping) else error
        if message:
            return str(message)[:300]
    return str(getattr(exc, "message", exc))[:300]


def _import_openai() -> Any:
    try:
        import openai
    except ImportError as exc:
        raise ConfigurationError(f"zerda.chat needs the openai package ({_INSTALL_HINT})") from exc
    return openai


def _check_url(base_url: object) -> str | None:
    if base_url is not None and (not isinstance(base_url, str) or not base_url):
        raise ConfigurationError(f"base_url must be a non-empty string, got {base_url!r}")
    return base_url
