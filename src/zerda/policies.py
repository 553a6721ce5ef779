"""Pure selection policies: which of the newest turns go into the context. No I/O here.

Policies work on a conversation's tail as a flat list of non-system messages, the offsets
where its turns start, and (for budgets) each message's cached token count. They return where
the context starts in that list, so a memory can slice the context out without building a
``Turn`` per turn and without counting a token again.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from collections.abc import Set as AbstractSet
from typing import Literal, NamedTuple, TypeVar

from zerda.errors import ContextOverflowError
from zerda.messages import Message, Role, TextPart

__all__ = [
    "REPAIRS",
    "Fit",
    "Overflow",
    "RepairEvent",
    "Repaired",
    "call_ids",
    "count_repairs",
    "extends_valid",
    "fit_budget",
    "last_turns",
    "rename_reused_ids",
    "repair",
    "window_start",
]

T = TypeVar("T")

Overflow = Literal["truncate", "raise"]


def last_turns(turns: Sequence[T], k: int | None) -> Sequence[T]:
    """The newest ``k`` turns, oldest first (all of them when ``k`` is ``None``)."""
    if k is None or k >= len(turns):
        return turns
    return turns[len(turns) - k :] if k > 0 else turns[:0]


def window_start(turn_starts: Sequence[int], length: int, k: int | None) -> int:
    """Where the last ``k`` turns start in a tail of ``length`` messages."""
    kept = last_turns(turn_starts, k)
    return kept[0] if kept else length


class Fit(NamedTuple):
    """The result of fitting a tail into a token budget.

    ``start`` is the offset of the context's first message in the tail; ``turns`` counts the
    turns in the context; ``tokens`` is the sum of the counts of the messages from ``start``
    on. ``truncated``: the newest turn alone, over the budget, to be shortened.
    ``exhausted`` means every turn of the tail fitted, so an older turn, if the store has
    one, might fit too.
    """

    start: int
    turns: int
    tokens: int
    truncated: bool
    exhausted: bool


# A tail of at most this many turns is fitted from its oldest turn (see fit_budget).
_SHORT_TAIL = 64


def fit_budget(
    messages: Sequence[Message],
    tokens: Sequence[int],
    turn_starts: Sequence[int],
    budget: int,
    overflow: Overflow = "truncate",
) -> Fit:
    """Keep the newest whole turns whose tokens add up to at most ``budget`` (``tokens`` are
    counts: none is negative).

    The first turn that does not fit, walking from the newest, ends the context, so the cost
    is that of the context, not of the conversation. When the newest turn alone is over
    budget, ``overflow="raise"`` raises :class:`ContextOverflowError`; ``"truncate"`` returns
    that turn alone, ``truncated`` and with its full count: :func:`shorten_turn` then makes it
    fit.
    """
    end = len(messages)
    n = len(turn_starts)
    if 0 < n <= _SHORT_TAIL:
        # A memory reads the turns its last context held and a turn or two more: sum them all
        # (in C) and drop turns from the oldest while over budget, a step or two, rather than
        # a step for every kept turn. Counts are not negative, so the turns left are exactly
        # those the walk from the newest keeps.
        first = turn_starts[0]
        used = sum(tokens if not first and len(tokens) == end else tokens[first:end])
        dropped = 0
        while used > budget and dropped < n:
            dropped += 1
            used -= sum(
                tokens[turn_starts[dropped - 1] : turn_starts[dropped] if dropped < n else end]
            )
        if dropped < n:
            # truncated=False; exhausted when no turn was dropped
            return Fit(turn_starts[dropped], n - dropped, used, False, not dropped)
    else:
        used = 0
        kept = 0
        start = end
        for begin in reversed(turn_starts):
            cost = sum(tokens[begin:start])
            used += cost
            if used > budget:
                used -= cost
                break
            kept += 1
            start = begin
        else:
            return Fit(start, kept, used, False, True)  # truncated=False, exhausted=True
        if kept:
            return Fit(start, kept, used, False, False)
    # The newest turn alone does not fit.
    newest = turn_starts[-1]
    needed = sum(tokens[newest:end])
    if overflow == "raise":
        raise ContextOverflowError(
            f"the newest turn alone needs {needed} tokens, over the budget of {budget}; "
            'use overflow="truncate" to cut its longest texts, or raise the budget',
            needed=needed,
            limit=budget,
        )
    return Fit(newest, 1, needed, truncated=True, exhausted=False)


# -- repair: a context every provider accepts, from whatever was stored ------------------------

REPAIRS = (
    "moved_results",
    "dropped_orphan_results",
    "dropped_duplicate_results",
    "dropped_unanswered_calls",
    "dropped_before_user",
    "renamed_call_ids",
)
"""What :func:`repair` reports, by kind (the index of each in :attr:`Repaired.events`)."""
MOVED, ORPHAN, DUPLICATE, UNANSWERED, BEFORE_USER, RENAMED = range(len(REPAIRS))


class RepairEvent(NamedTuple):
    """One repair: its ``kind`` (an index of :data:`REPAIRS`), the ``turn`` of the repaired
    sequence it belongs to (a moved result, or a duplicate, belongs to its call's turn),
    the ``stored_turn`` of the message it is about, that message (``message``: its index in
    the tail repaired), the ``other`` message concerned (the call's, for a moved or
    duplicate result) and the ``call`` of the message (its index in ``tool_calls``) for a
    removed or renamed call; ``-1`` where there is none."""

    kind: int
    turn: int
    stored_turn: int
    message: int
    other: int = -1
    call: int = -1


class Repaired(NamedTuple):
    """A repaired tail: its messages and counts, where each of its turns starts (as many turns
    as before; a turn whose every message was dropped is empty), what was repaired
    (:class:`RepairEvent`), and, for each output message, the index of the message of the
    tail it came from (``sources``)."""

    messages: list[Message]
    tokens: list[int | None]
    turn_starts: list[int]
    events: list[RepairEvent]
    sources: list[int]


def repair(
    messages: Sequence[Message],
    tokens: Sequence[int | None],
    turn_starts: Sequence[int],
    valid_upto: int = 0,
) -> Repaired | None:
    """The tail of a log (no pinned messages) made valid for every provider, or ``None`` when
    it is valid as it is. The log itself is never changed; the rules, in this order (the
    sixth applies to the context a memory picks from the tail: :func:`rename_reused_ids`):

    1. a tool result stored after another message (a user who interjected), or before its
       call, is moved to directly after its call, with the call's other results;
    2. a result whose call is not in the tail (evicted, or never made) is dropped;
    3. of several results for one call, the first is kept;
    4. a call with no result is removed from its message (a second call with the same id in
       one message too); a message left with neither text nor calls is dropped;
    5. a first turn that does not open on a user message (a greeting) is dropped: the first
       message after the pinned ones is a user message, and the results of its calls go with
       it, wherever they were stored;
    6. a call whose id an earlier call of the context uses (models that number their calls
       ``call_0`` each turn) is given a new one, ``call_0_2``, and so are its results: OpenAI
       and Anthropic refuse a request that uses one id twice.

    A result answers a call of its own turn with its id when there is one (the latest before
    it, else the first after it), else the latest call with its id in the turns before; a
    call that already has its result takes no other (rule 3). So models that reuse ids turn
    after turn are paired right, and how a result is paired never depends on how far back
    the tail reaches: the same turns give the same context from any tail that holds them.
    Turns keep their numbers (a moved result belongs to its call's turn); a message that
    changed has no count (``None``: count it again). Costs one pass over the tail.

    ``valid_upto`` says that ``messages[:valid_upto]`` is known to break no rule and to end
    where no call waits for a result (a memory knows it from its last read: logs only
    grow): only the messages after it are checked, so a valid tail costs what was added since.
    """
    if not _needs_repair(messages, turn_starts, valid_upto):
        return None
    n = len(messages)
    turn_of = _turn_numbers(n, turn_starts)
    greeting = bool(turn_starts) and messages[turn_starts[0]].role is not Role.USER
    greeting_end = turn_starts[1] if greeting and len(turn_starts) > 1 else n
    events: list[RepairEvent] = []
    removed: set[tuple[int, int]] = set()  # (message, call) to drop: an id twice in a message
    owner_of: dict[int, tuple[int, int]] = {}  # result -> the (message, call) it answers
    answered: set[tuple[int, int]] = set()
    latest: dict[str, tuple[int, int]] = {}  # call id -> its latest call in the turns before
    bounds = [*turn_starts, n] if turn_starts and turn_starts[0] == 0 else [0, *turn_starts, n]
    for begin, end in itertools.pairwise(bounds):
        own: dict[str, list[tuple[int, int]]] = {}  # this turn's calls, by id, in order
        for i in range(begin, end):
            here: set[str] = set()
            for j, call in enumerate(messages[i].tool_calls):
                if call.id in here:
                    removed.add((i, j))
                    continue
                here.add(call.id)
                own.setdefault(call.id, []).append((i, j))
        for r in range(begin, end):
            m = messages[r]
            if m.role is not Role.TOOL:
                continue
            call_id = m.tool_call_id or ""
            same_turn = own.get(call_id)
            owner = None
            if same_turn:
                before = [c for c in same_turn if c[0] < r]
                owner = before[-1] if before else same_turn[0]
            else:
                owner = latest.get(call_id)
            if owner is None:
                events.append(RepairEvent(ORPHAN, turn_of[r], turn_of[r], r))
            elif owner in answered:
                events.append(RepairEvent(DUPLICATE, turn_of[owner[0]], turn_of[r], r, owner[0]))
            else:
                answered.add(owner)
                owner_of[r] = owner
        for call_id, calls in own.items():
            latest[call_id] = calls[-1]
    results_of: dict[int, list[int]] = {}  # message -> the results of its calls, in order
    for r, (i, _) in owner_of.items():
        if greeting and i < greeting_end:
            if r >= greeting_end:  # a greeting's call answered later: dropped with it
                events.append(RepairEvent(ORPHAN, turn_of[r], turn_of[r], r))
            continue
        results_of.setdefault(i, []).append(r)
    counted = bool(tokens)
    out: list[Message] = []
    out_tokens: list[int | None] = []
    sources: list[int] = []
    starts: list[int] = []
    next_start = 0
    for i, m in enumerate(messages):
        while next_start < len(turn_starts) and turn_starts[next_start] == i:
            starts.append(len(out))
            next_start += 1
        if greeting and i < greeting_end:
            # Dropped with its turn (the results of its calls with it, wherever stored).
            if m.role is not Role.TOOL:
                events.append(RepairEvent(BEFORE_USER, 0, 0, i))
            continue
        if m.role is Role.TOOL:
            continue  # emitted with its call, or dropped
        if not m.tool_calls:
            out.append(m)
            sources.append(i)
            if counted:
                out_tokens.append(tokens[i])
            continue
        gone = [j for j in range(len(m.tool_calls)) if (i, j) not in answered or (i, j) in removed]
        kept = tuple(c for j, c in enumerate(m.tool_calls) if j not in gone)
        dropped = len(gone)
        events.extend(RepairEvent(UNANSWERED, turn_of[i], turn_of[i], i, call=j) for j in gone)
        mine = sorted(results_of.get(i, ()))
        if dropped and not kept and not m.text and not isinstance(m.content, tuple):
            continue  # neither text nor calls left
        if dropped:
            m = dataclasses.replace(m, tool_calls=kept)
        out.append(m)
        sources.append(i)
        if counted:
            out_tokens.append(None if dropped else tokens[i])
        for r in mine:
            if r < i or any(messages[k].role is not Role.TOOL for k in range(i + 1, r)):
                events.append(RepairEvent(MOVED, turn_of[i], turn_of[r], r, i))
            out.append(messages[r])
            sources.append(r)
            if counted:
                out_tokens.append(tokens[r])
    while next_start < len(turn_starts):  # turns that were only dropped messages, at the end
        starts.append(len(out))
        next_start += 1
    return Repaired(out, out_tokens, starts, events, sources)


def count_repairs(events: Sequence[RepairEvent], first_turn: int) -> dict[str, int]:
    """What :func:`repair`'s ``events`` did to the turns from ``first_turn`` on (a context),
    by kind (every kind of :data:`REPAIRS`, 0 when it did not happen). Seen from that
    context, a result moved to (or a duplicate of) a call in a turn before it was dropped
    because its call is not there: it counts as an orphan, so the counts, like the context,
    do not depend on how far back the tail reached."""
    counts = dict.fromkeys(REPAIRS, 0)
    for event in events:
        if event.turn >= first_turn:
            counts[REPAIRS[event.kind]] += 1
        elif event.stored_turn >= first_turn and event.kind in (MOVED, DUPLICATE):
            counts[REPAIRS[ORPHAN]] += 1
    return counts


def extends_valid(messages: Sequence[Message], turn_starts: Sequence[int]) -> bool:
    """Whether ``messages``, appended to a tail that :func:`repair` leaves as it is, leave it
    so: they break none of its rules (a first turn, at ``turn_starts[0]`` when the tail
    before them is empty, opens on a user message; pass no ``turn_starts`` after a non-empty
    tail). One pass over ``messages``."""
    return not _needs_repair(messages, turn_starts, 0)


def call_ids(messages: Sequence[Message]) -> set[str]:
    """The ids of the tool calls ``messages`` make."""
    return {c.id for m in messages if m.tool_calls for c in m.tool_calls}


def rename_reused_ids(
    messages: Sequence[Message], turn_starts: Sequence[int]
) -> tuple[list[Message], list[RepairEvent]] | None:
    """Rule 6 of :func:`repair`, over a context: ``messages`` (repaired, so each call's
    results come right after its message; ``turn_starts`` where its turns start) with every
    call whose id an earlier call of them uses given a new one (``call_0_2``, see
    :func:`_fresh_id`), and its results with it, and a :class:`RepairEvent` for each;
    ``None`` when no id is used twice. Counts do not change: ids are not counted.

    It applies to the context, not to the tail it was picked from: whether an id is used
    twice is a question about one request, and the answer must not depend on how far back
    a read reached."""
    seen: set[str] = set()
    for m in messages:
        for call in m.tool_calls:
            if call.id in seen:
                break
            seen.add(call.id)
        else:
            continue
        break
    else:
        return None
    every_id = call_ids(messages)
    turn_of = _turn_numbers(len(messages), turn_starts)
    used: set[str] = set()  # the ids of the calls out so far
    renamed: dict[str, str] = {}  # of the call message the results now read follow
    out: list[Message] = []
    events: list[RepairEvent] = []
    for i, m in enumerate(messages):
        if m.tool_calls:
            renamed = {}
            for j, call in enumerate(m.tool_calls):
                if call.id in used:
                    renamed[call.id] = _fresh_id(call.id, used, every_id)
                    events.append(RepairEvent(RENAMED, turn_of[i], turn_of[i], i, call=j))
                used.add(renamed.get(call.id, call.id))
            if renamed:
                calls = tuple(
                    dataclasses.replace(c, id=renamed[c.id]) if c.id in renamed else c
                    for c in m.tool_calls
                )
                m = dataclasses.replace(m, tool_calls=calls)
        elif m.role is Role.TOOL:
            new_id = renamed.get(m.tool_call_id or "")
            if new_id:
                m = dataclasses.replace(m, tool_call_id=new_id)
        else:
            renamed = {}
        out.append(m)
    return out, events


def _fresh_id(call_id: str, used: AbstractSet[str], taken: AbstractSet[str]) -> str:
    """``call_id`` with the smallest suffix ``_2``, ``_3``, … that no call uses (kept within
    OpenAI's 40 characters by shortening the id it extends)."""
    n = 2
    while True:
        suffix = f"_{n}"
        fresh = (
            call_id[: 40 - len(suffix)] + suffix
            if len(call_id) + len(suffix) > 40
            else (call_id + suffix)
        )
        if fresh not in used and fresh not in taken:
            return fresh
        n += 1


def _turn_numbers(n: int, turn_starts: Sequence[int]) -> list[int]:
    """The turn each of ``n`` messages belongs to."""
    out = [0] * n
    for t, start in enumerate(turn_starts):
        end = turn_starts[t + 1] if t + 1 < len(turn_starts) else n
        out[start:end] = [t] * (end - start)
    return out


def _needs_repair(messages: Sequence[Message], turn_starts: Sequence[int], start: int = 0) -> bool:
    """Whether the tail, from ``start`` (a point known valid before), breaks a rule of
    :func:`repair` (one cheap pass; most tails do not)."""
    if not start and turn_starts and messages[turn_starts[0]].role is not Role.USER:
        return True
    tool = Role.TOOL
    i, n = start, len(messages)
    while i < n:
        m = messages[i]
        i += 1
        if m.role is tool:
            return True  # a result not right after its call's message
        calls = m.tool_calls
        if not calls:
            continue
        if len(calls) == 1:  # the common case, without sets: its one result right after it
            if i < n and messages[i].role is tool and messages[i].tool_call_id == calls[0].id:
                i += 1
                continue  # a second result would be a tool message out of place: caught above
            return True  # a call without its result right after it, or a stray result
        wanted = {c.id for c in calls}
        if len(wanted) != len(calls):
            return True  # one id twice in a message
        while i < n and messages[i].role is tool:
            call_id = messages[i].tool_call_id
            if call_id not in wanted:
                return True  # a stray or a repeated result
            wanted.discard(call_id)
            i += 1
        if wanted:
            return True  # a call without its result right after it
    return False


# -- shortening a turn that alone is over the budget ------------------------------------------

MARKER = "[... {n} tokens cut ...]"
"""What replaces the middle of a text cut to fit the budget (``{n}``: the tokens cut)."""


class Shortened(NamedTuple):
    """A turn made to fit: its messages (the long texts cut in the middle), their counts, how
    many tokens were cut, and how many from each message (``cuts``)."""

    messages: list[Message]
    tokens: list[int]
    cut: int
    cuts: list[int]


def shorten_turn(
    messages: Sequence[Message],
    tokens: Sequence[int],
    budget: int,
    count_text: Callable[[str], int],
    count_message: Callable[[Message], int],
) -> Shortened:
    """``messages`` (one turn; ``tokens`` their counts) made to fit ``budget`` by cutting the
    middle of their longest texts, each down to the same size (the largest first), with a
    :data:`MARKER` saying how much was cut: every message stays, so the turn still opens on
    its user message and keeps each call with its result. Only text is cut: tool-call
    arguments (JSON), media, reasoning and the per-message overheads are not. When they,
    with every text cut to a marker, still exceed the budget: :class:`ContextOverflowError`.
    """
    texts = [(i, j, t) for i, m in enumerate(messages) for j, t in _cuttable(m)]
    sizes = [count_text(t) for _, _, t in texts]
    fixed = sum(tokens) - sum(sizes)  # counters are additive: the rest of each message
    floor = count_text(MARKER.format(n="999,999")) + 4  # a cut text: a marker and a little
    least = fixed + sum(min(size, floor) for size in sizes)
    if least > budget:
        raise ContextOverflowError(
            f"the newest turn needs {sum(tokens)} tokens, over the budget of {budget}, and "
            f"{least} even with its texts cut to a marker: {_uncuttable(messages)} "
            "cannot be cut",
            needed=least,
            limit=budget,
        )
    cap = _water_level(sizes, budget - fixed)
    new_texts: dict[int, dict[int, str]] = {}
    cuts = [0] * len(messages)
    for (i, j, text), size in zip(texts, sizes, strict=True):
        if size > cap:
            short, removed = _cut_middle(text, size, cap, count_text)
            new_texts.setdefault(i, {})[j] = short
            cuts[i] += removed
    out = list(messages)
    out_tokens = list(tokens)
    for i, changed in new_texts.items():
        out[i] = _with_texts(messages[i], changed)
        out_tokens[i] = count_message(out[i])
    return Shortened(out, out_tokens, sum(cuts), cuts)


def _uncuttable(messages: Sequence[Message]) -> str:
    """What in ``messages`` no cut can shorten, named for an error message: only the kinds
    that are there."""
    n = len(messages)
    what = [f"the overhead every message costs ({n} message{'s' if n != 1 else ''})"]
    if any(m.tool_calls for m in messages):
        what.append("tool-call names and arguments")
    kinds = {
        type(p).__name__
        for m in messages
        if isinstance(m.content, tuple)
        for p in m.content
        if type(p) is not TextPart
    }
    if kinds - {"ReasoningPart"}:
        what.append("media (images, audio, files)")
    if "ReasoningPart" in kinds:
        what.append("reasoning")
    return spoken_list(what)


def spoken_list(items: Sequence[str]) -> str:
    """``a``, ``a and b``, ``a, b and c``: parts named in an error message."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def _cuttable(m: Message) -> list[tuple[int, str]]:
    """The texts of ``m`` that may be cut, by position: its string content (position 0), or its
    text parts (their index)."""
    content = m.content
    if isinstance(content, str):
        return [(0, content)] if content else []
    if content is None:
        return []
    return [(j, p.text) for j, p in enumerate(content) if type(p) is TextPart and p.text]


def _with_texts(m: Message, texts: dict[int, str]) -> Message:
    content = m.content
    if isinstance(content, str):
        return dataclasses.replace(m, content=texts[0])
    assert content is not None
    parts = tuple(
        TextPart(texts[j], extra=p.extra) if j in texts else p for j, p in enumerate(content)
    )
    return dataclasses.replace(m, content=parts)


def _water_level(sizes: Sequence[int], room: int) -> int:
    """The largest cap such that the sizes, each cut down to it, add up to at most ``room``."""
    if sum(sizes) <= room:
        return max(sizes, default=0)
    ordered = sorted(sizes)
    below = 0  # the sizes under the cap, kept whole
    for k, size in enumerate(ordered):
        left = len(ordered) - k  # those at or above the cap share what is left
        cap = (room - below) // left
        if cap < size:
            return max(cap, 0)
        below += size
    return ordered[-1]


def _cut_middle(
    text: str, size: int, target: int, count_text: Callable[[str], int]
) -> tuple[str, int]:
    """``text`` (``size`` tokens) with its middle replaced by a marker, at most ``target``
    tokens in all, the head and the tail of equal length; and how many of its tokens were
    cut. Estimates what to keep from the text's characters per token, then checks (counting
    only what is kept), a few rounds at most."""
    per_token = len(text) / max(size, 1)
    marker = count_text(MARKER.format(n=f"{size:,}"))
    keep = int(max(target - marker, 0) * per_token)
    for _ in range(8):
        head = _until_space(text[: keep - keep // 2], from_end=True)
        tail = _until_space(text[len(text) - keep // 2 :] if keep // 2 else "", from_end=False)
        removed = size - count_text(head) - count_text(tail)
        short = head + MARKER.format(n=f"{removed:,}") + tail
        over = count_text(short) - target
        if over <= 0:
            return short, removed
        keep = max(0, keep - int(over * per_token) - 1)
    return MARKER.format(n=f"{size:,}"), size


def _until_space(piece: str, *, from_end: bool) -> str:
    """``piece`` cut back to a space near its cut end, so no word is cut in two (a piece with
    no space near that end is left as it is)."""
    window = piece[-40:] if from_end else piece[:40]
    at = window.rfind(" ") if from_end else window.find(" ")
    if at < 0:
        return piece
    return piece[: len(piece) - len(window) + at + 1] if from_end else piece[at:]
