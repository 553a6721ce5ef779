"""``zerda replay``: a conversation log played turn by turn through a memory, in memory only."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from zerda.cli._jsonl import FORM_NAMES, Parsed
from zerda.cli._parser import PLOT_HINT
from zerda.cli._render import plural, table, terminal_width
from zerda.errors import ContextOverflowError, ZerdaError
from zerda.memory import (
    BaseMemory,
    ConversationBufferWindowMemory,
    ConversationSummaryBufferMemory,
    ConversationTokenBufferMemory,
)
from zerda.messages import PINNED, Message, Role
from zerda.stores import InMemoryStore
from zerda.tokens import TokenCounter

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "Conversation",
    "Progress",
    "Run",
    "Setting",
    "Summary",
    "TurnBatch",
    "TurnRow",
    "check_plot",
    "conversations",
    "draw",
    "full_history",
    "replay",
    "run_command",
    "summarize",
]

MemoryKind = Literal["window", "token", "summary-buffer"]

MEMORY_CLASSES: dict[MemoryKind, str] = {
    "window": "ConversationBufferWindowMemory",
    "token": "ConversationTokenBufferMemory",
    "summary-buffer": "ConversationSummaryBufferMemory",
}

# The progress bar waits this long before it shows, so short replays never flicker.
PROGRESS_DELAY = 0.5
PROGRESS_INTERVAL = 0.1


# -- what is replayed ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Setting:
    """One memory configuration to replay through: a window of ``k`` turns or a token budget."""

    memory: MemoryKind
    k: int | None = None
    token_limit: int | None = None
    reserve: int = 0

    @property
    def label(self) -> str:
        """The options that give this setting: ``--k 5``, ``--token-limit 2000 --reserve 500``."""
        if self.memory == "window":
            return f"--k {self.k}"
        text = f"--token-limit {self.token_limit}"
        return f"{text} --reserve {self.reserve}" if self.reserve else text

    @property
    def budget(self) -> int | None:
        """The tokens the context may use, for the token memories."""
        return None if self.token_limit is None else self.token_limit - self.reserve

    def as_json(self) -> dict[str, Any]:
        return {
            "memory": self.memory,
            "class": MEMORY_CLASSES[self.memory],
            "k": self.k,
            "token_limit": self.token_limit,
            "reserve": self.reserve,
            "budget": self.budget,
            "label": self.label,
        }

    def memory_for(self, counter: TokenCounter) -> BaseMemory:
        """A fresh memory over its own in-memory store: nothing is written anywhere."""
        store = InMemoryStore()
        if self.memory == "window":
            assert self.k is not None
            return ConversationBufferWindowMemory(k=self.k, store=store, session_id="replay")
        assert self.token_limit is not None
        kind = (
            ConversationTokenBufferMemory
            if self.memory == "token"
            else ConversationSummaryBufferMemory  # with its offline ExtractiveSummarizer
        )
        return kind(
            max_token_limit=self.token_limit,
            reserve_tokens=self.reserve,
            token_counter=counter,
            store=store,
            session_id="replay",
        )


@dataclass(frozen=True, slots=True)
class TurnBatch:
    """One turn as it is added: its messages, and where it is in the file."""

    conversation: int  # from 1, in file order
    number: int  # from 1 within its conversation
    line: int  # the line of the file it starts on
    messages: tuple[Message, ...]


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation cut for replay: the pinned (system and developer) messages before its
    first turn, then turns."""

    number: int
    pinned: tuple[Message, ...]
    turns: tuple[TurnBatch, ...]


def conversations(parsed: Parsed) -> list[Conversation]:
    """The file's conversations (one for a file of one message a line), cut into turns.

    A turn opens at each user message (or at the first message that is not pinned, such as an
    assistant's greeting) and holds everything up to the next one, as ``zerda.group_turns``
    groups them; system and developer messages stay where they are in the batch that adds them
    (memories pin them), and those before the first turn are added first, on their own.
    """
    found = []
    for number, (start, end) in enumerate(parsed.spans(), 1):
        pinned: list[Message] = []
        cuts: list[int] = []
        for i in range(start, end):
            role = parsed.messages[i].role
            if role is Role.USER or (not cuts and role not in PINNED):
                cuts.append(i)
            elif not cuts:
                pinned.append(parsed.messages[i])
        ends = [*cuts[1:], end] if cuts else []
        turns = tuple(
            TurnBatch(number, n, parsed.lines[lo], tuple(parsed.messages[lo:hi]))
            for n, (lo, hi) in enumerate(zip(cuts, ends, strict=True), 1)
        )
        found.append(Conversation(number, tuple(pinned), turns))
    return found


