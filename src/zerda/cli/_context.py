"""Rows of messages with their tokens, and a context as ``zerda show --context`` and ``zerda
chat``'s ``/context`` print it: both render one ``memory.inspect()`` and count nothing."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TextIO

from zerda.cli._render import brief, clip, local_time, plural, short_id, terminal_width
from zerda.memory import BaseMemory, Inspection, MessageAccount, TurnAccount
from zerda.messages import Message
from zerda.tokens import TokenCounter

__all__ = [
    "Layout",
    "Row",
    "TurnRows",
    "context_json",
    "context_turns",
    "inspect_context",
    "print_context",
    "print_messages",
    "print_pinned",
    "print_rows",
    "print_turn",
    "shown_id",
    "system_rows",
]


@dataclass(slots=True)
class Row:
    """A message and its tokens; ``notes``: what the context did to it, in words."""

    message: Message
    tokens: int
    notes: tuple[str, ...] = ()

    def as_json(self) -> dict[str, Any]:
        row: dict[str, Any] = {"tokens": self.tokens, "message": self.message.to_dict()}
        if self.notes:
            row["repairs"] = list(self.notes)
        return row


@dataclass(slots=True)
class TurnRows:
    number: int
    rows: list[Row]
    partial: bool = False  # the newest turn, its longest texts cut to fit a token budget
    not_sent: tuple[Row, ...] = ()  # messages of the turn the context leaves out

    @property
    def tokens(self) -> int:
        return sum(r.tokens for r in self.rows)

    @property
    def started_at(self) -> float | None:
        return self.rows[0].message.created_at if self.rows else None

    def as_json(self) -> dict[str, Any]:
        out = {
            "turn": self.number,
            "started_at": self.started_at,
            "tokens": self.tokens,
            "partial": self.partial,
            "messages": [r.as_json() for r in self.rows],
        }
        if self.not_sent:
            out["not_sent"] = [r.as_json() for r in self.not_sent]
        return out


def shown_id(message: Message, whole: bool) -> str:
    return (message.id or "-") if whole else short_id(message.id)


def print_rows(
    out: TextIO, rows: Sequence[Row], token_width: int, width: int, id_width: int, whole: bool
) -> None:
    """One line a message: id, role, tokens, the text cut to the terminal; a line for each
    thing the context did to it."""
    # Cut long texts to the terminal, but always leave some of the text to read.
    width = max(width, 2 + id_width + 2 + 9 + 2 + token_width + 2 + 20)
    for r in rows:
        shown = shown_id(r.message, whole)
        line = (
            f"  {shown:<{id_width}}  {r.message.role.value:<9}  {r.tokens:>{token_width}}  "
            f"{brief(r.message)}"
        )
        print(clip(line, width), file=out)
        for note in r.notes:
            print(clip(f"  {'':<{id_width}}  ↳ {note}", width), file=out)


@dataclass(frozen=True, slots=True)
class Layout:
    """Where the columns of a table of rows go: the widths of the tokens and ids that will
    be shown, the terminal's, and whether ids are shown whole."""

    token_width: int
    id_width: int
    width: int
    whole_ids: bool

    @classmethod
    def of(cls, rows: Sequence[Row], whole_ids: bool) -> Layout:
        return cls(
            max((len(str(r.tokens)) for r in rows), default=1),
            max((len(shown_id(r.message, whole_ids)) for r in rows), default=1),
            terminal_width(),
            whole_ids,
        )

    def rows(self, out: TextIO, rows: Sequence[Row]) -> None:
        print_rows(out, rows, self.token_width, self.width, self.id_width, self.whole_ids)


def print_pinned(out: TextIO, rows: Sequence[Row], tokens: int, layout: Layout) -> None:
    """The pinned messages' block: a heading with their roles and tokens, a row each."""
    if not rows:
        return
    print(file=out)
    roles = sorted({r.message.role.value for r in rows}, reverse=True)
    which = " and ".join(roles).capitalize()  # System, Developer, System and developer
    print(f"{which} messages (pinned, sent first): {plural(tokens, 'token')}", file=out)
    layout.rows(out, rows)


def print_turn(out: TextIO, turn: TurnRows, total: int, layout: Layout) -> None:
    """A turn's block: its number, time, messages and tokens, then a row each (and the
    messages of it the context does not send)."""
    print(file=out)
    when = f", {local_time(turn.started_at)}" if turn.started_at is not None else ""
    cut = ", its longest texts cut to fit" if turn.partial else ""
    print(
        f"Turn {turn.number} of {total}{when}: "
        f"{plural(len(turn.rows), 'message')}, {plural(turn.tokens, 'token')}{cut}",
        file=out,
    )
    layout.rows(out, turn.rows)
    if turn.not_sent:
        print(f"  not sent, of this turn ({len(turn.not_sent)}):", file=out)
        layout.rows(out, turn.not_sent)


def print_messages(out: TextIO, messages: Sequence[Message]) -> None:
    """Messages as ``zerda show`` prints them (short ids), without token counts."""
    id_width = max((len(short_id(m.id)) for m in messages), default=1)
    width = max(terminal_width(), 2 + id_width + 2 + 9 + 2 + 20)
    for m in messages:
        line = f"  {short_id(m.id):<{id_width}}  {m.role.value:<9}  {brief(m)}"
        print(clip(line, width), file=out)


# -- a context ----------------------------------------------------------------------------------


def inspect_context(memory: BaseMemory[Any], counter: TokenCounter) -> Inspection:
    """The inspection of ``memory``'s context, with the turns it holds (and no more)."""
    return memory.inspect(turns=0, token_counter=counter)


