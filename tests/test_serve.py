"""zerda serve: the real server on a loopback port, driven over HTTP.

Each test starts uvicorn in a thread on a free port over its own store, creates keys with
the KeyRing (as ``zerda keys create`` does) and talks to it with httpx: every endpoint, every
error code, tenant isolation, revocation, a store that stops answering, and the CLI itself
in a subprocess.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")
import httpx
import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _redis_servers import RedisServer
from zerda import ConversationTokenBufferMemory, Message
from zerda.memory import ConversationBufferWindowMemory
from zerda.server import KeyRing, create_app
from zerda.stores import InMemoryStore, SQLiteStore
from zerda.stores._base import Store
from zerda.tokens import counter_by_name

REPO = Path(__file__).resolve().parent.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Live:
    """A server running ``create_app(store, ...)`` in a thread, on a loopback port."""

    def __init__(self, store: Store, **options: Any) -> None:
        self.store = store
        self.port = _free_port()
        options.setdefault("counter", "approx")
        config = uvicorn.Config(
            create_app(store, **options),
            host="127.0.0.1",
            port=self.port,
            log_config=None,
            access_log=False,
            lifespan="on",  # /mcp's session manager runs in the app's lifespan
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.port}"
        self.http = httpx.Client(base_url=self.url, timeout=20)

    def client(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key is not None else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=20)

    def close(self) -> None:
        self.http.close()
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def serve() -> Iterator[Callable[..., Live]]:
    started: list[Live] = []

    def start(store: Store | None = None, **options: Any) -> Live:
        live = Live(store if store is not None else InMemoryStore(), **options)
        started.append(live)
        return live

    yield start
    for live in started:
        live.close()


def key_for(live: Live, tenant: str) -> str:
    key, _ = KeyRing(live.store).create(tenant)
    return key


TOOL_TURN = [
    {"role": "user", "content": "What is 6 x 7?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "mul", "arguments": '{"a":6}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "42"},
    {"role": "assistant", "content": "It is 42."},
]


def error_of(response: httpx.Response, status: int, kind: str | None = None) -> str:
    """Check an error answer's status and body; its message."""
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"type", "message"}, body
    if kind is not None:
        assert body["error"]["type"] == kind, body
    assert "Traceback" not in response.text
    message: str = body["error"]["message"]
    return message


# -- the endpoints ----------------------------------------------------------------------------


