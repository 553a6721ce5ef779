"""The inspector's HTML: pure functions from what was read to a page (no I/O, no Starlette).

Every piece of text that comes from a store, a request or a user passes through :func:`esc`
once, where it is put into the page; nothing here builds HTML from unescaped input. The pages
need no script: charts are SVG drawn here, confirmations are pages of their own.
"""

from __future__ import annotations

import contextlib
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, urlencode

from zerda.memory import Inspection, MessageAccount
from zerda.messages import Role, ToolCall
from zerda.parts import AudioPart, FilePart, ImagePart, ReasoningPart, TextPart
from zerda.stores._base import SessionInfo

__all__ = [
    "TURNS_PER_PAGE",
    "MemoryForm",
    "SessionView",
    "TurnView",
    "confirm_page",
    "error_page",
    "fork_page",
    "login_page",
    "page",
    "session_page",
    "session_view",
    "sessions_page",
]

# Shown at most this many characters of one text (the rest is counted, not shown).
_TEXT_SHOWN = 4000
TURNS_PER_PAGE = 50
_MEMORY_KINDS = ("buffer", "window", "token", "summary_buffer")


def esc(value: object) -> str:
    return html.escape(str(value), quote=True)


def _counted(count: int, noun: str) -> str:
    """``1 turn``, ``1,024 turns``."""
    return f"{count:,} {noun}" if count == 1 else f"{count:,} {noun}s"


def when(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    moment = datetime.fromtimestamp(seconds, timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def page(
    title: str, body: str, *, base: str, tenant: str | None, csrf: str | None, auth: bool
) -> str:
    """A whole page: the header (who is signed in, and a sign-out button) and ``body``."""
    who = ""
    if auth and tenant is not None and csrf is not None:
        who = (
            f'<span class="who">tenant <b>{esc(tenant)}</b></span>'
            f'<form method="post" action="{base}/ui/logout" class="inline">'
            f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
            '<button type="submit">Sign out</button></form>'
        )
    elif not auth:
        who = '<span class="who warn">no authentication (--no-auth)</span>'
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)} · Zerda inspector</title>"
        f'<link rel="stylesheet" href="{base}/ui/static/inspector.css"></head><body>'
        f'<header><a class="brand" href="{base}/ui">Zerda inspector</a>{who}</header>'
        f"<main>{body}</main></body></html>"
    )


def login_page(*, base: str, csrf: str, next_path: str, problem: str | None) -> str:
    error = f'<p class="error" role="alert">{esc(problem)}</p>' if problem else ""
    body = (
        "<h1>Sign in</h1>"
        "<p>Paste an API key of this server (<code>zerda keys create --tenant NAME</code>). "
        "It is kept in an HTTP-only cookie of this site, for this browser session.</p>"
        f"{error}"
        f'<form method="post" action="{base}/ui/login" class="login">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        f'<input type="hidden" name="next" value="{esc(next_path)}">'
        '<label>API key <input type="password" name="key" autocomplete="off" required '
        'autofocus></label> <button type="submit">Sign in</button></form>'
    )
    return page("Sign in", body, base=base, tenant=None, csrf=None, auth=True)


def error_page(status: int, message: str, *, base: str) -> str:
    body = f'<h1>{status}</h1><p class="error" role="alert">{esc(message)}</p>'
    body += f'<p><a href="{base}/ui">Back to the sessions</a></p>'
    return body


def confirm_page(
    *, question: str, action: str, csrf: str, back: str, fields: Mapping[str, str], button: str
) -> str:
    """A confirmation: the question, a form that POSTs ``fields`` to ``action``, a way back."""
    hidden = "".join(
        f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in fields.items()
    )
    return (
        f'<h1>Confirm</h1><p class="question">{esc(question)}</p>'
        f'<form method="post" action="{esc(action)}" class="confirm">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">{hidden}'
        f'<button type="submit" class="danger">{esc(button)}</button> '
        f'<a href="{esc(back)}">Cancel</a></form>'
    )


