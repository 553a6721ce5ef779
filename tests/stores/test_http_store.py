"""HTTPStore and AsyncHTTPStore: the store contract through a real ``zerda serve``, and what
only a remote store has to show: keys and tenants, errors mapped back, timeouts, the URL form.

Two uvicorn servers on loopback ports serve the whole module (starting one per test would
cost more than the tests): one without keys, whose store each contract test swaps for a fresh
one made with the test's ttl, max_messages and clock, as ``make_store`` asks; and one with keys,
where each test makes tenants of its own.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from itertools import count
from pathlib import Path
from typing import Any, ClassVar

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")
import httpx

import zerda.stores._http as http_module
from stores.contract import AsyncStoreContract, StoreContract, assistant, user
from test_serve import Live
from zerda import ApproxCounter
from zerda.errors import (
    ConfigurationError,
    CorruptDataError,
    InvalidMessageError,
    InvalidSessionIdError,
    MessageNotFoundError,
    SessionExistsError,
    StoreUnavailableError,
    SummarizerError,
)
from zerda.memory import ConversationBufferWindowMemory, ConversationSummaryBufferMemory
from zerda.messages import Message, Role
from zerda.server import KeyRing
from zerda.stores import AsyncHTTPStore, HTTPStore, InMemoryStore, SQLiteStore, open_store

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 30.0  # the machine running the tests may be slow and shared


class SwappedStore:
    """The server's store: each test puts a fresh one behind it."""

    def __init__(self) -> None:
        self.target: Any = None

    def __getattr__(self, name: str) -> Any:
        if self.target is None:
            raise RuntimeError("no store behind the server: the test made none")
        return getattr(self.target, name)


@pytest.fixture(scope="module")
def open_server() -> Iterator[tuple[Live, SwappedStore]]:
    """A server without keys (the contract's session ids are the store's own, up to 200
    characters, which a tenant's prefix would shorten)."""
    swapped = SwappedStore()
    live = Live(swapped, auth=False)  # type: ignore[arg-type]  # a Store by delegation
    yield live, swapped
    live.close()


@pytest.fixture(scope="module")
def keyed_server() -> Iterator[Live]:
    """A server with API keys, over one in-memory store; each test makes its own tenants."""
    live = Live(InMemoryStore())
    yield live
    live.close()


_tenants = count()


def new_key(live: Live) -> tuple[str, str]:
    """A key of a tenant no other test uses, and the tenant."""
    tenant = f"t{next(_tenants)}"
    key, _ = KeyRing(live.store).create(tenant)
    return key, tenant


def reopened(base_url: str, clock: object = None) -> HTTPStore:
    """Another client of the same server (the contract's recipe; the clock is the server's)."""
    return HTTPStore(base_url, timeout=TIMEOUT)


def reopened_async(base_url: str, clock: object = None) -> AsyncHTTPStore:
    return AsyncHTTPStore(base_url, timeout=TIMEOUT)


# -- the contract, over the in-memory store (sync) and SQLite (async) on the server --------------


class _OverHTTP:
    """The contract's store is a client of the server; the server's store is made fresh.

    ``supports_processes`` stays off: to the server, writers in other processes are only more
    connections, which the threads and tasks tests already open at once (eight writers and a
    reader), and spawning them costs more than the rest of the run. A second client over the
    same data is still checked (``reopen_recipe``).
    """

    server_store: ClassVar[str]
    client: ClassVar[Callable[..., Any]]

    live: Live
    swapped: SwappedStore
    fresh_path: Callable[[str], Path]

    @pytest.fixture(autouse=True)
    def _server(self, open_server: tuple[Live, SwappedStore]) -> Iterator[None]:
        self.live, self.swapped = open_server
        self.swapped.target = None
        yield
        if self.swapped.target is not None:
            self.swapped.target.close()
            self.swapped.target = None

    def make_store(
        self, *, ttl: float | None, max_messages: int | None, clock: Callable[[], float]
    ) -> Any:
        # The contract opens one store per test; two would share the one server store.
        assert self.swapped.target is None, "a second store in one test"
        options = {"ttl": ttl, "max_messages": max_messages, "clock": clock}
        if self.server_store == "sqlite":
            self.swapped.target = SQLiteStore(self.fresh_path(".db"), **options)
        else:
            self.swapped.target = InMemoryStore(**options)
        return type(self).client(self.live.url, timeout=TIMEOUT)

    def reopen_recipe(self, store: Any) -> tuple[str, dict[str, Any]]:
        factory = "reopened" if isinstance(store, HTTPStore) else "reopened_async"
        return f"{__name__}:{factory}", {"base_url": store.url}


