"""``zerda import --session-field``: a session per conversation, and JSON array files."""

from __future__ import annotations

import gzip
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from test_cli_replay import Out as ReplayOut
from zerda.cli import main
from zerda.stores import SQLiteStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "coffee-order.jsonl"
SHARED_DATA = ROOT.parent / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"


def chat(n: int) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": f"Order {n}: a flat white, please."},
        {"role": "assistant", "content": f"Order {n}: one flat white."},
    ]


def dialogs() -> list[dict[str, Any]]:
    """Three conversations as the shared data set has them: an id, a scenario, messages."""
    return [{"id": f"dlg-{n}", "scenario": "x", "messages": chat(n)} for n in (1, 2, 3)]


def write_jsonl(path: Path, values: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(v) + "\n" for v in values), encoding="utf-8")
    return path


def write_json(path: Path, value: object, indent: int | None = 2) -> Path:
    path.write_text(json.dumps(value, indent=indent), encoding="utf-8")
    return path


class Out(ReplayOut):
    """What a run printed (see test_cli_replay); an import error prints nothing on stdout."""

    def failed(self, code: int, *expected: str) -> list[str]:
        assert self.out == ""
        lines = super().failed(code, *expected)
        assert lines, "an error says why"
        return lines


class Zerda:
    def __init__(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "zerda.sqlite3"
        self.capsys = capsys

    def __call__(self, *args: str | Path) -> Out:
        code = main(["--db", str(self.db), *map(str, args)])
        captured = self.capsys.readouterr()
        return Out(code, captured.out, captured.err)

    def sessions(self) -> dict[str, list[dict[str, Any]]]:
        """Every session of the database, and its messages in OpenAI's format."""
        if not self.db.exists():
            return {}
        store = SQLiteStore(self.db)
        try:
            return {
                info.session_id: [m.to_openai() for m in store.history(info.session_id)]
                for info in store.list_sessions()
            }
        finally:
            store.close()


@pytest.fixture
def zerda(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Zerda:
    return Zerda(tmp_path, capsys)


# -- a session per conversation --------------------------------------------------------------


def test_session_field_puts_each_conversation_in_its_own_session(zerda: Zerda) -> None:
    path = write_jsonl(zerda.tmp / "d.jsonl", dialogs())
    run = zerda("import", path, "--session-field", "id").ok()
    assert run.out == (
        f"Imported 6 messages (3 turns) from {path} (3 conversations, one conversation a line) "
        "into 3 sessions named by 'id': dlg-1, dlg-2, dlg-3.\n"
    )
    assert zerda.sessions() == {f"dlg-{n}": chat(n) for n in (1, 2, 3)}


def test_the_json_output_names_every_session(zerda: Zerda) -> None:
    path = write_jsonl(zerda.tmp / "d.jsonl", dialogs())
    zerda("import", path, "--session-field", "id", "--session-prefix", "tm4:").ok()
    again = zerda("import", path, "--session-field", "id", "--session-prefix", "tm4:", "--json")
    assert again.ok().json == {
        "source": str(path),
        "form": "conversations",
        "conversations": 3,
        "messages": 6,
        "stored": 6,
        "turns": 3,
        "session_field": "id",
        "session_prefix": "tm4:",
        "sessions": [
            {
                "session_id": f"tm4:dlg-{n}",
                "conversations": 1,
                "messages": 2,
                "stored": 2,
                "turns": 1,
                "session_messages": 4,  # appended, as --session appends
                "session_turns": 2,
            }
            for n in (1, 2, 3)
        ],
    }
    assert sorted(zerda.sessions()) == ["tm4:dlg-1", "tm4:dlg-2", "tm4:dlg-3"]


def test_session_prefix_goes_before_every_name(zerda: Zerda) -> None:
    path = write_jsonl(zerda.tmp / "d.jsonl", dialogs())
    run = zerda("import", path, "--session-field", "id", "--session-prefix", "tm4:").ok()
    assert "into 3 sessions named by 'id': tm4:dlg-1, tm4:dlg-2, tm4:dlg-3." in run.out
    assert zerda.sessions() == {f"tm4:dlg-{n}": chat(n) for n in (1, 2, 3)}


def test_conversations_with_the_same_value_share_a_session_in_order(zerda: Zerda) -> None:
    values: list[dict[str, Any]] = [{"user": "ada", "messages": chat(1)}]
    values += [{"user": "bo", "messages": chat(2)}, {"user": "ada", "messages": chat(3)}]
    values.append({"user": 7, "messages": chat(4)})  # a whole number names a session too
    path = write_jsonl(zerda.tmp / "u.jsonl", values)
    run = zerda("import", path, "--session-field", "user", "--json").ok()
    assert [(s["session_id"], s["conversations"]) for s in run.json["sessions"]] == [
        ("ada", 2),
        ("bo", 1),
        ("7", 1),
    ]
    assert zerda.sessions() == {"ada": chat(1) + chat(3), "bo": chat(2), "7": chat(4)}


def test_many_sessions_are_named_briefly(zerda: Zerda) -> None:
    values = [{"id": f"d{n}", "messages": chat(n)} for n in range(5)]
    path = write_jsonl(zerda.tmp / "five.jsonl", values)
    run = zerda("import", path, "--session-field", "id").ok()
    assert run.out.rstrip().endswith("into 5 sessions named by 'id': d0, d1, d2 and 2 more.")
    assert len(zerda.sessions()) == 5


# -- what is refused, and then nothing is imported -------------------------------------------


def test_a_conversation_without_the_field_is_an_error_and_nothing_is_imported(
    zerda: Zerda,
) -> None:
    values = dialogs()
    del values[1]["id"]
    path = write_jsonl(zerda.tmp / "d.jsonl", values)
    lines = zerda("import", path, "--session-field", "id").failed(1)
    assert lines == [
        f"zerda: error: {path}:2: conversation 2 has no 'id' to name its session; its keys: "
        "'messages', 'scenario'",
        f"zerda: error: nothing imported: 1 conversation of 3 in {path} without a session name "
        "by --session-field id",
    ]
    assert not zerda.db.exists(), "not even the database is created"
    zerda("import", EXAMPLE, "--session", "demo").ok()
    zerda("import", path, "--session-field", "id").failed(1)
    assert list(zerda.sessions()) == ["demo"], "no conversation of the file was imported"


def test_an_unknown_field_names_the_keys_there_are(zerda: Zerda) -> None:
    values = [{"id": f"d{n}", "messages": chat(n)} for n in range(12)]
    path = write_jsonl(zerda.tmp / "d.jsonl", values)
    lines = zerda("import", path, "--session-field", "ID").failed(1)
    assert len(lines) == 11, "ten conversations shown, then the summary"
    assert lines[0] == (
        f"zerda: error: {path}:1: conversation 1 has no 'ID' to name its session; its keys: "
        "'id', 'messages'"
    )
    assert lines[-1] == (
        f"zerda: error: nothing imported: 12 conversations of 12 in {path} without a session "
        "name by --session-field ID (2 more not shown)"
    )
    assert zerda.sessions() == {}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, "conversation 1: 'id' is null; a session is named by a string or a whole number"),
        (True, "conversation 1: 'id' is a JSON bool"),
        (["a"], "conversation 1: 'id' is a JSON list"),
        ({"a": 1}, "conversation 1: 'id' is a JSON dict"),
        ("a b", "conversation 1: 'id' makes no session id: session id 'a b' has characters"),
        ("", "conversation 1: 'id' makes no session id: a session id must be 1 to 200"),
        ("x" * 201, "conversation 1: 'id' makes no session id: a session id must be 1 to 200"),
    ],
)
def test_a_value_that_names_no_session_is_an_error(
    zerda: Zerda, value: object, expected: str
) -> None:
    path = write_jsonl(zerda.tmp / "d.jsonl", [{"id": value, "messages": chat(1)}])
    zerda("import", path, "--session-field", "id").failed(1, f"{path}:1: {expected}")
    assert zerda.sessions() == {}


