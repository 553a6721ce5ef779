"""The ``zerda`` command, run as a process runs it (in this one, a few in real subprocesses), and
``open_store`` behind its --db."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import json
import logging
import os
import re
import struct
import subprocess
import sys
import tempfile
import time
import warnings
import wave
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

import zerda
from _validators import (
    validate_anthropic,
    validate_gemini,
    validate_openai_chat,
    validate_responses,
)
from zerda import (
    ApproxCounter,
    ConfigurationError,
    Message,
    Role,
    ToolCall,
    formats,
    group_turns,
    to_openai,
)
from zerda.memory import (
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
)
from zerda.parts import AudioPart, FilePart, ImagePart, Part, ReasoningPart, TextPart
from zerda.stores import InMemoryStore, JSONFileStore, SQLiteStore, open_store
from zerda.stores._open import parse_target

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "coffee-order.jsonl"
SHARED_DATA = ROOT.parent / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"
CONSOLE_SCRIPT = Path(sys.executable).parent / "zerda"
APPROX = ApproxCounter()


def _sqlite_missing() -> str | None:
    """Why the SQLite store cannot back these tests, or None when it can."""
    with tempfile.TemporaryDirectory() as folder:
        try:
            SQLiteStore(Path(folder) / "probe.sqlite3").close()
        except NotImplementedError:
            return "SQLiteStore is still a placeholder (raises NotImplementedError)"
    return None


_NO_SQLITE = _sqlite_missing()
needs_sqlite = pytest.mark.skipif(_NO_SQLITE is not None, reason=str(_NO_SQLITE))


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def json(self) -> object:
        return json.loads(self.out)

    def succeeded(self) -> Run:
        assert self.code == 0, self.err
        assert "Traceback" not in self.err
        return self

    def failed(self, code: int, *expected: str) -> str:
        """Check the one-line error; returns it."""
        assert self.code == code, (self.out, self.err)
        assert "Traceback" not in self.err
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("zerda: error: "), self.err
        for text in expected:
            assert text in lines[0]
        return lines[0]


MODULE = (sys.executable, "-m", "zerda.cli")
"""The command as a subprocess runs it."""

# Python's own warning filters, which a `zerda` process starts with (pytest's are others).
PYTHON_WARNING_FILTERS = [
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, None),
    ("ignore", PendingDeprecationWarning, None),
    ("ignore", ImportWarning, None),
    ("ignore", ResourceWarning, None),
]


class Zerda:
    """Runs the ``zerda`` command with its own database and a clean environment: ``main()``
    in this process, as a fresh process would run it (its environment, folder, standard
    streams, warning filters, and no logging set up); or, given ``program`` or ``fresh=True``,
    a real subprocess (``python -m zerda.cli``), for what only a process shows."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "zerda.sqlite3"
        env = {k: v for k, v in os.environ.items() if k not in ("ZERDA_DB", "COLUMNS")}
        env.update(
            {
                # Never the real user's data folder, whatever a test forgets.
                "XDG_DATA_HOME": str(tmp_path / "xdg"),
                "HOME": str(tmp_path / "home"),
                "TZ": "UTC",
                "COLUMNS": "250",  # no cut texts in these tests
                "PYTHONIOENCODING": "utf-8",
            }
        )
        self.env = env

    def __call__(
        self,
        *args: str,
        db: Path | str | None = None,
        use_db: bool = True,
        stdin: bytes | None = None,
        env: dict[str, str] | None = None,
        program: Sequence[str] = MODULE,
        fresh: bool = False,
    ) -> Run:
        argv = [*args]
        if use_db:
            argv = ["--db", str(db if db is not None else self.db), *argv]
        environment = {**self.env, **(env or {})}
        if not fresh and tuple(program) == MODULE:
            return self._in_process(argv, stdin, environment)
        run = subprocess.run(
            [*program, *argv],
            input=stdin,
            capture_output=True,
            env=environment,
            cwd=self.tmp,
            timeout=120,
            check=False,
        )
        return Run(run.returncode, run.stdout.decode("utf-8"), run.stderr.decode("utf-8"))

    def _in_process(self, argv: list[str], stdin: bytes | None, env: dict[str, str]) -> Run:
        from zerda.cli import main

        raw_out, raw_err = io.BytesIO(), io.BytesIO()
        out, err = (
            io.TextIOWrapper(raw, encoding="utf-8", newline="") for raw in (raw_out, raw_err)
        )
        given = io.TextIOWrapper(io.BytesIO(stdin or b""), encoding="utf-8")
        saved = (dict(os.environ), os.getcwd(), sys.stdin, sys.stdout, sys.stderr)
        root = logging.getLogger()
        handlers, level = root.handlers[:], root.level
        try:
            os.environ.clear()
            os.environ.update(env)
            time.tzset()
            os.chdir(self.tmp)
            sys.stdin, sys.stdout, sys.stderr = given, out, err
            # As in a new process: no handler, so the library's warnings reach standard error
            # through logging's last resort, as a user sees them.
            root.handlers, root.level = [], logging.WARNING
            with warnings.catch_warnings():
                warnings.resetwarnings()
                for action, category, module in PYTHON_WARNING_FILTERS:
                    warnings.filterwarnings(action, category=category, module=module or "")
                code = main(argv)
        finally:
            root.handlers, root.level = handlers, level
            environ, cwd, sys.stdin, sys.stdout, sys.stderr = saved
            os.environ.clear()
            os.environ.update(environ)
            time.tzset()
            os.chdir(cwd)
        out.flush()
        err.flush()
        return Run(code, raw_out.getvalue().decode("utf-8"), raw_err.getvalue().decode("utf-8"))

    def imported(self, session: str = "demo", path: Path = EXAMPLE) -> Run:
        return self("import", str(path), "--session", session).succeeded()


@pytest.fixture
def cli(tmp_path: Path) -> Zerda:
    return Zerda(tmp_path)


def example() -> list[Message]:
    return [Message.from_dict(json.loads(line)) for line in EXAMPLE.read_text().splitlines()]


