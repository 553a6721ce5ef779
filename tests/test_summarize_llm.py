"""LLMSummarizer through the real openai SDK against a local OpenAI-compatible server, and the
Summarizer protocol's helpers."""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from zerda import ConfigurationError, InvalidMessageError, Message, SummarizerError, ToolCall
from zerda.summarize import (
    DEFAULT_PROMPT,
    ExtractiveSummarizer,
    LLMSummarizer,
    Summarizer,
    SummaryResult,
    arun_summarizer,
    render_messages,
    run_summarizer,
)

SRC = Path(__file__).resolve().parents[1] / "src" / "zerda"

MESSAGES = [
    Message("user", "I'd like two oat lattes for Ada, please."),
    Message(
        "assistant",
        None,
        tool_calls=(ToolCall("call_1", "add_item", '{"item": "oat latte", "quantity": 2}'),),
    ),
    Message("tool", '{"order_id": "A-1042", "total": 9.50}', tool_call_id="call_1"),
    Message("assistant", "Order A-1042 is in: two oat lattes, 9.50."),
]
PREVIOUS = "Ada is a regular; she paid with card 7731 last time."


# -- a local OpenAI-compatible endpoint ------------------------------------------------------------


@dataclass
class Reply:
    status: int = 200
    body: str | dict[str, Any] = field(default_factory=lambda: completion("A summary."))
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    stall: bool = False  # hold the request until the test ends


@dataclass
class Seen:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


def completion(
    content: str | None, *, usage: dict[str, int] | None = None, model: str = "served-model"
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1700000000,
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
    }
    if usage is not None:
        body["usage"] = {**usage, "total_tokens": sum(usage.values())}
    return body


