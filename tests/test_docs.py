"""The README, the docs pages and the examples run as written."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for page in PAGES:
        for i, block in enumerate(FENCE.findall(page.read_text(encoding="utf-8"))):
            found.append((f"{page.relative_to(ROOT)}#{i}", block))
    return found


def test_the_docs_have_code_to_run() -> None:
    pages_with_code = {name.split("#")[0] for name, _ in _blocks()}
    assert {"README.md", "docs/memory.md", "docs/messages.md", "docs/tokens.md"} <= pages_with_code


@pytest.mark.parametrize(("name", "code"), _blocks(), ids=[n for n, _ in _blocks()])
def test_doc_code_block_runs(name: str, code: str) -> None:
    exec(compile(code, name, "exec"), {"__name__": "__doc_example__"})


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
