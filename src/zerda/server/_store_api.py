"""Routes that let :class:`zerda.stores.HTTPStore` run the whole store protocol remotely.

The REST API serves apps; these serve a store: a tail as the store reads it (Zerda's reserved
metadata included), compare-and-set, clearing and purging, editing the log exactly as the
store does (deleting messages, popping a turn, forking, editing a message: no memory is
involved), and the JSON forms of a tail and of the token counts an append may carry.
Everything stays inside the caller's tenant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response

from zerda.errors import InvalidMessageError, MessageNotFoundError, SessionExistsError
from zerda.parts import Part, part_from_dict
from zerda.server._http import ApiError, Handler, JSONResponse, query_int, read_json
from zerda.stores._base import Tail, message_not_found, session_exists

if TYPE_CHECKING:
    from zerda.server._app import _Service

__all__ = ["given_tokens", "store_routes", "tail_json", "tail_wanted"]


def tail_json(tail: Tail) -> dict[str, Any]:
    """A tail as JSON: messages as :meth:`Message.to_dict` gives them."""
    return {
        "system": [m.to_dict() for m in tail.system],
        "messages": [m.to_dict() for m in tail.messages],
        "turn_starts": list(tail.turn_starts),
        "total_turns": tail.total_turns,
        "total_messages": tail.total_messages,
        "tokens": list(tail.tokens),
        "system_tokens": list(tail.system_tokens),
        "metadata": dict(tail.metadata),
    }


def given_tokens(body: Mapping[str, Any]) -> dict[str, list[Any]] | None:
    """The counts an append body gives (``"tokens": {counter: [count, ...]}``), to store
    instead of counting; ``None`` when it gives none. The counts themselves are checked with
    the batch (``check_batch``)."""
    if "tokens" not in body:
        return None
    tokens = body["tokens"]
    if not isinstance(tokens, dict) or not all(isinstance(c, list) for c in tokens.values()):
        raise ApiError(422, "InvalidBody", '"tokens" must map counter names to arrays of counts')
    return tokens


def tail_wanted(body: Mapping[str, Any]) -> tuple[int | None, str | None] | None:
    """The tail an append body asks back (``"tail": {"turns": N, "counter": NAME}``, either
    may be null or left out), or ``None``."""
    if "tail" not in body:
        return None
    wanted = body["tail"]
    if not isinstance(wanted, dict) or not set(wanted) <= {"turns", "counter"}:
        raise ApiError(
            422, "InvalidBody", '"tail" must be {"turns": N or null, "counter": NAME or null}'
        )
    turns, counter = wanted.get("turns"), wanted.get("counter")
    if turns is not None and (type(turns) is not int or turns < 0):
        raise ApiError(422, "InvalidBody", f'"tail.turns" must be an integer >= 0, got {turns!r}')
    if counter is not None and (not isinstance(counter, str) or not counter):
        raise ApiError(422, "InvalidBody", f'"tail.counter" must be a name, got {counter!r}')
    return turns, counter


def _counter(params: Mapping[str, str]) -> str | None:
    name = params.get("counter")
    if name == "":
        raise ApiError(422, "InvalidParameter", "counter must be a counter's name, got ''")
    return name


def message_missing(session_id: str, message_id: str) -> ApiError:
    """404 for a message the session does not hold, naming the session as the caller does
    (the store's error names it with the tenant's prefix)."""
    return ApiError(404, "MessageNotFoundError", str(message_not_found(session_id, message_id)))


def _fields(body: object, required: set[str], optional: set[str], shape: str) -> dict[str, Any]:
    """``body`` if it is an object with the ``required`` fields and maybe ``optional`` ones;
    else 422 saying it must be ``shape``."""
    if not isinstance(body, dict) or not required <= set(body) <= required | optional:
        raise ApiError(422, "InvalidBody", f"the body must be {shape}")
    return body


def edit_content(value: object) -> str | tuple[Part, ...] | None:
    """An edit's content from its JSON: a string, null, or parts as Message.to_dict gives
    them (a part Zerda refuses is an InvalidMessageError, as in an append)."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ApiError(
            422, "InvalidBody", '"content" must be a string, null or an array of content parts'
        )
    parts = []
    for i, part in enumerate(value):
        try:
            parts.append(part_from_dict(part))
        except InvalidMessageError as exc:
            raise InvalidMessageError(f"content part {i}: {exc}") from None
    return tuple(parts)


