"""``zerda chat`` against the local fake OpenAI server: piped input with its commands, what each
request holds, the API key, a failing endpoint (``main()`` as a process runs it, see
test_cli.Zerda), and a session in a pseudo-terminal (a real process)."""

from __future__ import annotations

import re
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pexpect
import pytest

from _fake_openai import FakeOpenAI, Reply, failure
from test_cli import Run, Zerda
from zerda import ApproxCounter, Message, Role, to_openai
from zerda.chat import default_memory
from zerda.cli import main
from zerda.cli._render import short_id
from zerda.stores import InMemoryStore, SQLiteStore

APPROX = ApproxCounter()


@pytest.fixture
def fake() -> Iterator[FakeOpenAI]:
    with FakeOpenAI() as server:
        yield server


@pytest.fixture
def cli(tmp_path: Path) -> Zerda:
    runner = Zerda(tmp_path)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ZERDA_CHAT_MODEL"):
        runner.env.pop(name, None)
    return runner


def chat(
    cli: Zerda, fake: FakeOpenAI | str, lines: str, *args: str, env: dict[str, str] | None = None
) -> Run:
    """``zerda chat`` with ``lines`` on standard input (a pipe), against ``fake``."""
    url = fake if isinstance(fake, str) else fake.url
    return cli(
        "chat",
        "--base-url",
        url,
        "--counter",
        "approx",
        *args,
        stdin=lines.encode("utf-8"),
        env=env,
    )


def history(cli: Zerda, session: str) -> list[Message]:
    with SQLiteStore(cli.db) as store:
        return store.history(session)


def contexts(history: list[Message], model: str, token_limit: int | None) -> list[Any]:
    """What each request should have sent: for each user message of ``history``, the
    context of the chat's memory over the log up to and including it, as OpenAI dicts."""
    sent = []
    for i, message in enumerate(history):
        if message.role is Role.USER:
            store = InMemoryStore()
            store.append("s", history[: i + 1])
            memory = default_memory(
                model, token_limit=token_limit, token_counter=APPROX, store=store, session_id="s"
            )
            sent.append(to_openai(memory.get_context()))
    return sent


# -- from a pipe -------------------------------------------------------------------------------


def test_piped_lines_are_answered_stored_and_sent_as_the_memory_context(
    cli: Zerda, fake: FakeOpenAI
) -> None:
    questions = [f"Question number {n}: what comes after {n}?" for n in range(1, 6)]
    lines = f"{questions[0]}\n\n   \n" + "".join(f"{q}\n" for q in questions[1:]) + "//etc\n"
    # A small window: the oldest turns leave the context, the session keeps them all.
    run = chat(
        cli,
        fake,
        lines,
        "--session",
        "piped",
        "--system",
        "Be brief.",
        "--token-limit",
        "120",
        "--api-key-env",
        "ZERDA_TEST_KEY",
        env={
            "ZERDA_CHAT_MODEL": "local-model",
            "ZERDA_TEST_KEY": "sk-from-the-variable",
            "OPENAI_API_KEY": "sk-not-this-one",
        },
    ).succeeded()
    assert run.err == ""
    assert run.out == "".join(f"echo: {q}\n" for q in [*questions, "/etc"])

    stored = history(cli, "piped")
    assert [(m.role, m.content) for m in stored] == [
        (Role.SYSTEM, "Be brief."),
        *(
            (r, t)
            for q in [*questions, "/etc"]
            for r, t in [(Role.USER, q), (Role.ASSISTANT, f"echo: {q}")]
        ),
    ]
    assert [r["model"] for r in fake.requests] == ["local-model"] * 6
    assert all(r["stream"] is True for r in fake.requests)
    sent = [r["messages"] for r in fake.requests]
    assert sent == contexts(stored, "local-model", 120)
    assert all(s[0] == {"role": "system", "content": "Be brief."} for s in sent)
    assert all(s[-1]["role"] == "user" for s in sent)
    assert len(sent[-1]) < 1 + 2 * 5 + 1, "the window evicted the oldest turns"
    assert {h["authorization"] for h in fake.headers} == {"Bearer sk-from-the-variable"}

    shown = cli("show", "piped").succeeded().out
    assert "Session piped: 13 messages in 6 turns" in shown
    for q in questions:
        assert re.search(rf"^  \S{{8}}  user\s+\d+  {re.escape(q)}$", shown, re.MULTILINE)
        assert re.search(rf"^  \S{{8}}  assistant\s+\d+  echo: {re.escape(q)}$", shown, re.M)


