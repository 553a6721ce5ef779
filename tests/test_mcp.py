"""The MCP tools, driven by the MCP SDK's own client: over streamable HTTP at ``/mcp`` of a real
server on a loopback port (keys, tenants, both protocol eras, a two-worker ``zerda serve``), and
over stdio with ``zerda mcp`` as a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mcp", reason="the mcp extra is not installed")
pytest.importorskip("uvicorn", reason="the server extra is not installed")
import anyio
import httpx2
from mcp import Client, MCPError, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult
from starlette.testclient import TestClient

from test_serve import Live, _free_port, key_for, wait_until_healthy
from zerda import ConversationTokenBufferMemory, Message, formats
from zerda.cli import main
from zerda.server import _mcp, create_app
from zerda.stores import InMemoryStore, SQLiteStore
from zerda.tokens import counter_by_name

TOOLS = {
    "append_messages",
    "get_context",
    "inspect_context",
    "get_history",
    "list_sessions",
    "delete_session",
    "pop_turn",
    "delete_message",
    "edit_message",
    "fork_session",
}

# An old turn, then an order whose tool result was stored after the user interjected: the
# context must move the result back after its call, and a budget of 70 (approx) evicts the
# old turn.
ORDER = [
    {"role": "system", "content": "You take coffee orders."},
    {"role": "user", "content": "When do you open on Sundays, and is there parking nearby?"},
    {"role": "assistant", "content": "We open at eight on Sundays; the car park is next door."},
    {"role": "user", "content": "One latte, please."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "add_item", "arguments": '{"item": "latte"}'},
            }
        ],
    },
    {"role": "user", "content": "Wait, with oat milk."},
    {"role": "tool", "tool_call_id": "call_1", "content": '{"ok": true}'},
    {"role": "assistant", "content": "One oat latte, added."},
]
LIMIT = 70


@pytest.fixture
def live() -> Iterator[Live]:
    server = Live(InMemoryStore())
    yield server
    server.close()


@asynccontextmanager
async def connect(
    url: str, key: str | None, mode: str = "auto", *, reconnect: bool = False
) -> AsyncIterator[Client]:
    """The SDK's client on ``url``'s ``/mcp``, sending ``key`` as the REST API takes it;
    ``reconnect``: a new connection for every request."""
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    limits = httpx2.Limits(max_keepalive_connections=0) if reconnect else httpx2.Limits()
    async with (
        httpx2.AsyncClient(headers=headers, timeout=20, limits=limits) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


def run(body: Callable[[], Awaitable[None]]) -> None:
    anyio.run(body)


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer; the test fails on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content
    assert result.structured_content is not None
    # What a host shows the model is the same JSON, as text, compact: no tokens spent on indents.
    assert json.loads(text_of(result)) == result.structured_content
    assert "\n" not in text_of(result)
    return result.structured_content


def text_of(result: CallToolResult) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


async def refused(client: Client, tool: str, **arguments: Any) -> str:
    """The text of a tool error (the test fails if the call succeeds)."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    text = text_of(result)
    assert "Traceback" not in text
    return text


def library_memory(store: Any, stored_id: str) -> ConversationTokenBufferMemory:
    return ConversationTokenBufferMemory(
        LIMIT, token_counter=counter_by_name("approx"), store=store, session_id=stored_id
    )


# -- over HTTP ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28, and the initialize handshake
def test_the_tools_are_listed_with_schemas_a_host_can_use(live: Live, mode: str) -> None:
    async def body() -> None:
        async with connect(live.url, key_for(live, "acme"), mode) as client:
            assert client.server_info is None or client.server_info.name == "zerda"
            tools = {t.name: t for t in (await client.list_tools()).tools}
        assert set(tools) == TOOLS
        for tool in tools.values():
            assert tool.description
            assert "\n" not in tool.description  # the docstring, on one line
            schema = tool.input_schema
            assert schema["type"] == "object"
            for name, prop in schema["properties"].items():
                assert prop.get("description"), (tool.name, name)
            required = {
                "append_messages": ["session_id", "messages"],
                "list_sessions": [],
                "delete_message": ["session_id", "message_id"],
                "edit_message": ["session_id", "message_id", "content"],
                "fork_session": ["session_id", "new_session_id"],
            }
            assert schema.get("required", []) == required.get(tool.name, ["session_id"])
            assert "ctx" not in schema["properties"]
        context = tools["get_context"].input_schema["properties"]
        assert set(context) == {
            "session_id",
            "token_limit",
            "k",
            "memory",
            "reserve",
            "counter",
            "format",
        }
        assert context["token_limit"]["anyOf"][0] == {"minimum": 1, "type": "integer"}
        assert tools["get_context"].annotations is not None
        assert tools["get_context"].annotations.read_only_hint is True
        assert tools["delete_session"].annotations is not None
        assert tools["delete_session"].annotations.destructive_hint is True

    run(body)


