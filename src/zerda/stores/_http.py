"""The HTTP store: a remote ``zerda serve`` as a store, over httpx, sync and async."""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Generator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, unquote, urlsplit

from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidMessageError,
    InvalidSessionIdError,
    MessageNotFoundError,
    SessionExistsError,
    StoreUnavailableError,
    SummarizerError,
    ZerdaError,
)
from zerda.messages import Message
from zerda.parts import Part
from zerda.stores._base import (
    AsyncClosingStore,
    ClosingStore,
    SessionInfo,
    Tail,
    TokenCounts,
    check_batch,
    check_ids,
    check_session_id,
    check_timeout,
    metadata_copy,
    redact,
)

if TYPE_CHECKING:
    import httpx

__all__ = ["DEFAULT_TIMEOUT", "AsyncHTTPStore", "HTTPStore", "open_http_url"]

_T = TypeVar("_T")

DEFAULT_TIMEOUT = 5.0
_INSTALL_HINT = "pip install 'zerda-memory[http]'"
_PAGE = 1000  # sessions per page of list_sessions: the most the server gives
_URL_SCHEMES = {"zerda+http": "http", "zerda+https": "https"}
# What an Authorization header can carry as it is: no spaces, no control characters.
_KEY = re.compile(r"[\x21-\x7e]+")
# Zerda's errors, by the name the server gives them in an error answer.
_ERRORS: dict[str, type[ZerdaError]] = {
    kind.__name__: kind
    for kind in (
        ConfigurationError,
        InvalidMessageError,
        InvalidSessionIdError,
        MessageNotFoundError,
        SessionExistsError,
        StoreUnavailableError,
        SummarizerError,
        CorruptDataError,
    )
}


def _httpx() -> Any:
    try:
        import httpx
    except ImportError as exc:
        raise ConfigurationError(f"the HTTP store needs httpx: {_INSTALL_HINT} ({exc})") from exc
    return httpx


_tls: list[Any] = []


def _tls_context() -> Any:
    """The TLS settings of the clients stores make, made once: loading the CA certificates
    takes longer than making a client, and one context serves any number of them."""
    if not _tls:
        _tls.append(_httpx().create_ssl_context())
    return _tls[0]


@dataclass(frozen=True, slots=True)
class _Call:
    """One request to the server. ``doing`` completes "cannot ..." in an error; with
    ``missing``, a 404 for want of the session answers ``None`` (the protocol's empty read)."""

    method: str
    path: str
    doing: str
    params: tuple[tuple[str, str], ...] = ()
    body: Any = None
    missing: bool = False


_Flow = Generator[_Call, Any, _T]
"""An operation written once: it yields calls and is sent each one's decoded JSON answer."""


def _segment(session_id: str) -> str:
    """``session_id`` as one path segment. A segment of dots alone would be read as ``.`` or
    ``..`` and folded into the path, so its dots are escaped."""
    segment = quote(check_session_id(session_id), safe="")
    return "%2E" * len(segment) if not segment.strip(".") else segment


def _turns(turns: object) -> int | None:
    if turns is None:
        return None
    if type(turns) is not int:
        raise ConfigurationError(f"turns must be None or an integer, got {turns!r}")
    return max(turns, 0)  # as the stores take it: fewer than none is none