def test_append_then_read_the_log_and_the_context(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(key_for(live, "acme")) as http:
        r = http.post("/v1/sessions/s1/messages", json={"messages": TOOL_TURN})
        assert r.status_code == 201, r.text
        body = r.json()
        assert body["appended"] == 4
        assert len(body["ids"]) == 4
        log = http.get("/v1/sessions/s1/messages").json()["messages"]
        assert [m["id"] for m in log] == body["ids"]
        assert [Message.from_dict(m).to_openai() for m in log] == [
            Message.from_openai(m).to_openai() for m in TOOL_TURN
        ]
        # The context is exactly what the library's memory returns over the same store.
        r = http.get("/v1/sessions/s1/context", params={"token_limit": 60, "counter": "approx"})
        assert r.status_code == 200, r.text
        memory = ConversationTokenBufferMemory(
            60, token_counter=counter_by_name("approx"), store=live.store, session_id="acme:s1"
        )
        assert r.json()["messages"] == [m.to_openai() for m in memory.get_context()]
        assert r.json()["stats"] == memory.get_memory_stats()


def test_inspect_is_the_library_memorys_inspection(serve: Callable[..., Live]) -> None:
    live = serve()
    interjected = [
        TOOL_TURN[0],
        TOOL_TURN[1],
        {"role": "user", "content": "and 6 x 8?"},  # before the result: repair moves it back
        TOOL_TURN[2],
        TOOL_TURN[3],
    ]
    with live.client(key_for(live, "acme")) as http:
        http.post("/v1/sessions/s1/messages", json={"messages": TOOL_TURN})
        http.post("/v1/sessions/s1/messages", json={"messages": interjected})
        params = {"token_limit": 45, "counter": "approx", "turns": 2}
        r = http.get("/v1/sessions/s1/inspect", params=params)
        assert r.status_code == 200, r.text
        memory = ConversationTokenBufferMemory(
            45, token_counter=counter_by_name("approx"), store=live.store, session_id="acme:s1"
        )
        expected = memory.inspect(turns=2)
        assert r.json() == {**expected.as_dict(), "session_id": "s1"}
        assert [t["number"] for t in r.json()["turns"]] == [2, 3]
        assert r.json()["fates"] == {"context": 2, "summary": 0, "pending": 0, "evicted": 1}
        # The same stats as the context's, from the same memory.
        context = http.get(
            "/v1/sessions/s1/context", params={"token_limit": 45, "counter": "approx"}
        )
        assert context.json()["stats"] == r.json()["stats"]
        error_of(http.get("/v1/sessions/nope/inspect"), 404, "NotFound")
        error_of(http.get("/v1/sessions/s1/inspect", params={"turns": -1}), 422)
        error_of(http.get("/v1/sessions/s1/inspect", params={"format": "openai"}), 422)


def test_appends_are_idempotent_by_message_id(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(key_for(live, "acme")) as http:
        first = http.post("/v1/sessions/s/messages", json={"messages": TOOL_TURN}).json()
        given = [{**m, "id": i} for m, i in zip(TOOL_TURN, first["ids"], strict=True)]
        again = http.post("/v1/sessions/s/messages", json={"messages": given})
        assert again.status_code == 201
        assert again.json()["appended"] == 0
        assert len(http.get("/v1/sessions/s/messages").json()["messages"]) == 4


@pytest.mark.parametrize(
    ("params", "memory"),
    [
        ({}, lambda s, sid: __import__("zerda").ConversationBufferMemory(store=s, session_id=sid)),
        ({"k": "1"}, lambda s, sid: ConversationBufferWindowMemory(k=1, store=s, session_id=sid)),
        (
            {"memory": "token", "token_limit": "40", "reserve": "5", "counter": "approx"},
            lambda s, sid: ConversationTokenBufferMemory(
                40,
                token_counter=counter_by_name("approx"),
                reserve_tokens=5,
                store=s,
                session_id=sid,
            ),
        ),
    ],
)
def test_each_memory_gives_what_the_library_gives(
    serve: Callable[..., Live], params: dict[str, str], memory: Callable[..., Any]
) -> None:
    live = serve()
    with live.client(key_for(live, "t")) as http:
        for n in range(3):
            turn = [{"role": "user", "content": f"question {n}"}, *TOOL_TURN[1:]]
            turn[1] = {**turn[1], "tool_calls": [{**TOOL_TURN[1]["tool_calls"][0], "id": f"c{n}"}]}
            turn[2] = {**turn[2], "tool_call_id": f"c{n}"}
            assert http.post("/v1/sessions/x/messages", json={"messages": turn}).status_code == 201
        r = http.get("/v1/sessions/x/context", params=params)
        assert r.status_code == 200, r.text
        expected = memory(live.store, "t:x")
        assert r.json()["messages"] == [m.to_openai() for m in expected.get_context()]
        assert r.json()["stats"] == expected.get_memory_stats()


@pytest.mark.parametrize("backend", ["redis", "postgres"])
def test_over_redis_and_postgres_requests_go_through_the_native_async_store(
    serve: Callable[..., Live], backend: str
) -> None:
    """zerda serve over Redis or Postgres answers through the backend's async store (what
    open_native_async gives), never the sync store's methods; every kind of request answers
    as the library over the sync store says, a revoked key is refused at once, and the app
    closes the async store when it stops."""
    from services import RUN_ID, require_postgres, require_redis
    from zerda.stores import AsyncPostgresStore, AsyncRedisStore
    from zerda.stores._open import open_native_async, open_store

    name = f"{RUN_ID}_serve_async_{backend}"
    if backend == "redis":
        target, twin_class = f"{require_redis()}?prefix={name}", AsyncRedisStore
    else:
        target, twin_class = f"{require_postgres()}?schema={name}", AsyncPostgresStore
    store = open_store(target)
    twin = open_native_async(target)
    assert isinstance(twin, twin_class)
    assert open_native_async("chats.db") is None  # SQLite: the sync store's fast path

    class Untouched:  # the sync store, for KeyRing and the checks here: requests never call it
        def __getattr__(self, attribute: str) -> Any:
            value = getattr(store, attribute)
            if callable(value) and threading.current_thread() is not threading.main_thread():
                raise AssertionError(f"a request called the sync store's {attribute}")
            return value

    try:
        live = serve(Untouched(), async_store=twin)
        key, record = KeyRing(store).create("t")
        with live.client(key) as http:
            for n in range(3):
                turn = [{"role": "user", "content": f"question {n}"}, *TOOL_TURN[1:]]
                call = {**TOOL_TURN[1]["tool_calls"][0], "id": f"c{n}"}
                turn[1] = {**turn[1], "tool_calls": [call]}
                turn[2] = {**turn[2], "tool_call_id": f"c{n}"}
                r = http.post("/v1/sessions/x/messages", json={"messages": turn})
                assert r.status_code == 201, r.text
            for params, memory in [
                ({"k": "1"}, ConversationBufferWindowMemory(k=1, store=store, session_id="t:x")),
                (
                    {"token_limit": "40", "counter": "approx"},
                    ConversationTokenBufferMemory(
                        40, token_counter=counter_by_name("approx"), store=store, session_id="t:x"
                    ),
                ),
            ]:
                r = http.get("/v1/sessions/x/context", params=params)
                assert r.status_code == 200, r.text
                assert r.json()["messages"] == [m.to_openai() for m in memory.get_context()]
                assert r.json()["stats"] == memory.get_memory_stats()
            log = http.get("/v1/sessions/x/messages").json()["messages"]
            assert [m["id"] for m in log] == [m.id for m in store.history("t:x")]
            r = http.patch("/v1/sessions/x/metadata", json={"metadata": {"user": "ada"}})
            assert r.json() == {"metadata": {"user": "ada"}}
            r = http.post("/v1/sessions/x/fork", json={"new_session_id": "y", "at": log[3]["id"]})
            assert r.status_code == 201, r.text
            assert [m.id for m in store.history("t:y")] == [m["id"] for m in log[:4]]
            assert len(http.post("/v1/sessions/x/pop").json()["messages"]) == 4
            r = http.patch(f"/v1/sessions/x/messages/{log[0]['id']}", json={"content": "edited"})
            assert r.json()["message"]["content"] == "edited"
            assert http.delete(f"/v1/sessions/x/messages/{log[1]['id']}").json()["deleted"] == 2
            assert store.history("t:x")[0].content == "edited"
            ids = {s["id"] for s in http.get("/v1/sessions").json()["sessions"]}
            assert ids == {"x", "y"}
            assert http.delete("/v1/sessions/y").status_code == 204
            assert http.get("/healthz").json() == {"status": "ok"}
            KeyRing(store).revoke(record.key_id)
            error_of(http.get("/v1/sessions/x/messages"), 401, "Unauthorized")
        live.close()
        assert twin._closed  # the app's lifespan closed it
    finally:
        store.clear()
        if backend == "postgres":
            import psycopg

            with psycopg.connect(require_postgres(), autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
        store.close()


def test_formats_in_and_out(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(key_for(live, "t")) as http:
        r = http.post(
            "/v1/sessions/a/messages",
            json={
                "format": "anthropic",
                "system": "Be brief.",
                "messages": [
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                ],
            },
        )
        assert r.status_code == 201, r.text
        assert r.json()["appended"] == 3  # the system prompt is a message too
        r = http.get("/v1/sessions/a/context", params={"format": "gemini"})
        body = r.json()["messages"]
        assert body["system_instruction"] == {"parts": [{"text": "Be brief."}]}
        assert [c["role"] for c in body["contents"]] == ["user", "model"]
        for fmt in ("responses", "anthropic", "zerda"):
            assert http.get("/v1/sessions/a/context", params={"format": fmt}).status_code == 200


def test_metadata_and_delete(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(key_for(live, "t")) as http:
        error_of(http.get("/v1/sessions/m/metadata"), 404, "NotFound")
        r = http.patch("/v1/sessions/m/metadata", json={"metadata": {"user": "ada", "n": 1}})
        assert r.status_code == 200
        assert r.json() == {"metadata": {"user": "ada", "n": 1}}
        r = http.patch("/v1/sessions/m/metadata", json={"metadata": {"n": None}})
        assert r.json() == {"metadata": {"user": "ada"}}
        assert http.get("/v1/sessions/m/metadata").json() == {"metadata": {"user": "ada"}}
        error_of(
            http.patch("/v1/sessions/m/metadata", json={"metadata": {"zerda.summary": 1}}),
            400,
            "ConfigurationError",
        )
        error_of(http.patch("/v1/sessions/m/metadata", json={"user": "x"}), 422, "InvalidBody")
        assert http.delete("/v1/sessions/m").status_code == 204
        error_of(http.delete("/v1/sessions/m"), 404, "NotFound")
        error_of(http.get("/v1/sessions/m/metadata"), 404)


def test_answers_are_the_same_json_whoever_writes_it(serve: Callable[..., Live]) -> None:
    """Answers are written by orjson; what it cannot write (an integer over 64 bits) by the
    standard library, so every value comes back as it was sent."""
    import orjson

    from zerda.server._http import JSONResponse

    values = {"text": 'café \u2028 "quoted" \\ </script>', "n": -3, "x": 0.1, "e": 1e300}
    fast = JSONResponse({"metadata": values}).body
    assert fast == orjson.dumps({"metadata": values})
    assert json.loads(fast) == {"metadata": values}
    assert json.loads(JSONResponse({"big": 2**70}).body) == {"big": 2**70}  # the fallback
    live = serve()
    with live.client(key_for(live, "t")) as http:
        sent = {**values, "big": 2**70, "list": [None, True, {"deep": [1.5]}]}
        r = http.patch("/v1/sessions/j/metadata", json={"metadata": sent})
        assert r.status_code == 200
        assert r.json() == {"metadata": sent}
        assert http.get("/v1/sessions/j/metadata").json() == {"metadata": sent}


def test_sessions_are_listed_a_page_at_a_time(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(key_for(live, "t")) as http:
        ids = [f"s{n:02d}" for n in range(7)]
        for sid in reversed(ids):
            http.post(f"/v1/sessions/{sid}/messages", json={"messages": TOOL_TURN[:1]})
        seen: list[str] = []
        cursor = None
        while True:
            params = {"limit": 3} | ({"cursor": cursor} if cursor else {})
            body = http.get("/v1/sessions", params=params).json()
            assert len(body["sessions"]) <= 3
            seen += [s["id"] for s in body["sessions"]]
            cursor = body["next_cursor"]
            if cursor is None:
                break
        assert seen == ids
        first = http.get("/v1/sessions").json()["sessions"][0]
        assert set(first) == {"id", "messages", "turns", "created_at", "updated_at", "expires_at"}
        assert first["messages"] == 1
        assert first["turns"] == 1
        error_of(http.get("/v1/sessions", params={"cursor": "%%%"}), 422)
        error_of(http.get("/v1/sessions", params={"limit": "0"}), 422)


# -- errors ---------------------------------------------------------------------------------------


def test_bad_input_gets_the_status_that_says_why(serve: Callable[..., Live]) -> None:
    live = serve(max_body=2000)
    with live.client(key_for(live, "t")) as http:
        post = "/v1/sessions/s/messages"
        error_of(http.post(post, content=b"{not json"), 400, "InvalidJSON")
        error_of(http.post(post, content=b""), 400, "InvalidJSON")
        error_of(http.post(post, json=[1]), 422, "InvalidBody")
        error_of(http.post(post, json={"messages": "hi"}), 422, "InvalidBody")
        error_of(http.post(post, json={"messages": []}), 422, "InvalidBody")
        error_of(http.post(post, json={"messages": [], "extra": 1}), 422, "InvalidBody")
        error_of(http.post(post, json={"format": "x", "messages": [{}]}), 422, "InvalidBody")
        # An integer parameter given empty is not a parameter left out (schemathesis found it).
        assert "got ''" in error_of(http.get("/v1/sessions?limit="), 422, "InvalidParameter")
        error_of(http.get("/v1/sessions/s/context?token_limit="), 422, "InvalidParameter")
        message = error_of(
            http.post(post, json={"messages": [{"role": "wizard", "content": "x"}]}),
            400,
            "InvalidMessageError",
        )
        assert "wizard" in message
        error_of(http.post(post, json={"messages": [{"role": "user", "content": "x" * 3000}]}), 413)

        def chunks() -> Iterator[bytes]:  # no Content-Length: the limit holds while reading
            yield b'{"messages": [{"role": "user", "content": "'
            for _ in range(10):
                yield b"y" * 500
            yield b'"}]}'

        error_of(http.post(post, content=chunks()), 413, "PayloadTooLarge")
        error_of(http.post("/v1/sessions/bad id/messages", json={"messages": TOOL_TURN}), 400)
        error_of(http.post("/v1/sessions/" + "x" * 199 + "/messages", json={}), 400)
        context = "/v1/sessions/s/context"
        http.post(post, json={"messages": TOOL_TURN})
        error_of(http.get(context, params={"memory": "magic"}), 422, "InvalidParameter")
        error_of(http.get(context, params={"k": "-1"}), 422, "InvalidParameter")
        error_of(http.get(context, params={"k": "²"}), 422, "InvalidParameter")
        error_of(http.get(context, params={"memory": "buffer", "k": "2"}), 422)
        error_of(http.get(context, params={"format": "xml"}), 422)
        error_of(http.get(context, params={"nonsense": "1"}), 422)
        error_of(http.get(context, params={"token_limit": "5", "counter": "approx"}), 422)
        error_of(
            http.get(context, params={"counter": "no-such-encoding", "token_limit": "99"}), 400
        )
        error_of(http.get("/v1/nowhere"), 404)
        error_of(http.put("/v1/sessions/s/messages"), 405)
        # Nothing bad was stored.
        assert len(http.get("/v1/sessions/s/messages").json()["messages"]) == 4


def test_a_store_that_stops_answering_gets_503_then_recovers(
    serve: Callable[..., Live], start_redis: Callable[..., RedisServer]
) -> None:
    from zerda.stores import RedisStore

    server = start_redis()
    live = serve(RedisStore(server.url, prefix="serve-test", timeout=0.5))
    key = key_for(live, "t")
    with live.client(key) as http:
        assert http.post("/v1/sessions/s/messages", json={"messages": TOOL_TURN}).status_code == 201
        server.stop()
        try:
            r = http.get("/v1/sessions/s/messages")
            error_of(r, 503)
            assert r.headers["Retry-After"] == "1"
            assert "Traceback" not in r.text
            error_of(live.http.get("/healthz"), 503)
        finally:
            server.cont()
        assert live.http.get("/healthz").json() == {"status": "ok"}
        assert len(http.get("/v1/sessions/s/messages").json()["messages"]) == 4
        metrics = live.http.get("/metrics").text
        assert "zerda_store_errors_total 2" in metrics


# -- keys and tenants -------------------------------------------------------------------------


def test_requests_without_a_valid_key_are_refused(serve: Callable[..., Live]) -> None:
    live = serve()
    key = key_for(live, "t")
    for headers in (
        {},
        {"Authorization": "Bearer"},
        {"Authorization": f"Basic {key}"},
        {"Authorization": "Bearer zk_000000000000_" + "A" * 43},
        {"Authorization": f"Bearer {key}x"},
        {"Authorization": f"Bearer {key[:-1]}"},
    ):
        for method, path in (
            ("GET", "/v1/sessions"),
            ("POST", "/v1/sessions/s/messages"),
            ("GET", "/v1/sessions/s/context"),
            ("DELETE", "/v1/sessions/s"),
        ):
            r = live.http.request(method, path, headers=headers, json={"messages": TOOL_TURN})
            error_of(r, 401, "Unauthorized")
    assert live.http.get("/healthz").status_code == 200  # no key needed


def test_a_revoked_key_is_refused_on_the_next_request(serve: Callable[..., Live]) -> None:
    live = serve()
    ring = KeyRing(live.store)
    key, record = ring.create("t")
    with live.client(key) as http:
        assert http.get("/v1/sessions").status_code == 200
        assert ring.revoke(record.key_id) == record
        error_of(http.get("/v1/sessions"), 401)
    assert ring.revoke(record.key_id) is None


def test_tenants_never_see_each_other(serve: Callable[..., Live]) -> None:
    live = serve()
    a, b = live.client(key_for(live, "alpha")), live.client(key_for(live, "beta"))
    with a, b:
        a.post("/v1/sessions/same/messages", json={"messages": [TOOL_TURN[0]]})
        b.post("/v1/sessions/same/messages", json={"messages": TOOL_TURN})
        assert len(a.get("/v1/sessions/same/messages").json()["messages"]) == 1
        assert len(b.get("/v1/sessions/same/messages").json()["messages"]) == 4
        a.post("/v1/sessions/only-a/messages", json={"messages": [TOOL_TURN[0]]})
        assert [s["id"] for s in b.get("/v1/sessions").json()["sessions"]] == ["same"]
        # Neither the store's own id nor a reserved one reaches across.
        for sid in ("alpha:only-a", "zerda.key:x", "..%2Falpha:only-a"):
            r = b.get(f"/v1/sessions/{sid}/messages")
            assert r.status_code in (400, 404), r.text
        error_of(b.delete("/v1/sessions/only-a"), 404)
        assert a.get("/v1/sessions/only-a/messages").status_code == 200


def segment(session_id: str) -> str:
    """``session_id`` as a path segment: ids of dots only (valid ids) escaped, or the client
    would read them as ``.`` and ``..`` and change the path."""
    return "%2E" * len(session_id) if set(session_id) == {"."} else session_id


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    tenants=st.lists(
        st.from_regex(r"[a-z0-9][a-z0-9_-]{0,6}", fullmatch=True),
        min_size=2,
        max_size=3,
        unique=True,
    ),
    ids=st.lists(
        st.from_regex(r"[A-Za-z0-9_.:@+=-]{1,12}", fullmatch=True), min_size=1, max_size=4
    ),
)
def test_isolation_over_any_ids_and_tenants(
    shared_live: Live, tenants: list[str], ids: list[str]
) -> None:
    """Each tenant writes its own text under the same ids; each reads back only its own."""
    run = f"{time.monotonic_ns()}"
    clients = {t: shared_live.client(key_for(shared_live, f"{t}{run[-6:]}")) for t in tenants}
    try:
        for tenant, http in clients.items():
            for sid in ids:
                message = {"role": "user", "content": f"{tenant}:{sid}"}
                r = http.post(f"/v1/sessions/{segment(sid)}/messages", json={"messages": [message]})
                if sid.startswith("zerda.key:"):  # reserved for API keys
                    error_of(r, 400)
                    continue
                assert r.status_code == 201, r.text
        for tenant, http in clients.items():
            listed = {s["id"] for s in http.get("/v1/sessions").json()["sessions"]}
            assert listed <= set(ids)
            for sid in listed:
                log = http.get(f"/v1/sessions/{segment(sid)}/messages").json()["messages"]
                assert {m["content"] for m in log} == {f"{tenant}:{sid}"}
    finally:
        for http in clients.values():
            http.close()


@pytest.fixture(scope="module")
def shared_live() -> Iterator[Live]:
    live = Live(InMemoryStore())
    yield live
    live.close()


# -- no auth, health, metrics, the description, the log -------------------------------------------


def test_no_auth_serves_the_store_as_the_cli_sees_it(serve: Callable[..., Live]) -> None:
    store = InMemoryStore()
    store.append("demo", [Message("user", "hi")])
    live = serve(store, auth=False)
    KeyRing(store).create("t")  # a key's reserved session is never shown or reachable
    sessions = live.http.get("/v1/sessions").json()["sessions"]
    assert [s["id"] for s in sessions] == ["demo"]
    assert live.http.get("/v1/sessions/demo/messages").json()["messages"][0]["content"] == "hi"
    error_of(live.http.get("/v1/sessions/zerda.key:abc/metadata"), 400)


def test_metrics_count_requests_latency_and_tokens(serve: Callable[..., Live]) -> None:
    live = serve()
    with live.client(key_for(live, "t")) as http:
        http.post("/v1/sessions/s/messages", json={"messages": TOOL_TURN})
        r = http.get("/v1/sessions/s/context", params={"token_limit": 500, "counter": "approx"})
        tokens = r.json()["stats"]["context_tokens"]
    text = live.http.get("/metrics").text
    assert (
        'zerda_requests_total{method="POST",route="/v1/sessions/{session_id}/messages",'
        'status="201"} 1'
    ) in text
    assert 'zerda_request_duration_seconds_count{route="/v1/sessions/{session_id}/context"} 1' in (
        text
    )
    assert f"zerda_tokens_served_total {tokens}" in text
    assert "s1" not in text
    assert "Bearer" not in text


def test_the_description_names_every_route(serve: Callable[..., Live]) -> None:
    live = serve()
    doc = live.http.get("/openapi.json").json()
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {
        "/v1/sessions",
        "/v1/sessions/{session_id}/messages",
        "/v1/sessions/{session_id}/context",
        "/v1/sessions/{session_id}/inspect",
        "/v1/sessions/{session_id}/metadata",
        "/v1/sessions/{session_id}",
        "/v1/sessions/{session_id}/tail",
        "/v1/sessions/{session_id}/compare-and-set",
        "/v1/sessions/{session_id}/delete-messages",
        "/v1/sessions/{session_id}/pop-turn",
        "/v1/sessions/{session_id}/fork-session",
        "/v1/sessions/{session_id}/edit-message",
        "/v1/sessions/{session_id}/messages/{message_id}",
        "/v1/sessions/{session_id}/pop",
        "/v1/sessions/{session_id}/fork",
        "/v1/sessions/purge-expired",
        "/mcp",
        "/healthz",
        "/metrics",
    }


def test_one_access_log_line_per_request_without_secrets(
    serve: Callable[..., Live], caplog: pytest.LogCaptureFixture
) -> None:
    live = serve()
    key = key_for(live, "t")
    with caplog.at_level(logging.INFO, logger="zerda.server.access"), live.client(key) as http:
        http.post("/v1/sessions/secret-session/messages", json={"messages": TOOL_TURN})
        http.get("/v1/sessions/secret-session/context", params={"k": 1})
        live.http.get("/v1/sessions", headers={"Authorization": "Bearer wrong"})
        # A line is written once the answer has gone out: the last may come a moment later.
        deadline = time.monotonic() + 10
        while True:
            lines = [r.getMessage() for r in caplog.records if r.name == "zerda.server.access"]
            if len(lines) >= 3 or time.monotonic() > deadline:
                break
            time.sleep(0.01)
    assert len(lines) == 3, lines
    assert lines[0].startswith("POST /v1/sessions/{session_id}/messages 201 ")
    assert lines[0].endswith("tenant=t")
    assert lines[2].startswith("GET /v1/sessions 401 ")
    for line in lines:
        assert key not in line
        assert "secret-session" not in line
        assert "42" not in line


# -- the commands -------------------------------------------------------------------------------


def _zerda(*args: str, db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zerda.cli", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def wait_until_healthy(process: subprocess.Popen[str], url: str) -> None:
    """Wait for the ``zerda serve`` of ``process`` to answer ``/healthz`` at ``url``."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "zerda serve did not answer"
        time.sleep(0.1)


def test_zerda_keys_create_list_revoke(tmp_path: Path) -> None:
    db = tmp_path / "keys.sqlite3"
    made = _zerda("keys", "create", "--tenant", "acme", db=db)
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert key.startswith("zk_")
    assert "not shown again" in made.stderr
    with SQLiteStore(db) as store:
        record = KeyRing(store).lookup(key)
        assert record is not None
        assert record.tenant == "acme"
        assert key not in json.dumps(store.get_metadata(f"zerda.key:{key}"))
    sessions = _zerda("sessions", db=db)
    assert sessions.returncode == 0, sessions.stderr
    assert "zerda.key" not in sessions.stdout  # keys are listed by zerda keys list only
    listed = _zerda("keys", "list", "--json", db=db)
    assert [r["tenant"] for r in json.loads(listed.stdout)] == ["acme"]
    assert key not in listed.stdout
    assert _zerda("keys", "revoke", record.key_id, db=db).returncode == 0
    gone = _zerda("keys", "revoke", record.key_id, db=db)
    assert gone.returncode == 1
    assert "no API key" in gone.stderr
    missing = tmp_path / "nothing" / "here.sqlite3"
    assert _zerda("keys", "list", "--json", db=missing).stdout.strip() == "[]"
    gone = _zerda("keys", "revoke", "abc", db=missing)
    assert gone.returncode == 1
    assert "does not exist" in gone.stderr
    assert not missing.parent.exists()  # listing and revoking create nothing
    bad = _zerda("keys", "create", "--tenant", "Bad:Name", db=db)
    assert bad.returncode == 1
    assert "tenant name" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("workers", [1, 2])
def test_zerda_serve_runs_and_stops(tmp_path: Path, workers: int) -> None:
    db = tmp_path / "serve.sqlite3"
    key = _zerda("keys", "create", "--tenant", "acme", db=db).stdout.strip()
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "zerda.cli", "--db", str(db), "serve", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--workers", str(workers)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(process, url)
        headers = {"Authorization": f"Bearer {key}"}
        for n in range(4):  # with two workers, requests land on both
            r = httpx.post(
                f"{url}/v1/sessions/s/messages",
                json={"messages": [{"role": "user", "content": f"m{n}"}]},
                headers=headers,
            )
            assert r.status_code == 201, r.text
        log = httpx.get(f"{url}/v1/sessions/s/messages", headers=headers).json()["messages"]
        assert [m["content"] for m in log] == ["m0", "m1", "m2", "m3"]
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert f"on http://127.0.0.1:{port}" in err
    assert "tenant=acme" in err  # the access log
    assert key not in err
    assert "Traceback" not in err
    with SQLiteStore(db) as store:
        assert [m.text for m in store.history("acme:s")] == ["m0", "m1", "m2", "m3"]


@pytest.mark.parametrize("workers", [1, 2])
def test_zerda_serve_on_a_port_in_use_says_so_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workers: int
) -> None:
    """One ``zerda: error:`` line and status 1, before any banner (issue #28: it printed
    "serving on", then uvicorn's raw [Errno 98], and exited 3)."""
    from zerda.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        db = tmp_path / "x.sqlite3"
        code = main(["--db", str(db), "serve", "--port", str(port), "--workers", str(workers)])
    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    assert captured.err.splitlines() == [
        f"zerda: error: cannot serve on 127.0.0.1:{port}: Address already in use; another "
        "process is listening there: stop it, or give another --port"
    ]


def test_zerda_serve_without_auth_says_so(tmp_path: Path) -> None:
    port = _free_port()
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zerda.cli",
            "--db",
            str(tmp_path / "x.sqlite3"),
            "serve",
            "--no-auth",
            "--port",
            str(port),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/v1/sessions", timeout=1)
                break
            except httpx.TransportError:
                assert process.poll() is None
                assert time.monotonic() < deadline
                time.sleep(0.1)
        assert r.status_code == 200
        assert r.json() == {"sessions": [], "next_cursor": None}
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert "WARNING: --no-auth" in err
    assert "anyone who can connect" in err


def test_summary_buffer_over_the_api_folds_what_the_context_no_longer_holds(
    serve: Callable[..., Live],
) -> None:
    live = serve()
    with live.client(key_for(live, "t")) as http:
        for n in range(8):
            turn = [
                {"role": "user", "content": f"Order {n}: a large oat latte with extra foam."},
                {"role": "assistant", "content": f"Order {n} is in: one large oat latte."},
            ]
            assert http.post("/v1/sessions/s/messages", json={"messages": turn}).status_code == 201
        params = {"memory": "summary_buffer", "token_limit": 120, "counter": "approx"}
        body = http.get("/v1/sessions/s/context", params=params).json()
    stats = body["stats"]
    assert stats["turns_summarized"] > 0
    assert stats["turns_summarized"] + stats["turns_in_context"] == 8
    summary = [m for m in body["messages"] if m["role"] == "system"]
    assert len(summary) == 1
    # The summary holds orders of the folded turns only; the context, the newest verbatim.
    folded = {int(n) for n in re.findall(r"Order (\d)", summary[0]["content"])}
    assert folded
    assert max(folded) < stats["turns_summarized"]
    kept = [m["content"] for m in body["messages"] if m["role"] == "user"]
    assert kept[-1].startswith("Order 7:")


def test_query_parameters_are_those_documented_and_head_is_get(
    serve: Callable[..., Live],
) -> None:
    live = serve()
    with live.client(key_for(live, "t")) as http:
        http.post("/v1/sessions/s/messages", json={"messages": TOOL_TURN})
        message = error_of(http.get("/v1/sessions", params={"limt": "5"}), 422, "InvalidParameter")
        assert "limt" in message
        error_of(http.get("/v1/sessions/s/messages", params={"k": "1"}), 422)
        error_of(http.delete("/v1/sessions/s", params={"force": "1"}), 422)
        head = http.head("/v1/sessions/s/messages")
        assert head.status_code == 200
        assert head.content == b""
        r = http.request("OPTIONS", "/v1/sessions/purge-expired")
        assert r.status_code == 405
        assert r.headers["Allow"] == "POST"
        r = http.request("PUT", "/v1/sessions")
        assert set(r.headers["Allow"].split(", ")) == {"GET", "HEAD", "DELETE"}
