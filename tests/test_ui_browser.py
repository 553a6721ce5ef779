"""The inspector at ``/ui`` as a real browser renders it: headless Chromium over a live server.

A ``--no-auth`` app over a SQLite file holds a long session (40 Taskmaster-4 coffee dialogs
played one after another, recorded through a memory), a few one-dialog sessions, and a short
hostile one (an image part, markup in the text). Chromium's ``--dump-dom`` gives the DOM it
built, which is checked against the library's own answers (the sessions' counts, the context
of a 1,500-token memory); its ``--screenshot`` refreshes ``docs/inspector/*.png`` on every run.

Needs Debian's ``chromium`` (``apt-get install chromium``): without it the test skips, or fails
under ``ZERDA_REQUIRE_SERVICES=1`` (``.ci/run`` installs it).
"""

from __future__ import annotations

import dataclasses
import gzip
import itertools
import json
import os
import shutil
import struct
import subprocess
import zlib
from base64 import b64encode
from collections.abc import Iterator
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")

from starlette.testclient import TestClient

from _conversations import scan_turns
from services import REQUIRED
from test_serve import TOOL_TURN, Live
from zerda import ApproxCounter, ConversationTokenBufferMemory, Message
from zerda.server import create_app
from zerda.stores import InMemoryStore, SQLiteStore

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT.parent / "shared" / "data" / "taskmaster4-coffee.jsonl.gz"
SHOTS = ROOT / "docs" / "inspector"
LONG = "taskmaster-long"
HOSTILE = "hostile"
REPAIRED = "repaired"
SCRIPT = "<script>alert(1)</script>"
ATTRIBUTE = '"><img src=x onerror=alert(2)>'
LIMIT = 1500
# A fixed clock and fixed message ids: the pages, and so the screenshots, are the same on
# every run unless the inspector changes.
T0 = 1_767_225_600.0  # 2026-01-01 00:00 UTC
WIDTH = 1280


def chromium() -> str:
    """The path of Debian's chromium, or skip (fail under ZERDA_REQUIRE_SERVICES=1)."""
    path = shutil.which("chromium")
    if path is None:
        message = (
            "chromium is not installed, and the inspector's browser test drives it: install "
            "Debian's chromium (apt-get install chromium)"
        )
        if REQUIRED:
            pytest.fail(f"{message}; ZERDA_REQUIRE_SERVICES=1 does not let it skip", pytrace=False)
        pytest.skip(message)
    return path


# -- the DOM Chromium dumps, as a tree ----------------------------------------------------------

_VOID = {
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
    "track", "wbr",
}  # fmt: skip


@dataclass(eq=False)
class Node:
    tag: str
    attrs: dict[str, str]
    parent: Node | None = None
    children: list[Node | str] = field(default_factory=list)

    @property
    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def iter(self) -> Iterator[Node]:
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def select(self, tag: str, *classes: str) -> list[Node]:
        """The elements under this one (itself included) named ``tag`` with all ``classes``."""
        return [n for n in self.iter() if n.tag == tag and set(classes) <= n.classes]

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def inside(self, tag: str, *classes: str) -> Node | None:
        """The nearest ancestor named ``tag`` with all ``classes``."""
        node = self.parent
        while node is not None and not (node.tag == tag and set(classes) <= node.classes):
            node = node.parent
        return node


class _TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs}, self.stack[-1])
        self.stack[-1].children.append(node)
        if tag not in _VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in _VOID:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self.stack) - 1, 0, -1):
            if self.stack[i].tag == tag:
                del self.stack[i:]
                return

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(data)