def _rows(accounts: Sequence[MessageAccount], *, sent: bool) -> list[Row]:
    rows = []
    for a in accounts:
        message = a.sent if sent and a.sent is not None else a.message
        rows.append(
            Row(
                message, a.sent_tokens if sent else a.tokens, tuple(r.describe() for r in a.repairs)
            )
        )
    return rows


def _turn_rows(turn: TurnAccount) -> TurnRows:
    return TurnRows(
        turn.number,
        _rows(turn.sent, sent=True),
        partial=any(r.kind == "truncated" for a in turn.sent for r in a.repairs),
        not_sent=tuple(_rows([a for a in turn.messages if not a.in_context], sent=False)),
    )


def context_json(inspection: Inspection, settings: Mapping[str, Any]) -> dict[str, Any]:
    """The ``context`` object of ``zerda show --context --json``: ``settings`` (what the
    options made of the memory), then what the inspection says."""
    stats: Mapping[str, Any] = inspection.stats
    tokens = inspection.tokens
    fates = inspection.fates()
    return {
        **settings,
        "turns_in_context": fates["context"],
        "turns_summarized": fates["summary"],
        "turns_pending": fates["pending"],
        "turns_evicted": fates["evicted"],
        "truncated": bool(stats.get("truncated", False)),
        "truncated_tokens": int(stats.get("truncated_tokens", 0)),
        "repairs": {k: n for k, n in stats["repairs"].items() if n},
        "tokens": tokens.total,
        "tokens_by_part": {
            "system": tokens.system,
            "summary": tokens.summary,
            "tools": tokens.tools,
            "turns": tokens.turns,
            "reply_priming": tokens.reply_priming,
        },
        "messages": [m.to_openai() for m in inspection.context],
    }


def context_turns(inspection: Inspection) -> list[TurnRows]:
    """The turns the context holds, as rows of what it sends."""
    return [_turn_rows(t) for t in inspection.turns if t.fate == "context"]


def system_rows(inspection: Inspection) -> list[Row]:
    return _rows(inspection.system, sent=False)


def print_context(
    out: TextIO,
    session_id: str,
    inspection: Inspection,
    settings: Mapping[str, Any],
    *,
    whole_ids: bool,
) -> None:
    """What the model sees, turn by turn, then where every stored turn went and the tokens."""
    limit = f"--k {settings['k']}" if "k" in settings else _budget_text(settings)
    print(
        f"Session {session_id}: what the model sees with {limit} (tokens by {inspection.counter})",
        file=out,
    )
    system = system_rows(inspection)
    turns = context_turns(inspection)
    layout = Layout.of([*system, *(r for t in turns for r in (*t.rows, *t.not_sent))], whole_ids)
    total = int(inspection.stats["stored_turns"])
    print_pinned(out, system, inspection.tokens.system, layout)
    if inspection.summary is not None:
        covered = inspection.fates()["summary"]
        print(file=out)
        print(
            f"Summary of turns 1 to {covered}, sent after the pinned messages: "
            f"{plural(inspection.tokens.summary, 'token')}",
            file=out,
        )
        print(clip(f"  {brief(inspection.summary)}", max(layout.width, 40)), file=out)
    for turn in turns:
        print_turn(out, turn, total, layout)
    if not system and not turns and inspection.summary is None:
        print("\nNo messages.", file=out)
    _print_footer(out, inspection, settings)


def _budget_text(settings: Mapping[str, Any]) -> str:
    text = f"--token-limit {settings['max_token_limit']}"
    if settings.get("reserve_tokens"):
        text += f" --reserve {settings['reserve_tokens']}"
    return text


def _print_footer(out: TextIO, inspection: Inspection, settings: Mapping[str, Any]) -> None:
    stats: Mapping[str, Any] = inspection.stats
    fates = inspection.fates()
    tokens = inspection.tokens
    cut = (
        f" (the newest, {stats['truncated_tokens']:,} tokens cut from its longest texts: "
        "alone it is over the budget)"
        if stats.get("truncated")
        else ""
    )
    where = [f"{fates['evicted']} evicted"]
    if fates["summary"]:
        where.insert(0, f"{fates['summary']} summarized")
    if fates["pending"]:
        where.insert(1 if fates["summary"] else 0, f"{fates['pending']} pending their fold")
    print(file=out)
    print(
        f"In context: {fates['context']} of {plural(sum(fates.values()), 'turn')}{cut}, "
        f"{', '.join(where)}",
        file=out,
    )
    of = str(tokens.total)
    if tokens.budget is not None:
        of += f" / {tokens.budget} ({100 * tokens.total / tokens.budget:.0f}%)"
    parts = [f"system {tokens.system}"]
    if tokens.summary:
        parts.append(f"summary {tokens.summary}")
    if tokens.tools:
        parts.append(f"tools {tokens.tools}")
    parts += [f"turns {tokens.turns}", f"reply priming {tokens.reply_priming}"]
    print(f"Context tokens: {of} = {' + '.join(parts)}", file=out)
    if settings.get("reserve_tokens"):
        print(
            f"Budget: {settings['budget']} = --token-limit {settings['max_token_limit']} - "
            f"--reserve {settings['reserve_tokens']}",
            file=out,
        )
    repairs = {k: n for k, n in stats["repairs"].items() if n}
    if repairs:
        done = ", ".join(f"{k.replace('_', ' ')} {n}" for k, n in repairs.items())
        print(f"Repaired for the model (the log is unchanged): {done}", file=out)
