"""ExtractiveSummarizer: the most informative sentences and facts within a token target, offline."""

from __future__ import annotations

import heapq
import json
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from zerda.errors import ConfigurationError
from zerda.messages import Message, Role
from zerda.summarize._base import SummaryResult, check_inputs
from zerda.tokens import ApproxCounter, TokenCounter, as_token_counter

__all__ = ["DEFAULT_SUMMARY_TOKENS", "ExtractiveSummarizer"]

DEFAULT_SUMMARY_TOKENS = 256

# What a term is worth when a summary first covers it. Ids and figures are what a model can
# never reconstruct; names next; any other content word counts for little.
_NUMBER_WEIGHT = 4.0
_DIGIT_WEIGHT = 2.0  # a single digit: a quantity, often, but also "1 sec"
_NAME_WEIGHT = 2.0
_WORD_WEIGHT = 0.5
# What the user says is what the conversation is for; tool results mostly restate it in ids.
_USER_BOOST = 2.0
# Lines of the previous summary were chosen before, from turns nobody will see again.
_PREVIOUS_BOOST = 1.2
# Later facts tend to supersede earlier ones ("make that oat milk"): up to this much more.
_RECENCY_BOOST = 0.2
_MAX_NAME_WORDS = 4
_MAX_NAME_CHARS = 48

_TOKEN = re.compile(r"[^\W_][\w'@#$%&./:+-]*")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\s*\n\s*")
_LABELLED_LINE = re.compile(r"^((?:user|assistant|system|tool)\b[^:\n]{0,80}): (.*)$")
_TRAILING = ".,:;/'-+&@#"