def parse(dom: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(dom)
    builder.close()
    return builder.root


# -- the data -----------------------------------------------------------------------------------


def tiny_png(width: int = 24, height: int = 24, rgb: tuple[int, int, int] = (217, 119, 6)) -> bytes:
    """A valid PNG of one colour, written out by hand (8-bit RGB, no filter)."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data) & 0xFFFFFFFF
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


IMAGE_URL = "data:image/png;base64," + b64encode(tiny_png()).decode("ascii")


def dialogs(count: int) -> list[list[dict[str, Any]]]:
    """The first ``count`` Taskmaster dialogs; where the shared data set is not (a clone of
    its own, as CI may run), dialogs of the same shape made up here, so the browser still runs
    (the screenshots are then not refreshed: they show the real dialogs)."""
    if not DATA.exists():
        return [made_up_dialog(i) for i in range(count)]
    with gzip.open(DATA, "rt", encoding="utf-8") as lines:
        return [json.loads(line)["messages"] for line in itertools.islice(lines, count)]


def made_up_dialog(i: int) -> list[dict[str, Any]]:
    """An order with a menu lookup, a tool call per item and a closing answer."""
    call = f"call_{i:04d}"
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": f"Two oat lattes and a scone for order {i}, please."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": f"{call}_{n}",
                    "type": "function",
                    "function": {"name": "add_order_item", "arguments": json.dumps(item)},
                }
                for n, item in enumerate(({"item": "oat latte", "qty": 2}, {"item": "scone"}))
            ],
        },
        *(
            {"role": "tool", "tool_call_id": f"{call}_{n}", "content": json.dumps({"ok": n})}
            for n in range(2)
        ),
        {"role": "assistant", "content": f"Order {i}: two oat lattes and a scone. Anything else?"},
    ]
    if i % 2:
        messages += [
            {"role": "user", "content": "That is all, thanks."},
            {"role": "assistant", "content": "Enjoy!"},
        ]
    return messages


def stamped(dicts: list[dict[str, Any]], tag: str, start: float) -> list[Message]:
    """The messages of ``dicts`` with ids and times of their own (a minute apart)."""
    return [
        dataclasses.replace(Message.from_openai(d), id=f"{tag}-{i:04d}", created_at=start + 60 * i)
        for i, d in enumerate(dicts)
    ]


@dataclass
class Store:
    """The store the pages show, and what the library says they should show."""

    path: Path
    expected: dict[str, tuple[int, int]]  # session id -> (messages, turns)
    context: list[Message]  # the library's context of LONG for a 1,500-token memory


def fill(path: Path) -> Store:
    source = dialogs(46)
    expected: dict[str, tuple[int, int]] = {}
    with SQLiteStore(path, clock=lambda: T0 + 86_400) as store:
        # The long session, recorded dialog by dialog through the memory whose context is shown.
        memory = ConversationTokenBufferMemory(
            LIMIT, token_counter=ApproxCounter(), store=store, session_id=LONG
        )
        messages = stamped([m for d in source[:40] for m in d], "tm", T0)
        at = 0
        for dialog in source[:40]:
            memory.add_messages(messages[at : at + len(dialog)])
            at += len(dialog)
        expected[LONG] = (len(messages), len(scan_turns(messages)))
        context = ConversationTokenBufferMemory(
            LIMIT, token_counter=ApproxCounter(), store=store, session_id=LONG
        ).get_context()

        for n, dialog in enumerate(source[40:], 1):
            session = f"order-{n}"
            one = stamped(dialog, session, T0 + 3600 * n)
            store.append(session, one)
            expected[session] = (len(one), len(scan_turns(one)))

        hostile = stamped(
            [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is in this picture?"},
                        {"type": "image_url", "image_url": {"url": IMAGE_URL}},
                    ],
                },
                {"role": "assistant", "content": "An orange square."},
                {"role": "user", "content": SCRIPT},
                {"role": "assistant", "content": ATTRIBUTE},
            ],
            HOSTILE,
            T0 + 7200,
        )
        store.append(HOSTILE, hostile)
        expected[HOSTILE] = (len(hostile), len(scan_turns(hostile)))

        repaired = stamped(repaired_order(source[0]), REPAIRED, T0 + 10_800)
        store.append(REPAIRED, repaired)
        expected[REPAIRED] = (len(repaired), len(scan_turns(repaired)))
    return Store(path, expected, context)


def repaired_order(dialog: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A dialog as a hurried log leaves it: the user speaks again before the first tool
    result is stored, a second result for the same call comes in, and a call that never
    got an answer, beside a call of its own in one message."""
    first = next(i for i, m in enumerate(dialog) if m.get("tool_calls"))
    call = dialog[first]
    end = first + 1
    while end < len(dialog) and dialog[end]["role"] == "tool":
        end += 1
    results = dialog[first + 1 : end]  # the call message's results, stored right after it
    ghost = {
        "id": "call_never_answered",
        "type": "function",
        "function": {"name": "check_loyalty_card", "arguments": "{}"},
    }
    return [
        *dialog[:first],
        {**call, "tool_calls": [*call["tool_calls"], ghost]},
        {"role": "user", "content": "Oh, and make it decaf, please."},
        *results,
        dict(results[0]),  # the first result, stored twice
        *dialog[end:],
    ]


# -- Chromium -------------------------------------------------------------------------------------


def start(browser: str, args: list[str], profile: Path) -> subprocess.Popen[str]:
    command = [
        browser,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        f"--user-data-dir={profile}",
        *args,
    ]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def browse(
    browser: str, dumps: dict[str, str], shots: dict[str, tuple[str, int]], folder: Path
) -> dict[str, str]:
    """The DOM of each of ``dumps`` (name: URL), and a screenshot ``folder/NAME.png`` of each
    of ``shots`` (name: URL and window height). Every browser runs at once: each spends most
    of its second starting up."""
    running: dict[str, subprocess.Popen[str]] = {}
    try:
        for name, url in dumps.items():
            running[name] = start(browser, ["--dump-dom", url], folder / f"profile-{name}")
        for name, (url, height) in shots.items():
            args = [f"--window-size={WIDTH},{height}", f"--screenshot={folder / name}.png", url]
            running[f"{name}.png"] = start(browser, args, folder / f"profile-{name}.png")
        out = {}
        for name, process in running.items():
            try:
                out[name], err = process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"chromium did not finish in 60 s: {process.args}")
            assert process.returncode == 0, f"chromium exited {process.returncode}: {err[-2000:]}"
        return {name: out[name] for name in dumps}
    finally:
        for process in running.values():
            if process.poll() is None:
                process.kill()
                process.communicate()


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n"), f"{path} is not a PNG"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def facts(dom: Node) -> dict[str, str]:
    """The context's facts as the page states them (dl.facts), term to value."""
    (listing,) = dom.select("dl", "facts")
    terms = [t.text() for t in listing.select("dt")]
    return dict(zip(terms, [d.text() for d in listing.select("dd")], strict=True))