def write_jsonl(path: Path, values: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(v) + "\n" for v in values), encoding="utf-8")
    return path


@pytest.fixture
def sqlite(cli: Zerda) -> Iterator[SQLiteStore]:
    """The test's database, opened in this process to compare with what the command shows."""
    store = SQLiteStore(cli.db)
    yield store
    store.close()


# -- the example conversation and the entry points ---------------------------------------------


def test_the_example_is_a_coffee_order_with_answered_tool_calls() -> None:
    messages = example()
    assert messages[0].role == "system"
    turns = group_turns(messages)
    assert 3 <= len(turns) <= 4
    assert all(t.user is not None and t.reply is not None for t in turns)
    assert all(t.tool_calls and not t.pending_tool_calls for t in turns)
    assert any(len(m.tool_calls) > 1 for m in messages), "one message makes parallel calls"


@needs_sqlite
def test_the_console_script_is_the_same_command(cli: Zerda) -> None:
    assert CONSOLE_SCRIPT.exists(), "pip install -e . makes the zerda script"
    version = cli("--version", use_db=False, program=[str(CONSOLE_SCRIPT)]).succeeded()
    assert version.out.strip() == f"zerda {zerda.__version__}"
    cli.imported()
    listed = cli("sessions", "--json", program=[str(CONSOLE_SCRIPT)]).succeeded()
    assert [s["session_id"] for s in listed.json] == ["demo"]  # type: ignore[attr-defined]


def test_help_describes_every_command(cli: Zerda) -> None:
    top = cli("--help", use_db=False).succeeded().out
    for command in ("sessions", "show", "export", "import", "stats", "rm"):
        assert re.search(rf"^\s+{command}\s+\S", top, re.MULTILINE), command
    assert "ZERDA_DB" in top
    assert "XDG_DATA_HOME" in top
    assert "newest first" in cli("sessions", "--help", use_db=False).succeeded().out
    show = cli("show", "--help", use_db=False).succeeded().out
    for option in ("--context", "--k N", "--token-limit N", "--reserve N", "--counter", "--db"):
        assert option in show


def test_no_command_prints_the_help(cli: Zerda) -> None:
    run = cli(use_db=False).succeeded()
    assert "usage: zerda" in run.out


# -- import ----------------------------------------------------------------------------------


@needs_sqlite
def test_import_one_message_a_line(cli: Zerda, sqlite: SQLiteStore) -> None:
    run = cli.imported()
    assert "20 messages (4 turns)" in run.out
    assert "one message a line" in run.out
    stored = sqlite.history("demo")
    assert [m.to_openai() for m in stored] == [m.to_openai() for m in example()]
    assert all(m.created_at is not None for m in stored), "stamped with the import time"


@needs_sqlite
def test_import_one_conversation_a_line(cli: Zerda, sqlite: SQLiteStore) -> None:
    first = [{"role": "user", "content": "A cortado?"}, {"role": "assistant", "content": "Sure."}]
    second = [{"role": "user", "content": "And a bun."}, {"role": "assistant", "content": "Done."}]
    path = write_jsonl(
        cli.tmp / "dialogs.jsonl",
        [{"id": "d1", "scenario": "x", "messages": first}, {"id": "d2", "messages": second}],
    )
    run = cli("import", str(path), "--session", "two", "--json").succeeded()
    assert run.json == {
        "session_id": "two",
        "source": str(path),
        "form": "conversations",
        "conversations": 2,
        "messages": 4,
        "stored": 4,
        "turns": 2,
        "session_messages": 4,
        "session_turns": 2,
    }
    human = cli("import", str(path), "--session", "again").succeeded()
    assert "2 conversations, one conversation a line" in human.out
    assert [m.to_openai() for m in sqlite.history("two")] == [*first, *second]


@needs_sqlite
def test_import_the_shared_data_set(cli: Zerda, sqlite: SQLiteStore) -> None:
    if not SHARED_DATA.exists():
        pytest.skip(f"the shared data set is not at {SHARED_DATA}")
    with gzip.open(SHARED_DATA, "rt", encoding="utf-8") as lines:
        dialogs = [json.loads(next(lines)) for _ in range(5)]
    path = cli.tmp / "five.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in dialogs), encoding="utf-8")
    run = cli("import", str(path), "--session", "taskmaster", "--json").succeeded()
    expected = [m for d in dialogs for m in d["messages"]]
    assert run.json["form"] == "conversations"  # type: ignore[index]
    assert run.json["messages"] == len(expected)  # type: ignore[index]
    assert [m.to_openai() for m in sqlite.history("taskmaster")] == expected


@needs_sqlite
def test_a_bad_line_is_reported_with_its_number_and_nothing_is_imported(
    cli: Zerda, sqlite: SQLiteStore
) -> None:
    cli.imported()
    lines = [json.dumps(m.to_openai()) for m in example()[:4]]
    lines.insert(2, "")  # blank lines are skipped but still counted
    lines.insert(4, '{"role": "tool", "content": "no call id"}')
    path = cli.tmp / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = cli("import", str(path), "--session", "demo")
    assert run.code == 1
    assert "Traceback" not in run.err
    first, last = run.err.splitlines()
    assert first.startswith(f"zerda: error: {path}:5: a tool message needs tool_call_id")
    assert last == f"zerda: error: nothing imported: 1 bad line in {path}"
    assert sqlite.tail("demo", 0).total_messages == 20, "the session is as it was"
    assert cli("import", str(path), "--session", "fresh").code == 1
    assert sqlite.history("fresh") == []


def test_bad_json_in_a_new_database_creates_no_file(cli: Zerda) -> None:
    path = cli.tmp / "bad.jsonl"
    path.write_text('{"role": "user", "content": "ok"}\n{"role": \n', encoding="utf-8")
    run = cli("import", str(path), "--session", "s")
    assert run.code == 1
    assert f"{path}:2: not JSON" in run.err
    assert not cli.db.exists()


