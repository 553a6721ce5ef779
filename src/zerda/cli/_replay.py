"""``zerda replay``: a conversation log played turn by turn through a memory, in memory only."""

from __future__ import annotations

import itertools
import json
import statistics
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO

from zerda.cli._jsonl import Parsed
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

# The plot draws at most this many points a line; past that, turns are taken in buckets.
PLOT_POINTS = 100
# A full history this many times over every setting and budget goes off the top of a plot.
OFF_THE_TOP = 4
FULL_COLOR = "0.2"
BOUNDARY_COLOR = "0.75"
# tab10 without its grey, which is the full history's.
COLORS = (
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#bcbd22",
    "#17becf",
)
# A line style and a marker per setting, never the full history's dashes.
STYLES: tuple[tuple[Any, str], ...] = (
    ("-", "o"),
    ((0, (6, 2)), "s"),
    ("-.", "^"),
    ((0, (1, 1.2)), "D"),
    ((0, (8, 2, 1, 2, 1, 2)), "v"),
    ((0, (3, 1, 3, 3)), "P"),
)


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

    def memory_for(self, counter: TokenCounter) -> BaseMemory[Any]:
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


def full_history(
    conversations: Sequence[Conversation], counter: TokenCounter, *, one_session: bool = False
) -> list[int]:
    """Per turn, in order, the tokens of the whole conversation so far by ``counter``: what
    sending the full history would cost. It does not depend on the memory, so a replay of
    several settings counts it once. With ``one_session`` the history is every conversation
    so far, one after another, as :func:`replay` plays them then."""
    priming = counter.count_messages([])
    out: list[int] = []
    full = priming
    for conversation in conversations:
        # The counters are additive: the whole prompt is its messages plus the priming.
        if not one_session:
            full = priming
        full += sum(map(counter.count_message, conversation.pinned))
        for turn in conversation.turns:
            full += sum(map(counter.count_message, turn.messages))
            out.append(full)
    return out