# -- the test -----------------------------------------------------------------------------------


def test_the_inspector_as_chromium_renders_it(tmp_path: Path) -> None:
    # One test, so that pytest-xdist runs one round of browsers, not one per worker.
    browser = chromium()
    data = fill(tmp_path / "inspector.sqlite3")
    with SQLiteStore(data.path) as store:
        live = Live(store, auth=False, counter="approx")
        try:
            long_url = f"{live.url}/ui/sessions/{LONG}?memory=token&token_limit={LIMIT}"
            repaired_url = f"{live.url}/ui/sessions/{REPAIRED}?memory=token&token_limit={LIMIT}"
            doms = browse(
                browser,
                {
                    "sessions": f"{live.url}/ui",
                    "long": long_url,
                    "hostile": f"{live.url}/ui/sessions/{HOSTILE}",
                    "repaired": repaired_url,
                },
                {
                    "sessions": (f"{live.url}/ui", 720),
                    "session": (long_url, 1800),
                    "repaired": (repaired_url, 1600),
                },
                tmp_path,
            )
        finally:
            live.close()
    SHOTS.mkdir(parents=True, exist_ok=True)
    for name in ("sessions", "session", "repaired"):
        shot = tmp_path / f"{name}.png"
        assert png_size(shot)[0] == WIDTH
        if not DATA.exists():
            continue  # made-up dialogs: the docs keep the real ones
        interim = SHOTS / f".{name}.png.{os.getpid()}"
        shutil.copyfile(shot, interim)
        os.replace(interim, SHOTS / f"{name}.png")  # whole, even if a second run writes too

    check_sessions_page(parse(doms["sessions"]), data)
    check_long_session(parse(doms["long"]), data)
    check_hostile_session(doms["hostile"])
    check_repaired_session(parse(doms["repaired"]), data.path)


def check_repaired_session(dom: Node, path: Path) -> None:
    """The repairs as the library's inspection tells them, drawn where they happen: the
    result stored after the interjection inside its call's message, the duplicate not sent,
    the unanswered call marked."""
    with SQLiteStore(path) as store:
        memory = ConversationTokenBufferMemory(
            LIMIT, token_counter=ApproxCounter(), store=store, session_id=REPAIRED
        )
        context = memory.get_context()
        stats = memory.get_memory_stats()
    repairs = {k: n for k, n in stats["repairs"].items() if n}
    # Every result of the call moved back (one with Taskmaster's dialogs, two made up).
    assert repairs.pop("moved_results") >= 1
    assert repairs == {"dropped_duplicate_results": 1, "dropped_unanswered_calls": 1}
    repairs = {k: n for k, n in stats["repairs"].items() if n}
    stated = facts(dom)
    assert stated["repairs"] == ", ".join(f"{k.replace('_', ' ')}: {n}" for k, n in repairs.items())
    moved = next(m for m in context if m.tool_call_id)  # the first result the context sends
    (result,) = [n for n in dom.iter() if n.attrs.get("id") == f"m-{moved.id}"]
    assert "in" in result.classes
    call = result.inside("article", "message")
    assert call is not None, "the moved result is drawn inside its call's message"
    assert "in" in call.classes
    (removed,) = dom.select("div", "call", "removed")
    assert "check_loyalty_card" in removed.text()
    assert "not sent: it has no result" in removed.text()
    duplicates = [
        n for n in dom.select("div", "result", "out") if "already has a result" in n.text()
    ]
    assert len(duplicates) == 1