class TestHTTPStore(_OverHTTP, StoreContract):
    server_store = "memory"
    client = HTTPStore


class TestAsyncHTTPStore(_OverHTTP, AsyncStoreContract):
    server_store = "sqlite"
    client = AsyncHTTPStore


# -- keys and tenants ---------------------------------------------------------------------------


def test_each_tenant_sees_clears_and_deletes_only_its_own(keyed_server: Live) -> None:
    (key_a, a), (key_b, b) = new_key(keyed_server), new_key(keyed_server)
    with HTTPStore(keyed_server.url, key_a) as one, HTTPStore(keyed_server.url, key_b) as two:
        for store, who in ((one, "a"), (two, "b")):
            store.append("s", [user(f"from {who}")], {"x": [1]})
            store.append(f"only-{who}", [user("q")])
            store.update_metadata("s", {"who": who})
        assert [m.content for m in one.history("s")] == ["from a"]
        assert two.get_metadata("s") == {"who": "b"}
        assert [i.session_id for i in one.list_sessions()] == ["only-a", "s"]
        assert one.delete_session("only-b") is False
        one.clear()
        assert one.list_sessions() == []
        assert [i.session_id for i in two.list_sessions()] == ["only-b", "s"]
        assert [m.content for m in two.history("s")] == ["from b"]
        # Purging is store-wide: a tenant may not do it, nor learn what others had.
        with pytest.raises(ConfigurationError, match="operator"):
            two.purge_expired()
    # In the server's store, each tenant's sessions carry its name.
    held = {i.session_id for i in keyed_server.store.list_sessions()}
    assert {f"{b}:s", f"{b}:only-b"} <= held
    assert not any(s.startswith(f"{a}:") for s in held)


def test_editing_the_log_stays_inside_the_tenant(keyed_server: Live) -> None:
    (key_a, a), (key_b, b) = new_key(keyed_server), new_key(keyed_server)
    with HTTPStore(keyed_server.url, key_a) as one, HTTPStore(keyed_server.url, key_b) as two:
        one.append("s", [user("q1", id="u1"), assistant("a1", id="a1"), user("q2", id="u2")])
        two.append("s", [user("theirs", id="u1"), assistant("a1", id="a1")])
        two.append("taken", [user("b's")])
        # The fork's new session is the tenant's own: another tenant's "taken" is no obstacle.
        assert one.fork("s", "taken", at="a1") == 2
        assert one.fork("s", "copy") == 3
        with pytest.raises(SessionExistsError, match="'copy'") as exists:
            one.fork("s", "copy")
        with pytest.raises(MessageNotFoundError, match="session 's' holds no message 'x'") as gone:
            one.edit_message("s", "x", "y")
        for error in (exists.value, gone.value):
            assert f"{a}:" not in str(error), "the tenant's prefix showed"
        assert one.edit_message("s", "u1", "edited").text == "edited"
        assert one.delete_messages("s", ["a1", "x"]) == 1
        assert [m.id for m in one.pop_turn("s")] == ["u2"]
        assert [m.text for m in one.history("s")] == ["edited"]
        assert [m.text for m in one.history("taken")] == ["q1", "a1"]
        assert [m.text for m in two.history("s")] == ["theirs", "a1"]
        assert [m.text for m in two.history("taken")] == ["b's"]
        assert two.fork("s", "copy", at="u1") == 1
        with pytest.raises(InvalidSessionIdError):
            one.fork("s", "x" * 200)  # too long once the tenant's prefix is added
    held = {i.session_id for i in keyed_server.store.list_sessions()}
    assert {f"{a}:copy", f"{a}:taken", f"{b}:copy", f"{b}:taken"} <= held