def test_a_prefix_that_makes_ids_too_long_is_an_error(zerda: Zerda) -> None:
    path = write_jsonl(zerda.tmp / "d.jsonl", dialogs())
    prefix = "p" * 196
    zerda("import", path, "--session-field", "id", "--session-prefix", prefix).failed(
        1, "must be 1 to 200 characters long, got 201", "3 conversations of 3"
    )


def test_session_field_needs_conversations(zerda: Zerda) -> None:
    zerda("import", EXAMPLE, "--session-field", "id").failed(
        1,
        "--session-field needs conversations",
        f"{EXAMPLE} holds one message a line; nothing imported",
    )
    assert not zerda.db.exists()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--session", "a", "--session-field", "id"], "not allowed with argument --session"),
        ([], "one of the arguments --session --session-field is required"),
        (["--session-prefix", "x"], "one of the arguments --session --session-field"),
        (["--session", "a", "--session-prefix", "x"], "--session-prefix goes with --session-field"),
        (["--session-field", "id", "--session-prefix", "a/b"], "--session-prefix: 'a/b' cannot"),
    ],
)
def test_usage_errors(zerda: Zerda, args: list[str], expected: str) -> None:
    path = write_jsonl(zerda.tmp / "d.jsonl", dialogs())
    (line,) = zerda("import", path, *args).failed(2, expected)
    assert line.endswith("(see 'zerda import --help')")
    assert not zerda.db.exists()


