"""The layers of DESIGN.md §2: every module of the package imports only its own layer and the
layers below it (a front door may use a memory; a memory never imports a front door)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "zerda"

# Bottom to top; the package's private helpers sit with the layer that owns them.
LAYERS = [
    {"errors"},
    {"messages", "parts", "_ids", "_checks", "_media"},
    {"formats"},
    {"tokens", "_tool_schemas"},
    {"stores"},
    {"summarize"},
    {"policies"},
    {"memory"},
    {"integrations"},
    {"cli", "server", "chat"},
]
RANK = {name: rank for rank, layer in enumerate(LAYERS) for name in layer}
RANK[""] = len(LAYERS) - 1  # the package itself re-exports every layer: only the top uses it


def _layer_of(module: str) -> str:
    return module.split(".")[1] if "." in module else ""


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.append(node.module)
        elif isinstance(node, ast.Import):
            found.extend(alias.name for alias in node.names)
    return [name for name in found if name == "zerda" or name.startswith("zerda.")]


MODULES = sorted(p for p in SRC.rglob("*.py") if p.parent != SRC or p.stem != "__init__")


def test_every_part_of_the_package_has_a_layer() -> None:
    parts = {p.relative_to(SRC).parts[0].removesuffix(".py") for p in MODULES}
    assert parts - {"py.typed"} <= set(RANK), sorted(parts - set(RANK))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down_the_layers(path: Path) -> None:
    own = RANK[path.relative_to(SRC).parts[0].removesuffix(".py")]
    upward = [name for name in _imports(path) if RANK[_layer_of(name)] > own]
    assert upward == [], f"{path.relative_to(SRC)} imports a layer above its own"