class _StoreApi:
    """The handlers, over the service's store and its tenants."""

    def __init__(self, service: _Service) -> None:
        self.service = service

    async def tail(self, request: Request) -> Response:
        _, stored = await self.service.session(request)
        params = request.query_params  # only those documented (create_app checks)
        turns = query_int(params, "turns")
        tail = await self.service.astore.atail(stored, turns, _counter(params))
        return JSONResponse(tail_json(tail))

    async def compare_and_set(self, request: Request) -> Response:
        _, stored = await self.service.session(request)
        body = await read_json(request, self.service.max_body)
        if not isinstance(body, dict) or set(body) != {"key", "expected", "value"}:
            raise ApiError(
                422,
                "InvalidBody",
                'the body must be {"key": ..., "expected": ..., "value": ...} (null: absent)',
            )
        if not isinstance(body["key"], str) or not body["key"]:
            raise ApiError(
                422, "InvalidBody", f'"key" must be a non-empty string, got {body["key"]!r}'
            )
        swapped = await self.service.astore.acompare_and_set(
            stored, body["key"], body["expected"], body["value"]
        )
        return JSONResponse({"swapped": swapped})

    # -- editing the log: the store's own operations, each one atomic step --------------------

    async def delete_messages(self, request: Request) -> Response:
        _, stored = await self.service.session(request)
        body = _fields(
            await read_json(request, self.service.max_body),
            {"ids"},
            set(),
            '{"ids": [message id, ...]}',
        )
        ids = body["ids"]
        if not isinstance(ids, list) or not all(isinstance(i, str) and i for i in ids):
            raise ApiError(422, "InvalidBody", '"ids" must be an array of message ids')
        return JSONResponse({"deleted": await self.service.astore.adelete_messages(stored, ids)})

    async def pop_turn(self, request: Request) -> Response:
        _, stored = await self.service.session(request)
        popped = await self.service.astore.apop_turn(stored)
        return JSONResponse({"messages": [m.to_dict() for m in popped]})

    async def fork_session(self, request: Request) -> Response:
        tenant, stored = await self.service.session(request)
        body = _fields(
            await read_json(request, self.service.max_body),
            {"new_session_id"},
            {"at"},
            '{"new_session_id": ..., "at": message id or null}',
        )
        new_id, at = body["new_session_id"], body.get("at")
        if at is not None and not isinstance(at, str):
            raise ApiError(422, "InvalidBody", f'"at" must be a message id or null, got {at!r:.80}')
        new_stored = tenant.stored_id(new_id)  # the same tenant's: 400 for a bad id
        try:
            copied = await self.service.astore.afork(stored, new_stored, at)
        except MessageNotFoundError:
            assert at is not None
            raise self._not_found(request, at) from None
        except SessionExistsError:
            raise ApiError(409, "SessionExistsError", str(session_exists(new_id))) from None
        return JSONResponse({"copied": copied})

    async def edit_message(self, request: Request) -> Response:
        _, stored = await self.service.session(request)
        body = _fields(
            await read_json(request, self.service.max_body),
            {"message_id", "content"},
            set(),
            '{"message_id": ..., "content": text, null or content parts}',
        )
        message_id = body["message_id"]
        if not isinstance(message_id, str):
            raise ApiError(
                422, "InvalidBody", f'"message_id" must be a string, got {message_id!r:.80}'
            )
        content = edit_content(body["content"])
        try:
            message = await self.service.astore.aedit_message(stored, message_id, content)
        except MessageNotFoundError:
            raise self._not_found(request, message_id) from None
        return JSONResponse({"message": message.to_dict()})

    @staticmethod
    def _not_found(request: Request, message_id: str) -> ApiError:
        return message_missing(request.path_params["session_id"], message_id)

    async def clear(self, request: Request) -> Response:
        """Delete every session of the tenant, one by one (other tenants' stay)."""
        tenant = await self.service.tenant(request)
        store = self.service.astore
        deleted = 0
        for info in tenant.visible(await store.alist_sessions()):
            deleted += await store.adelete_session(tenant.prefix + info.session_id)
        if tenant.name is None:
            # The whole store is the caller's: its expired sessions go too, as clear() does.
            await store.apurge_expired()
        return JSONResponse({"deleted": deleted})

    async def purge_expired(self, request: Request) -> Response:
        tenant = await self.service.tenant(request)
        if tenant.name is not None:
            # A store purges all its expired sessions at once; a tenant may not touch
            # another's, nor learn how many there were.
            raise ApiError(
                403,
                "Forbidden",
                "purging expired sessions is store-wide, so it is the operator's job "
                "(purge_expired() on the server's store); expired sessions already read as absent",
            )
        return JSONResponse({"purged": await self.service.astore.apurge_expired()})


def store_routes(service: _Service) -> list[tuple[str, Handler, list[str]]]:
    """The routes, as ``(path, handler, methods)`` for ``create_app`` to serve."""
    api = _StoreApi(service)
    session = "/v1/sessions/{session_id}"
    return [
        (session + "/tail", api.tail, ["GET"]),
        (session + "/compare-and-set", api.compare_and_set, ["POST"]),
        (session + "/delete-messages", api.delete_messages, ["POST"]),
        (session + "/pop-turn", api.pop_turn, ["POST"]),
        (session + "/fork-session", api.fork_session, ["POST"]),
        (session + "/edit-message", api.edit_message, ["POST"]),
        ("/v1/sessions", api.clear, ["DELETE"]),
        ("/v1/sessions/purge-expired", api.purge_expired, ["POST"]),
    ]
