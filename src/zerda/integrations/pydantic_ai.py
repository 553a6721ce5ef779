"""Pydantic AI integration: Zerda's turns, budgets and repair as a history processor, and
``list[ModelMessage]`` kept in any Zerda store.

``ZerdaHistory(k=...)`` or ``ZerdaHistory(token_limit=...)`` is a history processor: give it to
``Agent(capabilities=[ProcessHistory(history)])`` (or ``history_processors=[history]`` in a
Pydantic AI that still has that argument). Before each model request it sends the newest whole
turns that fit, the system prompt pinned, a tool call never without its return, repaired as a
Zerda memory repairs a context; it gives back the very ``ModelMessage`` objects it was given.

``ZerdaMessageHistory(session_id, store=...)`` keeps a conversation's messages in a Zerda store:
``save(result.new_messages())`` after each run, ``load()`` before the next. Each message is
stored as Zerda messages (one per part Zerda models: system, user, tool return, one for a
response), so that the CLI, the inspector and every memory read it, with the message's own
``ModelMessagesTypeAdapter`` JSON in ``metadata["pydantic_ai"]``: ``load()`` gives back messages
equal to those saved. ``ZerdaConversationStore(store)`` is Pydantic AI's ``ConversationStore``
over a Zerda store, where the installed Pydantic AI has that base class.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from zerda.errors import ConfigurationError, InvalidMessageError
from zerda.integrations._memory import memory_on, selecting_memory
from zerda.memory import (
    BaseMemory,
)
from zerda.messages import Message, Role, ToolCall, new_message_id
from zerda.parts import Part, ReasoningPart, TextPart
from zerda.policies import Overflow
from zerda.stores import AsyncStore, InMemoryStore, Store
from zerda.stores._base import as_async
from zerda.tokens import TokenCounterLike

try:
    import pydantic
    from pydantic_ai import messages as _pm
    from pydantic_ai.messages import (
        BaseToolCallPart,
        BaseToolReturnPart,
        ModelMessage,
        ModelMessagesTypeAdapter,
        ModelRequest,
        ModelResponse,
        RetryPromptPart,
        SystemPromptPart,
        ThinkingPart,
        ToolCallPart,
        ToolReturnPart,
        UserPromptPart,
    )
    from pydantic_ai.messages import TextPart as ModelTextPart
except ImportError as exc:  # pragma: no cover - exercised only without pydantic-ai
    raise ImportError(
        "zerda.integrations.pydantic_ai needs pydantic-ai: pip install 'zerda-memory[pydantic-ai]'"
    ) from exc

try:
    from pydantic_ai import conversation_store as _conversation_store
except ImportError:  # pragma: no cover - a Pydantic AI without conversation stores
    _conversation_store = None  # type: ignore[assignment]

__all__ = [
    "METADATA_KEY",
    "RECORD_KEY",
    "ZerdaConversationStore",
    "ZerdaHistory",
    "ZerdaMessageHistory",
]

METADATA_KEY = "pydantic_ai"
"""The message ``metadata`` key under which a stored Zerda message keeps what it stands for:
``{"message": <ModelMessagesTypeAdapter JSON of the model message, with only the parts this
Zerda message stands for>, "group": <the id of the first Zerda message of the model message>,
"parts": [<the indexes of those parts>]}``."""

# Parts executed by the provider inside one response: not calls a request answers. Named
# ``Native...`` in Pydantic AI 2, ``Builtin...`` in 1.
_NATIVE_CALLS: tuple[type[Any], ...] = tuple(
    c
    for c in (getattr(_pm, "NativeToolCallPart", None), getattr(_pm, "BuiltinToolCallPart", None))
    if isinstance(c, type)
)
_NATIVE_RETURNS: tuple[type[Any], ...] = tuple(
    c
    for c in (
        getattr(_pm, "NativeToolReturnPart", None),
        getattr(_pm, "BuiltinToolReturnPart", None),
    )
    if isinstance(c, type)
)


# -- model messages -> Zerda messages ---------------------------------------------------------


class _Piece(NamedTuple):
    """One Zerda message standing for some parts of a model message: the indexes of those
    parts, and for a response the part index of each tool call it makes."""

    message: Message
    parts: tuple[int, ...]
    calls: tuple[int, ...] = ()


def _text_of(value: object) -> str:
    """The text a user prompt's or a tool return's content reads as, media shown by what they
    are (Zerda counts their text, not their bytes)."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return "\n".join(_text_of(item) for item in value)
    url = getattr(value, "url", None)
    if isinstance(url, str):
        return f"[{type(value).__name__} {url}]"
    media = getattr(value, "media_type", None)
    if isinstance(media, str):
        return f"[{type(value).__name__} {media}]"
    return str(value)


