"""A local OpenAI-compatible Chat Completions server for tests.

``with FakeOpenAI() as fake:`` serves ``POST {fake.url}/chat/completions`` on 127.0.0.1, answering
with the scripted :class:`Reply` objects in order (``fake.script(...)``), then with
``fake.responder(body)`` if set, and otherwise by echoing the last user message. Every request
body and its headers are recorded. Replies can be plain JSON or server-sent-event streams (when the
request asks for ``"stream": true``), HTTP errors, stalls (to trigger client timeouts) or dropped
connections.
"""

from __future__ import annotations

import itertools
import json
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

ToolCallSpec = tuple[str, str, str]
"""A scripted tool call: ``(id, name, arguments JSON text)``."""

COMPLETIONS_PATH = "/v1/chat/completions"
DEFAULT_ERROR: dict[str, Any] = {"error": {"message": "scripted failure", "type": "server_error"}}


@dataclass(frozen=True)
class Reply:
    """One scripted answer."""

    content: str | None = None
    """The assistant's text (``None``: no content)."""
    tool_calls: tuple[ToolCallSpec, ...] = ()
    """Tool calls as ``(id, name, arguments JSON text)``."""
    usage: tuple[int, int] | None = (10, 5)
    """``(prompt_tokens, completion_tokens)``; ``None`` reports no usage."""
    status: int = 200
    """A status other than 200 answers with that status and :attr:`error_body`."""
    error_body: dict[str, Any] | None = None
    """The JSON body of an error reply (``None``: :data:`DEFAULT_ERROR`)."""
    stall: float = 0.0
    """Seconds to wait before answering (cut short, without an answer, when the server stops)."""
    drop: bool = False
    """Close the connection without any answer."""


def text(content: str, *, usage: tuple[int, int] | None = (10, 5)) -> Reply:
    """A plain text reply."""
    return Reply(content=content, usage=usage)


def calls(
    *calls: tuple[str, str, str] | tuple[str, str, dict[str, Any]], content: str | None = None
) -> Reply:
    """A reply with tool calls ``(id, name, arguments)``; dict arguments are JSON-encoded."""
    specs = tuple(
        (call_id, name, arguments if isinstance(arguments, str) else json.dumps(arguments))
        for call_id, name, arguments in calls
    )
    return Reply(content=content, tool_calls=specs)


def failure(status: int = 500, message: str = "scripted failure") -> Reply:
    """An HTTP error reply with an OpenAI-style error body."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return Reply(status=status, error_body={"error": {"message": message, "type": kind}})


class FakeOpenAI:
    """A scripted OpenAI-compatible server; use it as a context manager.

    Entering starts a :class:`ThreadingHTTPServer` (daemon threads) on a free port of 127.0.0.1
    in a background thread; leaving shuts it down, cuts short any stalled reply and closes it.
    """

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        """The JSON body of every POST to ``/v1/chat/completions``, in order."""
        self.headers: list[dict[str, str]] = []
        """The lower-cased headers of each of :attr:`requests`."""
        self.responder: Callable[[dict[str, Any]], Reply] | None = None
        """Answers a request when the script is used up (``None``: echo the last user message)."""
        self._queue: deque[Reply] = deque()
        self._arrived = threading.Condition()
        self._stopping = threading.Event()
        self._server = _Server(self)
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="fake-openai", daemon=True
        )
        host, port = self._server.server_address[:2]
        self.url = f"http://{host!s}:{port}/v1"
        """The ``base_url`` to give the client."""

    def __enter__(self) -> FakeOpenAI:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._stopping.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=10)
        self._server.server_close()

    def script(self, *replies: Reply) -> None:
        """Queue replies; each request takes the next one."""
        with self._arrived:
            self._queue.extend(replies)

    def wait_for_requests(self, n: int, timeout: float = 10) -> None:
        """Block until at least ``n`` requests have arrived; raise TimeoutError otherwise."""
        with self._arrived:
            if not self._arrived.wait_for(lambda: len(self.requests) >= n, timeout=timeout):
                raise TimeoutError(f"{len(self.requests)} of {n} requests within {timeout}s")

    def _record(self, body: dict[str, Any], headers: dict[str, str]) -> tuple[int, Reply]:
        """Record a request and choose its reply; returns its 1-based number and the reply."""
        with self._arrived:
            self.requests.append(body)
            self.headers.append(headers)
            number = len(self.requests)
            scripted = self._queue.popleft() if self._queue else None
            self._arrived.notify_all()
        if scripted is not None:
            return number, scripted
        if self.responder is not None:
            return number, self.responder(body)
        return number, text(f"echo: {_last_user_text(body)}")


def _last_user_text(body: dict[str, Any]) -> str:
    """The text of the last user message: its content, or its text parts joined with spaces."""
    for message in reversed(body.get("messages") or []):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                return " ".join(
                    str(part.get("text", ""))
                    for part in content
                    if isinstance(part, dict) and part.get("type") == "text"
                )
            return "" if content is None else str(content)
    return ""


def _usage(usage: tuple[int, int]) -> dict[str, int]:
    """An OpenAI usage object."""
    prompt, completion = usage
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _finish_reason(reply: Reply) -> str:
    """Why the scripted answer ends."""
    return "tool_calls" if reply.tool_calls else "stop"


def completion_body(reply: Reply, *, number: int, model: str) -> dict[str, Any]:
    """The ``chat.completion`` object answering a non-streamed request."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            for call_id, name, arguments in reply.tool_calls
        ]
    body: dict[str, Any] = {
        "id": f"chatcmpl-{number}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": _finish_reason(reply)}],
    }
    if reply.usage is not None:
        body["usage"] = _usage(reply.usage)
    return body