def fork_page(*, here: str, csrf: str) -> str:
    """The fork's confirmation: the new session's id, asked for."""
    return (
        "<h1>Fork the session</h1><p>A copy of the whole log, as a new session you name.</p>"
        f'<form method="post" action="{esc(here)}/fork" class="confirm">'
        f'<input type="hidden" name="csrf" value="{esc(csrf)}">'
        '<label>New session id <input name="new_session_id" required></label> '
        f'<button type="submit">Fork</button> <a href="{esc(here)}">Cancel</a></form>'
    )


# -- the sessions page ------------------------------------------------------------------------


def sessions_page(
    sessions: Sequence[SessionInfo],
    *,
    base: str,
    prefix: str,
    page_number: int,
    pages: int,
    total: int,
) -> str:
    rows = "".join(
        "<tr>"
        f'<td><a href="{base}/ui/sessions/{quote(s.session_id, safe="")}">'
        f"{esc(s.session_id)}</a></td>"
        f'<td class="num">{s.messages:,}</td><td class="num">{s.turns:,}</td>'
        f"<td>{when(s.updated_at)}</td><td>{when(s.expires_at)}</td></tr>"
        for s in sessions
    )
    if not rows:
        rows = '<tr><td colspan="5" class="empty">No sessions here.</td></tr>'
    nav = _pager(f"{base}/ui", {"prefix": prefix} if prefix else {}, page_number, pages, "sessions")
    return (
        f"<h1>Sessions <small>{total:,}</small></h1>"
        f'<form method="get" action="{base}/ui" class="filter">'
        f'<label>Id starts with <input type="search" name="prefix" value="{esc(prefix)}">'
        '</label> <button type="submit">Filter</button></form>'
        '<table class="sessions"><thead><tr><th>session</th><th class="num">messages</th>'
        '<th class="num">turns</th>'
        f"<th>updated</th><th>expires</th></tr></thead><tbody>{rows}</tbody></table>{nav}"
    )


def _pager(path: str, query: Mapping[str, str], number: int, pages: int, what: str) -> str:
    if pages <= 1:
        return ""

    def link(n: int, label: str) -> str:
        return f'<a href="{esc(path)}?{esc(urlencode({**query, "page": n}))}">{label}</a>'

    newer = link(number - 1, "← newer") if number > 1 else '<span class="off">← newer</span>'
    older = link(number + 1, "older →") if number < pages else '<span class="off">older →</span>'
    return (
        f'<nav class="pager" aria-label="{esc(what)} pages">{newer} '
        f"<span>page {number} of {pages}</span> {older}</nav>"
    )


# -- the session page -------------------------------------------------------------------------


@dataclass(frozen=True)
class MemoryForm:
    """The memory the page shows the context of, as the query string chose it."""

    memory: str
    k: str = ""
    token_limit: str = ""
    reserve: str = ""
    counter: str = ""

    def query(self) -> dict[str, str]:
        values = {
            "memory": self.memory,
            "k": self.k,
            "token_limit": self.token_limit,
            "reserve": self.reserve,
            "counter": self.counter,
        }
        return {k: v for k, v in values.items() if v}


@dataclass(frozen=True)
class TurnView:
    """One stored turn as the page shows it, from the inspection: its number, its fate, its
    messages as stored and their tokens (as ``zerda show`` prints them), and what the
    context sends as it (``sent``, ``sent_tokens``: what the budget's turns part counts)."""

    number: int
    fate: str  # "context", "summary", "pending" or "evicted"
    messages: Sequence[MessageAccount]
    tokens: int
    sent: Sequence[MessageAccount]
    sent_tokens: int


@dataclass(frozen=True)
class SessionView:
    """What the session page shows: one inspection, cut to a page of turns, with each tool
    result placed under the call it answers (where the context sends it)."""

    session_id: str
    system: Sequence[MessageAccount]
    turns: Sequence[TurnView]
    summary: str | None
    inspection: Inspection
    with_context: bool  # the memory of the form was made (else: the log only)
    problem: str | None
    form: MemoryForm
    page_number: int
    pages: int
    # call message id -> the results shown under it; result id -> the turn whose call it is
    # shown under
    results: Mapping[str, Sequence[MessageAccount]]
    shown_in: Mapping[str, int]

    @property
    def total_messages(self) -> int:
        return int(self.inspection.stats["stored_messages"])

    @property
    def total_turns(self) -> int:
        return int(self.inspection.stats["stored_turns"])