def test_a_conversation_in_a_file_of_messages_is_a_bad_line(cli: Zerda) -> None:
    path = write_jsonl(
        cli.tmp / "mixed.jsonl",
        [{"role": "user", "content": "hi"}, {"messages": [{"role": "user", "content": "x"}]}],
    )
    run = cli("import", str(path), "--session", "s")
    assert run.code == 1
    assert f"{path}:2: a conversation" in run.err


@needs_sqlite
def test_import_reads_standard_input(cli: Zerda, sqlite: SQLiteStore) -> None:
    run = cli(
        "import", "-", "--session", "piped", stdin=EXAMPLE.read_bytes(), fresh=True
    ).succeeded()  # a real pipe
    assert "from <stdin>" in run.out
    assert len(sqlite.history("piped")) == 20


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--session", "'; DROP TABLE x; --"], "argument --session: session id"),
        ([], "one of the arguments --session --session-field is required"),
    ],
)
def test_import_needs_a_valid_session_id(cli: Zerda, args: list[str], expected: str) -> None:
    cli("import", str(EXAMPLE), *args).failed(2, expected, "zerda import --help")
    assert not cli.db.exists()


def test_import_of_an_empty_or_missing_file_fails(cli: Zerda) -> None:
    (cli.tmp / "empty.jsonl").write_text("\n\n", encoding="utf-8")
    cli("import", "empty.jsonl", "--session", "s").failed(1, "holds no messages")
    cli("import", "nope.jsonl", "--session", "s").failed(1, "nope.jsonl: No such file")


# -- sessions --------------------------------------------------------------------------------


@needs_sqlite
def test_sessions_newest_first_as_a_table_and_as_json(cli: Zerda, sqlite: SQLiteStore) -> None:
    cli.imported("older")
    cli.imported("newer")
    listed = cli("sessions", "--json").succeeded().json
    assert isinstance(listed, list)
    assert [s["session_id"] for s in listed] == ["newer", "older"]
    newer = listed[0]
    assert set(newer) == {
        "session_id",
        "messages",
        "turns",
        "created_at",
        "updated_at",
        "expires_at",
    }
    assert (newer["messages"], newer["turns"]) == (20, 4)
    stored = {s.session_id: s for s in sqlite.list_sessions()}
    assert newer["updated_at"] == stored["newer"].updated_at  # epoch seconds
    table = cli("sessions").succeeded().out.splitlines()
    assert table[0].split() == ["session", "messages", "turns", "last", "activity"]
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(newer["updated_at"]))  # TZ=UTC
    assert table[1].split() == ["newer", "20", "4", *when.split()]
    assert table[2].split()[0] == "older"
    # Aligned columns: the counts end where their header does.
    end = table[0].index("messages") + len("messages")
    assert all(row[:end].endswith(" 20") for row in table[1:])


def test_sessions_of_a_database_that_does_not_exist_yet(cli: Zerda) -> None:
    assert "No sessions" in cli("sessions").succeeded().out
    assert cli("sessions", "--json").succeeded().json == []
    assert not cli.db.exists(), "reading never creates the database"


# -- show ------------------------------------------------------------------------------------


@needs_sqlite
def test_show_gives_every_turn_with_its_messages_and_tokens(cli: Zerda) -> None:
    cli.imported()
    out = cli("show", "demo").succeeded().out
    messages = example()
    assert "Session demo: 20 messages in 4 turns (tokens by approx:chars/4)" in out
    for number in range(1, 5):
        assert f"Turn {number} of 4, " in out
    user = messages[1]
    assert re.search(
        rf"^  [0-9a-f]{{8}}  user\s+{APPROX.count_message(user)}  Hi! Do you have", out, re.M
    )
    assert '-> search_menu({"query": "oat milk", "sweetness": "low"})' in out
    assert '-> add_item({"item_id": "flat-white"' in out
    assert "set_order_type(" in out
    assert '[call_menu_1] {"items": [' in out
    turn1 = group_turns(messages)[0]
    assert f"4 messages, {sum(map(APPROX.count_message, turn1.messages))} tokens" in out


@needs_sqlite
def test_show_json_counts_every_message(cli: Zerda) -> None:
    cli.imported()
    shown = cli("show", "demo", "--json").succeeded().json
    assert isinstance(shown, dict)
    assert (shown["total_messages"], shown["total_turns"]) == (20, 4)
    assert "context" not in shown
    rows = [*shown["system"], *(r for t in shown["turns"] for r in t["messages"])]
    got = [Message.from_dict(r["message"]) for r in rows]
    assert [m.to_openai() for m in got] == [m.to_openai() for m in example()]
    assert [r["tokens"] for r in rows] == [APPROX.count_message(m) for m in got]
    for turn in shown["turns"]:
        assert turn["tokens"] == sum(r["tokens"] for r in turn["messages"])


@needs_sqlite
def test_show_uses_the_counts_stored_by_the_same_counter(cli: Zerda, sqlite: SQLiteStore) -> None:
    messages = example()
    sqlite.append("counted", messages, {APPROX.name: [7] * len(messages)})
    shown = cli("show", "counted", "--json").succeeded().json
    assert isinstance(shown, dict)
    rows = [*shown["system"], *(r for t in shown["turns"] for r in t["messages"])]
    assert {r["tokens"] for r in rows} == {7}, "stored counts, not counted again"


@needs_sqlite
@pytest.mark.parametrize("k", [1, 2, 4, 10])
def test_show_context_k_is_what_the_window_memory_gives(
    cli: Zerda, sqlite: SQLiteStore, k: int
) -> None:
    cli.imported()
    memory = ConversationBufferWindowMemory(k=k, store=sqlite, session_id="demo")
    expected = memory.get_context()
    shown = cli("show", "demo", "--context", "--k", str(k), "--json").succeeded().json
    assert isinstance(shown, dict)
    context = shown["context"]
    assert context["messages"] == to_openai(expected)
    kept = min(k, 4)
    assert (context["turns_in_context"], context["turns_evicted"]) == (kept, 4 - kept)
    parts = context["tokens_by_part"]
    assert context["tokens"] == APPROX.count_messages(expected) == sum(parts.values())
    human = cli("show", "demo", "--context", "--k", str(k)).succeeded().out
    assert f"In context: {kept} of 4 turns, {4 - kept} evicted" in human
    assert f"Context tokens: {context['tokens']} = system" in human
    assert ("Turn 1 of 4" in human) == (k >= 4)
    assert "Turn 4 of 4" in human