def _part_text(part: object) -> str:
    """What a part Zerda has no role for says to the model, as near as can be told."""
    for name in ("model_response", "model_response_str"):
        method = getattr(part, name, None)
        if callable(method):
            try:
                text = method()
            except Exception:  # a part that cannot render still counts, as its content
                break
            if isinstance(text, str):
                return text
    content = getattr(part, "content", None)
    return _text_of(content) if content is not None else repr(part)


def _return_text(part: BaseToolReturnPart[Any, Any]) -> str:
    try:
        return part.model_response_str()
    except Exception:  # content Pydantic AI cannot render: shown as it is
        return _text_of(part.content)


def _pieces(message: ModelMessage, calls: dict[str, str], *, unique: str | None) -> list[_Piece]:
    """The Zerda messages that stand for ``message``.

    A request gives a system message per system prompt, a user message per user prompt and a
    tool message per tool return; a part Zerda has no role for (a retry without a call,
    instruction bookkeeping, ...) goes with the next piece of its request (else the one before);
    a request of such parts only is an assistant message showing their text, so that it stays
    inside its turn. A response is one assistant message: its text, its thinking, its tool
    calls. ``calls`` maps each call id seen so far to the id its Zerda call has; with
    ``unique``, each call is given a fresh id ending in it, so that a model that reuses ids turn
    after turn pairs each return with the latest call of its id.
    """
    if isinstance(message, ModelResponse):
        return [_response_piece(message, calls, unique)]
    if not isinstance(message, ModelRequest):
        raise InvalidMessageError(
            f"a Pydantic AI history holds ModelRequest and ModelResponse objects, got "
            f"{type(message).__name__}"
        )
    out: list[tuple[Message | None, list[int]]] = []
    waiting: list[int] = []
    for i, part in enumerate(message.parts):
        zerda = _request_part(part, calls, unique)
        if zerda is None:
            waiting.append(i)
            continue
        out.append((zerda, [*waiting, i]))
        waiting = []
    if waiting:
        if out:
            out[-1][1].extend(waiting)
        else:
            text = "\n".join(_part_text(message.parts[i]) for i in waiting)
            out.append((Message(Role.ASSISTANT, text), waiting))
    return [_Piece(m, tuple(parts)) for m, parts in out if m is not None]


def _request_part(part: object, calls: dict[str, str], unique: str | None) -> Message | None:
    if isinstance(part, SystemPromptPart):
        return Message(Role.SYSTEM, part.content)
    if isinstance(part, UserPromptPart):
        return Message(Role.USER, _text_of(part.content))
    if isinstance(part, BaseToolReturnPart) and not isinstance(part, _NATIVE_RETURNS):
        return Message(
            Role.TOOL,
            _return_text(part),
            tool_call_id=_answered(part.tool_call_id, calls, unique),
            name=part.tool_name or None,
        )
    if isinstance(part, RetryPromptPart) and part.tool_name is not None:
        return Message(
            Role.TOOL,
            part.model_response(),
            tool_call_id=_answered(part.tool_call_id, calls, unique),
            name=part.tool_name,
        )
    return None


def _answered(call_id: str, calls: dict[str, str], unique: str | None) -> str:
    """The id of the Zerda call a return of ``call_id`` answers; a return of no call seen has
    an id no call has, so that repair drops it."""
    if unique is None:
        return call_id or "-"
    return calls.get(call_id, f"{call_id}#orphan{unique}")