def test_an_empty_file_imports_nothing(zerda: Zerda) -> None:
    for name, text in (("empty.jsonl", ""), ("blank.jsonl", "\n \n"), ("empty.json", "[ ]\n")):
        path = zerda.tmp / name
        path.write_text(text, encoding="utf-8")
        zerda("import", path, "--session-field", "id").failed(
            1, f"{path} holds no messages; nothing imported"
        )
    assert not zerda.db.exists()


# -- a JSON array ----------------------------------------------------------------------------


@pytest.mark.parametrize("indent", [2, None], ids=["pretty", "one-line"])
def test_a_json_array_of_conversations(zerda: Zerda, indent: int | None) -> None:
    path = write_json(zerda.tmp / "d.json", dialogs(), indent)
    run = zerda("import", path, "--session-field", "id").ok()
    assert f"from {path} (3 conversations, a JSON array of conversations)" in run.out
    assert zerda.sessions() == {f"dlg-{n}": chat(n) for n in (1, 2, 3)}
    into_one = zerda("import", path, "--session", "all", "--json").ok()
    assert into_one.json["form"] == "conversations"
    assert zerda.sessions()["all"] == chat(1) + chat(2) + chat(3), "without the flag: one session"


def test_a_json_array_of_messages(zerda: Zerda) -> None:
    messages = [json.loads(line) for line in EXAMPLE.read_text().splitlines()]
    path = write_json(zerda.tmp / "m.json", messages)
    run = zerda("import", path, "--session", "demo").ok()
    assert f"from {path} (a JSON array of messages) into session demo" in run.out
    from_lines = zerda("import", EXAMPLE, "--session", "lines").ok()
    assert "(one message a line)" in from_lines.out
    sessions = zerda.sessions()
    assert sessions["demo"] == sessions["lines"]