def test_a_missing_or_refused_key_is_a_configuration_error(keyed_server: Live) -> None:
    key, _ = new_key(keyed_server)
    with HTTPStore(keyed_server.url) as keyless, pytest.raises(ConfigurationError, match="API key"):
        keyless.history("s")
    with HTTPStore(keyed_server.url, key) as store:
        store.append("s", [user("hi")])
        record = KeyRing(keyed_server.store).lookup(key)
        assert record is not None
        KeyRing(keyed_server.store).revoke(record.key_id)
        with pytest.raises(ConfigurationError, match="refused the API key") as info:
            store.history("s")
    assert key not in str(info.value)


def test_the_key_never_shows(keyed_server: Live, caplog: pytest.LogCaptureFixture) -> None:
    key, _ = new_key(keyed_server)
    host = keyed_server.url.removeprefix("http://")
    closed = f"127.0.0.1:{free_port()}"
    errors: list[BaseException] = []
    with caplog.at_level(logging.DEBUG):
        store = open_store(f"zerda+http://{key}@{host}")
        store.append("s", [user("hi")])
        assert store.history("s")[0].content == "hi"
        texts = [repr(store), str(store.url)]  # type: ignore[attr-defined]
        store.close()
        for target in (
            f"zerda+http://{key}@{closed}",
            f"zerda+http://{key}@{closed}/with/a/path",
        ):
            with pytest.raises(StoreUnavailableError) as unavailable:
                open_store(target).history("s")
            errors.append(unavailable.value)
        for malformed in (
            f"zerda+http://{key}@{host}:99999",
            f"zerda+http://{key}@[::1",
            f"zerda+http://{key}:{key}@{host}",
            f"zerda+http://{key}@{host}?timeout=1",
            f"zerda+ftp://{key}@{host}",
        ):
            with pytest.raises(ConfigurationError) as refused:
                open_store(malformed)
            errors.append(refused.value)
        with pytest.raises(ConfigurationError) as in_url:
            HTTPStore(f"http://{key}@{host}")
        errors.append(in_url.value)
        with pytest.raises(ConfigurationError) as spaced:
            HTTPStore(keyed_server.url, f"{key} x")
        errors.append(spaced.value)
    texts += [str(e) for e in errors] + [str(e.__cause__) for e in errors]
    texts += [r.getMessage() for r in caplog.records]
    assert caplog.records, "the requests logged nothing: the check of the log proves nothing"
    for text in texts:
        assert key not in text
    assert f"http://{closed}" in str(errors[0])
    assert "api_key=***" in texts[0]


def test_a_url_without_a_key_sends_no_authorization(open_server: tuple[Live, SwappedStore]) -> None:
    live, swapped = open_server
    swapped.target = InMemoryStore()
    sent: list[httpx.Request] = []
    client = httpx.Client(event_hooks={"request": [sent.append]})
    host = live.url.removeprefix("http://")
    try:
        with open_store(f"zerda+http://{host}", client=client) as store:
            assert isinstance(store, HTTPStore)
            assert store.url == live.url
            store.append("s", [user("hi")])
        with open_store(f"zerda+http://zk_123@{host}/", client=client) as store:
            store.history("s")
    finally:
        client.close()
        swapped.target = None
    assert [r.headers.get("authorization") for r in sent] == [None, "Bearer zk_123"]


# -- errors --------------------------------------------------------------------------------------