class FakeOpenAI:
    """Answers POSTs with the scripted replies in order (the last one repeats) and records them."""

    def __init__(self) -> None:
        self.replies: list[Reply] = [Reply()]
        self.seen: list[Seen] = []
        self.release = threading.Event()
        self._arrived = threading.Condition()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                with fake._arrived:
                    fake.seen.append(
                        Seen(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
                    )
                    reply = fake.replies[min(len(fake.seen), len(fake.replies)) - 1]
                    fake._arrived.notify_all()
                if reply.stall:
                    fake.release.wait(timeout=60)
                    return
                data = reply.body if isinstance(reply.body, str) else json.dumps(reply.body)
                payload = data.encode()
                self.send_response(reply.status)
                self.send_header("Content-Type", reply.content_type)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def wait_for_requests(self, n: int) -> None:
        with self._arrived:
            assert self._arrived.wait_for(lambda: len(self.seen) >= n, timeout=10)

    @property
    def prompt(self) -> str:
        messages = self.seen[-1].body["messages"]
        assert len(messages) == 1
        assert messages[0]["role"] == "user"
        return str(messages[0]["content"])


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    fake = FakeOpenAI()
    thread = threading.Thread(target=fake.server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield fake
    fake.release.set()
    fake.server.shutdown()
    fake.server.server_close()
    thread.join(timeout=10)


@pytest.fixture(autouse=True)
def no_ambient_openai_config(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def sdk() -> Any:
    return pytest.importorskip("openai", reason="the openai extra is not installed")


def summarizer_for(server: FakeOpenAI, **options: Any) -> LLMSummarizer:
    options.setdefault("api_key", "test-key")
    return LLMSummarizer("test-model", base_url=server.url, **options)


# Server-directed retry delay: the SDK honours retry-after-ms, so retries take a millisecond
# rather than its exponential backoff.
FAST_RETRY = {"retry-after-ms": "1"}


# -- the request ----------------------------------------------------------------------------------


def test_the_request_carries_the_model_and_the_filled_prompt(sdk: Any, server: FakeOpenAI) -> None:
    summary = summarizer_for(server).summarize(PREVIOUS, MESSAGES)

    assert summary == "A summary."
    [seen] = server.seen
    assert seen.path == "/v1/chat/completions"
    assert seen.body["model"] == "test-model"
    assert seen.headers["authorization"] == "Bearer test-key"
    prompt = server.prompt
    assert prompt == DEFAULT_PROMPT.format(summary=PREVIOUS, new_lines=render_messages(MESSAGES))
    assert PREVIOUS in prompt
    for line in (
        "user: I'd like two oat lattes for Ada, please.",
        'assistant -> add_item({"item":"oat latte","quantity":2})',
        'tool add_item: {"order_id":"A-1042","total":9.50}',
        "assistant: Order A-1042 is in: two oat lattes, 9.50.",
    ):
        assert line in prompt
    assert "{summary}" not in prompt
    assert "{new_lines}" not in prompt


def test_a_custom_prompt_is_filled_exactly(sdk: Any, server: FakeOpenAI) -> None:
    template = "Old {{facts}}: {summary}\n---\n{new_lines}\n---\nNew {{facts}}:"
    summarizer_for(server, prompt=template).summarize("nothing yet", MESSAGES[:1])

    assert server.prompt == (
        "Old {facts}: nothing yet\n---\nuser: I'd like two oat lattes for Ada, please.\n---\n"
        "New {facts}:"
    )


def test_braces_in_the_conversation_are_sent_as_they_are(sdk: Any, server: FakeOpenAI) -> None:
    tricky = [Message("user", "format is {summary} and {0} and {{x}}")]
    summarizer_for(server).summarize("{new_lines}", tricky)

    assert "user: format is {summary} and {0} and {{x}}" in server.prompt
    assert "Current summary:\n{new_lines}\n" in server.prompt


def test_the_usage_the_api_reported_is_in_the_stats(sdk: Any, server: FakeOpenAI) -> None:
    server.replies = [
        Reply(body=completion("Sum.", usage={"prompt_tokens": 321, "completion_tokens": 17}))
    ]

    result = summarizer_for(server).summarize_with_stats(PREVIOUS, MESSAGES)

    assert isinstance(result, SummaryResult)
    assert (result.text, result.prompt_tokens, result.completion_tokens) == ("Sum.", 321, 17)
    assert result.model == "served-model"  # the model the API says answered
    assert 0 <= result.seconds < 10


def test_a_reply_without_usage_reports_none(sdk: Any, server: FakeOpenAI) -> None:
    result = summarizer_for(server).summarize_with_stats("", MESSAGES)

    assert result.text == "A summary."
    assert (result.prompt_tokens, result.completion_tokens) == (None, None)


def test_the_summary_is_stripped_of_surrounding_whitespace(sdk: Any, server: FakeOpenAI) -> None:
    server.replies = [Reply(body=completion("\n  Ada ordered two oat lattes.  \n"))]

    assert summarizer_for(server).summarize("", MESSAGES) == "Ada ordered two oat lattes."


def test_nothing_new_makes_no_request(sdk: Any, server: FakeOpenAI) -> None:
    summarizer = summarizer_for(server)

    result = summarizer.summarize_with_stats(PREVIOUS, [])

    assert result == SummaryResult(PREVIOUS, 0, 0, "test-model", 0.0)
    assert asyncio.run(summarizer.asummarize(PREVIOUS, [])) == PREVIOUS
    assert server.seen == []


# -- failures --------------------------------------------------------------------------------------


@pytest.mark.parametrize("max_retries", [0, 1, 3])
def test_http_500_is_retried_max_retries_times_then_raises(
    sdk: Any, server: FakeOpenAI, max_retries: int
) -> None:
    server.replies = [Reply(status=500, body={"error": {"message": "boom"}}, headers=FAST_RETRY)]
    summarizer = summarizer_for(server, max_retries=max_retries)

    with pytest.raises(SummarizerError, match=r"test-model.*InternalServerError") as info:
        summarizer.summarize(PREVIOUS, MESSAGES)

    assert isinstance(info.value.__cause__, sdk.InternalServerError)
    assert len(server.seen) == max_retries + 1


def test_a_500_then_a_success_gives_the_summary(sdk: Any, server: FakeOpenAI) -> None:
    server.replies = [Reply(status=500, body="{}", headers=FAST_RETRY), Reply()]

    assert summarizer_for(server, max_retries=1).summarize(PREVIOUS, MESSAGES) == "A summary."
    assert len(server.seen) == 2


def test_a_client_error_is_not_retried(sdk: Any, server: FakeOpenAI) -> None:
    server.replies = [Reply(status=400, body={"error": {"message": "bad model"}})]

    with pytest.raises(SummarizerError, match="BadRequestError") as info:
        summarizer_for(server, max_retries=3).summarize(PREVIOUS, MESSAGES)

    assert isinstance(info.value.__cause__, sdk.BadRequestError)
    assert len(server.seen) == 1


def test_a_stalled_server_times_out_as_a_summarizer_error(sdk: Any, server: FakeOpenAI) -> None:
    server.replies = [Reply(stall=True)]
    summarizer = summarizer_for(server, timeout=0.3, max_retries=0)

    started = time.monotonic()
    with pytest.raises(SummarizerError, match=r"timed out \(timeout=0.3s") as info:
        summarizer.summarize(PREVIOUS, MESSAGES)

    assert time.monotonic() - started < 5
    assert isinstance(info.value.__cause__, sdk.APITimeoutError)
    assert len(server.seen) == 1


def test_a_timeout_is_retried_too(sdk: Any, server: FakeOpenAI) -> None:
    server.replies = [Reply(stall=True), Reply()]
    # Long enough for the second, prompt answer even on a loaded machine.
    summarizer = summarizer_for(server, timeout=1.0, max_retries=1)

    assert summarizer.summarize(PREVIOUS, MESSAGES) == "A summary."
    assert len(server.seen) == 2


MALFORMED = {
    "not JSON": Reply(body="<html>502 Bad Gateway</html>"),
    "HTML": Reply(body="<html>oops</html>", content_type="text/html"),
    "a JSON list": Reply(body="[1, 2]"),
    "no choices key": Reply(body={"id": "x", "object": "chat.completion"}),
    "empty choices": Reply(body={**completion("x"), "choices": []}),
    "null content": Reply(body=completion(None)),
    "empty content": Reply(body=completion("")),
    "blank content": Reply(body=completion(" \n ")),
}


@pytest.mark.parametrize("reply", MALFORMED.values(), ids=MALFORMED.keys())
def test_a_malformed_reply_is_a_summarizer_error(
    sdk: Any, server: FakeOpenAI, reply: Reply
) -> None:
    server.replies = [reply]

    with pytest.raises(SummarizerError, match="test-model"):
        summarizer_for(server, max_retries=0).summarize(PREVIOUS, MESSAGES)


def test_an_unreachable_endpoint_is_a_summarizer_error(sdk: Any) -> None:
    with socket.socket() as probe:  # a free port, closed again: it refuses connections
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"

    summarizer = LLMSummarizer("m", base_url=url, api_key="k", max_retries=0, timeout=5)
    with pytest.raises(SummarizerError, match="APIConnectionError") as info:
        summarizer.summarize(PREVIOUS, MESSAGES)
    assert isinstance(info.value.__cause__, sdk.APIConnectionError)


# -- the API key -----------------------------------------------------------------------------------


def test_the_api_key_comes_from_openai_api_key_by_default(
    sdk: Any, server: FakeOpenAI, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "from-the-environment")

    LLMSummarizer("test-model", base_url=server.url).summarize("", MESSAGES)
    LLMSummarizer("test-model", base_url=server.url, api_key="given").summarize("", MESSAGES)

    assert [s.headers["authorization"] for s in server.seen] == [
        "Bearer from-the-environment",
        "Bearer given",
    ]


@pytest.mark.parametrize("environment", [None, ""])
def test_no_api_key_and_no_client_is_a_configuration_error(
    monkeypatch: pytest.MonkeyPatch, environment: str | None
) -> None:
    if environment is not None:
        monkeypatch.setenv("OPENAI_API_KEY", environment)

    with pytest.raises(ConfigurationError, match="OPENAI_API_KEY") as info:
        LLMSummarizer("gpt-4o-mini")
    assert "client=" in str(info.value)


def test_the_api_key_never_shows_in_repr(sdk: Any, server: FakeOpenAI) -> None:
    summarizer = summarizer_for(server, api_key="sk-secret-123")

    assert "sk-secret" not in repr(summarizer)
    assert repr(summarizer) == f"LLMSummarizer(model='test-model', base_url={server.url!r})"


def test_without_the_openai_package_the_error_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "openai", None)  # makes `import openai` fail

    with pytest.raises(ConfigurationError, match=r"pip install 'zerda-memory\[openai\]'") as info:
        LLMSummarizer("gpt-4o-mini", api_key="k")
    assert isinstance(info.value.__cause__, ImportError)
    # A client function needs no SDK.
    assert LLMSummarizer("mine", client=lambda prompt: "ok").summarize("", MESSAGES) == "ok"


# -- the callable client ---------------------------------------------------------------------------


def test_a_plain_function_gets_the_filled_prompt_and_returns_the_summary() -> None:
    prompts: list[str] = []

    def fake_model(prompt: str) -> str:
        prompts.append(prompt)
        return "  Ada ordered two oat lattes (A-1042).  "

    summarizer = LLMSummarizer("my-model", client=fake_model)
    result = summarizer.summarize_with_stats(PREVIOUS, MESSAGES)

    assert result.text == "Ada ordered two oat lattes (A-1042)."
    assert (result.prompt_tokens, result.completion_tokens, result.model) == (
        None,
        None,
        "my-model",
    )
    assert prompts == [summarizer.format_prompt(PREVIOUS, MESSAGES)]
    assert PREVIOUS in prompts[0]
    assert "user: I'd like two oat lattes for Ada, please." in prompts[0]
    assert repr(summarizer) == (
        "LLMSummarizer(model='my-model', client=test_a_plain_function_gets_the_filled_prompt_"
        "and_returns_the_summary.<locals>.fake_model)"
    )


def test_an_exception_in_the_function_is_chained_in_a_summarizer_error() -> None:
    def broken(prompt: str) -> str:
        raise TimeoutError("model took too long")

    with pytest.raises(SummarizerError, match="TimeoutError: model took too long") as info:
        LLMSummarizer("my-model", client=broken).summarize(PREVIOUS, MESSAGES)
    assert isinstance(info.value.__cause__, TimeoutError)


@pytest.mark.parametrize("returned", [None, 42, b"bytes", "", "   "])
def test_a_function_returning_no_text_is_a_summarizer_error(returned: object) -> None:
    summarizer = LLMSummarizer("my-model", client=lambda prompt: returned)  # type: ignore[arg-type,return-value]

    with pytest.raises(SummarizerError, match=r"my-model|str"):
        summarizer.summarize(PREVIOUS, MESSAGES)


@pytest.mark.parametrize("option", ["base_url", "api_key", "timeout", "max_retries"])
def test_sdk_options_cannot_be_given_with_a_client_function(option: str) -> None:
    value = {"base_url": "http://x", "api_key": "k", "timeout": 5.0, "max_retries": 1}[option]

    with pytest.raises(ConfigurationError, match=f"{option}.*client="):
        LLMSummarizer("m", client=str.upper, **{option: value})


def test_a_client_must_be_callable() -> None:
    with pytest.raises(ConfigurationError, match="function str -> str"):
        LLMSummarizer("m", client="not callable")  # type: ignore[arg-type]


# -- the async twin --------------------------------------------------------------------------------


def test_asummarize_uses_the_async_client_against_the_same_server(
    sdk: Any, server: FakeOpenAI
) -> None:
    server.replies = [
        Reply(body=completion("Async sum.", usage={"prompt_tokens": 50, "completion_tokens": 5}))
    ]
    summarizer = summarizer_for(server)
    summarizer._sync = None  # the sync client must not be needed
    clients: list[object] = []

    async def main() -> SummaryResult:
        result = await summarizer.asummarize_with_stats(PREVIOUS, MESSAGES)
        clients.append(summarizer._async[asyncio.get_running_loop()])
        return result

    result = asyncio.run(main())

    assert (result.text, result.prompt_tokens, result.completion_tokens) == ("Async sum.", 50, 5)
    assert server.prompt == summarizer.format_prompt(PREVIOUS, MESSAGES)
    assert isinstance(clients[0], sdk.AsyncOpenAI)


def test_asummarize_works_across_event_loops(sdk: Any, server: FakeOpenAI) -> None:
    summarizer = summarizer_for(server)

    first = asyncio.run(summarizer.asummarize(PREVIOUS, MESSAGES))
    second = asyncio.run(summarizer.asummarize(PREVIOUS, MESSAGES))

    assert first == second == "A summary."
    assert len(server.seen) == 2


def test_async_failures_are_summarizer_errors(sdk: Any, server: FakeOpenAI) -> None:
    server.replies = [
        Reply(status=503, body="{}", headers=FAST_RETRY),
        Reply(status=503, body="{}", headers=FAST_RETRY),
        Reply(body=completion(None)),
        Reply(stall=True),
    ]
    summarizer = summarizer_for(server, timeout=0.3, max_retries=1)

    async def main() -> list[BaseException]:
        errors: list[BaseException] = []
        for _ in range(3):
            try:
                await summarizer.asummarize(PREVIOUS, MESSAGES)
            except SummarizerError as exc:
                errors.append(exc)
        return errors

    started = time.monotonic()
    http_error, empty, timeout = asyncio.run(main())

    assert time.monotonic() - started < 8
    assert isinstance(http_error.__cause__, sdk.InternalServerError)
    assert empty.__cause__ is None
    assert "no text content" in str(empty)
    assert isinstance(timeout.__cause__, sdk.APITimeoutError)
    assert len(server.seen) == 2 + 1 + 2


def test_asummarize_runs_a_client_function_off_the_event_loop() -> None:
    threads: list[int] = []

    def fake_model(prompt: str) -> str:
        threads.append(threading.get_ident())
        return "summary"

    async def main() -> tuple[str, int]:
        summarizer = LLMSummarizer("m", client=fake_model)
        return await summarizer.asummarize("", MESSAGES), threading.get_ident()

    text, loop_thread = asyncio.run(main())

    assert text == "summary"
    assert len(threads) == 1
    assert threads[0] != loop_thread


def test_an_async_function_failure_is_chained() -> None:
    def broken(prompt: str) -> str:
        raise ConnectionError("no route")

    summarizer = LLMSummarizer("m", client=broken)
    with pytest.raises(SummarizerError) as info:
        asyncio.run(summarizer.asummarize("", MESSAGES))
    assert isinstance(info.value.__cause__, ConnectionError)


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ("Summarize {new_lines}", r"lacks \{summary\}"),
        ("Summary: {summary}", r"lacks \{new_lines\}"),
        ("{summary} {new_lines} {history}", r"unknown variables \['history'\]"),
        ("{summary} {new_lines} {0}", r"unknown variables \['0'\]"),
        ("{summary} {new_lines} {}", r"unknown variables \[''\]"),
        ("{summary} {new_lines} }", "not a valid template"),
        (42, "str template"),
    ],
)
def test_a_bad_prompt_is_refused_at_construction(prompt: object, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        LLMSummarizer("m", client=str.upper, prompt=prompt)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"model": ""}, "model must be a non-empty string"),
        ({"timeout": 0}, "timeout must be seconds > 0"),
        ({"timeout": True}, "timeout must be seconds > 0"),
        ({"timeout": float("nan")}, "timeout must be seconds > 0"),
        ({"timeout": float("inf")}, "timeout must be seconds > 0"),
        ({"max_retries": -1}, "max_retries must be an integer >= 0"),
        ({"max_retries": 1.5}, "max_retries must be an integer >= 0"),
        ({"base_url": ""}, "base_url must be a non-empty string"),
    ],
)
def test_bad_options_are_refused(sdk: Any, options: dict[str, Any], message: str) -> None:
    options = {"model": "m", "api_key": "k", **options}
    with pytest.raises(ConfigurationError, match=message):
        LLMSummarizer(**options)