def test_get_context_is_the_library_memorys_repaired_budgeted_context(live: Live) -> None:
    async def body() -> None:
        async with connect(live.url, key_for(live, "acme")) as client:
            appended = await call(client, "append_messages", session_id="s1", messages=ORDER)
            assert appended["appended"] == len(ORDER)
            context = await call(
                client, "get_context", session_id="s1", token_limit=LIMIT, counter="approx"
            )
            anthropic = await call(
                client,
                "get_context",
                session_id="s1",
                token_limit=LIMIT,
                counter="approx",
                format="anthropic",
            )
            history = await call(client, "get_history", session_id="s1")

        memory = library_memory(live.store, "acme:s1")
        expected = memory.get_context()
        assert context["messages"] == [m.to_openai() for m in expected]
        assert context["stats"] == memory.get_memory_stats()
        assert anthropic["messages"] == formats.to_anthropic(expected)
        # Budgeted: the old turn is out. Repaired: the result follows its call again.
        assert context["stats"]["turns_evicted"] == 1
        assert context["stats"]["context_tokens"] <= LIMIT
        assert context["stats"]["repairs"]["moved_results"] == 1
        roles = [m["role"] for m in context["messages"]]
        assert roles == ["system", "user", "assistant", "tool", "user", "assistant"]
        # The log itself is unchanged, ids as append_messages gave them.
        assert [m["id"] for m in history["messages"]] == appended["ids"]
        assert [Message.from_dict(m).to_openai() for m in history["messages"]] == [
            Message.from_openai(m).to_openai() for m in ORDER
        ]

    run(body)


def test_inspect_context_is_the_library_memorys_inspection(live: Live) -> None:
    async def body() -> None:
        async with connect(live.url, key_for(live, "acme")) as client:
            await call(client, "append_messages", session_id="s2", messages=ORDER)
            return await call(
                client, "inspect_context", session_id="s2", token_limit=LIMIT, counter="approx"
            )

    answer = anyio.run(body)
    inspection = library_memory(live.store, "acme:s2").inspect(turns=50)
    assert answer == {**inspection.as_dict(), "session_id": "s2"}  # the tenant's own id
    assert [t["fate"] for t in answer["turns"]] == ["evicted", "context", "context"]
    # The result stored after the interjection is sent after its call, in the turn before.
    [moved] = [r for m in answer["turns"][2]["messages"] for r in m["repairs"]]
    call_message = inspection.turns[1].messages[1].message
    assert moved == {"kind": "moved_results", "call_id": "call_1", "after": call_message.id}


def test_formats_in_and_out(live: Live) -> None:
    async def body() -> None:
        async with connect(live.url, key_for(live, "t")) as client:
            appended = await call(
                client,
                "append_messages",
                session_id="a",
                format="anthropic",
                system="Be brief.",
                messages=[
                    {"role": "user", "content": "Hi"},
                    {"role": "assistant", "content": [{"type": "text", "text": "Hello."}]},
                ],
            )
            assert appended["appended"] == 3  # the system prompt is a message too
            gemini = await call(client, "get_context", session_id="a", format="gemini")
            assert gemini["messages"]["system_instruction"] == {"parts": [{"text": "Be brief."}]}
            assert [c["role"] for c in gemini["messages"]["contents"]] == ["user", "model"]
            text = await refused(
                client, "append_messages", session_id="a", system="x", messages=ORDER[1:2]
            )
            assert "system goes with format anthropic or gemini" in text

    run(body)


def test_tenants_see_only_their_own_sessions(live: Live) -> None:
    alpha, beta = key_for(live, "alpha"), key_for(live, "beta")

    async def body() -> None:
        async with connect(live.url, alpha) as a, connect(live.url, beta) as b:
            await call(a, "append_messages", session_id="same", messages=ORDER[:3])
            await call(a, "append_messages", session_id="only-a", messages=ORDER[1:2])
            assert (await call(b, "list_sessions"))["sessions"] == []
            assert "no session 'only-a' here" in await refused(
                b, "get_history", session_id="only-a"
            )
            assert "no session" in await refused(b, "get_context", session_id="only-a", k=1)
            assert "no session" in await refused(b, "delete_session", session_id="only-a")
            # The store's own id of another tenant's session is just another id here.
            await refused(b, "get_history", session_id="alpha:only-a")
            await call(b, "append_messages", session_id="same", messages=ORDER[1:2])
            assert [s["id"] for s in (await call(b, "list_sessions"))["sessions"]] == ["same"]
            assert len((await call(b, "get_history", session_id="same"))["messages"]) == 1
            assert len((await call(a, "get_history", session_id="same"))["messages"]) == 3
            assert await call(b, "delete_session", session_id="same") == {"deleted": "same"}
            assert len((await call(a, "get_history", session_id="same"))["messages"]) == 3
            listed = (await call(a, "list_sessions", limit=1))["sessions"]
            assert [s["id"] for s in listed] == ["only-a"]

    run(body)
    stored = [s.session_id for s in live.store.list_sessions()]
    assert sorted(s for s in stored if not s.startswith("zerda.key:")) == [
        "alpha:only-a",
        "alpha:same",
    ]