def test_commands_from_a_pipe(cli: Zerda, fake: FakeOpenAI) -> None:
    lines = [
        "Hello",
        "Second question",
        "/context",
        "/stats",
        "/history",
        "/pop",
        "/fork side",
        "In the fork",
        "/fork side",
        "/bogus",
        "/stats now",
        "/help",
        "/exit",
        "never read",
    ]
    key = {"OPENAI_API_KEY": "sk-the-default"}
    run = chat(cli, fake, "\n".join(lines) + "\n", "--model", "local-model", env=key)
    assert run.code == 1, "the command errors make the status 1, after the whole input"
    assert "Traceback" not in run.err
    errors = run.err.splitlines()
    assert len(errors) == 3, run.err
    assert errors[0].startswith("zerda: error: cannot fork into 'side': "), errors[0]
    assert errors[1] == (
        "zerda: error: unknown command /bogus; the commands: /context, /stats, /history, /pop, "
        "/fork NAME, /retry, /help, /exit"
    )
    assert errors[2] == "zerda: error: /stats takes no argument"
    out = run.out

    # What was asked: two questions in default, one more in the fork; nothing after /exit.
    assert [r["messages"][-1]["content"] for r in fake.requests] == [
        "Hello",
        "Second question",
        "In the fork",
    ]
    assert fake.requests[2]["messages"] == [
        {"role": "user", "content": "Hello"},
        {"role": "assistant", "content": "echo: Hello"},
        {"role": "user", "content": "In the fork"},
    ]
    assert {h["authorization"] for h in fake.headers} == {"Bearer sk-the-default"}
    default, side = history(cli, "default"), history(cli, "side")
    assert [m.content for m in default] == ["Hello", "echo: Hello"]
    assert [m.content for m in side] == ["Hello", "echo: Hello", "In the fork", "echo: In the fork"]

    # /context: what zerda show --context prints, for the chat's memory (4096: an unknown model).
    context = out[out.index("Session default: what the model sees") : out.index("requests")]
    assert context.startswith(
        "Session default: what the model sees with --token-limit 4096 --reserve 512 "
        "(tokens by approx:chars/4)"
    )
    rows = re.findall(r"^  (\S{8})  (user|assistant)\s+(\d+)  (.*)$", context, re.MULTILINE)
    asked = [
        Message(Role.USER, "Hello"),
        Message(Role.ASSISTANT, "echo: Hello"),
        Message(Role.USER, "Second question"),
        Message(Role.ASSISTANT, "echo: Second question"),
    ]
    assert [(role, int(n), text) for _, role, n, text in rows] == [
        (m.role.value, APPROX.count_message(m), m.content) for m in asked
    ]
    total = APPROX.count_messages(asked)
    assert "In context: 2 of 2 turns, 0 evicted" in context
    assert f"Context tokens: {total} / 3584 (" in context

    # /stats: the usage the fake reported (10 + 5 a request) and the context now.
    assert re.search(r"^requests\s+2 since the chat started$", out, re.MULTILINE)
    assert re.search(r"^tokens used\s+30 = prompt 20 \+ completion 10 ", out, re.MULTILINE)
    assert re.search(r"^tool calls\s+0 \(0 failed\)$", out, re.MULTILINE)
    assert re.search(rf"^context now\s+{total} of 3,584 tokens \(", out, re.MULTILINE)
    assert re.search(r"^turns\s+2 in context, 0 evicted, of 2 in session default$", out, re.M)

    # /history and /pop print the ends of the ids, as zerda show does.
    assert "Session default: 4 messages in 2 turns." in out
    for m in default:
        assert f"  {short_id(m.id)}  {m.role.value:<9}  {m.content}" in out
    assert "Popped the newest turn of session default: 2 messages removed." in out
    assert re.search(
        r"^  \S{8}  user       Second question\n  \S{8}  assistant  echo: Second ", out, re.M
    )
    assert (
        "Forked session default into side (2 messages); the chat goes on in side, and default "
        "stays as it was." in out
    )
    assert "echo: In the fork\n" in out
    assert "/fork NAME  copy the session into a new session NAME" in out  # /help


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_a_model_that_is_down_then_retry(cli: Zerda, fake: FakeOpenAI) -> None:
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    down = chat(cli, url, "Hello\nnever sent\n", "--max-retries", "0", "--timeout", "5")
    line = down.failed(1)
    assert line.startswith(f"zerda: error: cannot reach model 'gpt-4o-mini' at {url}: "), line
    assert line.endswith("; what was sent is stored: /retry asks again"), line
    assert down.out == ""
    assert [(m.role, m.content) for m in history(cli, "default")] == [(Role.USER, "Hello")]

    # /retry asks the question again, once; a /retry with nothing to retry is an error, and
    # the input goes on (only a failed answer stops it).
    again = chat(cli, fake, "/retry\nNext\n/retry\n/history\n")
    assert again.code == 1
    assert again.err == (
        "zerda: error: nothing to retry: the conversation ends with the model's answer (send a "
        "new message, or /pop to ask that one again)\n"
    )
    assert again.out.startswith("echo: Hello\necho: Next\nSession default: 4 messages")
    assert fake.requests[0]["messages"] == [{"role": "user", "content": "Hello"}]
    assert [m.content for m in history(cli, "default")] == [
        "Hello",
        "echo: Hello",
        "Next",
        "echo: Next",
    ]