def test_the_defaults_bound_a_call(sdk: Any) -> None:
    summarizer = LLMSummarizer("m", api_key="k")

    assert (summarizer.timeout, summarizer.max_retries) == (60.0, 2)
    assert summarizer._sync is not None
    assert summarizer._sync.timeout == 60.0
    assert summarizer._sync.max_retries == 2


def test_the_default_prompt_names_what_to_keep() -> None:
    for needed in ("{summary}", "{new_lines}", "names", "numbers", "decisions", "open"):
        assert needed in DEFAULT_PROMPT


# -- the protocol and its helpers ------------------------------------------------------------------


class Uppercase:
    """A third-party summarizer: fits the protocol, reports no figures."""

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return (previous_summary + " " + " ".join(m.text for m in messages)).strip().upper()

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


class Failing:
    def __init__(self, error: Exception | None = None, returned: object = None) -> None:
        self.error = error
        self.returned = returned

    def summarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        if self.error is not None:
            raise self.error
        return self.returned  # type: ignore[return-value]

    async def asummarize(self, previous_summary: str, messages: Sequence[Message]) -> str:
        return self.summarize(previous_summary, messages)


def test_every_summarizer_fits_the_protocol() -> None:
    assert isinstance(LLMSummarizer("m", client=str.upper), Summarizer)
    assert isinstance(ExtractiveSummarizer(), Summarizer)
    assert isinstance(Uppercase(), Summarizer)
    assert not isinstance(object(), Summarizer)