def call(store: Any, name: str, *args: Any) -> Any:
    """``store.name(*args)``, or its async twin run to the end for an async store."""
    if isinstance(store, AsyncHTTPStore):
        return asyncio.run(getattr(store, f"a{name}")(*args))
    return getattr(store, name)(*args)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.mark.parametrize("use_async", [False, True])
def test_no_server_is_store_unavailable_naming_the_endpoint(use_async: bool) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    store = AsyncHTTPStore(url) if use_async else HTTPStore(url)
    with pytest.raises(StoreUnavailableError, match=re.escape(url)) as info:
        call(store, "history", "s")
    assert "cannot read session 's'" in str(info.value)
    assert isinstance(info.value.__cause__, httpx.ConnectError)


@pytest.mark.parametrize("use_async", [False, True])
def test_a_server_that_never_answers_times_out(use_async: bool) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # connections are accepted by the kernel, never answered
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        start = time.monotonic()
        store = (AsyncHTTPStore if use_async else HTTPStore)(url, timeout=0.3)
        with pytest.raises(StoreUnavailableError, match="Timeout") as info:
            call(store, "tail", "s", 1)
        assert time.monotonic() - start < 0.3 + 2
    assert isinstance(info.value.__cause__, httpx.TimeoutException)


class _Down:
    """A server store whose every call fails as a store that cannot be reached does."""

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any) -> Any:
            raise StoreUnavailableError("Redis store redis://db:6379/0: ConnectionError")

        return fail


def test_a_store_down_behind_the_server_is_store_unavailable(
    open_server: tuple[Live, SwappedStore],
) -> None:
    live, swapped = open_server
    swapped.target = _Down()
    try:
        with HTTPStore(live.url) as store:
            with pytest.raises(StoreUnavailableError, match="redis://db:6379/0"):
                store.append("s", [user("hi")])
            with pytest.raises(StoreUnavailableError, match="ConnectionError"):
                store.list_sessions()
    finally:
        swapped.target = None


def _answering(status: int, body: bytes | str, use_async: bool) -> Any:
    """A store whose server answers every request with ``status`` and ``body``."""
    content = body.encode() if isinstance(body, str) else body

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(status, content=content)

    transport = httpx.MockTransport(handler)
    if use_async:
        return AsyncHTTPStore("http://zerda.test", client=httpx.AsyncClient(transport=transport))
    return HTTPStore("http://zerda.test", client=httpx.Client(transport=transport))


def _error(kind: str, message: str = "what the server said") -> str:
    return f'{{"error": {{"type": "{kind}", "message": "{message}"}}}}'


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize(
    ("status", "body", "expected", "says"),
    [
        (400, _error("InvalidMessageError"), InvalidMessageError, "what the server said"),
        (400, _error("InvalidSessionIdError"), InvalidSessionIdError, "what the server said"),
        (400, _error("ConfigurationError"), ConfigurationError, "what the server said"),
        (400, _error("InvalidJSON"), ConfigurationError, "what the server said"),
        (413, _error("PayloadTooLarge"), ConfigurationError, "what the server said"),
        (422, _error("InvalidBody"), ConfigurationError, "what the server said"),
        (401, _error("Unauthorized"), ConfigurationError, "needs an API key"),
        (403, _error("Forbidden"), ConfigurationError, "what the server said"),
        (404, _error("NotFound", "no route"), ConfigurationError, "before the store API"),
        (404, _error("MessageNotFoundError"), MessageNotFoundError, "what the server said"),
        (409, _error("SessionExistsError"), SessionExistsError, "what the server said"),
        (404, "<html>Not Found</html>", ConfigurationError, "not an answer from zerda serve"),
        (500, _error("CorruptDataError"), CorruptDataError, "what the server said"),
        (500, _error("InternalError"), StoreUnavailableError, "what the server said"),
        (502, "<html>Bad Gateway</html>", StoreUnavailableError, "HTTP 502"),
        (503, _error("StoreUnavailableError"), StoreUnavailableError, "what the server said"),
        (503, _error("SummarizerError"), SummarizerError, "what the server said"),
        (429, "slow down", StoreUnavailableError, "HTTP 429"),
        (200, "<html>a page</html>", ConfigurationError, "not JSON"),
        (200, '{"system": []}', CorruptDataError, "cannot be decoded"),
    ],
)
def test_each_answer_maps_to_a_zerda_error(
    status: int, body: str, expected: type[Exception], says: str, use_async: bool
) -> None:
    store = _answering(status, body, use_async)
    with pytest.raises(expected, match=re.escape(says)) as info:
        call(store, "tail", "s", 1)
    assert type(info.value) is expected
    assert str(info.value).startswith("HTTP store http://zerda.test: cannot read the tail of")


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_only_zerdas_not_found_is_an_empty_answer(use_async: bool) -> None:
    found = _answering(404, _error("NotFound", "no session 's' here"), use_async)
    assert call(found, "history", "s") == []
    assert call(found, "get_metadata", "s") == {}
    assert call(found, "delete_session", "s") is False
    other = _answering(404, "<html>Not Found</html>", use_async)
    with pytest.raises(ConfigurationError, match="not an answer from zerda serve"):
        call(other, "history", "s")


