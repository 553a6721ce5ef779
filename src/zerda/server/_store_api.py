"""Routes that let :class:`zerda.stores.HTTPStore` run the whole store protocol remotely.

The REST API serves apps; these serve a store: a tail as the store reads it (Zerda's reserved
metadata included), compare-and-set, clearing and purging, and the JSON forms of a tail and of
the token counts an append may carry. Everything stays inside the caller's tenant.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from zerda.server._http import ApiError, Handler, query_int, read_json
from zerda.stores._base import Tail

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
        ("/v1/sessions", api.clear, ["DELETE"]),
        ("/v1/sessions/purge-expired", api.purge_expired, ["POST"]),
    ]