def test_run_summarizer_gives_a_result_for_any_summarizer() -> None:
    result = run_summarizer(Uppercase(), "old.", MESSAGES[:1])
    aresult = asyncio.run(arun_summarizer(Uppercase(), "old.", MESSAGES[:1]))

    for r in (result, aresult):
        assert r.text == "OLD. I'D LIKE TWO OAT LATTES FOR ADA, PLEASE."
        assert (r.prompt_tokens, r.completion_tokens, r.model) == (None, None, None)
        assert r.seconds >= 0


def test_run_summarizer_takes_the_figures_of_a_builtin_summarizer(
    sdk: Any, server: FakeOpenAI
) -> None:
    server.replies = [
        Reply(body=completion("S.", usage={"prompt_tokens": 9, "completion_tokens": 2}))
    ]
    summarizer = summarizer_for(server)

    result = run_summarizer(summarizer, "", MESSAGES)
    aresult = asyncio.run(arun_summarizer(summarizer, "", MESSAGES))

    assert result.prompt_tokens == aresult.prompt_tokens == 9
    assert result.completion_tokens == aresult.completion_tokens == 2


@pytest.mark.parametrize(
    "summarizer",
    [Failing(error=RuntimeError("kaput")), Failing(error=KeyError("k")), Failing(returned=None)],
    ids=["RuntimeError", "KeyError", "returns None"],
)
def test_run_summarizer_turns_any_failure_into_a_summarizer_error(summarizer: Failing) -> None:
    for run in (
        lambda: run_summarizer(summarizer, "", MESSAGES),
        lambda: asyncio.run(arun_summarizer(summarizer, "", MESSAGES)),
    ):
        with pytest.raises(SummarizerError, match="Failing") as info:
            run()
        assert info.value.__cause__ is summarizer.error