def test_arguments_are_checked_before_any_request() -> None:
    store = _answering(500, "never asked", use_async=False)
    with pytest.raises(InvalidSessionIdError):
        store.history("a/b")
    with pytest.raises(ConfigurationError, match="twice"):
        store.append("s", [user("a", id="x"), user("b", id="x")])
    with pytest.raises(ConfigurationError, match="reserved"):
        store.update_metadata("s", {"zerda.summary": "x"})
    for bad_turns in ("3", 1.5, True):
        with pytest.raises(ConfigurationError, match="turns"):
            store.tail("s", bad_turns)
    for bad_counter in ("", "a\ud800", 5):
        with pytest.raises(ConfigurationError, match="counter"):
            store.tail("s", 1, bad_counter)
    with pytest.raises(ConfigurationError, match="surrogate"):
        store.append("s", [user("q")], {"a\ud800": [1]})
    for options in ({"timeout": 0}, {"timeout": "5"}, {"client": object()}):
        with pytest.raises(ConfigurationError):
            HTTPStore("http://zerda.test", **options)
    with pytest.raises(ConfigurationError, match=r"httpx\.AsyncClient"):
        AsyncHTTPStore("http://zerda.test", client=httpx.Client())  # type: ignore[arg-type]
    for url in ("zerda.test", "ftp://zerda.test", "http://", "http://h/?q=1", 8080):
        with pytest.raises(ConfigurationError):
            HTTPStore(url)  # type: ignore[arg-type]


def test_a_closed_store_says_so_and_a_given_client_stays_open() -> None:
    client = httpx.Client(transport=httpx.MockTransport(lambda r: httpx.Response(500)))
    store = HTTPStore("http://zerda.test", client=client)
    store.close()
    with pytest.raises(StoreUnavailableError, match="closed"):
        store.history("s")
    assert not client.is_closed
    own = HTTPStore("http://zerda.test")
    own.close()
    assert own._client.is_closed


# -- the routes HTTPStore uses, as the server answers them --------------------------------------


def test_session_ids_of_dots_reach_their_own_session(keyed_server: Live) -> None:
    key, tenant = new_key(keyed_server)
    with HTTPStore(keyed_server.url, key) as store:
        for n, session_id in enumerate([".", "..", "...", "a.."]):
            store.append(session_id, [user(f"q{n}")], {"x": [n]})
        assert [m.content for m in store.history("..")] == ["q1"]
        assert list(store.tail(".", None, "x").tokens) == [0]
        assert store.delete_session("...") is True
        assert [i.session_id for i in store.list_sessions()] == [".", "..", "a.."]
    held = {i.session_id for i in keyed_server.store.list_sessions()}
    assert {f"{tenant}:.", f"{tenant}:..", f"{tenant}:a.."} <= held


