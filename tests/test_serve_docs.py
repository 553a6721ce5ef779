"""docs/serve.md's curl examples run, in order, against a real server, and answer in the shape
the page shows."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")

from test_serve import Live, key_for
from zerda import Message
from zerda.stores import InMemoryStore

PAGE = Path(__file__).resolve().parents[1] / "docs" / "serve.md"
BASE = "http://127.0.0.1:8080"
BLOCK = re.compile(r"^```console\n(.*?)^```", re.DOTALL | re.MULTILINE)


def examples() -> list[tuple[str, str]]:
    """Every ``$ curl`` command of the page's console blocks (continuation lines joined), and
    the answer the page shows under it."""
    found = []
    for block in BLOCK.findall(PAGE.read_text(encoding="utf-8")):
        command: list[str] = []
        answer: list[str] = []
        for line in block.splitlines():
            if line.startswith("$ "):
                if command:
                    found.append(("\n".join(command), "\n".join(answer)))
                command, answer = [line[2:]], []
            elif command and not answer and _continued(command):
                command.append(line)
            elif command:
                answer.append(line)
        if command:
            found.append(("\n".join(command), "\n".join(answer)))
    return [(c, a) for c, a in found if c.startswith("curl ")]


def _continued(lines: list[str]) -> bool:
    """Whether a command goes on past these lines: a trailing backslash, or a quote open."""
    return lines[-1].endswith("\\") or "\n".join(lines).count("'") % 2 == 1


def test_the_page_has_curl_examples_for_every_route() -> None:
    commands = " ".join(c for c, _ in examples())
    for route in ("/v1/sessions", "/messages", "/context", "/metadata", "/healthz", "/metrics"):
        assert route in commands
    assert "-X DELETE" in commands
    assert "-X PATCH" in commands


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
def test_every_curl_example_answers_as_the_page_shows() -> None:
    store = InMemoryStore()
    for other in ("cy", "dee"):  # sessions the page lists and deletes besides its own
        store.append(f"acme:{other}", [Message("user", "A mocha.")])
    live = Live(store)
    try:
        env = {**os.environ, "KEY": key_for(live, "acme")}
        for command, shown in examples():
            run = subprocess.run(
                ["bash", "-c", command.replace(BASE, live.url)],
                capture_output=True,
                text=True,
                env=env,
                timeout=30,
                check=False,
            )
            assert run.returncode == 0, (command, run.stderr)
            got = run.stdout
            if shown.startswith("HTTP/1.1"):  # curl -i: the status line
                assert got.startswith(shown.splitlines()[0]), (command, got)
                continue
            if shown.startswith("{"):
                body = json.loads(got)
                assert "error" not in body or '"error"' in shown, (command, got)
                # Every field the page names is in the answer (the page shortens with …).
                for field in re.findall(r'"([a-z_]+)":', shown):
                    assert f'"{field}"' in got, (command, field, got)
            else:  # Prometheus text
                for line in shown.splitlines():
                    name = line.split("{")[0].split(" ")[0]
                    if name.startswith("zerda_"):
                        assert name in got, (command, name)
    finally:
        live.close()
