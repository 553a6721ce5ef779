"""The benchmark scripts run (tiny sizes): they must not rot between the runs that matter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from services import require_postgres, require_redis

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"


@pytest.mark.skipif(not DATA.exists(), reason=f"shared data set not found at {DATA}")
def test_token_buffer_benchmark_runs_and_stays_in_budget(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "token_buffer.py"),
            "--sizes=300,600",
            "--turns=20",
            "--repeat=1",
            "--budget=500",
            f"--json={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
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
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "sqlite_store.py"),
            "--quick",
            f"--dir={tmp_path}",
            f"--json={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    assert result, "the benchmark wrote no results"
    assert "|" in run.stdout


@pytest.mark.skipif(not DATA.exists(), reason=f"shared data set not found at {DATA}")
@pytest.mark.parametrize(
    ("script", "server"),
    [("redis_store.py", "--url"), ("postgres_store.py", "--dsn")],
    ids=["redis", "postgres"],
)
def test_server_benchmarks_run(tmp_path: Path, script: str, server: str) -> None:
    target = require_redis() if script.startswith("redis") else require_postgres()
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / script),
            f"{server}={target}",
            "--quick",
            f"--json={out}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(out.read_text()), "the benchmark wrote no results"
    assert "|" in run.stdout
