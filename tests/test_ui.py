"""The inspector at /ui over HTTP: sign-in and its cookie, tenants, CSRF, escaping, paging, and
the context it highlights against what the library returns."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest

from test_serve import TOOL_TURN, Live, key_for
from zerda import ApproxCounter, Message, group_turns
from zerda.memory import (
    ConversationBufferMemory,
    ConversationBufferWindowMemory,
    ConversationTokenBufferMemory,
)
from zerda.server._keys import KeyRing
from zerda.server._ui import COOKIE, TURNS_PER_PAGE
from zerda.stores import InMemoryStore, Store

PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUHEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhf"
    "DwAChwGA60e6kgAAAABJRU5ErkJggg=="
)
HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


class Elements(HTMLParser):
    """Every start tag of a page, with its attributes, and the page's text."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str]]] = []
        self.text: list[str] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, {k: v or "" for k, v in attrs}))

    def handle_data(self, data: str) -> None:
        self.text.append(data)

    def having(self, tag: str, *classes: str) -> list[dict[str, str]]:
        return [
            attrs
            for name, attrs in self.tags
            if name == tag and set(classes) <= set(attrs.get("class", "").split())
        ]

    def csrf(self) -> str:
        return next(a["value"] for t, a in self.tags if t == "input" and a.get("name") == "csrf")


@pytest.fixture
def serve() -> Iterator[Callable[..., Live]]:
    """Start servers (create_app's options; an in-memory store by default); all stop after."""
    started: list[Live] = []

    def start(store: Store | None = None, **options: Any) -> Live:
        started.append(Live(InMemoryStore() if store is None else store, **options))
        return started[-1]

    yield start
    for live in started:
        live.close()


def browser(live: Live) -> httpx.Client:
    return httpx.Client(base_url=live.url, timeout=20, follow_redirects=False)


def sign_in(http: httpx.Client, key: str) -> httpx.Response:
    form = Elements(http.get("/ui/login").text)
    return http.post("/ui/login", data={"key": key, "csrf": form.csrf(), "next": "/ui"})


def coffee_turns(n: int, tag: str = "") -> list[Message]:
    messages = []
    for i in range(n):
        messages.append(Message("user", f"{tag}order {i}: two oat lattes for table {i}, please"))
        if i % 3 == 0:
            messages.append(
                Message.from_openai(
                    {
                        "role": "assistant",
                        "content": None,
                        "tool_calls": [
                            {
                                "id": f"{tag}c{i}",
                                "type": "function",
                                "function": {"name": "add_item", "arguments": '{"qty": 2}'},
                            }
                        ],
                    }
                )
            )
            messages.append(Message("tool", f'{{"order": {i}}}', tool_call_id=f"{tag}c{i}"))
        messages.append(Message("assistant", f"Order {i} is in."))
    return messages


def stored_session(store: Store, session: str, messages: list[Message]) -> None:
    ConversationBufferMemory(store=store, session_id=session).add_messages(messages)


# -- signing in --------------------------------------------------------------------------------


def test_pages_ask_for_a_key_once_and_keep_it_in_a_strict_http_only_cookie(
    serve: Callable[..., Live],
) -> None:
    live = serve()
    key = key_for(live, "acme")
    with browser(live) as http:
        first = http.get("/ui/sessions/s1?memory=window&k=2")
        assert first.status_code == 303
        assert (
            first.headers["location"]
            == "/ui/login?next=%2Fui%2Fsessions%2Fs1%3Fmemory%3Dwindow%26k%3D2"
        )
        login = http.get(first.headers["location"])
        assert login.status_code == 200
        assert 'type="password" name="key"' in login.text
        assert 'name="next" value="/ui/sessions/s1?memory=window&amp;k=2"' in login.text

        wrong = sign_in(http, "zk_not_a_key")
        assert wrong.status_code == 401
        assert "not valid here" in wrong.text
        assert COOKIE not in http.cookies

        answer = sign_in(http, key)
        assert answer.status_code == 303
        cookie = answer.headers["set-cookie"]
        assert cookie.startswith(f"{COOKIE}={key};")
        flags = {part.strip().lower() for part in cookie.split(";")[1:]}
        assert {"httponly", "samesite=strict", "path=/ui"} <= flags
        assert "secure" not in flags  # plain http on loopback; https sets it
        assert answer.headers["location"] == "/ui"

        page = http.get("/ui")
        assert page.status_code == 200
        assert "tenant <b>acme</b>" in page.text

        out = http.post("/ui/logout", data={"csrf": Elements(page.text).csrf()})
        assert out.status_code == 303
        assert (
            "Max-Age=0" in out.headers["set-cookie"]
            or "expires=" in out.headers["set-cookie"].lower()
        )
        http.cookies.clear()
        assert http.get("/ui").status_code == 303