def check_sessions_page(dom: Node, data: Store) -> None:
    (table,) = dom.select("table", "sessions")
    listed = {}
    for row in table.select("tr")[1:]:
        cells = row.select("td")
        (link,) = cells[0].select("a")
        assert link.attrs["href"] == f"/ui/sessions/{link.text()}"
        listed[link.text()] = (cells[1].text(), cells[2].text())
    assert listed == {s: (f"{m:,}", f"{t:,}") for s, (m, t) in data.expected.items()}
    assert f"Sessions {len(data.expected)}" in dom.select("h1")[0].text()


def check_long_session(dom: Node, data: Store) -> None:
    context = data.context
    assert 0 < len(context) < data.expected[LONG][0]
    shown_in = dom.select("article", "message", "in")
    # A tool result is drawn inside its call (div.result.in|out), not as an article of its
    # own: the articles marked "in" are the context's other messages, the results marked "in"
    # its tool messages; together, the context, message for message.
    results_in = dom.select("div", "result", "in")
    assert len(shown_in) == sum(1 for m in context if not m.tool_call_id)
    assert len(results_in) == sum(1 for m in context if m.tool_call_id)
    assert [n.attrs["id"] for n in dom.iter() if n in {*shown_in, *results_in}] == [
        f"m-{m.id}" for m in context
    ]
    for result in results_in:  # a result in the context, inside its call's message in it too
        call = result.inside("article", "message")
        assert call is not None
        assert "in" in call.classes
    assert all(a.select("span", "role") for a in dom.select("article", "message"))

    # Whole turns: a message in the context sits in a turn in the context, never an evicted one.
    for article in shown_in:
        turn = article.inside("section", "turn")
        assert turn is not None
        assert "context" in turn.classes, turn.attrs
    evicted = dom.select("section", "turn", "evicted")
    assert evicted, "a 1,500-token budget evicts older turns of this session"
    assert not any(a.select("article", "message", "in") for a in evicted)
    assert all(s.select("h2")[0].text().startswith("Turn ") for s in dom.select("section", "turn"))

    kept, stored = len(scan_turns(context)), data.expected[LONG][1]
    stated = facts(dom)
    assert stated["turns in the context"] == f"{kept:,}"
    assert stated["turns evicted"] == f"{stored - kept:,}"
    # Page 1 holds the newest 50 turns: those kept, then the evicted ones before them.
    assert len(evicted) == min(stored, 50) - kept
    assert stated["tokens"].endswith(f"of {LIMIT:,}")  # no reserve: the budget is the limit
    assert stated["repairs"] == "none"
    assert dom.select("figure", "budget")[0].select("svg")
    (chart,) = dom.select("figure", "turns")
    assert chart.select("line", "start"), "the chart marks where the context starts"
    assert chart.select("rect", "evicted")
    assert chart.select("rect", "context")


def check_hostile_session(raw: str) -> None:
    dom = parse(raw)
    assert not dom.select("script"), "the page holds a script element"
    texts = [t.text() for t in dom.select("div", "text")]
    assert SCRIPT in texts
    assert ATTRIBUTE in texts
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in raw
    (image,) = dom.select("img")  # the thumbnail, and no image made of the text
    assert "thumb" in image.classes
    assert image.attrs["src"] == IMAGE_URL
    handlers = [(n.tag, a) for n in dom.iter() for a in n.attrs if a.startswith("on")]
    assert handlers == []


def test_the_facts_count_the_messages_in_the_context() -> None:
    # The page's own HTML (no browser needed): one turn of four messages, all in the context.
    store = InMemoryStore()
    memory = ConversationTokenBufferMemory(2000, token_counter=ApproxCounter(), store=store)
    memory.add_messages([Message.from_openai(m) for m in TOOL_TURN])
    with TestClient(create_app(store, auth=False, counter="approx")) as http:
        page = http.get(f"/ui/sessions/{memory.session_id}")
    assert page.status_code == 200, page.text
    stated = facts(parse(page.text))
    assert stated["messages in the context"] == f"{len(memory.get_context()):,}"
