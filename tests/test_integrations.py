"""What every framework adapter promises: ``import zerda`` never imports the framework, and
an adapter imported without its framework says which extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

ADAPTERS = [
    # (adapter module, the framework module it needs, the extra that installs it)
    ("zerda.integrations.langchain", "langchain_core", "langchain"),
    ("zerda.integrations.llama_index", "llama_index.core", "llamaindex"),
]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.parametrize(("adapter", "framework", "extra"), ADAPTERS)
def test_import_zerda_does_not_import_the_framework(
    adapter: str, framework: str, extra: str
) -> None:
    top = framework.split(".")[0]
    run = _run(
        "import sys, zerda, zerda.integrations, zerda.memory, zerda.stores\n"
        f"assert {top!r} not in sys.modules, '{top} was imported'\n"
    )
    assert run.returncode == 0, run.stderr


@pytest.mark.parametrize(("adapter", "framework", "extra"), ADAPTERS)
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