@needs_sqlite
@pytest.mark.parametrize(
    ("limit", "reserve"), [(300, 0), (400, 100), (150, 0), (100_000, 0), (260, 10)]
)
def test_show_context_token_limit_is_what_the_token_memory_gives(
    cli: Zerda, sqlite: SQLiteStore, limit: int, reserve: int
) -> None:
    cli.imported()
    memory = ConversationTokenBufferMemory(
        max_token_limit=limit,
        reserve_tokens=reserve,
        token_counter=ApproxCounter(),
        store=sqlite,
        session_id="demo",
    )
    expected = memory.get_context()
    stats = memory.get_memory_stats()
    args = ["show", "demo", "--context", "--token-limit", str(limit), "--reserve", str(reserve)]
    context = cli(*args, "--json").succeeded().json["context"]  # type: ignore[index]
    assert context["messages"] == to_openai(expected)
    assert context["tokens"] == stats["context_tokens"] <= limit - reserve
    assert context["budget"] == limit - reserve
    assert context["turns_in_context"] == stats["turns_in_context"]
    assert context["turns_evicted"] == stats["turns_evicted"]
    assert context["truncated"] == stats["truncated"]
    human = cli(*args).succeeded().out
    assert f"Context tokens: {stats['context_tokens']} / {limit - reserve} (" in human
    assert f"{stats['turns_evicted']} evicted" in human
    assert ("Budget: " in human) == bool(reserve)
    assert context["truncated_tokens"] == stats["truncated_tokens"]
    assert stats["truncated"] is (limit == 150)  # the newest turn alone is over 150
    if stats["truncated"]:
        assert "its longest texts cut to fit" in human
        assert f"{stats['truncated_tokens']:,} tokens cut" in human


FORMATS = {
    "openai": (formats.to_openai, validate_openai_chat),
    "responses": (formats.to_responses, validate_responses),
    "anthropic": (formats.to_anthropic, validate_anthropic),
    "gemini": (formats.to_gemini, validate_gemini),
}


@needs_sqlite
@pytest.mark.parametrize("name", sorted(FORMATS))
def test_show_format_prints_the_request_a_provider_takes(
    cli: Zerda, sqlite: SQLiteStore, name: str
) -> None:
    cli.imported()
    # A stored defect: a result whose call never existed. Shown repaired, never sent.
    sqlite.append("demo", [Message(Role.TOOL, "stray", tool_call_id="ghost")])
    convert, validate = FORMATS[name]
    memory = ConversationTokenBufferMemory(
        max_token_limit=300, token_counter=ApproxCounter(), store=sqlite, session_id="demo"
    )
    context = cli("show", "demo", "--context", "--token-limit", "300", "--format", name)
    request = context.succeeded().json
    validate(request)  # type: ignore[arg-type]
    assert request == convert(memory.get_context())
    everything = cli("show", "demo", "--format", name).succeeded().json
    validate(everything)  # type: ignore[arg-type]
    buffer = ConversationBufferMemory(store=sqlite, session_id="demo")
    assert everything == convert(buffer.get_context())
    assert "stray" not in json.dumps(everything)
    assert everything != request  # the whole session is more than 300 tokens of it
    # --json changes nothing: the request is JSON already.
    assert cli("--json", "show", "demo", "--format", name).succeeded().json == everything


def test_show_format_refuses_an_unknown_format(cli: Zerda) -> None:
    cli.imported()
    cli("show", "demo", "--format", "xml").failed(2, "invalid choice: 'xml'")


@needs_sqlite
def test_show_context_over_budget_is_an_error(cli: Zerda) -> None:
    cli.imported()
    cli("show", "demo", "--token-limit", "20").failed(1, "try a larger --token-limit")


@needs_sqlite
def test_a_limit_implies_context(cli: Zerda) -> None:
    cli.imported()
    out = cli("show", "demo", "--k", "1").succeeded().out
    assert "what the model sees with --k 1" in out
    assert "Turn 3 of 4" not in out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--context"], "--context needs a limit: --k N"),
        (["--reserve", "10"], "--reserve goes with --token-limit"),
        (["--token-limit", "100", "--reserve", "100"], "must be less than --token-limit"),
        (["--k", "2", "--token-limit", "100"], "not allowed with argument --k"),
        (["--k", "0"], "argument --k: expected a number > 0"),
        (["--token-limit", "many"], "expected a whole number, got 'many'"),
    ],
)
def test_show_usage_errors(cli: Zerda, args: list[str], expected: str) -> None:
    cli("show", "demo", *args).failed(2, expected, "(see 'zerda show --help')")


@needs_sqlite
def test_show_a_missing_session_is_an_error(cli: Zerda) -> None:
    cli("show", "nobody").failed(1, "no session 'nobody'", "does not exist yet")
    cli.imported()
    line = cli("show", "nobody", "--context", "--k", "2").failed(1, "no session 'nobody'")
    assert "does not exist" not in line


@needs_sqlite
def test_an_unknown_counter_is_an_error(cli: Zerda) -> None:
    cli.imported()
    cli("show", "demo", "--counter", "no-such-encoding").failed(1, "no-such-encoding")