def session_view(
    session_id: str,
    inspection: Inspection,
    number: int,
    form: MemoryForm,
    problem: str | None,
    *,
    with_context: bool,
) -> SessionView:
    """The ``number``-th page of turns, from the newest, of ``inspection`` (which holds at
    least that many of the newest turns)."""
    every = inspection.turns
    first = max(0, len(every) - number * TURNS_PER_PAGE)
    last = len(every) - (number - 1) * TURNS_PER_PAGE
    turns = [
        TurnView(t.number, t.fate, t.messages, t.tokens, t.sent, t.sent_tokens)
        for t in every[first : max(first, last)]
    ]
    results: dict[str, list[MessageAccount]] = {}
    shown_in: dict[str, int] = {}

    def place(result: MessageAccount, owner: MessageAccount, turn: int) -> None:
        results.setdefault(owner.message.id or "", []).append(result)
        shown_in[result.message.id or ""] = turn

    # A result the context sends comes right after its call's message: it goes under it.
    for turn in every:
        owner: MessageAccount | None = None
        for a in turn.sent:
            if a.message.tool_calls:
                owner = a
            elif a.message.role is Role.TOOL and owner is not None:
                place(a, owner, turn.number)
    # A result it does not send goes under the latest call with its id stored before it.
    latest: dict[str, tuple[MessageAccount, int]] = {}
    for turn in every:
        for a in turn.messages:
            for c in a.message.tool_calls:
                latest[c.id] = (a, turn.number)
            if a.message.role is Role.TOOL and (a.message.id or "") not in shown_in:
                found = latest.get(a.message.tool_call_id or "")
                if found is not None:
                    place(a, *found)
    summary = inspection.summary.text if inspection.summary is not None else None
    return SessionView(
        session_id=session_id,
        system=inspection.system,
        turns=turns,
        summary=summary,
        inspection=inspection,
        with_context=with_context,
        problem=problem,
        form=form,
        page_number=number,
        pages=max(1, math.ceil(int(inspection.stats["stored_turns"]) / TURNS_PER_PAGE)),
        results=results,
        shown_in=shown_in,
    )


def session_page(view: SessionView, *, base: str, csrf: str) -> str:
    here = f"{base}/ui/sessions/{quote(view.session_id, safe='')}"
    parts = [
        f"<h1>Session <code>{esc(view.session_id)}</code></h1>",
        f'<p class="facts">{_counted(view.total_messages, "message")} in '
        f"{_counted(view.total_turns, 'turn')} · "
        f'<a href="{base}/ui">all sessions</a></p>',
        _actions(here),
        _memory_form(here, view.form),
    ]
    if view.problem:
        parts.append(f'<p class="error" role="alert">{esc(view.problem)}</p>')
    if view.with_context:
        parts.append(_context_summary(view))
    parts.append(_turn_chart(view))
    nav = _pager(here, view.form.query(), view.page_number, view.pages, "turns")
    parts.append(nav)
    if view.system:
        parts.append('<section class="pinned"><h2>Pinned</h2>')
        parts.extend(_message(a, view, here) for a in view.system)
        parts.append("</section>")
    if view.summary is not None:
        covered = view.inspection.fates()["summary"]
        parts.append(
            '<section class="summary"><h2>Summary in the context '
            f"<small>turns 1 to {covered:,}</small></h2>"
            f"<p>{esc(view.summary)}</p></section>"
        )
    for turn in view.turns:
        parts.append(_turn(turn, view, here))
    parts.append(nav)
    return "".join(parts)


def _actions(here: str) -> str:
    return (
        '<nav class="actions" aria-label="session actions">'
        f'<a class="button" href="{here}/confirm?action=pop">Pop the newest turn</a> '
        f'<a class="button" href="{here}/confirm?action=fork">Fork…</a> '
        f'<a class="button danger" href="{here}/confirm?action=delete">Delete the session</a>'
        "</nav>"
    )


