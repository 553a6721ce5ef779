"""The docs' examples run on the core install, as `make demo` builds it (issue #15).

`make demo` makes a venv with ``pip install -e .``: the core dependencies, no extra. Every
python block of the README and docs/*.md that needs no extra (``extras_needed`` in
test_docs.py says which need one; those run in test_docs.py, on the dev install) runs here in
such a venv, in a fresh interpreter, offline (an empty tiktoken cache, a proxy that refuses),
with ``ZerdaWarning`` an error as in the rest of the suite.

The venv is built once into ``.venv/demo-venv`` (ignored by git, removed by ``make clean``) and
reused while pyproject.toml, the Python running the tests and this folder stay the same: the
key of the build is kept in the venv. A file lock keeps pytest-xdist's workers from building it
twice. A cold build takes tens of seconds (pip builds and installs Zerda and tiktoken); a warm
run only starts an interpreter per block.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_docs import core_blocks

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / ".venv" / "demo-venv"
BUILD_KEY = VENV / ".zerda-build-key"
PYTHON = VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
# Bump when the way the venv is built changes, so that a cached one is rebuilt.
RECIPE = "python -m venv; pip install -e ROOT (core dependencies only)"

CORE_BLOCKS = core_blocks()

# Runs one block as test_docs.py does, with ZerdaWarning an error as pyproject.toml makes it.
RUNNER = """\
import sys
import warnings

from zerda.errors import ZerdaWarning

warnings.simplefilter("error", ZerdaWarning)
name, path = sys.argv[1], sys.argv[2]
with open(path, encoding="utf-8") as file:
    code = compile(file.read(), name, "exec")
exec(code, {"__name__": "__doc_example__"})
"""

# What the venv holds: the optional dependencies (extras) installed in it, and where zerda is.
INSPECT = """\
import importlib.metadata as metadata
import json
import re

import zerda


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


optional = set()
for requirement in metadata.requires("zerda-memory") or []:
    if "extra ==" in requirement:
        optional.add(norm(re.match(r"[A-Za-z0-9._-]+", requirement).group(0)))
optional.discard("zerda-memory")
installed = {norm(d.metadata["Name"]) for d in metadata.distributions()}
print(json.dumps({"extras_installed": sorted(optional & installed), "zerda": zerda.__file__}))
"""


def _build_key() -> str:
    digest = hashlib.sha256((ROOT / "pyproject.toml").read_bytes())
    digest.update(f"\n{sys.version}\n{sys.executable}\n{ROOT}\n{RECIPE}".encode())
    return digest.hexdigest()


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    """One process at a time (pytest-xdist workers each set up session fixtures)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: one worker, or accept the race
        yield
        return
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _run(command: list[str], timeout: float) -> None:
    run = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
    if run.returncode != 0:
        pytest.fail(
            f"{' '.join(command)} exited {run.returncode}:\n{run.stdout[-3000:]}"
            f"{run.stderr[-3000:]}",
            pytrace=False,
        )


@pytest.fixture(scope="session")
def core_python() -> Path:
    """The interpreter of a venv with Zerda's core install only, built or reused."""
    VENV.parent.mkdir(parents=True, exist_ok=True)
    key = _build_key()
    with _exclusive(VENV.parent / "demo-venv.lock"):
        if PYTHON.exists() and BUILD_KEY.is_file() and BUILD_KEY.read_text() == key:
            return PYTHON
        shutil.rmtree(VENV, ignore_errors=True)
        _run([sys.executable, "-m", "venv", str(VENV)], timeout=300)
        install = ["install", "--quiet", "--disable-pip-version-check", "-e", str(ROOT)]
        _run([str(PYTHON), "-m", "pip", *install], timeout=900)
        BUILD_KEY.write_text(key)  # last: a build cut short is never reused
    return PYTHON


def _offline_env(tmp_path: Path) -> dict[str, str]:
    """The environment without the tests' Python settings, offline for tiktoken."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "TIKTOKEN_", "DATA_GYM_", "VIRTUAL_ENV"))
        and k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
    }
    cache = tmp_path / "empty-tiktoken-cache"
    cache.mkdir(exist_ok=True)
    refused = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused
    env.update(
        TIKTOKEN_CACHE_DIR=str(cache),
        HTTPS_PROXY=refused,
        https_proxy=refused,
        HTTP_PROXY=refused,
        http_proxy=refused,
    )
    return env


def test_the_venv_is_the_core_install(core_python: Path, tmp_path: Path) -> None:
    """No extra's package is there (so a block that needs one fails here), and Zerda is this
    working tree's, installed editable as `make demo` installs it."""
    run = subprocess.run(
        [str(core_python), "-c", INSPECT],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env=_offline_env(tmp_path),
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["extras_installed"] == []
    assert Path(found["zerda"]).resolve().is_relative_to(ROOT / "src")


def test_there_are_core_blocks_to_run() -> None:
    assert len(CORE_BLOCKS) >= 20


@pytest.mark.parametrize(("name", "code"), CORE_BLOCKS, ids=[name for name, _ in CORE_BLOCKS])
def test_doc_code_block_runs_on_the_core_install(
    core_python: Path, tmp_path: Path, name: str, code: str
) -> None:
    block = tmp_path / "block.py"
    block.write_text(code, encoding="utf-8")
    run = subprocess.run(
        [str(core_python), "-c", RUNNER, name, str(block)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env=_offline_env(tmp_path),
    )
    assert run.returncode == 0, f"{name} failed on the core install:\n{run.stderr[-4000:]}"