def test_a_bad_item_of_an_array_is_reported_by_its_line_and_number(zerda: Zerda) -> None:
    values = dialogs()
    values[2]["messages"][1] = {"role": "tool", "content": "no call id"}
    path = write_json(zerda.tmp / "d.json", values)
    starts = [n for n, line in enumerate(path.read_text().splitlines(), 1) if line == "  {"]
    assert len(starts) == 3
    lines = zerda("import", path, "--session-field", "id").failed(1)
    assert lines[0].startswith(
        f"zerda: error: {path}:{starts[2]}: item 3: message 2: a tool message needs tool_call_id"
    )
    assert lines[1] == f"zerda: error: nothing imported: 1 bad line in {path}"
    assert zerda.sessions() == {}


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ('{"role": "robot", "content": "hi"}', "unknown role 'robot'"),
        ('{"role": "user", "content": 5}', "content must be a string or a sequence of parts"),
        ('{"role": "user", "content": "\\ud800"}', "lone surrogate"),
    ],
)
@pytest.mark.parametrize("command", ["import", "replay"])
@pytest.mark.parametrize("lines", [1, 2])
def test_a_bad_line_is_named_for_what_it_is_even_alone(
    zerda: Zerda, line: str, expected: str, command: str, lines: int
) -> None:
    """A file of one bad line is JSON Lines with a bad line, not "one JSON object over several
    lines" (issue #28): the problem is named as in a longer file."""
    path = zerda.tmp / "bad.jsonl"
    good = '{"role": "user", "content": "fine"}'
    path.write_text("\n".join([line, good][:lines]) + "\n", encoding="utf-8")
    args = ["--session", "s"] if command == "import" else ["--k", "1"]
    out = zerda(command, path, *args)
    assert out.code == 1, out
    assert f"{path}:1: " in out.err
    assert expected in out.err
    assert "over several lines" not in out.err


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('[{"messages": []},', ":1: item 2: not JSON: Expecting value"),
        ('[{"messages": []}', ":1: not JSON: the array has no closing ]"),
        ('[{"messages": []}] []', ":1: not JSON: text after the array's closing ]"),
        ('[{"messages": []} {"messages": []}]', ":1: not JSON: expected , or ] after item 1"),
        ("[1, 2]", ":1: item 1: "),
        ('[\n{"messages": []},\n{"role": "user", "content": "x"}\n]', ":3: item 2: expected a"),
        ("[" * 100_000, ":1: item 1: nested too deeply to read"),
    ],
)
def test_a_broken_array_is_an_error(zerda: Zerda, text: str, expected: str) -> None:
    path = zerda.tmp / "bad.json"
    path.write_text(text, encoding="utf-8")
    zerda("import", path, "--session", "s").failed(1, f"{path}{expected}", "nothing imported")
    assert not zerda.db.exists()


def test_a_json_object_instead_of_an_array_is_an_error(zerda: Zerda) -> None:
    path = write_json(zerda.tmp / "one.json", dialogs()[0])  # pretty-printed: many lines
    lines = zerda("import", path, "--session-field", "id").failed(1)
    assert lines == [
        f"zerda: error: {path}:1: one JSON object over several lines; Zerda reads JSON Lines "
        "(a message or a conversation on each line) or a JSON array of them: put the object "
        "on one line, or inside [ ]",
        f"zerda: error: nothing imported: 1 bad line in {path}",
    ]
    assert not zerda.db.exists()
    # On one line, an object is a line of JSON Lines, whatever the file is called, as before.
    write_json(path, dialogs()[0], indent=None)
    zerda("import", path, "--session-field", "id").ok()
    assert zerda.sessions() == {"dlg-1": chat(1)}


def test_an_array_with_a_byte_order_mark_and_standard_input(
    zerda: Zerda, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = zerda.tmp / "bom.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(dialogs()).encode())
    zerda("import", path, "--session-field", "id", "--session-prefix", "b.").ok()

    class Stdin:
        buffer = _Buffer(json.dumps(dialogs(), indent=1).encode())

    monkeypatch.setattr("sys.stdin", Stdin())
    run = zerda("import", "-", "--session-field", "id", "--session-prefix", "s.").ok()
    assert "from <stdin> (3 conversations, a JSON array of conversations)" in run.out
    assert sorted(zerda.sessions()) == [f"{p}.dlg-{n}" for p in "bs" for n in (1, 2, 3)]


@dataclass
class _Buffer:
    data: bytes

    def read(self) -> bytes:
        return self.data


# -- the shared data set ---------------------------------------------------------------------


def test_the_shared_data_set_by_its_ids(zerda: Zerda) -> None:
    if not SHARED_DATA.exists():
        pytest.skip(f"the shared data set is not at {SHARED_DATA}")
    with gzip.open(SHARED_DATA, "rt", encoding="utf-8") as lines:
        values = [json.loads(next(lines)) for _ in range(20)]
    path = write_jsonl(zerda.tmp / "twenty.jsonl", values)
    run = zerda("import", path, "--session-field", "id", "--session-prefix", "tm4:", "--json")
    result = run.ok().json
    assert result["conversations"] == 20
    assert [s["session_id"] for s in result["sessions"]] == [f"tm4:{v['id']}" for v in values]
    assert zerda.sessions() == {f"tm4:{v['id']}": v["messages"] for v in values}
    as_array = write_json(zerda.tmp / "twenty.json", values)
    again = zerda("import", as_array, "--session-field", "scenario").failed(1, "makes no session")
    assert len(again) == 11, "scenarios hold spaces: each conversation says so, ten shown"