# -- the API key -------------------------------------------------------------------------------


def test_a_missing_api_key_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """(A key that reaches the server: the tests above, by --api-key-env and by default.)"""
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "ZERDA_TEST_KEY"):
        monkeypatch.delenv(name, raising=False)
    db = str(tmp_path / "x.sqlite3")
    base = ["--db", db, "chat", "--counter", "approx"]
    url = ["--base-url", "http://127.0.0.1:9/v1"]
    assert main([*base, *url, "--api-key-env", "ZERDA_TEST_KEY"]) == 2
    assert capsys.readouterr().err == (
        "zerda: error: --api-key-env ZERDA_TEST_KEY: the environment variable ZERDA_TEST_KEY "
        "is not set, or empty (see 'zerda chat --help')\n"
    )
    monkeypatch.setenv("ZERDA_TEST_KEY", "")
    assert main([*base, *url, "--api-key-env", "ZERDA_TEST_KEY"]) == 2
    assert "ZERDA_TEST_KEY is not set, or empty" in capsys.readouterr().err
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.startswith("zerda: error: no API key for OpenAI: set $OPENAI_API_KEY, or name ")
    assert "--api-key-env NAME" in err
    assert "--base-url URL" in err
    assert not Path(db).exists(), "refused before the store was opened"


# -- usage, and what needs no model ------------------------------------------------------------


def test_usage_errors_and_a_missing_openai_package(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "x.sqlite3")
    base = ["--db", db, "chat", "--base-url", "http://127.0.0.1:9/v1", "--counter", "approx"]
    assert main(["--json", *base]) == 2
    assert "--json" in capsys.readouterr().err
    assert main([*base, "--token-limit", "1"]) == 2
    assert "expected a number >= 2" in capsys.readouterr().err
    assert main([*base, "--session", "no spaces"]) == 2
    capsys.readouterr()
    monkeypatch.setitem(sys.modules, "openai", None)  # import raises ImportError
    assert main(base) == 1
    assert capsys.readouterr().err == (
        "zerda: error: zerda chat needs the openai package: pip install 'zerda-memory[openai]'\n"
    )
    assert not Path(db).exists()


def test_help_lists_the_options_and_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["chat", "--help"]) == 0
    text = capsys.readouterr().out
    for option in ("--model", "--base-url", "--session", "--db", "--token-limit", "--counter"):
        assert option in text
    for option in ("--system", "--api-key-env", "--timeout", "--max-retries"):
        assert option in text
    for command in ("/context", "/stats", "/history", "/pop", "/fork NAME", "/retry", "/exit"):
        assert f"\n  {command} " in text
    assert main(["--help"]) == 0
    assert re.search(r"^\s+chat\s+chat with a model", capsys.readouterr().out, re.MULTILINE)