def test_sign_in_never_sends_the_browser_elsewhere(serve: Callable[..., Live]) -> None:
    live = serve()
    key = key_for(live, "acme")
    with browser(live) as http:
        token = Elements(http.get("/ui/login").text).csrf()
        for target in ("https://evil.example/", "//evil.example/ui", "/v1/sessions", "/ui\\x"):
            answer = http.post("/ui/login", data={"key": key, "csrf": token, "next": target})
            assert answer.headers["location"] == "/ui", target


def test_a_revoked_key_signs_the_browser_out(serve: Callable[..., Live]) -> None:
    live = serve()
    ring = KeyRing(live.store)
    key, record = ring.create("acme")
    with browser(live) as http:
        sign_in(http, key)
        assert http.get("/ui").status_code == 200
        ring.revoke(record.key_id)
        assert http.get("/ui").status_code == 303


def test_no_auth_servers_skip_the_sign_in(serve: Callable[..., Live]) -> None:
    live = serve(auth=False)
    stored_session(live.store, "open-session", coffee_turns(2))
    with browser(live) as http:
        page = http.get("/ui")
        assert page.status_code == 200
        assert "open-session" in page.text
        assert "no authentication" in page.text
        assert http.get("/ui/login").status_code == 303


# -- tenants and forms -----------------------------------------------------------------------


def test_a_tenant_sees_and_touches_only_its_own_sessions(serve: Callable[..., Live]) -> None:
    live = serve()
    alpha, beta = key_for(live, "alpha"), key_for(live, "beta")
    stored_session(live.store, "alpha:shared-name", coffee_turns(2, "a"))
    stored_session(live.store, "beta:shared-name", coffee_turns(2, "b"))
    stored_session(live.store, "beta:only-beta", coffee_turns(1, "b"))
    with browser(live) as http:
        sign_in(http, alpha)
        listing = http.get("/ui").text
        assert "shared-name" in listing
        assert "only-beta" not in listing
        page = http.get("/ui/sessions/shared-name?memory=buffer").text
        assert "aorder 0" in page
        assert "border 0" not in page
        assert http.get("/ui/sessions/only-beta").status_code == 404
        token = Elements(page).csrf()
        refused = http.post("/ui/sessions/only-beta/delete", data={"csrf": token})
        assert refused.status_code == 404
    assert ConversationBufferMemory(store=live.store, session_id="beta:only-beta").get_history()
    with browser(live) as http:
        sign_in(http, beta)
        assert "border 0" in http.get("/ui/sessions/shared-name?memory=buffer").text


def test_forms_without_the_token_or_from_another_origin_are_refused(
    serve: Callable[..., Live],
) -> None:
    live = serve()
    key = key_for(live, "acme")
    stored_session(live.store, "acme:s", coffee_turns(3))
    with browser(live) as http:
        sign_in(http, key)
        token = Elements(http.get("/ui/sessions/s").text).csrf()
        assert http.post("/ui/sessions/s/pop", data={"x": "1"}).status_code == 403
        assert http.post("/ui/sessions/s/pop", data={"csrf": "0" * 64}).status_code == 403
        other = http.post(
            "/ui/sessions/s/pop",
            data={"csrf": token},
            headers={"Origin": "https://evil.example"},
        )
        assert other.status_code == 403
        assert "cannot act here" in other.text
        as_json = http.post("/ui/sessions/s/pop", json={"csrf": token})
        assert as_json.status_code == 415
        # Another browser signed in with another key gets another token.
        with browser(live) as other_browser:
            sign_in(other_browser, key_for(live, "acme"))
            stolen = other_browser.post("/ui/sessions/s/pop", data={"csrf": token})
            assert stolen.status_code == 403
        memory = ConversationBufferMemory(store=live.store, session_id="acme:s")
        assert len(memory.get_history()) == len(coffee_turns(3))  # nothing was popped
        done = http.post("/ui/sessions/s/pop", data={"csrf": token}, headers={"Origin": live.url})
        assert done.status_code == 303
        assert len(memory.get_history()) == len(coffee_turns(3)) - 2


