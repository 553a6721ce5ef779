"""Strands Agents integration: Zerda's turns, budgets and repair as a conversation manager, and an
agent's messages and state in any Zerda store as a session manager.

``ZerdaConversationManager(token_limit=...)`` or ``ZerdaConversationManager(k=...)`` is a
Strands ``ConversationManager``: give it to ``Agent(conversation_manager=...)``. After each
invocation (and, with ``per_turn``, before each model call) it keeps in ``agent.messages`` the
newest whole turns that fit, repaired as a Zerda memory repairs a context: the history opens on a
user prompt (never on an assistant message or a bare ``toolResult``), a ``toolUse`` is never kept
without its ``toolResult``. On a context-window overflow it always makes progress or says why it
cannot. The messages it keeps are the very objects it was given.

``ZerdaSessionManager(session_id, store=...)`` is a Strands ``SessionManager`` (a
``RepositorySessionManager`` over a ``SessionRepository`` written on Zerda's store primitives):
give it to ``Agent(session_manager=...)`` where a ``FileSessionManager`` goes. Each Strands
message is stored as Zerda messages (one per ``toolResult``, else one), so that the ``zerda``
CLI, the inspector and every Zerda memory read the conversation, each with the JSON of the
blocks it stands for in ``metadata["strands"]``: what Strands reads back is equal to what it
wrote, blocks Zerda does not model included. The agent's state and its conversation manager's
state go into the session's metadata.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, NamedTuple

from zerda._media import data_url
from zerda.errors import (
    ConfigurationError,
    ContextOverflowError,
    CorruptDataError,
    InvalidMessageError,
)
from zerda.integrations._json import shown, storable
from zerda.integrations._memory import memory_on, selecting_memory
from zerda.memory import (
    BaseMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
)
from zerda.memory._flow import DeleteMessages, Flow, drive
from zerda.memory._record import forget_summary
from zerda.messages import Message, Role, ToolCall, new_message_id
from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart
from zerda.stores import AsyncStore, InMemoryStore, Store
from zerda.tokens import TokenCounter, TokenCounterLike

try:
    from strands.agent.conversation_manager import (
        ConversationManager,
        ProactiveCompressionConfig,
    )
    from strands.hooks import BeforeModelCallEvent, HookRegistry
    from strands.session import RepositorySessionManager, SessionRepository
    from strands.types.exceptions import ContextWindowOverflowException, SessionException
    from strands.types.session import (
        Session,
        SessionAgent,
        SessionMessage,
        decode_bytes_values,
        encode_bytes_values,
    )
except ImportError as exc:  # pragma: no cover - exercised only without strands-agents
    raise ImportError(
        "zerda.integrations.strands needs strands-agents: pip install 'zerda-memory[strands]'"
    ) from exc

if TYPE_CHECKING:
    from strands.agent.agent import Agent
    from strands.multiagent.base import MultiAgentBase
    from strands.types.agent import LocalAgent

__all__ = ["METADATA_KEY", "ZerdaConversationManager", "ZerdaSessionManager"]

METADATA_KEY = "strands"
"""The message ``metadata`` key under which a stored Zerda message keeps what it stands for:
``{"index": <the Strands message_id>, "message": <the Strands message holding only the content
blocks this Zerda message stands for, bytes base64-encoded as Strands encodes them (as JSON text
where it nests too deep for metadata)>, "created_at", "updated_at": <the SessionMessage's>}``,
and, where they apply: ``"group"``: the id of the first Zerda message of the Strands message
(absent on that first one), ``"blocks"``: the indexes of the blocks it stands for (absent when
it stands for all of them), ``"redacted"``: true on the first one of a redacted message, with
the ``"original"`` beside the redaction when it differs, and ``"updated"``: true on a message
stored again by an update."""

_SESSION_KEY = "strands.session"
_AGENTS_KEY = "strands.agents"
_AGENT_KEY = "strands.agent"
_MULTI_AGENT_PREFIX = "strands.multi_agent:"
_DEFAULT_AGENT_ID = "default"

_log = logging.getLogger("zerda.integrations.strands")

_DOCUMENT_TYPES = {
    "pdf": "application/pdf",
    "csv": "text/csv",
    "doc": "application/msword",
    "docx": "application/vnd.openxmlformats-officedocument.wordprocessingml.document",
    "xls": "application/vnd.ms-excel",
    "xlsx": "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet",
    "html": "text/html",
    "txt": "text/plain",
    "md": "text/markdown",
}

# -- Strands content blocks -> Zerda parts ------------------------------------------------------
#
# Strands messages are Bedrock Converse messages: a role ("user" or "assistant") and a list of
# content blocks. zerda.formats has no Converse converter, so this module has its own, one way:
# Zerda needs the turns and the token counts, never a Strands message made from a Zerda one
# (the session keeps each message's own JSON). What Zerda models (text, reasoning, images,
# documents, audio, tool calls and results) becomes its parts; anything else (a citation, a
# guard block, a block type newer than this release) is counted as its JSON, bytes left out.


def _source_bytes(media: Mapping[str, Any]) -> bytes | None:
    source = media.get("source")
    data = source.get("bytes") if isinstance(source, Mapping) else None
    return bytes(data) if isinstance(data, (bytes, bytearray)) else None


def _source_uri(media: Mapping[str, Any]) -> str | None:
    source = media.get("source")
    location = source.get("location") if isinstance(source, Mapping) else None
    uri = location.get("uri") if isinstance(location, Mapping) else None
    return uri if isinstance(uri, str) and uri else None


def _media(kind: str, media: object) -> Part | None:
    """An image, document, audio or video block as the Zerda part that costs what it does (by
    the providers' formulas: an image by its size, a PDF by its pages); ``None`` for one that
    holds neither bytes nor a location."""
    if not isinstance(media, Mapping):
        return None
    fmt = media.get("format")
    fmt = fmt if isinstance(fmt, str) and fmt else "bin"
    data = _source_bytes(media)
    encoded = base64.b64encode(data).decode("ascii") if data else None
    uri = _source_uri(media)
    if encoded is None and uri is None:
        return None
    if kind == "image":
        url = data_url(f"image/{fmt}", encoded) if encoded is not None else uri
        return ImagePart(url, media_type=f"image/{fmt}")
    if kind == "audio" and encoded is not None:
        return AudioPart(encoded, fmt)
    media_type = _DOCUMENT_TYPES.get(fmt) if kind == "document" else f"{kind}/{fmt}"
    name = media.get("name")
    return FilePart(
        data_url(media_type or "application/octet-stream", encoded) if encoded else None,
        url=uri if encoded is None else None,
        filename=name if isinstance(name, str) and name else None,
        media_type=media_type,
    )


def _parts_of(block: object) -> list[Part]:
    """What the model reads of one content block (that is not a call or a result of this
    message's own), as Zerda parts."""
    if not isinstance(block, Mapping):
        return [TextPart(shown(block))]
    text = block.get("text")
    if isinstance(text, str):
        return [TextPart(text)]
    if "cachePoint" in block and len(block) == 1:
        return []  # a marker for the provider's cache: nothing the model reads
    for kind in ("image", "document", "audio", "video"):
        if kind in block:
            part = _media(kind, block[kind])
            return [part] if part is not None else [TextPart(shown(block))]
    reasoning = block.get("reasoningContent")
    if isinstance(reasoning, Mapping):
        said = reasoning.get("reasoningText")
        hidden = reasoning.get("redactedContent")
        if isinstance(said, Mapping) and isinstance(said.get("text", ""), str):
            signature = said.get("signature")
            return [
                ReasoningPart(
                    said.get("text", ""),
                    signature=signature if isinstance(signature, str) else None,
                )
            ]
        if isinstance(hidden, (bytes, bytearray)):
            return [ReasoningPart("", encrypted=base64.b64encode(hidden).decode("ascii"))]
    for kind in ("injected", "summary"):
        inner = block.get(kind)
        if isinstance(inner, Mapping) and isinstance(inner.get("text"), str):
            return [TextPart(inner["text"])]
    guard = block.get("guardContent")
    if isinstance(guard, Mapping):
        inner = guard.get("text")
        if isinstance(inner, Mapping) and isinstance(inner.get("text"), str):
            return [TextPart(inner["text"])]
    return [TextPart(shown(block))]


def _result_parts(result: Mapping[str, Any]) -> list[Part]:
    """What a ``toolResult`` tells the model: its content items as parts."""
    items = result.get("content")
    if not isinstance(items, list):
        return [TextPart(shown(items))] if items is not None else []
    parts: list[Part] = []
    for item in items:
        if isinstance(item, Mapping) and "json" in item:
            parts.append(TextPart(json.dumps(item["json"], ensure_ascii=False, default=repr)))
        else:
            parts.extend(_parts_of(item))
    return parts


def _content(parts: list[Part], calls: bool = False) -> str | tuple[Part, ...] | None:
    if not parts:
        return None if calls else ""
    if len(parts) == 1 and type(parts[0]) is TextPart and not parts[0].extra:
        return parts[0].text
    return tuple(parts)


def _arguments(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=repr)


_NO_METADATA: Mapping[str, Any] = MappingProxyType({})
"""Empty metadata that :class:`Message` takes without checking it again."""


class _Piece(NamedTuple):
    """One Zerda message standing for some content blocks of a Strands message: their
    indexes, and for an assistant message the block index and Zerda id of each call."""

    message: Message
    blocks: tuple[int, ...]
    calls: tuple[tuple[int, str], ...] = ()


class _Raw(NamedTuple):
    """A piece before it is a message (each message is built, and so checked, once)."""

    role: Role
    content: str | tuple[Part, ...] | None
    blocks: tuple[int, ...]
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    calls: tuple[tuple[int, str], ...] = ()


def _pieces(
    message: object,
    where: str,
    group: str,
    calls: dict[str, str] | None,
    *,
    pending: bool = False,
    metadata: Callable[[int, tuple[int, ...]], Mapping[str, Any]] | None = None,
    created_at: float | None = None,
) -> list[_Piece]:
    """The Zerda messages that stand for a Strands message.

    A user message without ``toolResult`` blocks is one user message (a turn starts there, as
    it does where Strands' own trimming may start). A user message with results is one tool
    message per result, its other blocks counted with the result before them, so that it never
    starts a turn. An assistant message is one assistant message, its ``toolUse`` blocks its
    calls, unless ``pending``: the calls of an agent's last message may be waiting for their
    results (an interrupt, a stopped run), which Strands adds when the next prompt comes, so
    they are only counted, never taken out.

    ``calls`` maps each ``toolUseId`` seen so far to its Zerda id, unique per block, so that a
    result answers the call Strands pairs it with (the latest before it) even when a model
    reuses ids; ``None``: the ids as they are (for a message stored alone). The pieces' ids are
    ``group``, ``group.1``, ...; ``metadata`` gives each piece's from its number and blocks.
    """
    if not isinstance(message, Mapping):
        raise InvalidMessageError(
            f"{where} must be a Strands message (a dict with 'role' and 'content'), "
            f"got {type(message).__name__}"
        )
    content = message.get("content")
    role = message.get("role")
    if not isinstance(content, list):
        raise InvalidMessageError(
            f"{where}: a Strands message's content is a list of content blocks, got "
            f"{type(content).__name__}"
        )
    if not isinstance(role, str):
        raise InvalidMessageError(f"{where}: a Strands message's role is a string, got {role!r}")
    if role == "user":
        raws = _user_pieces(content, calls)
    else:
        raws = [_assistant_piece(content, group, calls, pending)]
    out = []
    for j, raw in enumerate(raws):
        kept: Mapping[str, Any] = _NO_METADATA if metadata is None else metadata(j, raw.blocks)
        made = Message(
            raw.role,
            raw.content,
            tool_calls=raw.tool_calls,
            tool_call_id=raw.tool_call_id,
            metadata=kept,
            created_at=created_at,
            id=group if j == 0 else f"{group}.{j}",
        )
        out.append(_Piece(made, raw.blocks, raw.calls))
    return out


def _result_of(block: object) -> Mapping[str, Any] | None:
    if isinstance(block, Mapping):
        result = block.get("toolResult")
        if isinstance(result, Mapping):
            return result
    return None


def _user_pieces(content: list[Any], calls: dict[str, str] | None) -> list[_Raw]:
    results = [k for k, block in enumerate(content) if _result_of(block) is not None]
    if not results:
        parts = [p for block in content for p in _parts_of(block)]
        return [_Raw(Role.USER, _content(parts), tuple(range(len(content))))]
    owner: dict[int, list[int]] = {k: [] for k in results}
    current = results[0]
    for k in range(len(content)):
        if k in owner:
            current = k
        owner[current].append(k)
    out = []
    for k in results:
        result = _result_of(content[k])
        assert result is not None
        parts = _result_parts(result)
        for other in owner[k]:
            if other != k:
                parts.extend(_parts_of(content[other]))
        call_id = _answered(result, k, calls)
        out.append(_Raw(Role.TOOL, _content(parts), tuple(owner[k]), tool_call_id=call_id))
    return out


def _answered(result: Mapping[str, Any], k: int, calls: dict[str, str] | None) -> str:
    """The Zerda id of the call a result answers; a result of no call seen gets an id no call
    has, so that repair leaves it out."""
    call_id = result.get("toolUseId")
    if not isinstance(call_id, str) or not call_id:
        return f"-#orphan.{k}"
    if calls is None:
        return call_id
    return calls.get(call_id, f"{call_id}#orphan.{k}")


def _assistant_piece(
    content: list[Any], group: str, calls: dict[str, str] | None, pending: bool
) -> _Raw:
    parts: list[Part] = []
    made: list[ToolCall] = []
    at: list[tuple[int, str]] = []
    for k, block in enumerate(content):
        use = block.get("toolUse") if isinstance(block, Mapping) else None
        call_id = use.get("toolUseId") if isinstance(use, Mapping) else None
        if isinstance(use, Mapping) and isinstance(call_id, str) and call_id and not pending:
            zid = call_id
            if calls is not None:
                zid = f"{call_id}#{group}.{k}"
                calls[call_id] = zid
            name = use.get("name")
            name = name if isinstance(name, str) and name else "tool"
            made.append(ToolCall(zid, name, _arguments(use.get("input"))))
            at.append((k, zid))
        else:
            parts.extend(_parts_of(block))
    return _Raw(
        Role.ASSISTANT,
        _content(parts, bool(made)),
        tuple(range(len(content))),
        tool_calls=tuple(made),
        calls=tuple(at),
    )


# -- the conversation manager -------------------------------------------------------------------


class _Stuck(Exception):
    """Nothing more can be dropped from an agent's messages; says why."""


def _changed(kept: Sequence[object], messages: Sequence[object]) -> bool:
    return len(kept) != len(messages) or any(
        a is not b for a, b in zip(kept, messages, strict=False)
    )


def _back(
    context: Sequence[Message],
    pieces: Mapping[str, tuple[int, _Piece]],
    messages: Sequence[Any],
) -> tuple[list[Any], int]:
    """The Strands messages ``context`` (Zerda messages made by :func:`_pieces`, chosen and
    repaired by a memory) stands for, in its order, and how many of the agent's oldest messages
    none of them is.

    A message kept whole is the object given. One only some of whose blocks are kept (a call
    repair took out, a result of no call) is a copy holding those blocks. The results repair
    placed right after their calls are one user message, as Bedrock wants them: a copy of the
    first message they come from, holding them all, when they come from several."""
    groups: list[tuple[bool, list[tuple[int, int]]]] = []  # (results?, [(message, block)])
    for sent in context:
        i, piece = pieces[sent.id or ""]
        blocks = piece.blocks
        if piece.calls and len(sent.tool_calls) != len(piece.calls):
            kept = {c.id for c in sent.tool_calls}
            gone = {k for k, zid in piece.calls if zid not in kept}
            blocks = tuple(b for b in blocks if b not in gone)
        results = sent.role is Role.TOOL
        last = groups[-1] if groups else None
        if last is not None and (
            (results and last[0]) or (not results and not last[0] and last[1][0][0] == i)
        ):
            last[1].extend((i, b) for b in blocks)
        else:
            groups.append((results, [(i, b) for b in blocks] or [(i, -1)]))
    times: dict[int, int] = {}
    for _, members in groups:
        for i in dict.fromkeys(i for i, _ in members):
            times[i] = times.get(i, 0) + 1
    out: list[Any] = []
    seen: set[int] = set()
    for _, members in groups:
        first = members[0][0]
        original = messages[first]
        sources = dict.fromkeys(i for i, _ in members)
        chosen = sorted({b for i, b in members if b >= 0})
        if (
            len(sources) == 1
            and times[first] == 1
            and chosen == list(range(len(original["content"])))
        ):
            out.append(original)
        else:
            copy = dict(original)
            copy["content"] = [
                messages[i]["content"][b]
                for i in sources
                for b in sorted({b for j, b in members if j == i and b >= 0})
            ]
            if (
                first in seen
            ):  # a message split in two by repair: one tracking id, on its first part
                copy.pop("tracking_id", None)
            out.append(copy)
        seen.update(sources)
    return out, min((i for _, members in groups for i, _ in members), default=len(messages))


class ZerdaConversationManager(ConversationManager):
    """A Strands ``ConversationManager`` that keeps what a Zerda memory would.

    ``k``: the last ``k`` turns; ``token_limit``: the newest whole turns within that many
    tokens, counted by ``counter`` (Zerda's default counter when unset), less
    ``reserve_tokens`` (room for the system prompt, the tools and the reply); neither: every
    turn. A turn is a user prompt and everything after it up to the next prompt: the model's
    ``toolUse`` messages and the ``toolResult`` messages that answer them stay in the turn of
    the prompt they serve. What is kept is repaired as Zerda repairs a context: the history
    opens on a user prompt (never on an assistant message or a bare ``toolResult``), a
    ``toolResult`` whose ``toolUse`` is gone is left out, a ``toolUse`` without its result is
    taken out of its message (except in the agent's last message, whose calls Strands answers
    when the next prompt comes). ``strict=True`` raises instead of repairing.

    ``apply_management`` runs after each invocation, and with ``per_turn`` (``True``, or every
    ``n`` model calls) before model calls too: it trims ``agent.messages`` in place, keeping
    the objects it keeps. When the newest turn alone is over ``token_limit`` (a tool-heavy
    turn), its oldest tool exchanges go, its prompt and its newest exchange stay.

    ``reduce_context`` runs when the model says the context window overflowed: it keeps what
    ``apply_management`` would, and at least halves the turns held (the oldest go); with one
    turn left, at least the older half of its tool exchanges go. When only the prompt and its
    newest exchange are left it raises ``ContextWindowOverflowException`` saying so.

    ``removed_message_count`` counts the agent's oldest messages that are gone, which is where
    a Strands session manager starts reading the session again on restore.
    """

    def __init__(
        self,
        *,
        k: int | None = None,
        token_limit: int | None = None,
        counter: TokenCounterLike | None = None,
        reserve_tokens: int = 0,
        per_turn: bool | int = False,
        strict: bool = False,
        proactive_compression: bool | ProactiveCompressionConfig | None = None,
    ) -> None:
        if not isinstance(per_turn, bool) and (not isinstance(per_turn, int) or per_turn <= 0):
            raise ConfigurationError(
                f"per_turn must be True, False or a positive integer, got {per_turn!r}"
            )
        if not isinstance(strict, bool):
            raise ConfigurationError(f"strict must be a bool, got {strict!r}")
        super().__init__(proactive_compression=proactive_compression)
        self.k = k
        self.token_limit = token_limit
        self.reserve_tokens = reserve_tokens
        self.per_turn = per_turn
        self.strict = strict
        self._model_calls = 0
        self._counter: TokenCounter | None = None
        self._budget = 0
        self._make = selecting_memory(
            "ZerdaConversationManager",
            k=k,
            token_limit=token_limit,
            counter=counter,
            reserve_tokens=reserve_tokens,
            overflow="raise",
            strict=strict,
        )
        probe = self._make(InMemoryStore())
        if isinstance(probe, ConversationTokenBufferMemory):
            self._counter = probe.token_counter
            self._budget = probe.budget

    # -- the Strands protocol ----------------------------------------------------------------------

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        super().register_hooks(registry, **kwargs)
        registry.add_callback(BeforeModelCallEvent, self._before_model_call)

    def _before_model_call(self, event: BeforeModelCallEvent) -> None:
        if self.per_turn is False:
            return
        self._model_calls += 1
        if self.per_turn is True or self._model_calls % self.per_turn == 0:
            self.apply_management(event.agent)

    def get_state(self) -> dict[str, Any]:
        return {**super().get_state(), "model_call_count": self._model_calls}

    def restore_from_session(self, state: dict[str, Any]) -> list[Any] | None:
        restored = super().restore_from_session(state)
        calls = state.get("model_call_count", 0)
        self._model_calls = calls if isinstance(calls, int) else 0
        return restored

    def apply_management(self, agent: Agent, **kwargs: Any) -> None:
        """Keep in ``agent.messages`` the turns the policy keeps, repaired (see the class)."""
        self._manage(agent, reduce=False, error=None)

    def reduce_context(self, agent: Agent, e: Exception | None = None, **kwargs: Any) -> None:
        """Drop at least half the turns held, or with one turn left the older half of its tool
        exchanges; raise ``ContextWindowOverflowException`` (from ``e``) when nothing can go.
        Without ``e`` (proactive compression) the same, but nothing is raised."""
        self._manage(agent, reduce=True, error=e)

    # -- the choice --------------------------------------------------------------------------------

    def _manage(self, agent: Agent, *, reduce: bool, error: Exception | None) -> None:
        messages = agent.messages
        if not isinstance(messages, list):
            raise InvalidMessageError(
                f"agent.messages must be a list of Strands messages, got {type(messages).__name__}"
            )
        try:
            plan = self._plan(messages, reduce=reduce)
            if plan is None and reduce:
                raise _Stuck("nothing in the agent's messages can go")
        except _Stuck as stuck:
            if error is not None:
                raise ContextWindowOverflowException(
                    f"ZerdaConversationManager cannot reduce the context any further: {stuck}"
                ) from error
            _log.debug("proactive reduction made no progress: %s", stuck)
            return
        if plan is None:
            return
        kept, dropped = plan
        messages[:] = kept
        self.removed_message_count += dropped

    def _plan(self, messages: list[Any], *, reduce: bool) -> tuple[list[Any], int] | None:
        """What ``agent.messages`` becomes and how many of its oldest messages go; ``None``
        when it stays as it is. :class:`_Stuck` when ``reduce`` finds nothing to drop."""
        if not messages:
            if reduce:
                raise _Stuck("the agent holds no messages")
            return None
        calls: dict[str, str] = {}
        last = len(messages) - 1
        pieces: dict[str, tuple[int, _Piece]] = {}
        batch: list[Message] = []
        for i, message in enumerate(messages):
            where = f"agent.messages[{i}]"
            for piece in _pieces(message, where, str(i), calls, pending=i == last):
                pieces[piece.message.id or ""] = (i, piece)
                batch.append(piece.message)
        users = sum(m.role is Role.USER for m in batch)
        if not users:
            if reduce:
                raise _Stuck("the agent holds no user prompt to keep a turn of")
            return None  # nothing a context could open on: left as it is
        store = InMemoryStore()
        memory = self._make(store)
        memory.add_messages(batch)
        try:
            context: list[Message] | None = memory.get_context()
        except ContextOverflowError:
            context = None  # the newest turn alone is over the budget
        if context is not None:
            if reduce and users > 1 and sum(m.role is Role.USER for m in context) > users // 2:
                context = self._window(store, users // 2)
            kept = _back(context, pieces, messages)
            if _changed(kept[0], messages):
                return kept
            if not reduce or users > 1:
                return None  # (a reduction that changed nothing is _manage's to refuse)
        return self._within_newest_turn(store, pieces, messages, reduce=reduce and users == 1)

    def _window(self, store: Store, k: int) -> list[Message]:
        return ConversationBufferWindowMemory(k=k, store=store, strict=self.strict).get_context()

    def _within_newest_turn(
        self,
        store: Store,
        pieces: Mapping[str, tuple[int, _Piece]],
        messages: list[Any],
        *,
        reduce: bool,
    ) -> tuple[list[Any], int] | None:
        """The newest turn alone, less its oldest tool exchanges: as many as the budget needs,
        and with ``reduce`` the older half at least. Its prompt and its newest exchange always
        stay, so it still opens on the prompt and keeps pairs whole."""
        turn = self._window(store, 1)
        head = turn[:1]
        units: list[list[Message]] = []
        for m in turn[1:]:
            if m.role is Role.ASSISTANT or not units:
                units.append([m])
            else:
                units[-1].append(m)
        droppable = len(units) - 1
        drop = (droppable + 1) // 2 if reduce else 0  # the older half, at least one
        if self._counter is not None:
            count = self._counter.count_message
            room = self._budget - self._counter.count_messages([])
            costs = [sum(count(m) for m in unit) for unit in units]
            used = sum(count(m) for m in head) + sum(costs[drop:])
            while drop < droppable and used > room:
                used -= costs[drop]
                drop += 1
        kept = _back([*head, *(m for unit in units[drop:] for m in unit)], pieces, messages)
        if _changed(kept[0], messages):
            return kept
        if reduce:
            raise _Stuck(
                "only the newest turn is left, as its prompt and its newest tool exchange, "
                "which cannot be split; shorten what its tools return or use a model with a "
                "larger context window"
            )
        return None

    def __repr__(self) -> str:
        if self.token_limit is not None:
            return f"ZerdaConversationManager(token_limit={self.token_limit})"
        if self.k is not None:
            return f"ZerdaConversationManager(k={self.k})"
        return "ZerdaConversationManager()"


# -- the session manager ------------------------------------------------------------------------

_FIRST_TURNS = 8
"""Turns a read from the end of an agent's session asks for first; doubled until enough."""


class _Group(NamedTuple):
    """The stored Zerda messages of one Strands message, in the order the store holds them;
    ``moved``: stored again by an update, after messages numbered after it."""

    message_id: int
    group: str
    pieces: list[Message]
    moved: bool


def _reaches(groups: list[_Group], message_id: int) -> bool:
    """Whether ``groups``, the newest of a session, hold every message numbered from
    ``message_id`` on: Strands numbers messages in the order it stores them, so they do once
    one numbered ``message_id`` or less is among them, not counting one an update moved to
    the end (it was stored after every message that was there, and before any stored later)."""
    return any(g.message_id <= message_id for g in groups if not g.moved)


def _epoch(iso: object) -> float | None:
    if not isinstance(iso, str):
        return None
    try:
        return datetime.fromisoformat(iso).timestamp()
    except ValueError:
        return None


def _dumped(value: object, what: str) -> Any:
    """``value`` as message metadata keeps it: its JSON value, bytes base64-encoded as Strands
    encodes them, or that as JSON text where it nests too deep for metadata."""
    encoded = encode_bytes_values(value)
    if storable(encoded, 2):  # metadata["strands"]["message"]
        return encoded
    try:
        return json.dumps(encoded, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidMessageError(f"{what} is not JSON, which every store keeps: {exc}") from None


def _loaded(value: Any) -> Any:
    """What :func:`_dumped` kept, as it was."""
    return decode_bytes_values(json.loads(value) if isinstance(value, str) else value)


def _stored(session_message: SessionMessage, where: str, *, updated: bool = False) -> list[Message]:
    """The Zerda messages that store ``session_message``: the pieces of what it says (its
    redaction, if it has one), each with that message holding only the blocks the piece
    stands for, its other fields as they are. A redacted message's first piece also keeps the
    original, when it differs (Strands usually redacts the message in place). ``updated``: it
    replaces a message stored before it, so it may be out of order.

    What a piece keeps is left out where the read can tell it: its ``group`` on the first piece
    (its own id), its ``blocks`` when it stands for all of them."""
    said = session_message.to_message()
    redacted = session_message.redact_message is not None
    group = new_message_id()
    content = said.get("content") if isinstance(said, Mapping) else None  # else _pieces refuses
    every = tuple(range(len(content))) if isinstance(content, list) else ()

    def kept(j: int, blocks: tuple[int, ...]) -> dict[str, Any]:
        partial = {
            key: [content[k] for k in blocks] if key == "content" else value
            for key, value in said.items()
        }
        out: dict[str, Any] = {"index": session_message.message_id}
        if j:
            out["group"] = group
        if blocks != every:
            out["blocks"] = list(blocks)
        out["message"] = _dumped(partial, where)
        out["created_at"] = session_message.created_at
        out["updated_at"] = session_message.updated_at
        if updated:
            out["updated"] = True
        if redacted and j == 0:
            out["redacted"] = True
            if session_message.message != said:
                out["original"] = _dumped(session_message.message, where)
        return {METADATA_KEY: out}

    created = _epoch(session_message.created_at)
    pieces = _pieces(said, where, group, None, metadata=kept, created_at=created)
    return [piece.message for piece in pieces]


class _Kept(NamedTuple):
    """What a stored piece keeps (see :data:`METADATA_KEY`)."""

    number: int  # the Strands message_id
    group: str
    blocks: list[int] | None  # None: all the blocks of its message
    message: Any
    fields: Mapping[str, Any]


def _kept(message: Message) -> _Kept | None:
    kept = message.metadata.get(METADATA_KEY)
    if not isinstance(kept, Mapping):
        return None
    index, group, blocks = kept.get("index"), kept.get("group", message.id), kept.get("blocks")
    said = kept.get("message")
    if (
        not isinstance(index, int)
        or not isinstance(group, str)
        or not isinstance(said, (str, Mapping))
        or not (blocks is None or isinstance(blocks, list))
    ):
        return None
    return _Kept(index, group, blocks, said, kept)


def _groups(messages: Sequence[Message]) -> list[_Group]:
    """The Strands messages ``messages`` hold, by their pieces, in the order stored. A message
    written by other code (no ``metadata["strands"]``) is no part of the agent's history."""
    out: list[_Group] = []
    by_id: dict[str, _Group] = {}
    for m in messages:
        kept = _kept(m)
        if kept is None:
            continue
        group = by_id.get(kept.group)
        if group is None:
            moved = kept.fields.get("updated") is True
            group = by_id[kept.group] = _Group(kept.number, kept.group, [], moved)
            out.append(group)
        group.pieces.append(m)
    return out


def _edited(piece: Message, own: list[Any], indexes: list[int]) -> tuple[list[Any], list[int]]:
    """The blocks of ``piece``, a message edited through Zerda since it was stored, as its
    text now says: a result's content, a prompt, or an answer's text (its calls kept)."""
    text = piece.text
    if piece.role is Role.TOOL:
        for k, block in zip(indexes, own, strict=False):
            result = _result_of(block)
            if result is not None:
                return [{**block, "toolResult": {**result, "content": [{"text": text}]}}], [k]
    if piece.role is Role.ASSISTANT:
        blocks: list[Any] = []
        at: list[int] = []
        placed = False
        for k, block in zip(indexes, own, strict=False):
            if isinstance(block, Mapping) and "toolUse" in block:
                blocks.append(block)
                at.append(k)
            elif not placed:
                placed = True
                if text:
                    blocks.append({"text": text})
                    at.append(k)
        if not placed and text:
            blocks.append({"text": text})
            at.append(max(indexes, default=-1) + 1)
        return blocks, at
    return [{"text": text}], indexes[:1] or [0]


def _removal(session_id: str, ids: Sequence[str]) -> Flow[int]:
    """Delete exactly the messages ``ids`` (one atomic step), then forget a summary of the
    session that may have been made of them, as every Zerda edit does. Not the memory's
    ``delete_messages``, which also deletes the results of a deleted call."""
    deleted: int = yield DeleteMessages(session_id, list(ids))
    if deleted:
        yield from forget_summary(session_id, 0, mark_absent=False)
    return deleted


class ZerdaSessionManager(RepositorySessionManager, SessionRepository):
    """A Strands session manager over a Zerda store: ``Agent(session_manager=...)``.

    ``store`` holds the session (default: a new :class:`~zerda.stores.InMemoryStore`); or give
    ``memory``, a Zerda memory on ``session_id``, whose store holds it and whose writes record
    the messages (a token memory stores each message's count as it is added). Strands calls a
    session manager synchronously: the store must be a sync one.

    It is Strands' own ``RepositorySessionManager`` over a ``SessionRepository`` written on
    Zerda's store primitives (as Strands' ``FileSessionManager`` is one over files), so an agent
    is restored, synced and redacted exactly as Strands does it. Each agent of the session has
    a Zerda session of its own (:meth:`agent_session_id`): the session's id for the default
    agent, ``"<session_id>+<agent_id>"`` for another. Each Strands message is one atomic append
    of its Zerda messages; the agent's record (its state, its conversation manager's state) and
    the session's are keys of the Zerda session's metadata.

    An agent is restored from the messages its conversation manager kept: Strands reads from
    ``removed_message_count`` on, and this reads the session from its end, so that a restart
    costs what the manager keeps, not the whole log.
    """

    def __init__(
        self,
        session_id: str,
        *,
        store: Store | AsyncStore | None = None,
        memory: BaseMemory[Any] | None = None,
        **kwargs: Any,
    ) -> None:
        self.memory = memory_on("ZerdaSessionManager", session_id, store, memory)
        given = self.memory.store
        if not isinstance(given, Store):
            raise ConfigurationError(
                "ZerdaSessionManager needs a sync store (Strands calls its session manager "
                f"synchronously); {type(given).__name__} is async only: use SQLiteStore, "
                "RedisStore, PostgresStore, JSONFileStore or HTTPStore"
            )
        self._store: Store = given
        self._memories: dict[str, BaseMemory[Any]] = {session_id: self.memory}
        self._created: dict[tuple[str, str], str] = {}  # (session, agent) -> its created_at
        super().__init__(session_id=session_id, session_repository=self, **kwargs)

    @property
    def store(self) -> Store:
        return self._store

    def agent_session_id(
        self, agent_id: str = _DEFAULT_AGENT_ID, session_id: str | None = None
    ) -> str:
        """The Zerda session holding the messages of agent ``agent_id`` of the Strands session
        ``session_id`` (default: this manager's): the session's own id for the default agent,
        ``"<session_id>+<agent_id>"`` for another. Point a Zerda memory or the CLI at it."""
        sid = self.session_id if session_id is None else session_id
        return sid if agent_id == _DEFAULT_AGENT_ID else f"{sid}+{agent_id}"

    def _memory_for(self, zerda_session: str) -> BaseMemory[Any]:
        """The memory that writes an agent's session: the one given, or one of its kind and
        settings on the agent's own session."""
        memory = self._memories.get(zerda_session)
        if memory is None:
            memory = self._memories[zerda_session] = self.memory._forked(zerda_session)
        return memory

    def initialize(self, agent: LocalAgent, **kwargs: Any) -> None:
        """Strands' restore, and then, when the messages it read were none (its conversation
        manager had removed them all), the newest message read from the store: Strands numbers
        the next message after it, and would otherwise start again at 0."""
        super().initialize(agent, **kwargs)
        if self._latest_agent_message.get(agent.agent_id) is None:
            zerda_session = self.agent_session_id(agent.agent_id)
            groups = self._read(zerda_session, lambda found: any(not g.moved for g in found))
            if groups:
                newest = max(reversed(groups), key=lambda g: g.message_id)
                self._latest_agent_message[agent.agent_id] = self._message_of(zerda_session, newest)

    # -- SessionRepository: the session and its agents --------------------------------------

    def create_session(self, session: Session, **kwargs: Any) -> Session:
        record = session.to_dict()
        if not self._store.compare_and_set(session.session_id, _SESSION_KEY, None, record):
            raise SessionException(f"Session {session.session_id} already exists")
        return session

    def read_session(self, session_id: str, **kwargs: Any) -> Session | None:
        value = self._store.get_metadata(session_id).get(_SESSION_KEY)
        return Session.from_dict(dict(value)) if isinstance(value, Mapping) else None

    def delete_session(self, session_id: str, **kwargs: Any) -> None:
        """Forget the session: its agents' messages and records, and its own."""
        agents = self._store.get_metadata(session_id).get(_AGENTS_KEY)
        existed = False
        for agent_id in agents if isinstance(agents, list) else []:
            zerda_session = self.agent_session_id(str(agent_id), session_id)
            if zerda_session != session_id:
                existed = self._store.delete_session(zerda_session) or existed
        existed = self._store.delete_session(session_id) or existed
        if not existed:
            raise SessionException(f"Session {session_id} does not exist")

    def create_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        zerda_session = self.agent_session_id(session_agent.agent_id, session_id)
        self._store.update_metadata(zerda_session, {_AGENT_KEY: session_agent.to_dict()})
        self._created[(session_id, session_agent.agent_id)] = session_agent.created_at
        while True:  # the session's list of agents, for delete_session
            agents = self._store.get_metadata(session_id).get(_AGENTS_KEY)
            known = list(agents) if isinstance(agents, list) else []
            if session_agent.agent_id in known or self._store.compare_and_set(
                session_id, _AGENTS_KEY, agents, [*known, session_agent.agent_id]
            ):
                return

    def read_agent(self, session_id: str, agent_id: str, **kwargs: Any) -> SessionAgent | None:
        zerda_session = self.agent_session_id(agent_id, session_id)
        value = self._store.get_metadata(zerda_session).get(_AGENT_KEY)
        if not isinstance(value, Mapping):
            return None
        agent = SessionAgent.from_dict(dict(value))
        self._created[(session_id, agent_id)] = agent.created_at
        return agent

    def update_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        agent_id = session_agent.agent_id
        created = self._created.get((session_id, agent_id))
        if created is None:
            previous = self.read_agent(session_id, agent_id)
            if previous is None:
                raise SessionException(f"Agent {agent_id} in session {session_id} does not exist")
            created = previous.created_at
        session_agent.created_at = created
        zerda_session = self.agent_session_id(agent_id, session_id)
        self._store.update_metadata(zerda_session, {_AGENT_KEY: session_agent.to_dict()})

    # -- SessionRepository: the messages ----------------------------------------------------

    def create_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        zerda_session = self.agent_session_id(agent_id, session_id)
        where = f"message {session_message.message_id} of agent {agent_id!r}"
        self._memory_for(zerda_session).add_messages(_stored(session_message, where))

    def read_message(
        self, session_id: str, agent_id: str, message_id: int, **kwargs: Any
    ) -> SessionMessage | None:
        zerda_session = self.agent_session_id(agent_id, session_id)
        group = self._find(zerda_session, message_id)
        return None if group is None else self._message_of(zerda_session, group)

    def update_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        """Replace a message (a guardrail's redaction): its new Zerda messages are appended,
        then the old ones deleted, so that nothing of what was redacted stays in the store
        (unless Strands keeps it as the ``message`` beside the ``redact_message``). A message
        is read back by its ``message_id``, so Strands finds it in its place; a Zerda memory
        finds it where it was only when it was the newest (as a redacted prompt is)."""
        zerda_session = self.agent_session_id(agent_id, session_id)
        group = self._find(zerda_session, session_message.message_id)
        if group is None:
            raise SessionException(f"Message {session_message.message_id} does not exist")
        session_message.created_at = self._message_of(zerda_session, group).created_at
        where = f"message {session_message.message_id} of agent {agent_id!r}"
        self._memory_for(zerda_session).add_messages(_stored(session_message, where, updated=True))
        old = [m.id for m in group.pieces if m.id is not None]
        drive(_removal(zerda_session, old), self._store)

    def list_messages(
        self,
        session_id: str,
        agent_id: str,
        limit: int | None = None,
        offset: int = 0,
        **kwargs: Any,
    ) -> list[SessionMessage]:
        """The agent's messages from ``offset`` (a ``message_id``) on, oldest first, the first
        ``limit`` of them: read from the end of the session, so that a restore after a
        conversation manager removed the oldest costs what it kept."""
        for value, name in ((offset, "offset"), (limit, "limit")):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ConfigurationError(f"{name} must be a non-negative integer, got {value!r}")
        zerda_session = self.agent_session_id(agent_id, session_id)
        reached: Callable[[list[_Group]], bool] | None = None
        if offset:
            reached = lambda found: _reaches(found, offset)  # noqa: E731
        newest: dict[int, _Group] = {}  # a message stored again (updated) is read as stored last
        for group in self._read(zerda_session, reached):
            if group.message_id >= offset:
                newest[group.message_id] = group
        out = [self._message_of(zerda_session, newest[n]) for n in sorted(newest)]
        return out if limit is None else out[:limit]

    # -- SessionRepository: a multi-agent's state -------------------------------------------

    def create_multi_agent(
        self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any
    ) -> None:
        key = _MULTI_AGENT_PREFIX + multi_agent.id
        self._store.update_metadata(session_id, {key: multi_agent.serialize_state()})

    def read_multi_agent(
        self, session_id: str, multi_agent_id: str, **kwargs: Any
    ) -> dict[str, Any] | None:
        value = self._store.get_metadata(session_id).get(_MULTI_AGENT_PREFIX + multi_agent_id)
        return dict(value) if isinstance(value, Mapping) else None

    def update_multi_agent(
        self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any
    ) -> None:
        if self.read_multi_agent(session_id, multi_agent.id) is None:
            raise SessionException(
                f"MultiAgent state {multi_agent.id} in session {session_id} does not exist"
            )
        self.create_multi_agent(session_id, multi_agent)

    # -- reading stored messages ------------------------------------------------------------

    def _read(
        self, zerda_session: str, reached: Callable[[list[_Group]], bool] | None
    ) -> list[_Group]:
        """The Strands messages of the newest turns of ``zerda_session``, as many as
        ``reached`` needs (all of them for ``None``): the newest turns first, twice as many
        each time they are not enough."""
        turns: int | None = None if reached is None else _FIRST_TURNS
        while True:
            tail = self._store.tail(zerda_session, turns)
            groups = _groups(tail.messages)
            if (
                turns is None
                or tail.complete
                or (groups and reached is not None and reached(groups))
            ):
                return groups
            turns = turns * 2 if turns * 2 < tail.total_turns else None

    def _find(self, zerda_session: str, message_id: int) -> _Group | None:
        """The message numbered ``message_id`` as it was stored last."""
        if isinstance(message_id, bool) or not isinstance(message_id, int):
            raise ConfigurationError(f"message_id must be an integer, got {message_id!r}")
        groups = self._read(zerda_session, lambda found: _reaches(found, message_id))
        return next((g for g in reversed(groups) if g.message_id == message_id), None)

    def _message_of(self, zerda_session: str, group: _Group) -> SessionMessage:
        """The ``SessionMessage`` a group stores: the blocks of its pieces (as edited through
        Zerda, where they were) in their places, and its original if it was redacted."""
        head = _kept(group.pieces[0])
        first: Mapping[str, Any] = head.fields if head is not None else {}
        try:
            blocks: dict[int, Any] = {}
            fields: dict[str, Any] | None = None
            for piece in group.pieces:
                kept = _kept(piece)
                assert kept is not None
                message = _loaded(kept.message)
                if fields is None:
                    fields = message
                own = message.get("content")
                own = own if isinstance(own, list) else []
                indexes = (
                    list(range(len(own)))
                    if kept.blocks is None
                    else [k for k in kept.blocks if isinstance(k, int)]
                )
                if "edited_at" in piece.metadata:
                    own, indexes = _edited(piece, own, indexes)
                blocks.update(zip(indexes, own, strict=False))
            original = first.get("original")
            original = _loaded(original) if original is not None else None
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptDataError(
                f"session {zerda_session!r}: message {group.message_id} cannot be read back: {exc}"
            ) from exc
        assert fields is not None
        said: Any = {  # a Strands Message, as it was stored
            key: [blocks[k] for k in sorted(blocks)] if key == "content" else value
            for key, value in fields.items()
        }
        stamps = {
            key: first[key]
            for key in ("created_at", "updated_at")
            if isinstance(first.get(key), str)
        }
        if first.get("redacted") is True:
            message = original if original is not None else said
            return SessionMessage(message, group.message_id, said, **stamps)
        return SessionMessage(said, group.message_id, **stamps)

    def __repr__(self) -> str:
        return f"ZerdaSessionManager({self.session_id!r}, store={type(self._store).__name__})"
