"""The editing commands of ``zerda``: ``rm --message``, ``pop``, ``edit``, ``fork``, and the
message ids ``show`` prints for them; run in-process on a SQLite file."""

from __future__ import annotations

import io
import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from test_cli_replay import Out as ReplayOut
from zerda import ApproxCounter, Message, Role, ToolCall
from zerda.cli import main
from zerda.memory import ConversationSummaryBufferMemory
from zerda.stores import SQLiteStore

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "coffee-order.jsonl"

# Whole ids as memories stamp them (UUID version 7: ids stamped together share their start).
SYSTEM = "01a235a5-bb94-754d-9c0d-06b100000000"
Q1 = "01a235a5-bb94-754d-9c0d-06b100000001"
CALL = "01a235a5-bb94-754d-9c0d-06b100000002"
RESULT = "01a235a5-bb94-754d-9c0d-06b100000003"
R1 = "01a235a5-bb94-754d-9c0d-06b100000004"
Q2 = "01a235a5-bb94-754d-9c0d-06b100000005"
R2 = "01a235a5-bb94-754d-9c0d-06b100000006"


def conversation() -> list[Message]:
    """A system message and two turns; the first makes a tool call that is answered."""
    return [
        Message(Role.SYSTEM, "You take coffee orders.", created_at=1.7e9, id=SYSTEM),
        Message(Role.USER, "Refund order 7.", created_at=1.7e9 + 1, id=Q1),
        Message(
            Role.ASSISTANT,
            None,
            tool_calls=(ToolCall(id="c1", name="refund", arguments='{"order": 77}'),),
            created_at=1.7e9 + 2,
            id=CALL,
        ),
        Message(
            Role.TOOL, "error: no order 77", tool_call_id="c1", created_at=1.7e9 + 3, id=RESULT
        ),
        Message(Role.ASSISTANT, "Sorry, that failed.", created_at=1.7e9 + 4, id=R1),
        Message(Role.USER, "A latte, please.", created_at=1.7e9 + 5, id=Q2),
        Message(Role.ASSISTANT, "One latte.", created_at=1.7e9 + 6, id=R2),
    ]


def ids_of(messages: list[Message]) -> list[str | None]:
    return [m.id for m in messages]


class Out(ReplayOut):
    """What a run printed (see test_cli_replay), and the one-line error of a failed edit."""

    def failed(self, *expected: str) -> str:
        """The one-line error of a command that failed with status 1 and printed nothing."""
        assert self.code == 1, (self.out, self.err)
        assert self.out == ""
        lines = self.err.splitlines()
        assert len(lines) == 1, self.err
        assert lines[0].startswith("zerda: error: "), self.err
        for text in expected:
            assert text in lines[0], lines[0]
        return lines[0]