def replay(
    conversations: Sequence[Conversation],
    setting: Setting,
    counter: TokenCounter,
    full: Sequence[int] | None = None,
    *,
    one_session: bool = False,
) -> Iterator[TurnRow]:
    """Replay each conversation as its own session, one turn at a time: a row per turn.
    With ``one_session``, every conversation goes into one memory instead, one after another
    in order (each one's pinned messages added when it starts), as one growing session.

    After each turn: ``get_context()`` and ``get_memory_stats()`` of the memory, and the
    tokens the whole conversation (the whole session) so far would cost (``full``, from
    :func:`full_history`, computed here when not given).
    """
    if full is None:
        full = full_history(conversations, counter, one_session=one_session)
    fulls = iter(full)
    memory = setting.memory_for(counter)
    for number, conversation in enumerate(conversations):
        if number and not one_session:
            memory = setting.memory_for(counter)
        if conversation.pinned:
            memory.add_messages(conversation.pinned)
        for turn in conversation.turns:
            memory.add_messages(turn.messages)
            try:
                context, stats = memory.get_context_with_stats()  # one read for both
            except ContextOverflowError as exc:
                raise ReplayOverflowError(
                    f"{_where(turn, len(conversations))}: {exc}; try a larger --token-limit",
                    turn,
                ) from exc
            tokens = (
                counter.count_messages(context)  # a window counts nothing itself
                if setting.memory == "window"
                else stats["context_tokens"]
            )
            yield TurnRow(
                conversation=conversation.number,
                turn=turn.number,
                line=turn.line,
                messages_added=len(turn.messages),
                context_messages=len(context),
                context_tokens=tokens,
                full_history_tokens=next(fulls),
                turns_in_context=stats["turns_in_context"],
                turns_evicted=stats["turns_evicted"],
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


@dataclass(frozen=True, slots=True)
class Buckets:
    """Values per turn taken ``size`` consecutive turns at a time, for a plot: the turn in
    the middle of each bucket, and the mean, least and largest value of its turns. With
    ``size`` 1 each bucket is a turn and its value."""

    size: int
    turns: list[float]
    mean: list[float]
    low: list[int]
    high: list[int]


def aggregate(values: Sequence[int], points: int = PLOT_POINTS) -> Buckets:
    """``values`` (one a turn, the first turn 1) in at most ``points`` buckets of equal size
    (the last one may be smaller): every turn is in one bucket, none is dropped."""
    if points < 1:
        raise ValueError(f"points must be at least 1, got {points}")
    size = max(1, -(-len(values) // points))  # rounded up
    buckets = Buckets(size, [], [], [], [])
    for start in range(0, len(values), size):
        chunk = values[start : start + size]
        buckets.turns.append(start + (len(chunk) + 1) / 2)
        buckets.mean.append(statistics.fmean(chunk))
        buckets.low.append(min(chunk))
        buckets.high.append(max(chunk))
    return buckets


def draw(
    runs: Sequence[Run],
    counter_name: str,
    title: str,
    *,
    log_scale: bool = False,
    one_session: bool = False,
) -> Figure:
    """Two panels. Above, context tokens per turn: a line per setting, the full history
    dashed for reference, a dotted line at each token budget. Past ``PLOT_POINTS`` turns,
    each point is the mean of a bucket of turns (:func:`aggregate`), and a band spans the
    bucket's least to largest context (the full history's, and each setting's that differs
    from it). Below, what each setting saves against the full history, as bars.

    No line hides another: each setting has its own colour, line style and markers; lines
    drawn later are thinner, and the full history is a thin line on top, so a line equal to
    another shows inside it (and its label says so). With ``log_scale`` the token axis is
    logarithmic; without it, a full history far above every setting goes off the top of
    the panel, and its label gives its largest value.
    """
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter, MaxNLocator, PercentFormatter

    figure = Figure(figsize=(10, 6.4 + 0.45 * len(runs)), layout="constrained")
    lines, bars = figure.subplots(2, 1, height_ratios=(4.4, 0.8 + 0.45 * len(runs)))
    rows = runs[0].rows if runs else []
    full_values = [r.full_history_tokens for r in rows]
    full = aggregate(full_values)
    marker_every = max(1, len(full.turns) // 10)
    seen: dict[tuple[int, ...], str] = {tuple(full_values): "full history"}
    colors: list[str] = []
    every = [aggregate([r.context_tokens for r in run.rows]) for run in runs]
    top = max((max(series.high) for series in every), default=0)  # the settings' largest
    highest = max(full.high, default=0)
    off_the_top = not log_scale and bool(runs) and highest > OFF_THE_TOP * top
    data_top = top if off_the_top else max(top, highest)
    # A budget far above every context is off the top too: it would squash the lines.
    budget_top = max(
        (b for run in runs if (b := run.setting.budget) is not None and b <= 2 * data_top),
        default=0,
    )
    y_top = max(data_top, budget_top)
    for i, (run, series) in enumerate(zip(runs, every, strict=True)):
        color = COLORS[i % len(COLORS)]
        style, mark = STYLES[i % len(STYLES)]
        colors.append(color)
        values = [r.context_tokens for r in run.rows]
        label = run.setting.label
        same = seen.setdefault(tuple(values), label)
        notes = [] if same == label else [f"the same as {same}"]
        budget = run.setting.budget
        if budget is not None and not log_scale and budget > y_top:
            notes.append(f"budget {budget:,} off the top")
        if notes:
            label = f"{label} ({'; '.join(notes)})"
        lines.plot(
            series.turns,
            series.mean,
            color=color,
            linestyle=style,
            linewidth=max(1.3, 4.6 - 1.1 * i),
            marker=mark,
            markersize=max(4.0, 7.0 - 0.8 * i),
            markevery=(i * marker_every // max(1, len(runs)), marker_every),
            label=label,
            zorder=3 + i,
        )
        if series.size > 1 and same == run.setting.label:
            lines.fill_between(
                series.turns, series.low, series.high, color=color, alpha=0.13, linewidth=0
            )
        if budget is not None:
            lines.axhline(budget, color=color, linestyle=":", linewidth=1.2)
    full_label = "full history"
    if off_the_top:
        full_label += f" (up to {highest:,}: off the top; --log-scale shows it)"
    lines.plot(
        full.turns,
        full.mean,
        color=FULL_COLOR,
        linestyle=(0, (4, 2)),
        linewidth=1.1,
        marker="o" if len(full.turns) <= 40 else None,
        markersize=3,
        label=full_label,
        zorder=3 + len(runs),
    )
    if full.size > 1:
        lines.fill_between(
            full.turns, full.low, full.high, color=FULL_COLOR, alpha=0.15, linewidth=0
        )
    conversations = len({r.conversation for r in rows})
    _mark_conversations(lines, rows)
    where = ""
    if conversations > 1:
        mode = "played as one session" if one_session else "each its own session"
        where = f" ({conversations:,} conversations, {mode})"
    xlabel = f"turn{where}"
    if full.size > 1:
        xlabel += f"\neach point: the mean of {full.size:,} turns; the band: their least to largest"
    lines.set_xlabel(xlabel)
    lines.set_ylabel(f"context tokens ({counter_name}{', log scale' if log_scale else ''})")
    lines.set_title("Context tokens per turn")
    # Whole turns only, however few (one turn is one tick, not eight labelled "1").
    lines.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    if rows:
        lines.set_xlim(0.5, len(rows) + 0.5)
    thousands = FuncFormatter(lambda value, _: f"{value:,.0f}")
    lines.xaxis.set_major_formatter(thousands)
    if log_scale:
        lines.set_yscale("log")
    else:
        lines.yaxis.set_major_formatter(thousands)
        # Room above the lines for the legend; the full history goes off it when far above.
        lines.set_ylim(0, 1.45 * y_top)
    lines.grid(alpha=0.3)
    legend = lines.legend(loc="upper left", ncols=2, fontsize="small", framealpha=0.95)
    legend.set_zorder(10 + len(runs))  # above every line, the full history's included

    sent_full = runs[0].summary.full_history_tokens_sent if runs else 0
    percents = [run.summary.saved_percent for run in runs]
    positions = list(range(len(runs)))
    bars.barh(positions, percents, color=colors, height=0.62)
    for position, run, percent in zip(positions, runs, percents, strict=True):
        shown = f"{percent:.2f}" if 99 < percent < 100 else f"{percent:.1f}"  # not 100.0 twice
        text = f"saves {shown}%: sends {run.summary.tokens_sent:,} tokens, not {sent_full:,}"
        inside = percent > 50
        bars.annotate(
            text,
            (max(percent, 0), position),
            xytext=(-5 if inside else 5, 0),
            textcoords="offset points",
            ha="right" if inside else "left",
            va="center",
            color="white" if inside else "black",
            fontsize="small",
        )
    bars.set_yticks(positions, [run.setting.label for run in runs])
    bars.invert_yaxis()  # the first setting on top, as in the legend
    bars.set_xlim(min([0.0, *percents]), 100)
    bars.xaxis.set_major_formatter(PercentFormatter())
    bars.set_xlabel(
        "tokens saved against sending the full history every turn, over "
        f"{len(rows):,} turn{'' if len(rows) == 1 else 's'}"
    )
    bars.set_title("Tokens saved")
    bars.grid(axis="x", alpha=0.3)
    figure.suptitle(title)
    return figure


# Past this many conversations, a line at each start would grey the panel: alternate bands.
_MAX_BOUNDARY_LINES = 80


def _mark_conversations(axes: Any, rows: Sequence[TurnRow]) -> None:
    """Where each conversation after the first starts, between its first turn and the turn
    before (x is the turn's place in the replay): a context that drops there starts a new
    conversation, it is no eviction."""
    starts = [
        i + 0.5 for i in range(1, len(rows)) if rows[i].conversation != rows[i - 1].conversation
    ]
    if not starts:
        return
    if len(starts) <= _MAX_BOUNDARY_LINES:
        for n, x in enumerate(starts):
            axes.axvline(
                x,
                color=BOUNDARY_COLOR,
                linewidth=0.8,
                zorder=1,
                label="a new conversation starts" if n == 0 else None,
            )
        return
    bounds = [0.5, *starts, len(rows) + 0.5]
    for n, (begin, end) in enumerate(itertools.pairwise(bounds)):
        if n % 2:
            axes.axvspan(
                begin,
                end,
                color=BOUNDARY_COLOR,
                alpha=0.12,
                linewidth=0,
                zorder=1,
                label="every other conversation" if n == 1 else None,
            )


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
    one_session: bool = False,
    log_scale: bool = False,
) -> int:
    """Replay ``parsed`` once per setting and print the rows, the summary and the plot;
    with ``one_session``, all its conversations as one session."""
    found = conversations(parsed)
    total_turns = sum(len(c.turns) for c in found)
    if not total_turns:
        raise ZerdaError(
            f"{name} holds no turns (only system and developer messages); nothing to replay"
        )
    runs = []
    full = full_history(found, counter, one_session=one_session)
    progress = Progress(err, total_turns * len(settings))
    try:
        for setting in settings:
            rows = []
            try:
                for row in replay(found, setting, counter, full, one_session=one_session):
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
        figure = draw(runs, counter.name, title, log_scale=log_scale, one_session=one_session)
        _save(figure, plot)
    if as_json:
        result = {
            "file": name,
            "form": parsed.form,
            "conversations": len(found),
            "one_session": one_session,
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
    _print_header(out, parsed, name, found, total_turns, settings, counter, one_session)
    if per_turn is None:
        per_turn = len(runs) == 1
    if per_turn:
        for run in runs:
            _print_rows(out, run, many=len(runs) > 1, conversations=len(found))
    _print_summary(out, runs, counter)
    if plot is not None:
        lines = plural(len(runs), "setting")
        print(
            f"\nPlot of context tokens per turn ({lines} and the full history) and of the "
            f"tokens saved: {plot}",
            file=out,
        )
    return 0


def _print_header(
    out: TextIO,
    parsed: Parsed,
    name: str,
    found: Sequence[Conversation],
    total_turns: int,
    settings: Sequence[Setting],
    counter: TokenCounter,
    one_session: bool = False,
) -> None:
    form = parsed.form_name
    messages = f"{plural(len(parsed.messages), 'message')} in {plural(total_turns, 'turn')}"
    if parsed.form == "conversations":
        what = f"{plural(len(found), 'conversation')} ({form}), {messages}"
        sessions = (
            "; all played as one session, in file order"
            if one_session
            else "; each conversation its own session"
        )
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
