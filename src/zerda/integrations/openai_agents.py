"""OpenAI Agents SDK integration: a ``Session`` over any Zerda store, and Zerda's context for
the model through ``RunConfig(session_input_callback=...)``.

``ZerdaSession(session_id, store=...)`` is the SDK's ``Session``: pass it to ``Runner.run``
where an ``SQLiteSession`` goes::

    session = ZerdaSession("alice", store=SQLiteStore("chat.db"))
    result = await Runner.run(agent, "Hi", session=session)

Each Responses input item the SDK writes is one Zerda message, converted by
:func:`zerda.formats.from_responses` (so that turns, budgets, repair, the CLI and the other
memories work on it), with the item itself kept in ``metadata["openai_agents"]["item"]``:
``get_items()`` gives back exactly what was written, ids and opaque fields included. An item
Zerda does not model (a hosted tool call, a compaction item) is stored as a message that shows
its JSON, and given back unchanged. What the model sees is Zerda's choice only through the
SDK's own hook: ``RunConfig(session_input_callback=session.input_callback(token_limit=...))``
sends the newest whole turns that fit, repaired; ``get_items()`` is never shortened.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any, cast

from zerda._checks import MAX_METADATA_DEPTH, check_json_value
from zerda.errors import ConfigurationError, InvalidMessageError
from zerda.formats import from_responses, to_responses
from zerda.integrations._json import shown
from zerda.integrations._memory import memory_on
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationTokenBufferMemory,
)
from zerda.memory._flow import DeleteMessages, Flow, adrive
from zerda.memory._record import Locate, changed_turn, forget_summary
from zerda.messages import PINNED, Message, Role
from zerda.stores import AsyncStore, InMemoryStore, Store
from zerda.stores._base import as_async
from zerda.tokens import TokenCounterLike

try:
    from agents.items import TResponseInputItem
    from agents.memory import SessionInputCallback, SessionSettings
    from agents.memory import session as _sdk_session
    from agents.memory.session_settings import coerce_session_settings, resolve_session_limit
except ImportError as exc:  # pragma: no cover - exercised only without openai-agents
    raise ImportError(
        "zerda.integrations.openai_agents needs openai-agents: "
        "pip install 'zerda-memory[openai-agents]'"
    ) from exc

__all__ = ["METADATA_KEY", "ZerdaSession"]

METADATA_KEY = "openai_agents"
"""The message ``metadata`` key under which ``{"item": ...}`` keeps the item as the SDK wrote
it."""

_SNAPSHOT: Any = getattr(_sdk_session, "_CompactionSnapshot", None)
"""The SDK's compaction snapshot (0.24: automatic compaction of a suffix of the history);
``None`` in an SDK without one, where the session offers no snapshot."""

REPLACES = "replaces"
"""The key, beside ``"item"``, of a compaction's first message: the ids of the messages it
replaces."""

Item = dict[str, Any]
_ROLES = {"user": Role.USER, "system": Role.SYSTEM, "developer": Role.DEVELOPER}

# -- items <-> messages -----------------------------------------------------------------------


def _message_of(item: object, where: str) -> Message:
    """The message that stores ``item``: what :func:`from_responses` reads in it, or, for an
    item it does not model, a message showing its JSON (a user, system or developer one when
    the item has that role, so that turns stay where they are; never a tool result, which
    repair would drop without its call); the item itself in ``metadata``."""
    if not isinstance(item, Mapping):
        raise InvalidMessageError(
            f"{where} must be a Responses input item (a dict), got {type(item).__name__}"
        )
    # The item sits two levels down in the message's metadata.
    check_json_value(item, where, max_depth=MAX_METADATA_DEPTH - 2)
    try:
        json.dumps(item, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidMessageError(f"{where} is not JSON, which every store keeps: {exc}") from None
    kept = {METADATA_KEY: {"item": dict(item)}}
    try:
        converted = from_responses([item])
    except (InvalidMessageError, TypeError, ValueError):
        converted = []
    if len(converted) == 1:
        message = converted[0]
        return dataclasses.replace(message, metadata={**message.metadata, **kept})
    role = item.get("role")
    return Message(
        _ROLES.get(role, Role.ASSISTANT) if isinstance(role, str) else Role.ASSISTANT,
        shown(item),
        metadata=kept,
    )


def _copied(value: Any) -> Any:
    """A deep copy of a JSON value: nothing returned aliases a message a store may cache."""
    return json.loads(json.dumps(value))


def _items_of(message: Message) -> list[Item]:
    """The items ``message`` reads as: the one the SDK wrote, or, for a message edited on
    Zerda's side since or written by other code, what :func:`to_responses` makes of it now
    (none for a message nothing of which the Responses API takes)."""
    kept = message.metadata.get(METADATA_KEY)
    if (
        isinstance(kept, Mapping)
        and isinstance(kept.get("item"), Mapping)
        and "edited_at" not in message.metadata
    ):
        return [_copied(kept["item"])]
    return [_copied(item) for item in to_responses([message])]


def _messages_of(items: Sequence[object], what: str) -> list[Message]:
    if isinstance(items, (str, bytes, Mapping)) or not isinstance(items, Sequence):
        raise InvalidMessageError(f"{what} takes a list of items, got {type(items).__name__}")
    return [_message_of(item, f"{what}: items[{i}]") for i, item in enumerate(items)]


def _removal(session_id: str, ids: Collection[str], first_turn: int | Locate) -> Flow[int]:
    """Delete exactly the messages ``ids`` (one atomic step; how many went), then forget a
    summary of the session made of them, as every edit does. Not the memory's
    ``delete_messages``, which also deletes every result of a deleted call's id: one popped
    call of a model that numbers its calls ``call_0`` each turn would take older results."""
    deleted: int = yield DeleteMessages(session_id, sorted(ids))
    if deleted:
        yield from forget_summary(session_id, first_turn, mark_absent=False)
    return deleted


def _replacing(batch: list[Message], ids: Sequence[str]) -> list[Message]:
    """``batch`` with its first message marked as replacing the messages ``ids``: from the
    moment the batch is appended (one atomic step) the session's reads skip them, whether or
    not their deletion, the next step, has happened yet."""
    if not batch or not ids:
        return batch
    first = batch[0]
    kept = {**first.metadata[METADATA_KEY], REPLACES: list(ids)}
    return [dataclasses.replace(first, metadata={**first.metadata, METADATA_KEY: kept}), *batch[1:]]


def _replaced(message: Message) -> list[str]:
    """The ids of the older messages ``message`` replaces (see :func:`_replacing`)."""
    kept = message.metadata.get(METADATA_KEY)
    ids = kept.get(REPLACES) if isinstance(kept, Mapping) else None
    return [i for i in ids if isinstance(i, str)] if isinstance(ids, list) else []


def _visible(messages: Sequence[Message]) -> list[Message]:
    """``messages`` without those a newer one among them replaces."""
    hidden: set[str] = set()
    out: list[Message] = []
    for m in reversed(messages):
        hidden.update(_replaced(m))
        if m.id is None or m.id not in hidden:
            out.append(m)
    return out[::-1]


def _at_end(message: Message) -> Locate:
    """Where the removed newest ``message`` was, for :func:`forget_summary`."""
    ids = {message.id} if message.id is not None else set()
    return lambda left: changed_turn([*left, message], ids)


# -- the session ------------------------------------------------------------------------------


class ZerdaSession:
    """The OpenAI Agents SDK's ``Session`` protocol over a Zerda store.

    ``store`` holds the session (default: a new :class:`~zerda.stores.InMemoryStore`); or give
    ``memory``, a Zerda memory on ``session_id``: its store holds the session, its writes
    record the items (a token memory stores each message's count as it is added) and its
    window or budget is what :meth:`input_callback` applies by default. ``session_settings``
    is the SDK's (``limit``: how many of the newest items ``get_items()`` gives by default).

    Every method is one atomic step of the store, or a few that stay safe together (see
    :meth:`pop_item` and the compaction hooks); any number of sessions, threads, tasks and
    processes may share a session.
    """

    def __init__(
        self,
        session_id: str,
        *,
        store: Store | AsyncStore | None = None,
        memory: BaseMemory[Any] | None = None,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        self.memory = memory_on("ZerdaSession", session_id, store, memory)
        given = self.memory.store
        self._store: AsyncStore = as_async(given)
        if isinstance(session_settings, Mapping):
            session_settings = coerce_session_settings(dict(session_settings))
        self.session_settings: SessionSettings | None = session_settings or SessionSettings()

    @property
    def session_id(self) -> str:
        return self.memory.session_id

    @session_id.setter
    def session_id(self, value: str) -> None:
        raise AttributeError(
            "ZerdaSession.session_id cannot be changed: make a ZerdaSession for the other session"
        )

    @property
    def store(self) -> Store | AsyncStore:
        return self.memory.store

    # -- the Session protocol -----------------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The items, oldest first: the newest ``limit`` of them (default
        ``session_settings.limit``; ``None``: all, ``0`` or less: none), read by whole turns
        from the newest, so that the cost is that of what is returned."""
        wanted = resolve_session_limit(limit, self.session_settings)
        if wanted is None:
            messages = _visible(await self._store.ahistory(self.session_id))
            return cast("list[TResponseInputItem]", [i for m in messages for i in _items_of(m)])
        if wanted <= 0:
            return []
        pairs, _ = await self._newest(wanted)
        items = [item for _, items in pairs for item in items]
        return cast("list[TResponseInputItem]", items[-wanted:])

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Record ``items`` as one atomic batch, one message each (all of them or, when one
        is not JSON, none)."""
        batch = _messages_of(items, "add_items")
        if batch:
            await self.memory.aadd_messages(batch)

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (``None`` when there is none).

        The newest message is deleted by its id, which the store does atomically: of two
        pops at once only one deletes it, and the other takes the next (each item is popped
        once). A message written by other code that reads as several items is replaced by
        the others, each a message of its own, before it is deleted."""
        while True:
            pairs, _ = await self._newest(1)
            if not pairs:
                return None
            message, items = pairs[-1]
            if message.id is None:
                raise InvalidMessageError(
                    f"session {self.session_id!r}: its newest message has no id, so it cannot "
                    "be removed alone (messages a memory records always have one)"
                )
            rest = (
                await self.memory.aadd_messages(_messages_of(items[:-1], "pop_item"))
                if len(items) > 1
                else []
            )
            if await adrive(_removal(self.session_id, [message.id], _at_end(message)), self._store):
                leftovers = _replaced(message)  # a compaction's, hidden by it until now
                if leftovers:
                    await adrive(_removal(self.session_id, leftovers, 0), self._store)
                return cast(TResponseInputItem, items[-1])
            if rest:  # another pop took it first: take back what this one added
                ids = [m.id for m in rest if m.id is not None]
                await adrive(_removal(self.session_id, ids, _at_end(message)), self._store)

    async def clear_session(self) -> None:
        """Forget the session: its items and its metadata."""
        await self.memory.aclear()

    # -- the SDK's compaction hooks (OpenAIResponsesCompactionSession) ---------------------------
    #
    # A replacement is one atomic append: the new items, the first of them naming the ids of
    # the items it replaces, which every read of the session skips from then on. The old
    # messages are then deleted by id, a second step that only tidies up: a reader never sees
    # both the old items and the new ones, nor neither, and a process that dies between the
    # steps leaves old messages that no read of the session shows (the next replacement or
    # clear_session deletes them; until then Zerda's own memories and the CLI still show them).

    async def _atomic_replace_items(self, items: list[TResponseInputItem]) -> bool:
        """Replace the whole history with ``items`` (a manual compaction) atomically; see
        above. Items added meanwhile by others are kept, before the new ones. ``False`` (the
        SDK then clears and adds) for a subclass, whose own reads and writes this would
        bypass."""
        if type(self) is not ZerdaSession:
            return False
        batch = _messages_of(items, "compaction")
        old = await self._store.ahistory(self.session_id)
        if any(m.id is None for m in old):
            return False
        ids = [cast(str, m.id) for m in old]
        if batch:
            await self.memory.aadd_messages(_replacing(batch, ids))
        if ids:
            await adrive(_removal(self.session_id, ids, 0), self._store)
        return True

    async def _get_compaction_snapshot(
        self, limit: int, *, prune_prefix: Callable[[TResponseInputItem], bool] | None = None
    ) -> Any:
        """The newest ``limit`` items, for an automatic compaction of what the model saw, with
        their ``replace_suffix(start, output)``: replace the items from ``start`` on with
        ``output`` if they are still the newest (see above), and delete the oldest items
        ``prune_prefix`` says are expired; whether it did. ``None`` (the SDK then needs the
        whole history) for a subclass, an SDK without snapshots, or a window holding a
        message written by other code that is not one item."""
        if _SNAPSHOT is None or type(self) is not ZerdaSession:
            return None
        pairs, complete = await self._newest(limit)
        if any(len(items) != 1 or m.id is None for m, items in pairs):
            return None
        ids = [cast(str, m.id) for m, _ in pairs]

        async def replace_suffix(start: int, output: list[TResponseInputItem]) -> bool:
            return await self._replace_suffix(ids[start:], output, prune_prefix)

        return _SNAPSHOT([items[0] for _, items in pairs], complete, replace_suffix)

    async def _replace_suffix(
        self,
        expected: list[str],
        output: list[TResponseInputItem],
        prune_prefix: Callable[[TResponseInputItem], bool] | None,
    ) -> bool:
        if not expected:
            return False
        batch = _messages_of(output, "compaction")
        if await self._newest_ids(len(expected)) != expected:
            return False
        doomed = list(expected)
        if prune_prefix is not None:
            doomed = await self._expired(expected[0], prune_prefix) + doomed
        added = [
            m.id
            for m in await self.memory.aadd_messages(_replacing(batch, doomed))
            if m.id is not None
        ]
        if not await self._directly_after(expected, added):
            if added:  # something came between: the replacement would misplace it
                await adrive(_removal(self.session_id, added, 0), self._store)
            return False
        await adrive(_removal(self.session_id, doomed, 0), self._store)
        return True

    async def _directly_after(self, expected: list[str], added: list[str]) -> bool:
        """Whether the messages ``added`` follow the messages ``expected`` directly (others
        may have been added after them)."""
        if not added:
            return await self._newest_ids(len(expected)) == expected
        wanted = len(expected) + len(added)
        while True:
            pairs, complete = await self._newest(wanted, hide=False)
            ids = [m.id for m, _ in pairs]
            at = ids.index(added[0]) if added[0] in ids else -1
            if at >= len(expected) or complete:
                return at >= len(expected) and ids[at - len(expected) : at] == expected
            wanted *= 2

    async def _expired(
        self, first_kept: str, prune_prefix: Callable[[TResponseInputItem], bool]
    ) -> list[str]:
        """The ids of the oldest messages, up to ``first_kept``, whose items are expired."""
        expired: list[str] = []
        for m in _visible(await self._store.ahistory(self.session_id)):
            items = _items_of(m)
            if m.id is None or m.id == first_kept or len(items) != 1:
                break
            if not prune_prefix(cast(TResponseInputItem, items[0])):
                break
            expired.append(m.id)
        return expired

    # -- reading the newest messages --------------------------------------------------------

    async def _newest(
        self, wanted: int, *, hide: bool = True
    ) -> tuple[list[tuple[Message, list[Item]]], bool]:
        """The newest messages that read as items, oldest first, with their items: the
        fewest that hold ``wanted`` items (all when the session holds fewer), and whether
        they are the session's oldest too. Read by whole turns from the newest, so that the
        cost is that of what is asked for. Messages a compaction replaced are skipped, unless
        ``hide`` is false."""
        turns = max(wanted // 4, 1)  # a turn is a few items: read more if it is not enough
        while True:
            tail = await self._store.atail(self.session_id, turns, None)
            messages: Sequence[Message] = tail.messages
            whole = tail.complete
            if tail.system:  # pinned messages have no place in a tail: read the log in order
                messages, whole = await self._store.ahistory(self.session_id), True
            pairs: list[tuple[Message, list[Item]]] = []
            count = 0
            if hide:
                messages = _visible(messages)
            for i in range(len(messages) - 1, -1, -1):
                if count >= wanted:
                    return pairs[::-1], False
                items = _items_of(messages[i])
                if items:
                    pairs.append((messages[i], items))
                    count += len(items)
            if whole or count >= wanted:
                return pairs[::-1], whole
            turns *= 2

    async def _newest_ids(self, count: int) -> list[str | None]:
        pairs, _ = await self._newest(count)
        return [m.id for m, _ in pairs][-count:]

    # -- what the model sees --------------------------------------------------------------------

    def input_callback(
        self,
        token_limit: int | None = None,
        k: int | None = None,
        counter: TokenCounterLike | None = None,
    ) -> SessionInputCallback:
        """A ``RunConfig(session_input_callback=...)`` that sends the model what a Zerda memory
        would: the newest whole turns within ``token_limit`` tokens (counted by ``counter``)
        or the last ``k`` turns, repaired (a call never without its result, no orphan result,
        the history opening on a user message), pinned system and developer items first, and
        every new item after. Without either, the policy of the session's ``memory`` (its
        budget, reserve and tools, or its window), else every turn, repaired.

        The memory looks at the items the SDK hands over (``session_settings.limit`` of them,
        when set), converted as the session stores them: the SDK stores what the callback
        returns and was not history, so the callback gives back items, never shortened or
        renamed ones. A newest turn over the budget raises
        :class:`~zerda.ContextOverflowError`; a call id the model used twice reaches it as it
        was stored. Leave room in ``token_limit`` for the instructions and the tools.
        """
        make = _view_memory(self.memory, token_limit, k, counter)
        return cast(SessionInputCallback, _InputView(make, self.session_id))

    def __repr__(self) -> str:
        return f"ZerdaSession({self.session_id!r}, store={type(self.store).__name__})"


# -- the callback -----------------------------------------------------------------------------


def _view_memory(
    template: BaseMemory[Any],
    token_limit: int | None,
    k: int | None,
    counter: TokenCounterLike | None,
) -> Callable[[Store, str], BaseMemory[Any]]:
    """How to build the memory :class:`_InputView` selects with, over its own store."""
    if token_limit is not None and k is not None:
        raise ConfigurationError("input_callback takes token_limit or k, not both")
    if counter is not None and token_limit is None:
        raise ConfigurationError("counter counts for token_limit: give token_limit too")
    strict = template.strict
    token = (
        template
        if isinstance(template, ConversationTokenBufferMemory)
        and not isinstance(template, ConversationSummaryBufferMemory)
        else None
    )
    if token_limit is not None:
        limit = token_limit
        if counter is None and token is not None:
            counter = token.token_counter  # the one the stored counts were made by
        return lambda store, sid: ConversationTokenBufferMemory(
            limit,
            token_counter=counter,
            overflow="raise",
            store=store,
            session_id=sid,
            strict=strict,
        )
    if k is not None:
        window = k
        return lambda store, sid: ConversationBufferWindowMemory(
            k=window, store=store, session_id=sid, strict=strict
        )
    if isinstance(template, ConversationSummaryBufferMemory):
        raise ConfigurationError(
            f"input_callback cannot send a {type(template).__name__}'s summary (the SDK would "
            "store it as new input): give token_limit or k"
        )
    if token is not None:
        kept = token
        return lambda store, sid: ConversationTokenBufferMemory(
            kept.max_token_limit,
            token_counter=kept.token_counter,
            reserve_tokens=kept.reserve_tokens,
            tools=kept.tools or None,
            overflow="raise",
            store=store,
            session_id=sid,
            strict=strict,
        )
    if isinstance(template, ConversationBufferWindowMemory):
        kept_k = template.k
        return lambda store, sid: ConversationBufferWindowMemory(
            k=kept_k, store=store, session_id=sid, strict=strict
        )
    return lambda store, sid: ConversationBufferMemory(store=store, session_id=sid, strict=strict)


class _InputView:
    """A ``session_input_callback``: the history and the new items, as messages in a store of
    its own, and the items of the memory's context over them.

    Histories grow by what each run added, so the store keeps what it was last given and
    appends what is new. A window of ``session_settings.limit`` items moves on at its start
    too: the store keeps the items the window left (up to a window's worth) before those it
    holds, and the context is read again over exactly the history given only when the
    memory's choice reaches back into them. Any other history (another session's, a shorter
    one) is stored again from the start, its items converted once: the conversions of the
    items held are kept, by the item's JSON.
    """

    def __init__(self, make: Callable[[Store, str], BaseMemory[Any]], session_id: str) -> None:
        self._store = InMemoryStore()
        self._memory = make(self._store, session_id)  # the session's name in its logs
        self._lock = threading.Lock()
        self._items: list[Item] = []  # the items the store holds, in order
        self._skip = 0  # how many of them, the oldest, the history last given does not hold
        self._place: dict[str, int] = {}  # each message's place among them, by message id
        self._converted: dict[str, Message] = {}  # messages of the items held, by item JSON

    def __call__(
        self, history: list[TResponseInputItem], new_items: list[TResponseInputItem]
    ) -> list[TResponseInputItem]:
        given: list[Item] = [cast(Item, item) for item in (*history, *new_items)]
        with self._lock:
            self._follow(given, moved=True)
            context = self._memory.get_context()
            if self._skip and any(self._place[cast(str, m.id)] < self._skip for m in context):
                self._follow(given, moved=False)  # the choice reached items not given
                context = self._memory.get_context()
            # The memory chooses; the items go in the order the model made them (parallel
            # calls before their outputs, as the SDK sends them), the pinned ones first.
            at = {cast(str, m.id): self._place[cast(str, m.id)] - self._skip for m in context}
            pinned = sorted(at[cast(str, m.id)] for m in context if m.role in PINNED)
            turns = sorted(at[cast(str, m.id)] for m in context if m.role not in PINNED)
        places = [i for i in (*pinned, *turns) if i < len(history)]
        return [history[i] for i in _with_followers(places, given, len(history))] + new_items

    def _follow(self, given: list[Item], *, moved: bool) -> None:
        """Make the store hold ``given`` after its ``_skip`` oldest items: by appending to
        what it holds when ``given`` continues it (``moved``: or a part of it that starts
        later), else from the start."""
        skip = self._continued_at(given, moved)
        if skip is None:
            self._memory.clear()
            self._items, self._place, skip = [], {}, 0
            if len(self._converted) > 2 * len(given) + 64:
                self._converted = {}
        self._skip = skip
        fresh = given[len(self._items) - skip :]
        if not fresh:
            return
        stored = self._memory.add_messages(self._messages_of(fresh))
        for i, m in enumerate(stored, start=len(self._items)):
            self._place[cast(str, m.id)] = i
        self._items.extend(_copied(item) for item in fresh)

    def _continued_at(self, given: list[Item], moved: bool) -> int | None:
        """Where in the items held ``given`` starts, when it goes on to hold the rest of them
        (``0`` unless ``moved``; never more than ``len(given)`` in, so that the store holds
        at most twice a window); ``None`` when it does not."""
        held = self._items
        if not held:
            return 0
        if not given:
            return None
        starts = range(self._skip, min(len(held), len(given) + 1)) if moved else range(1)
        for skip in starts:
            if (
                held[skip] == given[0]
                and len(held) - skip <= len(given)
                and held[skip:] == given[: len(held) - skip]
            ):
                return skip
        return None

    def _messages_of(self, items: list[Item]) -> list[Message]:
        """The messages of ``items``, each converted once while it is held."""
        out = []
        for i, item in enumerate(items):
            try:
                key = json.dumps(item, sort_keys=True)
            except (TypeError, ValueError):  # _message_of says what is wrong with it
                out.append(_message_of(item, f"session_input_callback: items[{i}]"))
                continue
            if key not in self._converted:
                self._converted[key] = _message_of(item, f"session_input_callback: items[{i}]")
            out.append(self._converted[key])
        return out


def _with_followers(kept: list[int], items: Sequence[Item], history: int) -> list[int]:
    """``kept`` (places in the first ``history`` items) without the reasoning items whose
    following item, the one the model made after it, is not sent: the Responses API refuses
    reasoning "provided without its required following item"."""
    sent = set(kept)
    out = []
    for i in kept:
        if items[i].get("type") == "reasoning":
            j = i + 1
            while j < history and items[j].get("type") == "reasoning":
                j += 1
            if j >= history or j not in sent:
                continue
        out.append(i)
    return out