def _response_piece(message: ModelResponse, calls: dict[str, str], unique: str | None) -> _Piece:
    content: list[Part] = []
    made: list[ToolCall] = []
    at: list[int] = []
    for i, part in enumerate(message.parts):
        if isinstance(part, ModelTextPart):
            if part.content:
                content.append(TextPart(part.content))
        elif isinstance(part, ThinkingPart):
            content.append(ReasoningPart(part.content, signature=part.signature))
        elif isinstance(part, BaseToolCallPart) and not isinstance(part, _NATIVE_CALLS):
            call_id = part.tool_call_id or "-"
            zid = call_id if unique is None else f"{call_id}#{unique}.{i}"
            calls[call_id] = zid
            made.append(ToolCall(zid, part.tool_name or "-", _arguments(part)))
            at.append(i)
        else:  # native calls and returns, files, ...: shown by their text
            text = _part_text(part)
            if text:
                content.append(TextPart(text))
    body: str | tuple[Part, ...] | None
    if not content:
        body = None if made else ""
    elif len(content) == 1 and isinstance(content[0], TextPart):
        body = content[0].text
    else:
        body = tuple(content)
    return _Piece(
        Message(Role.ASSISTANT, body, tool_calls=tuple(made)),
        tuple(range(len(message.parts))),
        tuple(at),
    )


def _arguments(part: BaseToolCallPart[Any]) -> str:
    try:
        return part.args_as_json_str()
    except Exception:  # arguments that are not JSON: shown as they are
        return str(part.args)


# -- what a Zerda memory chose -> model messages ----------------------------------------------


def _chosen(
    messages: Sequence[ModelMessage],
    kept: Mapping[int, set[int]],
    cut: Mapping[int, Mapping[int, Any]],
) -> list[ModelMessage]:
    """``messages`` with only the parts ``kept`` says (by message index), in their order, and
    the parts ``cut`` says in place of theirs: the very objects where every part is kept as it
    is, a copy holding the kept parts where not."""
    out: list[ModelMessage] = []
    for i, message in enumerate(messages):
        parts = kept.get(i)
        if not parts:
            continue
        changed = cut.get(i, {})
        if len(parts) == len(message.parts) and not changed:
            out.append(message)
        else:
            chosen = [changed.get(j, message.parts[j]) for j in sorted(parts)]
            out.append(dataclasses.replace(message, parts=chosen))  # type: ignore[arg-type]
    return out


def _cut_parts(model_message: ModelMessage, piece: _Piece, shown: Message) -> dict[int, Any]:
    """The parts of ``piece`` whose text the memory cut to fit its budget (``overflow=
    "truncate"``), cut likewise, by part index: a request's prompt or return (the piece's
    last part), a response's texts (in the order the piece holds them)."""
    if shown.content == piece.message.content:
        return {}
    if isinstance(model_message, ModelRequest):
        j = piece.parts[-1]
        part: Any = model_message.parts[j]  # a prompt, a return or a retry: each has content
        if not isinstance(shown.content, str) or not hasattr(part, "content"):
            return {}
        return {j: dataclasses.replace(part, content=shown.content)}
    texts = [
        j
        for j, part in enumerate(model_message.parts)
        if isinstance(part, ModelTextPart) and part.content
    ]
    before, after = piece.message.content, shown.content
    pairs: list[tuple[int, str]] = []
    if isinstance(after, str) and len(texts) == 1:
        pairs = [(texts[0], after)]
    elif isinstance(before, tuple) and isinstance(after, tuple):
        originals = [p for p in before if isinstance(p, TextPart)]
        shortened = [p for p in after if isinstance(p, TextPart)]
        pairs = [
            (j, b.text)
            for j, a, b in zip(texts, originals, shortened, strict=False)
            if a.text != b.text
        ]
    given: list[Any] = list(model_message.parts)
    return {j: dataclasses.replace(given[j], content=text) for j, text in pairs}