def test_actions_are_confirmed_then_posted(serve: Callable[..., Live]) -> None:
    live = serve()
    key = key_for(live, "acme")
    messages = coffee_turns(4)
    stored_session(live.store, "acme:s", messages)
    memory = ConversationBufferMemory(store=live.store, session_id="acme:s")
    call_message = memory.get_history()[1]
    assert call_message.tool_calls
    with browser(live) as http:
        sign_in(http, key)
        for action in ("pop", "delete", "fork", "delete-message"):
            page = http.get(f"/ui/sessions/s/confirm?action={action}&message={call_message.id}")
            assert page.status_code == 200
            assert 'method="post"' in page.text
        confirm = Elements(
            http.get(f"/ui/sessions/s/confirm?action=delete-message&message={call_message.id}").text
        )
        form = {a["name"]: a["value"] for t, a in confirm.tags if t == "input"}
        assert form["message"] == call_message.id
        assert http.post("/ui/sessions/s/delete-message", data=form).status_code == 303
        ids = [m.id for m in memory.get_history()]
        assert call_message.id not in ids
        assert len(ids) == len(messages) - 2  # the call took its result with it

        fork = Elements(http.get("/ui/sessions/s/confirm?action=fork").text)
        answer = http.post(
            "/ui/sessions/s/fork", data={"csrf": fork.csrf(), "new_session_id": "s-copy"}
        )
        assert answer.headers["location"] == "/ui/sessions/s-copy"
        assert http.get("/ui/sessions/s-copy").status_code == 200
        again = http.post(
            "/ui/sessions/s/fork", data={"csrf": fork.csrf(), "new_session_id": "s-copy"}
        )
        assert again.status_code == 409
        assert "s-copy" in again.text

        gone = http.post("/ui/sessions/s/delete", data={"csrf": fork.csrf()})
        assert gone.headers["location"] == "/ui"
        assert memory.get_history() == []
        assert http.get("/ui/sessions/s").status_code == 404
        assert http.get("/ui/sessions/s-copy/confirm?action=explode").status_code == 404


# -- what a page shows ------------------------------------------------------------------------


def test_message_text_is_escaped_everywhere(serve: Callable[..., Live]) -> None:
    live = serve(auth=False)
    hostile_call = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c<b>1",
                "type": "function",
                "function": {"name": "f", "arguments": HOSTILE},
            }
        ],
    }
    stored_session(
        live.store,
        "hostile",
        [
            Message("system", HOSTILE),
            Message("user", HOSTILE),
            Message.from_openai(hostile_call),
            Message("tool", HOSTILE, tool_call_id="c<b>1"),
            Message.from_openai(
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": HOSTILE},
                        {"type": "image_url", "image_url": {"url": PNG}},
                        {"type": "image_url", "image_url": {"url": 'https://x/"><script>'}},
                    ],
                }
            ),
        ],
    )
    with browser(live) as http:
        for path in ("/ui", "/ui/sessions/hostile?memory=buffer", "/ui?prefix=%3Cscript%3E"):
            page = http.get(path)
            assert page.status_code == 200, path
            parsed = Elements(page.text)
            assert not [t for t, _ in parsed.tags if t in ("script", "i", "b")], path
            assert not [a for t, a in parsed.tags if t == "img" and a.get("src") == "x"], path
        box = next(a for t, a in parsed.tags if t == "input" and a.get("name") == "prefix")
        assert box["value"] == "<script>"  # the filter box shows what was typed, as text
        session = Elements(http.get("/ui/sessions/hostile?memory=buffer").text)
        shown = "".join(session.text)
        assert shown.count('<script>alert("x")</script>') >= 5
        assert "hostile" in shown
        images = session.having("img", "thumb")
        assert [a["src"] for a in images] == [PNG]  # only data URLs load; a URL shows as text
        assert 'https://x/"><script>' in shown
        page = http.get("/ui/sessions/hostile")
        policy = page.headers["content-security-policy"]
        assert "default-src 'none'" in policy
        assert "script-src" not in policy  # no script may run
        assert page.headers["x-content-type-options"] == "nosniff"


def in_context_ids(page: str) -> set[str]:
    """The messages a page marks as in the context: messages, and results beside calls."""
    parsed = Elements(page)
    marked = parsed.having("article", "message", "in") + parsed.having("div", "result", "in")
    return {a["id"].removeprefix("m-") for a in marked}