def test_a_request_without_a_valid_key_is_refused_before_any_mcp(live: Live) -> None:
    key = key_for(live, "acme")
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": "2025-06-18",
            "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"},
        },
    }
    accept = {"Accept": "application/json, text/event-stream"}
    for auth in ({}, {"Authorization": "Bearer nope"}, {"Authorization": f"Bearer {key}x"}):
        for content in (json.dumps(initialize), "not JSON-RPC at all"):
            r = live.http.post("/mcp", content=content, headers={**accept, **auth})
            assert r.status_code == 401, r.text
            assert r.json()["error"]["type"] == "Unauthorized"
    # With the key, the same garbage reaches the SDK, which refuses it its own way.
    r = live.http.post("/mcp", content="not JSON-RPC at all", headers={**accept, **_bearer(key)})
    assert r.status_code == 400, r.text
    r = live.http.post("/mcp", json=initialize, headers={**accept, **_bearer(key)})
    assert r.status_code == 200, r.text
    assert r.json()["result"]["serverInfo"]["name"] == "zerda"
    # Stateless: no stream to open, no session to end.
    for method in ("GET", "DELETE"):
        r = live.http.request(method, "/mcp", headers={**accept, **_bearer(key)})
        assert r.status_code == 405, r.text

    async def body() -> None:
        # The SDK's client reports the 401 as an error response, inside its task groups.
        with pytest.raises(BaseException) as refusal:  # noqa: PT011
            async with connect(live.url, None) as client:
                await client.list_tools()
        assert any(isinstance(e, MCPError) for e in leaves(refusal.value)), refusal.value

    run(body)
    assert live.store.list_sessions() != []  # only the key's reserved session
    assert all(s.session_id.startswith("zerda.key:") for s in live.store.list_sessions())


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``'s (nested) groups."""
    inner = getattr(exc, "exceptions", None)  # an exception group (3.11+, or the backport)
    if isinstance(inner, tuple):
        return [leaf for e in inner for leaf in leaves(e)]
    return [exc]


def test_zerdas_errors_are_tool_errors_with_its_message_and_crashes_say_nothing() -> None:
    class Failing(InMemoryStore):
        def history(self, session_id: str) -> list[Message]:
            raise RuntimeError("postgresql://app:hunter2@db.internal failed")

    live = Live(Failing())
    try:

        async def body() -> None:
            async with connect(live.url, key_for(live, "acme")) as client:
                text = await refused(client, "get_context", session_id="bad id!")
                assert "session id 'bad id!' has characters that are not accepted" in text
                text = await refused(
                    client,
                    "append_messages",
                    session_id="s",
                    messages=[{"role": "robot", "content": "hi"}],
                )
                assert "message 0" in text
                assert "robot" in text
                text = await refused(client, "get_context", session_id="s", k=2, token_limit=9)
                assert "memory=token takes no k" in text
                text = await refused(client, "list_sessions", cursor="not-ours")
                assert "cursor is not one this server gave" in text
                text = await refused(client, "get_history", session_id="s")
                assert "hunter2" not in text
                assert "get_history" in text

        run(body)
    finally:
        live.close()


def test_no_auth_serves_the_stores_own_ids() -> None:
    store = InMemoryStore()
    store.append("demo", [Message("user", "hi")])
    live = Live(store, auth=False)
    try:

        async def body() -> None:
            async with connect(live.url, None) as client:
                listed = (await call(client, "list_sessions"))["sessions"]
                assert [s["id"] for s in listed] == ["demo"]
                history = (await call(client, "get_history", session_id="demo"))["messages"]
                assert [m["content"] for m in history] == ["hi"]

        run(body)
    finally:
        live.close()


def test_mcp_needs_the_apps_lifespan_and_the_sdk(monkeypatch: pytest.MonkeyPatch) -> None:
    store = InMemoryStore()
    client = TestClient(create_app(store, auth=False, counter="approx"))  # no lifespan run
    r = client.post("/mcp", json={})
    assert r.status_code == 503
    assert "lifespan" in r.json()["error"]["message"]
    with TestClient(create_app(store, auth=False, counter="approx")) as running:
        assert running.post("/mcp", json={}).status_code == 400  # the SDK's, now
    monkeypatch.setattr(_mcp, "mcp_installed", lambda: False)
    without = TestClient(create_app(store, auth=False, counter="approx"))
    assert without.post("/mcp", json={}).status_code == 404
    assert without.get("/v1/sessions").status_code == 200