def _memory_form(here: str, form: MemoryForm) -> str:
    options = "".join(
        f'<option value="{k}"{" selected" if k == form.memory else ""}>{k}</option>'
        for k in _MEMORY_KINDS
    )
    return (
        f'<form method="get" action="{here}" class="memory">'
        f'<label>memory <select name="memory">{options}</select></label> '
        f'<label>k <input name="k" inputmode="numeric" size="4" value="{esc(form.k)}"></label> '
        '<label>token limit <input name="token_limit" inputmode="numeric" size="7" '
        f'value="{esc(form.token_limit)}"></label> '
        '<label>reserve <input name="reserve" inputmode="numeric" size="5" '
        f'value="{esc(form.reserve)}"></label> '
        f'<label>counter <input name="counter" size="12" value="{esc(form.counter)}" '
        'placeholder="server default"></label> '
        '<button type="submit">Show the context</button></form>'
    )


_FATE_WORDS = {
    "context": "in the context",
    "summary": "in the summary",
    "pending": "waiting for its fold",
    "evicted": "evicted",
}


def _context_summary(view: SessionView) -> str:
    inspection = view.inspection
    stats: Mapping[str, Any] = inspection.stats
    fates = inspection.fates()
    tokens = inspection.tokens
    facts = [
        f"<dt>messages in the context</dt><dd>{len(inspection.context):,}</dd>",
        f"<dt>turns in the context</dt><dd>{fates['context']:,}</dd>",
    ]
    if fates["summary"] or view.summary is not None:
        facts.append(f"<dt>turns in the summary</dt><dd>{fates['summary']:,}</dd>")
    if fates["pending"]:
        facts.append(
            f"<dt>turns waiting for their fold</dt><dd>{fates['pending']:,} (the summarizer "
            f"failed: {esc(stats.get('summary_error') or 'unknown')})</dd>"
        )
    facts.append(f"<dt>turns evicted</dt><dd>{fates['evicted']:,}</dd>")
    if tokens.budget is not None:
        reserve = int(stats.get("reserve_tokens", 0))
        of = f" (the limit {stats.get('token_limit', 0):,} less {reserve:,} reserved for the reply)"
        facts.append(
            f"<dt>tokens</dt><dd>{tokens.total:,} of {tokens.budget:,}{of if reserve else ''}</dd>"
        )
    else:
        facts.append(f"<dt>tokens</dt><dd>{tokens.total:,} ({esc(inspection.counter)})</dd>")
    if stats.get("truncated"):
        facts.append(f"<dt>shortened</dt><dd>{stats.get('truncated_tokens', 0):,} tokens cut</dd>")
    repairs = {k: v for k, v in (stats.get("repairs") or {}).items() if v}
    repaired = ", ".join(f"{k.replace('_', ' ')}: {v}" for k, v in repairs.items()) or "none"
    facts.append(f'<dt>repairs</dt><dd class="repairs">{esc(repaired)}</dd>')
    return (
        '<section class="context"><h2>The context</h2>'
        f'<dl class="facts">{"".join(facts)}</dl>{_budget_bar(view)}</section>'
    )


_PART_COLOURS = (("system", "#7a5af8"), ("summary", "#d97706"), ("tools", "#0891b2"))