def _kept_parts(piece: _Piece, shown: Message) -> set[int]:
    """The parts of ``piece`` that ``shown``, the piece as the context holds it, still has:
    all of them, less the tool calls repair removed (matched by name and arguments, in order:
    a renamed reused id is still the same call)."""
    parts = set(piece.parts)
    original = piece.message.tool_calls
    if len(shown.tool_calls) == len(original):
        return parts
    remaining = list(shown.tool_calls)
    for call, at in zip(original, piece.calls, strict=True):
        if remaining and (remaining[0].name, remaining[0].arguments) == (call.name, call.arguments):
            remaining.pop(0)
        else:
            parts.discard(at)
    return parts


# -- the history processor --------------------------------------------------------------------


class ZerdaHistory:
    """A Pydantic AI history processor that sends what a Zerda memory would.

    ``k``: the last ``k`` turns; ``token_limit``: the newest whole turns within that many
    tokens, counted by ``counter`` (Zerda's default counter when unset), less
    ``reserve_tokens`` (room for the instructions, the tools and the reply); neither: every
    turn. A turn is a user prompt and everything after it up to the next one. System prompts
    are pinned: always sent, inside the budget. Repaired as Zerda repairs a context: a tool
    return whose call is not sent is left out, a call whose return is missing is taken out of
    its response, a history never opens on a reply. ``overflow``: what to do when the newest
    turn alone is over the budget: ``"raise"`` :class:`~zerda.ContextOverflowError` (the
    default), or ``"truncate"``: keep the newest messages of it that fit.

    Give it to ``ProcessHistory(history)`` (or ``ProcessHistory(history.aselect)``, which spares
    Pydantic AI a thread for a plain function), or to ``history_processors=[history]`` where an
    Agent still takes that. The messages it returns are the objects it was given; a request only
    some of whose parts are sent (the system prompt of a first request whose turn was left
    out) is a copy with those parts, every other field as it was.
    """

    def __init__(
        self,
        *,
        k: int | None = None,
        token_limit: int | None = None,
        counter: TokenCounterLike | None = None,
        reserve_tokens: int = 0,
        overflow: Overflow = "raise",
        strict: bool = False,
    ) -> None:
        self._make = selecting_memory(
            "ZerdaHistory",
            k=k,
            token_limit=token_limit,
            counter=counter,
            reserve_tokens=reserve_tokens,
            overflow=overflow,
            strict=strict,
        )
        self.k = k
        self.token_limit = token_limit

    def select(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """The messages to send: what the memory keeps of ``messages`` (see the class)."""
        if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
            raise InvalidMessageError(
                f"a history processor takes a list of ModelMessage, got {type(messages).__name__}"
            )
        calls: dict[str, str] = {}
        pieces: dict[str, tuple[int, _Piece]] = {}
        batch: list[Message] = []
        for i, model_message in enumerate(messages):
            for j, piece in enumerate(_pieces(model_message, calls, unique=str(i))):
                zid = f"{i}.{j}"
                pieces[zid] = (i, piece)
                batch.append(dataclasses.replace(piece.message, id=zid))
        memory = self._make(InMemoryStore())
        memory.add_messages(batch)
        kept: dict[int, set[int]] = {}
        cut: dict[int, dict[int, Any]] = {}
        for shown in memory.get_context():
            at, piece = pieces[shown.id or ""]
            kept.setdefault(at, set()).update(_kept_parts(piece, shown))
            cut.setdefault(at, {}).update(_cut_parts(messages[at], piece, shown))
        return _chosen(messages, kept, cut)

    def __call__(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        return self.select(messages)

    async def aselect(self, messages: list[ModelMessage]) -> list[ModelMessage]:
        """:meth:`select`, for Pydantic AI to await: the selection is pure computation over an
        in-memory store, so there is nothing to wait for and no thread to hop to."""
        return self.select(messages)

    def __repr__(self) -> str:
        if self.token_limit is not None:
            return f"ZerdaHistory(token_limit={self.token_limit})"
        return f"ZerdaHistory(k={self.k})" if self.k is not None else "ZerdaHistory()"


# -- storing model messages -------------------------------------------------------------------


def _dump(message: ModelMessage, parts: Sequence[int] | None = None) -> str:
    if parts is not None and len(parts) != len(message.parts):
        message = dataclasses.replace(
            message,
            parts=[message.parts[j] for j in parts],  # type: ignore[arg-type]
        )
    return ModelMessagesTypeAdapter.dump_json([message]).decode()


def _stored(
    message: ModelMessage, group: str, extra: Mapping[str, Any] | None = None
) -> list[Message]:
    """The Zerda messages that store ``message``: its pieces, each with the JSON of its parts,
    the first with id ``group``."""
    pieces = _pieces(message, {}, unique=None)
    out = []
    for j, piece in enumerate(pieces):
        kept: dict[str, Any] = {
            "message": _dump(message, piece.parts),
            "group": group,
            "parts": list(piece.parts),
            **(extra or {}),
        }
        out.append(
            dataclasses.replace(
                piece.message,
                id=group if j == 0 else f"{group}.{j}",
                metadata={METADATA_KEY: kept},
            )
        )
    return out


def _stored_batch(messages: Iterable[ModelMessage], what: str) -> list[Message]:
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Iterable):
        raise InvalidMessageError(
            f"{what} takes a list of ModelMessage, got {type(messages).__name__}"
        )
    batch: list[Message] = []
    for i, message in enumerate(messages):
        if not isinstance(message, (ModelRequest, ModelResponse)):
            raise InvalidMessageError(
                f"{what}: messages[{i}] must be a ModelRequest or ModelResponse, got "
                f"{type(message).__name__}"
            )
        batch.extend(_stored(message, new_message_id()))
    return batch


def _kept_of(message: Message) -> Mapping[str, Any] | None:
    kept = message.metadata.get(METADATA_KEY)
    if (
        isinstance(kept, Mapping)
        and isinstance(kept.get("message"), str)
        and isinstance(kept.get("group"), str)
        and "edited_at" not in message.metadata
    ):
        return kept
    return None


def _read_back(stored: Sequence[Message]) -> list[tuple[ModelMessage, Mapping[str, Any] | None]]:
    """The model messages ``stored`` holds, in order, each with the metadata of its first
    piece (``None`` for one written by other code): the pieces of one message, wherever the
    store returns them, are one message again; a message edited through Zerda or written by
    other code is converted from what it says now."""
    slots: list[tuple[str | None, Message]] = []
    groups: dict[str, list[Mapping[str, Any]]] = {}
    for m in stored:
        kept = _kept_of(m)
        if kept is None:
            slots.append((None, m))
            continue
        group = kept["group"]
        if group not in groups:
            groups[group] = []
            slots.append((group, m))
        groups[group].append(kept)
    texts: list[str] = []
    for group, _ in slots:
        if group is not None:
            texts.extend(kept["message"][1:-1] for kept in groups[group])
    parsed = iter(ModelMessagesTypeAdapter.validate_json("[" + ",".join(texts) + "]"))
    out: list[tuple[ModelMessage, Mapping[str, Any] | None]] = []
    for group, m in slots:
        if group is None:
            out.append((_converted(m), None))
            continue
        pieces = groups[group]
        first = next(parsed)
        if len(pieces) == 1:
            out.append((first, pieces[0]))
            continue
        by_index: dict[int, Any] = {}
        for kept, message in zip(pieces, [first, *(next(parsed) for _ in pieces[1:])], strict=True):
            for index, part in zip(kept.get("parts", ()), message.parts, strict=False):
                by_index[int(index)] = part
        parts = [by_index[i] for i in sorted(by_index)]
        out.append((dataclasses.replace(first, parts=parts), pieces[0]))  # type: ignore[arg-type]
    return out


def _converted(message: Message) -> ModelMessage:
    """A model message saying what ``message``, which no model message was stored in, says."""
    text = message.text
    if message.role in (Role.SYSTEM, Role.DEVELOPER):
        return ModelRequest(parts=[SystemPromptPart(text)])
    if message.role is Role.USER:
        return ModelRequest(parts=[UserPromptPart(text)])
    if message.role is Role.TOOL:
        return ModelRequest(
            parts=[
                ToolReturnPart(
                    tool_name=message.name or "tool",
                    content=text,
                    tool_call_id=message.tool_call_id or "-",
                )
            ]
        )
    parts: list[Any] = [ModelTextPart(text)] if text else []
    parts.extend(ToolCallPart(c.name, c.arguments, tool_call_id=c.id) for c in message.tool_calls)
    return ModelResponse(parts=parts)


class ZerdaMessageHistory:
    """A Pydantic AI conversation's ``list[ModelMessage]`` in a Zerda store.

    ``store`` holds it (default: a new :class:`~zerda.stores.InMemoryStore`); or give
    ``memory``, a Zerda memory on ``session_id``, whose store holds it and whose writes record
    it (a token memory stores each message's count as it is added)::

        history = ZerdaMessageHistory("alice", store=SQLiteStore("chat.db"))
        result = agent.run_sync("Hi", message_history=history.load())
        history.save(result.new_messages())

    Save what a run added (``result.new_messages()``), not ``all_messages()``: a history
    processor that trims the history trims ``all_messages()`` too. ``load()`` gives back
    messages equal to those saved, in order. Each save is one atomic append.
    """

    def __init__(
        self,
        session_id: str,
        *,
        store: Store | AsyncStore | None = None,
        memory: BaseMemory[Any] | None = None,
    ) -> None:
        self.memory = memory_on("ZerdaMessageHistory", session_id, store, memory)
        given = self.memory.store
        self._sync: Store | None = given if isinstance(given, Store) else None
        self._async: AsyncStore = as_async(given)

    @property
    def session_id(self) -> str:
        return self.memory.session_id

    @property
    def store(self) -> Store | AsyncStore:
        return self.memory.store

    def _io(self) -> Store:
        if self._sync is None:
            raise ConfigurationError(
                f"{type(self.store).__name__} is an async store: use aload, asave and aclear"
            )
        return self._sync

    def load(self, *, turns: int | None = None) -> list[ModelMessage]:
        """The stored messages, oldest first; with ``turns``, those of the newest ``turns``
        turns only (and the system prompts), read from the end of the session, so that the
        cost is that of what is returned."""
        return self._messages(self._read(turns, self._io()))

    async def aload(self, *, turns: int | None = None) -> list[ModelMessage]:
        """:meth:`load`, through the store's async methods."""
        _check_turns(turns)
        if turns is None:
            stored = await self._async.ahistory(self.session_id)
        else:
            tail = await self._async.atail(self.session_id, turns, None)
            stored = [*tail.system, *tail.messages]
        return self._messages(stored)

    def _read(self, turns: int | None, store: Store) -> list[Message]:
        _check_turns(turns)
        if turns is None:
            return store.history(self.session_id)
        tail = store.tail(self.session_id, turns, None)
        return [*tail.system, *tail.messages]

    @staticmethod
    def _messages(stored: Sequence[Message]) -> list[ModelMessage]:
        return [message for message, _ in _read_back(stored)]

    def save(self, messages: Iterable[ModelMessage]) -> None:
        """Append ``messages`` (what a run added: ``result.new_messages()``) as one atomic
        batch."""
        batch = _stored_batch(messages, "save")
        if batch:
            self.memory.add_messages(batch)

    async def asave(self, messages: Iterable[ModelMessage]) -> None:
        """:meth:`save`, through the store's async methods."""
        batch = _stored_batch(messages, "asave")
        if batch:
            await self.memory.aadd_messages(batch)

    def clear(self) -> None:
        """Forget the conversation: its messages and its metadata."""
        self.memory.clear()

    async def aclear(self) -> None:
        await self.memory.aclear()

    def __repr__(self) -> str:
        return f"ZerdaMessageHistory({self.session_id!r}, store={type(self.store).__name__})"


def _check_turns(turns: int | None) -> None:
    if turns is not None and (isinstance(turns, bool) or not isinstance(turns, int) or turns < 0):
        raise ConfigurationError(f"turns must be a non-negative integer or None, got {turns!r}")


# -- Pydantic AI's ConversationStore over a Zerda store ---------------------------------------

RECORD_KEY = "pydantic_ai.record"
"""The session metadata key holding a conversation's ``ConversationRecord`` (its JSON)."""

if _conversation_store is not None:
    _cs = _conversation_store
    _RECORD: pydantic.TypeAdapter[Any] = pydantic.TypeAdapter(_cs.ConversationRecord)

    class ZerdaConversationStore(_cs.ConversationStore):
        """Pydantic AI's ``ConversationStore`` over a Zerda store: each conversation is the
        Zerda session of its ``conversation_id``.

        The entries a save adds are appended to the session (one atomic batch), stored as
        :class:`ZerdaMessageHistory` stores messages, with the entry's id and its parent's in
        ``metadata["pydantic_ai"]``; the record is the session's metadata key
        :data:`RECORD_KEY`, written by compare-and-set on the record read, so that of two saves
        from one revision only one succeeds. A fork's own session holds only the entries it
        added; what it shares is read from the conversation it was forked from. The log of a
        session holds every entry saved to it in the order saved, branches included: a Zerda
        memory over it reads them all. ``delete`` deletes the session with its entries, unless
        another conversation was forked from it (then its entries stay, unlisted).
        """

        def __init__(self, store: Store | AsyncStore | None = None) -> None:
            given = store if store is not None else InMemoryStore()
            if not isinstance(given, (Store, AsyncStore)):
                raise ConfigurationError(
                    f"ZerdaConversationStore takes a Zerda store, got {type(given).__name__}"
                )
            self.store = given
            self._io: AsyncStore = as_async(given)
            self._where: dict[str, str] = {}  # entry id -> the session holding it

        # -- the record ---------------------------------------------------------------------

        async def _raw_record(self, conversation_id: str) -> Any:
            return (await self._io.aget_metadata(conversation_id)).get(RECORD_KEY)

        def _record_of(self, raw: Any) -> Any:
            record = _RECORD.validate_python(raw)
            for entry in (record.head_id, *record.branches):
                if entry is not None:
                    self._where.setdefault(entry, record.conversation_id)
            if record.forked_at is not None and record.forked_from is not None:
                self._where.setdefault(record.forked_at, record.forked_from)
            return record

        async def read_record(self, conversation_id: str) -> Any:
            raw = await self._raw_record(conversation_id)
            return None if raw is None else self._record_of(raw)

        async def read_records(self, *, scope: str | None = None, limit: int | None = None) -> Any:
            records = []
            for info in await self._io.alist_sessions():
                record = await self.read_record(info.session_id)
                if record is not None and (scope is None or record.scope == scope):
                    records.append(record)
            records.sort(key=lambda r: r.updated_at, reverse=True)
            return records[:limit]

        async def write_record(
            self,
            record: Any,
            *,
            new_entries: Sequence[Any] = (),
            expected_revision: str | None,
        ) -> None:
            cid = record.conversation_id
            raw = await self._raw_record(cid)
            stored = None if raw is None else self._record_of(raw)
            if (stored.revision if stored is not None else None) != expected_revision:
                raise _cs.ConversationConflict(cid)
            new_ids = {entry.id for entry in new_entries}
            head = record.head_id
            if head is not None and head not in new_ids and not await self._session_of(head, cid):
                raise _cs.ConversationConflict(cid)
            if stored is not None:
                record = dataclasses.replace(record, title=stored.title, metadata=stored.metadata)
            batch = [
                m
                for entry in new_entries
                for m in _stored(entry.message, entry.id, {"parent": entry.parent_id})
            ]
            if batch:
                await self._io.aappend(cid, batch)
            value = _RECORD.dump_python(record, mode="json")
            if not await self._io.acompare_and_set(cid, RECORD_KEY, raw, value):
                if batch:  # another writer won: take back what this one appended
                    await self._io.adelete_messages(cid, [m.id for m in batch if m.id])
                raise _cs.ConversationConflict(cid)
            for entry_id in new_ids:
                self._where[entry_id] = cid

        async def write_details(
            self,
            conversation_id: str,
            details: Any,
            *,
            expected_revision: str,
            expected: Any = None,
        ) -> Any:
            raw = await self._raw_record(conversation_id)
            stored = None if raw is None else self._record_of(raw)
            if stored is None or stored.revision != expected_revision:
                raise _cs.ConversationConflict(conversation_id)
            if expected and any(getattr(stored, key) != value for key, value in expected.items()):
                raise _cs.ConversationConflict(conversation_id)
            changed = dataclasses.replace(stored, **dict(details))
            value = _RECORD.dump_python(changed, mode="json")
            if not await self._io.acompare_and_set(conversation_id, RECORD_KEY, raw, value):
                raise _cs.ConversationConflict(conversation_id)
            return changed

        async def delete_record(self, conversation_id: str, *, expected_revision: str) -> None:
            raw = await self._raw_record(conversation_id)
            stored = None if raw is None else self._record_of(raw)
            if stored is None or stored.revision != expected_revision:
                raise _cs.ConversationConflict(conversation_id)
            if not await self._io.acompare_and_set(conversation_id, RECORD_KEY, raw, None):
                raise _cs.ConversationConflict(conversation_id)
            forks = [r for r in await self.read_records() if r.forked_from == conversation_id]
            if not forks:
                await self._io.adelete_session(conversation_id)
                self._where = {e: s for e, s in self._where.items() if s != conversation_id}

        # -- the entries --------------------------------------------------------------------

        async def _entries(self, session_id: str) -> dict[str, Any]:
            """The entries the session holds, by id."""
            out: dict[str, Any] = {}
            for message, kept in _read_back(await self._io.ahistory(session_id)):
                if kept is None:
                    continue
                entry_id = kept["group"]
                parent = kept.get("parent")
                out[entry_id] = _cs.ConversationEntry(
                    id=entry_id,
                    parent_id=parent if isinstance(parent, str) else None,
                    message=message,
                )
                self._where[entry_id] = session_id
            return out

        async def _session_of(self, entry_id: str, hint: str | None = None) -> str | None:
            """The session holding the entry ``entry_id``: known from a record or a read, or
            found by reading the sessions (``hint`` first)."""
            known = self._where.get(entry_id)
            if known is not None:
                return known
            sessions = [info.session_id for info in await self._io.alist_sessions()]
            for session_id in ([hint] if hint else []) + sessions:
                if entry_id in await self._entries(session_id):
                    return session_id
            return None

        async def read_history(self, head_id: str | None, *, limit: int | None = None) -> Any:
            """The entries up to ``head_id``, oldest first (the last ``limit`` of them): one
            read of each session the history lies in."""
            out: list[Any] = []
            entry_id = head_id
            cache: dict[str, dict[str, Any]] = {}
            while entry_id is not None and (limit is None or len(out) < limit):
                session_id = await self._session_of(entry_id)
                if session_id is None:
                    raise LookupError(entry_id)
                if session_id not in cache:
                    cache[session_id] = await self._entries(session_id)
                entries = cache[session_id]
                if entry_id not in entries:
                    self._where.pop(entry_id, None)
                    raise LookupError(entry_id)
                while entry_id in entries and (limit is None or len(out) < limit):
                    entry = entries[entry_id]
                    out.append(entry)
                    entry_id = entry.parent_id
            out.reverse()
            return out

        async def read_entry(self, entry_id: str) -> Any:
            session_id = await self._session_of(entry_id)
            entries = await self._entries(session_id) if session_id is not None else {}
            if entry_id not in entries:
                raise LookupError(entry_id)
            return entries[entry_id]

        def __repr__(self) -> str:
            return f"ZerdaConversationStore({type(self.store).__name__})"

else:  # pragma: no cover - a Pydantic AI without conversation stores

    class ZerdaConversationStore:  # type: ignore[no-redef]
        """Needs a Pydantic AI with ``pydantic_ai.conversation_store``."""

        def __init__(self, store: Store | AsyncStore | None = None) -> None:
            raise ConfigurationError(
                "ZerdaConversationStore needs a Pydantic AI with conversation stores "
                "(pydantic_ai.conversation_store): upgrade pydantic-ai-slim"
            )
