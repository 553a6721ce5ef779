"""Each agent SDK's default session or memory beside Zerda's, at 500, 2,000 and 8,000 messages.

A turn is the memory work an agent framework does around one model call: read what the model
is sent and record the turn's new messages (no model is called). Per framework, one run
times the framework's default (its SQLite session, checkpointer or file store, reading the
whole conversation as it does by default) and Zerda's adapter over a SQLiteStore, on the same
turns of the same session, and measures the bytes each one writes to disk per turn. The
modules ``benchmarks/_framework_*.py`` say what exactly each side does.

    .venv/bin/python benchmarks/frameworks.py                 # the full run
    .venv/bin/python benchmarks/frameworks.py --quick         # a smoke run
    .venv/bin/python benchmarks/frameworks.py --only adk,strands --json out.json

Sessions are the Taskmaster-4 coffee dialogs played one after another
(``benchmarks/_sessions.py``). A framework whose package is not installed is skipped with a
note.
"""

from __future__ import annotations

import argparse
import importlib
import json
import platform
import sys
import tempfile
from pathlib import Path
from typing import Any

FRAMEWORKS = ["openai_agents", "pydantic_ai"]
"""The frameworks measured, each by ``benchmarks/_framework_NAME.py`` (issue #29 adds Pydantic
AI, LangChain agents, Google ADK and Strands as their adapters land)."""


def _ratio(a: object, b: object) -> str:
    if isinstance(a, (int, float)) and isinstance(b, (int, float)) and b:
        return f"{a / b:.1f}x"
    return "-"


def _number(value: object) -> str:
    return f"{value:,}" if isinstance(value, (int, float)) else "-"


def print_table(rows: list[dict[str, Any]]) -> None:
    print(
        "| framework | messages | default µs/turn | Zerda µs/turn | time ratio "
        "| default bytes/turn | Zerda bytes/turn |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['framework']} | {_number(r['messages'])} | {_number(r['baseline_us'])} "
            f"| {_number(r['zerda_us'])} | {_ratio(r['baseline_us'], r['zerda_us'])} "
            f"| {_number(r['baseline_bytes'])} | {_number(r['zerda_bytes'])} |"
        )
    print()
    for name in dict.fromkeys(r["framework"] for r in rows):
        first = next(r for r in rows if r["framework"] == name)
        print(f"- {name}: default = {first['baseline']}; Zerda = {first['zerda']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="500,2000,8000", help="messages before the timing")
    parser.add_argument("--turns", type=int, default=5, help="timed turns per size")
    parser.add_argument("--only", default="", help=f"a comma list of {','.join(FRAMEWORKS)}")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a smoke run")
    parser.add_argument("--json", type=Path, help="write the rows to this file")
    args = parser.parse_args(argv)
    sizes = [40, 80] if args.quick else [int(s) for s in args.sizes.split(",")]
    turns = 2 if args.quick else args.turns
    chosen = [f for f in args.only.split(",") if f] or FRAMEWORKS
    unknown = sorted(set(chosen) - set(FRAMEWORKS))
    if unknown:
        parser.error(f"unknown framework(s) {', '.join(unknown)}; pick from {FRAMEWORKS}")

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    rows: list[dict[str, Any]] = []
    skipped: dict[str, str] = {}
    for name in chosen:
        try:
            module = importlib.import_module(f"_framework_{name}")
            with tempfile.TemporaryDirectory(prefix=f"zerda-bench-{name}-") as directory:
                rows.extend(module.measure(sizes, turns, Path(directory)))
        except ImportError as exc:
            skipped[name] = str(exc)
    print(f"Python {platform.python_version()}, {platform.machine()}; {turns} timed turns a size")
    print()
    print_table(rows)
    for name, why in skipped.items():
        print(f"- {name}: skipped ({why})")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "skipped": skipped}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
