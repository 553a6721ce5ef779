"""The REST API under ``/v1``: sessions, messages, contexts and metadata, per tenant.

Each handler authenticates (one metadata read: see :mod:`zerda.server._keys`), maps the
client's session id into its tenant's namespace, and does its work through Zerda's memories
and the store's async methods (a sync store runs in worker threads, so the event loop never
blocks on I/O).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, cast

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import BaseRoute, Route
from starlette.types import Lifespan

from zerda import formats
from zerda.errors import (
    InvalidMessageError,
    MessageNotFoundError,
    SessionExistsError,
    ZerdaError,
)
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationTokenBufferMemory,
)
from zerda.messages import Message, stamped_batch
from zerda.server._http import (
    ApiError,
    Handler,
    JSONResponse,
    Metrics,
    Observe,
    query_int,
    read_json,
    route,
)
from zerda.server._keys import KeyRing, Tenant
from zerda.server._mcp import mcp_mount
from zerda.server._openapi import openapi
from zerda.server._otel import RESULTS
from zerda.server._store_api import (
    edit_content,
    given_tokens,
    message_missing,
    store_routes,
    tail_json,
    tail_wanted,
)
from zerda.server._ui import ui_routes
from zerda.stores._base import (
    RESERVED_PREFIX,
    AsyncOverThread,
    AsyncStore,
    BoundedCache,
    SessionInfo,
    Store,
    check_batch,
    metadata_copy,
    session_exists,
)
from zerda.tokens import TokenCounter, counter_by_name

__all__ = ["DEFAULT_MAX_BODY", "create_app"]

log = logging.getLogger("zerda.server")

DEFAULT_MAX_BODY = 4 * 1024 * 1024
"""Bytes a request body may hold (``zerda serve --max-body``)."""
MAX_PAGE = 1000
DEFAULT_PAGE = 100
# The stored turns GET .../inspect accounts for message by message when turns= is not given.
DEFAULT_INSPECTED = 50

# The converters a context is returned through, by the name ``format=`` takes.
_TO: dict[str, Callable[[list[Message]], object]] = {
    "openai": formats.to_openai,
    "responses": formats.to_responses,
    "anthropic": formats.to_anthropic,
    "gemini": formats.to_gemini,
    "zerda": lambda messages: [m.to_dict() for m in messages],
}
_MEMORIES = ("buffer", "window", "token", "summary_buffer")


def _session_json(info: SessionInfo) -> dict[str, Any]:
    return {
        "id": info.session_id,
        "messages": info.messages,
        "turns": info.turns,
        "created_at": info.created_at,
        "updated_at": info.updated_at,
        "expires_at": info.expires_at,
    }


def _user_metadata(metadata: Mapping[str, Any]) -> dict[str, Any]:
    """Session metadata without Zerda's own keys (the summary state)."""
    return {k: v for k, v in metadata.items() if not k.startswith(RESERVED_PREFIX)}


def _cursor(session_id: str) -> str:
    return base64.urlsafe_b64encode(session_id.encode()).decode().rstrip("=")