_STOPWORD_TEXT = """
    a about above after again against all also am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each few for from further get gets getting got had hadn't
    has hasn't have haven't having he he'd he'll he's her here here's hers herself him himself
    his how how's i i'd i'll i'm i've if in into is isn't it it's its itself just let let's
    like ll me more most much must mustn't my myself no nor not now of off ok okay on once only
    or other ought our ours ourselves out over own please re same shall shan't she she'd she'll
    she's should shouldn't so some such sure than thank thanks that that's the their theirs them
    themselves then there there's these they they'd they'll they're they've this those through
    to too under until up us very want wanna was wasn't we we'd we'll we're we've well were
    weren't what what's when when's where where's which while who who's whom why why's will with
    won't would wouldn't yeah yes yep yup you you'd you'll you're you've your yours yourself
    yourselves hi hello hey bye goodbye great good fine cool alright right sounds sound
    true false null none user assistant system tool
"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


def _norm(token: str) -> str:
    return token.rstrip(_TRAILING).lower()


def _words(text: str) -> list[str]:
    """The tokens of ``text`` as written, trailing punctuation stripped."""
    return [w for w in (t.rstrip(_TRAILING) for t in _TOKEN.findall(text)) if w]


def _is_name_word(word: str) -> bool:
    return word[0].isupper() and word.lower() not in _STOPWORDS


def _sentences(text: str) -> list[str]:
    return [s for s in (p.strip() for p in _SENTENCE_END.split(text)) if s]


@dataclass(slots=True)
class _Unit:
    """A candidate for the summary: a sentence, or the scalar fields of one JSON object."""

    source: tuple[int, ...]  # units of one source may share a line
    prefix: str  # "user", "tool get_order", "" for none
    body: str
    joiner: str  # between bodies that share a line
    boost: float = 1.0
    topic: str = ""  # for a tool call, the function's name: what was done is a fact too
    terms: dict[str, float] = field(default_factory=dict)
    cost: int = 0  # tokens of its line
    body_cost: int = 0  # tokens of its body, what it adds at least

    def line(self) -> str:
        return f"{self.prefix}: {self.body}" if self.prefix else self.body


def _scalar(value: object) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _records(node: object, key: str = "") -> Iterator[tuple[str, list[tuple[str, str]]]]:
    """The objects of a JSON document: for each, the key it sits under and its scalar fields.

    Numbers arrive as their JSON text (see ``_parse``), so ``12.50`` stays ``12.50``.
    """
    if isinstance(node, dict):
        fields = []
        for k, v in node.items():
            if isinstance(v, list) and v and all(_scalar(x) is not None for x in v):
                fields.append((k, ", ".join(str(x) for x in v)))
            elif (text := _scalar(v)) is not None:
                fields.append((k, text))
        if fields:
            yield key, fields
        for k, v in node.items():
            if isinstance(v, dict) or (isinstance(v, list) and any(_scalar(x) is None for x in v)):
                yield from _records(v, k)
    elif isinstance(node, list):
        for item in node:
            yield from _records(item, key)
    elif (text := _scalar(node)) is not None:
        yield key, [("", text)]


def _parse(text: str) -> object:
    """JSON with numbers kept as written; ``None`` when ``text`` is not a JSON object or array."""
    stripped = text.strip()
    if not stripped or stripped[0] not in "{[":
        return None
    try:
        return json.loads(stripped, parse_float=str, parse_int=str, parse_constant=str)
    except ValueError:
        return None


class ExtractiveSummarizer:
    """A summary made of the conversation's own most informative sentences. No model, no key.

    Every sentence of the messages and of the previous summary, every tool call and every
    object of a JSON tool result is a candidate line. The summary covers as much information
    as fits ``max_tokens`` (counted by ``token_counter``, default :class:`~zerda.ApproxCounter`):
    ids and numbers weigh most, then names (capitalized words not opening a sentence, and the
    strings of JSON tool results and call arguments, wherever they recur), then other
    content words. Lines are picked greedily by new information per token, each fact counted
    once, so repeats are skipped; the chosen lines keep their order, the previous summary's
    first. The same input always gives the same summary.

    Lines read like :func:`render_messages`' (``user: ...``, ``tool get_order: order_id=7``),
    so a summary folded in again is parsed back line by line.
    """

    def __init__(
        self,
        max_tokens: int = DEFAULT_SUMMARY_TOKENS,
        token_counter: TokenCounter | Callable[[str], int] | None = None,
    ) -> None:
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens <= 0:
            raise ConfigurationError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.max_tokens = max_tokens
        self.token_counter = (
            ApproxCounter() if token_counter is None else as_token_counter(token_counter)
        )

    def __repr__(self) -> str:
        return (
            f"ExtractiveSummarizer(max_tokens={self.max_tokens}, "
            f"token_counter={self.token_counter!r})"
        )

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize_with_stats(previous_summary, messages).text

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        # Pure computation with no I/O to wait on: nothing to gain from a thread.
        return self.summarize_with_stats(previous_summary, messages).text

    def summarize_with_stats(
        self, previous_summary: str, messages: Sequence[Message]
    ) -> SummaryResult:
        """Like :meth:`summarize`, with the time taken (no API, so no token figures)."""
        started = time.perf_counter()
        batch = check_inputs(previous_summary, messages)
        if not batch and self.token_counter.count_text(previous_summary) <= self.max_tokens:
            # Nothing to fold in: choosing again could only reorder or drop.
            return SummaryResult(previous_summary, seconds=time.perf_counter() - started)
        units = self._units(previous_summary, batch)
        text = self._select(units)
        return SummaryResult(text, seconds=time.perf_counter() - started)

    async def asummarize_with_stats(
        self, previous_summary: str, messages: Sequence[Message]
    ) -> SummaryResult:
        return self.summarize_with_stats(previous_summary, messages)

    # -- candidates ------------------------------------------------------------------------------

    def _units(self, previous_summary: str, messages: list[Message]) -> list[_Unit]:
        units: list[_Unit] = []
        names: set[str] = set()  # membership only: iteration order never reaches the output

        def text_units(
            source: tuple[int, ...], prefix: str, text: str, boost: float, topic: str = ""
        ) -> None:
            for sentence in _sentences(text):
                words = _words(sentence)
                run: list[str] = []
                # A capitalized word that does not open the sentence is a name; so is a run
                # of two or more ("Caramel Macchiato, please") even where it opens it.
                for i, word in enumerate([*words, ""]):
                    if word and _is_name_word(word):
                        run.append(word)
                        continue
                    if len(run) > 1 or (run and i - len(run) > 0):
                        _add_name(names, " ".join(run))
                    run = []
                units.append(_Unit(source, prefix, sentence, " ", boost, topic))

        def record_units(
            source: tuple[int, ...], prefix: str, document: object, topic: str = ""
        ) -> None:
            for key, all_fields in _records(document):
                # {"attribute_id": "Name", "attribute_name": "Name"}: say "Name" once.
                fields: list[tuple[str, str]] = []
                for k, v in all_fields:
                    if all(v != kept for _, kept in fields):
                        fields.append((k, v))
                for _, value in fields:
                    _add_name(names, value)
                body = ", ".join(f"{k}={v}" if k else v for k, v in fields)
                label = f"{prefix} {key}" if key and prefix else prefix
                units.append(_Unit(source, label, body, "; ", topic=topic))

        for i, line in enumerate(previous_summary.splitlines()):
            labelled = _LABELLED_LINE.match(line.strip())
            prefix, body = labelled.groups() if labelled else ("", line)
            text_units((0, i), prefix, body, _PREVIOUS_BOOST)

        call_names: dict[str, str] = {}
        for j, m in enumerate(messages, start=1):
            label = m.role.value if m.name is None else f"{m.role.value} ({m.name})"
            if m.role is Role.TOOL:
                call = m.name or call_names.get(m.tool_call_id or "")
                label = f"tool {call}" if call else "tool"
                document = _parse(m.text)
                if document is not None:
                    record_units((j,), label, document)
                    continue
            text_units((j,), label, m.text, _USER_BOOST if m.role is Role.USER else 1.0)
            for k, c in enumerate(m.tool_calls):
                call_names[c.id] = c.name
                _add_name(names, c.name)
                document = _parse(c.arguments)
                call_label = f"{label} -> {c.name}"
                if document is None:
                    text_units((j, k), call_label, c.arguments, 1.0, c.name)
                else:
                    record_units((j, k), call_label, document, c.name)

        return self._scored(units, names)

    def _scored(self, units: list[_Unit], names: set[str]) -> list[_Unit]:
        count = self.token_counter.count_text
        # No single line may take more than a third of the summary (or all of a tiny one): long
        # ones are cut into pieces of whole words, so that one long message cannot crowd out
        # everything else.
        cap = min(max(self.max_tokens // 3, 8), self.max_tokens)
        pieces: list[_Unit] = []
        for unit in units:
            cost = count(unit.line())
            if cost <= cap:
                unit.cost = cost
                pieces.append(unit)
                continue
            words = unit.body.split()
            parts = min(-(-cost // cap), len(words))
            size = -(-len(words) // parts)
            for start in range(0, len(words), size):
                body = " ".join(words[start : start + size])
                piece = _Unit(unit.source, unit.prefix, body, " ", unit.boost, unit.topic)
                piece.cost = count(piece.line())
                pieces.append(piece)
        total = len(pieces)
        for position, unit in enumerate(pieces):
            if unit.source[0]:  # not the previous summary
                unit.boost += _RECENCY_BOOST * position / total
            unit.terms = _terms(f"{unit.topic} {unit.body}", names)
            unit.body_cost = count(unit.body)
        return pieces

    # -- selection -------------------------------------------------------------------------------

    def _select(self, units: list[_Unit]) -> str:
        """Greedy by new weight per token (lazy: a gain only shrinks as coverage grows)."""
        covered: set[str] = set()
        chosen: list[int] = []
        heap = [
            (-self._gain(u, covered) / max(u.cost, 1), -i, i)
            for i, u in enumerate(units)
            if u.terms and u.cost <= self.max_tokens
        ]
        heapq.heapify(heap)
        text = ""
        used = 0
        while heap:
            _, tie, i = heapq.heappop(heap)
            unit = units[i]
            gain = self._gain(unit, covered)
            if gain <= 0:
                continue
            ratio = gain / max(unit.cost, 1)
            if heap and ratio < -heap[0][0]:
                heapq.heappush(heap, (-ratio, tie, i))
                continue
            # A line adds at least its body's tokens (less 1 for rounding): skip what cannot fit
            # without rendering; nor will it later, since the summary only grows.
            if used + unit.body_cost - 1 > self.max_tokens:
                continue
            candidate = _render(units, sorted([*chosen, i]))
            tokens = self.token_counter.count_text(candidate)
            if tokens > self.max_tokens:
                continue
            chosen.append(i)
            text, used = candidate, tokens
            covered.update(unit.terms)
        return text

    @staticmethod
    def _gain(unit: _Unit, covered: set[str]) -> float:
        return unit.boost * sum(w for t, w in unit.terms.items() if t not in covered)


def _add_name(names: set[str], value: str) -> None:
    words = [_norm(w) for w in _words(value)]
    if (
        0 < len(words) <= _MAX_NAME_WORDS
        and len(value) <= _MAX_NAME_CHARS
        and any(w not in _STOPWORDS and not w.isdigit() for w in words)
    ):
        names.add(" ".join(words))


def _terms(text: str, names: set[str]) -> dict[str, float]:
    """The terms of a candidate and their weights, in the order they occur."""
    words = [_norm(w) for w in _words(text)]
    terms: dict[str, float] = {}
    for i, word in enumerate(words):
        if any(ch.isdigit() for ch in word):
            single = len(word) == 1
            terms.setdefault(word, _DIGIT_WEIGHT if single else _NUMBER_WEIGHT)
            continue
        for n in range(1, min(_MAX_NAME_WORDS, len(words) - i) + 1):
            phrase = " ".join(words[i : i + n])
            if phrase in names:
                terms.setdefault(phrase, _NAME_WEIGHT)
        if len(word) > 2 and word not in _STOPWORDS and word.isalpha():
            terms.setdefault(word, _WORD_WEIGHT)
    return terms


def _render(units: list[_Unit], chosen: list[int]) -> str:
    """The chosen units in order; consecutive ones from one source share a line."""
    lines: list[str] = []
    previous: _Unit | None = None
    bodies: list[str] = []
    for i in chosen:
        unit = units[i]
        if previous is not None and (unit.source, unit.prefix) == (
            previous.source,
            previous.prefix,
        ):
            bodies.append(unit.body)
            continue
        if previous is not None:
            lines.append(_line(previous, bodies))
        previous, bodies = unit, [unit.body]
    if previous is not None:
        lines.append(_line(previous, bodies))
    return "\n".join(lines)


def _line(unit: _Unit, bodies: list[str]) -> str:
    body = unit.joiner.join(bodies)
    return f"{unit.prefix}: {body}" if unit.prefix else body