def _words(content: str) -> list[str]:
    """Split text into pieces, one word each with its trailing whitespace; they join back."""
    return re.findall(r"\s*\S+\s*|\s+", content)


def _thirds(arguments: str) -> list[str]:
    """Split text into up to three non-empty pieces that join back."""
    size = len(arguments)
    cuts = [0, size // 3, 2 * size // 3, size]
    return [arguments[a:b] for a, b in itertools.pairwise(cuts) if a < b]


def stream_chunks(
    reply: Reply, *, number: int, model: str, include_usage: bool
) -> Iterator[dict[str, Any]]:
    """The ``chat.completion.chunk`` objects streaming a reply, in order."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": f"chatcmpl-{number}",
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
        }

    yield chunk({"role": "assistant", "content": ""})
    for piece in _words(reply.content or ""):
        yield chunk({"content": piece})
    for index, (call_id, name, arguments) in enumerate(reply.tool_calls):
        function = {"name": name, "arguments": ""}
        yield chunk(
            {
                "tool_calls": [
                    {"index": index, "id": call_id, "type": "function", "function": function}
                ]
            }
        )
        for piece in _thirds(arguments):
            yield chunk({"tool_calls": [{"index": index, "function": {"arguments": piece}}]})
    yield chunk({}, _finish_reason(reply))
    if include_usage and reply.usage is not None:
        final = chunk({})
        final["choices"] = []
        final["usage"] = _usage(reply.usage)
        yield final


class _Server(ThreadingHTTPServer):
    """The HTTP server, holding the :class:`FakeOpenAI` its handlers answer for."""

    daemon_threads = True

    def __init__(self, fake: FakeOpenAI) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.fake = fake


class _Handler(BaseHTTPRequestHandler):
    """Answers one connection's requests for :class:`FakeOpenAI`."""

    protocol_version = "HTTP/1.1"
    server: _Server

    def do_POST(self) -> None:
        """Record a chat completion request and answer it with its reply."""
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.path.split("?")[0] != COMPLETIONS_PATH:
            self._not_found()
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._json(400, {"error": {"message": "body is not a JSON object", "type": "invalid"}})
            return
        fake = self.server.fake
        headers = {name.lower(): value for name, value in self.headers.items()}
        number, reply = fake._record(body, headers)
        if reply.stall > 0 and fake._stopping.wait(reply.stall):
            reply = Reply(drop=True)
        try:
            self._answer(reply, body, number)
        except (BrokenPipeError, ConnectionResetError):  # the client has given up
            self.close_connection = True

    def do_GET(self) -> None:
        """Nothing is served by GET."""
        self._not_found()

    def _answer(self, reply: Reply, body: dict[str, Any], number: int) -> None:
        """Write the reply: nothing, an error, a JSON completion or an event stream."""
        model = str(body.get("model", ""))
        if reply.drop:
            self.close_connection = True
        elif reply.status != 200:
            self._json(reply.status, reply.error_body or DEFAULT_ERROR)
        elif body.get("stream") is True:
            options = body.get("stream_options") or {}
            include_usage = isinstance(options, dict) and options.get("include_usage") is True
            self._stream(
                stream_chunks(reply, number=number, model=model, include_usage=include_usage)
            )
        else:
            self._json(200, completion_body(reply, number=number, model=model))

    def _not_found(self) -> None:
        """Answer 404 for anything but the chat completions endpoint."""
        message = f"no route for {self.command} {self.path}"
        self._json(404, {"error": {"message": message, "type": "invalid_request_error"}})

    def _json(self, status: int, payload: dict[str, Any]) -> None:
        """Send a JSON response with a Content-Length."""
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self.wfile.flush()

    def _stream(self, chunks: Iterator[dict[str, Any]]) -> None:
        """Send server-sent events, one flushed ``data:`` line per chunk, ending the connection."""
        self.close_connection = True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        for chunk in chunks:
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()

    def log_message(self, format: str, *args: Any) -> None:
        """Keep the test output quiet."""