def _budget_bar(view: SessionView) -> str:
    """The budget as one bar: system, summary, tools and turns, then what is left."""
    tokens = view.inspection.tokens
    stats: Mapping[str, Any] = view.inspection.stats
    limit = stats.get("token_limit")
    if tokens.budget is None or not isinstance(limit, int) or limit <= 0:
        return ""
    width = 800
    reserve = int(stats.get("reserve_tokens", 0))
    segments = [*_PART_COLOURS, ("turns", "#16a34a")]
    x = 0.0
    rects = []
    legend = []
    for name, colour in segments:
        part = int(getattr(tokens, name))
        w = width * part / limit
        if w > 0:
            rects.append(
                f'<rect x="{x:.1f}" y="0" width="{w:.1f}" height="24" fill="{colour}">'
                f"<title>{name}: {part:,} tokens</title></rect>"
            )
        legend.append(
            f'<li><svg width="10" height="10" aria-hidden="true"><rect width="10" height="10" '
            f'fill="{colour}"/></svg> {name} {part:,}</li>'
        )
        x += w
    legend.append(f"<li>reply priming {tokens.reply_priming:,}</li>")
    if reserve:
        w = width * reserve / limit
        rects.append(
            f'<rect x="{width - w:.1f}" y="0" width="{w:.1f}" height="24" fill="#cbd5e1">'
            f"<title>reserved for the reply: {reserve:,} tokens</title></rect>"
        )
        legend.append(f"<li>reserved {reserve:,}</li>")
    return (
        f'<figure class="budget"><svg viewBox="0 0 {width} 24" role="img" '
        f'aria-label="token budget by part" preserveAspectRatio="none">'
        f'<rect x="0" y="0" width="{width}" height="24" fill="#f1f5f9"/>{"".join(rects)}</svg>'
        f'<figcaption><ul class="legend">{"".join(legend)}</ul></figcaption></figure>'
    )


def _turn_chart(view: SessionView) -> str:
    """Tokens per turn on this page, coloured by each turn's fate."""
    turns = view.turns
    if not turns:
        return ""
    width, height = 800, 120
    most = max(t.tokens for t in turns) or 1
    step = width / len(turns)
    bars = []
    start: float | None = None
    first_kept = 0
    for i, turn in enumerate(turns):
        h = max(1.0, (height - 20) * turn.tokens / most)
        x = i * step
        if turn.fate == "context" and start is None:
            start, first_kept = x, turn.number
        bars.append(
            f'<rect class="{turn.fate}" x="{x + step * 0.1:.1f}" y="{height - h:.1f}" '
            f'width="{step * 0.8:.1f}" height="{h:.1f}">'
            f"<title>turn {turn.number}: {turn.tokens:,} tokens "
            f"({_FATE_WORDS[turn.fate]})</title></rect>"
        )
    marker = ""
    if start is not None:
        marker = (
            f'<line x1="{start:.1f}" y1="0" x2="{start:.1f}" y2="{height}" class="start"/>'
            f'<a href="#turn-{first_kept}"><text x="{start + 4:.1f}" y="12" class="start">'
            "context starts ↓</text></a>"
        )
    keys = "".join(
        f'<span class="key {fate}">{words}</span> ' for fate, words in _FATE_WORDS.items()
    )
    return (
        '<figure class="turns"><svg viewBox="0 0 800 120" role="img" '
        f'aria-label="tokens per turn">{"".join(bars)}{marker}</svg>'
        f"<figcaption>Tokens per turn, turns {turns[0].number} to {turns[-1].number}: "
        f"{keys.strip()}</figcaption></figure>"
    )


def _turn(turn: TurnView, view: SessionView, here: str) -> str:
    parts = []
    for a in turn.messages:
        m = a.message
        shown_in = view.shown_in.get(m.id or "") if m.role is Role.TOOL else None
        if shown_in is None:
            parts.append(_message(a, view, here))
        elif shown_in != turn.number:  # stored here, shown under its call in another turn
            parts.append(
                f'<p class="moved">↑ a result of <code>{esc(m.tool_call_id)}</code> stored '
                f"here ({esc((m.id or '')[-8:])}) is shown under its call, in "
                f'<a href="#turn-{shown_in}">turn {shown_in}</a></p>'
            )
    sent = f", {turn.sent_tokens:,} sent" if turn.fate == "context" else ""
    return (
        f'<section class="turn {turn.fate}" id="turn-{turn.number}">'
        f"<h2>Turn {turn.number} <small>{turn.tokens:,} tokens{sent} · "
        f"{_FATE_WORDS[turn.fate]}</small></h2>{''.join(parts)}</section>"
    )