@needs_sqlite
def test_a_zerda_warning_is_one_line(cli: Zerda) -> None:
    """The default counter cannot load o200k_base here (an empty cache, a proxy that refuses)
    and falls back to the approximation with a warning."""
    cli.imported()
    offline = {
        "TIKTOKEN_CACHE_DIR": str(cli.tmp / "empty-cache"),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
    }
    # A fresh process: the warning is said once a process.
    run = cli("show", "demo", "--counter", "default", env=offline, fresh=True).succeeded()
    assert "tokens by approx:chars/4" in run.out
    (line,) = run.err.splitlines()
    # Once, in one line a terminal shows whole, with the fix in the command line's terms.
    assert line.startswith("zerda: warning: tiktoken could not load o200k_base (")
    assert "--counter NAME" in line
    assert len(line) <= 200, line


# -- export ----------------------------------------------------------------------------------


@needs_sqlite
def test_export_round_trips_the_openai_lines(cli: Zerda) -> None:
    cli.imported()
    exported = cli("export", "demo").succeeded().out
    assert exported == EXAMPLE.read_text(encoding="utf-8")
    out = cli("export", "demo", "-o", "copy.jsonl").succeeded().out
    assert "Exported 20 messages of session demo to copy.jsonl" in out
    assert (cli.tmp / "copy.jsonl").read_text(encoding="utf-8") == exported


@needs_sqlite
def test_export_full_keeps_times_and_metadata_and_imports_back(
    cli: Zerda, sqlite: SQLiteStore
) -> None:
    tagged = [
        Message("user", "Un café, s'il vous plaît", metadata={"lang": "fr"}, created_at=1.5e9),
        Message("assistant", "Voilà ☕", created_at=1.5e9 + 2),
    ]
    sqlite.append("fr", tagged)
    full = cli("export", "fr", "--full").succeeded().out
    assert [Message.from_dict(json.loads(line)) for line in full.splitlines()] == tagged
    (cli.tmp / "fr.jsonl").write_text(full, encoding="utf-8")
    cli("import", "fr.jsonl", "--session", "fr-copy").succeeded()
    copied = sqlite.history("fr-copy")
    assert [dataclasses.replace(m, id=None) for m in copied] == tagged
    assert all(m.id is not None for m in copied), "an import gives ids"


@needs_sqlite
def test_export_to_a_closed_pipe_is_quiet(cli: Zerda, sqlite: SQLiteStore) -> None:
    # More than a pipe buffer (64 KiB) that nobody reads: the write must hit the closed pipe.
    sqlite.append("long", [Message("user", "x" * 1000) for _ in range(200)])
    process = subprocess.Popen(
        [sys.executable, "-m", "zerda.cli", "--db", str(cli.db), "export", "long"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=cli.env,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    process.stdout.close()
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=120) == 1
    assert err == b""


@needs_sqlite
def test_export_a_missing_session_is_an_error(cli: Zerda) -> None:
    cli.imported()
    cli("export", "nobody").failed(1, "no session 'nobody'")


# -- stats -----------------------------------------------------------------------------------


@needs_sqlite
@pytest.mark.parametrize(
    "command",
    [["stats"], ["stats", "--json"], ["sessions"], ["sessions", "--json"], ["stats", "demo"]],
)
def test_the_cli_uses_no_deprecated_name_of_its_own(cli: Zerda, command: list[str]) -> None:
    """The commands read ``SessionInfo.messages`` and ``.turns``: no deprecation warning of
    the library's own old names reaches the user (issue #28)."""
    cli.imported()
    run = cli(*command).succeeded()
    assert run.err == "", run.err


REPAIRED = [
    {"role": "system", "content": "You take coffee orders."},
    {"role": "user", "content": "One latte, please."},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "order", "arguments": "{}"}},
            {"id": "c2", "type": "function", "function": {"name": "price", "arguments": "{}"}},
        ],
    },
    {"role": "user", "content": "Wait, with oat milk!"},
    {"role": "tool", "tool_call_id": "c1", "content": "ordered"},
    {"role": "tool", "tool_call_id": "c1", "content": "ordered again"},
    {"role": "assistant", "content": "Done. Changing it to oat milk."},
]


@needs_sqlite
def test_show_context_of_a_repaired_session_says_so_once(cli: Zerda) -> None:
    """Each repair under its message, the counts in the footer, and no bare library log line
    beside them (issue #28: the warning came twice)."""
    cli.imported("rep", write_jsonl(cli.tmp / "rep.jsonl", REPAIRED))
    run = cli("show", "rep", "--context", "--token-limit", "300").succeeded()
    assert run.err == ""
    assert run.out.count("Repaired for the model") == 1
    assert "↳ moved to follow its call c1" in run.out
    assert "↳ call c2 not sent: it has no result" in run.out
    assert "↳ not sent: its call c1 already has a result" in run.out
    shown = cli("show", "rep", "--context", "--token-limit", "300", "--json").succeeded()
    context = shown.json["context"]  # type: ignore[index]
    assert context["repairs"] == {
        "moved_results": 1,
        "dropped_duplicate_results": 1,
        "dropped_unanswered_calls": 1,
    }
    [moved] = [t for t in shown.json["turns"] if t["turn"] == 1]  # type: ignore[index]
    assert [m["message"]["role"] for m in moved["messages"]] == ["user", "assistant", "tool"]


@needs_sqlite
def test_stats_of_the_database(cli: Zerda) -> None:
    cli.imported("one")
    cli.imported("two")
    stats = cli("stats", "--json").succeeded().json
    assert isinstance(stats, dict)
    assert stats["backend"] == "sqlite"
    assert stats["target"] == stats["path"] == str(cli.db)
    assert stats["source"] == "--db"
    assert stats["file_size"] == cli.db.stat().st_size > 0
    assert isinstance(stats["schema_version"], int)
    assert stats["schema_version"] >= 1
    assert (stats["sessions"], stats["messages"], stats["turns"]) == (2, 40, 8)
    human = cli("stats").succeeded().out
    assert f"database        {cli.db} (from --db)" in human
    assert re.search(r"^file size\s+\d+\.\d KiB \([\d,]+ bytes\)$", human, re.M)
    assert re.search(r"^sessions\s+2$", human, re.M)


