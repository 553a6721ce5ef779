"""A TCP proxy on loopback that counts round trips: used by the Postgres benchmark and tests."""

from __future__ import annotations

import selectors
import socket
import threading
from collections.abc import Callable
from contextlib import suppress


class RoundTripProxy:
    """A TCP proxy on loopback, in front of the test server, that counts round trips.

    How it counts: per connection, each time the client sends after the server has spoken
    (or first) is one round trip. libpq writes a whole statement in one go (Parse, Bind,
    Execute, Sync; Bind, Execute, Sync once prepared) and then waits for the answer, so a
    call costs as many round trips as times it has to wait for the server, however the bytes
    are split into TCP segments. It sees what the server sees: nothing in the client can hide
    a statement from it.
    """

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.round_trips = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for s in (client, upstream):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(client, selectors.EVENT_READ, upstream)
        selector.register(upstream, selectors.EVENT_READ, client)
        last_from_client = False
        try:
            while True:
                for key, _ in selector.select():
                    source: socket.socket = key.fileobj  # type: ignore[assignment]
                    data = source.recv(65536)
                    if not data:
                        return
                    if source is client and not last_from_client:
                        with self._lock:
                            self.round_trips += 1
                    last_from_client = source is client
                    key.data.sendall(data)
        except OSError:
            return
        finally:
            selector.close()
            client.close()
            upstream.close()

    def count(self, call: Callable[[], object]) -> int:
        """Round trips ``call`` makes."""
        before = self.round_trips
        call()
        return self.round_trips - before

    def close(self) -> None:
        self._listener.close()
        with self._lock:
            for s in self._sockets:
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