class Zerda:
    def __init__(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.tmp = tmp_path
        self.db = tmp_path / "zerda.sqlite3"
        self.capsys = capsys

    def __call__(self, *args: str, db: Path | None = None) -> Out:
        code = main(["--db", str(db or self.db), *args])
        captured = self.capsys.readouterr()
        return Out(code, captured.out, captured.err)

    def store(self) -> SQLiteStore:
        return SQLiteStore(self.db)

    def history(self, session: str = "chat") -> list[Message]:
        with self.store() as store:
            return store.history(session)

    def metadata(self, session: str = "chat") -> dict[str, Any]:
        with self.store() as store:
            return store.get_metadata(session)

    def sessions(self) -> list[str]:
        with self.store() as store:
            return [s.session_id for s in store.list_sessions()]


@pytest.fixture
def zerda(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Zerda:
    monkeypatch.setenv("COLUMNS", "200")  # no cut texts
    cli = Zerda(tmp_path, capsys)
    with cli.store() as store:
        store.append("chat", conversation())
    return cli


def stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


# -- show: the ids -----------------------------------------------------------------------------


def test_show_starts_each_line_with_the_end_of_the_message_id(zerda: Zerda) -> None:
    out = zerda("show", "chat").ok().out
    rows = [line for line in out.splitlines() if line.startswith("  ")]
    assert [line.split()[:2] for line in rows] == [
        [m.id[-8:], m.role.value] for m in conversation() if m.id
    ]
    assert re.search(r"^  00000005  user\s+\d+  A latte, please\.$", out, re.M)
    assert Q2 not in out, "whole ids only with --ids"


def test_show_ids_prints_whole_ids(zerda: Zerda) -> None:
    out = zerda("show", "chat", "--ids").ok().out
    assert re.search(rf"^  {SYSTEM}  system\s+\d+  You take coffee orders\.$", out, re.M)
    assert re.search(rf"^  {RESULT}  tool\s+\d+  \[c1\] error: no order 77$", out, re.M)
    for m in conversation():
        assert f"  {m.id}  {m.role.value}" in out


def test_show_ids_of_imported_messages_are_their_stamped_ids(zerda: Zerda) -> None:
    zerda("import", str(EXAMPLE), "--session", "demo").ok()
    stored = zerda.history("demo")
    out = zerda("show", "demo").ok().out
    shown = [line.split()[0] for line in out.splitlines() if line.startswith("  ")]
    assert shown == [m.id[-8:] for m in stored if m.id]
    assert len(set(shown)) == len(stored) == 20
    assert all(len(m.id or "") == 36 for m in stored)


def test_show_json_has_every_whole_id(zerda: Zerda) -> None:
    shown = zerda("show", "chat", "--json").ok().json
    rows = [*shown["system"], *(r for t in shown["turns"] for r in t["messages"])]
    assert [r["message"]["id"] for r in rows] == ids_of(conversation())


def test_a_message_without_an_id_shows_a_dash(zerda: Zerda) -> None:
    with zerda.store() as store:
        store.append("old", [Message(Role.USER, "From before ids.", created_at=1.7e9)])
    out = zerda("show", "old").ok().out
    assert re.search(r"^  -  user\s+\d+  From before ids\.$", out, re.M)


# -- rm --message ------------------------------------------------------------------------------


def test_rm_message_deletes_it_and_leaves_the_rest(zerda: Zerda) -> None:
    run = zerda("rm", "chat", "--message", R2).ok()
    assert ids_of(zerda.history()) == [SYSTEM, Q1, CALL, RESULT, R1, Q2]
    assert run.out == (
        "Deleted 1 message from session chat:\n"
        "  00000006  assistant  One latte.\n"
        "Session chat now holds 6 messages in 2 turns.\n"
    )


def test_rm_message_of_a_call_deletes_its_results(zerda: Zerda) -> None:
    run = zerda("rm", "chat", "--message", CALL).ok()
    assert ids_of(zerda.history()) == [SYSTEM, Q1, R1, Q2, R2]
    assert run.out.splitlines() == [
        "Deleted 2 messages from session chat (1 tool result of a deleted call went with it):",
        '  00000002  assistant  -> refund({"order": 77})',
        "  00000003  tool       [c1] error: no order 77",
        "Session chat now holds 5 messages in 2 turns.",
    ]


def test_rm_message_of_a_result_deletes_only_it(zerda: Zerda) -> None:
    zerda("rm", "chat", "--message", RESULT).ok()
    assert ids_of(zerda.history()) == [SYSTEM, Q1, CALL, R1, Q2, R2]


def test_rm_message_json(zerda: Zerda) -> None:
    # Q2 is named twice, whole and by its end: deleted once, named once.
    shown = zerda(
        "rm", "chat", "--message", CALL, "--message", Q2, "--message", "00000005", "--json"
    )
    assert shown.ok().json == {
        "session_id": "chat",
        "deleted": 3,
        "named": [CALL, Q2],
        "tool_results": 1,
        "messages": [m.to_dict() for m in conversation() if m.id in (CALL, RESULT, Q2)],
        "summary_dropped": False,
        "session_messages": 4,
        "session_turns": 1,  # the answer of the deleted question joins the turn before
    }
    assert ids_of(zerda.history()) == [SYSTEM, Q1, R1, R2]


def test_rm_message_takes_the_end_of_an_id_as_show_prints_it(zerda: Zerda) -> None:
    zerda("rm", "chat", "--message", "00000004", "--message", "d-06b100000006").ok()
    assert ids_of(zerda.history()) == [SYSTEM, Q1, CALL, RESULT, Q2]


def test_rm_message_refuses_every_id_if_one_is_unknown(zerda: Zerda) -> None:
    error = zerda("rm", "chat", "--message", R1, "--message", "nope", "--message", "0000000x")
    line = error.failed("session 'chat' holds no messages 'nope', '0000000x'", "nothing deleted")
    assert R1[-8:] not in line
    assert "'zerda show chat --ids'" in line
    assert ids_of(zerda.history()) == ids_of(conversation()), "nothing deleted"


def test_rm_message_refuses_an_end_too_short_or_shared(zerda: Zerda) -> None:
    with zerda.store() as store:
        store.append("twins", [Message(Role.USER, "a", id="aaaa-12345678")])
        store.append("twins", [Message(Role.ASSISTANT, "b", id="bbbb-12345678")])
        store.append("twins", [Message(Role.ASSISTANT, "c", id="x1")])
    zerda("rm", "twins", "--message", "12345678").failed(
        "more than one id of session 'twins' ends with '12345678'", "nothing deleted"
    )
    # Fewer than 8 characters name a message only as its whole id.
    zerda("rm", "chat", "--message", "0000006").failed("holds no message '0000006'")
    assert len(zerda.history("twins")) == 3
    assert ids_of(zerda.history()) == ids_of(conversation())
    zerda("rm", "twins", "--message", "x1").ok()  # a short whole id
    zerda("rm", "twins", "--message", "a-12345678").ok()  # an end only one id has
    assert ids_of(zerda.history("twins")) == ["bbbb-12345678"]


def test_rm_message_of_an_unknown_session_or_file(zerda: Zerda) -> None:
    zerda("rm", "nobody", "--message", Q1).failed("no session 'nobody'")
    missing = zerda.tmp / "missing.sqlite3"
    zerda("rm", "chat", "--message", Q1, db=missing).failed(
        "no session 'chat'", "the file does not exist yet"
    )
    assert not missing.exists(), "a failed edit creates no file"


def test_rm_without_message_still_removes_the_session(zerda: Zerda) -> None:
    run = zerda("rm", "chat").ok()
    assert run.out == "Removed session chat: 7 messages in 2 turns, and its metadata.\n"
    assert zerda.sessions() == []


def test_rm_message_leaves_the_metadata_of_a_session_without_summary(zerda: Zerda) -> None:
    with zerda.store() as store:
        store.update_metadata("chat", {"user": "ada"})
    zerda("rm", "chat", "--message", Q2).ok()
    assert zerda.metadata() == {"user": "ada"}, "no summary record written"


def summarized(zerda: Zerda) -> tuple[str, str]:
    """A session whose summary holds a card number: the card message's id and a later one's."""
    with zerda.store() as store:
        memory = ConversationSummaryBufferMemory(
            60, token_counter=ApproxCounter(), store=store, session_id="card"
        )
        memory.save_context({"input": "My card is 4111-1111."}, {"output": "Noted."})
        for i in range(6):
            memory.save_context({"input": f"Question {i}?"}, {"output": f"Answer {i}."})
        assert memory.get_memory_stats()["turns_summarized"] > 0
        history = memory.get_history()
    assert "card is 4111" in json.dumps(zerda.metadata("card"))
    first, last = history[0].id, history[-1].id
    assert first is not None
    assert last is not None
    return first, last


def test_rm_message_drops_a_summary_that_covered_it(zerda: Zerda) -> None:
    card, _ = summarized(zerda)
    run = zerda("rm", "card", "--message", card).ok()
    assert "Its summary covered what changed: it is dropped" in run.out
    assert "card is 4111" not in json.dumps(zerda.metadata("card"))
    assert card not in ids_of(zerda.history("card"))


def test_rm_message_json_says_the_summary_was_dropped(zerda: Zerda) -> None:
    card, _ = summarized(zerda)
    shown = zerda("rm", "card", "--message", card, "--json").ok().json
    assert shown["summary_dropped"] is True
    assert "card is 4111" not in json.dumps(zerda.metadata("card"))


def test_rm_message_keeps_a_summary_that_did_not_cover_it(zerda: Zerda) -> None:
    _, last = summarized(zerda)
    shown = zerda("rm", "card", "--message", last, "--json").ok().json
    assert shown["summary_dropped"] is False
    assert "card is 4111" in json.dumps(zerda.metadata("card"))


# -- pop ---------------------------------------------------------------------------------------


def test_pop_removes_the_newest_turn(zerda: Zerda) -> None:
    run = zerda("pop", "chat").ok()
    assert run.out == (
        "Popped turn 2 from session chat: 2 messages.\n"
        "  00000005  user       A latte, please.\n"
        "  00000006  assistant  One latte.\n"
        "Session chat now holds 5 messages in 1 turn.\n"
    )
    assert ids_of(zerda.history()) == [SYSTEM, Q1, CALL, RESULT, R1]


def test_pop_json(zerda: Zerda) -> None:
    zerda("pop", "chat").ok()
    shown = zerda("pop", "chat", "--json").ok().json
    assert shown == {
        "session_id": "chat",
        "turn": 1,
        "messages": [m.to_dict() for m in conversation()[1:5]],
        "summary_dropped": False,
        "session_messages": 1,
        "session_turns": 0,
    }
    assert ids_of(zerda.history()) == [SYSTEM], "the system message belongs to no turn"


def test_pop_with_no_turn_left_is_an_error(zerda: Zerda) -> None:
    zerda("pop", "chat").ok()
    zerda("pop", "chat").ok()
    zerda("pop", "chat").failed(
        "nothing to pop: session 'chat' holds no turn, only 1 system or developer message"
    )
    assert ids_of(zerda.history()) == [SYSTEM]
    with zerda.store() as store:
        store.update_metadata("bare", {"user": "ada"})
    zerda("pop", "bare").failed("session 'bare' holds no turn, only metadata")


def test_pop_of_an_unknown_session_or_file(zerda: Zerda) -> None:
    zerda("pop", "nobody").failed("no session 'nobody'")
    missing = zerda.tmp / "missing.sqlite3"
    zerda("pop", "chat", db=missing).failed("no session 'chat'")
    assert not missing.exists()


# -- edit --------------------------------------------------------------------------------------


def test_edit_replaces_the_content(zerda: Zerda) -> None:
    run = zerda("edit", "chat", Q2, "--content", "A flat white, please.").ok()
    assert run.out == (
        "Edited message 00000005 of session chat:\n  00000005  user       A flat white, please.\n"
    )
    edited = zerda.history()[5]
    assert (edited.id, edited.role, edited.text) == (Q2, Role.USER, "A flat white, please.")
    assert "edited_at" in edited.metadata
    assert [m.text for m in zerda.history()] == [m.text for m in conversation()[:5]] + [
        "A flat white, please.",
        "One latte.",
    ]


def test_edit_json_by_the_end_of_the_id(zerda: Zerda) -> None:
    shown = zerda("edit", "chat", "00000006", "--content", "Two lattes.", "--json").ok().json
    assert shown["session_id"] == "chat"
    assert shown["summary_dropped"] is False
    message = shown["message"]
    assert (message["id"], message["role"], message["content"]) == (R2, "assistant", "Two lattes.")
    assert message["metadata"]["edited_at"] > 0
    assert Message.from_dict(message) == zerda.history()[6]


def test_edit_reads_standard_input(zerda: Zerda, monkeypatch: pytest.MonkeyPatch) -> None:
    stdin(monkeypatch, "Un café crème,\ns'il vous plaît.\n".encode())
    zerda("edit", "chat", Q1, "--content", "-").ok()
    assert zerda.history()[1].text == "Un café crème,\ns'il vous plaît."  # one newline less


def test_edit_refuses_standard_input_that_is_not_utf8(
    zerda: Zerda, monkeypatch: pytest.MonkeyPatch
) -> None:
    stdin(monkeypatch, b"caf\xe9")
    zerda("edit", "chat", Q1, "--content", "-").failed("standard input is not UTF-8 text")
    assert zerda.history()[1].text == "Refund order 7."


def test_edit_of_an_unknown_message_session_or_file(zerda: Zerda) -> None:
    zerda("edit", "chat", "nope", "--content", "x").failed(
        "session 'chat' holds no message 'nope'", "nothing changed"
    )
    assert zerda.history() == conversation()
    zerda("edit", "nobody", Q1, "--content", "x").failed("no session 'nobody'")
    missing = zerda.tmp / "missing.sqlite3"
    zerda("edit", "chat", Q1, "--content", "x", db=missing).failed("no session 'chat'")
    assert not missing.exists()


def test_edit_drops_a_summary_that_covered_it(zerda: Zerda) -> None:
    card, _ = summarized(zerda)
    run = zerda("edit", "card", card, "--content", "My card is on file.").ok()
    assert "The session's summary covered it: it is dropped" in run.out
    assert "card is 4111" not in json.dumps(zerda.metadata("card"))
    assert "card is 4111" not in json.dumps([m.to_dict() for m in zerda.history("card")])


def test_edit_content_is_required(zerda: Zerda) -> None:
    run = zerda("edit", "chat", Q1)
    assert run.code == 2
    assert "--content" in run.err


# -- fork --------------------------------------------------------------------------------------


def test_fork_copies_the_whole_session(zerda: Zerda) -> None:
    with zerda.store() as store:
        store.update_metadata("chat", {"user": "ada"})
    run = zerda("fork", "chat", "copy").ok()
    assert run.out == "Forked session chat into copy: copy holds 7 messages in 2 turns.\n"
    assert zerda.history("copy") == zerda.history("chat") == conversation()
    assert zerda.metadata("copy") == {"user": "ada"}


def test_fork_at_a_message(zerda: Zerda) -> None:
    run = zerda("fork", "chat", "branch", "--at", "00000005").ok()
    assert run.out == (
        "Forked session chat into branch, up to and including message 00000005: "
        "branch holds 6 messages in 2 turns.\n"
    )
    assert ids_of(zerda.history("branch")) == [SYSTEM, Q1, CALL, RESULT, R1, Q2]
    assert zerda.history("chat") == conversation(), "the source is unchanged"


def test_fork_json(zerda: Zerda) -> None:
    shown = zerda("fork", "chat", "branch", "--at", R1, "--json").ok().json
    assert shown == {
        "session_id": "chat",
        "new_session_id": "branch",
        "at": R1,
        "messages": 5,
        "turns": 1,
    }
    assert zerda("fork", "chat", "all", "--json").ok().json["at"] is None


def test_fork_into_a_session_that_exists_is_an_error(zerda: Zerda) -> None:
    with zerda.store() as store:
        store.append("taken", [Message(Role.USER, "Mine.", id="t1")])
    zerda("fork", "chat", "taken").failed("cannot fork into 'taken'", "already holds")
    assert ids_of(zerda.history("taken")) == ["t1"]
    zerda("fork", "chat", "chat").failed("cannot fork into 'chat'")
    assert zerda.history() == conversation()


def test_fork_at_an_unknown_message_is_an_error(zerda: Zerda) -> None:
    zerda("fork", "chat", "branch", "--at", "nope").failed(
        "session 'chat' holds no message 'nope'", "nothing forked"
    )
    assert "branch" not in zerda.sessions()


def test_fork_of_an_unknown_session_or_file(zerda: Zerda) -> None:
    zerda("fork", "nobody", "branch").failed("no session 'nobody'")
    assert zerda.sessions() == ["chat"]
    missing = zerda.tmp / "missing.sqlite3"
    zerda("fork", "chat", "branch", db=missing).failed("no session 'chat'")
    assert not missing.exists()


def test_fork_needs_a_valid_new_session_id(zerda: Zerda) -> None:
    run = zerda("fork", "chat", "no spaces")
    assert run.code == 2
    assert "zerda: error: argument NEW" in run.err


def test_fork_of_a_summarized_session_at_an_early_message_drops_the_summary(
    zerda: Zerda,
) -> None:
    card, _ = summarized(zerda)
    zerda("fork", "card", "early", "--at", card).ok()
    assert "card is 4111" not in json.dumps(zerda.metadata("early"))
    zerda("fork", "card", "whole").ok()
    assert "card is 4111" in json.dumps(zerda.metadata("whole")), "a whole fork keeps the summary"


def test_help_lists_the_editing_commands(zerda: Zerda) -> None:
    run = zerda("--help")
    assert run.code == 0
    for name in ("pop", "edit", "fork"):
        assert re.search(rf"^    {name}\s", run.out, re.M), name
    assert "--message" in zerda("rm", "--help").out