def _message(a: MessageAccount, view: SessionView, here: str) -> str:
    m = a.message
    classes = ["message", m.role.value, "in" if a.in_context else "out"]
    cut = [r for r in a.repairs if r.kind == "truncated"]
    if cut:
        classes.append("shortened")
    badges = "".join(
        f' <span class="badge">{esc(r.describe())}</span>'
        for r in a.repairs
        if r.kind not in ("dropped_unanswered_calls", "renamed_call_ids")  # on their calls
    )
    delete = ""
    if m.id is not None:
        delete = (
            f'<a class="small" href="{here}/confirm?action=delete-message&amp;message='
            f'{esc(quote(m.id, safe=""))}">delete</a>'
        )
    results = view.results.get(m.id or "", ())
    calls = "".join(
        _call(c, a, [r for r in results if r.message.tool_call_id == c.id]) for c in m.tool_calls
    )
    answered = ""
    if m.role is Role.TOOL:
        answered = f' <span class="meta">result of <code>{esc(m.tool_call_id)}</code></span>'
    tokens = f"{a.tokens:,} tokens" + (
        f", {a.sent_tokens:,} sent" if a.in_context and a.sent_tokens != a.tokens else ""
    )
    return (
        f'<article class="{" ".join(classes)}" id="m-{esc(m.id or "")}">'
        f'<header><span class="role">{esc(m.role.value)}</span>{answered}{badges} '
        f'<span class="meta"><code title="{esc(m.id or "")}">{esc((m.id or "")[-8:])}</code> · '
        f"{tokens} · {when(m.created_at)}</span> {delete}</header>"
        f"{_content(m.content)}{calls}</article>"
    )


def _call(call: ToolCall, owner: MessageAccount, results: Sequence[MessageAccount]) -> str:
    arguments = call.arguments
    with contextlib.suppress(ValueError):  # arguments that are not JSON show as they are
        arguments = json.dumps(json.loads(arguments), indent=1, ensure_ascii=False)
    notes = [r for r in owner.repairs if r.call_id == call.id]
    removed = any(r.kind == "dropped_unanswered_calls" for r in notes)
    badges = "".join(f' <span class="badge">{esc(r.describe())}</span>' for r in notes)
    answers = []
    for result in results:
        where = "in" if result.in_context else "out"
        marks = "".join(f' <span class="badge">{esc(r.describe())}</span>' for r in result.repairs)
        answers.append(
            f'<div class="result {where}" id="m-{esc(result.message.id or "")}">'
            f'<span class="role">result</span>{marks} <span class="meta"><code>'
            f"{esc((result.message.id or '')[-8:])}</code> · {result.tokens:,} tokens</span>"
            f"{_content(result.message.content)}</div>"
        )
    if not answers:
        answers.append('<div class="result missing">no result stored</div>')
    state = " removed" if removed else ""
    return (
        f'<div class="call{state}"><div class="call-head">→ <code>{esc(call.name)}</code> '
        f'<span class="meta">{esc(call.id)}</span>{badges}</div>'
        f"<pre>{esc(_clip(arguments))}</pre>{''.join(answers)}</div>"
    )


def _clip(text: str) -> str:
    if len(text) <= _TEXT_SHOWN:
        return text
    return f"{text[:_TEXT_SHOWN]}… [{len(text) - _TEXT_SHOWN:,} more characters]"


def _content(content: str | tuple[Any, ...] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return f'<div class="text">{esc(_clip(content))}</div>'
    return "".join(_part(p) for p in content)


def _part(part: object) -> str:
    if isinstance(part, TextPart):
        return f'<div class="text">{esc(_clip(part.text))}</div>'
    if isinstance(part, ImagePart):
        url = part.url or ""
        if url.startswith("data:image/"):
            return f'<img class="thumb" src="{esc(url)}" alt="an image in the message">'
        where = url or f"file {part.file_id}"
        return f'<div class="part">image: <code>{esc(_clip(where))}</code></div>'
    if isinstance(part, FilePart):
        name = part.filename or part.file_id or part.url or "a file"
        return f'<div class="part">file: <code>{esc(name)}</code></div>'
    if isinstance(part, AudioPart):
        return f'<div class="part">audio ({esc(part.format)})</div>'
    if isinstance(part, ReasoningPart):
        return (
            f'<details class="part"><summary>reasoning</summary>'
            f"<div>{esc(_clip(part.text or ''))}</div></details>"
        )
    return f'<div class="part">{esc(type(part).__name__)}</div>'