# -- the replay: pure over the messages, no I/O ------------------------------------------------


@dataclass(frozen=True, slots=True)
class TurnRow:
    """What the memory would send after one more turn, and what the full history would cost."""

    conversation: int
    turn: int
    line: int
    messages_added: int
    context_messages: int
    context_tokens: int
    full_history_tokens: int  # counter.count_messages(every message of the conversation so far)
    turns_in_context: int
    turns_evicted: int
    truncated: bool
    turns_summarized: int  # summary-buffer only; 0 otherwise
    summary_tokens: int  # summary-buffer only; 0 otherwise


class ReplayOverflowError(ZerdaError):
    """No context fits the budget after ``turn``: the replay stops there."""

    def __init__(self, message: str, turn: TurnBatch) -> None:
        super().__init__(message)
        self.turn = turn


def full_history(conversations: Sequence[Conversation], counter: TokenCounter) -> list[int]:
    """Per turn, in order, the tokens of the whole conversation so far by ``counter``: what
    sending the full history would cost. It does not depend on the memory, so a replay of
    several settings counts it once."""
    priming = counter.count_messages([])
    out: list[int] = []
    for conversation in conversations:
        # The counters are additive: the whole prompt is its messages plus the priming.
        full = priming + sum(map(counter.count_message, conversation.pinned))
        for turn in conversation.turns:
            full += sum(map(counter.count_message, turn.messages))
            out.append(full)
    return out


def replay(
    conversations: Sequence[Conversation],
    setting: Setting,
    counter: TokenCounter,
    full: Sequence[int] | None = None,
) -> Iterator[TurnRow]:
    """Replay each conversation as its own session, one turn at a time: a row per turn.

    After each turn: ``get_context()`` and ``get_memory_stats()`` of the memory, and the
    tokens the whole conversation so far would cost (``full``, from :func:`full_history`,
    computed here when not given).
    """
    fulls = iter(full_history(conversations, counter) if full is None else full)
    for conversation in conversations:
        memory = setting.memory_for(counter)
        if conversation.pinned:
            memory.add_messages(conversation.pinned)
        for turn in conversation.turns:
            memory.add_messages(turn.messages)
            try:
                context = memory.get_context()
            except ContextOverflowError as exc:
                raise ReplayOverflowError(
                    f"{_where(turn, len(conversations))}: {exc}; try a larger --token-limit",
                    turn,
                ) from exc
            stats = memory.get_memory_stats()
            if setting.memory == "window":
                tokens = counter.count_messages(context)
                in_context = stats["message_count"]
                evicted = stats["stored_turns"] - in_context
            else:
                tokens = stats["context_tokens"]
                in_context = stats["turns_in_context"]
                evicted = stats["turns_evicted"]
            yield TurnRow(
                conversation=conversation.number,
                turn=turn.number,
                line=turn.line,
                messages_added=len(turn.messages),
                context_messages=len(context),
                context_tokens=tokens,
                full_history_tokens=next(fulls),
                turns_in_context=in_context,
                turns_evicted=evicted,
                truncated=bool(stats.get("truncated", False)),
                turns_summarized=stats.get("turns_summarized", 0),
                summary_tokens=stats.get("summary_tokens", 0),
            )


def _where(turn: TurnBatch, conversations: int) -> str:
    if conversations == 1:
        return f"turn {turn.number}"
    return f"turn {turn.number} of conversation {turn.conversation}"


@dataclass(frozen=True, slots=True)
class Summary:
    """Totals over a replay's turns. ``saved`` is against sending the full history every turn."""

    turns: int
    mean_context_tokens: float
    max_context_tokens: int
    tokens_sent: int
    full_history_tokens_sent: int
    tokens_saved: int
    saved_percent: float
    truncated_turns: int


def summarize(rows: Sequence[TurnRow]) -> Summary:
    tokens = [r.context_tokens for r in rows]
    sent = sum(tokens)
    full = sum(r.full_history_tokens for r in rows)
    return Summary(
        turns=len(rows),
        mean_context_tokens=statistics.fmean(tokens) if tokens else 0.0,
        max_context_tokens=max(tokens, default=0),
        tokens_sent=sent,
        full_history_tokens_sent=full,
        tokens_saved=full - sent,
        saved_percent=100 * (full - sent) / full if full else 0.0,
        truncated_turns=sum(r.truncated for r in rows),
    )


def _full_history_summary(rows: Sequence[TurnRow]) -> dict[str, Any]:
    tokens = [r.full_history_tokens for r in rows]
    return {
        "mean_context_tokens": statistics.fmean(tokens) if tokens else 0.0,
        "max_context_tokens": max(tokens, default=0),
        "tokens_sent": sum(tokens),
    }


