"""What every framework adapter promises: ``import zerda`` never imports the framework, an
adapter imported without its framework says which extra to install, and a developer message
stays one. ``messages_with_parts_st`` generates the messages each adapter's round-trip property
runs on: content parts of every kind, with extras, on every role. ``opened_stores`` gives the
stores each adapter's read-back-equals-added tests run over."""

from __future__ import annotations

import base64
import importlib
import itertools
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st

from _redis_servers import drop_keys, fresh_prefix
from services import RUN_ID, require_postgres, require_redis
from test_messages import created_at_st, ids_st, json_values, names_st
from zerda import Message, Role, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart
from zerda.stores import (
    AsyncRedisStore,
    AsyncSQLiteStore,
    InMemoryStore,
    JSONFileStore,
    RedisStore,
    SQLiteStore,
)

ADAPTERS = [
    # (adapter module, the framework module it needs, the extra that installs it)
    ("zerda.integrations.langchain", "langchain_core", "langchain"),
    ("zerda.integrations.llama_index", "llama_index.core", "llamaindex"),
]
"""The adapters with message converters (``to_NAME`` / ``from_NAME``)."""
AGENT_ADAPTERS = [
    # the agent SDKs' adapters: sessions and memories over a Zerda store, no converters
    ("zerda.integrations.openai_agents", "agents", "openai-agents"),
    ("zerda.integrations.pydantic_ai", "pydantic_ai", "pydantic-ai"),
    ("zerda.integrations._langchain_agents", "langchain", "langchain-agents"),
    ("zerda.integrations.adk", "google.adk", "adk"),
    ("zerda.integrations.strands", "strands", "strands"),
]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(("adapter", "framework", "extra"), ADAPTERS + AGENT_ADAPTERS)
def test_import_zerda_does_not_import_the_framework(
    adapter: str, framework: str, extra: str
) -> None:
    top = framework.split(".")[0]
    run = _run(
        "import sys, zerda, zerda.integrations, zerda.memory, zerda.stores\n"
        f"assert {top!r} not in sys.modules, '{top} was imported'\n"
    )
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(("adapter", "framework", "extra"), ADAPTERS + AGENT_ADAPTERS)
def test_a_missing_framework_names_the_extra(adapter: str, framework: str, extra: str) -> None:
    run = _run(
        "import sys\n"
        f"sys.modules[{framework!r}] = None\n"
        "try:\n"
        f"    import {adapter}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    assert run.returncode == 0, run.stderr
    assert f"pip install 'zerda-memory[{extra}]'" in run.stdout


# -- messages with every kind of part, for every adapter's round trip -----------------------------

MEDIA_TYPES = ["image/png", "image/jpeg", "application/pdf", "audio/wav", "text/plain"]
FORMAT_NAMES = ["anthropic", "gemini", "responses", "langchain", "llama_index"]

base64_st = st.binary(min_size=1, max_size=24).map(lambda b: base64.b64encode(b).decode())
data_urls_st = st.builds(
    lambda t, d: f"data:{t};base64,{d}", st.sampled_from(MEDIA_TYPES), base64_st
)
urls_st = (
    st.sampled_from(["https://example.com/cat.png", "https://example.com", "http://x/a b.pdf"])
    | data_urls_st
    | st.text(min_size=1, max_size=12)
)
optional_text_st = st.none() | st.text(min_size=1, max_size=12)
# By format name, what a provider said about a part that Zerda does not model; the adapters'
# own names hold anything too, even fields that clash with the ones they write.
extra_st = st.dictionaries(
    st.sampled_from(FORMAT_NAMES),
    st.dictionaries(
        st.sampled_from(["type", "id", "text", "url", "extras", "detail", "path", "x"]),
        json_values,
        max_size=3,
    ),
    max_size=2,
)
common_extra_st = st.just({}) | extra_st  # mostly none, as most parts have none


@st.composite
def images_st(draw: st.DrawFn) -> ImagePart:
    url = draw(st.none() | urls_st)
    file_id = draw(optional_text_st) if url is not None else draw(st.text(min_size=1))
    return ImagePart(
        url,
        file_id=file_id,
        detail=draw(st.sampled_from([None, "auto", "low", "high"])),
        media_type=draw(st.none() | st.sampled_from(MEDIA_TYPES)),
        extra=draw(common_extra_st),
    )


@st.composite
def files_st(draw: st.DrawFn) -> FilePart:
    data = draw(st.none() | data_urls_st | base64_st)
    url = draw(st.none() | urls_st)
    file_id = draw(optional_text_st)
    if data is None and url is None and file_id is None:
        file_id = "file-1"
    return FilePart(
        data,
        file_id=file_id,
        url=url,
        filename=draw(optional_text_st),
        media_type=draw(st.none() | st.sampled_from(MEDIA_TYPES)),
        extra=draw(common_extra_st),
    )


parts_st: st.SearchStrategy[Part] = st.one_of(
    st.builds(TextPart, st.text(max_size=20), extra=common_extra_st),
    images_st(),
    st.builds(
        AudioPart,
        base64_st | st.text(min_size=1, max_size=8),
        st.sampled_from(["wav", "mp3", "flac"]) | st.text(min_size=1, max_size=6),
        extra=common_extra_st,
    ),
    files_st(),
    st.builds(
        ReasoningPart,
        st.text(max_size=20),
        signature=optional_text_st,
        encrypted=optional_text_st,
        extra=common_extra_st,
    ),
)

calls_st = st.builds(
    ToolCall,
    id=ids_st,
    name=st.text(min_size=1, max_size=12),
    arguments=st.sampled_from(['{"a": 1}', '{"a":1}', "[1]", "{"]) | st.text(max_size=10),
    type=st.just("function") | st.text(min_size=1, max_size=8),
    extra=common_extra_st,
)


@st.composite
def messages_with_parts_st(draw: st.DrawFn) -> Message:
    """Any Zerda message; content mostly parts, of every kind, on every role."""
    role = draw(st.sampled_from(Role))
    content: Any = draw(st.lists(parts_st, min_size=1, max_size=4).map(tuple) | st.text())
    fields: dict[str, Any] = {
        "name": draw(names_st),
        "metadata": draw(st.just({}) | st.dictionaries(st.text(max_size=5), json_values)),
        "created_at": draw(created_at_st),
        "id": draw(st.none() | st.from_regex(r"[A-Za-z0-9_-]{1,16}", fullmatch=True)),
    }
    if role is Role.ASSISTANT:
        fields["tool_calls"] = draw(st.lists(calls_st, max_size=2))
        if fields["tool_calls"] and draw(st.booleans()):
            content = None
    if role is Role.TOOL:
        fields["tool_call_id"] = draw(ids_st)
    return Message(role, content, **fields)


def _converters(adapter: str) -> tuple[Callable[[Message], Any], Callable[[Any], Message]]:
    framework = {a: f for a, f, _ in ADAPTERS}[adapter]
    pytest.importorskip(framework, reason=f"{framework} is not installed")
    module = importlib.import_module(adapter)
    name = adapter.rsplit(".", 1)[1]
    return getattr(module, f"to_{name}"), getattr(module, f"from_{name}")


@pytest.mark.parametrize("adapter", [a for a, _, _ in ADAPTERS])
@pytest.mark.parametrize("role", [Role.DEVELOPER, "developer"])
def test_a_developer_message_stays_a_developer_message(adapter: str, role: Role | str) -> None:
    to_framework, from_framework = _converters(adapter)
    message = Message(role, "Answer in French.")
    back = from_framework(to_framework(message))
    assert back.role is Role.DEVELOPER
    assert back == message


# -- the stores every adapter's history is read back from -----------------------------------------

STORES = ["memory", "sqlite", "json", "redis", "postgres"]
"""Every kind of store, as the sync methods of an adapter use it."""
ASYNC_STORES = [*STORES, "async-sqlite", "async-redis", "async-postgres"]
"""Every kind of store, as the async methods of an adapter use it (a sync store too)."""

_schemas = itertools.count()


@contextmanager
def opened_stores(kind: str, tmp_path: Path) -> Iterator[Callable[[], Any]]:
    """A factory of stores of ``kind`` (one of :data:`ASYNC_STORES`) that all reach the same
    data, so that what one wrote another reads back from the store itself (the in-memory store
    is the same store each time). Sync stores are closed when the block ends; a test closes
    the async ones it opened, in its own event loop. A server store's data is dropped when the
    block ends; without its server the test skips (or fails under ZERDA_REQUIRE_SERVICES=1)."""
    made: list[Any] = []

    def keep(store: Any) -> Any:
        made.append(store)
        return store

    def close() -> None:
        while made:
            store = made.pop()
            if not kind.startswith("async"):
                store.close()

    try:
        if kind == "memory":
            shared = keep(InMemoryStore())
            yield lambda: shared
        elif kind in ("sqlite", "async-sqlite"):
            sqlite = AsyncSQLiteStore if kind.startswith("async") else SQLiteStore
            yield lambda: keep(sqlite(tmp_path / "chat.db"))
        elif kind == "json":
            yield lambda: keep(JSONFileStore(tmp_path / "chat.json"))
        elif kind in ("redis", "async-redis"):
            yield from _redis_stores(kind, keep, close)
        elif kind in ("postgres", "async-postgres"):
            yield from _postgres_stores(kind, keep, close)
        else:
            raise AssertionError(f"unknown store kind {kind!r}")
    finally:
        close()


def _redis_stores(
    kind: str, keep: Callable[[Any], Any], close: Callable[[], None]
) -> Iterator[Callable[[], Any]]:
    import redis

    url, prefix = require_redis(), fresh_prefix()
    store_class = AsyncRedisStore if kind.startswith("async") else RedisStore
    try:
        yield lambda: keep(store_class(url, prefix=prefix))
    finally:
        close()
        admin = redis.Redis.from_url(url)
        try:
            drop_keys(admin, prefix)
        finally:
            admin.close()


def _postgres_stores(
    kind: str, keep: Callable[[Any], Any], close: Callable[[], None]
) -> Iterator[Callable[[], Any]]:
    import psycopg

    from zerda.stores import AsyncPostgresStore, PostgresStore

    dsn, schema = require_postgres(), f"{RUN_ID}_adapters{next(_schemas)}"
    store_class = AsyncPostgresStore if kind.startswith("async") else PostgresStore
    try:
        yield lambda: keep(store_class(dsn, schema=schema, max_size=2))
    finally:
        close()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