# -- at a terminal -----------------------------------------------------------------------------


def _spawn(cli: Zerda, fake: FakeOpenAI, *args: str) -> pexpect.spawn:
    env = {**cli.env, "TERM": "dumb"}
    argv = ["-m", "zerda.cli", "--db", str(cli.db), "chat", "--base-url", fake.url]
    return pexpect.spawn(
        sys.executable,
        [*argv, "--counter", "approx", *args],
        env=env,
        cwd=str(cli.tmp),
        encoding="utf-8",
        timeout=30,
        dimensions=(40, 120),
    )


def test_a_session_at_a_terminal(cli: Zerda, fake: FakeOpenAI) -> None:
    child = _spawn(cli, fake, "--session", "tty", "--max-retries", "0")
    try:
        child.expect(
            rf"zerda chat: gpt-4o-mini at {re.escape(fake.url)}, session tty \(new\) in "
            rf"{re.escape(str(cli.db))}\. /help lists the commands, Ctrl-D leaves\.\r\n"
        )
        child.expect_exact("you> ")
        child.sendline("Hello there")
        child.expect_exact("echo: Hello there\r\n")
        child.expect_exact("you> ")
        child.sendline("/stats")
        child.expect(r"requests\s+1 since the chat started")
        child.expect_exact("you> ")

        # Ctrl-C while the answer is on its way stops it; the question waits for /retry.
        fake.script(Reply(content="too slow", stall=30))
        child.sendline("Take your time")
        fake.wait_for_requests(2)
        child.sendintr()
        child.expect_exact("[stopped: the answer is not stored; /retry asks again]\r\n")
        child.expect_exact("you> ")
        child.sendline("/retry")
        child.expect_exact("echo: Take your time\r\n")
        child.expect_exact("you> ")

        # An error is one line, and the chat goes on.
        fake.script(failure(500))
        child.sendline("Are you there?")
        child.expect_exact(
            f"error: model 'gpt-4o-mini' at {fake.url} answered HTTP 500: scripted failure; "
            "what was sent is stored: /retry asks again\r\n"
        )
        child.expect_exact("you> ")
        child.sendline("/nope")
        child.expect_exact("error: unknown command /nope; the commands: ")
        child.expect_exact("you> ")
        child.sendeof()
        child.expect(pexpect.EOF)
    finally:
        child.close()
    assert child.exitstatus == 0, child.before
    assert [(m.role, m.content) for m in history(cli, "tty")] == [
        (Role.USER, "Hello there"),
        (Role.ASSISTANT, "echo: Hello there"),
        (Role.USER, "Take your time"),
        (Role.ASSISTANT, "echo: Take your time"),
        (Role.USER, "Are you there?"),
    ]


class _Terminal:
    """Standard input that says it is a terminal; ``input()`` is patched to read it."""

    def __init__(self, *replies: str | type[BaseException]) -> None:
        self.replies = list(replies)

    def isatty(self) -> bool:
        return True

    def input(self, prompt: str = "") -> str:
        print(prompt, end="")
        reply = self.replies.pop(0)
        if isinstance(reply, str):
            return reply
        raise reply


def test_ctrl_c_at_the_prompt_leaves_with_130_and_ctrl_d_with_0(
    tmp_path: Path,
    fake: FakeOpenAI,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    args = ["--db", str(tmp_path / "x.sqlite3"), "chat", "--base-url", fake.url]
    args += ["--counter", "approx", "--session", "tty"]
    for ending, status in ((KeyboardInterrupt, 130), (EOFError, 0)):
        terminal = _Terminal("Hello", ending)
        monkeypatch.setattr(sys, "stdin", terminal)
        monkeypatch.setattr("builtins.input", terminal.input)
        assert main(args) == status
        out, err = capsys.readouterr()
        assert err == ""
        assert out.startswith("zerda chat: gpt-4o-mini at ")
        assert out.endswith("you> echo: Hello\nyou> \n")