@dataclass(slots=True)
class Run:
    """One setting replayed: its rows and their summary."""

    setting: Setting
    rows: list[TurnRow]

    @property
    def summary(self) -> Summary:
        return summarize(self.rows)

    def as_json(self) -> dict[str, Any]:
        return {
            "setting": self.setting.as_json(),
            "summary": asdict(self.summary),
            "turns": [asdict(r) for r in self.rows],
        }


# -- progress --------------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on ``stream``, drawn only when it is a terminal.

    It shows only once a replay has run for ``delay`` seconds, and is erased when done.
    """

    def __init__(self, stream: TextIO, total: int, delay: float | None = None) -> None:
        isatty = getattr(stream, "isatty", None)
        self.stream = stream
        self.enabled = bool(callable(isatty) and isatty()) and total > 0
        self.total = total
        self.done = 0
        self.start = time.monotonic()
        self.delay = PROGRESS_DELAY if delay is None else delay
        self.drawn_at: float | None = None
        self.width = 0

    def advance(self, label: str) -> None:
        self.done += 1
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.start < self.delay:
            return
        recent = self.drawn_at is not None and now - self.drawn_at < PROGRESS_INTERVAL
        if recent and self.done < self.total:
            return
        self.drawn_at = now
        share = self.done / self.total
        bar = "#" * int(share * 30)
        text = (
            f"replaying {label}: [{bar:<30}] {self.done:,}/{self.total:,} turns "
            f"({100 * share:.0f}%)"
        )
        text = text[: terminal_width() - 1]  # a wrapped line could not be redrawn in place
        self.stream.write("\r" + text.ljust(self.width))
        self.stream.flush()
        self.width = len(text)

    def close(self) -> None:
        if self.drawn_at is not None:
            self.stream.write("\r" + " " * self.width + "\r")
            self.stream.flush()
            self.drawn_at = None


# -- the plot --------------------------------------------------------------------------------


def check_plot(path: str) -> None:
    """Fail before a long replay if the plot cannot be written: no matplotlib, a format it does
    not know, a folder that does not exist."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError as exc:
        raise ZerdaError(f"--plot needs matplotlib: {PLOT_HINT}") from exc
    suffix = Path(path).suffix.lower().lstrip(".")
    formats = FigureCanvasAgg.get_supported_filetypes()
    if suffix not in formats:
        raise ZerdaError(
            f"--plot {path}: name the file with one of the extensions matplotlib writes: "
            f"{', '.join('.' + f for f in sorted(formats))}"
        )
    folder = Path(path).parent
    if not folder.is_dir():
        raise ZerdaError(f"--plot {path}: the folder {folder} does not exist")