@pytest.mark.parametrize(
    ("query", "memory"),
    [
        (
            "memory=token&token_limit=400",
            lambda s, st: ConversationTokenBufferMemory(
                400, token_counter=ApproxCounter(), store=st, session_id=s
            ),
        ),
        (
            "memory=token&token_limit=900&reserve=300",
            lambda s, st: ConversationTokenBufferMemory(
                900, reserve_tokens=300, token_counter=ApproxCounter(), store=st, session_id=s
            ),
        ),
        (
            "memory=window&k=3",
            lambda s, st: ConversationBufferWindowMemory(k=3, store=st, session_id=s),
        ),
        ("memory=buffer", lambda s, st: ConversationBufferMemory(store=st, session_id=s)),
    ],
    ids=["token-400", "token-900-reserve", "window-3", "buffer"],
)
def test_the_highlighted_context_is_the_librarys(
    serve: Callable[..., Live], query: str, memory: Callable[[str, Store], Any]
) -> None:
    store = InMemoryStore()
    stored_session(store, "s", [Message("system", "You take coffee orders."), *coffee_turns(12)])
    live = serve(store, auth=False)
    library = memory("s", store)
    context, stats = library.get_context_with_stats()
    with browser(live) as http:
        page = http.get(f"/ui/sessions/s?{query}").text
    assert in_context_ids(page) == {m.id for m in context}
    if "context_tokens" in stats:
        budget = stats["token_limit"] - stats["reserve_tokens"]
        assert f"{stats['context_tokens']:,} of {budget:,}" in page  # as zerda show says it
    evicted = len(Elements(page).having("section", "turn", "evicted"))
    kept = len(Elements(page).having("section", "turn", "context"))
    assert kept == len(group_turns([m for m in context if m.role != "system"]))
    assert evicted == 12 - kept
    assert ('class="start"' in page) is (kept > 0)


def test_repairs_and_shortening_are_shown(serve: Callable[..., Live]) -> None:
    store = InMemoryStore()
    stored_session(
        store,
        "repaired",
        [
            Message.from_openai(TOOL_TURN[0]),
            Message.from_openai(TOOL_TURN[1]),  # a call whose result never came
            Message("tool", "an orphan result", tool_call_id="nobody-called-me"),
            Message("assistant", "Hello"),
        ],
    )
    stored_session(store, "pasted", [Message("user", "Paste: " + "lorem ipsum " * 400)])
    live = serve(store, auth=False)
    with browser(live) as http:
        repaired = http.get("/ui/sessions/repaired?memory=buffer").text
        pasted = http.get("/ui/sessions/pasted?memory=token&token_limit=300").text
    assert "dropped orphan results: 1" in repaired
    assert "dropped unanswered calls: 1" in repaired
    assert "no result stored" in repaired
    assert re.search(r"[0-9,]+ tokens cut from its text", pasted)
    assert re.search(r"[0-9,]+ tokens cut</dd>", pasted)
    assert "partly in" not in pasted  # a shortened message is still in the context


def test_the_page_tells_what_zerda_show_and_the_stats_tell(serve: Callable[..., Live]) -> None:
    """The counts and the tokens are those of one inspection, as ``zerda show`` prints them
    and ``get_memory_stats()`` gives them: no message counted twice, no turn 3 tokens over,
    the turns' sent tokens adding up to the budget bar's; a moved result under its call, a
    removed call marked (issue #28)."""
    store = InMemoryStore()
    interjected = [
        Message("system", "You take coffee orders."),
        Message.from_openai(TOOL_TURN[0]),
        Message.from_openai(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "mul", "arguments": "{}"},
                    },
                    {
                        "id": "c9",
                        "type": "function",
                        "function": {"name": "div", "arguments": "{}"},
                    },
                ],
            }
        ),
        Message("user", "and 6 x 8?"),  # before the result: the context moves it back
        Message("tool", "42", tool_call_id="c1"),
        Message("assistant", "It is 42."),
    ]
    stored_session(store, "s", [*coffee_turns(3), *interjected])
    stored_session(store, "one", [Message("user", "hello")])
    live = serve(store, auth=False)
    with browser(live) as http:
        page = http.get("/ui/sessions/s?memory=token&token_limit=200&counter=approx").text
        lone = http.get("/ui/sessions/one").text
    memory = ConversationTokenBufferMemory(
        200, token_counter=ApproxCounter(), store=store, session_id="s"
    )
    stats = memory.get_memory_stats()
    inspection = memory.inspect()
    history = memory.get_history()
    assert f"{len(history)} messages in {stats['stored_turns']} turns" in page
    assert "1 message in 1 turn" in lone
    headers = re.findall(r"<h2>Turn (\d+) <small>([\d,]+) tokens(?:, ([\d,]+) sent)?", page)
    shown = {int(n): (int(t.replace(",", "")), s) for n, t, s in headers}
    for turn in inspection.turns:
        assert shown[turn.number][0] == sum(
            ApproxCounter().count_message(a.message) for a in turn.messages
        ), "a turn's tokens: its messages' as stored, as zerda show counts them"
    sent = sum(int(s.replace(",", "")) for _, s in shown.values() if s)
    assert sent == stats["tokens_by_part"]["turns"]
    assert f"turns {sent:,}</li>" in page  # the budget bar's turns part
    assert f"<dt>turns in the context</dt><dd>{stats['turns_in_context']}</dd>" in page
    assert f"<dt>turns evicted</dt><dd>{stats['turns_evicted']}</dd>" in page
    # The result stored after "and 6 x 8?" shows under its call, which is answered...
    call_block = page.split("<code>mul</code>", 1)[1].split('<div class="call', 1)[0]
    assert '<div class="result in"' in call_block
    assert "no result stored" not in call_block
    assert 'is shown under its call, in <a href="#turn-' in page
    # ...and the call that never got one is marked as not sent.
    assert '<div class="call removed">' in page
    assert "call c9 not sent: it has no result" in page