def test_list_sessions_pages_through_next_cursor(
    keyed_server: Live, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(http_module, "_PAGE", 2)
    key, _ = new_key(keyed_server)
    pages: list[httpx.Request] = []
    client = httpx.Client(event_hooks={"request": [pages.append]})
    with HTTPStore(keyed_server.url, key, client=client) as store:
        for session_id in ("e", "a", "d", "b", "c"):
            store.append(session_id, [user("q")])
        pages.clear()
        assert [i.session_id for i in store.list_sessions()] == ["a", "b", "c", "d", "e"]
    client.close()
    assert [r.url.params.get("cursor") is None for r in pages] == [True, False, False]


def test_the_store_routes_refuse_what_is_malformed(keyed_server: Live) -> None:
    key, _ = new_key(keyed_server)
    with keyed_server.client(key) as http:
        messages = "/v1/sessions/s/messages"
        zerda = {"format": "zerda", "messages": [{"role": "user", "content": "q"}]}
        for body, params in [
            ({**zerda, "tokens": {"x": [1]}}, {"counter": "approx"}),
            ({**zerda, "tokens": [1]}, {}),
            ({**zerda, "tokens": {"x": 1}}, {}),
            ({**zerda, "tail": {"turns": -1}}, {}),
            ({**zerda, "tail": {"turns": "2"}}, {}),
            ({**zerda, "tail": {"counter": ""}}, {}),
            ({**zerda, "tail": {"k": 1}}, {}),
        ]:
            assert http.post(messages, json=body, params=params).status_code == 422, body
        r = http.post(messages, json={**zerda, "tokens": {"x": [1.5]}})
        assert (r.status_code, r.json()["error"]["type"]) == (400, "ConfigurationError")
        r = http.post(messages, json={"format": "zerda", "messages": [{"content": "no role"}]})
        assert (r.status_code, r.json()["error"]["type"]) == (400, "InvalidMessageError")
        assert r.json()["error"]["message"].startswith("message 0: ")
        assert http.get("/v1/sessions", params={"limit": 5}).json()["sessions"] == []
        cas = "/v1/sessions/s/compare-and-set"
        assert http.post(cas, json={"key": "k", "value": 1}).status_code == 422
        r = http.post(cas, json={"key": 5, "expected": None, "value": 1})
        assert (r.status_code, r.json()["error"]["type"]) == (422, "InvalidBody")
        assert http.get("/v1/sessions/s/tail", params={"turns": "-1"}).status_code == 422
        assert http.get("/v1/sessions/s/tail", params={"k": "1"}).status_code == 422
        assert http.get("/v1/sessions/s/metadata", params={"reserved": "yes"}).status_code == 422


def test_the_edit_routes_refuse_what_is_malformed(keyed_server: Live) -> None:
    key, _ = new_key(keyed_server)
    with keyed_server.client(key) as http:
        for route, body in [
            ("delete-messages", {}),
            ("delete-messages", {"ids": "a1"}),
            ("delete-messages", {"ids": [1]}),
            ("delete-messages", {"ids": [""]}),
            ("delete-messages", {"ids": [], "more": 1}),
            ("fork-session", {"at": None}),
            ("fork-session", {"new_session_id": "n", "at": 5}),
            ("edit-message", {"message_id": "m"}),
            ("edit-message", {"message_id": 5, "content": "x"}),
            ("edit-message", {"message_id": "m", "content": {"text": "x"}}),
        ]:
            r = http.post(f"/v1/sessions/s/{route}", json=body)
            assert (r.status_code, r.json()["error"]["type"]) == (422, "InvalidBody"), body
        r = http.post("/v1/sessions/s/fork-session", json={"new_session_id": "bad id"})
        assert (r.status_code, r.json()["error"]["type"]) == (400, "InvalidSessionIdError")
        r = http.post(
            "/v1/sessions/s/edit-message", json={"message_id": "m", "content": [{"type": "?"}]}
        )
        assert (r.status_code, r.json()["error"]["type"]) == (400, "InvalidMessageError")
        assert r.json()["error"]["message"].startswith("content part 0: ")
        # A session that is not there has nothing to edit: the store's answers, no 404.
        assert http.post("/v1/sessions/s/pop-turn").json() == {"messages": []}
        assert http.post("/v1/sessions/s/delete-messages", json={"ids": ["x"]}).json() == {
            "deleted": 0
        }
        assert http.post("/v1/sessions/s/fork-session", json={"new_session_id": "n"}).json() == {
            "copied": 0
        }
        r = http.post("/v1/sessions/s/fork-session", json={"new_session_id": "n", "at": "x"})
        assert (r.status_code, r.json()["error"]["type"]) == (404, "MessageNotFoundError")
        assert http.get("/v1/sessions").json()["sessions"] == []


def test_zerda_format_appends_store_exactly_what_is_sent(keyed_server: Live) -> None:
    key, tenant = new_key(keyed_server)
    with keyed_server.client(key) as http:
        body = {
            "format": "zerda",
            "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}],
            "tokens": {"mine": [3, 4]},
            "tail": {"turns": 1, "counter": "mine"},
        }
        r = http.post("/v1/sessions/s/messages", json=body)
        assert r.status_code == 201, r.text
        answer = r.json()
        assert (answer["appended"], answer["ids"]) == (2, [None, None])
        assert answer["tail"]["messages"] == body["messages"]
        assert answer["tail"]["tokens"] == [3, 4]
        assert http.get("/v1/sessions/s/tail", params={"counter": "mine"}).json() == answer["tail"]
        missing = http.get("/v1/sessions/nobody/tail")
        assert (missing.status_code, missing.json()["total_messages"]) == (200, 0)
        r = http.post(
            "/v1/sessions/s/compare-and-set", json={"key": "zerda.n", "expected": None, "value": 1}
        )
        assert r.json() == {"swapped": True}
        assert http.get("/v1/sessions/s/metadata").json() == {"metadata": {}}
        reserved = http.get("/v1/sessions/s/metadata", params={"reserved": "true"}).json()
        assert reserved == {"metadata": {"zerda.n": 1}}
    assert keyed_server.store.history(f"{tenant}:s") == [
        Message(Role.USER, "q"),
        Message(Role.ASSISTANT, "a"),
    ]


def test_the_description_names_every_route_and_method() -> None:
    from starlette.routing import Route

    from zerda.server import create_app
    from zerda.server._openapi import openapi

    documented = openapi()["paths"]
    served = {
        (r.path, method.lower())
        for r in create_app(InMemoryStore(), counter="approx").routes
        # The inspector's pages are for browsers, not clients: docs/inspector.md has them.
        if isinstance(r, Route) and r.path != "/openapi.json" and not r.path.startswith("/ui")
        for method in r.methods or ()
        if method != "HEAD"
    }
    assert {(p, m) for p, m in served if p.startswith("/v1/")} >= {
        ("/v1/sessions", "delete"),
        ("/v1/sessions/purge-expired", "post"),
        ("/v1/sessions/{session_id}/tail", "get"),
        ("/v1/sessions/{session_id}/compare-and-set", "post"),
        ("/v1/sessions/{session_id}/delete-messages", "post"),
        ("/v1/sessions/{session_id}/pop-turn", "post"),
        ("/v1/sessions/{session_id}/fork-session", "post"),
        ("/v1/sessions/{session_id}/edit-message", "post"),
    }
    for path, method in served:
        assert method in documented.get(path, {}), f"{method.upper()} {path} is not documented"


# -- memories over the service -------------------------------------------------------------------


def test_a_summary_memory_over_http_is_the_same_as_over_a_local_store(keyed_server: Live) -> None:
    key, _ = new_key(keyed_server)
    counter = ApproxCounter()
    local = ConversationSummaryBufferMemory(
        60, token_counter=counter, store=InMemoryStore(), session_id="chat"
    )
    with HTTPStore(keyed_server.url, key) as store:
        remote = ConversationSummaryBufferMemory(
            60, token_counter=counter, store=store, session_id="chat"
        )
        for n in range(6):
            turn = {"input": f"question {n} about the weather"}, {"output": f"answer {n}: sunny"}
            local.save_context(*turn)
            remote.save_context(*turn)
        # The same context, but for the ids and times each memory stamped.
        assert [m.to_openai() for m in remote.get_context()] == [
            m.to_openai() for m in local.get_context()
        ]
        stats, expected = remote.get_memory_stats(), local.get_memory_stats()
        assert {**stats, "last_summarized_at": 0} == {**expected, "last_summarized_at": 0}
        summary = store.get_metadata("chat")
        assert any(k.startswith("zerda.") for k in summary), "no summary was folded"
        assert store.tail("chat", 1, counter.name).tokens[0] is not None


def test_an_async_window_memory_over_http(keyed_server: Live) -> None:
    key, _ = new_key(keyed_server)

    async def main() -> list[str | None]:
        async with AsyncHTTPStore(keyed_server.url, key) as store:
            memory = ConversationBufferWindowMemory(k=2, store=store, session_id="chat")
            for n in range(4):
                await memory.asave_context({"input": f"q{n}"}, {"output": f"a{n}"})
            return [m.content for m in await memory.aget_context()]

    assert asyncio.run(main()) == ["q2", "a2", "q3", "a3"]


# -- the docs, and the extra -------------------------------------------------------------------


def test_the_serve_docs_example_runs(keyed_server: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    text = (ROOT / "docs" / "serve.md").read_text(encoding="utf-8")
    [example] = [
        b for b in re.findall(r"^```py\n(.*?)^```", text, re.S | re.M) if "zerda+http" in b
    ]
    key, tenant = new_key(keyed_server)
    monkeypatch.setenv("ZERDA_KEY", key)
    code = example.replace("127.0.0.1:8080", keyed_server.url.removeprefix("http://"))
    exec(compile(code, "docs/serve.md", "exec"), {"__name__": "__doc_example__"})
    assert keyed_server.store.history(f"{tenant}:user-42"), "the example stored nothing"


def test_zerda_stores_imports_without_httpx() -> None:
    code = (
        "import sys; sys.modules['httpx'] = None\n"
        "import zerda.stores\n"
        "from zerda.errors import ConfigurationError\n"
        "for make in (lambda: zerda.stores.HTTPStore('http://h'),\n"
        "             lambda: zerda.stores.open_store('zerda+http://h:1')):\n"
        "    try:\n"
        "        make()\n"
        "    except ConfigurationError as exc:\n"
        "        assert \"pip install 'zerda-memory[http]'\" in str(exc), exc\n"
        "    else:\n"
        "        raise AssertionError('no error')\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (run.returncode, run.stdout.strip()) == (0, "ok"), run.stderr


def test_the_cli_never_prints_the_key_of_a_zerda_url() -> None:
    import subprocess
    import sys

    key = "zk_0123456789ab_" + "S" * 43
    run = subprocess.run(
        [sys.executable, "-m", "zerda.cli", "--db", f"zerda+http://{key}@127.0.0.1:1", "sessions"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1, run.stderr
    assert "127.0.0.1:1" in run.stderr
    assert key not in run.stderr + run.stdout
    assert "S" * 43 not in run.stderr + run.stdout


def test_redact_hides_the_key_of_a_zerda_url() -> None:
    from zerda.stores._base import redact

    assert redact("zerda+http://zk_a_b@h:8080/x") == "zerda+http://***@h:8080/x"
    assert redact("ZERDA+HTTPS://k@h") == "ZERDA+HTTPS://***@h"
    assert redact("zerda+http://h:8080") == "zerda+http://h:8080"