def test_stats_of_a_database_that_does_not_exist_yet(cli: Zerda) -> None:
    assert "does not exist yet" in cli("stats").succeeded().out
    stats = cli("stats", "--json").succeeded().json
    assert isinstance(stats, dict)
    assert (stats["exists"], stats["sessions"]) == (False, 0)
    assert not cli.db.exists()


@needs_sqlite
def test_stats_of_a_session_count_tokens_by_role(cli: Zerda) -> None:
    cli.imported()
    stats = cli("stats", "demo", "--json").succeeded().json
    assert isinstance(stats, dict)
    messages = example()
    for role in ("system", "user", "assistant", "tool"):
        of_role = [m for m in messages if m.role == role]
        assert stats["tokens_by_role"][role] == {
            "messages": len(of_role),
            "tokens": sum(map(APPROX.count_message, of_role)),
        }
    assert stats["tokens"] == sum(map(APPROX.count_message, messages))
    assert (stats["messages"], stats["turns"]) == (20, 4)
    assert stats["created_at"] <= stats["updated_at"]
    human = cli("stats", "demo").succeeded().out
    assert re.search(rf"^  total\s+20\s+{stats['tokens']}$", human, re.M)
    assert "first activity" in human
    assert "last activity" in human
    cli("stats", "nobody").failed(1, "no session 'nobody'")


# -- rm --------------------------------------------------------------------------------------


@needs_sqlite
def test_rm_deletes_the_session_and_its_metadata(cli: Zerda, sqlite: SQLiteStore) -> None:
    cli.imported("keep")
    cli.imported("drop")
    sqlite.update_metadata("drop", {"summary": "an order"})
    out = cli("rm", "drop").succeeded().out
    assert out.strip() == "Removed session drop: 20 messages in 4 turns, and its metadata."
    assert sqlite.get_metadata("drop") == {}
    assert sqlite.history("drop") == []
    assert [s.session_id for s in sqlite.list_sessions()] == ["keep"]
    cli("rm", "drop").failed(1, "no session 'drop'")
    removed = cli("rm", "keep", "--json").succeeded().json
    assert removed == {"session_id": "keep", "removed": True, "messages": 20, "turns": 4}


# -- the database: --db, ZERDA_DB, the XDG default, bad targets -------------------------------


@needs_sqlite
def test_db_and_json_after_the_command(cli: Zerda) -> None:
    cli.imported()
    before = cli("--db", str(cli.db), "--json", "sessions", use_db=False).succeeded()
    after = cli("sessions", "--db", str(cli.db), "--json", use_db=False).succeeded()
    assert before.out == after.out
    assert json.loads(after.out)[0]["session_id"] == "demo"
    # Given after the command, --db wins over one given before it.
    other = cli.tmp / "other.sqlite3"
    assert cli("sessions", "--json", "--db", str(other)).succeeded().json == []


@needs_sqlite
def test_zerda_db_from_the_environment(cli: Zerda) -> None:
    from_env = cli.tmp / "env.sqlite3"
    env = {"ZERDA_DB": str(from_env)}
    cli("import", str(EXAMPLE), "--session", "e", use_db=False, env=env).succeeded()
    assert from_env.exists()
    stats = cli("stats", "--json", use_db=False, env=env).succeeded().json
    assert stats["path"] == str(from_env)
    assert stats["source"] == "$ZERDA_DB"
    # --db overrides the environment.
    assert cli("sessions", "--json", env=env).succeeded().json == []


@needs_sqlite
def test_the_default_database_is_in_the_xdg_data_folder(cli: Zerda) -> None:
    expected = cli.tmp / "xdg" / "zerda" / "zerda.sqlite3"
    assert not expected.parent.exists()
    cli("import", str(EXAMPLE), "--session", "x", use_db=False).succeeded()
    assert expected.exists(), "the folder and the file are created"
    stats = cli("stats", "--json", use_db=False).succeeded().json
    assert isinstance(stats, dict)
    assert (stats["path"], stats["source"]) == (str(expected), "the default location")
    # XDG_DATA_HOME unset: ~/.local/share.
    home = {"XDG_DATA_HOME": ""}
    stats = cli("stats", "--json", use_db=False, env=home).succeeded().json
    expected_home = cli.tmp / "home" / ".local" / "share" / "zerda" / "zerda.sqlite3"
    assert stats["path"] == str(expected_home)  # type: ignore[index]


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("ftp://example.com/x", "unknown scheme 'ftp'"),
        # A server that does not answer (port 1 is closed): one line, the password hidden.
        ("redis://user:hunter2@127.0.0.1:1/0", "redis://user:***@127.0.0.1:1/0"),
        ("postgresql://postgres:hunter2@127.0.0.1:1/zerda", "postgres:***@127.0.0.1:1"),
        ("sqlite://host/file.db", "names a file, not a host"),
        ("memory:somewhere", "use memory: alone"),
    ],
)
def test_a_bad_db_target_is_one_line(cli: Zerda, target: str, expected: str) -> None:
    line = cli("sessions", db=target).failed(1, expected)
    assert "hunter2" not in line


def test_a_file_that_is_not_a_database(cli: Zerda) -> None:
    cli.db.write_text("just text, not SQLite\n" * 100, encoding="utf-8")
    cli("sessions").failed(1, str(cli.db.name))


def test_the_json_and_memory_backends(cli: Zerda) -> None:
    path = cli.tmp / "chats.json"
    cli("import", str(EXAMPLE), "--session", "j", db=path).succeeded()
    assert json.loads(path.read_text(encoding="utf-8"))["sessions"]["j"]
    assert cli("export", "j", db=f"json:{path}").succeeded().out == EXAMPLE.read_text()
    stats = cli("stats", "--json", db="memory:").succeeded().json
    assert stats == {
        "target": "memory:",
        "source": "--db",
        "backend": "memory",
        "sessions": 0,
        "messages": 0,
        "turns": 0,
    }


# -- main() in this process: what a subprocess cannot show deterministically -------------------