def test_zerda_serve_with_two_workers_answers_mcp_on_either(tmp_path: Path) -> None:
    """Stateless: the handshake and each call may land on different workers."""
    db = tmp_path / "serve.sqlite3"
    key = _zerda("keys", "create", "--tenant", "acme", db=db).stdout.strip()
    port = _free_port()
    command = [sys.executable, "-m", "zerda.cli", "--db", str(db), "serve", "--port", str(port)]
    process = subprocess.Popen(
        [*command, "--workers", "2", "--counter", "approx"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(process, url)

        async def body() -> None:
            async with connect(url, key, mode="legacy", reconnect=True) as client:
                for n in range(8):
                    message = {"role": "user", "content": f"m{n}"}
                    await call(client, "append_messages", session_id="s", messages=[message])
                history = await call(client, "get_history", session_id="s")
                assert [m["content"] for m in history["messages"]] == [f"m{n}" for n in range(8)]

        run(body)
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert "POST /mcp 200" in err
    assert "tenant=acme" in err
    assert key not in err


def _zerda(*args: str, db: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "zerda.cli", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# -- over stdio ---------------------------------------------------------------------------------


def stdio(db: Path, *options: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "zerda.cli", "--db", str(db), "mcp", "--counter", "approx", *options],
    )


def test_zerda_mcp_over_stdio_in_a_tenants_namespace(tmp_path: Path) -> None:
    db = tmp_path / "stdio.sqlite3"

    async def body() -> None:
        async with Client(stdio(db, "--tenant", "acme")) as client:
            assert {t.name for t in (await client.list_tools()).tools} == TOOLS
            await call(client, "append_messages", session_id="s1", messages=ORDER)
            context = await call(
                client, "get_context", session_id="s1", token_limit=LIMIT, counter="approx"
            )
            with SQLiteStore(db) as store:
                memory = library_memory(store, "acme:s1")
                assert context["messages"] == [m.to_openai() for m in memory.get_context()]
                assert context["stats"] == memory.get_memory_stats()

    run(body)


def test_zerda_mcp_without_a_tenant_serves_the_stores_own_ids(tmp_path: Path) -> None:
    db = tmp_path / "own.sqlite3"
    with SQLiteStore(db) as store:
        store.append("acme:old", [Message("user", "written by the library")])

    async def body() -> None:
        async with Client(stdio(db)) as client:
            listed = (await call(client, "list_sessions"))["sessions"]
            assert [s["id"] for s in listed] == ["acme:old"]
            history = await call(client, "get_history", session_id="acme:old")
            assert [m["content"] for m in history["messages"]] == ["written by the library"]

    run(body)


def test_zerda_mcp_refuses_a_bad_tenant_or_a_missing_extra_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "x.sqlite3")
    assert main(["--db", db, "mcp", "--tenant", "Bad:Name"]) == 1
    assert capsys.readouterr().err.startswith("zerda: error: a tenant name is")
    monkeypatch.setattr(_mcp, "mcp_installed", lambda: False)
    assert main(["--db", db, "mcp"]) == 1
    err = capsys.readouterr().err
    assert (
        err == "zerda: error: the MCP tools need the mcp extra: pip install 'zerda-memory[mcp]'\n"
    )
    assert not (tmp_path / "x.sqlite3").exists()  # both refused before the store was opened


def test_the_editing_tools_pop_delete_edit_and_fork(live: Live) -> None:
    async def body() -> None:
        async with connect(live.url, key_for(live, "t")) as client:
            ids = (await call(client, "append_messages", session_id="a", messages=ORDER))["ids"]
            popped = await call(client, "pop_turn", session_id="a")
            assert [m["id"] for m in popped["messages"]] == ids[5:]  # "Wait, with oat milk."
            deleted = await call(client, "delete_message", session_id="a", message_id=ids[4])
            assert deleted == {"deleted": 1}  # the call; its result went with the pop
            edited = await call(
                client, "edit_message", session_id="a", message_id=ids[1], content="A tea."
            )
            assert edited["message"]["content"] == "A tea."
            forked = await call(client, "fork_session", session_id="a", new_session_id="b")
            assert forked == {"session_id": "b", "messages": 4}
            assert "already holds" in await refused(
                client, "fork_session", session_id="a", new_session_id="b"
            )
            assert "no message" in await refused(
                client, "delete_message", session_id="a", message_id="nope"
            )

    run(body)
    assert [m.text for m in live.store.history("t:b")] == [
        ORDER[0]["content"],
        "A tea.",
        ORDER[2]["content"],
        ORDER[3]["content"],
    ]