def draw(runs: Sequence[Run], counter_name: str, title: str) -> Figure:
    """Context tokens per turn, a line per setting, and the full history for reference; a
    dotted line at each token budget."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(10, 5.5), layout="constrained")
    axes = figure.add_subplot()
    rows = runs[0].rows if runs else []
    turns = list(range(1, len(rows) + 1))
    marker = "o" if len(turns) <= 40 else None
    axes.plot(
        turns,
        [r.full_history_tokens for r in rows],
        color="0.55",
        linestyle="--",
        marker=marker,
        markersize=3,
        label="full history",
    )
    for run in runs:
        (line,) = axes.plot(
            turns,
            [r.context_tokens for r in run.rows],
            marker=marker,
            markersize=3,
            label=run.setting.label,
        )
        if run.setting.budget is not None:
            axes.axhline(run.setting.budget, color=line.get_color(), linestyle=":", linewidth=1)
    conversations = len({r.conversation for r in rows})
    axes.set_xlabel(
        "turn" if conversations <= 1 else f"turn ({conversations} conversations, one after another)"
    )
    axes.set_ylabel(f"context tokens ({counter_name})")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    axes.legend()
    return figure


def _save(figure: Figure, path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(figure)
    figure.savefig(path, dpi=120)


# -- the command -----------------------------------------------------------------------------


def run_command(
    parsed: Parsed,
    name: str,
    settings: Sequence[Setting],
    counter: TokenCounter,
    *,
    out: TextIO,
    err: TextIO,
    as_json: bool,
    per_turn: bool | None,
    plot: str | None,
) -> int:
    """Replay ``parsed`` once per setting and print the rows, the summary and the plot."""
    found = conversations(parsed)
    total_turns = sum(len(c.turns) for c in found)
    if not total_turns:
        raise ZerdaError(
            f"{name} holds no turns (only system and developer messages); nothing to replay"
        )
    runs = []
    full = full_history(found, counter)
    progress = Progress(err, total_turns * len(settings))
    try:
        for setting in settings:
            rows = []
            try:
                for row in replay(found, setting, counter, full):
                    rows.append(row)
                    progress.advance(setting.label)
            except ReplayOverflowError as exc:
                raise ZerdaError(f"{name}:{exc.turn.line}: {setting.label}: {exc}") from exc
            runs.append(Run(setting, rows))
    finally:
        progress.close()
    kind = settings[0].memory
    if plot is not None:
        title = f"{Path(name).name}: {MEMORY_CLASSES[kind]}"
        _save(draw(runs, counter.name, title), plot)
    if as_json:
        result = {
            "file": name,
            "form": parsed.form,
            "conversations": len(found),
            "messages": len(parsed.messages),
            "turns": total_turns,
            "counter": counter.name,
            "memory": MEMORY_CLASSES[kind],
            "runs": [r.as_json() for r in runs],
            "full_history": _full_history_summary(runs[0].rows),
            "plot": plot,
        }
        print(json.dumps(result, indent=2, ensure_ascii=False), file=out)
        return 0
    _print_header(out, parsed, name, found, total_turns, settings, counter)
    if per_turn is None:
        per_turn = len(runs) == 1
    if per_turn:
        for run in runs:
            _print_rows(out, run, many=len(runs) > 1, conversations=len(found))
    _print_summary(out, runs, counter)
    if plot is not None:
        lines = plural(len(runs), "setting")
        print(f"\nPlot of context tokens per turn ({lines} and the full history): {plot}", file=out)
    return 0


def _print_header(
    out: TextIO,
    parsed: Parsed,
    name: str,
    found: Sequence[Conversation],
    total_turns: int,
    settings: Sequence[Setting],
    counter: TokenCounter,
) -> None:
    assert parsed.form is not None
    form = FORM_NAMES[parsed.form]
    messages = f"{plural(len(parsed.messages), 'message')} in {plural(total_turns, 'turn')}"
    if parsed.form == "conversations":
        what = f"{plural(len(found), 'conversation')} ({form}), {messages}"
        sessions = "; each conversation its own session"
    else:
        what = f"{messages} ({form})"
        sessions = ""
    print(f"Replay of {name}: {what}{sessions}", file=out)
    labels = ", ".join(s.label for s in settings)
    print(
        f"Memory: {MEMORY_CLASSES[settings[0].memory]} with {labels}, tokens by {counter.name}",
        file=out,
    )


def _print_rows(out: TextIO, run: Run, *, many: bool, conversations: int) -> None:
    summary_buffer = run.setting.memory == "summary-buffer"
    print(file=out)
    if many:
        print(f"With {run.setting.label}:", file=out)
    header: list[str] = ["conversation"] if conversations > 1 else []
    header += ["turn", "messages", "context tokens", "full history", "turns in context", "evicted"]
    if summary_buffer:
        header.append("summarized")
    header.append("truncated")
    rows: list[Sequence[object]] = [header]
    for r in run.rows:
        cells: list[object] = [r.conversation] if conversations > 1 else []
        cells += [
            r.turn,
            r.context_messages,
            r.context_tokens,
            r.full_history_tokens,
            r.turns_in_context,
            r.turns_evicted,
        ]
        if summary_buffer:
            cells.append(r.turns_summarized)
        cells.append("yes" if r.truncated else "")
        rows.append(cells)
    for line in table(rows, "r" * (len(header) - 1) + "l"):
        print(line, file=out)


def _print_summary(out: TextIO, runs: Sequence[Run], counter: TokenCounter) -> None:
    turns = len(runs[0].rows)
    print(file=out)
    print(
        f"Summary over {plural(turns, 'turn')} (tokens sent: the context tokens of every turn "
        "added up):",
        file=out,
    )
    rows: list[Sequence[object]] = [
        (
            "setting",
            "mean context",
            "max context",
            "tokens sent",
            "saved vs full history",
            "truncated turns",
        )
    ]
    for run in runs:
        s = run.summary
        rows.append(
            (
                run.setting.label,
                f"{s.mean_context_tokens:,.1f}",
                f"{s.max_context_tokens:,}",
                f"{s.tokens_sent:,}",
                f"{s.tokens_saved:,} ({s.saved_percent:.1f}%)",
                s.truncated_turns,
            )
        )
    full = _full_history_summary(runs[0].rows)
    rows.append(
        (
            "full history",
            f"{full['mean_context_tokens']:,.1f}",
            f"{full['max_context_tokens']:,}",
            f"{full['tokens_sent']:,}",
            "-",
            "-",
        )
    )
    for line in table(rows, "lrrrrr"):
        print(line, file=out)