def test_a_summarizer_error_passes_through_unwrapped() -> None:
    error = SummarizerError("mine")
    with pytest.raises(SummarizerError) as info:
        run_summarizer(Failing(error=error), "", MESSAGES)
    assert info.value is error


@pytest.mark.parametrize(
    ("previous", "messages", "error"),
    [
        (None, MESSAGES, ConfigurationError),
        ("", "user: hi", ConfigurationError),
        ("", [{"role": "user", "content": "hi"}], InvalidMessageError),
    ],
)
def test_bad_arguments_are_refused_before_any_call(
    previous: object, messages: object, error: type[Exception]
) -> None:
    calls: list[str] = []
    summarizer = LLMSummarizer("m", client=lambda p: calls.append(p) or "x")  # type: ignore[func-returns-value]

    for call in (
        lambda: summarizer.summarize(previous, messages),  # type: ignore[arg-type]
        lambda: run_summarizer(Uppercase(), previous, messages),  # type: ignore[arg-type]
        lambda: ExtractiveSummarizer().summarize(previous, messages),  # type: ignore[arg-type]
    ):
        with pytest.raises(error):
            call()
    assert calls == []


# -- new_lines -------------------------------------------------------------------------------------


def test_render_messages_writes_one_line_a_message_and_a_tool_call() -> None:
    messages = [
        Message("system", "Be brief."),
        Message("user", "Hi, I'm Ada.", name="ada"),
        Message(
            "assistant",
            "Let me check.",
            tool_calls=(
                ToolCall("c1", "lookup", '{ "who" : "Ada",\n "price": 12.50 }'),
                ToolCall("c2", "weather", "not json {"),
            ),
        ),
        Message("tool", '[ {"a b": " spaced  value "} ]', tool_call_id="c1"),
        Message("tool", "sunny", tool_call_id="c9"),
        Message("tool", "done", tool_call_id="c3", name="named_tool"),
        Message("assistant", "", tool_calls=(ToolCall("c4", "noop"),)),
    ]

    assert render_messages(messages).split("\n") == [
        "system: Be brief.",
        "user (ada): Hi, I'm Ada.",
        "assistant: Let me check.",
        'assistant -> lookup({"who":"Ada","price":12.50})',
        "assistant -> weather(not json {)",
        'tool lookup: [{"a b":" spaced  value "}]',
        "tool: sunny",
        "tool named_tool: done",
        "assistant -> noop({})",
    ]
    assert render_messages([]) == ""


