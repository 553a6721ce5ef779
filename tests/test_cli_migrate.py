"""``zerda migrate``, run for real in subprocesses, over SQLite and the stores without a schema.

(Postgres's ``zerda migrate`` is tested in tests/stores/test_postgres.py, beside its server.)
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from zerda import Message
from zerda.stores import SQLiteStore
from zerda.stores._sqlite import MIGRATIONS


def zerda(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ZERDA_DB", "COLUMNS")}
    env.update({"XDG_DATA_HOME": str(tmp_path / "xdg"), "HOME": str(tmp_path / "home")})
    env["PYTHONIOENCODING"] = "utf-8"
    return subprocess.run(
        [sys.executable, "-m", "zerda.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=120,
        check=False,
    )


def succeeded(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    return done.stdout


def recorded(path: Path) -> list[str]:
    db = sqlite3.connect(path)
    try:
        return [name for (name,) in db.execute("SELECT name FROM _zerda_migrations ORDER BY rowid")]
    finally:
        db.close()


def test_migrate_creates_a_missing_sqlite_file_and_says_versions(tmp_path: Path) -> None:
    path = tmp_path / "new" / "chats.sqlite3"
    out = succeeded(zerda(tmp_path, "migrate", "--db", str(path)))
    n = len(MIGRATIONS)
    applied = f"{n} migration{'' if n == 1 else 's'} applied"
    assert out == f"Schema of {path}: version 0 -> {n} ({applied}).\n"
    assert recorded(path) == [m.__name__ for m in MIGRATIONS]
    again = succeeded(zerda(tmp_path, "--db", str(path), "migrate"))
    assert again == f"Schema of {path}: version {len(MIGRATIONS)}, already up to date.\n"
    assert recorded(path) == [m.__name__ for m in MIGRATIONS]


def test_migrate_json_output(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    with SQLiteStore(path) as store:
        store.append("s", [Message("user", "kept")])
    result = json.loads(succeeded(zerda(tmp_path, "migrate", "--db", str(path), "--json")))
    assert result == {
        "target": str(path),
        "backend": "sqlite",
        "schema": True,
        "version_before": len(MIGRATIONS),
        "version_after": len(MIGRATIONS),
        "applied": 0,
    }
    with SQLiteStore(path) as store:
        assert [m.content for m in store.history("s")] == ["kept"]


def test_migrate_reads_the_version_of_a_file_before_opening_it(tmp_path: Path) -> None:
    """A file made before the migrations table existed is version 0, then migrated."""
    path = tmp_path / "old.sqlite3"
    sqlite3.connect(path).close()  # an empty database: no table at all
    result = json.loads(succeeded(zerda(tmp_path, "migrate", "--db", str(path), "--json")))
    assert (result["version_before"], result["version_after"]) == (0, len(MIGRATIONS))


@pytest.mark.parametrize(
    ("target", "backend"), [("chats.json", "json"), ("json:x.data", "json"), ("memory:", "memory")]
)
def test_stores_without_a_schema_have_nothing_to_migrate(
    tmp_path: Path, target: str, backend: str
) -> None:
    out = succeeded(zerda(tmp_path, "migrate", "--db", target))
    assert out == f"Nothing to migrate: the {backend} store {target} has no schema.\n"
    result = json.loads(succeeded(zerda(tmp_path, "migrate", "--db", target, "--json")))
    assert result == {
        "target": target,
        "backend": backend,
        "schema": False,
        "version_before": None,
        "version_after": None,
        "applied": 0,
    }
    assert list(tmp_path.iterdir()) == [], "migrate created a file for a store without a schema"


def test_a_newer_sqlite_schema_is_one_error_line(tmp_path: Path) -> None:
    path = tmp_path / "z.sqlite3"
    SQLiteStore(path).close()
    db = sqlite3.connect(path)
    db.execute("INSERT INTO _zerda_migrations VALUES ('m999_from_the_future', 0)")
    db.commit()
    db.close()
    done = zerda(tmp_path, "migrate", "--db", str(path))
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("zerda: error: ")
    assert "newer" in lines[0]
    assert "m999_from_the_future" in lines[0]
    assert "Traceback" not in done.stderr


def test_migrate_is_in_the_help(tmp_path: Path) -> None:
    out = succeeded(zerda(tmp_path, "--help"))
    assert "migrate" in out
    sub = succeeded(zerda(tmp_path, "migrate", "--help"))
    assert "version before and after" in " ".join(sub.split())
