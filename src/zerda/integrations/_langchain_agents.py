"""LangChain 1.x agents: ZerdaMiddleware, a Zerda memory as ``create_agent`` middleware.

Import it as ``zerda.integrations.langchain.ZerdaMiddleware``: that module imports only
langchain-core, and loads this one, which needs ``langchain`` 1.x (the ``langchain-agents``
extra), the first time the name is used.

``create_agent(model, tools, middleware=[ZerdaMiddleware(memory)])`` records every message the
agent adds to its state in the memory's store, once (by message id), and sends the model the
memory's context of the thread (its window, budget, summary and repairs) in place of the
thread's whole state. The state itself is left as LangGraph keeps it. The store holds the
thread, so an agent built anew (no checkpointer, or a new one) continues a thread it finds
there.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from typing import Any, cast

try:
    from langchain.agents.middleware import AgentMiddleware, AgentState, ModelRequest, ModelResponse
    from langchain_core.messages import (
        AIMessage,
        AnyMessage,
        BaseMessage,
        ChatMessage,
        ToolMessage,
        message_to_dict,
        messages_from_dict,
    )
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from langgraph.config import get_config
    from langgraph.runtime import Runtime
except ImportError as exc:  # pragma: no cover - exercised only without langchain 1.x
    raise ImportError(
        "zerda.integrations.langchain.ZerdaMiddleware needs langchain 1.x: "
        "pip install 'zerda-memory[langchain-agents]'"
    ) from exc

from zerda.errors import ConfigurationError, InvalidMessageError
from zerda.integrations._json import shown, storable
from zerda.integrations._langchain_messages import _TOOL_BLOCKS, from_langchain, to_langchain
from zerda.memory import BaseMemory, ConversationTokenBufferMemory
from zerda.messages import MAX_ID_LENGTH, Message, Role
from zerda.stores import AsyncStore, Store, check_session_id
from zerda.stores._base import BoundedCache, Tail, as_async

__all__ = ["ZerdaMiddleware"]

KEPT_KEY = "langchain.message"
"""The message ``metadata`` key holding, for a LangChain message :func:`from_langchain` cannot
read (a content block or a message type Zerda does not model), the message itself as
``message_to_dict`` gives it, so that it is given back unchanged."""

_THREADS = 1024
"""How many threads' memories and recording marks a middleware keeps at once (per
generation): a thread seen again after that costs one read of its newest turn."""

_CHAT_ROLES = {"user": Role.USER, "human": Role.USER, "system": Role.SYSTEM}


# -- recording: the state's messages as Zerda messages ----------------------------------------


def _zerda_id(message: BaseMessage) -> str:
    """The Zerda id of a state message: its LangChain id (the one ``add_messages`` matches
    messages by), or a digest of it when it is not a valid Zerda id."""
    lc_id = message.id
    if lc_id is None:
        # Every message LangGraph's add_messages reducer keeps has an id; a state schema
        # without that reducer may hold one without: it gets one, as LangChain's own
        # middleware gives it (SummarizationMiddleware._ensure_message_ids).
        lc_id = message.id = str(uuid.uuid4())
    if 0 < len(lc_id) <= MAX_ID_LENGTH and lc_id.isprintable():
        return lc_id
    return "lc-" + hashlib.sha256(lc_id.encode("utf-8", "surrogatepass")).hexdigest()


def _after(messages: Sequence[BaseMessage], known: Collection[str]) -> int | None:
    """Where the messages after the newest of ``messages`` whose Zerda id is ``known``
    start; ``None`` when none is."""
    for i in range(len(messages) - 1, -1, -1):
        if _zerda_id(messages[i]) in known:
            return i + 1
    return None


def _stored(message: object, where: str) -> Message:
    """The Zerda message that records a state message: :func:`from_langchain`'s, or, for one
    it cannot read, a stand-in that keeps the message whole (see :func:`_stand_in`)."""
    if not isinstance(message, BaseMessage):
        raise InvalidMessageError(
            f"{where} must be a LangChain message, got {type(message).__name__}"
        )
    try:
        converted = from_langchain(message)
    except InvalidMessageError:
        converted = _stand_in(message)
    return dataclasses.replace(converted, id=_zerda_id(message))


def _stand_in(message: BaseMessage) -> Message:
    """A message showing ``message``'s content as text (blocks Zerda does not model as their
    JSON, inline data left out), with its role, tool calls and tool call id where Zerda has
    them, and ``message`` itself under :data:`KEPT_KEY`: counted, summarized and shown to
    the CLI as what it says, given back to LangChain as it was."""
    shown = _shown(message)
    try:
        converted = from_langchain(message.model_copy(update={"content": shown}))
    except InvalidMessageError:  # a message type Zerda has no role for: inside its turn
        role = _CHAT_ROLES.get(message.role) if isinstance(message, ChatMessage) else None
        converted = Message(role or Role.ASSISTANT, shown)
    kept = _kept(message)
    if kept is None:
        return converted
    return dataclasses.replace(converted, metadata={**converted.metadata, KEPT_KEY: kept})


def _kept(message: BaseMessage) -> dict[str, Any] | None:
    """``message`` as ``message_to_dict`` gives it, if a message's metadata can hold that,
    less the ``additional_kwargs`` and ``response_metadata`` values it cannot; else
    ``None``."""
    kept = message_to_dict(message)
    data = kept["data"]
    for key in ("additional_kwargs", "response_metadata"):
        if isinstance(data.get(key), Mapping):
            data[key] = {k: v for k, v in data[key].items() if storable(v, 4)}
    return kept if storable(kept, 1) else None


def _shown(message: BaseMessage) -> str:
    """What ``message`` says, as text: its text blocks, other blocks as their JSON (an AI
    message's tool-call blocks left out: its calls are in ``tool_calls``)."""
    content = message.content
    if isinstance(content, str):
        return content
    ai = isinstance(message, AIMessage)
    pieces = []
    for block in content:
        if isinstance(block, str):
            pieces.append(block)
        elif block.get("type") == "text" and isinstance(block.get("text"), str):
            pieces.append(block["text"])
        elif not (ai and block.get("type") in _TOOL_BLOCKS):
            pieces.append(shown(block))
    return "\n".join(pieces)


# -- giving back: Zerda messages as LangChain messages ----------------------------------------


def _given_back(message: Message) -> BaseMessage:
    """The LangChain message for a stored message: the one it was recorded from, kept whole
    when Zerda could not read it and unchanged since (not edited, not cut to fit a budget,
    no call of it taken out by repair), else :func:`to_langchain`'s."""
    kept = message.metadata.get(KEPT_KEY)
    if isinstance(kept, Mapping):
        try:
            original = messages_from_dict([dict(kept)])[0]
        except (KeyError, TypeError, ValueError):  # pydantic's ValidationError is a ValueError
            original = None
        if original is not None and _unchanged(original, message):
            return original
    return to_langchain(message, include_zerda_fields=False)


def _unchanged(original: BaseMessage, message: Message) -> bool:
    """Whether ``message``, the stand-in of ``original`` as a context holds it, still says
    what ``original`` says: the same text, calls and call id."""
    if message.content != _shown(original):
        return False
    if isinstance(original, AIMessage):
        ids = [c.get("id") for c in original.tool_calls]
        ids += [c.get("id") for c in original.invalid_tool_calls]
        return ids == [c.id for c in message.tool_calls]
    if isinstance(original, ToolMessage):
        return original.tool_call_id == message.tool_call_id
    return True


# -- the request's tools, as Zerda counts them ------------------------------------------------


def _definition(tool: object) -> dict[str, Any]:
    """The OpenAI function definition of a request's tool; a provider's built-in tool (a dict
    with no function in it) is counted as a function named by its type, described by its
    JSON."""
    try:
        converted = convert_to_openai_tool(tool)  # type: ignore[arg-type]
    except (ValueError, TypeError, KeyError, AttributeError):
        converted = {}
    function = converted.get("function", converted)
    if isinstance(function, Mapping) and isinstance(function.get("name"), str):
        return converted
    raw = tool if isinstance(tool, Mapping) else {"tool": repr(tool)}
    return {
        "type": "function",
        "function": {
            "name": str(raw.get("type") or raw.get("name") or "tool"),
            "description": json.dumps(raw, default=repr, separators=(",", ":")),
        },
    }


# -- the middleware ---------------------------------------------------------------------------


def _thread_id(runtime: Runtime[Any] | None) -> str | None:
    """The thread id of the run (``config["configurable"]["thread_id"]``), as a string;
    ``None`` for a run without one. LangGraph's runtime carries it (``execution_info``); a
    langgraph without that is asked through ``get_config()``, which in async code needs
    Python 3.11."""
    info = getattr(runtime, "execution_info", None)
    thread = getattr(info, "thread_id", None)
    if info is None:
        try:
            configurable = get_config().get("configurable") or {}
        except RuntimeError:  # outside a run
            configurable = {}
        thread = configurable.get("thread_id")
    return None if thread is None else str(thread)


class ZerdaMiddleware(AgentMiddleware[AgentState[Any], Any, Any]):
    """LangChain 1.x agent middleware that gives the model a Zerda memory's context and keeps
    the thread in the memory's store.

    ``memory`` is any Zerda memory: its store holds the threads, its kind and settings (a
    window of ``k`` turns, a token budget, a summary, ``strict``) say what the model sees.
    Each thread is a Zerda session: the run's ``thread_id`` (``config={"configurable":
    {"thread_id": ...}}``) names it, a run without one uses ``memory.session_id``. A thread
    other than the memory's own gets a memory of the same kind and settings on that session
    (:meth:`memory_for`).

    Before each model call, the messages the state gained since the last one (the user's
    input, the model's replies with their tool calls, the tool results) are appended to the
    thread's session as one batch, each under its LangChain id, so that nothing is stored
    twice however often a checkpointer hands the state back; the messages of the final reply
    are appended when the run ends (``after_agent``). The model is then sent the memory's
    context in place of the state's messages: pinned system messages, the summary, the
    newest whole turns that fit, every tool call with its result. The request's tools count
    inside a token budget; the agent's ``system_prompt`` stays the request's own and does
    not (leave room for it with the memory's ``reserve_tokens``). The state keeps what
    LangGraph keeps: the middleware never removes a message from it.

    A message Zerda does not model (a content block of another kind, a ``FunctionMessage``)
    is stored as a message showing its text, with the message itself kept whole, and given
    back unchanged. Put this middleware first in ``middleware=[...]``: the others then see,
    and may change, what it sends.
    """

    def __init__(self, memory: BaseMemory[Any]) -> None:
        super().__init__()
        if not isinstance(memory, BaseMemory):
            raise ConfigurationError(
                f"ZerdaMiddleware takes a Zerda memory, got {type(memory).__name__}"
            )
        self.memory = memory
        store = memory.store
        self._sync: Store | None = store if isinstance(store, Store) else None
        self._async: AsyncStore = as_async(store)
        self._memories: BoundedCache[str, BaseMemory[Any]] = BoundedCache(_THREADS)
        # Per session, the Zerda id of the newest state message recorded: the next state
        # holds it, and what follows it is what to record (no read of the store).
        self._newest: BoundedCache[str, str] = BoundedCache(_THREADS)
        self._definitions: BoundedCache[int, tuple[object, dict[str, Any]]] = BoundedCache(256)
        # The LangChain message of each context message sent, by the Zerda message's identity:
        # a store gives back the same object for a message it has not changed, and a context
        # holds mostly the messages the last one held. Each entry holds its key's object, so
        # that no other object can have that id while it is cached (tools, likewise).
        self._converted: BoundedCache[int, tuple[Message, BaseMessage]] = BoundedCache(4096)

    def memory_for(self, thread_id: str | None = None) -> BaseMemory[Any]:
        """The memory of a thread: :attr:`memory` for its own session (and for ``None``),
        else one of the same kind and settings on the session ``thread_id``, in the same
        store (read its context, stats or history as any memory's)."""
        if thread_id is None or thread_id == self.memory.session_id:
            return self.memory
        found = self._memories.lookup(thread_id)
        if found is None:
            found = self.memory._forked(check_session_id(thread_id))
            self._memories.put(thread_id, found)
        return found

    def get_history(self, thread_id: str | None = None) -> list[BaseMessage]:
        """Every message of a thread, as the agent added them (``==``), system messages
        included, read from the store."""
        return [_given_back(m) for m in self.memory_for(thread_id).get_history()]

    async def aget_history(self, thread_id: str | None = None) -> list[BaseMessage]:
        return [_given_back(m) for m in await self.memory_for(thread_id).aget_history()]

    # -- the hooks --------------------------------------------------------------------------

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        memory = self._run_memory(request.runtime)
        self._record(memory, request.state["messages"])
        context = memory.get_context(tools=self._tools(memory, request))
        return handler(request.override(messages=self._sent(context)))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        memory = self.memory_for(_thread_id(request.runtime))
        await self._arecord(memory, request.state["messages"])
        context = await memory.aget_context(tools=self._tools(memory, request))
        return await handler(request.override(messages=self._sent(context)))

    def after_agent(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        self._record(self._run_memory(runtime), state["messages"])
        return None

    async def aafter_agent(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        await self._arecord(self.memory_for(_thread_id(runtime)), state["messages"])
        return None

    # -- recording ---------------------------------------------------------------------------

    def _run_memory(self, runtime: Runtime[Any]) -> BaseMemory[Any]:
        if self._sync is None:
            raise ConfigurationError(
                f"ZerdaMiddleware's memory has an async store ({type(self.memory.store).__name__})"
                ": run the agent with ainvoke or astream, or give the memory a sync store"
            )
        return self.memory_for(_thread_id(runtime))

    def _unrecorded(self, session_id: str, messages: Sequence[BaseMessage]) -> int | None:
        """Where the state's unrecorded messages start, when the newest message recorded from
        a state of this session is in ``messages``; ``None`` when it is not (a new process,
        a state without a checkpointer): then the store's newest turn says."""
        newest = self._newest.lookup(session_id)
        return None if newest is None else _after(messages, (newest,))

    def _record(self, memory: BaseMemory[Any], messages: Sequence[BaseMessage]) -> None:
        session_id = memory.session_id
        start = self._unrecorded(session_id, messages)
        if start is None:
            start = _after(messages, _ids(cast(Store, self._sync).tail(session_id, 1, None))) or 0
        batch = _batch(messages, start)
        if batch:
            memory.add_messages(batch)
        if messages:
            self._newest.put(session_id, _zerda_id(messages[-1]))

    async def _arecord(self, memory: BaseMemory[Any], messages: Sequence[BaseMessage]) -> None:
        session_id = memory.session_id
        start = self._unrecorded(session_id, messages)
        if start is None:
            start = _after(messages, _ids(await self._async.atail(session_id, 1, None))) or 0
        batch = _batch(messages, start)
        if batch:
            await memory.aadd_messages(batch)
        if messages:
            self._newest.put(session_id, _zerda_id(messages[-1]))

    def _tools(self, memory: BaseMemory[Any], request: ModelRequest[Any]) -> list[dict[str, Any]]:
        """The request's tool definitions, for a memory that counts them in its budget."""
        if not isinstance(memory, ConversationTokenBufferMemory):
            return []
        out = []
        for tool in request.tools:
            cached = self._definitions.lookup(id(tool))
            if cached is None:
                cached = (tool, _definition(tool))
                self._definitions.put(id(tool), cached)
            out.append(cached[1])
        return out

    def _sent(self, context: Sequence[Message]) -> list[AnyMessage]:
        """The LangChain messages of ``context``: converted once while the store gives back
        the same message, each request given copies of its own (shallow: LangChain's own
        middleware change a message by ``model_copy(update=...)``, never in place)."""
        out = []
        for message in context:
            hit = self._converted.lookup(id(message))
            if hit is None:
                hit = (message, _given_back(message))
                self._converted.put(id(message), hit)
            out.append(hit[1].model_copy())
        return cast("list[AnyMessage]", out)

    def __repr__(self) -> str:
        memory, store = type(self.memory).__name__, type(self.memory.store).__name__
        return f"ZerdaMiddleware({memory}, store={store})"


def _ids(tail: Tail) -> set[str]:
    return {m.id for m in (*tail.system, *tail.messages) if m.id is not None}


def _batch(messages: Sequence[BaseMessage], start: int) -> list[Message]:
    return [_stored(messages[i], f"state message {i}") for i in range(start, len(messages))]
