"""The public surface is on purpose: exported names, and an async twin for every sync method."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

import zerda
import zerda.chat
import zerda.errors
import zerda.formats
import zerda.integrations.adk
import zerda.integrations.langchain
import zerda.integrations.llama_index
import zerda.integrations.openai_agents
import zerda.integrations.pydantic_ai
import zerda.integrations.strands
import zerda.memory
import zerda.messages
import zerda.server
import zerda.stores
import zerda.summarize
import zerda.tokens
from zerda.memory import (
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
)

API_PAGE = Path(__file__).resolve().parents[1] / "docs" / "api.md"


def documented_names(module: str) -> set[str]:
    """The names listed in docs/api.md under the heading ``## `module```."""
    text = API_PAGE.read_text(encoding="utf-8")
    section = text.split(f"## `{module}`\n", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))


ZERDA_NAMES = documented_names("zerda")
MEMORY_NAMES = documented_names("zerda.memory")
PUBLIC_MODULES = [
    zerda,
    zerda.chat,
    zerda.memory,
    zerda.messages,
    zerda.formats,
    zerda.tokens,
    zerda.errors,
    zerda.server,
    zerda.stores,
    zerda.summarize,
    zerda.integrations.adk,
    zerda.integrations.langchain,
    zerda.integrations.llama_index,
    zerda.integrations.openai_agents,
    zerda.integrations.pydantic_ai,
    zerda.integrations.strands,
]


def test_the_api_page_lists_the_core_names() -> None:
    """A sanity floor, so that a broken page parser cannot make the checks below vacuous."""
    assert {"Message", "ConversationBufferWindowMemory", "ZerdaError"} <= ZERDA_NAMES
    assert {"BaseMemory", "ConversationTokenBufferMemory"} <= MEMORY_NAMES


MEMORY_CLASSES = [
    BaseMemory,
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
]


@pytest.mark.parametrize("module", PUBLIC_MODULES, ids=lambda m: m.__name__)
def test_exported_names_are_exactly_the_documented_ones(module: ModuleType) -> None:
    names = documented_names(module.__name__)
    exported = module.__all__
    assert len(exported) == len(set(exported)), "duplicate names in __all__"
    assert set(exported) == names
    for name in exported:
        assert hasattr(module, name), f"{name} is in __all__ but not defined"


def test_top_level_reexports_are_the_same_objects() -> None:
    for name in MEMORY_NAMES & ZERDA_NAMES:
        assert getattr(zerda, name) is getattr(zerda.memory, name)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from zerda.memory import *", namespace)
    assert set(namespace) - {"__builtins__"} == MEMORY_NAMES


def _public_sync_methods(cls: type) -> list[str]:
    names = [n for n in dir(cls) if not n.startswith("_")]
    methods = []
    for name in names:
        attr = inspect.getattr_static(cls, name)
        if isinstance(attr, property) or not inspect.isfunction(attr):
            continue
        if inspect.iscoroutinefunction(attr):
            continue
        methods.append(name)
    return [n for n in methods if not (n.startswith("a") and n[1:] in methods)]


@pytest.mark.parametrize("cls", MEMORY_CLASSES, ids=lambda c: c.__name__)
def test_every_sync_method_has_an_async_twin(cls: type) -> None:
    sync_names = _public_sync_methods(cls)
    # A sanity floor, so that a broken discovery cannot make this test vacuous.
    assert {"save_context", "load_memory_variables", "add_messages", "get_context"} <= set(
        sync_names
    )
    for name in sync_names:
        twin = getattr(cls, "a" + name, None)
        assert twin is not None, f"{cls.__name__}.{name} has no async twin a{name}"
        assert inspect.iscoroutinefunction(twin), f"{cls.__name__}.a{name} is not async"
        sync_params = list(inspect.signature(getattr(cls, name)).parameters.values())
        async_params = list(inspect.signature(twin).parameters.values())
        assert async_params == sync_params, f"{cls.__name__}.a{name} parameters differ"


def test_window_has_window_info_twins() -> None:
    assert "get_window_info" in _public_sync_methods(ConversationBufferWindowMemory)
    assert inspect.iscoroutinefunction(ConversationBufferWindowMemory.aget_window_info)


def test_every_async_method_has_a_sync_twin() -> None:
    for cls in MEMORY_CLASSES:
        for name in dir(cls):
            if name.startswith("_"):
                continue
            attr = inspect.getattr_static(cls, name)
            if inspect.iscoroutinefunction(attr):
                assert name.startswith("a")
                assert callable(getattr(cls, name[1:], None)), f"{cls.__name__}.{name}"