def test_render_messages_keeps_escaped_quotes_inside_strings() -> None:
    call = ToolCall("c1", "say", '{"text": "she said \\"hi there\\" \\\\", "n": 1}')
    line = render_messages([Message("assistant", None, tool_calls=(call,))])
    assert line == 'assistant -> say({"text":"she said \\"hi there\\" \\\\","n":1})'
    assert json.loads(line[len("assistant -> say(") : -1]) == json.loads(call.arguments)


# -- layering --------------------------------------------------------------------------------------


def test_the_summarize_package_imports_only_the_layers_below() -> None:
    allowed = {"zerda.errors", "zerda.messages", "zerda.tokens"}
    for path in sorted((SRC / "summarize").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name == "zerda" or name.startswith("zerda."):
                    assert name in allowed or name.startswith("zerda.summarize"), (
                        f"{path.name} imports {name}"
                    )


def test_openai_is_imported_only_when_an_sdk_summarizer_is_made() -> None:
    code = (
        "import sys\n"
        "from zerda.summarize import ExtractiveSummarizer, LLMSummarizer\n"
        "LLMSummarizer('m', client=str.upper).summarize('', [])\n"
        "ExtractiveSummarizer().summarize('', [])\n"
        "print('openai' in sys.modules)\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "False"


@pytest.mark.parametrize("cls", [LLMSummarizer, ExtractiveSummarizer], ids=lambda c: c.__name__)
def test_each_sync_method_has_an_async_twin(cls: type) -> None:
    public = [n for n in vars(cls) if not n.startswith("_") and callable(vars(cls)[n])]
    sync = [n for n in public if not inspect.iscoroutinefunction(vars(cls)[n])]
    assert {"summarize", "summarize_with_stats"} <= set(sync)
    for name in sync:
        if name == "format_prompt":
            continue  # no I/O: nothing to await
        assert inspect.iscoroutinefunction(getattr(cls, "a" + name)), name