def test_ctrl_c_exits_130_quietly(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerda.cli import _commands, main

    def interrupted(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setitem(_commands.COMMANDS, "sessions", interrupted)
    assert main(["--db", "memory:", "sessions"]) == 130
    assert capsys.readouterr() == ("", "")


def test_main_returns_the_exit_status(capsys: pytest.CaptureFixture[str]) -> None:
    from zerda.cli import main

    assert main(["--db", "memory:", "sessions", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == []
    assert main(["show"]) == 2
    assert main(["--db", "memory:", "show", "nobody"]) == 1
    assert "zerda: error: no session 'nobody'" in capsys.readouterr().err


# -- open_store ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "backend", "path"),
    [
        ("sqlite:///srv/zerda/chats.db", "sqlite", "/srv/zerda/chats.db"),
        ("sqlite:chats/x.db", "sqlite", "chats/x.db"),
        ("chats.sqlite3", "sqlite", "chats.sqlite3"),
        ("/abs/chats.db", "sqlite", "/abs/chats.db"),
        ("data", "sqlite", "data"),
        ("chats.json", "json", "chats.json"),
        ("CHATS.JSON", "json", "CHATS.JSON"),
        ("json:chats.txt", "json", "chats.txt"),
        ("json:///srv/chats.json", "json", "/srv/chats.json"),
        ("./a:b.db", "sqlite", "a:b.db"),
        (Path("x.json"), "json", "x.json"),
    ],
)
def test_parse_target(target: str | Path, backend: str, path: str) -> None:
    parsed = parse_target(target)
    assert parsed.backend == backend
    assert parsed.path == Path(path)


def test_parse_target_expands_the_home_folder() -> None:
    assert parse_target("~/chats.db").path == Path.home() / "chats.db"


def test_memory_target() -> None:
    assert parse_target("memory:").path is None
    assert isinstance(open_store("memory:"), InMemoryStore)
    assert open_store("memory:", max_messages=4).max_messages == 4  # type: ignore[attr-defined]


@needs_sqlite
def test_open_store_opens_each_file_backend(tmp_path: Path) -> None:
    for target, cls in [
        (tmp_path / "a.sqlite3", SQLiteStore),
        (f"sqlite://{tmp_path}/b.db", SQLiteStore),
        (str(tmp_path / "c.json"), JSONFileStore),
        (f"json:{tmp_path}/d", JSONFileStore),
    ]:
        store = open_store(target, ttl=60)
        try:
            assert isinstance(store, cls)
            assert store.ttl == 60  # type: ignore[attr-defined]
            store.append("s", [Message("user", "hi")])
            assert len(store.history("s")) == 1
        finally:
            store.close()


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("", "empty"),
        ("   ", "empty"),
        ("redis://:pw@cache:6380/0?prefix=bad{x", "prefix must be"),
        ("postgres://u@h/db?schema=bad-name", "schema must be a Postgres identifier"),
        ("postgresql://bob:secret@db/zerda?schema=a&schema=b", "more than once"),
        ("mysql://localhost/x", "unknown scheme 'mysql'"),
        ("sqlite:", "has no path"),
        ("sqlite://", "has no path"),
        ("memory:x", "use memory: alone"),
    ],
)
def test_open_store_refuses_what_it_cannot_open(target: str, expected: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_store(target)
    message = str(caught.value)
    assert expected in message
    assert "secret" not in message
    assert ":pw@" not in message
    if "extra" in expected or "scheme" in expected or "empty" in expected:
        assert "sqlite:///absolute/path" in message, "lists the accepted forms"


def test_open_store_refuses_a_non_path() -> None:
    with pytest.raises(ConfigurationError, match="a path or a URL"):
        open_store(42)  # type: ignore[arg-type]


# -- ids: in-process runs of main() ------------------------------------------------------------


def test_import_gives_ids_and_a_full_export_imports_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerda.cli import main

    db, full = str(tmp_path / "z.sqlite3"), tmp_path / "full.jsonl"
    assert main(["--db", db, "import", str(EXAMPLE), "--session", "a"]) == 0
    with SQLiteStore(db) as store:
        ids = [m.id for m in store.history("a")]
    assert None not in ids, "import stamps an id on each message"
    assert len(set(ids)) == len(ids) == 20
    assert main(["--db", db, "export", "a", "--full", "-o", str(full)]) == 0
    assert [json.loads(line)["id"] for line in full.read_text().splitlines()] == ids
    capsys.readouterr()
    assert main(["--db", db, "import", str(full), "--session", "a"]) == 0
    out = capsys.readouterr().out
    assert "Imported 0 of 20 messages" in out
    assert "20 had an id the session holds already" in out
    assert main(["--db", db, "--json", "import", str(full), "--session", "b"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["messages"], report["stored"], report["session_messages"]) == (20, 20, 20)
    with SQLiteStore(db) as store:
        assert [m.id for m in store.history("a")] == ids, "nothing stored twice"


def test_a_file_naming_one_id_twice_is_refused_with_both_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerda.cli import main

    path = write_jsonl(
        tmp_path / "dup.jsonl",
        [
            {"role": "user", "content": "a", "id": "m1"},
            {"role": "assistant", "content": "b", "id": "m2"},
            {"role": "user", "content": "c", "id": "m1"},
        ],
    )
    assert main(["--db", str(tmp_path / "z.sqlite3"), "import", str(path), "--session", "s"]) == 1
    err = capsys.readouterr().err
    assert f"{path}:3: message id 'm1' is on line 1 already" in err
    assert not (tmp_path / "z.sqlite3").exists()


# -- content parts and the developer role ----------------------------------------------------


def png(width: int, height: int) -> bytes:
    """A real PNG of ``width`` x ``height`` black pixels (grey, 1 bit: small at any size)."""
    row = b"\x00" + bytes((width + 7) // 8)

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    pixels = zlib.compress(row * height)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", pixels) + chunk(b"IEND", b"")
    )


def wav(seconds: float, rate: int = 8000) -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(rate)
        w.writeframes(b"\x80" * int(seconds * rate))
    return out.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


IMAGE = b64(png(1024, 768))
AUDIO = b64(wav(3.2))
PDF = b64(b"%PDF-1.4\n" + bytes(120 * 1024))
MIXED = [
    Message(Role.DEVELOPER, "Answer in French.", created_at=1.7e9, id="m0"),
    Message(
        Role.USER,
        (
            TextPart("What is on this receipt?"),
            ImagePart(f"data:image/png;base64,{IMAGE}", detail="high"),
            ImagePart("https://example.com/cat.jpg", detail="low"),
            ImagePart(None, file_id="file-img"),
            AudioPart(AUDIO, "wav"),
            FilePart(f"data:application/pdf;base64,{PDF}", filename="receipt.pdf"),
            FilePart(None, url="https://example.com/terms.pdf"),
        ),
        metadata={"source": "app"},
        created_at=1.7e9 + 1,
        id="m1",
    ),
    Message(
        Role.ASSISTANT,
        (
            ReasoningPart(
                "The total is printed at the bottom, in euros.",
                signature="EqQBCkgIARABGAIiQL",
                extra={"anthropic": {"cache_control": {"type": "ephemeral"}}},
            ),
            ReasoningPart("", encrypted="gAAAAABn"),
            TextPart("Le total est de 12,40 €."),
        ),
        tool_calls=(
            ToolCall(
                id="c1", name="save", arguments="{}", extra={"gemini": {"thoughtSignature": "x"}}
            ),
        ),
        created_at=1.7e9 + 2,
        id="m2",
    ),
    Message(Role.TOOL, "saved", tool_call_id="c1", created_at=1.7e9 + 3, id="m3"),
]


def test_show_renders_parts_on_one_line_and_never_their_data(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from zerda.cli import main

    monkeypatch.setenv("COLUMNS", "400")
    db = str(tmp_path / "z.sqlite3")
    with SQLiteStore(db) as store:
        store.append("mixed", MIXED)
    assert main(["--db", db, "show", "mixed"]) == 0
    out = capsys.readouterr().out
    assert "Developer messages (pinned, sent first)" in out
    assert re.search(r"^  m0\s+developer\s+\d+  Answer in French\.$", out, re.M)
    user = next(line for line in out.splitlines() if line.startswith("  m1  user"))
    assert user.endswith(
        "What is on this receipt? [image png 1024x768 high] "
        "[image https://example.com/cat.jpg low] [image file-img] [audio wav 3.2 s] "
        "[file receipt.pdf 120 KiB] [file https://example.com/terms.pdf]"
    )
    reply = next(line for line in out.splitlines() if line.startswith("  m2  assistant"))
    assert reply.endswith(
        "[reasoning: The total is printed at the bottom, i...] [reasoning: encrypted] "
        "Le total est de 12,40 €. -> save({})"
    )
    for data in (IMAGE, AUDIO, PDF):
        assert data[:40] not in out


@pytest.mark.parametrize(
    ("part", "shown"),
    [
        (
            ImagePart("data:image/gif;base64," + b64(b"GIF89a\x20\x03\x58\x02" + bytes(8))),
            "[image gif 800x600]",
        ),
        (ImagePart("data:image/jpeg;base64,AAAA"), "[image jpeg 3 B]"),
        (ImagePart("data:image/png;name=a.png;base64,iVBORw0KGgo="), "[image image/png 8 B]"),
        (AudioPart(b64(bytes(48 * 1024)), "mp3"), "[audio mp3 48 KiB]"),
        (AudioPart(b64(wav(42)), "wav"), "[audio wav 42 s]"),
        (FilePart(None, file_id="file-abc"), "[file file-abc]"),
        (FilePart("data:text/plain;base64,aGk=", media_type="text/plain"), "[file text/plain 2 B]"),
        (ReasoningPart("", signature="sig"), "[reasoning]"),
        (ReasoningPart("line one\nline two"), "[reasoning: line one line two]"),
        (TextPart("two\nlines"), "two lines"),
    ],
)
def test_each_part_is_described_briefly(part: Part, shown: str) -> None:
    from zerda.cli._render import describe

    assert describe(part) == shown


def test_parts_and_the_developer_role_survive_export_full_and_import(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerda.cli import main

    db, full = str(tmp_path / "z.sqlite3"), tmp_path / "full.jsonl"
    with SQLiteStore(db) as store:
        store.append("mixed", MIXED)
    assert main(["--db", db, "export", "mixed", "--full", "-o", str(full)]) == 0
    assert [Message.from_dict(json.loads(line)) for line in full.read_text().splitlines()] == MIXED
    assert main(["--db", db, "import", str(full), "--session", "copy"]) == 0
    with SQLiteStore(db) as store:
        assert store.history("copy") == MIXED  # exactly: parts, extras, ids and times
    capsys.readouterr()
    assert main(["--db", db, "export", "copy"]) == 0  # OpenAI's form: what to_openai gives
    exported = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert exported == [m.to_openai() for m in MIXED]
    assert exported[0] == {"role": "developer", "content": "Answer in French."}
    assert [p["type"] for p in exported[1]["content"]] == [
        "text",
        "image_url",
        "image_url",
        "input_audio",
        "file",
    ]


def test_show_json_and_the_context_keep_parts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from zerda.cli import main

    db = str(tmp_path / "z.sqlite3")
    with SQLiteStore(db) as store:
        store.append("mixed", MIXED)
    assert main(["--db", db, "--json", "show", "mixed", "--k", "1"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [Message.from_dict(r["message"]) for r in shown["system"]] == MIXED[:1]
    rows = [r for t in shown["turns"] for r in t["messages"]]
    assert [Message.from_dict(r["message"]) for r in rows] == MIXED[1:]
    assert shown["context"]["messages"] == [m.to_openai() for m in MIXED]
    assert shown["context"]["turns_in_context"] == 1
    assert main(["--db", db, "--json", "stats", "mixed"]) == 0
    by_role = json.loads(capsys.readouterr().out)["tokens_by_role"]
    assert by_role["developer"]["messages"] == 1