def test_turns_and_sessions_come_a_page_at_a_time(serve: Callable[..., Live]) -> None:
    store = InMemoryStore()
    total_turns = TURNS_PER_PAGE * 2 + 5
    stored_session(store, "long", coffee_turns(total_turns))
    for i in range(55):
        stored_session(store, f"other-{i:02d}", [Message("user", "hi")])
    live = serve(store, auth=False)
    with browser(live) as http:
        newest = Elements(http.get("/ui/sessions/long?memory=window&k=2").text)
        numbers = [int(a["id"].removeprefix("turn-")) for a in newest.having("section", "turn")]
        assert numbers == list(range(total_turns - TURNS_PER_PAGE + 1, total_turns + 1))
        last = Elements(http.get("/ui/sessions/long?memory=window&k=2&page=3").text)
        numbers = [int(a["id"].removeprefix("turn-")) for a in last.having("section", "turn")]
        assert numbers == list(range(1, 6))
        assert "page 3 of 3" in "".join(last.text)
        assert "memory=window" in http.get("/ui/sessions/long?memory=window&k=2").text

        first = Elements(http.get("/ui").text)
        rows = [a["href"] for t, a in first.tags if t == "a" and "/ui/sessions/" in a["href"]]
        assert len(rows) == 50
        assert rows[0] == "/ui/sessions/other-54"  # newest first
        second = Elements(http.get("/ui?page=2").text)
        rows2 = [a["href"] for t, a in second.tags if t == "a" and "/ui/sessions/" in a["href"]]
        assert len(rows2) == 6
        filtered = http.get("/ui?prefix=other-1").text
        assert filtered.count('href="/ui/sessions/other-1') == 10
        assert "/ui/sessions/long" not in filtered


def test_bad_settings_show_on_the_page_and_bad_pages_get_an_html_error(
    serve: Callable[..., Live],
) -> None:
    store = InMemoryStore()
    stored_session(store, "s", coffee_turns(2))
    live = serve(store, auth=False)
    with browser(live) as http:
        page = http.get("/ui/sessions/s?memory=window&token_limit=5")
        assert page.status_code == 200
        assert "memory=window takes no token_limit" in page.text
        assert http.get("/ui/sessions/s?memory=token&token_limit=abc").status_code == 200
        missing = http.get("/ui/sessions/nope")
        assert missing.status_code == 404
        assert missing.headers["content-type"].startswith("text/html")
        assert "no session &#x27;nope&#x27; here" in missing.text
        assert http.get("/ui?page=0").status_code == 422
        css = http.get("/ui/static/inspector.css")
        assert css.headers["content-type"].startswith("text/css")
        assert "article.message" in css.text


def test_behind_a_proxy_links_and_the_cookie_carry_its_path() -> None:
    from starlette.testclient import TestClient

    from zerda.server import create_app

    store = InMemoryStore()
    key, _ = KeyRing(store).create("acme")
    stored_session(store, "acme:s", coffee_turns(2))
    app = create_app(store, counter="approx")
    with TestClient(app, root_path="/zerda", follow_redirects=False) as http:
        assert http.get("/ui").headers["location"] == "/zerda/ui/login?next=%2Fui"
        login = Elements(http.get("/ui/login").text)
        assert [a["action"] for t, a in login.tags if t == "form"] == ["/zerda/ui/login"]
        answer = http.post("/ui/login", data={"key": key, "csrf": login.csrf(), "next": "/ui"})
        assert answer.headers["location"] == "/zerda/ui"
        assert "Path=/zerda/ui" in answer.headers["set-cookie"]
        http.cookies.set(COOKIE, key)
        page = http.get("/ui/sessions/s").text
        assert 'href="/zerda/ui/static/inspector.css"' in page
        assert 'href="/zerda/ui/sessions/s/confirm?action=pop"' in page
