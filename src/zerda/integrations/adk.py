"""Google ADK integration: a ``SessionService`` over any Zerda store, and Zerda's context for
the model through ``LlmAgent(before_model_callback=...)``.

``ZerdaSessionService(store)`` is ADK's ``BaseSessionService``: give it to a ``Runner`` where a
``SqliteSessionService`` or a ``DatabaseSessionService`` goes::

    service = ZerdaSessionService(SQLiteStore("sessions.db"))
    runner = Runner(app_name="app", agent=agent, session_service=service)

Each ADK session is one Zerda session (:func:`zerda_session_id` names it). Each event is stored
as the Zerda messages :func:`zerda.formats.from_gemini` reads in its content (so that turns,
budgets, repair, the CLI and the other memories work on it), the first of them keeping the
event's own JSON in ``metadata["adk"]["event"]``: ``get_session`` gives back events equal to
those appended, ids and every field Zerda does not model included. An event Zerda cannot read
(no content, parts Gemini's format does not have) is stored as a message showing its JSON.

An event is committed by one atomic append: its first message's id names the session's next
revision, and a store keeps one message per id, so of two runners appending from one revision
one succeeds and the other gets ADK's ``StaleSessionError``. The session's state, times and
revision are a record in the session's metadata (app and user state, records of their own),
brought up to date by compare-and-set after each commit, by whoever comes next if a process
dies in between. ``GetSessionConfig(num_recent_events=..., after_timestamp=...)`` reads the
newest turns only. What the model sees is Zerda's choice only through ADK's own hook:
``LlmAgent(before_model_callback=ZerdaContext(token_limit=...))`` sends the newest whole turns
that fit, repaired; the events stored are never shortened.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import string
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from zerda.errors import ConfigurationError, CorruptDataError, InvalidMessageError, warn
from zerda.formats import from_gemini
from zerda.integrations._json import shown as shown_json
from zerda.integrations._memory import selecting_memory
from zerda.memory._flow import DeleteMessages, Flow, adrive
from zerda.memory._record import changed_turn, forget_summary
from zerda.messages import Message, Role
from zerda.parts import TextPart
from zerda.policies import Overflow
from zerda.stores import AsyncStore, InMemoryStore, Store
from zerda.stores._base import MAX_SESSION_ID_LENGTH, Tail, as_async
from zerda.tokens import TokenCounterLike

try:
    from google.adk.agents.callback_context import CallbackContext
    from google.adk.errors import StaleSessionError
    from google.adk.errors.already_exists_error import AlreadyExistsError
    from google.adk.errors.session_not_found_error import SessionNotFoundError
    from google.adk.events.event import Event
    from google.adk.models.llm_request import LlmRequest
    from google.adk.platform import time as _adk_time
    from google.adk.platform import uuid as _adk_uuid
    from google.adk.sessions import BaseSessionService, Session, State
    from google.adk.sessions.base_session_service import GetSessionConfig, ListSessionsResponse
    from google.genai import types
    from pydantic import ValidationError
    from pydantic_core import PydanticSerializationError, to_jsonable_python
except ImportError as exc:  # pragma: no cover - exercised only without google-adk
    raise ImportError(
        "zerda.integrations.adk needs google-adk: pip install 'zerda-memory[adk]'"
    ) from exc

__all__ = [
    "METADATA_KEY",
    "SESSION_KEY",
    "STATE_KEY",
    "ZerdaContext",
    "ZerdaSessionService",
    "zerda_session_id",
]

METADATA_KEY = "adk"
"""The message ``metadata`` key under which the first message of an event keeps
``{"event": <the event's JSON>}`` (and ``"class"``, for a subclass of ``Event``); the event's
other messages hold ``{"of": <the first one's id>}``."""

SESSION_KEY = "adk.session"
"""The session metadata key holding an ADK session's record: its ids, its state, its create and
update times, and the revision (the newest event) they are up to date with."""

STATE_KEY = "adk.state"
"""The session metadata key holding app or user state (of the sessions
``zerda_session_id(app_name)`` and ``zerda_session_id(app_name, user_id)``), with the commits
that changed it."""

_APPLIED = 64
"""How many of the commits that changed app or user state each state record remembers, so that
a commit whose state two processes apply at once (its writer, and one finishing it) counts
once."""

_MARKER = "_storage_update_marker"
"""ADK's private ``Session`` attribute for a storage revision (``DatabaseSessionService`` sets
it too): a session this service returns carries its revision, so that staleness is told by
revision, not by timestamps that two clocks may disagree on."""

_SAFE = frozenset(string.ascii_letters + string.digits + "_.@+-")
_PREFIX = "adk:"


# -- names ------------------------------------------------------------------------------------


def _escaped(text: str) -> str:
    """``text`` with every character a session id does not take, and ``:`` and ``=``, written
    ``=XX`` per UTF-8 byte: readable, and one text per id."""
    out = []
    for c in text:
        if c in _SAFE:
            out.append(c)
        else:
            out.extend(f"={b:02X}" for b in c.encode("utf-8", "surrogatepass"))
    return "".join(out)


def zerda_session_id(*names: str) -> str:
    """The Zerda session that holds ADK's ``(app_name, user_id, session_id)`` session:
    ``adk:`` and the three, escaped (``=XX`` for each byte a Zerda session id does not take)
    and joined by ``:``. ``(app_name,)`` names the session holding the app's state,
    ``(app_name, user_id)`` the one holding the user's. Names too long for a session id end
    in ``==`` and a digest of them all, from the last name back as far as needed."""
    if not 1 <= len(names) <= 3:
        raise ConfigurationError(
            "zerda_session_id takes (app_name), (app_name, user_id) or "
            f"(app_name, user_id, session_id), got {len(names)} names"
        )
    for name in names:
        if not isinstance(name, str):
            raise ConfigurationError(
                f"ADK app names, user ids and session ids are strings, got {type(name).__name__}"
            )
    parts = [_escaped(name) for name in names]
    full = _PREFIX + ":".join(parts)
    if len(full) <= MAX_SESSION_ID_LENGTH:
        return full
    digest = hashlib.sha256(json.dumps(list(names)).encode("utf-8", "surrogatepass")).hexdigest()
    for keep in range(len(parts) - 1, -1, -1):
        shorter = _PREFIX + ":".join([*parts[:keep], "==" + digest[:40]])
        if len(shorter) <= MAX_SESSION_ID_LENGTH:
            return shorter
    raise AssertionError("unreachable: a digest alone is a short id")  # pragma: no cover


def _may_hold(zid: str, app: str, user: str | None) -> bool:
    """Whether the Zerda session ``zid`` may hold a session of app ``app`` (and user ``user``)
    by its name alone: one with a digest for a name is read to tell."""
    if not zid.startswith(_PREFIX):
        return False
    parts = zid[len(_PREFIX) :].split(":")
    wanted = [_escaped(app)] if user is None else [_escaped(app), _escaped(user)]
    for i, name in enumerate(wanted):
        if i >= len(parts) or parts[i].startswith("=="):
            return True
        if parts[i] != name:
            return False
    return len(parts) == 3 or parts[-1].startswith("==")


# -- events <-> messages ----------------------------------------------------------------------

_BOOKKEEPING = ("id", "invocation_id", "timestamp", "node_info")
_CLASSES: dict[str, type[Event]] = {}


def _class_name(cls: type[Event]) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _event_class(name: str | None) -> type[Event]:
    """The ``Event`` subclass named ``name``, among those the process has loaded (nothing is
    imported for a name read from a store); ``Event`` when none is."""
    if name is None:
        return Event
    found = _CLASSES.get(name)
    if found is None:
        waiting: list[type[Event]] = [Event]
        while waiting:
            cls = waiting.pop()
            _CLASSES[_class_name(cls)] = cls
            waiting.extend(cls.__subclasses__())
        found = _CLASSES.get(name, Event)
    return found


def _dumped(event: Event) -> str:
    """The event's JSON, as ADK's own SQLite session service writes it."""
    try:
        return event.model_dump_json(exclude_none=True)
    except (PydanticSerializationError, TypeError, ValueError) as exc:
        raise InvalidMessageError(
            f"event {event.id!r} cannot be stored: it holds a value that is not JSON ({exc})"
        ) from None


def _loaded(text: str, name: str | None, where: str) -> Event:
    try:
        return _event_class(name).model_validate_json(text)
    except ValidationError as exc:
        raise CorruptDataError(f"{where}: a stored ADK event cannot be read: {exc}") from None


def _shown(data: Mapping[str, Any]) -> str:
    """What the message of an event Zerda cannot read says, to count it and to read it in the
    CLI: the event's JSON without its ids, time and empty actions, inline data elided."""
    shown = {k: v for k, v in data.items() if k not in _BOOKKEEPING}
    actions = shown.get("actions")
    if isinstance(actions, Mapping):
        actions = {k: v for k, v in actions.items() if v not in ({}, [], None)}
        if actions:
            shown["actions"] = actions
        else:
            del shown["actions"]
    return shown_json(shown)


def _messages_of(text: str, name: str | None, base: str, nonce: str) -> list[Message]:
    """The messages that store the event whose JSON is ``text``: those
    :func:`~zerda.formats.from_gemini` reads in its content, else one showing its JSON (a user
    message when the user wrote it, so that turns stay where they are). The first has id
    ``base`` and keeps the event; the others' ids end in ``nonce``, this append's own."""
    data = json.loads(text)
    content = data.get("content")
    converted: list[Message] = []
    if isinstance(content, Mapping):
        try:
            converted = from_gemini({"contents": [content]})
        except (InvalidMessageError, TypeError, ValueError):
            converted = []
    if not converted:
        role = Role.USER if data.get("author") == "user" else Role.ASSISTANT
        converted = [Message(role, _shown(data))]
    stamp = data.get("timestamp")
    created = float(stamp) if isinstance(stamp, (int, float)) else None
    out = []
    for j, m in enumerate(converted):
        kept: dict[str, Any] = {"of": base}
        if j == 0:
            kept = {"event": text} if name is None else {"event": text, "class": name}
        out.append(
            dataclasses.replace(
                m,
                id=base if j == 0 else f"{base}.{nonce}.{j}",
                created_at=created,
                metadata={**m.metadata, METADATA_KEY: kept},
            )
        )
    return out


def _event_of(message: Message) -> Mapping[str, Any] | None:
    """What the first message of an event keeps (``None`` for any other message)."""
    kept = message.metadata.get(METADATA_KEY)
    if isinstance(kept, Mapping) and isinstance(kept.get("event"), str):
        return kept
    return None


# -- the session record and the newest events ---------------------------------------------------


class _Stored(NamedTuple):
    """An event as a tail holds it: its revision (its first message's id says it), its JSON,
    its class name, its time."""

    rev: int
    text: str
    name: str | None
    stamp: float | None


def _slot(token: str, rev: int) -> str:
    """The id of the first message of the event that made revision ``rev`` of a session."""
    return f"{token}-{rev}"


def _stored_events(messages: Sequence[Message], token: str) -> list[_Stored]:
    """The events ``messages`` hold, of the session incarnation ``token`` (a session deleted
    and made again under the same ids has a new one), in order."""
    out = []
    prefix = f"{token}-"
    for m in messages:
        kept = _event_of(m)
        if kept is None or m.id is None or not m.id.startswith(prefix):
            continue
        rev = m.id[len(prefix) :]
        if rev.isdigit():
            name = kept.get("class")
            out.append(
                _Stored(
                    int(rev), kept["event"], name if isinstance(name, str) else None, m.created_at
                )
            )
    return out


def _record_of(raw: Any, zid: str) -> dict[str, Any] | None:
    """The session record ``raw`` (``None`` when there is none), checked."""
    if raw is None:
        return None
    keys = ("app_name", "user_id", "id", "token", "rev", "state", "update_time")
    if not isinstance(raw, dict) or any(k not in raw for k in keys):
        raise CorruptDataError(
            f"session {zid!r}: its {SESSION_KEY!r} metadata is not an ADK session record"
        )
    return raw


class _Now(NamedTuple):
    """A session as one snapshot shows it: its record, the events newer than the record (a
    commit not yet folded into it: being written, or left by a process that died), and its
    newest event."""

    record: dict[str, Any]
    gap: list[_Stored]
    newest: _Stored | None

    @property
    def rev(self) -> int:
        return self.gap[-1].rev if self.gap else int(self.record["rev"])

    @property
    def update_time(self) -> float:
        stamp = self.gap[-1].stamp if self.gap else None
        return float(self.record["update_time"] if stamp is None else stamp)

    @property
    def marker(self) -> str:
        return f"zerda:{self.record['token']}:{self.rev}"


def _now_of(record: dict[str, Any], events: Sequence[_Stored]) -> _Now:
    gap = [e for e in events if e.rev > record["rev"]]
    return _Now(record, gap, events[-1] if events else None)


_Shared = tuple[dict[str, Any], list[str]]
"""An app or user state record read: its state, and the commits it applied."""


def _shared_of(raw: Any) -> _Shared:
    if not isinstance(raw, dict):
        return {}, []
    state, applied = raw.get("state"), raw.get("applied")
    return (
        state if isinstance(state, dict) else {},
        [a for a in applied if isinstance(a, str)] if isinstance(applied, list) else [],
    )


def _scoped(state: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """``state`` split by scope: ``app:`` and ``user:`` keys without their prefix, the
    session's own keys; ``temp:`` keys are never stored."""
    out: dict[str, dict[str, Any]] = {"app": {}, "user": {}, "session": {}}
    for key, value in state.items():
        if key.startswith(State.APP_PREFIX):
            out["app"][key[len(State.APP_PREFIX) :]] = value
        elif key.startswith(State.USER_PREFIX):
            out["user"][key[len(State.USER_PREFIX) :]] = value
        elif not key.startswith(State.TEMP_PREFIX):
            out["session"][key] = value
    return out


def _deltas(text: str) -> dict[str, dict[str, Any]]:
    """The state delta of the event whose JSON is ``text``, by scope."""
    actions = json.loads(text).get("actions")
    delta = actions.get("state_delta") if isinstance(actions, Mapping) else None
    return _scoped(delta if isinstance(delta, Mapping) else {})


def _json_state(state: object) -> dict[str, Any]:
    """A session's initial state as JSON, as ADK's persistent services store it: rich values
    (dates, bytes, models) in their JSON form; a value with none as its text, with a warning."""
    if not isinstance(state, Mapping) or not all(isinstance(k, str) for k in state):
        raise ConfigurationError(
            f"a session's state is a dict with string keys, got {type(state).__name__}"
        )
    try:
        out = to_jsonable_python(dict(state))
    except (PydanticSerializationError, TypeError, ValueError):
        warn(
            f"create_session: state keys {sorted(state)} hold values that are not JSON; "
            "they are stored as their text, as ADK's persistent services store them"
        )
        out = to_jsonable_python(dict(state), serialize_unknown=True)
    if not isinstance(out, dict):  # pragma: no cover - a dict's JSON form is a dict
        raise ConfigurationError("a session's state must be a dict")
    return out


def _merged(now: _Now, app: _Shared, user: _Shared) -> dict[str, Any]:
    """The state a session reads as: its own, then app and user state with their prefixes,
    with the deltas of the events not yet folded into them."""
    record = now.record
    state = dict(record["state"])
    app_state, user_state = dict(app[0]), dict(user[0])
    for e in now.gap:
        deltas, key = _deltas(e.text), _slot(record["token"], e.rev)
        state.update(deltas["session"])
        if key not in app[1]:
            app_state.update(deltas["app"])
        if key not in user[1]:
            user_state.update(deltas["user"])
    state.update({State.APP_PREFIX + k: v for k, v in app_state.items()})
    state.update({State.USER_PREFIX + k: v for k, v in user_state.items()})
    return state


def _session_of(
    now: _Now, app: _Shared, user: _Shared, events: list[Event] | None = None
) -> Session:
    """The ADK session ``now`` reads as, with the app's and the user's state merged in and
    the storage marker that later appends check it by."""
    record = now.record
    session = Session(
        app_name=record["app_name"],
        user_id=record["user_id"],
        id=record["id"],
        state=_merged(now, app, user),
        events=events or [],
        last_update_time=now.update_time,
    )
    _mark(session, now)
    return session


def _stale(session: Session, now: _Now) -> bool:
    """Whether ``session`` was loaded before the stored revision, as ADK's
    ``DatabaseSessionService`` tells: by the revision marker the session carries, else (a
    session this service did not return) by its update time and newest event."""
    marker = getattr(session, _MARKER, None)
    if marker is not None:
        return bool(marker != now.marker)
    if now.update_time <= session.last_update_time:
        return False
    newest = json.loads(now.newest.text).get("id") if now.newest is not None else None
    return newest != (session.events[-1].id if session.events else None)


def _mark(session: Session, now: _Now) -> None:
    session.last_update_time = now.update_time
    if _MARKER in Session.__private_attributes__:
        setattr(session, _MARKER, now.marker)


def _stripped(session_id: str | None) -> str | None:
    if session_id is not None and not isinstance(session_id, str):
        raise ConfigurationError(f"a session id is a string, got {type(session_id).__name__}")
    return session_id.strip() if session_id else session_id


# -- the session service ----------------------------------------------------------------------


class ZerdaSessionService(BaseSessionService):
    """ADK's ``BaseSessionService`` over a Zerda store (default: a new
    :class:`~zerda.stores.InMemoryStore`).

    Every method keeps ADK's semantics: ``create_session`` raises ``AlreadyExistsError`` for
    an id taken, ``get_session`` gives ``None`` for none and honours ``GetSessionConfig``,
    ``list_sessions`` gives sessions without events, oldest update first, ``append_event``
    skips partial events, applies ``temp:`` state to the session object only and raises
    ``StaleSessionError`` when the session was changed in storage since it was loaded.
    Any number of services, tasks and processes may share the store.
    """

    def __init__(self, store: Store | AsyncStore | None = None) -> None:
        given = store if store is not None else InMemoryStore()
        if not isinstance(given, (Store, AsyncStore)):
            raise ConfigurationError(
                f"ZerdaSessionService takes a Zerda store, got {type(given).__name__}"
            )
        self.store = given
        self._io: AsyncStore = as_async(given)

    # -- sessions ---------------------------------------------------------------------------

    async def create_session(
        self,
        *,
        app_name: str,
        user_id: str,
        state: dict[str, Any] | None = None,
        session_id: str | None = None,
    ) -> Session:
        """A new session: its record is written if none is there, in one atomic step; then
        its ``app:`` and ``user:`` state is merged into the app's and the user's."""
        session_id = _stripped(session_id) or _adk_uuid.new_uuid()
        zid = zerda_session_id(app_name, user_id, session_id)
        scoped = _scoped(_json_state(state or {}))
        now = _adk_time.get_time()
        record: dict[str, Any] = {
            "app_name": app_name,
            "user_id": user_id,
            "id": session_id,
            "token": uuid.uuid4().hex[:16],
            "rev": 0,
            "state": scoped["session"],
            "create_time": now,
            "update_time": now,
        }
        if not await self._io.acompare_and_set(zid, SESSION_KEY, None, record):
            raise AlreadyExistsError(f"Session with id {session_id} already exists.")
        await self._apply_shared(record, scoped, _slot(record["token"], 0))
        return _session_of(_now_of(record, []), *await self._shared(app_name, user_id))

    async def get_session(
        self,
        *,
        app_name: str,
        user_id: str,
        session_id: str,
        config: GetSessionConfig | None = None,
    ) -> Session | None:
        """The session with its events (those ``config`` asks for), or ``None``: with
        ``num_recent_events`` or ``after_timestamp``, the newest turns are read, as many as
        hold them, never the whole session."""
        session_id = _stripped(session_id) or ""
        zid = zerda_session_id(app_name, user_id, session_id)
        wanted = config.num_recent_events if config is not None else None
        after = config.after_timestamp if config is not None else None
        found = await self._read(zid, wanted, after)
        if found is None:
            return None
        now, events = found
        return _session_of(now, *await self._shared(app_name, user_id), events)

    async def list_sessions(
        self, *, app_name: str, user_id: str | None = None
    ) -> ListSessionsResponse:
        """The app's sessions (the user's, given ``user_id``) without events, oldest update
        first: the store's list of sessions and each one's record, no event read (a commit
        being written shows once it is folded into the record)."""
        listed = [
            info.session_id
            for info in await self._io.alist_sessions()
            if _may_hold(info.session_id, app_name, user_id)
        ]
        metadata = await asyncio.gather(*(self._io.aget_metadata(zid) for zid in listed))
        records = [
            record
            for zid, m in zip(listed, metadata, strict=True)
            if (record := _record_of(m.get(SESSION_KEY), zid)) is not None
            and record["app_name"] == app_name
            and (user_id is None or record["user_id"] == user_id)
        ]
        users = sorted({r["user_id"] for r in records})
        app = _shared_of((await self._io.aget_metadata(zerda_session_id(app_name))).get(STATE_KEY))
        user_records = await asyncio.gather(
            *(self._io.aget_metadata(zerda_session_id(app_name, u)) for u in users)
        )
        by_user = {
            u: _shared_of(m.get(STATE_KEY)) for u, m in zip(users, user_records, strict=True)
        }
        sessions = [
            _session_of(_now_of(record, []), app, by_user[record["user_id"]]) for record in records
        ]
        sessions.sort(key=lambda s: (s.last_update_time, s.user_id, s.id))
        return ListSessionsResponse(sessions=sessions)

    async def delete_session(self, *, app_name: str, user_id: str, session_id: str) -> None:
        """Forget the session: its events and its record (app and user state stay)."""
        session_id = _stripped(session_id) or ""
        await self._io.adelete_session(zerda_session_id(app_name, user_id, session_id))

    async def get_user_state(self, *, app_name: str, user_id: str) -> dict[str, Any]:
        """The user's state, its keys without ``user:``."""
        return dict((await self._shared(app_name, user_id))[1][0])

    # -- events -----------------------------------------------------------------------------

    async def append_event(self, session: Session, event: Event) -> Event:
        """Commit ``event`` to ``session`` if the session is the stored revision.

        The commit is one atomic append of the event's messages, the first of which has the
        id of the session's next revision: a store keeps one message per id, so of two
        appends from one revision one is stored and the other raises ``StaleSessionError``,
        storing nothing. The event's state delta then goes into the session's record (and
        the app's and the user's), by compare-and-set; a reader sees it at once all the same,
        and the next append does it if this process dies first. The same event appended
        again (a retry after an error) is stored once."""
        if not isinstance(session, Session):
            raise ConfigurationError(f"append_event takes a Session, got {type(session).__name__}")
        if not isinstance(event, Event):
            raise InvalidMessageError(f"append_event takes an Event, got {type(event).__name__}")
        if event.partial:
            return event
        self._apply_temp_state(session, event)
        event = self._trim_temp_delta_state(event)
        text = _dumped(event)
        name = None if type(event) is Event else _class_name(type(event))
        zid = zerda_session_id(session.app_name, session.user_id, session.id)
        nonce = uuid.uuid4().hex[:8]
        while True:
            now = await self._now(zid)
            if now is None:
                raise SessionNotFoundError(f"Session {session.id} not found.")
            if now.newest is not None and now.newest.text == text:
                mine = now.newest  # the event again, once committed: nothing to add
                break
            if _stale(session, now):
                raise StaleSessionError(
                    f"session {session.id!r} was changed in storage since it was loaded (by "
                    "another runner or process): reload it with get_session before appending"
                )
            now = await self._fold(zid, now)
            mine = _Stored(now.rev + 1, text, name, event.timestamp)
            batch = _messages_of(text, name, _slot(now.record["token"], mine.rev), nonce)
            stored = await self._io.aappend(zid, batch)
            if stored == len(batch):
                break
            if stored:  # the revision was taken: take back the other messages this one stored
                await self._io.adelete_messages(zid, [m.id for m in batch[1:] if m.id])
        committed = _Now(now.record, [*now.gap, mine] if mine.rev > now.rev else now.gap, mine)
        # The session object follows at once, before any await, so that another task
        # appending through it sees the revision it now holds.
        _mark(session, committed)
        if not (session.events and session.events[-1] == event):
            self._commit_event_to_session(session, event)
        await self._fold(zid, committed)
        return event

    async def delete_events(
        self, *, app_name: str, user_id: str, session_id: str, event_ids: Sequence[str]
    ) -> int:
        """Remove the session's events with these ids (ADK has no way to: google/adk-python
        #1013); how many were removed. Their state deltas stay applied, and a session loaded
        before keeps them in memory. The events' messages are deleted in one atomic step, and
        a Zerda summary covering them is forgotten, as every edit of a Zerda session does."""
        if isinstance(event_ids, (str, bytes)) or not isinstance(event_ids, Sequence):
            raise ConfigurationError(
                f"event_ids must be a list of event ids, got {type(event_ids).__name__}"
            )
        wanted = set(event_ids)
        session_id = _stripped(session_id) or ""
        zid = zerda_session_id(app_name, user_id, session_id)
        now = await self._now(zid)
        if now is None:
            raise SessionNotFoundError(f"Session {session_id} not found.")
        now = await self._fold(zid, now)  # their deltas are in the record before they go
        history = await self._io.ahistory(zid)
        token = now.record["token"]
        slots = {e.rev for e in _stored_events(history, token) if _id_of(e.text) in wanted}
        bases = {_slot(token, rev) for rev in slots}
        ids = [m.id for m in history if m.id is not None and _base_of(m) in bases]
        if not ids:
            return 0
        await adrive(_removal(zid, ids, changed_turn(history, set(ids))), self._io)
        return len(bases)

    # -- reading ----------------------------------------------------------------------------

    async def _now(self, zid: str) -> _Now | None:
        """The session's record and newest events: its newest turn, or more when that holds
        none of its events (messages other code added after them)."""
        turns = 1
        while True:
            tail: Tail = await self._io.atail(zid, turns, None)
            record = _record_of(tail.metadata.get(SESSION_KEY), zid)
            if record is None:
                return None
            events = _stored_events(tail.messages, record["token"])
            if events or tail.complete:
                return _now_of(record, events)
            turns *= 2

    async def _read(
        self, zid: str, wanted: int | None, after: float | None
    ) -> tuple[_Now, list[Event]] | None:
        """The session and the events asked for: the newest ``wanted``, those from the newest
        back to the first older than ``after``. Read by whole turns from the newest, doubling
        until they hold those events and every event not yet folded into the record."""
        turns: int | None = None
        if wanted is not None or after is not None:
            turns = max(1, (wanted or 8) // 4)  # a turn is a few events: read more if short
        while True:
            tail: Tail = await self._io.atail(zid, turns, None)
            record = _record_of(tail.metadata.get(SESSION_KEY), zid)
            if record is None:
                return None
            events = _stored_events(tail.messages, record["token"])
            chosen, enough = _chosen(events, wanted, after)
            folded = bool(events) and events[0].rev <= record["rev"]  # no older unfolded one
            if turns is None or tail.complete or (enough and folded):
                return _now_of(record, events), [_loaded(e.text, e.name, zid) for e in chosen]
            turns *= 2

    async def _shared(self, app_name: str, user_id: str) -> tuple[_Shared, _Shared]:
        app, user = await asyncio.gather(
            self._io.aget_metadata(zerda_session_id(app_name)),
            self._io.aget_metadata(zerda_session_id(app_name, user_id)),
        )
        return _shared_of(app.get(STATE_KEY)), _shared_of(user.get(STATE_KEY))

    # -- folding commits into the record ----------------------------------------------------

    async def _fold(self, zid: str, now: _Now) -> _Now:
        """Bring the record up to date with the events committed after it: their app and user
        deltas first (each commit's once), then their session deltas, time and revision, by
        compare-and-set. Whoever folds first wins; the others find it done."""
        while now.gap:
            record = now.record
            state = dict(record["state"])
            for e in now.gap:
                deltas = _deltas(e.text)
                await self._apply_shared(record, deltas, _slot(record["token"], e.rev))
                state.update(deltas["session"])
            new = {**record, "rev": now.rev, "state": state, "update_time": now.update_time}
            if await self._io.acompare_and_set(zid, SESSION_KEY, record, new):
                return _Now(new, [], now.newest)
            fresh = await self._now(zid)
            if fresh is None:
                raise SessionNotFoundError(f"Session {record['id']} not found.")
            now = fresh
        return now

    async def _apply_shared(
        self, record: Mapping[str, Any], deltas: Mapping[str, Mapping[str, Any]], key: str
    ) -> None:
        for scope, names in (
            ("app", (record["app_name"],)),
            ("user", (record["app_name"], record["user_id"])),
        ):
            if deltas[scope]:
                await self._apply(zerda_session_id(*names), deltas[scope], key)

    async def _apply(self, zid: str, delta: Mapping[str, Any], key: str) -> None:
        """Merge ``delta`` into the state record of ``zid`` by compare-and-set, once."""
        while True:
            raw = (await self._io.aget_metadata(zid)).get(STATE_KEY)
            state, applied = _shared_of(raw)
            if key in applied:
                return
            new = {"state": {**state, **delta}, "applied": [*applied, key][-_APPLIED:]}
            if await self._io.acompare_and_set(zid, STATE_KEY, raw, new):
                return

    def __repr__(self) -> str:
        return f"ZerdaSessionService({type(self.store).__name__})"


def _base_of(message: Message) -> str | None:
    """The id of the first message of the event ``message`` stores part of."""
    kept = message.metadata.get(METADATA_KEY)
    if not isinstance(kept, Mapping):
        return None
    if isinstance(kept.get("event"), str):
        return message.id
    of = kept.get("of")
    return of if isinstance(of, str) else None


def _id_of(text: str) -> str | None:
    value = json.loads(text).get("id")
    return value if isinstance(value, str) else None


def _chosen(
    events: list[_Stored], wanted: int | None, after: float | None
) -> tuple[list[_Stored], bool]:
    """The events that ``wanted`` and ``after`` choose of ``events``, as ADK's in-memory
    service chooses them, and whether ``events`` held enough to tell."""
    chosen = events
    enough = True
    if wanted is not None:
        enough = len(events) >= wanted
        chosen = events[len(events) - wanted :] if wanted else []
    if after is not None:
        # From the newest back to the first event older than ``after``; without a count,
        # the events read must reach back to that event.
        cut = next(
            (i for i in range(len(chosen) - 1, -1, -1) if (chosen[i].stamp or 0.0) < after), None
        )
        if cut is not None:
            chosen = chosen[cut + 1 :]
        elif wanted is None:
            enough = False
    return chosen, enough


def _removal(session_id: str, ids: list[str], first: int | None) -> Flow[int]:
    """Delete the messages ``ids`` (one atomic step), then forget a summary of the session
    made of them, as every edit does."""
    deleted: int = yield DeleteMessages(session_id, ids)
    if deleted and first is not None:
        yield from forget_summary(session_id, first, mark_absent=False)
    return deleted


# -- what the model sees ------------------------------------------------------------------------

_CALL_KEYS = ("function_call", "functionCall")
_RESPONSE_KEYS = ("function_response", "functionResponse")
_READ_KEYS = ("text", "inline_data", "inlineData", "file_data", "fileData", *_CALL_KEYS)


def _readable(part: Mapping[str, Any]) -> dict[str, Any]:
    """``part`` as :func:`~zerda.formats.from_gemini` reads it: a part of a kind Gemini's
    format does not have (code execution, ...) becomes a text part of its JSON, counted as
    such."""
    if any(part.get(k) is not None for k in (*_READ_KEYS, *_RESPONSE_KEYS)):
        return dict(part)
    return {"text": shown_json(part)}


def _groups(content: Mapping[str, Any]) -> list[tuple[int, ...]]:
    """The parts of each message :func:`~zerda.formats.from_gemini` makes of ``content``: one
    for a model content; for a user content, one per run of parts that are not function
    responses, and one per function response."""
    parts = content["parts"]
    if content.get("role") == "model":
        return [tuple(range(len(parts)))]
    out: list[tuple[int, ...]] = []
    run: list[int] = []
    for j, part in enumerate(parts):
        if any(part.get(k) is not None for k in _RESPONSE_KEYS):
            if run:
                out.append(tuple(run))
                run = []
            out.append((j,))
        else:
            run.append(j)
    if run:
        out.append(tuple(run))
    return out


class ZerdaContext:
    """An ``LlmAgent(before_model_callback=...)`` that sends the model what a Zerda memory
    would of the contents ADK built for the request.

    ``k``: the last ``k`` turns; ``token_limit``: the newest whole turns within that many
    tokens, counted by ``counter`` (Zerda's default counter when unset), less
    ``reserve_tokens`` (room for the instructions, the tools and the reply); neither: every
    turn. A turn is a user content and everything after it up to the next one (function
    responses belong to their call's turn). Repaired as Zerda repairs a context: a function
    response whose call is not sent is left out, a call whose response is missing is taken out
    of its content, the contents never open on a reply. ``overflow``: when the newest turn
    alone is over the budget, ``"raise"`` :class:`~zerda.ContextOverflowError` (the run fails
    before the request), or ``"truncate"``: keep the newest messages of it that fit.

    The contents kept are the objects ADK built, in their order; a content only some of whose
    parts are kept is a copy holding those parts. The system instruction and the tools are not
    contents: they are sent as ADK built them. The session's events are not changed.
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
            "ZerdaContext",
            k=k,
            token_limit=token_limit,
            counter=counter,
            reserve_tokens=reserve_tokens,
            overflow=overflow,
            strict=strict,
        )
        self.k = k
        self.token_limit = token_limit

    def select(self, contents: Sequence[types.Content]) -> list[types.Content]:
        """The contents to send: what the memory keeps of ``contents`` (see the class)."""
        if isinstance(contents, (str, bytes, Mapping)) or not isinstance(contents, Sequence):
            raise InvalidMessageError(
                f"ZerdaContext takes a list of Content, got {type(contents).__name__}"
            )
        dumped = [_readable_content(c, i) for i, c in enumerate(contents)]
        _with_ids(dumped)
        try:
            messages = from_gemini({"contents": [d for d in dumped if d is not None]})
        except (InvalidMessageError, TypeError, ValueError) as exc:
            warn(f"ZerdaContext cannot read the contents ({exc}); they are sent whole")
            return list(contents)
        batch: list[Message] = []
        where: dict[str, tuple[int, tuple[int, ...], Message]] = {}
        at = iter(messages)
        for i, data in enumerate(dumped):
            for g, parts in enumerate(_groups(data) if data is not None else ()):
                message = dataclasses.replace(next(at), id=f"{i}.{g}")
                where[f"{i}.{g}"] = (i, parts, message)
                batch.append(message)
        memory = self._make(InMemoryStore())
        memory.add_messages(batch)
        # For each content kept, its parts kept, each the part given or a shortened copy.
        kept: dict[int, dict[int, types.Part]] = {}
        for shown in memory.get_context():
            i, parts, original = where[shown.id or ""]
            data = dumped[i]
            assert data is not None  # only contents with parts became messages
            given = contents[i].parts or []
            chosen = {j: given[j] for j in parts}
            if len(shown.tool_calls) != len(original.tool_calls):
                left = {c.id for c in shown.tool_calls}
                calls = [j for j in parts if _is_call(data, j)]
                for call, j in zip(original.tool_calls, calls, strict=True):
                    if call.id not in left:
                        del chosen[j]
            chosen.update(_shortened(given, data, parts, original, shown))
            kept.setdefault(i, {}).update(chosen)
        out: list[types.Content] = []
        for i, content in enumerate(contents):
            if dumped[i] is None:  # a content without parts is no message: it stays as it is
                out.append(content)
            elif i in kept:
                given = content.parts or []
                chosen_parts = [kept[i][j] for j in sorted(kept[i])]
                if len(chosen_parts) == len(given) and all(
                    a is b for a, b in zip(chosen_parts, given, strict=True)
                ):
                    out.append(content)
                else:
                    out.append(content.model_copy(update={"parts": chosen_parts}))
        return out

    def __call__(self, callback_context: CallbackContext, llm_request: LlmRequest) -> None:
        """Shorten ``llm_request.contents`` to what the memory keeps; ``None``: ADK goes on to
        call the model."""
        llm_request.contents = self.select(llm_request.contents)

    def __repr__(self) -> str:
        if self.token_limit is not None:
            return f"ZerdaContext(token_limit={self.token_limit})"
        return f"ZerdaContext(k={self.k})" if self.k is not None else "ZerdaContext()"


def _is_call(content: Mapping[str, Any], j: int) -> bool:
    return any(content["parts"][j].get(k) is not None for k in _CALL_KEYS)


def _readable_content(content: object, i: int) -> dict[str, Any] | None:
    """``content`` as :func:`~zerda.formats.from_gemini` reads it (``None`` for one without
    parts, which is no message)."""
    if not isinstance(content, types.Content):
        raise InvalidMessageError(
            f"contents[{i}] must be a google.genai Content, got {type(content).__name__}"
        )
    data = content.model_dump(mode="json", exclude_none=True)
    parts = data.get("parts")
    return {**data, "parts": [_readable(p) for p in parts]} if parts else None


def _with_ids(contents: Sequence[dict[str, Any] | None]) -> None:
    """Give each call and response without an id one, in place (ADK takes its own ids out of
    what the model is sent): a response answers the call at its place in the content just
    before, as Gemini pairs them, or none (then repair leaves it out)."""
    previous: list[tuple[Any, str]] = []  # the calls of the content before: (name, id)
    for i, content in enumerate(contents):
        if content is None:
            continue
        made: list[tuple[Any, str]] = []
        answered = 0
        for j, part in enumerate(content["parts"]):
            for key in (*_CALL_KEYS, *_RESPONSE_KEYS):
                if part.get(key) is None:
                    continue
                inner = dict(part[key])
                if key in _CALL_KEYS:
                    inner["id"] = inner.get("id") or f"zerda-{i}.{j}"
                    made.append((inner.get("name"), inner["id"]))
                else:
                    call = previous[answered] if answered < len(previous) else None
                    paired = call is not None and call[0] == inner.get("name")
                    inner["id"] = inner.get("id") or (
                        call[1] if call is not None and paired else f"zerda-orphan-{i}.{j}"
                    )
                    answered += 1
                part[key] = inner
        previous = made


def _shortened(
    given: Sequence[types.Part],
    data: Mapping[str, Any],
    parts: tuple[int, ...],
    original: Message,
    shown: Message,
) -> dict[int, types.Part]:
    """The parts (by index) whose texts the memory cut to fit the budget (``overflow=
    "truncate"``), cut likewise: the text of a text part, the output of a function response."""
    if shown.content == original.content:
        return {}
    texts = [j for j in parts if not _is_call(data, j)]
    cut: dict[int, str] = {}
    if isinstance(shown.content, str) and len(texts) == 1:
        cut[texts[0]] = shown.content
    elif isinstance(shown.content, tuple) and isinstance(original.content, tuple):
        pairs = zip(texts, original.content, shown.content, strict=False)
        cut = {j: b.text for j, a, b in pairs if a != b and isinstance(b, TextPart)}
    out = {}
    for j, text in cut.items():
        part = given[j]
        if part.function_response is not None:
            response = part.function_response.model_copy(update={"response": {"output": text}})
            out[j] = part.model_copy(update={"function_response": response})
        elif part.text is not None:
            out[j] = part.model_copy(update={"text": text})
        else:  # a part Gemini's format does not have, counted as its JSON: now that text, cut
            out[j] = types.Part(text=text)
    return out