def _content(message_id: str, content: object) -> str | list[dict[str, Any]] | None:
    """The JSON form of an edit's content: a string, ``None``, or the parts' dicts. Content
    that is none of these is refused here, as the store would (it cannot be sent as it is)."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)) and all(isinstance(p, Part) for p in content):
        return [p.to_dict() for p in content]
    raise InvalidMessageError(
        f"cannot edit message {message_id!r}: content must be a string, a sequence of "
        f"zerda.parts parts or None, got {type(content).__name__}"
    )


def _counter(counter: object) -> str | None:
    if counter is None:
        return None
    try:
        if isinstance(counter, str) and counter.encode():  # not empty, no lone surrogate
            return counter
    except UnicodeEncodeError:
        pass
    raise ConfigurationError(f"counter must be None or a counter's name, got {counter!r}")


def _split_url(url: object, schemes: Mapping[str, str]) -> tuple[str, str, str | None]:
    """The scheme (as ``schemes`` maps it), the rest of the base URL, and the user part of
    ``url`` (the API key), or a ConfigurationError that never shows the user part."""
    accepted = " or ".join(f"{s}://" for s in schemes)
    if not isinstance(url, str):
        raise ConfigurationError(f"the URL must be a {accepted} string, got {type(url).__name__}")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # the text may hold a key: describe it, never quote it
        raise ConfigurationError(f"not a {accepted} URL ({exc}); it is not shown here") from None
    scheme = schemes.get(parts.scheme.lower())
    host = parts.hostname
    if scheme is None or not host:
        raise ConfigurationError(
            f"not a {accepted} URL with a host (got scheme {parts.scheme!r}); it is not shown "
            "here, as it may hold a key"
        )
    if parts.query or parts.fragment:
        raise ConfigurationError(f"a {accepted} URL takes no query or fragment")
    if parts.password is not None:
        raise ConfigurationError(
            f"a {accepted} URL holds the API key as its user part alone (KEY@host), "
            "without a password"
        )
    shown_host = f"[{host}]" if ":" in host else host
    rest = shown_host + ("" if port is None else f":{port}") + parts.path.rstrip("/")
    key = None if parts.username is None else unquote(parts.username)
    return scheme, rest, key


class _HTTPBase:
    """Everything but the I/O: the requests each operation makes, and what their answers mean."""

    def __init__(self, base_url: str, api_key: str | None, timeout: float, client: Any) -> None:
        scheme, rest, user = _split_url(base_url, {"http": "http", "https": "https"})
        if user is not None:
            raise ConfigurationError(
                f"{type(self).__name__}: give the API key as api_key=, not in the URL "
                f"({scheme}://…@{rest})"
            )
        self.url = f"{scheme}://{rest}"
        if api_key is not None and (not isinstance(api_key, str) or not _KEY.fullmatch(api_key)):
            raise ConfigurationError(
                "api_key must be a non-empty string of printable ASCII without spaces "
                f"(got a {type(api_key).__name__}, not shown)"
            )
        self._has_key = api_key is not None
        self._headers = {"Accept": "application/json"}
        if api_key is not None:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self.timeout = check_timeout(timeout)
        module = _httpx()
        self._timeout = module.Timeout(self.timeout)
        self._owns_client = client is None
        self._errors: tuple[type[BaseException], ...] = (module.RequestError,)
        self._closed = False

    def _client_of(self, client: Any, kind: str) -> Any:
        """``client`` if it is an ``httpx.<kind>``, or a new one when ``None``."""
        made = getattr(_httpx(), kind)
        if client is None:
            return made(verify=_tls_context())
        if not isinstance(client, made):
            raise ConfigurationError(
                f"{type(self).__name__} takes an httpx.{kind} as client=, "
                f"got {type(client).__name__}"
            )
        return client

    def __repr__(self) -> str:
        key = ", api_key=***" if self._has_key else ""
        return f"{type(self).__name__}({self.url!r}{key})"

    # -- requests and answers ------------------------------------------------------------------

    def _request(self, call: _Call) -> dict[str, Any]:
        """The keyword arguments of ``httpx.Client.request`` for ``call``."""
        headers = self._headers
        content = None
        if call.body is not None:
            try:
                content = json.dumps(
                    call.body, ensure_ascii=False, allow_nan=False, separators=(",", ":")
                ).encode()
            except (ValueError, UnicodeEncodeError) as exc:  # a counter named with a surrogate
                raise ConfigurationError(f"cannot {call.doing}: {exc}") from None
            headers = {**headers, "Content-Type": "application/json"}
        return {
            "method": call.method,
            "url": self.url + call.path,
            "params": call.params,
            "content": content,
            "headers": headers,
            "timeout": self._timeout,
        }

    def _answer(self, call: _Call, status: int, content: bytes) -> Any:
        """The decoded answer to ``call``, ``None`` for a session that is not there, or the
        Zerda error the server answered."""
        where = f"HTTP store {self.url}: cannot {call.doing}"
        body = self._decoded(content)
        if 200 <= status < 300:
            if body is None and content:
                raise ConfigurationError(f"{where}: the answer is not JSON; is this zerda serve?")
            return {} if body is None else body
        error = body.get("error") if isinstance(body, dict) else None
        kind = message = ""
        if isinstance(error, dict):
            kind, message = str(error.get("type", "")), str(error.get("message", ""))
        if status == 404 and call.missing and kind == "NotFound":
            return None
        if status == 401:
            refused = (
                "the server refused the API key (unknown or revoked)"
                if self._has_key
                else "the server needs an API key: give api_key="
            )
            raise ConfigurationError(f"{where}: {refused}")
        if not kind:
            message = f"HTTP {status}, not an answer from zerda serve"
        elif status == 404 and kind not in _ERRORS:  # no such route, not a Zerda error
            message += " (a zerda serve from before the store API?)"
        unavailable = status >= 500 or status in (408, 429)
        error_type = _ERRORS.get(kind, StoreUnavailableError if unavailable else ConfigurationError)
        raise error_type(f"{where}: {message}")

    @staticmethod
    def _decoded(content: bytes) -> Any:
        if not content:
            return None
        try:
            return json.loads(content)
        except (ValueError, RecursionError):
            return None

    def _unavailable(self, call: _Call, exc: BaseException) -> StoreUnavailableError:
        detail = redact(str(exc)) or "no answer"
        return StoreUnavailableError(
            f"HTTP store {self.url}: cannot {call.doing}: {type(exc).__name__}: {detail}"
        )

    def _closed_error(self) -> StoreUnavailableError:
        return StoreUnavailableError(f"HTTP store {self.url} is closed")

    def _corrupt(self, call: _Call, exc: Exception) -> CorruptDataError:
        return CorruptDataError(
            f"HTTP store {self.url}: cannot {call.doing}: the answer cannot be decoded: {exc}"
        )

    def _tail(self, call: _Call, data: Any) -> Tail:
        try:
            return Tail(
                tuple(Message.from_dict(m) for m in data["system"]),
                [Message.from_dict(m) for m in data["messages"]],
                list(data["turn_starts"]),
                int(data["total_turns"]),
                int(data["total_messages"]),
                list(data["tokens"]),
                list(data["system_tokens"]),
                dict(data["metadata"]),
            )
        except (KeyError, TypeError, ValueError) as exc:  # InvalidMessageError is a ValueError
            raise self._corrupt(call, exc) from exc

    # -- the operations, written once -----------------------------------------------------------

    def _append(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        then_tail: tuple[int | None, str | None] | None = None,
    ) -> _Flow[tuple[int, Tail | None]]:
        path = f"/v1/sessions/{_segment(session_id)}/messages"
        check_batch(messages, tokens)
        body: dict[str, Any] = {
            "format": "zerda",  # stored exactly as given: no new ids, no new times
            "messages": [m.to_dict() for m in messages],
            "tokens": {name: list(counts) for name, counts in (tokens or {}).items()},
        }
        if then_tail is not None:
            turns, counter = then_tail
            body["tail"] = {"turns": _turns(turns), "counter": _counter(counter)}
        call = _Call("POST", path, f"append to session {session_id!r}", body=body)
        answer = yield call
        tail = None if then_tail is None else self._tail(call, answer.get("tail"))
        return int(answer["appended"]), tail

    def _read_tail(self, session_id: str, turns: int | None, counter: str | None) -> _Flow[Tail]:
        path = f"/v1/sessions/{_segment(session_id)}/tail"
        n, name = _turns(turns), _counter(counter)
        params = (() if n is None else (("turns", str(n)),)) + (
            () if name is None else (("counter", name),)
        )
        call = _Call("GET", path, f"read the tail of session {session_id!r}", params)
        return self._tail(call, (yield call))

    def _history(self, session_id: str) -> _Flow[list[Message]]:
        call = _Call(
            "GET",
            f"/v1/sessions/{_segment(session_id)}/messages",
            f"read session {session_id!r}",
            missing=True,
        )
        answer = yield call
        if answer is None:
            return []
        try:
            return [Message.from_dict(m) for m in answer["messages"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(call, exc) from exc

    def _get_metadata(self, session_id: str) -> _Flow[dict[str, Any]]:
        call = _Call(
            "GET",
            f"/v1/sessions/{_segment(session_id)}/metadata",
            f"read the metadata of session {session_id!r}",
            (("reserved", "true"),),
            missing=True,
        )
        answer = yield call
        metadata = {} if answer is None else answer.get("metadata")
        if not isinstance(metadata, dict):
            raise self._corrupt(call, TypeError(f"metadata is {metadata!r:.60}"))
        return metadata

    def _update_metadata(self, session_id: str, values: Mapping[str, Any]) -> _Flow[None]:
        path = f"/v1/sessions/{_segment(session_id)}/metadata"
        body = {"metadata": metadata_copy(values)}
        yield _Call("PATCH", path, f"update the metadata of session {session_id!r}", body=body)

    def _compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> _Flow[bool]:
        path = f"/v1/sessions/{_segment(session_id)}/compare-and-set"
        body = {
            "key": key,
            "expected": metadata_copy({key: expected}, reserved=True)[key],
            "value": metadata_copy({key: value}, reserved=True)[key],
        }
        answer = yield _Call("POST", path, f"compare-and-set in session {session_id!r}", body=body)
        return answer.get("swapped") is True

    def _list_sessions(self) -> _Flow[list[SessionInfo]]:
        out: list[SessionInfo] = []
        params: tuple[tuple[str, str], ...] = (("limit", str(_PAGE)),)
        while True:
            call = _Call("GET", "/v1/sessions", "list the sessions", params)
            page = yield call
            try:
                out += [
                    SessionInfo(
                        s["id"],
                        s["messages"],
                        s["turns"],
                        s["created_at"],
                        s["updated_at"],
                        s["expires_at"],
                    )
                    for s in page["sessions"]
                ]
                cursor = page["next_cursor"]
            except (KeyError, TypeError) as exc:
                raise self._corrupt(call, exc) from exc
            if cursor is None:
                return out
            params = (("limit", str(_PAGE)), ("cursor", str(cursor)))

    def _delete_session(self, session_id: str) -> _Flow[bool]:
        path = f"/v1/sessions/{_segment(session_id)}"
        answer = yield _Call("DELETE", path, f"delete session {session_id!r}", missing=True)
        return answer is not None

    def _messages(self, call: _Call, data: Any) -> list[Message]:
        try:
            return [Message.from_dict(m) for m in data["messages"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(call, exc) from exc

    def _delete_messages(self, session_id: str, ids: Collection[str]) -> _Flow[int]:
        wanted = check_ids(ids)
        path = f"/v1/sessions/{_segment(session_id)}/delete-messages"
        call = _Call(
            "POST", path, f"delete messages of session {session_id!r}", body={"ids": wanted}
        )
        answer = yield call
        try:
            return int(answer["deleted"])
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(call, exc) from exc

    def _pop_turn(self, session_id: str) -> _Flow[list[Message]]:
        path = f"/v1/sessions/{_segment(session_id)}/pop-turn"
        call = _Call("POST", path, f"pop the newest turn of session {session_id!r}")
        return self._messages(call, (yield call))

    def _fork(self, session_id: str, new_session_id: str, at: str | None) -> _Flow[int]:
        check_session_id(new_session_id)
        path = f"/v1/sessions/{_segment(session_id)}/fork-session"
        if at is not None and not isinstance(at, str):  # no message has it: as a store says
            raise MessageNotFoundError(f"session {session_id!r} holds no message {at!r:.80}")
        call = _Call(
            "POST",
            path,
            f"fork session {session_id!r} into {new_session_id!r}",
            body={"new_session_id": new_session_id, "at": at},
        )
        answer = yield call
        try:
            return int(answer["copied"])
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(call, exc) from exc

    def _edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> _Flow[Message]:
        path = f"/v1/sessions/{_segment(session_id)}/edit-message"
        if not isinstance(message_id, str):  # no message has it: as a store says
            raise MessageNotFoundError(
                f"session {session_id!r} holds no message {message_id!r:.80}"
            )
        body = {"message_id": message_id, "content": _content(message_id, content)}
        call = _Call(
            "POST", path, f"edit message {message_id!r} of session {session_id!r}", body=body
        )
        answer = yield call
        try:
            return Message.from_dict(answer["message"])
        except (KeyError, TypeError, ValueError) as exc:
            raise self._corrupt(call, exc) from exc

    def _clear(self) -> _Flow[None]:
        yield _Call("DELETE", "/v1/sessions", "clear the sessions")

    def _purge_expired(self) -> _Flow[int]:
        answer = yield _Call("POST", "/v1/sessions/purge-expired", "purge expired sessions")
        return int(answer["purged"])


class HTTPStore(_HTTPBase, ClosingStore):
    """A store that is a remote ``zerda serve``: every memory works over it, from any machine.

    ``base_url`` is the server's (``http://host:8080``, or under a path behind a proxy);
    ``api_key`` a key ``zerda keys create`` made, sent as ``Authorization: Bearer`` and never
    shown (``None``: no header, for a server run with ``--no-auth``). Each wait on the server
    (connecting, sending, each read) lasts at most ``timeout`` seconds. ``client``: an
    ``httpx.Client`` of your own (TLS, proxies, limits), which the store then does not close.

    Each call is one request, its atomicity, ids and retention the server's store's: TTL and
    ``max_messages`` are that store's settings. Needs ``pip install 'zerda-memory[http]'``.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        client: httpx.Client | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, client)
        self._client: httpx.Client = self._client_of(client, "Client")

    def _run(self, flow: _Flow[_T]) -> _T:
        answer: Any = None
        while True:
            try:
                call = flow.send(answer)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            if self._closed:
                raise self._closed_error()
            try:
                response = self._client.request(**self._request(call))
            except self._errors as exc:
                raise self._unavailable(call, exc) from exc
            answer = self._answer(call, response.status_code, response.content)

    def append(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        return self._run(self._append(session_id, messages, tokens))[0]

    def append_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        stored, tail = self._run(self._append(session_id, messages, tokens, (turns, counter)))
        assert tail is not None
        return stored, tail

    def tail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return self._run(self._read_tail(session_id, turns, counter))

    def history(self, session_id: str) -> list[Message]:
        return self._run(self._history(session_id))

    def get_metadata(self, session_id: str) -> dict[str, Any]:
        return self._run(self._get_metadata(session_id))

    def update_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        self._run(self._update_metadata(session_id, values))

    def compare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return self._run(self._compare_and_set(session_id, key, expected, value))

    def list_sessions(self) -> list[SessionInfo]:
        return self._run(self._list_sessions())

    def delete_session(self, session_id: str) -> bool:
        return self._run(self._delete_session(session_id))

    def delete_messages(self, session_id: str, ids: Collection[str]) -> int:
        return self._run(self._delete_messages(session_id, ids))

    def pop_turn(self, session_id: str) -> list[Message]:
        return self._run(self._pop_turn(session_id))

    def fork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        return self._run(self._fork(session_id, new_session_id, at))

    def edit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        return self._run(self._edit_message(session_id, message_id, content))

    def clear(self) -> None:
        self._run(self._clear())

    def purge_expired(self) -> int:
        return self._run(self._purge_expired())

    def close(self) -> None:
        self._closed = True
        if self._owns_client:
            self._client.close()


class AsyncHTTPStore(_HTTPBase, AsyncClosingStore):
    """:class:`HTTPStore` for asyncio, over ``httpx.AsyncClient``: the same requests, awaited
    (``client``: an ``httpx.AsyncClient`` of your own)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        client: httpx.AsyncClient | None = None,
    ) -> None:
        super().__init__(base_url, api_key, timeout, client)
        self._client: httpx.AsyncClient = self._client_of(client, "AsyncClient")

    async def _run(self, flow: _Flow[_T]) -> _T:
        answer: Any = None
        while True:
            try:
                call = flow.send(answer)
            except StopIteration as stop:
                result: _T = stop.value
                return result
            if self._closed:
                raise self._closed_error()
            try:
                response = await self._client.request(**self._request(call))
            except self._errors as exc:
                raise self._unavailable(call, exc) from exc
            answer = self._answer(call, response.status_code, response.content)

    async def aappend(
        self, session_id: str, messages: Sequence[Message], tokens: TokenCounts | None = None
    ) -> int:
        return (await self._run(self._append(session_id, messages, tokens)))[0]

    async def aappend_then_tail(
        self,
        session_id: str,
        messages: Sequence[Message],
        tokens: TokenCounts | None,
        turns: int | None,
        counter: str | None = None,
    ) -> tuple[int, Tail]:
        flow = self._append(session_id, messages, tokens, (turns, counter))
        stored, tail = await self._run(flow)
        assert tail is not None
        return stored, tail

    async def atail(self, session_id: str, turns: int | None, counter: str | None = None) -> Tail:
        return await self._run(self._read_tail(session_id, turns, counter))

    async def ahistory(self, session_id: str) -> list[Message]:
        return await self._run(self._history(session_id))

    async def aget_metadata(self, session_id: str) -> dict[str, Any]:
        return await self._run(self._get_metadata(session_id))

    async def aupdate_metadata(self, session_id: str, values: Mapping[str, Any]) -> None:
        await self._run(self._update_metadata(session_id, values))

    async def acompare_and_set(self, session_id: str, key: str, expected: Any, value: Any) -> bool:
        return await self._run(self._compare_and_set(session_id, key, expected, value))

    async def alist_sessions(self) -> list[SessionInfo]:
        return await self._run(self._list_sessions())

    async def adelete_session(self, session_id: str) -> bool:
        return await self._run(self._delete_session(session_id))

    async def adelete_messages(self, session_id: str, ids: Collection[str]) -> int:
        return await self._run(self._delete_messages(session_id, ids))

    async def apop_turn(self, session_id: str) -> list[Message]:
        return await self._run(self._pop_turn(session_id))

    async def afork(self, session_id: str, new_session_id: str, at: str | None = None) -> int:
        return await self._run(self._fork(session_id, new_session_id, at))

    async def aedit_message(
        self, session_id: str, message_id: str, content: str | tuple[Part, ...] | None
    ) -> Message:
        return await self._run(self._edit_message(session_id, message_id, content))

    async def aclear(self) -> None:
        await self._run(self._clear())

    async def apurge_expired(self) -> int:
        return await self._run(self._purge_expired())

    async def aclose(self) -> None:
        self._closed = True
        if self._owns_client:
            await self._client.aclose()


def open_http_url(url: str, **options: Any) -> HTTPStore:
    """An :class:`HTTPStore` from ``zerda+http://[KEY@]host:port[/path]`` (or
    ``zerda+https://``): the user part is the API key; none sends no key."""
    scheme, rest, key = _split_url(url, _URL_SCHEMES)
    return HTTPStore(f"{scheme}://{rest}", key or None, **options)