def _after(cursor: str) -> str:
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        after = base64.b64decode(padded, altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        after = None
    if after is None or _cursor(after) != cursor:
        raise ApiError(422, "InvalidParameter", "cursor is not one this server gave")
    return after


class _Service:
    """The service over one store: who is asking, the operations (which the MCP tools share),
    and the REST handlers that parse a request into one."""

    def __init__(
        self,
        store: Store,
        *,
        auth: bool,
        max_body: int,
        counter: str,
        metrics: Metrics,
        async_store: AsyncStore | None = None,
    ) -> None:
        self.store = store
        self.counter = counter_by_name(counter)  # now: a warning about it shows at start-up
        # What requests (and the memories they use) go through: the native async store when
        # there is one, else the sync store's calls in threads (a SQLite store's short ones at
        # once).
        self.astore: AsyncStore = AsyncOverThread(store) if async_store is None else async_store
        self.keys = KeyRing(store)
        self.auth = auth
        self.max_body = max_body
        self.metrics = metrics
        self.document = openapi()  # what /openapi.json answers, and what routes accept
        self.memories: BoundedCache[tuple[str | None, ...], BaseMemory[Any]] = BoundedCache(
            _MEMORIES_KEPT
        )

    # -- who is asking -----------------------------------------------------------------------

    async def tenant(self, request: Request) -> Tenant:
        if not self.auth:
            return Tenant(None)
        header = request.headers.get("authorization", "")
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise ApiError(401, "Unauthorized", "send an API key: Authorization: Bearer KEY")
        record = await self.keys.alookup(self.astore, key.strip())
        if record is None:
            raise ApiError(401, "Unauthorized", "the API key is not valid (unknown or revoked)")
        request.scope["zerda.tenant"] = record.tenant
        return Tenant(record.tenant)

    async def session(self, request: Request) -> tuple[Tenant, str]:
        """The tenant and the store's id of the session the path names."""
        tenant = await self.tenant(request)
        return tenant, tenant.stored_id(request.path_params["session_id"])

    async def require(self, stored: str, session_id: str) -> None:
        """404 unless the session exists (holds a message or metadata) for this tenant."""
        if (await self.astore.atail(stored, 0)).total_messages:
            return
        if await self.astore.aget_metadata(stored):
            return
        raise ApiError(404, "NotFound", f"no session {session_id!r} here")

    def memory_for(self, stored: str, params: Mapping[str, str]) -> BaseMemory[Any]:
        """The memory ``params`` describe on the session ``stored``: the same object for the
        same session and settings, so that what it learns reading (how many turns its
        context takes, which part of the log it found valid) saves the next read's work."""
        key = (stored, *(params.get(name) for name in _MEMORY_PARAMS))
        memory = self.memories.lookup(key)
        if memory is None:
            memory = _memory(params, stored, self.astore, self.counter_for(params))
            self.memories.put(key, memory)
        return memory

    def counter_for(self, params: Mapping[str, str]) -> TokenCounter:
        """The counter ``counter=`` names, else the server's."""
        name = params.get("counter")
        return self.counter if name is None else counter_by_name(name)

    # -- the operations, whatever the front door (REST here, MCP tools in _mcp) ---------------

    def sessions_page(
        self, tenant: Tenant, sessions: Sequence[SessionInfo], limit: int, cursor: str | None
    ) -> dict[str, Any]:
        """A page of ``tenant``'s ``sessions``, by id, after ``cursor``."""
        mine = sorted(tenant.visible(sessions), key=lambda s: s.session_id)
        if cursor:
            after = _after(cursor)
            mine = [s for s in mine if s.session_id > after]
        page = mine[: min(limit, MAX_PAGE)]
        more = len(mine) > len(page)
        return {
            "sessions": [_session_json(s) for s in page],
            "next_cursor": _cursor(page[-1].session_id) if more else None,
        }

    async def append_body(
        self, stored: str, body: object, counter: str | None = None
    ) -> dict[str, Any]:
        """Store the messages of an append body (see ``_messages_of``; ``"tokens"`` and
        ``"tail"`` serve HTTPStore); counted by ``counter``, else the server's counter."""
        messages = _messages_of(body)
        assert isinstance(body, dict)  # _messages_of checked it
        given, then_tail = given_tokens(body), tail_wanted(body)
        if body.get("format") == "zerda":  # the store API's form: stored exactly as given
            batch = cast("list[Message]", messages)
        else:
            batch = stamped_batch(messages, time.time())
        if given is None:
            count = self.counter if counter is None else counter_by_name(counter)
            counts = {count.name: [count.count_message(m) for m in batch]}
        elif counter is not None:
            raise ApiError(422, "InvalidParameter", 'give "tokens" or counter=, not both')
        else:
            check_batch(batch, given)
            counts = given
        answer: dict[str, Any] = {"ids": [m.id for m in batch]}
        if then_tail is None:
            answer["appended"] = await self.astore.aappend(stored, batch, counts)
        else:
            turns, name = then_tail
            appended, tail = await self.astore.aappend_then_tail(stored, batch, counts, turns, name)
            answer.update(appended=appended, tail=tail_json(tail))
        return answer

    async def history_of(self, stored: str, session_id: str) -> list[dict[str, Any]]:
        """Every message of the session, in Zerda's lossless form; 404 for no session."""
        messages = await self.astore.ahistory(stored)
        if not messages:
            await self.require(stored, session_id)
        return [m.to_dict() for m in messages]

    async def context_of(
        self, stored: str, session_id: str, params: Mapping[str, str]
    ) -> dict[str, Any]:
        """``{"messages", "stats"}``: the context of the memory ``params`` describe (memory, k,
        token_limit, reserve, counter, format), exactly as the library gives it."""
        fmt = params.get("format", "openai")
        if fmt not in _TO:
            raise ApiError(
                422, "InvalidParameter", f"format must be one of {', '.join(_TO)}, got {fmt!r}"
            )
        memory = self.memory_for(stored, params)
        # (A summary memory's read folds what the context no longer holds, appends here
        # having gone straight to the store.) The stats are those memory.inspect() gives,
        # from the memory's own read: the account's cheap part, on every request.
        messages, stats = await memory.aget_context_with_stats()
        if not messages and stats["stored_messages"] == 0:
            await self.require(stored, session_id)
        tokens = stats.get("context_tokens")
        if isinstance(tokens, int):
            self.metrics.served(tokens)
        return {"messages": _TO[fmt](messages), "stats": stats}

    async def inspection_of(
        self, stored: str, session_id: str, params: Mapping[str, str]
    ) -> dict[str, Any]:
        """``memory.inspect()`` of the memory ``params`` describe (as for the context), for
        the newest ``turns`` stored turns (default 50), as JSON."""
        turns = query_int(params, "turns", minimum=0)
        memory = self.memory_for(stored, {k: v for k, v in params.items() if k != "turns"})
        inspection = await memory.ainspect(
            turns=DEFAULT_INSPECTED if turns is None else turns,
            token_counter=self.counter_for(params),
        )
        if not inspection.stats["stored_messages"] and not inspection.system:
            await self.require(stored, session_id)
        return {**inspection.as_dict(), "session_id": session_id}  # the tenant's own id

    async def delete(self, stored: str, session_id: str) -> None:
        if not await self.astore.adelete_session(stored):
            raise ApiError(404, "NotFound", f"no session {session_id!r} here")

    # -- editing (through a memory: a deleted call takes its results, a summary that held
    #    what changed is dropped; see docs/editing.md) --------------------------------------

    def editor(self, stored: str) -> ConversationBufferMemory:
        return ConversationBufferMemory(store=self.astore, session_id=stored)

    async def delete_message(self, stored: str, session_id: str, message_id: str) -> int:
        """Delete one message (and, for a call, its results); 404 when it is not there."""
        await self.require(stored, session_id)
        deleted = await self.editor(stored).adelete_messages([message_id])
        if not deleted:
            raise message_missing(session_id, message_id)
        return deleted

    async def pop(self, stored: str, session_id: str) -> list[dict[str, Any]]:
        """The newest turn, removed; ``[]`` when there is none."""
        await self.require(stored, session_id)
        turn = await self.editor(stored).apop_turn()
        return [] if turn is None else [m.to_dict() for m in turn.messages]

    async def edit(
        self, stored: str, session_id: str, message_id: str, content: object
    ) -> dict[str, Any]:
        """Replace one message's content (a string, null or content parts)."""
        await self.require(stored, session_id)
        try:
            message = await self.editor(stored).aedit_message(message_id, edit_content(content))
        except MessageNotFoundError:
            raise message_missing(session_id, message_id) from None
        return message.to_dict()

    async def fork(
        self, tenant: Tenant, stored: str, session_id: str, new_session_id: object, at: object
    ) -> int:
        """Fork into ``new_session_id`` of the same tenant; how many messages it holds."""
        if not isinstance(new_session_id, str):
            raise ApiError(422, "InvalidBody", '"new_session_id" must be a session id string')
        if at is not None and not isinstance(at, str):
            raise ApiError(422, "InvalidBody", f'"at" must be a message id or null, got {at!r:.80}')
        new_stored = tenant.stored_id(new_session_id)
        await self.require(stored, session_id)
        try:
            await self.editor(stored).afork(new_stored, at)
        except MessageNotFoundError:
            assert at is not None
            raise message_missing(session_id, at) from None
        except SessionExistsError:
            raise ApiError(409, "SessionExistsError", str(session_exists(new_session_id))) from None
        return (await self.astore.atail(new_stored, 0)).total_messages

    # -- REST handlers -----------------------------------------------------------------------

    async def list_sessions(self, request: Request) -> Response:
        tenant = await self.tenant(request)
        limit = query_int(request.query_params, "limit", minimum=1) or DEFAULT_PAGE
        page = self.sessions_page(
            tenant, await self.astore.alist_sessions(), limit, request.query_params.get("cursor")
        )
        request.scope[RESULTS] = len(page["sessions"])
        return JSONResponse(page)

    async def append(self, request: Request) -> Response:
        _, stored = await self.session(request)
        body = await read_json(request, self.max_body)
        answer = await self.append_body(stored, body, request.query_params.get("counter"))
        return JSONResponse(answer, status_code=201)

    async def history(self, request: Request) -> Response:
        _, stored = await self.session(request)
        messages = await self.history_of(stored, request.path_params["session_id"])
        request.scope[RESULTS] = len(messages)
        return JSONResponse({"messages": messages})

    async def context(self, request: Request) -> Response:
        _, stored = await self.session(request)
        params = request.query_params  # only those documented (_by_method checks)
        answer = await self.context_of(stored, request.path_params["session_id"], params)
        request.scope[RESULTS] = answer["stats"]["total_messages"]
        return JSONResponse(answer)

    async def inspect(self, request: Request) -> Response:
        _, stored = await self.session(request)
        answer = await self.inspection_of(
            stored, request.path_params["session_id"], request.query_params
        )
        request.scope[RESULTS] = len(answer["turns"])
        return JSONResponse(answer)

    async def get_metadata(self, request: Request) -> Response:
        _, stored = await self.session(request)
        reserved = request.query_params.get("reserved", "false")
        if reserved not in ("true", "false"):
            raise ApiError(
                422, "InvalidParameter", f"reserved must be true or false, got {reserved!r}"
            )
        metadata = await self.astore.aget_metadata(stored)
        if not metadata:
            await self.require(stored, request.path_params["session_id"])
        shown = metadata if reserved == "true" else _user_metadata(metadata)
        return JSONResponse({"metadata": shown})

    async def patch_metadata(self, request: Request) -> Response:
        _, stored = await self.session(request)
        body = await read_json(request, self.max_body)
        if not isinstance(body, dict) or set(body) != {"metadata"}:
            raise ApiError(
                422, "InvalidBody", 'the body must be {"metadata": {...}} (null deletes a key)'
            )
        values = metadata_copy(_object(body["metadata"], "metadata"))
        await self.astore.aupdate_metadata(stored, values)
        return JSONResponse({"metadata": _user_metadata(await self.astore.aget_metadata(stored))})

    async def delete_session(self, request: Request) -> Response:
        _, stored = await self.session(request)
        await self.delete(stored, request.path_params["session_id"])
        return Response(status_code=204)

    async def delete_one_message(self, request: Request) -> Response:
        _, stored = await self.session(request)
        params = request.path_params
        deleted = await self.delete_message(stored, params["session_id"], params["message_id"])
        return JSONResponse({"deleted": deleted})

    async def patch_message(self, request: Request) -> Response:
        _, stored = await self.session(request)
        body = await read_json(request, self.max_body)
        if not isinstance(body, dict) or set(body) != {"content"}:
            raise ApiError(
                422, "InvalidBody", 'the body must be {"content": text, null or content parts}'
            )
        params = request.path_params
        message = await self.edit(
            stored, params["session_id"], params["message_id"], body["content"]
        )
        return JSONResponse({"message": message})

    async def pop_turn(self, request: Request) -> Response:
        _, stored = await self.session(request)
        messages = await self.pop(stored, request.path_params["session_id"])
        request.scope[RESULTS] = len(messages)
        return JSONResponse({"messages": messages})

    async def fork_session(self, request: Request) -> Response:
        tenant, stored = await self.session(request)
        body = await read_json(request, self.max_body)
        if not isinstance(body, dict) or not {"new_session_id"} <= set(body) <= {
            "new_session_id",
            "at",
        }:
            raise ApiError(
                422, "InvalidBody", 'the body must be {"new_session_id": ..., "at": id or null}'
            )
        new_id = body["new_session_id"]
        held = await self.fork(
            tenant, stored, request.path_params["session_id"], new_id, body.get("at")
        )
        return JSONResponse({"session_id": new_id, "messages": held}, status_code=201)

    async def healthz(self, request: Request) -> Response:
        try:
            await self.astore.aget_metadata("zerda.healthz")
        except ZerdaError as exc:  # the details (the store's address) go to the log only
            log.error("health check: the store does not answer: %s", exc)
            raise ApiError(503, "StoreUnavailableError", "the store does not answer") from None
        return JSONResponse({"status": "ok"})

    async def metrics_text(self, request: Request) -> Response:
        return PlainTextResponse(self.metrics.text(), media_type="text/plain; version=0.0.4")

    async def openapi_json(self, request: Request) -> Response:
        return JSONResponse(self.document)


def _object(value: object, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ApiError(422, "InvalidBody", f"{what} must be a JSON object")
    return value


def _messages_of(body: object) -> list[Message] | list[object]:
    """The messages a POST body carries, in the format it names (``zerda``: Zerda's own dicts,
    as :meth:`Message.to_dict` gives them, to be stored exactly as they are)."""
    body = _object(body, "the body")
    fmt = body.get("format", "openai")
    allowed = {"messages", "format", "tokens", "tail"} | {
        "anthropic": {"system"},
        "gemini": {"system_instruction"},
    }.get(fmt if isinstance(fmt, str) else "", set())
    extra = set(body) - allowed
    if extra:
        raise ApiError(
            422, "InvalidBody", f"unknown fields in the body: {', '.join(sorted(extra))}"
        )
    if "messages" not in body:
        raise ApiError(422, "InvalidBody", 'the body must hold "messages": [...]')
    raw = body["messages"]
    if not isinstance(raw, list):
        raise ApiError(422, "InvalidBody", '"messages" must be a JSON array')
    if fmt == "zerda":  # may be empty, as a store's append may be
        messages = []
        for i, item in enumerate(raw):
            try:
                messages.append(Message.from_dict(item))
            except InvalidMessageError as exc:
                raise InvalidMessageError(f"message {i}: {exc}") from None
        return messages
    if not raw:
        raise ApiError(422, "InvalidBody", '"messages" is empty: nothing to append')
    if fmt == "openai":
        return list(raw)
    if fmt == "responses":
        return formats.from_responses(raw)
    if fmt == "anthropic":
        payload = {"messages": raw}
        if "system" in body:
            payload["system"] = body["system"]
        return formats.from_anthropic(payload)
    if fmt == "gemini":
        payload = {"contents": raw}
        if "system_instruction" in body:
            payload["system_instruction"] = body["system_instruction"]
        return formats.from_gemini(payload)
    raise ApiError(
        422,
        "InvalidBody",
        f"format must be openai, responses, anthropic, gemini or zerda, got {fmt!r}",
    )


# What decides the memory a context read uses (the format only converts its answer).
_MEMORY_PARAMS = ("memory", "k", "token_limit", "reserve", "counter")
# Memories kept between reads (a session and settings each): the recently used ones.
_MEMORIES_KEPT = 4096


def _memory(
    params: Mapping[str, str], stored: str, store: AsyncStore, counter: TokenCounter
) -> BaseMemory[Any]:
    """The memory ``memory=`` names, with its settings, on the session ``stored``."""
    k = query_int(params, "k", minimum=1)
    limit = query_int(params, "token_limit", minimum=1)
    reserve = query_int(params, "reserve") or 0
    kind = params.get("memory") or ("token" if limit else "window" if k else "buffer")
    if kind not in _MEMORIES:
        raise ApiError(
            422, "InvalidParameter", f"memory must be one of {', '.join(_MEMORIES)}, got {kind!r}"
        )
    where: dict[str, Any] = {"store": store, "session_id": stored}
    if kind == "buffer":
        _none_of(params, kind, "k", "token_limit", "reserve", "counter")
        return ConversationBufferMemory(**where)
    if kind == "window":
        _none_of(params, kind, "token_limit", "reserve", "counter")
        return ConversationBufferWindowMemory(k=k or 5, **where)
    _none_of(params, kind, "k")
    if kind == "token":
        return ConversationTokenBufferMemory(
            limit or 2000, token_counter=counter, reserve_tokens=reserve, **where
        )
    return ConversationSummaryBufferMemory(
        limit or 2000, token_counter=counter, reserve_tokens=reserve, **where
    )


def _none_of(params: Mapping[str, str], kind: str, *names: str) -> None:
    given = [n for n in names if n in params]
    if given:
        raise ApiError(422, "InvalidParameter", f"memory={kind} takes no {', '.join(given)}")


def create_app(
    store: Store,
    *,
    auth: bool = True,
    max_body: int = DEFAULT_MAX_BODY,
    counter: str = "default",
    async_store: AsyncStore | None = None,
) -> Starlette:
    """The service over ``store``: an ASGI app to run with uvicorn (``zerda serve`` does).

    ``auth=False`` serves every session of the store to anyone who can connect: for local
    development only. ``counter`` names the token counter (as
    :func:`zerda.tokens.counter_by_name` takes it) whose counts are stored with appended
    messages and that token budgets use when a request names none.

    ``async_store``, the same data as a native async store (``zerda serve`` gives one for
    Redis and Postgres: an :class:`~zerda.stores.AsyncRedisStore` or
    :class:`~zerda.stores.AsyncPostgresStore`), answers the requests instead of ``store``'s
    methods run in threads; the app closes it when it stops.
    """
    metrics = Metrics()
    service = _Service(
        store,
        auth=auth,
        max_body=max_body,
        counter=counter,
        metrics=metrics,
        async_store=async_store,
    )
    session = "/v1/sessions/{session_id}"
    operations = [
        ("/v1/sessions", service.list_sessions, ["GET"]),
        (session + "/messages", service.append, ["POST"]),
        (session + "/messages", service.history, ["GET"]),
        (session + "/context", service.context, ["GET"]),
        (session + "/inspect", service.inspect, ["GET"]),
        (session + "/metadata", service.get_metadata, ["GET"]),
        (session + "/metadata", service.patch_metadata, ["PATCH"]),
        (session, service.delete_session, ["DELETE"]),
        (session + "/messages/{message_id}", service.delete_one_message, ["DELETE"]),
        (session + "/messages/{message_id}", service.patch_message, ["PATCH"]),
        (session + "/pop", service.pop_turn, ["POST"]),
        (session + "/fork", service.fork_session, ["POST"]),
        ("/healthz", service.healthz, ["GET"]),
        ("/metrics", service.metrics_text, ["GET"]),
        ("/openapi.json", service.openapi_json, ["GET"]),
        *store_routes(service),
    ]
    # One route per path, whatever its methods: a 405 then lists them all in its Allow header.
    by_path: dict[str, dict[str, Handler]] = {}
    for path, handler, methods in operations:
        for method in methods:
            by_path.setdefault(path, {})[method] = handler
    # Literal paths first (/v1/sessions/purge-expired before /v1/sessions/{session_id}).
    paths = sorted(by_path, key=lambda path: "{" in path)
    documented = service.document["paths"]
    served: list[BaseRoute] = [
        Route(path, route(path, _by_method(path, handlers, documented)), methods=list(handlers))
        for path, handlers in ((p, by_path[p]) for p in paths)
    ]
    mcp_routes, mcp_lifespan = mcp_mount(service)
    lifespan = _closing(async_store, mcp_lifespan) if async_store is not None else mcp_lifespan
    served += mcp_routes
    served += ui_routes(service)
    app = Starlette(
        routes=served,
        lifespan=lifespan,
        exception_handlers={
            404: _not_found,
            405: _not_allowed,
        },
    )
    app.add_middleware(Observe, metrics=metrics)
    app.state.service = service
    return app


def _closing(store: AsyncStore, inner: Lifespan[Starlette] | None) -> Lifespan[Starlette]:
    """``inner`` (the MCP session manager's lifespan, if any), then ``store`` closed."""

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        try:
            if inner is None:
                yield
            else:
                async with inner(app):
                    yield
        finally:
            await store.aclose()

    return lifespan


def _by_method(path: str, handlers: Mapping[str, Handler], paths: Mapping[str, Any]) -> Handler:
    """One handler for a path: the one for the request's method, once the query holds only
    the parameters the OpenAPI document's ``paths`` give that method (else 422)."""
    document = paths.get(path, {})
    allowed = {
        method: {
            p["name"]
            for p in (
                *document.get("parameters", ()),
                *document.get(method.lower(), {}).get("parameters", ()),
            )
            if p["in"] == "query"
        }
        for method in handlers
    }

    async def dispatch(request: Request) -> Response:
        method = "GET" if request.method == "HEAD" else request.method  # Starlette's HEAD
        unknown = set(request.query_params) - allowed[method]
        if unknown:
            raise ApiError(
                422, "InvalidParameter", f"unknown query parameters: {', '.join(sorted(unknown))}"
            )
        return await handlers[method](request)

    return dispatch


async def _not_found(request: Request, exc: Exception) -> Response:
    return JSONResponse(
        {"error": {"type": "NotFound", "message": f"no route {request.url.path!r}"}},
        status_code=404,
    )


async def _not_allowed(request: Request, exc: Exception) -> Response:
    return JSONResponse(
        {"error": {"type": "MethodNotAllowed", "message": f"{request.method} is not allowed here"}},
        status_code=405,
        headers=getattr(exc, "headers", None),  # Starlette's, with the Allow header
    )
