"""Editing and branching over HTTP: the REST endpoints and the MCP tools (issue #16)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("uvicorn", reason="the server extra is not installed")

from test_serve import TOOL_TURN, Live, error_of, key_for
from zerda.memory import ConversationSummaryBufferMemory
from zerda.stores import InMemoryStore
from zerda.tokens import ApproxCounter


@pytest.fixture
def live() -> Iterator[Live]:
    server = Live(InMemoryStore())
    yield server
    server.close()


def seed(http: Any) -> list[str]:
    """The ids of two turns appended to the session "s" of the client's tenant."""
    ids = []
    for turn in (
        TOOL_TURN,
        [{"role": "user", "content": "thanks"}, {"role": "assistant", "content": "welcome"}],
    ):
        r = http.post("/v1/sessions/s/messages", json={"messages": turn})
        assert r.status_code == 201, r.text
        ids += r.json()["ids"]
    return ids


def history(http: Any, session: str = "s") -> list[dict[str, Any]]:
    r = http.get(f"/v1/sessions/{session}/messages")
    assert r.status_code == 200, r.text
    messages: list[dict[str, Any]] = r.json()["messages"]
    return messages


def test_delete_a_message_and_its_results(live: Live) -> None:
    with live.client(key_for(live, "acme")) as http:
        ids = seed(http)
        r = http.delete(f"/v1/sessions/s/messages/{ids[1]}")  # the call: its result goes too
        assert r.status_code == 200, r.text
        assert r.json() == {"deleted": 2}
        assert [m["id"] for m in history(http)] == [ids[0], ids[3], ids[4], ids[5]]
        error_of(http.delete(f"/v1/sessions/s/messages/{ids[1]}"), 404, "MessageNotFoundError")
        message = error_of(http.delete("/v1/sessions/nobody/messages/x"), 404, "NotFound")
        assert "nobody" in message


def test_pop_the_newest_turn(live: Live) -> None:
    with live.client(key_for(live, "acme")) as http:
        ids = seed(http)
        r = http.post("/v1/sessions/s/pop")
        assert r.status_code == 200, r.text
        assert [m["id"] for m in r.json()["messages"]] == ids[4:]
        assert [m["id"] for m in history(http)] == ids[:4]
        assert [m["id"] for m in http.post("/v1/sessions/s/pop").json()["messages"]] == ids[:4]
        # The session holds nothing now: it is gone, like a session never written.
        error_of(http.post("/v1/sessions/s/pop"), 404, "NotFound")
        error_of(http.post("/v1/sessions/nobody/pop"), 404, "NotFound")


def test_edit_a_message(live: Live) -> None:
    with live.client(key_for(live, "acme")) as http:
        ids = seed(http)
        r = http.patch(f"/v1/sessions/s/messages/{ids[0]}", json={"content": "What is 7 x 6?"})
        assert r.status_code == 200, r.text
        message = r.json()["message"]
        assert (message["id"], message["content"]) == (ids[0], "What is 7 x 6?")
        assert "edited_at" in message["metadata"]
        assert history(http)[0]["content"] == "What is 7 x 6?"
        error_of(http.patch("/v1/sessions/s/messages/nope", json={"content": "x"}), 404)
        error_of(http.patch(f"/v1/sessions/s/messages/{ids[0]}", json={"text": "x"}), 422)
        error_of(http.patch(f"/v1/sessions/s/messages/{ids[0]}", json={"content": None}), 400)


def test_fork_within_the_tenant(live: Live) -> None:
    with live.client(key_for(live, "acme")) as http, live.client(key_for(live, "other")) as other:
        ids = seed(http)
        r = http.post("/v1/sessions/s/fork", json={"new_session_id": "b", "at": ids[3]})
        assert r.status_code == 201, r.text
        assert r.json() == {"session_id": "b", "messages": 4}
        assert [m["id"] for m in history(http, "b")] == ids[:4]
        assert len(history(http)) == 6, "the source is unchanged"
        assert "acme:b" in [s.session_id for s in live.store.list_sessions()]
        message = error_of(http.post("/v1/sessions/s/fork", json={"new_session_id": "b"}), 409)
        assert "acme" not in message, "the tenant's prefix never shows"
        error_of(http.post("/v1/sessions/s/fork", json={"new_session_id": "c", "at": "x"}), 404)
        error_of(http.post("/v1/sessions/s/fork", json={"new": "c"}), 422)
        error_of(http.post("/v1/sessions/s/fork", json={"new_session_id": "no spaces"}), 400)
        # Another tenant can neither fork nor see these sessions.
        error_of(other.post("/v1/sessions/s/fork", json={"new_session_id": "mine"}), 404)
        error_of(other.get("/v1/sessions/b/messages"), 404)


def test_a_deleted_message_leaves_the_summary_over_the_api(live: Live) -> None:
    counter = ApproxCounter()
    memory = ConversationSummaryBufferMemory(
        60, token_counter=counter, store=live.store, session_id="acme:s"
    )
    memory.save_context({"input": "my card is 4111-1111"}, {"output": "noted"})
    for i in range(6):
        memory.save_context({"input": f"question {i}"}, {"output": f"answer {i}"})
    assert "card is 4111" in str(live.store.get_metadata("acme:s"))
    card = memory.get_history()[0].id
    with live.client(key_for(live, "acme")) as http:
        assert http.delete(f"/v1/sessions/s/messages/{card}").status_code == 200
        r = http.get(
            "/v1/sessions/s/context",
            params={"memory": "summary_buffer", "token_limit": 60, "counter": "approx"},
        )
        assert r.status_code == 200, r.text
        assert "card is 4111" not in r.text
    assert "card is 4111" not in str(live.store.get_metadata("acme:s"))


def test_the_server_keeps_a_memory_per_session_and_setting(live: Live) -> None:
    """Reads reuse the memory of their session and settings, and stay exact after an edit
    made between them."""
    service = live.server.config.app.state.service
    a = service.memory_for("acme:s", {"token_limit": "60", "counter": "approx"})
    assert service.memory_for("acme:s", {"token_limit": "60", "counter": "approx"}) is a
    assert service.memory_for("acme:s", {"token_limit": "61", "counter": "approx"}) is not a
    assert service.memory_for("other:s", {"token_limit": "60", "counter": "approx"}) is not a
    with live.client(key_for(live, "acme")) as http:
        ids = seed(http)
        params = {"token_limit": 200, "counter": "approx"}
        before = http.get("/v1/sessions/s/context", params=params).json()["messages"]
        assert len(before) == 6
        http.delete(f"/v1/sessions/s/messages/{ids[1]}")  # the call and its result go
        after = http.get("/v1/sessions/s/context", params=params).json()["messages"]
        assert [m["content"] for m in after] == ["What is 6 x 7?", "It is 42.", "thanks", "welcome"]
